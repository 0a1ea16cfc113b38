"""Uncertainty of the headlines (issue 15, fix 5): CrowS-Pairs standard error, Wilson interval and
what its binomial p-value counts; the LPBS bootstrap interval and its random streams."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest, bootstrap, norm

from audit.errors import ParameterError
from audit.metrics.crows_pairs import crows_pairs_metric
from audit.metrics.lpbs import lpbs_metric

pytestmark = pytest.mark.unit


def _pairs(n_more: int, n_less: int, n_neutral: int, bias_type: str = "gender") -> pd.DataFrame:
    """A causal-LM table: n_more pairs won by sent_more, n_less by sent_less, n_neutral ties."""
    more = [-1.0] * n_more + [-2.0] * n_less + [-3.0] * n_neutral
    less = [-2.0] * n_more + [-1.0] * n_less + [-3.0] * n_neutral
    n = len(more)
    return pd.DataFrame({
        "pair_id": np.arange(n), "bias_type": bias_type, "stereo_antistereo": "stereo",
        "sent_more_score": more, "sent_less_score": less, "variant": "causal_ll",
    })


def _wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson (1927) score interval, written out."""
    z = norm.ppf(0.5 + confidence / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_crows_pairs_metric_stderr_interval_and_tested_pairs():
    """A headline of 50.0 next to a small p-value: 100 of 200 pairs won, 60 neutral, so the
    binomial test counts 100 of the 140 non-neutral pairs (71.4%)."""
    t = _pairs(100, 40, 60)
    f = crows_pairs_metric(t).fields
    assert f["metric_score"] == pytest.approx(50.0)
    # lm-evaluation-harness mean_stderr: sample std (n - 1) of the 0/1 outcomes / sqrt(n)
    x = [1.0] * 100 + [0.0] * 100
    mu = sum(x) / len(x)
    harness = math.sqrt(sum((v - mu) ** 2 for v in x) / (len(x) - 1)) / math.sqrt(len(x))
    assert f["metric_score_stderr"] == pytest.approx(100 * harness, rel=1e-12)
    lo, hi = _wilson(100, 200, 0.95)
    assert f["ci"] == pytest.approx([100 * lo, 100 * hi], rel=1e-9)
    assert f["ci_method"] == "wilson" and f["confidence"] == 0.95
    assert f["p_value_counts"] == "non-neutral pairs"
    assert f["n_tested"] == 140 and f["n_tested_won"] == 100
    assert f["pct_tested"] == pytest.approx(100 * 100 / 140)
    assert f["p_value"] == pytest.approx(binomtest(100, 140, 0.5).pvalue) and f["p_value"] < 1e-6
    # a narrower level gives a narrower interval; the per-type summaries carry the same fields
    g = crows_pairs_metric(t, confidence=0.5).fields
    assert f["ci"][0] < g["ci"][0] < 50.0 < g["ci"][1] < f["ci"][1]
    assert g["per_bias_type"]["gender"]["ci"] == g["ci"]
    assert g["per_bias_type"]["gender"]["n_tested"] == 140


def test_crows_pairs_metric_uncertainty_edge_cases():
    one = crows_pairs_metric(_pairs(1, 0, 0)).fields
    assert one["metric_score_stderr"] is None  # n = 1: no sample standard deviation
    assert one["ci"] == pytest.approx([100 * v for v in _wilson(1, 1, 0.95)])
    ties = crows_pairs_metric(_pairs(0, 0, 3)).fields
    assert ties["p_value"] is None and ties["n_tested"] == 0 and ties["pct_tested"] is None
    assert ties["metric_score_stderr"] == 0.0 and ties["ci"][0] == 0.0
    with pytest.raises(ParameterError, match="confidence"):
        crows_pairs_metric(_pairs(1, 1, 0), confidence=1.0)


def _lpbs_table(seed: int = 0, n_a: int = 6, n_b: int = 7, shift: float = 0.8) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for ai, n in ((0, n_a), (1, n_b)):
        for i in range(n):
            for tpl in ("T1", "T2"):
                for ti in (0, 1):
                    v = rng.normal() + (shift if (ai == 0) == (ti == 0) else 0.0)
                    rows.append((ti, f"t{ti}", "singular", tpl, ai, f"w{ai}{i}", v))
    cols = ["target_set", "target", "form", "template", "attribute_set", "attribute", "ilp"]
    return pd.DataFrame(rows, columns=cols)


def test_lpbs_metric_interval_is_scipy_percentile_bootstrap_over_attribute_words():
    t = _lpbs_table()
    out = lpbs_metric(t, seed=4, n_bootstrap=400)
    f = out.fields
    assert f["ci_method"] == "attributes" and f["n_bootstrap"] == 400 and f["ci_degenerate"] == 0
    items = out.items
    sa = items.loc[items["set"] == "A", "score"].to_numpy()
    sb = items.loc[items["set"] == "B", "score"].to_numpy()

    def d(a, b, axis=-1):
        return (a.mean(axis) - b.mean(axis)) / np.concatenate([a, b], axis).std(axis)  # ddof=0

    # the bootstrap stream is child 1 of SeedSequence(4), derived here independently
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(4).spawn(2)[1]))
    ref = bootstrap((sa, sb), d, n_resamples=400, vectorized=True, paired=False, method="percentile", rng=gen)
    np.testing.assert_allclose(f["ci"], [ref.confidence_interval.low, ref.confidence_interval.high], rtol=1e-10)
    assert f["ci"][0] < out.value < f["ci"][1]
    assert lpbs_metric(t, seed=4, n_bootstrap=400).fields["ci"] == f["ci"]
    assert lpbs_metric(t, seed=4, n_bootstrap=0).fields["ci"] is None
    # sampled permutations: child 0 of the same seed, and the seed recorded
    s = lpbs_metric(t, seed=4, permutations=999, alternative="greater").fields
    assert s["permutation"]["method"] == "sampled" and s["permutation"]["seed"] == 4
    assert s["random_streams"] == {"permutation": 0, "bootstrap": 1}
    with pytest.raises(ParameterError, match="n_bootstrap"):
        lpbs_metric(t, n_bootstrap=-1)
    with pytest.raises(ParameterError, match="confidence"):
        lpbs_metric(t, confidence=0.0)
