"""Masked-LM and causal-LM scoring (audit.measure.lm_scoring) against straightforward implementations.

Tiny local models from audit/tiny_models.py (built once, cached in $TMPDIR); real CrowS-Pairs
rows from ../shared/data (skipped if absent).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import torch

from audit import tiny_models  # noqa: E402
from audit.backends import hf_scoring as lm_scoring  # noqa: E402
from audit.backends.hf_scoring import (MaskedQuery, causal_loglik, crows_pairs_pll,  # noqa: E402
                              crows_pairs_template, masked_pll, masked_token_logprobs,
                              require_kind, token_spans)
from audit.datasets.external import data_root  # noqa: E402
from audit.errors import DataError, ModelError, ParameterError  # noqa: E402

DATA = data_root()
CROWS = DATA / "crows-pairs" / "crows_pairs_anonymized.csv"


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py


@pytest.fixture(scope="module")
def bert():
    return tiny_models.load_tiny("bert")


@pytest.fixture(scope="module")
def roberta():
    return tiny_models.load_tiny("roberta")


@pytest.fixture(scope="module")
def gpt2():
    return tiny_models.load_tiny("gpt2")


@pytest.fixture(scope="module")
def llama_tok():
    """The tiny Llama's tokenizer, loaded once (the tests only call it, never change it)."""
    return tiny_models.load_tiny("llama")[1]


@pytest.fixture(scope="module")
def crows_rows():
    if not CROWS.is_file():
        pytest.skip(f"CrowS-Pairs data absent at {CROWS}")
    df = pd.read_csv(CROWS)
    # 30 rows: the first 22 and 8 antistereo rows
    anti = df[df["stereo_antistereo"] == "antistereo"].head(8)
    return pd.concat([df.head(22), anti]).drop_duplicates("sent_more").reset_index(drop=True)


def original_order(df: pd.DataFrame) -> list[tuple[str, str]]:
    return [(m, l) if d == "stereo" else (l, m)
            for m, l, d in zip(df["sent_more"], df["sent_less"], df["stereo_antistereo"])]


def naive_crows(model, tok, s1: str, s2: str) -> tuple[float, float]:
    """nyu-mll/crows-pairs mask_unigram, literally: one full forward pass per masked token,
    template positions 1..N-2 (first and last skipped)."""
    ids1 = tok(s1, return_tensors="pt")["input_ids"]
    ids2 = tok(s2, return_tensors="pt")["input_ids"]
    t1, t2 = crows_pairs_template(ids1[0].tolist(), ids2[0].tolist())
    mask = tok.mask_token_id
    sc1 = sc2 = 0.0
    with torch.no_grad():
        for i in range(1, len(t1) - 1):
            for ids, pos, side in ((ids1, t1[i], 1), (ids2, t2[i], 2)):
                m = ids.clone()
                m[0, pos] = mask
                lp = torch.log_softmax(model(m).logits[0, pos], dim=0)[ids[0, pos]].item()
                if side == 1:
                    sc1 += lp
                else:
                    sc2 += lp
    return sc1, sc2


# --------------------------------------------------------------------------- tiny models


def test_tiny_models_realistic_tokenisation(bert, roberta, gpt2):
    m, tok = bert
    assert type(m).__name__ == "BertForMaskedLM" and m.config.hidden_size == 32
    assert m.config.num_hidden_layers == 2
    toks = tok.tokenize("the poor are really ignorant about calculus")
    assert any(t.startswith("##") for t in toks)  # some words split into subtokens
    assert tok("he")["input_ids"][0] == tok.cls_token_id
    _, rtok = roberta
    assert rtok.convert_ids_to_tokens(rtok("he likes art.")["input_ids"])[0] == "<s>"
    assert rtok.mask_token == "<mask>"
    gm, gtok = gpt2
    assert gtok.bos_token == "<|endoftext|>" and gm.config.bos_token_id == gtok.bos_token_id
    assert len(gtok.tokenize(" calculus")) > 1


def test_tiny_models_trained_not_uniform(bert):
    m, tok = bert
    ids = tok("the man is [MASK].", return_tensors="pt")
    with torch.no_grad():
        lp = torch.log_softmax(m(**ids).logits[0], -1)
    assert float(lp.max(-1).values.mean()) > np.log(1 / len(tok)) + 1.0


