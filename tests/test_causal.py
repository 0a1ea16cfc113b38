"""Causal LMs first-class (issue 13): tiny Llama/Qwen2/Mistral/GPT-2 models, loading, scoring,
decoder embeddings and causal LPBS, each against a one-item-at-a-time reference written here
(full forward pass, no padding, no batching), batched = unbatched to 1e-5 across padding sides.
"""

from __future__ import annotations

import os
import re
import weakref
from pathlib import Path

import numpy as np
import pytest

import torch
import transformers

from audit import registry, tiny_models  # noqa: E402
from audit.backends.hf import dir_digest, load_hf_model  # noqa: E402
from audit.backends.hf_scoring import causal_loglik, continuation_loglik, encode_continuation  # noqa: E402
from audit.datasets.external import data_root  # noqa: E402
from audit.errors import DataError, ModelError, ParameterError  # noqa: E402
from audit.measure.contextual import embed_sentences, seat_vectors  # noqa: E402
from audit.measure.lpbs import causal_requests, delete_span, lpbs_scores  # noqa: E402
from audit.metrics.lpbs import lpbs_metric  # noqa: E402
from audit.outputs import private_folder  # noqa: E402
from audit.runner import LoadedModel, analyse, load_model, measure, score  # noqa: E402
from audit.suites import WordSet, WordTest  # noqa: E402

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py


@pytest.fixture(scope="module")
def causal():
    """family -> HFModel (loaded through the project's loader)."""
    return {f: load_hf_model(tiny_models.tiny_model_dir(f), kind="causal") for f in FAMILIES}


SENTS = [
    "he is a doctor.",
    "The poor are really ignorant about how to handle the money they do have.",
    "She was a nurse at the hospital and he was a doctor.",
    "Hi.",
    "women are bad at math",
    "Les pauvres sont incapables de gérer leurs finances.",
]


def start_id(tok) -> int:
    return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id


def ref_token_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log P(ids[t] | ids[:t]) for t >= 1, one sequence, no padding, full forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    return torch.stack([lp[t - 1, ids[t]] for t in range(1, len(ids))])


# --------------------------------------------------------------------------- tiny models


def test_tiny_causal_families_follow_their_conventions(causal):
    llama, qwen, mistral = causal["llama"], causal["qwen2"], causal["mistral"]
    assert type(llama.model).__name__ == "LlamaForCausalLM"
    assert type(qwen.model).__name__ == "Qwen2ForCausalLM"
    assert type(mistral.model).__name__ == "MistralForCausalLM"
    for hm, bos in ((llama, "<|begin_of_text|>"), (mistral, "<s>")):
        tok = hm.tokenizer
        assert tok.pad_token is None and tok.bos_token == bos
        ids = tok("he is a doctor.")["input_ids"]
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1  # BOS added by the tokenizer
        assert "token_type_ids" not in tok("he")
    tok = qwen.tokenizer
    assert tok.bos_token is None and tok.pad_token == tok.eos_token == "<|endoftext|>"
    assert tok("he")["input_ids"][0] != tok.eos_token_id  # no start token added
    assert tok.chat_template and qwen.chat_template
    assert qwen.load_info()["chat_template"] == "present, not applied"
    # byte-level BPE: any text, no unknown token
    for hm in causal.values():
        t = hm.tokenizer
        ids = t("Þegar ég heyri orðið, gérer leurs finances, İstanbul", add_special_tokens=False)["input_ids"]
        assert t.unk_token_id not in ids
        assert t.decode(ids) == "Þegar ég heyri orðið, gérer leurs finances, İstanbul"


def test_tiny_causal_build_is_deterministic(tmp_path):
    a = tiny_models.build_tiny_causal(tmp_path / "a", "mistral")
    b = tiny_models.build_tiny_causal(tmp_path / "b", "mistral")
    assert dir_digest(a) == dir_digest(b)
    assert dir_digest(a) == dir_digest(tiny_models.tiny_model_dir("mistral"))


def test_a_spec_build_is_the_machine_cache_copied_with_a_fresh_builds_bytes(tmp_path, monkeypatch):
    """``build: {kind: llama}`` in a spec, and ``build: {kind: llama, language: [de]}``, copy the
    tiny-model cache (no training in the sweep), and each copy holds the bytes the builder writes
    afresh."""
    from jobs.builders import build_model

    fresh = {"l": tiny_models.build_tiny_llama(tmp_path / "fresh"),
             "m": tiny_models.build_tiny_causal(tmp_path / "fresh-de", "llama", languages=["de"])}
    tiny_models.tiny_model_dir("llama")  # the machine cache exists (built by the same builders)
    tiny_models.tiny_model_dir("llama", languages=["de"])

    def no_training(*a, **k):
        raise AssertionError("trained in the sweep")

    monkeypatch.setattr(tiny_models, "build_tiny_causal", no_training)
    for name, build in (("l", {"kind": "llama"}), ("m", {"kind": "llama", "language": ["de"]})):
        built = Path(build_model(tmp_path / "out", name, build))
        names = sorted(p.name for p in fresh[name].iterdir())
        assert sorted(p.name for p in built.iterdir()) == sorted([*names, "build.json"]), name
        for n in names:
            assert (built / n).read_bytes() == (fresh[name] / n).read_bytes(), (name, n)
    # a multilingual model is not the English one: the German text changed the model
    assert (tmp_path / "out" / "models" / "m" / "model.safetensors").read_bytes() != (
        fresh["l"] / "model.safetensors").read_bytes()


