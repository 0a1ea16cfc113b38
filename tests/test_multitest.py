"""Holm and Benjamini-Hochberg adjustment over families of tests (audit.multitest)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import false_discovery_control

from audit.errors import DataError, ParameterError
from audit.multitest import add_adjusted_pvalues, adjust_pvalues, benjamini_hochberg, holm


def _holm_by_hand(p):
    """Holm's step-down procedure written out: the adjusted p of the i-th smallest is the
    largest (m - j + 1) p_(j) over j <= i, capped at 1."""
    m = len(p)
    order = sorted(range(m), key=lambda i: (p[i], i))
    out = [0.0] * m
    for rank, i in enumerate(order):
        out[i] = min(1.0, max((m - j) * p[order[j]] for j in range(rank + 1)))
    return out


def test_holm_on_known_inputs():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.5, 0.5, 0.9]), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(holm([0.2]), [0.2])
    np.testing.assert_allclose(holm([0.01, 0.01, 0.02]), [0.03, 0.03, 0.03])  # ties


def test_bh_on_known_inputs_and_scipy():
    # sorted 0.005, 0.01, 0.03, 0.04: m p / j = 0.02, 0.02, 0.04, 0.04 (running min from the top)
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03, 0.005]), [0.02, 0.04, 0.04, 0.02])
    p = np.random.default_rng(0).uniform(size=50) ** 3
    np.testing.assert_allclose(benjamini_hochberg(p), false_discovery_control(p, method="bh"), rtol=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0), st.none(), st.just(float("nan"))), min_size=0, max_size=30))
def test_adjustments_against_references_with_missing_values(values):
    """Holm against the hand-written procedure and BH against scipy on the non-missing
    values; missing ones pass through as NaN and do not count in m."""
    h = holm(values)
    b = benjamini_hochberg(values)
    missing = np.array([v is None or np.isnan(v) for v in values], dtype=bool)
    assert np.isnan(h[missing]).all() and np.isnan(b[missing]).all()
    present = [v for v in values if v is not None and not np.isnan(v)]
    if present:
        np.testing.assert_allclose(h[~missing], _holm_by_hand(present), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(b[~missing], false_discovery_control(present, method="bh"), rtol=1e-12)
        raw = np.asarray(present)
        assert (h[~missing] >= raw - 1e-15).all() and (h[~missing] >= b[~missing] - 1e-15).all()
        assert (b[~missing] >= raw - 1e-15).all() and (h[~missing] <= 1.0).all()


def test_adjust_errors_name_the_entry():
    with pytest.raises(DataError, match="entry 1 is 1.5, outside"):
        holm([0.1, 1.5])
    with pytest.raises(DataError, match="entry 0 is not a number"):
        benjamini_hochberg(["low"])
    with pytest.raises(ParameterError, match="unknown p-value adjustment 'bonf'"):
        adjust_pvalues([0.1], "bonf")
    np.testing.assert_allclose(adjust_pvalues([0.1, 0.2], "holm"), [0.2, 0.2])


def _results():
    return pd.DataFrame({
        "model": ["m1"] * 4 + ["m2"] * 3,
        "metric": ["weat", "weat", "weat", "seat", "weat", "weat", "weat"],
        "test": ["weat1", "weat2", "weat3", "weat1", "weat1", "weat2", "weat3"],
        "p_value": [0.01, 0.04, None, 0.03, 0.005, np.nan, 0.5],
    }, index=[10, 11, 12, 13, 14, 15, 16])


def test_add_adjusted_pvalues_default_family_is_model_and_metric():
    df = _results()
    out = add_adjusted_pvalues(df)
    assert list(out.index) == list(df.index) and list(out.columns[:4]) == list(df.columns)
    assert df.columns.tolist() == ["model", "metric", "test", "p_value"]  # input untouched
    # family (m1, weat): 0.01, 0.04 (None passes through); (m1, seat): 0.03 alone; (m2, weat): 0.005, 0.5
    np.testing.assert_allclose(out["p_holm"], [0.02, 0.04, np.nan, 0.03, 0.01, np.nan, 0.5])
    np.testing.assert_allclose(out["p_bh"], [0.02, 0.04, np.nan, 0.03, 0.01, np.nan, 0.5])
    assert out["n_family"].tolist() == [2, 2, 2, 1, 2, 2, 2]
    pd.testing.assert_series_equal(out["p_value"], df["p_value"])  # raw column untouched


def test_add_adjusted_pvalues_other_families_and_errors():
    df = _results()
    one = add_adjusted_pvalues(df, family=())
    present = [0.01, 0.04, 0.03, 0.005, 0.5]
    np.testing.assert_allclose(one["p_holm"].dropna(), _holm_by_hand(present))
    np.testing.assert_allclose(one["p_bh"].dropna(), false_discovery_control(present, method="bh"))
    by_test = add_adjusted_pvalues(df, family=("test",), methods=("holm",))
    assert "p_bh" not in by_test.columns
    np.testing.assert_allclose(by_test["p_holm"], [0.02, 0.04, np.nan, 0.03, 0.015, np.nan, 0.5])
    with pytest.raises(ParameterError, match="lacks column.*language"):
        add_adjusted_pvalues(df, family=("model", "language"))
    with pytest.raises(ParameterError, match="unknown p-value adjustment"):
        add_adjusted_pvalues(df, methods=("fdr",))
    bad = df.assign(p_value=[0.1, 2.0, None, 0.1, 0.1, 0.1, 0.1])
    with pytest.raises(DataError, match="column 'p_value': entry 1 is 2.0"):
        add_adjusted_pvalues(bad)