def test_tiny_models_deterministic_content(roberta):
    cached = tiny_models.tiny_model_dir("roberta")  # built earlier (possibly by another process)
    with tempfile.TemporaryDirectory() as a:
        fresh = tiny_models.build_tiny_roberta(Path(a) / "r")
        for f in ("model.safetensors", "tokenizer.json", "config.json"):
            assert (fresh / f).read_bytes() == (cached / f).read_bytes(), f
    corpus = tiny_models.tiny_corpus()
    assert tiny_models._train_wordpiece(corpus, 700) == tiny_models._train_wordpiece(corpus, 700)


# --------------------------------------------------------------------------- CrowS-Pairs PLL


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_crows_pairs_pll_equals_one_pass_per_mask(kind, crows_rows, request):
    model, tok = request.getfixturevalue(kind)
    pairs = original_order(crows_rows)
    got = crows_pairs_pll(model, tok, pairs, batch_size=48)
    want = np.array([naive_crows(model, tok, a, b) for a, b in pairs])
    assert got.shape == (len(pairs), 3)
    np.testing.assert_allclose(got[:, :2], want, atol=1e-4, rtol=0)
    assert np.all(got[:, 2] > 3)  # unmodified tokens masked per sentence
    assert lm_scoring._SPLIT_OK.get(model) is True  # the head-only path was used and verified


def test_crows_pairs_pll_batch_size_and_fallback_invariant(bert, crows_rows, monkeypatch):
    model, tok = bert
    pairs = original_order(crows_rows.head(6))
    ref = crows_pairs_pll(model, tok, pairs, batch_size=64)
    np.testing.assert_allclose(crows_pairs_pll(model, tok, pairs, batch_size=1), ref, atol=1e-5)
    np.testing.assert_allclose(crows_pairs_pll(model, tok, pairs, batch_size=7), ref, atol=1e-5)
    monkeypatch.setattr(lm_scoring, "_split_head", lambda m: None)  # full-model path
    np.testing.assert_allclose(crows_pairs_pll(model, tok, pairs, batch_size=5), ref, atol=1e-5)


def test_unverified_head_split_falls_back_to_full_model(bert):
    model, tok = bert

    class Tempered(torch.nn.Module):
        """Looks like BERT (bert + cls) but its forward divides the logits by 2."""

        base_model_prefix = "bert"

        def __init__(self, inner):
            super().__init__()
            self.bert, self.cls, self.config = inner.bert, inner.cls, inner.config

        def forward(self, input_ids=None, attention_mask=None):
            h = self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]
            return type("Out", (), {"logits": self.cls(h) / 2})()

    tempered = Tempered(model).eval()
    sents = ["he likes art.", "she likes math."]
    got = masked_pll(tempered, tok, sents)
    assert lm_scoring._SPLIT_OK.get(tempered) is False
    for s_, g in zip(sents, got):
        ids = tok(s_, return_tensors="pt")["input_ids"]
        total = 0.0
        with torch.no_grad():
            for p in range(1, ids.shape[1] - 1):
                m = ids.clone()
                m[0, p] = tok.mask_token_id
                total += torch.log_softmax(tempered(m).logits[0, p], 0)[ids[0, p]].item()
        assert g == pytest.approx(total, abs=1e-4)
    assert not np.allclose(got, masked_pll(model, tok, sents), atol=1e-3)


def test_crows_template_matches_difflib_and_skips_specials(bert):
    _, tok = bert
    ids1 = tok("the poor are ignorant.")["input_ids"]
    ids2 = tok("the very rich are ignorant.")["input_ids"]
    t1, t2 = crows_pairs_template(ids1, ids2)
    assert len(t1) == len(t2) and t1[0] == 0 and t2[0] == 0
    assert t1[-1] == len(ids1) - 1 and t2[-1] == len(ids2) - 1
    assert all(ids1[a] == ids2[b] for a, b in zip(t1, t2))
    got = crows_pairs_pll(bert[0], tok, [("the poor are ignorant.", "the very rich are ignorant.")])
    assert got[0, 2] == len(t1) - 2  # CLS and SEP never masked