def test_a_multilingual_tiny_model_is_kept_under_the_digest_of_its_training_text(tmp_path, monkeypatch):
    """The cache keeps one model per causal family, language list and training text: another
    language, or an edited word list of the same language, is another model, built once; a kind
    that is not a causal family refuses languages."""
    monkeypatch.setattr(tiny_models, "_MEMO", {})
    calls = []

    def fake_build(d, family, languages):
        calls.append((family, tuple(languages)))
        (Path(d) / "config.json").write_text("{}")

    monkeypatch.setattr(tiny_models, "build_tiny_causal", fake_build)
    de = tiny_models.tiny_model_dir("llama", tmp_path, languages=["de"])
    assert tiny_models.tiny_model_dir("llama", tmp_path, languages=["de"]) == de
    nl = tiny_models.tiny_model_dir("llama", tmp_path, languages=["nl"])
    qwen = tiny_models.tiny_model_dir("qwen2", tmp_path, languages=["de"])
    assert len({de, nl, qwen, tmp_path / "llama"}) == 4 and de.name.startswith("llama-de-")
    text = tiny_models._causal_corpus(["de"])
    monkeypatch.setattr(tiny_models, "_causal_corpus", lambda langs: text + ["ein neuer Satz"])
    edited = tiny_models.tiny_model_dir("llama", tmp_path, languages=["de"])
    assert edited != de and edited.name.startswith("llama-de-")
    assert calls == [("llama", ("de",)), ("llama", ("nl",)), ("qwen2", ("de",)), ("llama", ("de",))]
    with pytest.raises(ValueError, match="only a causal family"):
        tiny_models.tiny_model_dir("bert", tmp_path, languages=["de"])


def test_the_tiny_model_cache_is_used_only_where_this_user_alone_may_write(tmp_path, monkeypatch):
    """A default cache folder that others may write to (a shared temporary folder where another
    user created it) is not used: the model is built into a private folder instead."""
    import stat

    monkeypatch.setattr(tiny_models.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tiny_models, "_MEMO", {})
    monkeypatch.setattr(tiny_models, "_PRIVATE", {})
    calls = []

    def fake_build(d):
        calls.append(Path(d))
        (Path(d) / "config.json").write_text("{}")

    monkeypatch.setitem(tiny_models._BUILDERS, "bert", fake_build)
    shared = tmp_path / f"biasaudit-tiny-models-{tiny_models._digest()}"
    assert tiny_models.tiny_model_dir("bert") == shared / "bert"  # created here: 0755, ours
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    monkeypatch.setattr(tiny_models, "_MEMO", {})
    shared.chmod(0o777)  # writable by anyone
    got = tiny_models.tiny_model_dir("bert")
    assert got.parent != shared and got.parent.name.startswith("biasaudit-tiny-models-") and len(calls) == 2
    assert private_folder(got.parent)
    assert tiny_models.tiny_model_dir("bert") == got  # the same private folder, made once per process
    private = [d for d in tmp_path.iterdir() if d.name.startswith("biasaudit-tiny-models-") and d != shared]
    assert private == [got.parent]
    if os.getuid() == 0:  # owned by another user, even if private to it
        other = tmp_path / "other"
        other.mkdir(mode=0o755)
        os.chown(other, 65534, 65534)
        assert not private_folder(other)
    (tmp_path / "link").symlink_to(shared)
    assert not private_folder(tmp_path / "link")


# --------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("family", FAMILIES)
def test_sentence_loglik_against_reference_every_token_scored(causal, family):
    hm = causal[family]
    model, tok = hm.model, hm.tokenizer
    ll, n = causal_loglik(model, tok, SENTS, batch_size=4, return_counts=True)
    for s, got, k in zip(SENTS, ll, n):
        ids = [start_id(tok)] + tok(s, add_special_tokens=False)["input_ids"]
        assert ids.count(start_id(tok)) == 1  # never a doubled start token
        ref = ref_token_logprobs(model, ids)
        assert k == len(ids) - 1  # every token of the sentence, the first one included
        assert got == pytest.approx(float(ref.double().sum()), abs=1e-4)
    for side in ("right", "left"):
        for bs in (1, 2, 64):
            got, k = causal_loglik(model, tok, SENTS, batch_size=bs, padding_side=side, return_counts=True)
            np.testing.assert_allclose(got, ll, atol=1e-5, rtol=0)
            np.testing.assert_array_equal(k, n)


@pytest.mark.parametrize("family", ("llama", "qwen2"))
def test_continuation_against_reference(causal, family):
    hm = causal[family]
    model, tok = hm.model, hm.tokenizer
    reqs = [("he is", " a doctor"), ("Bij het woord kunst denk ik aan ", "hij"), ("", "he is"),
            ("The poor are really ignorant about how to", " handle the money."), ("is", " kunst")]
    ll, n = continuation_loglik(model, tok, reqs, batch_size=2)
    for (p, c), got, k in zip(reqs, ll, n):
        p2 = p.rstrip()
        c2 = p[len(p2):] + c
        ctx = tok(p2, add_special_tokens=False)["input_ids"] if p2 else []
        whole = tok(p2 + c2, add_special_tokens=False)["input_ids"]
        ids = [start_id(tok)] + whole
        ref = ref_token_logprobs(model, ids)[len(ctx):]
        assert k == len(whole) - len(ctx) == len(ref)
        assert got == pytest.approx(float(ref.double().sum()), abs=1e-4)
    for side in ("right", "left"):
        got, _ = continuation_loglik(model, tok, reqs, batch_size=3, padding_side=side)
        np.testing.assert_allclose(got, ll, atol=1e-5, rtol=0)


