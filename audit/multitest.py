"""Multiple-comparison adjustment of p-values over families of tests.

A sweep runs hundreds of tests; reading each raw p-value against 0.05 finds "significant" bias
by chance alone. This module adjusts the p-values of each *family* of tests:

* **Holm** (Holm 1979, "A simple sequentially rejective multiple test procedure", Scand. J.
  Statist. 6:65-70) controls the family-wise error rate (the chance of *any* false rejection)
  under any dependence between the tests. With the ``m`` p-values of a family sorted,
  ``p_(1) <= ... <= p_(m)``, the adjusted values are
  ``p~_(i) = min(1, max_{j <= i} (m - j + 1) p_(j))``; rejecting ``p~ <= alpha`` is Holm's
  step-down procedure at level ``alpha``.
* **Benjamini-Hochberg** (Benjamini & Hochberg 1995, "Controlling the false discovery rate",
  JRSS B 57:289-300) controls the false discovery rate (the expected share of false
  rejections among the rejections) for independent or positively dependent tests:
  ``p~_(i) = min(1, min_{j >= i} p_(j) m / j)``: the arithmetic of
  :func:`scipy.stats.false_discovery_control` (``method="bh"``), which the tests compare it with
  (equal to the last bit), written here with numpy because importing ``scipy.stats`` for it cost
  every sweep's driver about 1.1 CPU-seconds (it was the driver's only use of scipy: a
  one-task sweep, 13 CPU-seconds in all processes; docs/architecture.md, "Start-up").

Conventions
-----------
* Missing p-values (``None`` or NaN: failed tasks, metrics without a test) are passed through
  untouched (NaN in the output) and are not counted in ``m``.
* Ties keep their order (stable sort); tied p-values get equal adjusted values.
* A p-value outside [0, 1] or not a number is an error naming the row.
* **Family** (:data:`DEFAULT_FAMILY`): all tests of one model and one metric in a sweep, i.e.
  the rows sharing the values of the columns ``("model", "metric")``; every test, language
  and parameter setting of that model and metric is one member. Another grouping is a tuple
  of column names (``()``: the whole table is one family).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit.errors import DataError, ParameterError

__all__ = [
    "DEFAULT_FAMILY",
    "METHODS",
    "add_adjusted_pvalues",
    "adjust_pvalues",
    "adjust_rows",
    "benjamini_hochberg",
    "holm",
]

#: The default family: all tests of one model and metric.
DEFAULT_FAMILY: tuple[str, ...] = ("model", "metric")

#: Adjustment methods by name, and the column each gets in :func:`add_adjusted_pvalues`.
METHODS = {"holm": "p_holm", "bh": "p_bh"}


def _as_pvalues(p: Any, where: str = "p-values") -> np.ndarray:
    """Float array with NaN for missing values; DataError for non-numbers and values outside
    [0, 1] (naming the position)."""
    raw = list(p) if not isinstance(p, np.ndarray) else p.tolist()
    out = np.empty(len(raw), dtype=np.float64)
    for i, v in enumerate(raw):
        if v is None or (np.ndim(v) == 0 and not isinstance(v, str) and pd.isna(v)):
            out[i] = np.nan
            continue
        if isinstance(v, (bool, np.bool_)):
            raise DataError(f"{where}: entry {i} is a boolean ({v!r}), not a p-value")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise DataError(f"{where}: entry {i} is not a number ({v!r})") from None
        if np.isnan(f):
            out[i] = np.nan
        elif not 0.0 <= f <= 1.0:
            raise DataError(f"{where}: entry {i} is {f!r}, outside [0, 1]")
        else:
            out[i] = f
    return out


def holm(p: Any) -> np.ndarray:
    """Holm-adjusted p-values (module docstring); NaN/None pass through as NaN."""
    x = _as_pvalues(p)
    out = np.full(x.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(x))
    m = ok.size
    if m == 0:
        return out
    order = np.argsort(x[ok], kind="stable")
    ranked = x[ok][order] * (m - np.arange(m))  # (m - j + 1) p_(j), j = 1..m
    adj = np.minimum(1.0, np.maximum.accumulate(ranked))
    out[ok[order]] = adj
    return out


def benjamini_hochberg(p: Any) -> np.ndarray:
    """Benjamini-Hochberg-adjusted p-values (module docstring; the steps of
    :func:`scipy.stats.false_discovery_control`, ``method="bh"``: sort, ``p * (m / i)``, running
    minimum from the largest, clip at 1); NaN/None pass through as NaN."""
    x = _as_pvalues(p)
    out = np.full(x.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(x))
    m = ok.size
    if m == 0:
        return out
    order = np.argsort(x[ok])  # scipy's (default, not stable) sort: tied p-values get equal values either way
    ranked = x[ok][order] * (m / np.arange(1, m + 1, dtype=np.float64))
    adj = np.minimum.accumulate(ranked[::-1])[::-1]
    out[ok[order]] = np.minimum(1.0, adj)
    return out


_FUNCS = {"holm": holm, "bh": benjamini_hochberg}


def adjust_pvalues(p: Any, method: str) -> np.ndarray:
    """Adjust one family's p-values by ``method`` (``"holm"`` or ``"bh"``)."""
    if method not in _FUNCS:
        raise ParameterError(f"unknown p-value adjustment {method!r}; methods: {', '.join(_FUNCS)}")
    return _FUNCS[method](p)


