"""Hub models through the real ``huggingface_hub`` client and Transformers, against the loopback
hub of ``tests/hub_server.py``: commits recorded, branch moves, offline reuse of the cache,
retries of transient errors, one-line error messages.

Retries here wait ``BIASAUDIT_HUB_RETRY_DELAY=0.02`` s (doubling) so that the tests stay fast;
``Retry-After`` is honoured as the hub sends it (1 s).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import hub_fixture  # noqa: E402,F401  (the fixture `hub`)
from audit.tiny_models import tiny_model_dir  # noqa: E402

from audit.backends.hf import load_hf_model  # noqa: E402
from audit.errors import ModelError  # noqa: E402
from jobs.resolve import model_kind, probe_revision  # noqa: E402

pytestmark = pytest.mark.unit

SECRET = "hf_secret_token_never_printed_0123456789"


@pytest.fixture(scope="module")
def bert_dir() -> Path:
    return tiny_model_dir("bert")


@pytest.fixture(scope="module")
def gpt2_dir() -> Path:
    return tiny_model_dir("gpt2")


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setenv("BIASAUDIT_HUB_RETRY_DELAY", "0.02")
    monkeypatch.setenv("BIASAUDIT_HUB_RETRIES", "4")


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _ref_file(hub, repo: str, branch: str = "main") -> Path:
    return hub.cache / ("models--" + repo.replace("/", "--")) / "refs" / branch


# ----------------------------------------------------------------------------- online


def test_online_load_records_the_commit_and_a_branch_move_gives_the_new_one(hub, bert_dir):
    c1 = hub.add_repo("acme/bert", bert_dir)
    m = load_hf_model("acme/bert", kind="mlm")
    assert m.revision == c1 and m.provenance()["revision"] == c1 and m.name_or_path == "acme/bert"
    assert m.resolution == f"online: main is commit {c1}"
    assert _same_weights(m.model, load_hf_model(bert_dir, kind="mlm").model)
    # the branch is recorded in the cache as huggingface_hub itself does (refs/main -> commit)
    assert _ref_file(hub, "acme/bert").read_text() == c1
    # only what Transformers needs was fetched, at the commit, never at the branch name
    got = {r.path.rsplit("/", 1)[-1] for r in hub.requests if r.method == "GET" and "/resolve/" in r.path}
    assert got == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert all(f"/resolve/{c1}/" in r.path for r in hub.requests if "/resolve/" in r.path)
    assert hub.unrouted == []

    # main moves to a new commit with other weights: the new commit is loaded and recorded
    sd = {k: v.clone() for k, v in m.model.state_dict().items()}
    for k in sd:
        if k.endswith("word_embeddings.weight"):
            sd[k] = sd[k] + 1.0
    from safetensors.torch import save

    c2 = hub.commit("acme/bert", {"model.safetensors": save(sd)}, message="retrain")
    assert c2 != c1 and hub.history("acme/bert") == [c2, c1]
    m2 = load_hf_model("acme/bert@main", kind="mlm")
    assert m2.revision == c2 and _ref_file(hub, "acme/bert").read_text() == c2
    emb = [k for k in sd if k.endswith("word_embeddings.weight")][0]
    assert torch.equal(m2.model.state_dict()[emb], sd[emb])
    # the old commit stays loadable by its hash, and the probe follows the branch
    assert load_hf_model(f"acme/bert@{c1}", kind="mlm").revision == c1
    assert probe_revision("acme/bert", "mlm", {"revision": "main"}) == c2


def test_only_the_files_transformers_needs_are_downloaded(hub, bert_dir):
    """A repository as real ones look (other frameworks' weights, ONNX and sentence-transformers
    sub-folders, a pickle twin of the weights): only the safetensors weights, config and
    tokenizer files travel."""
    extra = {"pytorch_model.bin": b"pickle" * 100, "tf_model.h5": b"h5" * 100, "flax_model.msgpack": b"m" * 100,
             "model.fp16.safetensors": b"half" * 100, "onnx/model.onnx": b"onnx" * 100,
             "1_Pooling/config.json": "{}", "training_args.bin": b"args", "README.md": "# card\n",
             "special_tokens_map.json": "{}"}
    files = {p.name: p for p in bert_dir.iterdir()} | extra
    hub.add_repo("acme/full", files)
    m = load_hf_model("acme/full", kind="mlm")
    assert m.revision == hub.head("acme/full")
    got = sorted(r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.requests
                 if r.method == "GET" and "/resolve/" in r.path)
    assert got == ["README.md", "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
                   "tokenizer_config.json"]


def test_distilbert_through_the_hub_scores_like_the_local_folder(hub):
    local_dir = tiny_model_dir("distilbert")
    c1 = hub.add_repo("acme/distil", local_dir)
    m = load_hf_model("acme/distil", kind="mlm")
    local = load_hf_model(local_dir, kind="mlm")
    assert m.revision == c1 and type(m.model).__name__ == "DistilBertForMaskedLM"
    text = ["the doctor is [MASK] ."]
    enc = m.tokenizer(text, return_tensors="pt")
    assert "token_type_ids" not in enc
    with torch.inference_mode():
        a, b = m.model(**enc).logits, local.model(**local.tokenizer(text, return_tensors="pt")).logits
    assert torch.equal(a, b) and a.shape[-1] == m.tokenizer.vocab_size


# ----------------------------------------------------------------------------- offline


def test_offline_reload_of_a_branch_uses_the_commit_cached_online(hub, gpt2_dir, monkeypatch, caplog):
    c1 = hub.add_repo("acme/gpt2", gpt2_dir)
    online = load_hf_model("acme/gpt2", kind="causal", revision="main")
    assert online.revision == c1

    hub.commit("acme/gpt2", {"README.md": "moved on the hub meanwhile"})
    hub.go_offline(monkeypatch)
    hub.clear_log()
    with caplog.at_level(logging.WARNING, logger="audit.backends.hf"):
        off = load_hf_model("acme/gpt2", kind="causal", revision="main")
    assert off.revision == c1 and off.resolution == f"offline: main resolved to {c1} from the cache"
    assert f"model 'acme/gpt2': offline: main resolved to {c1} from the cache" in caplog.messages
    assert hub.requests == []  # not one request while offline
    assert _same_weights(off.model, online.model)
    # the same through the runner and with '@main' in the reference
    from audit.runner import load_model

    lm = load_model("acme/gpt2@main", backend="hf-causal")
    assert lm.revision == c1
    # a branch never fetched online is not guessed
    with pytest.raises(ModelError, match=r"revision dev\) is not in the local Hugging Face cache and HF_HUB_OFFLINE"):
        load_hf_model("acme/gpt2", kind="causal", revision="dev")


def test_offline_probe_gives_the_planner_its_keys(hub, bert_dir, monkeypatch):
    from audit.provenance import task_key

    c1 = hub.add_repo("acme/bert", bert_dir)
    online_probe = probe_revision("acme/bert", "mlm", {"revision": "main"})
    assert online_probe == c1
    hub.go_offline(monkeypatch)
    # probed but never loaded: nothing cached, so offline the key waits for the load
    assert probe_revision("acme/bert", "mlm", {"revision": "main"}) is None

    hub.go_online(monkeypatch)
    load_hf_model("acme/bert", kind="mlm")
    hub.go_offline(monkeypatch)
    hub.clear_log()
    assert probe_revision("acme/bert", "mlm", {"revision": "main"}) == c1
    assert probe_revision("acme/bert@main", "mlm", {}) == c1
    assert probe_revision("acme/bert", "mlm", {}) == c1          # no revision: the default branch
    assert model_kind("acme/bert") == "mlm"                       # from the cached config, offline
    assert hub.requests == []
    key = dict(model_ref="acme/bert", dataset_digest="sha256:" + "0" * 64, metric="seat", params={}, seed=0)
    assert task_key(model_revision=probe_revision("acme/bert", "mlm", {}), **key) == \
        task_key(model_revision=online_probe, **key)


# ----------------------------------------------------------------------------- transient errors


def test_two_503_answers_are_retried_for_the_probe_and_the_load(hub, bert_dir, caplog):
    c1 = hub.add_repo("acme/bert", bert_dir)
    load_hf_model("acme/bert", kind="mlm")  # cached now
    hub.clear_log()

    hub.fail(r"^/api/models/acme/bert", 503, times=2)
    assert probe_revision("acme/bert", "mlm", {"revision": "main"}) == c1
    assert [r.status for r in hub.requests] == [503, 503, 200]

    hub.clear_log()
    caplog.clear()
    hub.fail(r"^/api/models/acme/bert", 503, times=2)
    with caplog.at_level(logging.WARNING, logger="audit.retry"):
        m = load_hf_model("acme/bert", kind="mlm")
    assert m.revision == c1 and m.resolution == f"online: main is commit {c1}"
    assert [r.status for r in hub.requests] == [503, 503, 200]  # and nothing downloaded again
    assert caplog.messages == ["model 'acme/bert': hub: HTTP 503 (retry 1 of 4 in 0.02 s)",
                               "model 'acme/bert': hub: HTTP 503 (retry 2 of 4 in 0.04 s)"]


def test_503_during_the_download_is_retried(hub, bert_dir, caplog):
    """huggingface_hub does not retry a 503 on a file's GET: the loader does."""
    c1 = hub.add_repo("acme/bert", bert_dir)
    fault = hub.fail(r"^/acme/bert/resolve/[0-9a-f]{40}/model\.safetensors$", 503, times=2, method="GET")
    with caplog.at_level(logging.WARNING, logger="audit.retry"):
        m = load_hf_model("acme/bert", kind="mlm")
    assert m.revision == c1 and fault.hits == 2
    assert [x for x in caplog.messages if "download" in x] == [
        "model 'acme/bert': download: HTTP 503 (retry 1 of 4 in 0.02 s)",
        "model 'acme/bert': download: HTTP 503 (retry 2 of 4 in 0.04 s)"]
    assert hub.count(r"model\.safetensors$", method="GET", status=200) == 1


