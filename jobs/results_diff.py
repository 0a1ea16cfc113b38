"""Compare two sweeps' results tables value by value (a refactor must not move a number).

    python -m jobs.results_diff OLD/reports/results.parquet NEW/reports/results.parquet [--atol 0]
    python -m jobs.results_diff OLD_OUTPUT_DIR NEW_OUTPUT_DIR      # each sweep's reports/results.parquet

Rows are matched on (model, language, test, metric); for each numeric column both tables have
(value, effect size, p-value, CI bounds, coverage, item count) it counts the rows whose values
differ by more than ``--atol`` (NaN equals NaN), and it checks that the ``audit.key`` of every
task is the same. Exit status 0 when every planned row is in both tables with equal values and
keys, 1 otherwise (each difference is listed, the first ``--show`` of them).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np
import pandas as pd

ROW_KEYS = ["model", "language", "test", "metric"]
VALUE_COLUMNS = ["value", "effect_size", "p_value", "ci_low", "ci_high", "coverage_min", "n_items"]


def diff_results(old: pd.DataFrame, new: pd.DataFrame, *, atol: float = 0.0) -> dict:
    """``{"rows": (n_old, n_new, n_matched), "only_old", "only_new", "columns": {col: n_diff},
    "keys_differ": n, "differences": DataFrame}``."""
    m = old.merge(new, on=ROW_KEYS, how="outer", suffixes=("_old", "_new"), indicator=True)
    both = m[m["_merge"] == "both"]
    cols, rows = {}, []
    for c in VALUE_COLUMNS:
        if f"{c}_old" not in both or f"{c}_new" not in both:
            continue
        x = pd.to_numeric(both[f"{c}_old"], errors="coerce").to_numpy(dtype=float)
        y = pd.to_numeric(both[f"{c}_new"], errors="coerce").to_numpy(dtype=float)
        bad = ~((np.abs(x - y) <= atol) | (np.isnan(x) & np.isnan(y)))
        cols[c] = int(bad.sum())
        for i in np.flatnonzero(bad):
            r = both.iloc[i]
            rows.append({**{k: r[k] for k in ROW_KEYS}, "column": c, "old": x[i], "new": y[i]})
    keys = int((both["key_old"] != both["key_new"]).sum()) if "key_old" in both else 0
    return {
        "rows": (len(old), len(new), len(both)),
        "only_old": m[m["_merge"] == "left_only"][ROW_KEYS], "only_new": m[m["_merge"] == "right_only"][ROW_KEYS],
        "columns": cols, "keys_differ": keys, "differences": pd.DataFrame(rows),
    }


def _read(path: str) -> pd.DataFrame:
    """A sweep's results table: a Parquet file, or a sweep's output folder (its
    ``reports/results.parquet``); anything else is one line naming the path."""
    from pathlib import Path

    f = Path(path)
    if f.is_dir():
        f = f / "reports" / "results.parquet"
    if not f.is_file():
        raise ValueError(f"{path}: no results table (expected a results.parquet or a sweep output folder holding "
                         "reports/results.parquet)")
    try:
        return pd.read_parquet(f)
    except Exception as e:  # noqa: BLE001 (pyarrow's many error types: one line naming the file)
        raise ValueError(f"{f}: not a readable Parquet results table ({type(e).__name__})") from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m jobs.results_diff", description=__doc__.split("\n\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance (default 0: identical)")
    p.add_argument("--show", type=int, default=20, help="differences to list")
    a = p.parse_args(argv)
    try:
        old, new = _read(a.old), _read(a.new)
    except ValueError as e:
        print(f"results_diff: error: {e}", file=sys.stderr)
        return 2
    d = diff_results(old, new, atol=a.atol)
    n_old, n_new, n_both = d["rows"]
    print(f"rows: {n_old} old, {n_new} new, {n_both} in both; "
          f"{len(d['only_old'])} only in old, {len(d['only_new'])} only in new")
    for c, n in d["columns"].items():
        print(f"{c:<14} {n_both - n} identical, {n} differ")
    print(f"audit.key      {n_both - d['keys_differ']} identical, {d['keys_differ']} differ")
    if len(d["differences"]):
        print(d["differences"].head(a.show).to_string(index=False))
    same = not len(d["only_old"]) and not len(d["only_new"]) and not any(d["columns"].values()) and not d["keys_differ"]
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
