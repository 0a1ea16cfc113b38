"""The scored-options step (:func:`audit.measure.options.score_options`): its conventions against the
model interface called option by option, and its one-line refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from audit import tiny_models
from audit.backends.hf import load_hf_model
from audit.errors import DataError, ModelError
from audit.measure.options import option_table, score_options

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.unit]  # tests/conftest.py; tier

OPTIONS = [["The nurse is kind.", "The nurse is rude.", "The nurse is here."],
           ["He fixed the car.", "She fixed the car.", "They fixed the car."]]


@pytest.fixture(scope="module")
def models():
    return {k: load_hf_model(str(tiny_models.tiny_model_dir(d)), kind=k) for k, d in (("mlm", "bert"),
                                                                                       ("causal", "gpt2"))}


def test_whole_sentences_on_a_causal_lm_are_rolling_log_likelihoods(models):
    m = models["causal"]
    sc, nt = score_options(m, ["", ""], OPTIONS)
    for i, row in enumerate(OPTIONS):
        ll, n = m.loglikelihood_rolling(row, batch_size=1)
        np.testing.assert_allclose(sc[i], ll, rtol=0, atol=1e-4)
        assert nt[i].tolist() == list(n)


def test_options_after_a_context_are_continuations(models):
    for m in models.values():
        ctx = ["Q: who is it?\nA:", "Q: what happened?\nA:"]
        sc, nt = score_options(m, ctx, OPTIONS)
        for i, row in enumerate(OPTIONS):
            alone, n = m.loglikelihood([(ctx[i], " " + o) for o in row], batch_size=1)
            np.testing.assert_allclose(sc[i], alone, rtol=0, atol=1e-4)
            assert nt[i].tolist() == list(n)
        t = option_table(pd.DataFrame({"item": [0, 1]}), OPTIONS, sc, nt)
        assert list(t.columns) == ["item", "score0", "score1", "score2", "n_tokens0", "n_tokens1", "n_tokens2",
                                   "n_chars0", "n_chars1", "n_chars2"]
        assert t["n_chars1"].tolist() == [len(OPTIONS[0][1]), len(OPTIONS[1][1])]


def test_masked_pairs_follow_the_gold_option(models):
    m = models["mlm"]
    pairs = [row[:2] for row in OPTIONS]
    sc, nt = score_options(m, ["", ""], pairs, gold=[1, 0])
    ref = m.pair_pll([(pairs[0][1], pairs[0][0]), (pairs[1][0], pairs[1][1])])
    np.testing.assert_array_equal(sc[0], [ref[0, 1], ref[0, 0]])
    np.testing.assert_array_equal(sc[1], [ref[1, 0], ref[1, 1]])


def test_refusals_are_one_line(models):
    with pytest.raises(ModelError, match="a masked LM scores whole-sentence options only in pairs"):
        score_options(models["mlm"], ["", ""], OPTIONS, what="toy")
    with pytest.raises(DataError, match=r"^toy: every item needs the same number \(>= 2\) of options; item 0 has 3, "
                                        r"item 1 has 2$"):
        score_options(models["causal"], ["", ""], [OPTIONS[0], OPTIONS[1][:2]], what="toy")
    with pytest.raises(DataError, match="^toy: item 1: the contexts must be all empty"):
        score_options(models["causal"], ["a", ""], OPTIONS, what="toy")
    with pytest.raises(ModelError, match="toy needs a masked LM"):
        score_options(object(), ["", ""], OPTIONS, what="toy")


def test_option_items_are_checked_before_scoring():
    from types import SimpleNamespace

    from audit.errors import ParameterError
    from audit.measure.options import OPTIONS as FAMILY
    from audit.suites import OptionItems

    table = pd.DataFrame({"item": [0, 1], "context": ["", ""], "option0": ["a", "b"], "option1": ["c", "d"],
                          "gold": [0, 2]})
    model = SimpleNamespace(handle=None, kind="causal")
    mp = {"batch_size": None, "limit": None, "delimiter": " "}
    test = OptionItems(name="t", language="en", table=table, source="t.jsonl", n_options=2)
    with pytest.raises(DataError, match=r"^t.jsonl: item 1: field gold: must be an option index 0..1, got 2$"):
        FAMILY.measure(model, test, None, mp, {})
    with pytest.raises(ParameterError, match=r"^limit: expected an integer, got 'x'$"):
        FAMILY.measure(model, test, None, {**mp, "limit": "x"}, {})
    with pytest.raises(DataError, match=r"^t.jsonl: the test's table lacks column\(s\) option1$"):
        FAMILY.measure(model, OptionItems(name="t", language="en", table=table.drop(columns="option1"),
                                          source="t.jsonl", n_options=2), None, mp, {})


def test_start_rule_reaches_the_model(models):
    """``start_token="harness"``: the continuation scored without the start token GPT-2's tokenizer does
    not add (lm-evaluation-harness's ``HFLM``); the default puts it first, so the scores differ."""
    from audit.backends.hf_scoring import continuation_loglik

    m = models["causal"]
    ctx = ["Q: who is it?\nA:", "Q: what happened?\nA:"]
    sc, _ = score_options(m, ctx, OPTIONS, start_token="harness")
    want, _ = continuation_loglik(m.model, m.tokenizer, [(c, " " + o) for c, row in zip(ctx, OPTIONS) for o in row],
                                  start="harness")
    np.testing.assert_allclose(sc.ravel(), want, rtol=0, atol=1e-6)
    always, _ = score_options(m, ctx, OPTIONS)
    assert np.abs(always - sc).max() > 1e-3