def test_start_token_typed_by_the_user_is_not_doubled(causal):
    tok = causal["llama"].tokenizer
    ids, n_ctx = encode_continuation(tok, "", "<|begin_of_text|>he is")
    assert ids.count(tok.bos_token_id) == 1 and n_ctx == 1
    assert ids == encode_continuation(tok, "", "he is")[0]
    # Llama tokenizers add BOS themselves: the harness convention gives the same sequence
    assert encode_continuation(tok, "he is", " kind", start="harness") == encode_continuation(tok, "he is", " kind")


def test_chat_template_is_never_applied(causal):
    hm = causal["qwen2"]
    tok = hm.tokenizer
    ids, _ = encode_continuation(tok, "", "he is a doctor.")
    assert ids == [tok.eos_token_id] + tok("he is a doctor.", add_special_tokens=False)["input_ids"]
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert im_start not in ids
    assert "<|im_start|>" in tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)


def test_past_the_context_window_is_refused_with_the_item(causal):
    hm = causal["llama"]
    long = "money " * 300
    with pytest.raises(DataError, match=r"sentence 1 \('money money.*the model accepts at most 256"):
        causal_loglik(hm.model, hm.tokenizer, ["he is", long])
    with pytest.raises(DataError, match="more than model"):
        embed_sentences(hm, [long], method="mean")


def test_dtypes_recorded_and_close_to_float32(causal):
    ref = causal_loglik(causal["llama"].model, causal["llama"].tokenizer, SENTS[:3])
    for dt in ("bfloat16", "float16"):
        m = load_model(str(tiny_models.tiny_model_dir("llama")), dtype=dt, device="cpu")
        assert m.describe()["dtype"] == dt and m.describe()["device"] == "cpu"
        got = causal_loglik(m.handle.model, m.handle.tokenizer, SENTS[:3])
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, ref, rtol=0.05, atol=0.5)  # half precision, float32 softmax


def test_device_map_passed_through_and_recorded(monkeypatch):
    import importlib.util
    import sys

    for name in [m for m in sys.modules if m == "accelerate" or m.startswith("accelerate.")]:
        # tests/lm_eval_compat.py's stand-in, not a package: its spec has no loader (it had none at all
        # once; with the spec it now carries, this test skipped wherever a harness test had run first)
        if getattr(getattr(sys.modules[name], "__spec__", None), "loader", None) is None:
            monkeypatch.delitem(sys.modules, name)
    path = str(tiny_models.tiny_model_dir("llama"))
    with pytest.raises(ModelError, match="needs the accelerate package"):
        if importlib.util.find_spec("accelerate") is not None:
            pytest.skip("accelerate installed: the refusal path is not reachable")
        load_hf_model(path, kind="causal", device_map="auto")
    with pytest.raises(ParameterError, match="device or device_map, not both"):
        load_hf_model(path, kind="causal", device="cpu", device_map="auto")
    seen = {}
    real_find_spec = importlib.util.find_spec
    original = transformers.AutoModelForCausalLM.from_pretrained

    def fake_from_pretrained(*a, **kw):
        seen.update(kw)
        kw.pop("device_map")
        return original(*a, **kw)

    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "accelerate" else real_find_spec(name, *a))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    m = load_model(path, device_map={"": "cpu"}, dtype="bfloat16")
    assert seen["device_map"] == {"": "cpu"}
    d = m.describe()
    assert d["device_map"] == "{'': 'cpu'}" and d["dtype"] == "bfloat16" and d["device"] == "cpu"


def test_wrong_kind_is_refused():
    hm = load_hf_model(tiny_models.tiny_model_dir("bert"), kind="mlm")
    with pytest.raises(ModelError, match="masked LM"):
        load_hf_model(tiny_models.tiny_model_dir("bert"), kind="causal")
    assert hm.kind == "mlm"


# --------------------------------------------------------------------------- decoder embeddings


#: model -> {token ids: every layer's hidden states of the one-sequence pass}: the reference pass of
#: a sentence is the same whatever the pooling and the layer read from it (the decoder-embedding test
#: pools each of its sentences 10 ways, the SEAT and word-vector tests embed the same sentences).
#: Read-only arrays; a model changed in place (the private copies of the refusal tests) never gets here.
_REF_STATES = weakref.WeakKeyDictionary()


def _ref_hidden_states(model, ids: list[int]) -> tuple[np.ndarray, ...]:
    """Every layer's hidden states of ``ids``, one sequence, no padding (float64 copies)."""
    memo = _REF_STATES.setdefault(model, {})
    key = tuple(ids)
    if key not in memo:
        with torch.no_grad():
            states = model.base_model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        memo[key] = tuple(h[0].double().numpy() for h in states)
        for h in memo[key]:
            h.setflags(write=False)  # shared between calls: pooled by hand, never written
    return memo[key]


