"""HONEST ``official`` protocol (the sampled GPT protocol of MilaNLProc/honest) against an
independent reimplementation: its own sampling loop (whole unpadded sequences through the model,
no KV cache) with transformers' logits warpers, the notebook's prompt and completion slicing, and
the ``honest`` package's own any-word rule (``HonestEvaluator.honest_score_inner_sentence``). The
only thing shared with the code under test is the specification of the random numbers: one
``numpy`` stream per template, ``default_rng(SeedSequence(seed).spawn(n)[i]).random((k, max_new_tokens))``,
token ``t`` of sample ``j`` drawn by inverse CDF with ``u[j, t]``."""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from audit import runner, tiny_models
from audit.datasets import load_test
from audit.datasets.external import data_root
from audit.errors import ParameterError

DATA = data_root()
HURTLEX = DATA / "hurtlex"
pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not (HURTLEX / "hurtlex_EN.tsv").is_file(), reason=f"HurtLex absent at {HURTLEX}")]
N_TEMPLATES = 40
K = 5


@pytest.fixture(scope="module")
def gpt2():
    return runner.load_model(str(tiny_models.tiny_model_dir("gpt2")))


@pytest.fixture(scope="module")
def small_test(tmp_path_factory):
    """The first English HONEST lines (a template listed under two groups included), as a file."""
    src = Path(load_test("en/honest").source)
    lines = src.read_text(encoding="utf-8").splitlines()
    young = [ln for ln in lines[1:] if ln.split("\t")[0].startswith("the young ")][:2]
    body = [ln for ln in lines[1:N_TEMPLATES + 1] if ln not in young] + young
    path = tmp_path_factory.mktemp("honest") / "en_small.tsv"
    path.write_text("\n".join([lines[0], *body]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def evaluator():
    from honest import honest as honest_mod

    real = pd.read_csv

    def local(path, *a, **kw):
        p = str(path)
        if p.startswith("https://raw.githubusercontent.com/MilaNLProc/hurtlex/"):
            p = str(HURTLEX / p.rsplit("/", 1)[-1])
        return real(p, *a, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(honest_mod.pd, "read_csv", local)
    try:
        ev = honest_mod.HonestEvaluator("en")
    finally:
        mp.undo()
    # the inclusive level (the evaluator keeps the conservative rows only): a tiny model's short
    # words meet it often enough for the comparison to see hurtful completions
    full = real(HURTLEX / "hurtlex_EN.tsv", sep="\t")
    full["lemma"] = full["lemma"].apply(honest_mod.strip_accent)
    ev.hurtlex, ev.words, ev.categories = full, set(full["lemma"].unique()), set(full["category"].unique())
    return ev


#: model -> {token ids: the full forward pass's last logits}: the model is deterministic in eval
#: mode, so a sequence the reference met before (the prompt of every sample, a prefix sampled
#: twice, the same template in another test) is not run through it again
_NEXT_LOGITS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def reference_samples(model, tok, templates, k, seed, *, max_new_tokens=10, temperature=1.0, top_k=50, top_p=1.0,
                      bos=False):
    """The official notebook's completions, each sequence on its own: prompt ``template.replace(" [M].", "")``
    tokenised by the tokenizer (``bos``: the start token put first), ``max_new_tokens`` tokens sampled
    through transformers' temperature / top-k / top-p warpers (stop at EOS), completion
    ``generated_text[len(template.replace(" [M]", "")):]``. Each step runs the whole sequence
    through the model (no KV cache, no padding, no attention mask); the ``k`` samples of a template,
    all of one length at a step, go through it as the rows of one batch (the notebook's
    ``num_return_sequences``), each row's logits those of its sequence alone."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)]
    streams = np.random.SeedSequence(seed).spawn(len(templates))
    memo = _NEXT_LOGITS.setdefault(model, {})
    cdfs = {}  # token ids -> the warped distribution's CDF (the prompt's, for all k samples, warped once)
    out = []
    for tpl, ss in zip(templates, streams):
        u = np.random.default_rng(ss).random((k, max_new_tokens))
        prompt = tpl.replace(" [M].", "")
        ids = list(tok(prompt)["input_ids"])
        if bos:
            ids = [tok.bos_token_id] + ids
        seqs, new = [list(ids) for _ in range(k)], [[] for _ in range(k)]
        live = list(range(k))  # the samples not ended by EOS
        for t in range(max_new_tokens):
            keys = [tuple(seqs[j]) for j in live]
            todo = list(dict.fromkeys(key for key in keys if key not in memo))
            if todo:
                with torch.inference_mode():
                    logits = model(torch.tensor(todo), use_cache=False).logits[:, -1, :].float()
                for i, key in enumerate(todo):
                    memo[key] = logits[i:i + 1].clone()
            still = []
            for j, key in zip(live, keys):
                cdf = cdfs.get(key)
                if cdf is None:
                    scores = memo[key].clone()
                    for w in warpers:
                        scores = w(torch.tensor([seqs[j]]), scores)
                    p = torch.softmax(scores.double(), dim=-1)[0].numpy()
                    cdf = cdfs[key] = np.cumsum(p)
                nxt = int(min(np.searchsorted(cdf, u[j, t] * cdf[-1], side="right"), len(cdf) - 1))
                if nxt == tok.eos_token_id:
                    continue
                seqs[j].append(nxt)
                new[j].append(nxt)
                still.append(j)
            live = still
            if not live:
                break
        out.append([(prompt + tok.decode(new[j], skip_special_tokens=True))[len(tpl.replace(" [M]", "")):]
                    for j in range(k)])
    return out


def evaluator_any_word(ev, completions):
    """HONEST@k by the evaluator's sentence mode (any word of a completion in HurtLex)."""
    k = len(completions[0])
    flat = ev.honest_score_inner_sentence(completions)
    return sum(s["count"] for s in flat) / (k * len(completions)), [s["count"] for s in flat]


def official(gpt2, test, **decoding):
    return runner.score(gpt2, test, "honest",
                        {"hurtlex": str(HURTLEX), "k": [1, K], "protocol": "official", "seed": 11,
                         "start_token": "harness", "hurtlex_level": "inclusive", **decoding}, language="en")


@pytest.fixture(scope="module")
def official_run(gpt2, small_test):
    return official(gpt2, small_test)


@pytest.mark.parametrize("decoding", [{}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}])
def test_official_equals_an_independent_reimplementation(gpt2, small_test, evaluator, decoding, official_run):
    res = official(gpt2, small_test, **decoding) if decoding else official_run
    templates = list(res.items["template"])
    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    want = reference_samples(model, tok, templates, K, 11, **decoding)
    got = [list(c) for c in res.items["completions"]]
    assert got == want
    score, counts = evaluator_any_word(evaluator, want)
    assert res.fields["honest_k5"] == pytest.approx(score, abs=1e-15)
    assert res.items["n_hurtful_k5"].tolist() == [sum(counts[i * K:(i + 1) * K]) for i in range(len(want))]
    assert res.fields["completion_rule"] == "any_word"
    assert res.provenance["protocol"] == "official" and res.provenance["start_token"] == "harness"
    gen = res.provenance["generation"]
    assert gen == {"max_new_tokens": 10, "temperature": decoding.get("temperature", 1.0),
                   "top_k": decoding.get("top_k", 50), "top_p": decoding.get("top_p", 1.0), "seed": 11}
    if not decoding:
        assert score > 0  # the comparison sees hurtful completions


def test_official_start_token_always_and_other_seeds(gpt2, small_test):
    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    base = {"hurtlex": str(HURTLEX), "k": [K], "protocol": "official"}
    a = runner.score(gpt2, small_test, "honest", {**base, "seed": 3}, language="en")
    templates = list(a.items["template"])[:8]
    assert [list(c) for c in a.items["completions"]][:8] != reference_samples(model, tok, templates, K, 3)
    # the streams are per template: the first 8 templates' samples do not depend on the others
    assert [list(c) for c in a.items["completions"]][:8] == reference_samples(model, tok, templates, K, 3, bos=True)
    b = runner.score(gpt2, small_test, "honest", {**base, "seed": 4}, language="en")
    assert list(a.items["completions"]) != list(b.items["completions"])
    assert a.provenance["start_token"] == "always" and a.provenance["key"] != b.provenance["key"]


def test_first_word_rule_on_the_same_samples(official_run, evaluator):
    """The issue's comparison: the official samples scored by their first word only (the word
    rule of ``first_word_greedy``), against the any-word rule."""
    from audit.backends.hf_generate import first_word
    from audit.metrics.honest import honest_metric

    res = official_run
    firsts = [tuple(first_word(c)[0] for c in row) for row in res.items["completions"]]
    table = res.items[["template", "groups"]].assign(completions=firsts)
    fw = honest_metric(table, language="en", hurtlex=str(HURTLEX), k=[K], hurtlex_level="inclusive")
    from unidecode import unidecode  # the evaluator's normalisation and lemma set, directly

    hits = sum(bool(w) and unidecode(w) in evaluator.words for row in firsts for w in row)
    assert fw.value == pytest.approx(hits / (K * len(firsts)), abs=1e-15)
    assert fw.value <= res.fields["honest_k5"]  # a hurtful first word makes its sentence hurtful
    assert res.fields["honest_k5"] > 0
    assert fw.fields["completion_rule"] == "word"


def test_protocol_parameters_are_checked(gpt2, small_test):
    base = {"hurtlex": str(HURTLEX), "k": [1]}
    with pytest.raises(ParameterError, match=r"^protocol: unknown value .*; known: first_word_greedy, official$"):
        runner.score(gpt2, small_test, "honest", {**base, "protocol": "paper"}, language="en")
    with pytest.raises(ParameterError, match="top_p: applies to protocol official only"):
        runner.score(gpt2, small_test, "honest", {**base, "top_p": 0.9}, language="en")
    with pytest.raises(ParameterError, match="decoding: applies to protocol first_word_greedy only"):
        runner.score(gpt2, small_test, "honest", {**base, "protocol": "official", "decoding": "sample"},
                     language="en")
    with pytest.raises(ParameterError, match=r"^start_token: unknown value 'sometimes'; known: always, harness$"):
        runner.score(gpt2, small_test, "honest", {**base, "start_token": "sometimes"}, language="en")
    with pytest.raises(ParameterError, match="parameter top_k of metric 'honest': must be >= 0, got -1"):
        runner.score(gpt2, small_test, "honest", {**base, "protocol": "official", "top_k": -1}, language="en")


def test_default_protocol_unchanged(gpt2, small_test):
    """The default is ``first_word_greedy`` with the start token always: the same completions as
    before the option existed, and no protocol parameter in the key."""
    from audit.backends.hf_generate import causal_first_words
    from audit.measure.honest import causal_prompt

    res = runner.score(gpt2, small_test, "honest", {"hurtlex": str(HURTLEX), "k": [1, 5]}, language="en")
    words, _ = causal_first_words(gpt2.handle.model, gpt2.handle.tokenizer,
                                  [causal_prompt(t) for t in res.items["template"]], 5)
    assert [list(c) for c in res.items["completions"]] == words
    assert res.provenance["protocol"] == "first_word_greedy" and res.provenance["start_token"] == "always"
    assert res.params == {"hurtlex": str(HURTLEX), "k": [1, 5]}
    assert res.provenance["generation"] == {"decoding": "greedy", "seed": 0, "max_new_tokens": 8}
