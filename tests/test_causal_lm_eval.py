"""Causal CrowS-Pairs against lm-evaluation-harness 0.4.13 on identical tiny models.

The oracle is the harness's own code: ``HFLM.loglikelihood`` (its tokenisation with the prefix
token for an empty context, its ``Collator`` batching, ``_model_call`` and log-softmax) and the
``crows_pairs`` task's ``doc_to_choice`` / ``process_results`` (``likelihood_diff`` =
|ll(sent_more) - ll(sent_less)|, ``pct_stereotype`` = ll(sent_more) > ll(sent_less)), both
aggregated by ``mean`` as the task's YAML says. Data: the French and the revised English
CrowS-Pairs (the sets the harness's ``crows_pairs_french`` / ``crows_pairs_english`` score),
subsampled per bias type so that the test stays well under a minute. Also: the LPBS-style
continuation requests (non-empty context) against ``HFLM.loglikelihood``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


from lm_eval_compat import assert_close_to_harness, harness_lm, loglikelihood  # noqa: E402
from lm_eval.tasks.crows_pairs.utils import doc_to_choice, process_results  # noqa: E402

from audit import tiny_models  # noqa: E402
from audit.backends.hf import load_hf_model  # noqa: E402
from audit.datasets import load_test  # noqa: E402
from audit.datasets.external import data_root  # noqa: E402
from audit.measure.crows_pairs import crows_pairs_scores  # noqa: E402
from audit.backends.hf_scoring import continuation_loglik  # noqa: E402
from audit.metrics.crows_pairs import crows_pairs_metric  # noqa: E402
from audit.runner import LoadedModel, score  # noqa: E402

MULTI = data_root() / "crows-pairs-multilingual"
needs_data = pytest.mark.skipif(not (MULTI / "crows_pairs_fr.tsv").is_file(), reason=f"no data at {MULTI}")


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py


@pytest.fixture(scope="module")
def models():
    out = {}
    for fam in ("llama", "qwen2"):  # BOS added by the tokenizer / no BOS (EOS is the prefix)
        hm = load_hf_model(tiny_models.tiny_model_dir(fam), kind="causal")
        out[fam] = (hm, harness_lm(hm.model, hm.tokenizer, batch_size=8))
    return out


def sample(test_name: str, per_type: int, tok) -> pd.DataFrame:
    """The first pairs of each bias type that fit the tiny models' 256 positions (every pair does;
    a longer sentence would be refused by both tools: a DataError naming the sentence here, an
    assertion in the harness)."""
    df = load_test(test_name).table
    n = [max(len(tok(a, add_special_tokens=False)["input_ids"]), len(tok(b, add_special_tokens=False)["input_ids"]))
         for a, b in zip(df["sent_more"], df["sent_less"])]
    df = df[np.array(n) < 255]
    return df.groupby("bias_type", sort=True).head(per_type).reset_index(drop=True)


@needs_data
@pytest.mark.parametrize("test_name", ["fr/crows_pairs", "en/crows_pairs_revised"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_causal_crows_pairs_equals_lm_eval(models, test_name, family):
    hm, lm = models[family]
    df = sample(test_name, 10_000 if family == "llama" else 15, hm.tokenizer)
    assert "autre" in set(df["bias_type"])
    if family == "llama":  # every pair of the set that fits the tiny model
        assert len(df) == {"fr/crows_pairs": 1676, "en/crows_pairs_revised": 1677}[test_name]
    # the harness: two loglikelihood requests per doc ("" context, each choice), process_results
    docs = df.to_dict("records")
    reqs = [("", c) for d in docs for c in doc_to_choice(d)]
    res = loglikelihood(lm, reqs)
    per_doc = [process_results(d, res[2 * i: 2 * i + 2]) for i, d in enumerate(docs)]
    ll_h = np.array([r[0] for r in res], dtype=np.float64).reshape(-1, 2)
    # biasaudit
    table = crows_pairs_scores(hm, df, batch_size=16)
    assert_close_to_harness(table["sent_more_score"], ll_h[:, 0])
    assert_close_to_harness(table["sent_less_score"], ll_h[:, 1])
    out = crows_pairs_metric(table)
    # same decision on every pair
    assert out.items["score"].tolist() == [int(p["pct_stereotype"]) for p in per_doc]
    # aggregates as the task's metric_list (mean) reports them
    assert out.fields["likelihood_diff"] == pytest.approx(np.mean([p["likelihood_diff"] for p in per_doc]), abs=1e-4)
    assert out.value == pytest.approx(100 * np.mean([p["pct_stereotype"] for p in per_doc]), abs=1e-9)
    for bt, g in pd.DataFrame(per_doc).assign(bias_type=df["bias_type"]).groupby("bias_type"):
        pb = out.fields["per_bias_type"][bt]
        assert pb["metric_score"] == pytest.approx(100 * g["pct_stereotype"].mean(), abs=1e-9)
        assert pb["likelihood_diff"] == pytest.approx(g["likelihood_diff"].mean(), abs=1e-4)


@needs_data
def test_registered_sets_end_to_end_with_encoding_recorded(models):
    hm, _ = models["llama"]
    lm = LoadedModel(ref="tiny-llama", kind="causal", backend="hf-causal", revision="x", handle=hm)
    fr = score(lm, "fr/crows_pairs", "crows_pairs", {"limit": 10})
    assert fr.metric == "crows_pairs_causal" and fr.fields["n_pairs"] == 10
    assert fr.provenance["encoding"] == "utf-8"
    assert fr.provenance["skipped_pairs"] == [{"pair_id": "129", "row": 129, "reason": "column 'sent_less' is empty"}]
    nl = score(lm, "nl/crows_pairs", "crows_pairs", {"limit": 10})
    assert nl.provenance["encoding"] == "mac_roman (detected; 1 line UTF-8)"
    assert nl.provenance["language"] == "nl" and nl.fields["n_pairs"] == 10


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_continuation_requests_equal_lm_eval(models, family):
    """LPBS/BBQ-style requests with a context: ``start="harness"`` is the harness's convention
    exactly; the default differs only for tokenizers that do not add BOS (Qwen2 here)."""
    hm, lm = models[family]
    reqs = [("he is", " a doctor."), ("Bij het woord kunst denk ik aan ", "hij"), ("The poor are", " rich"),
            ("Quando sento la parola kunst, penso a", " lei"), ("Les pauvres sont incapables de", " gérer leurs finances.")]
    want = np.array([r[0] for r in loglikelihood(lm, reqs)])
    got, _ = continuation_loglik(hm.model, hm.tokenizer, reqs, start="harness", batch_size=2)
    assert_close_to_harness(got, want)
    default, _ = continuation_loglik(hm.model, hm.tokenizer, reqs)
    if family == "llama":
        assert_close_to_harness(default, want)
    else:
        assert np.abs(default - want).max() > 1e-3  # the context starts with the start token here


def test_the_accelerate_stand_in_lets_transformers_be_imported_after_it(tmp_path):
    """Where accelerate is not installed, ``stub_accelerate`` registers a stand-in; transformers
    imported after it (a fresh process: here it is imported already) probes it with
    ``importlib.util.find_spec``, which raised ``ValueError: accelerate.__spec__ is None`` on a
    stand-in without a spec. With one, transformers imports and reports accelerate unavailable."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import importlib.util, sys; real = importlib.util.find_spec('accelerate') is not None; "
            "import lm_eval_compat; lm_eval_compat.stub_accelerate(); "
            "from transformers.utils import is_accelerate_available; "
            "from lm_eval.models.huggingface import HFLM; "
            "print(real, is_accelerate_available())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env={**os.environ,
                                          "PYTHONPATH": str(Path(__file__).parent)})
    assert r.returncode == 0, r.stderr[-2000:]
    real, seen = r.stdout.split()
    assert seen == real  # the stand-in is never mistaken for the package