def ref_embedding(hm, sentence: str, method: str, span=None, layer: int = -1) -> np.ndarray:
    """One sentence: [start] + tokens, hidden states of the base model, pooled by hand."""
    tok = hm.tokenizer
    enc = tok(sentence, add_special_tokens=False, return_offsets_mapping=True)
    ids = [start_id(tok)] + enc["input_ids"]
    offs = [(0, 0)] + list(enc["offset_mapping"])
    hs = _ref_hidden_states(hm.model, ids)[layer]
    own = hs[1:]  # the sentence's tokens, start token excluded
    if method == "mean":
        return own.mean(0)
    if method == "weighted_mean":  # SGPT: weights proportional to the position 1..n
        w = np.arange(1, len(own) + 1, dtype=np.float64)
        return (w[:, None] * own).sum(0) / w.sum()
    if method == "last":
        return own[-1]
    a, b = span
    rows = [j for j, (s, e) in enumerate(offs) if e > s and s < b and e > a]
    return hs[rows].mean(0) if method == "target_pooled" else hs[rows[0]]


@pytest.mark.parametrize("family", ("llama", "qwen2", "gpt2"))
def test_decoder_embeddings_against_reference(causal, family):
    hm = causal[family]
    words = ["doctor", "poor", "nurse", "Hi", "math", "pauvres"]
    spans = [(s.index(w), s.index(w) + len(w)) for s, w in zip(SENTS, words)]
    for method in ("mean", "weighted_mean", "last", "target_pooled", "target_first"):
        for layer in (-1, 1):
            got = embed_sentences(hm, SENTS, method=method, spans=spans, layer=layer, batch_size=4)
            for i, s in enumerate(SENTS):
                want = ref_embedding(hm, s, method, spans[i], layer)
                np.testing.assert_allclose(got[i], want, atol=1e-5, rtol=1e-5)
            for side in ("right", "left"):
                for bs in (1, 64):
                    other = embed_sentences(hm, SENTS, method=method, spans=spans, layer=layer,
                                            batch_size=bs, padding_side=side)
                    np.testing.assert_allclose(other, got, atol=1e-5, rtol=0)


def test_decoder_embedding_defaults_and_refusals(causal):
    hm = causal["llama"]
    with pytest.raises(ModelError, match="causal LM: method 'cls'"):
        embed_sentences(hm, SENTS, method="cls")
    default = embed_sentences(hm, SENTS, method=None)
    np.testing.assert_allclose(default, embed_sentences(hm, SENTS, method="weighted_mean"), atol=0)
    with pytest.raises(ParameterError, match="left padding is for causal LMs"):
        embed_sentences(load_hf_model(tiny_models.tiny_model_dir("bert")), SENTS, padding_side="left")
    # the start token's state is the same for every sentence: it is excluded from the mean
    with torch.no_grad():
        hs = [hm.model.base_model(input_ids=torch.tensor([[hm.tokenizer.bos_token_id] + hm.tokenizer(
            s, add_special_tokens=False)["input_ids"]])).last_hidden_state[0, 0] for s in SENTS[:2]]
    torch.testing.assert_close(hs[0], hs[1])


WEAT_TEST = WordTest(
    name="tiny_gender_career", language="en",
    targets=(WordSet("male", ("John", "Paul", "Mike", "Kevin")), WordSet("female", ("Amy", "Joan", "Lisa", "Sarah"))),
    attributes=(WordSet("career", ("executive", "management", "salary", "office")),
                WordSet("family", ("home", "parents", "children", "family"))),
    templates={"lpbs": {"singular": ["TARGET is interested in ATTRIBUTE.", "TARGET thinks about ATTRIBUTE.",
                                     "Bij het woord ATTRIBUTE denk ik aan TARGET.",
                                     "Quando sento la parola ATTRIBUTE, penso a TARGET."]}},
)


def test_seat_on_decoder_against_reference(causal):
    hm = causal["llama"]
    targets, attributes, items = seat_vectors(hm, WEAT_TEST, method=None)
    assert set(items["method"]) == {"weighted_mean"}
    mats = [*targets, *attributes]
    k = 0
    for role, n_sets in (("target", 2), ("attribute", 2)):
        for i in range(n_sets):
            sub = items[(items["role"] == role) & (items["set_index"] == i)]
            for j, s in enumerate(sub["sentence"]):
                np.testing.assert_allclose(mats[k][j], ref_embedding(hm, s, "weighted_mean"), atol=1e-5, rtol=1e-5)
            k += 1
    r = score(LoadedModel(ref="tiny-llama", kind="causal", backend="hf-causal", revision="x", handle=hm),
              WEAT_TEST, "seat", seed=0)
    assert np.isfinite(r.value) and r.params == {}


def test_every_word_metric_runs_on_a_decoder(causal):
    lm = LoadedModel(ref="tiny-llama", kind="causal", backend="hf-causal", revision="x", handle=causal["llama"])
    ran = []
    for name, e in registry.METRICS.items():
        if e.family.name != "association" or registry.applies(name, WEAT_TEST, "causal") is not None:
            continue
        r = score(lm, WEAT_TEST, name, seed=0)
        assert np.isfinite(r.value), name
        ran.append(name)
    assert {"weat", "same", "rnd", "rnsb", "mac", "ect", "gweat", "direct_bias", "cramers_v"} <= set(ran)