def add_adjusted_pvalues(
    df: pd.DataFrame,
    *,
    family: Sequence[str] | None = DEFAULT_FAMILY,
    p_col: str = "p_value",
    methods: Sequence[str] = ("holm", "bh"),
) -> pd.DataFrame:
    """A copy of ``df`` with the adjusted p-values of each family beside the raw ones.

    Parameters
    ----------
    df : DataFrame
        One row per test, with the raw p-values in ``p_col`` (e.g. a sweep's results table
        with columns ``model``, ``metric``, ``test``, ``p_value``).
    family : sequence of column names, default ``("model", "metric")``
        Rows with equal values in these columns form one family (missing values form their
        own group); ``()`` or None: one family for the whole table.
    p_col : str, default "p_value"
    methods : sequence of {"holm", "bh"}
        Each adds a column (:data:`METHODS`: ``p_holm``, ``p_bh``).

    Returns
    -------
    DataFrame
        ``df`` (same index and row order) plus the adjusted columns and ``n_family`` (number
        of non-missing p-values in the row's family, the ``m`` of the adjustment). Rows with
        a missing p-value get NaN adjusted values.
    """
    if not isinstance(df, pd.DataFrame):
        raise ParameterError(f"expected a pandas DataFrame of results, got {type(df).__name__}")
    keys = list(family or ())
    missing = [c for c in [p_col, *keys] if c not in df.columns]
    if missing:
        raise ParameterError(
            f"results table lacks column(s) {', '.join(missing)} (family {tuple(keys)}, p-values "
            f"{p_col!r}); columns: {', '.join(map(str, df.columns))}"
        )
    for m in methods:
        if m not in METHODS:
            raise ParameterError(f"unknown p-value adjustment {m!r}; methods: {', '.join(METHODS)}")
    out = df.copy()
    pos = np.arange(len(df))
    p = _as_pvalues(df[p_col].tolist(), where=f"column {p_col!r}")
    cols = {METHODS[m]: np.full(len(df), np.nan) for m in methods}
    n_family = np.zeros(len(df), dtype=np.int64)
    groups = [pos] if not keys else [
        np.asarray(ix) for ix in df.reset_index(drop=True).groupby(keys, dropna=False, sort=False).indices.values()
    ]
    for rows in groups:
        for m in methods:
            cols[METHODS[m]][rows] = _FUNCS[m](p[rows])
        n_family[rows] = int((~np.isnan(p[rows])).sum())
    for name, values in cols.items():
        out[name] = values
    out["n_family"] = n_family
    return out


def adjust_rows(df: pd.DataFrame, rows: Any, *, family: Sequence[str] | None = DEFAULT_FAMILY,
                p_col: str = "p_value", unadjusted_n_family: float = np.nan) -> pd.DataFrame:
    """A copy of ``df`` with ``p_holm``, ``p_bh`` and ``n_family`` over the selected ``rows``
    only (a boolean mask: a sweep's finished tasks, a comparison's compared tests), by
    :func:`add_adjusted_pvalues` per ``family``; the other rows are no test of the family and
    get NaN adjusted p-values and ``unadjusted_n_family`` (NaN, or 0 where a count is wanted).
    The one wrapper of the sweep reports and of ``audit compare``/``audit watch``."""
    out = df.copy()
    mask = np.asarray(rows, dtype=bool) if len(out) else np.zeros(0, dtype=bool)
    for c in ("p_holm", "p_bh"):
        out[c] = np.nan
    out["n_family"] = unadjusted_n_family
    if mask.any():
        cols = list(dict.fromkeys([*(family or ()), p_col]))
        sub = out.loc[mask, cols].astype({p_col: "float64"})
        adj = add_adjusted_pvalues(sub, family=tuple(family or ()), p_col=p_col)
        for c in ("p_holm", "p_bh", "n_family"):
            out.loc[mask, c] = adj[c].to_numpy(dtype=np.float64)
    return out