def test_masked_pll_equals_naive(roberta):
    model, tok = roberta
    sents = ["he likes math.", "The rich are really ignorant about money."]
    got = masked_pll(model, tok, sents, batch_size=4)
    for s, g in zip(sents, got):
        enc = tok(s, return_tensors="pt", return_special_tokens_mask=True)
        ids = enc["input_ids"]
        total = 0.0
        with torch.no_grad():
            for p in range(ids.shape[1]):
                if enc["special_tokens_mask"][0, p]:
                    continue
                m = ids.clone()
                m[0, p] = tok.mask_token_id
                total += torch.log_softmax(model(m).logits[0, p], 0)[ids[0, p]].item()
        assert g == pytest.approx(total, abs=1e-4)


def test_masked_token_logprobs_spans_and_duplicates(bert):
    model, tok = bert
    ids = tok("the boys like calculus.")["input_ids"]
    m = list(ids)
    for p in (2, 3):
        m[p] = tok.mask_token_id
    q = MaskedQuery(tuple(m), (2, 3), (ids[2], ids[3]))
    out = masked_token_logprobs(model, tok, [q, q, MaskedQuery(tuple(m), (2,), (ids[2],))])
    assert len(out) == 3 and out[0].shape == (2,)
    np.testing.assert_array_equal(out[0], out[1])
    assert out[2][0] == out[0][0]
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([m])).logits[0], -1)
    np.testing.assert_allclose(out[0], [lp[2, ids[2]].item(), lp[3, ids[3]].item()], atol=1e-5)
    assert np.all(out[0] < 0)
    with pytest.raises(ParameterError, match="position"):
        masked_token_logprobs(model, tok, [MaskedQuery(tuple(m), (99,), (1,))])


def test_token_spans_offsets(bert, roberta):
    for model, tok in (bert, roberta):
        text = "he likes calculus."
        ids, (a, b) = token_spans(tok, text, [(0, 2), (9, 17)])
        got = tok.decode([ids[i] for i in b]).strip()
        assert got == "calculus"
        assert tok.decode([ids[i] for i in a]).strip() == "he"
        with pytest.raises(DataError, match="maps to no token"):
            token_spans(tok, text, [(2, 3)])  # a space


# --------------------------------------------------------------------------- causal LM