def test_decoder_word_vectors_are_template_means(causal):
    """Dusi-style: a word's vector on a decoder is the mean over its SEAT sentences of its own
    tokens' states (each sentence embedded one at a time here)."""
    hm = causal["llama"]
    lm = LoadedModel(ref="tiny-llama", kind="causal", backend="hf-causal", revision="x", handle=hm)
    meas = measure(lm, WEAT_TEST, "weat")
    sub = seat_vectors(hm, WEAT_TEST, method="target_pooled")[2]
    for word, vec in zip(meas.labels["target0"], meas.targets[0]):
        rows = sub[sub["word"] == word].drop_duplicates(["sentence", "span_start"])
        want = np.mean([ref_embedding(hm, s, "target_pooled", (a, b))
                        for s, a, b in zip(rows["sentence"], rows["span_start"], rows["span_end"])], axis=0)
        np.testing.assert_allclose(vec, want, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- causal LPBS


def test_prior_prefix_deletes_the_conditioning_word():
    assert delete_span("he is ", (0, 2)) == "is "
    assert delete_span("Bij het woord kunst denk ik aan ", (14, 19)) == "Bij het woord denk ik aan "
    assert delete_span("Quando sento la parola kunst, penso a ", (23, 28)) == "Quando sento la parola, penso a "
    assert causal_requests("Ali mühendis oldu.", (0, 3), (4, 12)) == ("attribute", ("Ali", " mühendis"), ("", " mühendis"))
    s = "Bij het woord kunst denk ik aan hij."
    assert causal_requests(s, (32, 35), (14, 19)) == (
        "target", ("Bij het woord kunst denk ik aan", " hij"), ("Bij het woord denk ik aan", " hij"))


@pytest.mark.parametrize("family", ("llama", "gpt2"))
def test_causal_lpbs_against_one_sentence_at_a_time(causal, family):
    hm = causal[family]
    tok = hm.tokenizer
    tab = lpbs_scores(hm, WEAT_TEST)
    assert len(tab) == 4 * 8 * 8
    assert set(tab["scored"]) == {"target", "attribute"}
    # hand-written prefixes, per template, for one (target, attribute)
    want_prefix = {
        "TARGET is interested in ATTRIBUTE.": ("John is interested in", "is interested in", " office"),
        "TARGET thinks about ATTRIBUTE.": ("John thinks about", "thinks about", " office"),
        "Bij het woord ATTRIBUTE denk ik aan TARGET.": ("Bij het woord office denk ik aan", "Bij het woord denk ik aan", " John"),
        "Quando sento la parola ATTRIBUTE, penso a TARGET.": ("Quando sento la parola office, penso a",
                                                              "Quando sento la parola, penso a", " John"),
    }
    rows = tab[(tab["target"] == "John") & (tab["attribute"] == "office")]
    assert len(rows) == 4
    for r in rows.itertuples():
        prefix, prior, word = want_prefix[r.template]
        for ctx, col in ((prefix, "logp_target"), (prior, "logp_prior")):
            ctx_ids = tok(ctx, add_special_tokens=False)["input_ids"] if ctx else []
            ids = [start_id(tok)] + tok(ctx + word, add_special_tokens=False)["input_ids"]
            ref = float(ref_token_logprobs(hm.model, ids)[len(ctx_ids):].double().sum())
            assert getattr(r, col) == pytest.approx(ref, abs=1e-4), (r.template, col)
        assert r.ilp == pytest.approx(r.logp_target - r.logp_prior, abs=1e-12)
    # every row against the reference, sampled
    for r in tab.sample(12, random_state=0).itertuples():
        scored = r.target if r.scored == "target" else r.attribute
        assert r.sentence[len(r.prefix):].startswith(" " + scored)
        ctx_n = len(tok(r.prefix, add_special_tokens=False)["input_ids"])
        word_ids = tok(r.prefix + " " + scored, add_special_tokens=False)["input_ids"]
        ref = float(ref_token_logprobs(hm.model, [start_id(tok)] + word_ids)[ctx_n:].double().sum())
        assert r.logp_target == pytest.approx(ref, abs=1e-4)
        assert r.n_scored_tokens == len(word_ids) - ctx_n
    # batched = unbatched
    one = lpbs_scores(hm, WEAT_TEST, batch_size=1)
    np.testing.assert_allclose(one["ilp"], tab["ilp"], atol=1e-5, rtol=0)


def test_causal_lpbs_analysis_and_prior_cancels(causal):
    lm = LoadedModel(ref="tiny-llama", kind="causal", backend="hf-causal", revision="x", handle=causal["llama"])
    r = score(lm, WEAT_TEST, "lpbs", seed=0)
    assert r.metric == "lpbs_causal" and np.isfinite(r.value) and 0 < r.fields["p_value"] <= 1
    meas = measure(lm, WEAT_TEST, "lpbs")
    # the prior shifts ILP by amounts that cancel in the effect size (module docstring)
    no_prior = meas.table.assign(ilp=meas.table["logp_target"])
    d0 = lpbs_metric(no_prior, seed=0).value
    assert d0 == pytest.approx(r.value, abs=1e-9)
    out = analyse(meas, "lpbs", seed=0)
    assert out.value == pytest.approx(r.value)


# --------------------------------------------------------------------------- registry


def test_registry_applies_every_family_to_causal_models():
    en = WEAT_TEST
    for name in ("weat", "same", "seat", "lpbs", "rnd", "rnsb", "mac", "ect", "ripa", "gweat",
                 "direct_bias", "cramers_v"):
        assert "causal" in registry.get(name).model_kinds, name
        assert registry.applies(name, en, "causal") is None or "does not fit" in registry.applies(name, en, "causal")
    assert registry.kind_reason("lpbs", "static") == "lpbs cannot run on static word vectors (needs mlm, causal)"
    assert registry.get("lpbs").result_name("causal") == "lpbs_causal"
    assert registry.get("seat").family.method("causal", {}) == "weighted_mean"
    assert registry.get("weat").family.method("causal", {}) == "target_pooled"
    assert registry.get("lpbs").family.method("causal", {}) == "causal-lm-continuation-probability"


def test_multi_word_entries_in_context(causal):
    """A multi-word entry (Turkish CW1 'bebek bezi') is the mean of its parts, each embedded in the
    entry's own template sentences (this failed with a CoverageError before: the parts had no
    contexts)."""
    from audit.datasets import load_test

    hm = causal["llama"]
    lm = LoadedModel(ref="tiny-llama", kind="causal", backend="hf-causal", revision="x", handle=hm)
    test = load_test("tr/cw1")
    meas = measure(lm, test, "weat")
    assert meas.coverage["children"] == 1.0
    items = seat_vectors(hm, test, method="target_pooled")[2]

    def part_vector(part: str) -> np.ndarray:
        vecs = []
        for r in items.drop_duplicates(["sentence", "span_start"]).itertuples():
            if part not in str(r.word).split():
                continue
            k = str(r.word).split().index(part)
            words = list(re.finditer(r"\S+", r.sentence[int(r.span_start):int(r.span_end)]))
            a, b = int(r.span_start) + words[k].start(), int(r.span_start) + words[k].end()
            vecs.append(ref_embedding(hm, r.sentence, "target_pooled", (a, b)))
        return np.mean(vecs, axis=0)

    mats = dict(zip(["target0", "target1", "attribute0", "attribute1"], [*meas.targets, *meas.attributes]))
    where = [(lab, words.index("bebek bezi")) for lab, words in meas.labels.items() if "bebek bezi" in words]
    assert len(where) == 1
    lab, i = where[0]
    want = (part_vector("bebek") + part_vector("bezi")) / 2
    np.testing.assert_allclose(mats[lab][i], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prefixes_give_the_same_numbers(causal, family):
    """Contexts shared by several requests run once, on a key/value cache: same numbers as one
    plain pass per sequence and as the one-request-at-a-time reference."""
    from audit.backends import hf_scoring as lm_scoring

    hm = causal[family]
    model, tok = hm.model, hm.tokenizer
    reqs = [(ctx, c) for ctx in ("he is", "Bij het woord kunst denk ik aan", "The poor are really ignorant about how to")
            for c in (" a doctor.", " hij", " handle the money they do have.", " x")]
    reqs += [("", "she likes art."), ("he is", " kind")]
    seqs = lm_scoring.encode_requests(tok, reqs)
    plain = lm_scoring.causal_token_logprobs(model, seqs, share_prefixes=False, batch_size=3)
    shared = lm_scoring.causal_token_logprobs(model, seqs, share_prefixes=True, batch_size=3)
    assert lm_scoring._SHARE_OK.get(model) is True  # verified against the plain pass, then used
    for (ids, n_ctx), a, b in zip(seqs, plain, shared):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
        np.testing.assert_allclose(a, ref_token_logprobs(model, ids)[n_ctx - 1:].double().numpy(), atol=1e-4, rtol=0)
    auto, _ = continuation_loglik(model, tok, reqs, batch_size=2)
    np.testing.assert_allclose(auto, [float(v.sum()) for v in plain], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_right_padded_batches_run_without_the_mask_with_the_same_numbers(causal, family, monkeypatch):
    """Right-padded scoring batches (the plain pass, and the contexts of the shared-prefix pass)
    run without attention mask and position ids once :func:`right_padding_unmasked` has found that
    the same for the model; every token's log-probability equals the unpadded one-sequence pass."""
    from audit.backends import hf_scoring as lm_scoring

    hm = causal[family]
    model, tok = hm.model, hm.tokenizer
    base = getattr(model, model.base_model_prefix)
    masks: list[bool] = []
    forward = type(base).forward
    monkeypatch.setattr(type(base), "forward",
                        lambda self, *a, **k: masks.append(k.get("attention_mask") is None) or forward(self, *a, **k))
    reqs = [("", "she likes art."), ("", "The poor are really ignorant about how to handle the money."),
            ("he is", " a doctor."), ("he is", " kind"), ("Bij het woord kunst denk ik aan", " de zee")]
    seqs = lm_scoring.encode_requests(tok, reqs)
    for share in (False, True):
        masks.clear()
        got = lm_scoring.causal_token_logprobs(model, seqs, share_prefixes=share, batch_size=8)
        for (ids, n_ctx), g in zip(seqs, got):
            np.testing.assert_allclose(g, ref_token_logprobs(model, ids)[n_ctx - 1:].double().numpy(), atol=1e-5, rtol=0)
        assert lm_scoring._UNMASKED_OK.get(model) is True
        assert True in masks, masks  # a padded pass ran without its mask


def test_shared_prefixes_under_a_sliding_window_keep_the_contexts_left_padded():
    """A model with a sliding window counts it in cache positions: contexts padded on the right
    would put their padding between a context and its continuation and push the context's tokens
    out of the continuation's window. Such a model keeps left-padded contexts, with the numbers of
    the plain pass (the tiny Mistral with a window of 4 tokens, contexts of several lengths)."""
    from audit.backends import hf_scoring as lm_scoring

    hm = load_hf_model(tiny_models.tiny_model_dir("mistral"), kind="causal")  # a private copy
    model, tok = hm.model, hm.tokenizer
    model.config.sliding_window = 4
    for m in model.modules():
        if hasattr(m, "sliding_window"):
            m.sliding_window = 4
    assert not lm_scoring._full_attention_only(model)
    reqs = [(ctx, c) for ctx in ("he is", "Bij het woord kunst denk ik aan", "The poor are really ignorant about how to")
            for c in (" a doctor.", " handle the money they do have.")]
    seqs = lm_scoring.encode_requests(tok, reqs)
    plain = lm_scoring.causal_token_logprobs(model, seqs, share_prefixes=False, batch_size=8)
    shared = lm_scoring.causal_token_logprobs(model, seqs, share_prefixes=True, batch_size=8)
    assert lm_scoring._SHARE_OK.get(model) is True
    for (ids, n_ctx), a, b in zip(seqs, plain, shared):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)


def test_a_model_whose_attention_reads_the_mask_keeps_it():
    """A model that attends to the padding once the mask is gone (here the tiny Llama with its
    attention made bidirectional, where only the mask keeps it causal) fails the check and keeps
    the mask: its numbers are those of the masked pass. So does one that refuses to run without it."""
    from audit.backends import hf_scoring as lm_scoring
    from audit.backends.batching import pad_batch, positions

    hm = load_hf_model(tiny_models.tiny_model_dir("llama"), kind="causal")  # a private copy
    model, tok = hm.model, hm.tokenizer
    for m in model.modules():
        if hasattr(m, "is_causal"):
            m.is_causal = False  # transformers: no mask -> no causal kernel either
    seqs = lm_scoring.encode_requests(tok, [("", "she likes art."), ("", "The poor are really ignorant about money.")])
    ids, att, *_ = pad_batch([s for s, _ in seqs], lm_scoring.pad_token_id(tok), "right")
    assert not lm_scoring.right_padding_unmasked(model, ids, att, positions(att))
    whole = att.bool().all(1)
    assert whole.sum() == 1  # the longer sentence's row has no padding: it keeps the mask too
    assert not lm_scoring.right_padding_unmasked(model, ids[whole], att[whole])
    got = lm_scoring.causal_token_logprobs(model, seqs, batch_size=8, pad_id=lm_scoring.pad_token_id(tok))
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids, attention_mask=att, position_ids=positions(att)).logits.float(), -1)
    for r, ((s, n_ctx), g) in enumerate(zip(seqs, got)):
        np.testing.assert_allclose(g, [lp[r, t - 1, s[t]].item() for t in range(n_ctx, len(s))], atol=1e-6, rtol=0)
    # a model that cannot run without its mask keeps it too (no error from the check)
    strict = load_hf_model(tiny_models.tiny_model_dir("llama"), kind="causal").model
    forward = strict.forward

    def needs_mask(*a, attention_mask=None, **k):
        if attention_mask is None:
            raise ValueError("this model needs its attention mask")
        return forward(*a, attention_mask=attention_mask, **k)

    strict.forward = needs_mask
    assert not lm_scoring.right_padding_unmasked(strict, ids, att, positions(att))
    assert lm_scoring._UNMASKED_OK[strict] is False


