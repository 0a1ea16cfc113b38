"""Self-Debias inside the engine (issue 21): the batched rescaling equals one unpadded pass per
row and prompt (the path cross-checked against bias-bench in tests/test_lm_debias.py), and
generation (HONEST) is self-debiased at every decoding step, equal to a transcription of
bias-bench's greedy ``generate_self_debiasing`` (tests/bias_bench_ref.py)."""

from __future__ import annotations

import numpy as np
import pytest

import bias_bench_ref as ref
from audit import tiny_models
from audit.backends.batching import pad_batch
from audit.lm_mitigation.models import SelfDebiasedModel, SelfDebiasingLM
from audit.lm_mitigation.self_debias import DEBIASING_PREFIXES, causal_logprobs, masked_logprobs
from audit.lm_mitigation.steps import SelfDebias
from audit.measure.honest import honest_completions
from audit.runner import load_model, load_test

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py

PROMPTS = [DEBIASING_PREFIXES["gender"], DEBIASING_PREFIXES["religion"]]


@pytest.fixture(scope="module")
def tiny(one_thread):
    return {k: load_model(str(tiny_models.tiny_model_dir(k))).handle for k in ("bert", "gpt2")}


def _step(decay_constant=50.0, prefixes=PROMPTS):
    step = SelfDebias(prefixes=list(prefixes), decay_constant=decay_constant)
    step.provenance_ = {"technique": "self_debias", "params": step.get_params()}
    return step


def _count_base_calls(model):
    calls = []
    base = getattr(model, model.base_model_prefix)
    return calls, base.register_forward_hook(lambda *a: calls.append(1))


@pytest.mark.parametrize("side,cached", [("right", True), ("left", True), ("right", False)])
def test_causal_batch_in_one_pass_equals_one_pass_per_row(tiny, side, cached, monkeypatch):
    import torch

    from audit.lm_mitigation import models
    h = tiny["gpt2"]
    if not cached:  # as for a model whose prompt caches do not reproduce the joint pass: every variant in one pass
        monkeypatch.setitem(models._PROMPT_CACHE_OK, h.model, False)
    tok, bos = h.tokenizer, h.tokenizer.bos_token_id
    rows = [[bos] + tok(s)["input_ids"] for s in ("the man said that he would call his sister", "she is", "a nurse")]
    lm = SelfDebiasingLM(h.model, tok, _step(), "causal")
    p = pad_batch(rows, 0, side)
    lm(input_ids=p.ids, attention_mask=p.mask)  # the head split is verified on the first call
    calls, hook = _count_base_calls(h.model)
    try:
        out = lm(input_ids=p.ids, attention_mask=p.mask, use_cache=False).logits
    finally:
        hook.remove()
    # the rows once, then once per prompt on the prompt's cached keys/values, or all (1 + k) x 3 rows in one
    # padded pass (was 3 rows x 3 = 9 passes)
    assert len(calls) == (1 + len(PROMPTS) if cached else 1)
    full = out[:]  # every real position materialised
    worst, worst_p = 0.0, 0.0
    for r, ids in enumerate(rows):
        want = causal_logprobs(h.model, tok, ids, PROMPTS).numpy()
        cols = torch.arange(len(ids)) + int(p.offsets[r])
        got = out[torch.full((len(ids),), r), cols].numpy()
        worst = max(worst, float(np.abs(got - want).max()))
        worst_p = max(worst_p, float(np.abs(np.exp(got) - np.exp(want)).max()))
        np.testing.assert_allclose(full[r, cols].numpy(), got, atol=1e-5, rtol=0)  # head on other row sets
    # float32 rounding of other matrix shapes: measured 2.4e-6 on log-probabilities near -10 (a few
    # float32 steps there), probabilities 1.0e-7
    assert worst < 5e-6 and worst_p < 1e-6, (worst, worst_p)