def test_causal_loglik_equals_manual(gpt2, crows_rows):
    model, tok = gpt2
    sents = list(crows_rows["sent_more"].head(12)) + ["Hi."]
    ll, n = causal_loglik(model, tok, sents, batch_size=5, return_counts=True)
    for s, got, k in zip(sents, ll, n):
        ids = [tok.bos_token_id] + tok(s)["input_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)
        want = sum(lp[t - 1, ids[t]].item() for t in range(1, len(ids)))
        assert got == pytest.approx(want, abs=1e-4)
        assert k == len(ids) - 1
    np.testing.assert_allclose(causal_loglik(model, tok, sents, batch_size=64), ll, atol=1e-5)
    assert lm_scoring._SPLIT_OK.get(model) is True  # lm_head applied to the scored rows only


def test_causal_head_chunks_and_full_model_fallback(gpt2, monkeypatch):
    model, tok = gpt2
    sents = ["he likes art.", "The rich are really ignorant about how to handle money."]
    ref = causal_loglik(model, tok, sents)
    monkeypatch.setattr(lm_scoring, "HEAD_CHUNK_ROWS", 3)
    np.testing.assert_allclose(causal_loglik(model, tok, sents), ref, atol=1e-5)
    monkeypatch.setattr(lm_scoring, "_split_head", lambda m: None)
    np.testing.assert_allclose(causal_loglik(model, tok, sents), ref, atol=1e-5)


def test_causal_prefix_already_present(gpt2):
    model, tok = gpt2
    a = causal_loglik(model, tok, ["he likes art."])
    b = causal_loglik(model, tok, [tok.bos_token + "he likes art."])
    assert a[0] == pytest.approx(b[0], abs=1e-5)  # BOS typed by the user is the context


# --------------------------------------------------------------------------- errors


def test_errors(bert, gpt2):
    model, tok = bert
    long = " ".join(["money"] * 200)
    with pytest.raises(DataError, match="tokens; the model accepts at most 128"):
        masked_pll(model, tok, [long])
    with pytest.raises(DataError, match="at most"):
        causal_loglik(gpt2[0], gpt2[1], [long])
    with pytest.raises(ModelError, match="no mask token"):
        masked_pll(gpt2[0], gpt2[1], ["he"])

    class NoSpecials:
        bos_token_id = None
        eos_token_id = None

    with pytest.raises(ModelError, match="neither a BOS nor an EOS"):
        lm_scoring.causal_prefix_id(NoSpecials())

    class Fake:
        kind = "encoder"
        ref = "minilm"

    with pytest.raises(ModelError, match="'minilm'.*LPBS needs a masked LM"):
        require_kind(Fake(), "mlm", "LPBS")


# --------------------------------------------------------------------------- continuation_loglik


def _manual_continuation(model, ids: list[int], n_ctx: int) -> float:
    """One request at a time, full forward pass, no padding."""
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(lp[t - 1, ids[t]].item() for t in range(n_ctx, len(ids)))


def test_continuation_loglik_equals_manual_and_padding_sides(gpt2):
    from audit.backends.hf_scoring import continuation_loglik

    model, tok = gpt2
    reqs = [("he is", " a doctor."), ("The poor are ", "really ignorant."), ("", "she likes art."),
            ("women are bad at", " math"), ("he is", " a nurse and she is a doctor at the hospital.")]
    ll, n = continuation_loglik(model, tok, reqs, batch_size=2)
    bos = tok.bos_token_id
    for (p, c), got, k in zip(reqs, ll, n):
        if p.rstrip() != p:  # the trailing space moves to the continuation
            p, c = p.rstrip(), " " + c
        ctx = tok(p, add_special_tokens=False)["input_ids"] if p else []
        whole = tok(p + c, add_special_tokens=False)["input_ids"]
        assert whole[: len(ctx)] == ctx
        ids = [bos] + whole
        assert k == len(whole) - len(ctx)
        assert got == pytest.approx(_manual_continuation(model, ids, 1 + len(ctx)), abs=1e-4)
    for side in ("right", "left"):
        for bs in (1, 3, 64):
            got, k = continuation_loglik(model, tok, reqs, batch_size=bs, padding_side=side)
            np.testing.assert_allclose(got, ll, atol=1e-5)
            np.testing.assert_array_equal(k, n)


def test_continuation_start_modes_and_errors(gpt2):
    from audit.backends.hf_scoring import continuation_loglik, encode_continuation

    model, tok = gpt2
    ids, n_ctx = encode_continuation(tok, "he is", " kind")
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    h_ids, h_ctx = encode_continuation(tok, "he is", " kind", start="harness")  # GPT-2 adds no BOS
    assert h_ids == ids[1:] and h_ctx == n_ctx - 1
    # never a doubled start token: a typed BOS is the one used
    t_ids, t_ctx = encode_continuation(tok, tok.bos_token + "he is", " kind")
    assert t_ids == ids and t_ctx == n_ctx
    with pytest.raises(DataError, match="request 1 .*no tokens to score"):
        continuation_loglik(model, tok, [("a", " b"), ("he is", "")])
    with pytest.raises(DataError, match=r"request 0 \('money money.*at most 128"):
        continuation_loglik(model, tok, [("money " * 100, "money " * 100)])
    with pytest.raises(ParameterError, match="padding_side"):
        continuation_loglik(model, tok, [("a", " b")], padding_side="middle")


# --------------------------------------------------------------------------- token-budget batches


def test_token_budget_batches_equal_one_at_a_time(gpt2, monkeypatch):
    """``batch_size=None`` fills batches up to a token budget (sequences x longest, padding
    included): every token's log-probability equals the unpadded one-sequence pass within 1e-5, for
    sequences of mixed lengths with and without a context, on both padding sides."""
    from audit.backends.hf_scoring import causal_token_logprobs, encode_requests

    model, tok = gpt2
    reqs = [("", "she likes art."), ("he is", " a nurse and she is a doctor at the hospital in the city."),
            ("", "The poor are really ignorant about how to handle the money they get."), ("women are", " bad"),
            ("", "he"), ("The rich man said that", " the money is his and not theirs.")]
    seqs = encode_requests(tok, reqs)
    lens = sorted(len(s) for s, _ in seqs)
    assert lens[0] <= 4 and lens[-1] >= 15  # mixed lengths: padding in every batch but the last
    with torch.no_grad():
        want = []
        for ids, n_ctx in seqs:
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            want.append(np.array([lp[t - 1, ids[t]].item() for t in range(n_ctx, len(ids))]))
    shapes: list[tuple[int, int]] = []
    real = lm_scoring._target_logprobs

    def spy(m, input_ids, *a, **kw):
        shapes.append(tuple(input_ids.shape))
        return real(m, input_ids, *a, **kw)

    monkeypatch.setattr(lm_scoring, "_target_logprobs", spy)
    monkeypatch.setattr(lm_scoring, "DEFAULT_TOKENS_CPU", 36)
    assert lm_scoring.default_token_budget(torch.device("cpu")) == 36
    for side in ("right", "left"):
        shapes.clear()
        got = causal_token_logprobs(model, seqs, pad_id=lm_scoring.pad_token_id(tok), padding_side=side)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-5)
        # longest first: the long ones alone or in pairs, the short ones together, each within budget
        assert all(n * w <= 36 or n == 1 for n, w in shapes), shapes
        assert len(shapes) < len(seqs) and max(n for n, _ in shapes) >= 2, shapes
    assert len({n for n, _ in shapes}) >= 2, shapes  # sequences per batch follow their length