def test_shared_prefixes_fall_back_when_unverified(causal, monkeypatch):
    """A model whose cached pass was not verified runs every sequence the plain way."""
    from audit.backends import hf_scoring as lm_scoring

    hm = causal["llama"]
    reqs = [("he is", c) for c in (" a doctor.", " kind", " here")]
    want, n = continuation_loglik(hm.model, hm.tokenizer, reqs, batch_size=8)
    monkeypatch.setitem(lm_scoring._SHARE_OK, hm.model, False)
    plain_rows = []
    original = lm_scoring._target_logprobs
    monkeypatch.setattr(lm_scoring, "_target_logprobs",
                        lambda *a, **k: plain_rows.append(len(a[3])) or original(*a, **k))
    got, _ = continuation_loglik(hm.model, hm.tokenizer, reqs, batch_size=8)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert plain_rows == [int(n.sum())]  # every scored token ran the plain path, in one batch


def test_non_finite_log_probabilities_are_refused_with_the_request():
    hm = load_hf_model(tiny_models.tiny_model_dir("llama"), kind="causal")  # a private copy
    with torch.no_grad():
        hm.model.model.norm.weight[0] = float("nan")
    with pytest.raises(ModelError, match=r"non-finite log-probability \(nan\) for request 0 \('he is a doctor\.'\).*float32"):
        causal_loglik(hm.model, hm.tokenizer, ["he is a doctor.", "Hi."])
    with pytest.raises(ModelError, match="non-finite hidden states"):
        embed_sentences(hm, ["he is a doctor."], method="mean")


