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


def test_output_folders_are_read_and_bad_paths_are_one_line(tmp_path, capsys):
    """A sweep's output folder stands for its ``reports/results.parquet``; a path that is not a
    results table exits 2 with one line naming it, no traceback."""
    for d in ("old", "new"):
        (tmp_path / d / "reports").mkdir(parents=True)
        _frame().to_parquet(tmp_path / d / "reports" / "results.parquet")
    assert main([str(tmp_path / "old"), str(tmp_path / "new")]) == 0
    (tmp_path / "loads.jsonl").write_text("{}\n")
    capsys.readouterr()
    assert main([str(tmp_path / "loads.jsonl"), str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "loads.jsonl: not a readable Parquet results table" in err[0]
    assert main([str(tmp_path / "missing"), str(tmp_path / "new")]) == 2
    assert "missing: no results table" in capsys.readouterr().err
