"""`python -m jobs.results_diff`: the documented check that a refactor moves no number."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from jobs.results_diff import diff_results, main

pytestmark = pytest.mark.unit


def _frame(n=5):
    rng = np.random.default_rng(0)
    return pd.DataFrame({"model": ["m"] * n, "language": ["en"] * n, "test": [f"t{i}" for i in range(n)],
                         "metric": ["weat"] * n, "value": rng.normal(size=n), "effect_size": rng.normal(size=n),
                         "p_value": [0.1, np.nan, 0.3, 0.4, 0.5], "ci_low": -1.0, "ci_high": 1.0,
                         "coverage_min": 1.0, "n_items": 16.0, "key": [f"k{i}" for i in range(n)]})


def test_identical_tables(tmp_path):
    a = _frame()
    d = diff_results(a, a.copy())
    assert d["rows"] == (5, 5, 5) and not any(d["columns"].values()) and d["keys_differ"] == 0
    a.to_parquet(tmp_path / "a.parquet")
    assert main([str(tmp_path / "a.parquet"), str(tmp_path / "a.parquet")]) == 0


def test_a_moved_number_a_lost_row_and_a_new_key_are_reported(tmp_path, capsys):
    a, b = _frame(), _frame()
    b.loc[2, "value"] += 1e-12
    b.loc[1, "p_value"] = 0.2           # NaN -> number
    b.loc[4, "key"] = "other"
    b = b.drop(index=3)
    d = diff_results(a, b)
    assert d["columns"]["value"] == 1 and d["columns"]["p_value"] == 1 and d["keys_differ"] == 1
    assert list(d["only_old"]["test"]) == ["t3"]
    assert diff_results(a, b, atol=1e-9)["columns"]["value"] == 0
    a.to_parquet(tmp_path / "a.parquet")
    b.to_parquet(tmp_path / "b.parquet")
    assert main([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]) == 1
    assert "value          3 identical, 1 differ" in capsys.readouterr().out