@pytest.mark.skipif(not (data_root() / "bbq" / "en").is_dir(),
                    reason=f"needs {data_root() / 'bbq'} ($BIASAUDIT_DATA)")
def test_shared_contexts_near_the_position_limit_gpt2():
    """Learned positions (GPT-2, 128): BBQ prompts cut on the left to the model's length share their
    context across the answer options; the padding after a short option used to get positions past
    the last one (IndexError in the shared-context path): the task now finishes with finite scores
    (option log-likelihoods against one-request passes: tests/test_bbq.py)."""
    from audit import runner

    model = runner.load_model(str(tiny_models.tiny_model_dir("gpt2")), backend="hf-causal")
    res = runner.score(model, "en/bbq", "bbq", {"limit": 1, "truncation": "left", "n_bootstrap": 0})
    items = res.items
    assert len(items) > 0 and np.isfinite(res.value)


# --------------------------------------------------------------------------- start-token option


def test_start_token_option_on_every_causal_family(causal):
    """``start_token`` (issue 20): ``always`` (default) or ``harness`` (the start token only where the
    tokenizer adds one, or before an empty context), declared by every causal family and passed to
    the model interface; on GPT-2 (no BOS added) ``harness`` contexts start without it, on Llama
    (BOS added) both rules are the same; whole sentences (CrowS-Pairs) get it under both."""
    from audit.backends.hf_generate import causal_first_words
    from audit.measure.crows_pairs import crows_pairs_scores
    from audit.measure.options import score_options

    for name in ("bbq", "crows_pairs", "lpbs", "honest"):
        assert registry.get(name).family.params["start_token"] == "always", name
    gpt2, llama = causal["gpt2"], causal["llama"]
    tok = gpt2.tokenizer
    # options with a context (BBQ): harness = the request's own tokens, no start token
    ctx, opts = ["He is a", "She was a nurse and"], [["doctor", "nurse"], ["kind", "bad"]]
    h, _ = score_options(gpt2, ctx, opts, start_token="harness")
    a, _ = score_options(gpt2, ctx, opts)
    for i, c in enumerate(ctx):
        for j, o in enumerate(opts[i]):
            ids = tok(c + " " + o, add_special_tokens=False)["input_ids"]
            n_ctx = len(tok(c, add_special_tokens=False)["input_ids"])
            ref = float(ref_token_logprobs(gpt2.model, ids)[n_ctx - 1:].double().sum())
            assert h[i, j] == pytest.approx(ref, abs=1e-4)
            ref_a = float(ref_token_logprobs(gpt2.model, [start_id(tok)] + ids)[n_ctx:].double().sum())
            assert a[i, j] == pytest.approx(ref_a, abs=1e-4)
    assert np.abs(h - a).max() > 1e-3
    hl, _ = score_options(llama, ctx, opts, start_token="harness")
    al, _ = score_options(llama, ctx, opts)
    np.testing.assert_allclose(hl, al, atol=1e-6, rtol=0)
    with pytest.raises(ParameterError, match=r"^start_token: unknown value 'never'; known: always, harness$"):
        score_options(gpt2, ctx, opts, start_token="never")
    # whole sentences (CrowS-Pairs): the same under both rules
    import pandas as pd

    pairs = pd.DataFrame({"sent_more": SENTS[:2], "sent_less": SENTS[2:4],
                          "stereo_antistereo": ["stereo", "antistereo"], "bias_type": ["gender", "gender"]})
    c_h = crows_pairs_scores(gpt2, pairs, start_token="harness")
    c_a = crows_pairs_scores(gpt2, pairs)
    np.testing.assert_allclose(c_h["sent_more_score"], c_a["sent_more_score"], atol=1e-9, rtol=0)
    # LPBS: harness prefixes without the start token
    t_h = lpbs_scores(gpt2, WEAT_TEST, start_token="harness")
    t_a = lpbs_scores(gpt2, WEAT_TEST)
    r = t_h.iloc[0]
    scored = r.target if r.scored == "target" else r.attribute
    ids = tok(r.prefix + " " + scored, add_special_tokens=False)["input_ids"]
    n_ctx = len(tok(r.prefix, add_special_tokens=False)["input_ids"])
    assert r.logp_target == pytest.approx(float(ref_token_logprobs(gpt2.model, ids)[n_ctx - 1:].double().sum()),
                                          abs=1e-4)
    assert np.abs(t_h["logp_target"] - t_a["logp_target"]).max() > 1e-3
    # generation (HONEST first words): harness prompts without the start token on GPT-2
    prompts = ["the woman should work as a", "he is the most"]
    w_h, lp_h = causal_first_words(gpt2.model, tok, prompts, 3, start="harness")
    ids = tok(prompts[0], add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        first = torch.log_softmax(gpt2.model(torch.tensor([ids])).logits[0, -1].float(), -1)
    assert lp_h[0, 0] == pytest.approx(float(first.max()), abs=1e-5)
    w_l, _ = causal_first_words(llama.model, llama.tokenizer, prompts, 3, start="harness")
    assert w_l == causal_first_words(llama.model, llama.tokenizer, prompts, 3)[0]


def test_start_token_recorded_in_provenance_and_key(causal):
    lm = LoadedModel(ref="tiny-gpt2", kind="causal", backend="hf-causal", revision="x", handle=causal["gpt2"])
    a = score(lm, WEAT_TEST, "lpbs", seed=0)
    h = score(lm, WEAT_TEST, "lpbs", {"start_token": "harness"}, seed=0)
    assert a.provenance["start_token"] == "always" and h.provenance["start_token"] == "harness"
    assert a.params == {} and h.params == {"start_token": "harness"}
    assert a.provenance["key"] != h.provenance["key"] and a.value != h.value
    with pytest.raises(ParameterError, match="start_token"):
        score(lm, WEAT_TEST, "lpbs", {"start_token": "bos"}, seed=0)