def test_429_with_retry_after_is_honoured(hub, bert_dir, caplog):
    c1 = hub.add_repo("acme/bert", bert_dir)
    hub.fail(r"^/api/models/acme/bert$", 429, times=1, retry_after=1)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="audit.retry"):
        m = load_hf_model("acme/bert", kind="mlm")
    assert m.revision == c1
    assert time.monotonic() - t0 >= 1.0
    assert "model 'acme/bert': hub: HTTP 429 (retry 1 of 4 in 1.00 s)" in caplog.messages


def test_a_hub_down_for_good_falls_back_to_the_cached_branch(hub, bert_dir, monkeypatch):
    c1 = hub.add_repo("acme/bert", bert_dir)
    load_hf_model("acme/bert", kind="mlm")
    monkeypatch.setenv("BIASAUDIT_HUB_RETRIES", "2")
    hub.fail(r"^/api/models/", 503, times=None)
    m = load_hf_model("acme/bert", kind="mlm")
    assert m.revision == c1
    assert m.resolution == f"hub unreachable (HTTP 503 after 3 attempts): main resolved to {c1} from the cache"
    with pytest.raises(ModelError) as e:
        load_hf_model("acme/never-fetched", kind="mlm")
    assert "\n" not in str(e.value)
    assert str(e.value) == ("model 'acme/never-fetched' (revision main) is not in the local Hugging Face cache and "
                            "the hub could not be reached (HTTP 503); nothing is lost: run the sweep again when "
                            "the hub answers (it resumes and redoes only these tasks), or give a local directory")


