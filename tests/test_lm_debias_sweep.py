"""LM debiasing as sweep steps (models[i].lm_mitigation): parsing, plan-time refusals, Self-Debias
inside the engine's scoring operations, the variants' revisions, and the bias/LM-ability table."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from audit import tiny_models
from audit.errors import AuditError, ModelError, ParameterError
from audit.lm_mitigation import check_applicable, family_reason
from audit.lm_mitigation.models import SelfDebiasedModel
from audit.lm_mitigation.self_debias import causal_logprobs, masked_logprobs
from audit.lm_mitigation.steps import SelfDebias
from audit.runner import load_model
from jobs import plan as P
from jobs.report import bias_ability_frame, bias_ability_text
from jobs.spec import parse_spec

pytestmark = pytest.mark.unit


def _spec(tmp_path, steps, *, build="bert", metrics=("seat", "lpbs", {"name": "honest", "tests": ["honest"]})):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("My brother reads a book every evening.\nMy sister reads a book every evening.\n",
                      encoding="utf-8")
    d = {"name": "t", "output_dir": str(tmp_path / "out"), "languages": ["en"], "tests": ["gender_career"],
         "metrics": list(metrics), "models": [{"name": "m", "build": {"kind": build}, "lm_mitigation": steps}]}
    return yaml.safe_load(yaml.safe_dump(d).replace("CORPUS", str(corpus)))


def test_spec_steps_are_checked_with_one_line(tmp_path):
    with pytest.raises(AuditError, match=r"models\[0\]\.lm_mitigation\.technique: unknown LM debiasing technique "
                                         r"'hard_debias'"):
        parse_spec(_spec(tmp_path, {"technique": "hard_debias"}), "s.yaml")
    with pytest.raises(AuditError, match=r"lm_mitigation\.corpus: inlp is fitted on a corpus"):
        parse_spec(_spec(tmp_path, {"technique": "inlp"}), "s.yaml")
    with pytest.raises(AuditError, match=r"lm_mitigation\[1\]\.params\.alpha: unknown field; allowed fields: "
                                         r"n_classifiers, n_sentences, seed$"):
        parse_spec(_spec(tmp_path, ["self_debias", {"technique": "inlp", "corpus": "CORPUS", "params": {"alpha": 1}}]),
                   "s.yaml")
    with pytest.raises(AuditError, match=r"lm_mitigation\.corpus: /nonexistent/c.txt: no such file"):
        parse_spec(_spec(tmp_path, {"technique": "cda", "corpus": "/nonexistent/c.txt"}), "s.yaml")
    with pytest.raises(AuditError, match=r"lm_mitigation\.params\.decay_constant: must be >= 0, got -1$"):
        parse_spec(_spec(tmp_path, {"technique": "self_debias", "params": {"decay_constant": -1}}), "s.yaml")


def test_variants_follow_their_original_with_technique_and_digests_in_tags(tmp_path):
    spec = parse_spec(_spec(tmp_path, [{"technique": "inlp", "corpus": "CORPUS", "params": {"n_classifiers": 3}},
                                       "self_debias"]), "s.yaml")
    assert [m.name for m in spec.models] == ["m", "m+inlp", "m+self_debias"]
    orig, inlp, sd = spec.models
    assert orig.run_tags["audit.lm_mitigation"] == "none"
    assert inlp.ref == "built:m+inlp" and inlp.mitigated_from == "m"
    assert inlp.run_tags["audit.lm_mitigation"] == "inlp" and inlp.run_tags["audit.lm_mitigation.param.n_classifiers"] == "3"
    assert inlp.run_tags["audit.lm_mitigation.corpus_digest"].startswith("sha256:")
    assert inlp.run_tags["audit.lm_mitigation.pairs_digest"].startswith("sha256:")
    assert "audit.lm_mitigation.pairs_digest" not in sd.run_tags  # nothing fitted on pairs
    assert P.spec_field(spec, 2) == "models[0].lm_mitigation"


def test_plan_drops_each_family_a_technique_does_not_change_naming_why(tmp_path):
    spec = parse_spec(_spec(tmp_path, [{"technique": "inlp", "corpus": "CORPUS"}, "self_debias"]), "s.yaml")
    plan = P.expand(spec)
    by_model = {}
    for t in plan.tasks:
        by_model.setdefault(t.model, set()).add(t.metric)
    assert by_model["m"] == {"seat", "lpbs", "honest"}
    assert by_model["m+inlp"] == {"seat"} and by_model["m+self_debias"] == {"lpbs", "honest"}
    reasons = {(s.model, s.metric): s.reason for s in plan.skipped}
    assert reasons[("m+inlp", "lpbs")].startswith("inlp does not apply to the lpbs family: it changes representations")
    assert ("m+self_debias", "honest") not in reasons  # generation is self-debiased at every step
    assert reasons[("m+self_debias", "seat")].startswith("self_debias does not apply to the sentences family")


def test_a_technique_that_does_not_apply_to_the_kind_refuses_the_spec(tmp_path, monkeypatch):
    spec = parse_spec(_spec(tmp_path, ["self_debias"]), "s.yaml")
    monkeypatch.setattr(P, "model_kind", lambda *a, **k: "encoder")
    with pytest.raises(ParameterError, match=r"s.yaml: models\[0\]\.lm_mitigation: model 'm': self_debias does not "
                                             r"apply to encoder models"):
        P.model_infos(spec)


def test_registry_reasons():
    check_applicable("cda", "mlm", "sentences")  # weights change: representations too (bias-bench: SEAT on CDA)
    assert family_reason("self_debias", "perplexity") is None
    check_applicable("self_debias", "causal", "completions")  # HONEST: rescaled at every decoding step
    with pytest.raises(ParameterError, match="self_debias does not apply to the sentences family"):
        check_applicable("self_debias", "causal", "sentences")


@pytest.fixture(scope="module")
def tiny(one_thread):
    return {k: load_model(str(tiny_models.tiny_model_dir(k))) for k in ("bert", "gpt2")}


def _sd(handle):
    step = SelfDebias(decay_constant=50.0)
    step.provenance_ = {"technique": "self_debias", "params": step.get_params()}
    return step, SelfDebiasedModel(handle, step)


def test_self_debias_in_the_causal_scorers_equals_the_reference_rescaling(tiny):
    h = tiny["gpt2"].handle
    step, sd = _sd(h)
    sents = ["the man is a doctor", "she works as a nurse in the city"]
    ll, n = sd.loglikelihood_rolling(sents)
    ll0, n0 = h.loglikelihood_rolling(sents)
    assert list(n) == list(n0)
    for s, v in zip(sents, ll):
        ids = [h.tokenizer.bos_token_id] + h.tokenizer(s)["input_ids"]
        lp = causal_logprobs(h.model, h.tokenizer, ids, step.prefixes, decay_constant=50.0).double().numpy()
        want = sum(lp[t - 1, ids[t]] for t in range(1, len(ids)))
        assert v == pytest.approx(want, abs=1e-4)
    assert not np.allclose(ll, ll0, atol=1e-3)  # the rescaling changed the scores
    c, _ = sd.loglikelihood([("the man is", " a doctor")])
    c0, _ = h.loglikelihood([("the man is", " a doctor")])
    assert c[0] != pytest.approx(c0[0], abs=1e-4)


def test_self_debias_length_limit_leaves_room_for_the_prompt(tiny):
    """The prompt goes before every input: the variant's limit is the model's minus the prompt's
    tokens (causal: the prompt; masked: CLS + prompt in place of CLS), so an input that fits the
    original but not the prompted forward is refused in one line, and BBQ's left truncation cuts
    to the smaller limit (a position-embedding IndexError / RuntimeError before)."""
    from audit.errors import DataError
    from audit.measure.bbq import fit_prompts

    for kind, n_prompt in (("gpt2", 30), ("bert", 27)):
        h = tiny[kind].handle
        step, sd = _sd(h)
        text = step.prefixes[0] if kind == "gpt2" else f"{h.tokenizer.cls_token} {step.prefixes[0]}"
        assert len(h.tokenizer(text, add_special_tokens=False)["input_ids"]) - (kind == "bert") == n_prompt
        assert h.max_length == 128 and sd.max_length == 128 - n_prompt
        long = " ".join(["the man is a doctor"] * 20)
        n_tok = h.count_tokens([long])[0]
        assert 128 - n_prompt < n_tok
        with pytest.raises(DataError, match=f"has {n_tok} tokens; the model accepts at most {128 - n_prompt}$"):
            sd.loglikelihood_rolling([long]) if kind == "gpt2" else sd.loglikelihood([("", long)])
        prompts, cut = fit_prompts(sd, ["the man is a doctor " * 20], [["yes", "no", "maybe"]])
        assert cut[0] > 0 and max(h.count_tokens([prompts[0] + " " + o for o in ("yes", "no", "maybe")])) \
            <= 128 - n_prompt


def test_self_debias_in_the_masked_scorers_equals_bias_bench_at_a_single_mask(tiny):
    h = tiny["bert"].handle
    step, sd = _sd(h)
    s = "the man is a doctor"
    ll, n = sd.loglikelihood([("", s)])  # pseudo-log-likelihood: every token masked in turn
    ids = h.tokenizer(s)["input_ids"]
    want = 0.0
    for t in range(1, len(ids) - 1):
        masked = list(ids)
        masked[t] = h.tokenizer.mask_token_id
        want += float(masked_logprobs(h.model, h.tokenizer, masked, step.prefixes, decay_constant=50.0)[ids[t]])
    assert int(n[0]) == len(ids) - 2 and ll[0] == pytest.approx(want, abs=1e-4)
    with pytest.raises(ModelError, match="self_debias changes the output distribution, not the representations"):
        sd.embed(["the man is here"])
    assert json.loads(sd.load_info()["mitigation"])["technique"] == "self_debias"
    assert sd.revision.startswith(h.revision + "+self_debias:")


def test_bias_and_ability_side_by_side():
    rows = [("m", "en", "en/a", "seat", 0.4), ("m", "en", "en/b", "seat", 0.2), ("m", "en", "en/h", "perplexity", 30.0),
            ("m+sd", "en", "en/a", "seat", np.nan), ("m+sd", "en", "en/h", "perplexity", 33.0)]
    df = pd.DataFrame(rows, columns=["model", "language", "test", "metric", "value"]).assign(status="finished")
    df.loc[3, "status"] = "failed"
    ba = bias_ability_frame(df, model_order=["m", "m+sd"])
    assert list(ba.columns) == ["language", "model", "seat", "seat_n", "perplexity"]
    assert ba["seat"].iloc[0] == pytest.approx(0.3) and ba["seat_n"].tolist() == [2, 0]
    assert math.isnan(ba["seat"].iloc[1]) and ba["perplexity"].tolist() == [30.0, 33.0]
    assert "bias and LM ability (en)" in bias_ability_text(df)
    assert bias_ability_frame(df[df["metric"] == "seat"]).empty  # no LM-ability metric: no table