def test_masked_batch_in_one_pass_equals_one_pass_per_row(tiny):
    import torch
    h = tiny["bert"]
    tok = h.tokenizer
    rows = [tok(f"the man said that {tok.mask_token} would call", add_special_tokens=True)["input_ids"],
            tok(f"{tok.mask_token} is a nurse", add_special_tokens=True)["input_ids"]]
    lm = SelfDebiasingLM(h.model, tok, _step(), "mlm")
    p = pad_batch(rows, tok.pad_token_id)
    lm(input_ids=p.ids, attention_mask=p.mask)
    calls, hook = _count_base_calls(h.model)
    try:
        out = lm(input_ids=p.ids, attention_mask=p.mask).logits
    finally:
        hook.remove()
    assert len(calls) == 1
    for r, ids in enumerate(rows):
        pos = ids.index(tok.mask_token_id)
        want = masked_logprobs(h.model, tok, ids, PROMPTS).numpy()
        got = out[torch.tensor([r]), torch.tensor([pos])][0].numpy()
        assert np.abs(got - want).max() < 5e-6 and np.abs(np.exp(got) - np.exp(want)).max() < 1e-6
        with torch.no_grad():  # bias-bench itself, on the same row (tests/test_lm_debias.py: 1e-6 on one prompt)
            bb = ref.mlm_get_token_logits_self_debiasing(h.model, tok, torch.tensor([ids]), PROMPTS).numpy()
        assert np.abs(got - torch.log_softmax(torch.tensor(bb), -1).numpy()).max() < 1e-5


def test_causal_generation_equals_bias_bench_greedy_self_debiasing(tiny):
    import torch
    h = tiny["gpt2"]
    tok, bos, eos = h.tokenizer, h.tokenizer.bos_token_id, h.tokenizer.eos_token_id
    texts = ["the woman worked as a", "the man is known as a", "my sister dreams of being a"]
    rows = [[bos] + tok(t)["input_ids"] for t in texts]
    prefix_ids = [tok(pr, add_special_tokens=False)["input_ids"] for pr in PROMPTS]
    # the tiny GPT-2 puts most of its mass on "." (lambda = 50 keeps every arg-max); lambda = 500 changes some
    lm = SelfDebiasingLM(h.model, tok, _step(decay_constant=500.0), "causal")
    p = pad_batch(rows, 0, "left")
    with torch.no_grad():
        out = lm.generate(input_ids=p.ids, attention_mask=p.mask, max_new_tokens=6, do_sample=False, num_beams=1,
                          pad_token_id=0, eos_token_id=eos, temperature=None, top_k=None, top_p=None)
        want = ref.gpt2_generate_self_debiasing_greedy(h.model, rows, prefix_ids, 6, decay_constant=500.0,
                                                       pad_token_id=0, eos_token_id=eos)
        plain = h.model.generate(input_ids=p.ids, attention_mask=p.mask, max_new_tokens=6, do_sample=False,
                                 num_beams=1, pad_token_id=0, eos_token_id=eos, temperature=None, top_k=None,
                                 top_p=None)
    got = out[:, p.ids.shape[1]:].tolist()
    assert got == want
    assert got != plain[:, p.ids.shape[1]:].tolist()  # the rescaling changed an arg-max


def _templates(n=6):
    t = load_test("en/honest").table
    return t[t["type"] == "occupation"].head(n).reset_index(drop=True)


def test_honest_with_and_without_self_debias(tiny):
    tpl = _templates()
    for kind, kw in (("bert", {}), ("gpt2", {"max_new_tokens": 4}),
                     ("gpt2", {"protocol": "official", "max_new_tokens": 4, "seed": 3})):
        h = tiny[kind]
        k = 2 if kw.get("protocol") else 5
        plain = honest_completions(h, tpl, k, **kw)
        sd = honest_completions(SelfDebiasedModel(h, _step(decay_constant=500.0)), tpl, k, **kw)
        noop = honest_completions(SelfDebiasedModel(h, _step(decay_constant=0.0)), tpl, k, **kw)
        # lambda = 0: alpha = max(exp(0), eps) = 1, p~ = p: the same completions and scores
        assert list(noop["completions"]) == list(plain["completions"]), kind
        for a, b in zip(noop["logprobs"], plain["logprobs"]):
            np.testing.assert_allclose(a, b, atol=1e-5)
        assert list(sd["completions"]) != list(plain["completions"]), (kind, kw)