def test_run_batched_token_budget():
    from audit.backends.batching import run_batched

    seen: list[list[int]] = []
    lens = [10, 9, 5, 5, 4, 1, 1, 1]
    out = run_batched(lambda b: seen.append(list(b)) or [x * 2 for x in b], list(range(8)), 12, device="cpu",
                      lengths=lens)
    assert out == [2 * x for x in range(8)]
    assert seen == [[0], [1], [2, 3], [4, 5, 6], [7]]  # 10, 9 alone; 2 x 5; 3 x 4 = 12; the last 1 left over
    with pytest.raises(ValueError, match="2 lengths for 3 items"):
        run_batched(lambda b: b, [1, 2, 3], 4, device="cpu", lengths=[1, 2])


#: n -> the tokenizer's own ids of the n texts of the test below (the same for every setting: computed once
#: per n, a fresh list each time)
_REFERENCE_IDS: dict[int, list[list[int]]] = {}


def _reference_ids(tok, n: int, texts: list[str]) -> list[list[int]]:
    if n not in _REFERENCE_IDS:
        _REFERENCE_IDS[n] = [list(x) for x in tok(texts, add_special_tokens=False)["input_ids"]]
    return [list(x) for x in _REFERENCE_IDS[n]]


class _RecordingBackend:
    """A Rust tokenizer's batch entry point that records each call's size and thread."""

    truncation = None
    padding = None

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def encode_batch_fast(self, texts, add_special_tokens):
        import threading

        self.calls.append((len(texts), threading.current_thread().name))
        return self.backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)


@pytest.mark.parametrize("env,threads,n,calls", [
    ("false", 3, 1000, [334, 334, 332]),  # the Rust pool is off: the process's 3 threads
    ("0", 2, 1000, [500, 500]),
    ("false", 3, 600, [300, 300]),  # at least 256 texts a thread: 2
    ("false", 3, 300, [300]),  # too few to split
    ("false", 1, 1000, [1000]),  # one CPU
    (None, 3, 1000, [1000]),  # the Rust pool (TOKENIZERS_PARALLELISM unset)
    ("true", 3, 1000, [1000]),
])
def test_batch_tokenisation_splits_over_the_process_threads_when_the_rust_pool_is_off(monkeypatch, env, threads,
                                                                                       n, calls, llama_tok):
    tok = llama_tok
    texts = [f"text {i}: the {'poor' if i % 3 else 'rich'} person number {i * 7919 % 1000} said hello." for i in range(n)]
    if env is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", env)
    torch.set_num_threads(threads)  # the one_thread fixture restores it
    rec = _RecordingBackend(tok.backend_tokenizer)
    got = lm_scoring._token_ids(type("T", (), {"backend_tokenizer": rec})(), texts)
    assert got == _reference_ids(tok, n, texts)  # same ids, same order
    assert [c for c, _ in rec.calls] == calls
    on_pool = [name.startswith("tokenize") for _, name in rec.calls]
    assert all(on_pool) if len(calls) > 1 else not any(on_pool)