# ----------------------------------------------------------------------------- permanent errors


def _error(ref: str, **kw) -> str:
    with pytest.raises(ModelError) as e:
        load_hf_model(ref, kind="mlm", **kw)
    msg = str(e.value)
    assert "\n" not in msg and SECRET not in msg and "wrong-token" not in msg
    return msg


def test_error_lines_say_what_to_do(hub, bert_dir, monkeypatch):
    hub.add_repo("acme/bert", bert_dir)
    hub.add_repo("acme/secret", bert_dir, private=True)
    hub.add_repo("acme/gated", bert_dir, gated=True)
    hub.add_token(SECRET, "alice")
    ep = hub.endpoint

    # anonymous: a missing and a private repository look the same (HTTP 401)
    for repo in ("acme/secret", "acme/missing"):
        assert _error(repo) == (f"model {repo!r}: repository {repo!r} not found on {ep}, or private (HTTP 401, "
                                "no token sent); check the id, or set HF_TOKEN to a token that can read it")
    assert _error("acme/gated") == (f"model 'acme/gated' is gated (HTTP 401): log in at {ep}/acme/gated, accept its "
                                    "licence on the model page, then set HF_TOKEN to a token of that account")
    assert _error("acme/bert@nope") == ("model 'acme/bert@nope': revision 'nope' not found in 'acme/bert' "
                                        "(HTTP 404); check the branch, tag or commit")

    # with a valid token
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert _error("acme/missing") == (f"model 'acme/missing': repository 'acme/missing' not found on {ep} (HTTP 404); "
                                      "check the id; if it is private, the token in use (HF_TOKEN) cannot read it")
    assert _error("acme/gated") == (f"model 'acme/gated' is gated (HTTP 403): log in at {ep}/acme/gated, accept its "
                                    "licence on the model page, then set HF_TOKEN to a token of that account "
                                    "(the token in use has no access yet)")
    hub.grant("acme/gated", "alice")
    hub.grant("acme/secret", "alice")
    assert load_hf_model("acme/gated", kind="mlm").revision == hub.head("acme/gated")
    assert load_hf_model("acme/secret", kind="mlm").revision == hub.head("acme/secret")

    # a token the hub does not know
    monkeypatch.setenv("HF_TOKEN", "wrong-token")
    assert _error("acme/bert") == (f"model 'acme/bert': the hub at {ep} refused the token (HTTP 401, invalid "
                                   "credentials); set HF_TOKEN to a valid token, or unset it for public models")
    # none of these was retried: each permanent answer came once
    assert hub.count(r"^/api/models/acme/missing", status=404) == 1