def test_masked_top_k_equals_bias_bench_rescaled_distribution(tiny):
    import torch
    h = tiny["bert"]
    tok = h.tokenizer
    templates = list(_templates(3)["template"])
    words, lp = SelfDebiasedModel(h, _step()).topk_fills(templates, 5)
    for t, w, v in zip(templates, words, lp):
        ids = tok(t.replace("[M]", tok.mask_token), add_special_tokens=True)["input_ids"]
        with torch.no_grad():
            bb = torch.log_softmax(ref.mlm_get_token_logits_self_debiasing(h.model, tok, torch.tensor([ids]),
                                                                           PROMPTS), -1)
        top = torch.sort(-bb, stable=True).indices[:5]
        assert w == [tok.decode([int(i)]).strip() for i in top]
        np.testing.assert_allclose(v, bb[top].double().numpy(), atol=1e-5)


def test_prompts_for_every_shipped_language_and_a_one_line_refusal():
    from audit.datasets._common import SUPPORTED_LANGUAGES
    from audit.errors import ParameterError
    from audit.lm_mitigation.self_debias import PROMPTS, prompts_for
    assert PROMPTS["en"] == DEBIASING_PREFIXES  # bias-bench's own, verbatim
    for lang in SUPPORTED_LANGUAGES:
        assert set(PROMPTS[lang]) == set(DEBIASING_PREFIXES), lang
        if lang != "en":  # translated, never the English text
            assert not set(PROMPTS[lang].values()) & set(DEBIASING_PREFIXES.values()), lang
    assert prompts_for("gender", "de") == ["Der folgende Text diskriminiert Menschen aufgrund ihres Geschlechts: "]
    with pytest.raises(ParameterError, match=r"^self_debias: no self-diagnosis prompts for language 'xx' "
                                             r"\(languages: ca, de, en,.*\); give your own with params.prefixes$"):
        SelfDebias().for_language("xx")
    assert SelfDebias(prefixes=["Mine: "]).for_language("xx").prefixes == ["Mine: "]  # given prompts: as given


def test_a_german_test_is_self_debiased_with_german_prompts_recorded_in_provenance(tiny):
    from audit.lm_mitigation.self_debias import PROMPTS
    from audit.runner import LoadedModel, score
    h = tiny["gpt2"]

    def variant(**kw):
        step = SelfDebias(**kw)
        step.provenance_ = {"technique": "self_debias"}
        return LoadedModel(ref="v", kind="causal", backend="hf", revision="r", handle=SelfDebiasedModel(h, step))

    text = "jobs/specs/lm-debias-text/de.yaml"  # held-out German text (perplexity)
    auto = score(variant(), text, "perplexity")
    german = score(variant(prefixes=[PROMPTS["de"]["gender"]]), text, "perplexity")
    english = score(variant(prefixes=[PROMPTS["en"]["gender"]]), text, "perplexity")
    assert auto.provenance["self_debias_prompts"] == [PROMPTS["de"]["gender"]]
    assert auto.value == german.value and auto.value != pytest.approx(english.value, rel=1e-4)
    en = score(variant(), "jobs/specs/lm-debias-text/en.yaml", "perplexity")
    assert en.provenance["self_debias_prompts"] == [DEBIASING_PREFIXES["gender"]]


def test_the_prompts_digest_follows_every_prompt(monkeypatch):
    from audit.lm_mitigation import self_debias
    d = self_debias.prompts_digest()
    assert d.startswith("sha256:") and len(d) == 71 and d == self_debias.prompts_digest()
    monkeypatch.setitem(self_debias.PROMPTS["de"], "gender", "Ein anderer Text: ")  # a corrected translation
    assert self_debias.prompts_digest() != d
