"""The result of one (model, test, metric) task, and the provenance it carries."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pandas as pd


@dataclasses.dataclass
class MetricOutput:
    """What a pure metric function returns (the *analyse* step).

    value:  the headline number of the metric (WEAT: effect size; SAME: mean |b|; ...).
    fields: further named numbers or small structures (``statistic``, ``effect_size``,
            ``p_value``, ``ci``, ``n_partitions``, ...). JSON-serialisable.
    items:  the per-item table (one row per word, sentence or pair), or ``None``.
    """

    value: float
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    items: pd.DataFrame | None = None


@dataclasses.dataclass
class Result:
    """A finished task: the metric output plus coverage, parameters and provenance."""

    metric: str
    value: float
    fields: dict[str, Any]
    items: pd.DataFrame | None
    coverage: dict[str, float]
    missing: dict[str, list[str]]
    params: dict[str, Any]
    seed: int | None
    provenance: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: ``metric``, ``value``, the fields at top level, coverage, missing,
        ``params``, ``seed`` and ``provenance`` (model, revision, dataset digest, versions)."""
        out: dict[str, Any] = {"metric": self.metric, "value": _jsonable(self.value)}
        for k, v in self.fields.items():
            out[k] = _jsonable(v)
        out["coverage"] = _jsonable(self.coverage)
        out["missing"] = _jsonable(self.missing)
        out["params"] = _jsonable(self.params)
        out["seed"] = self.seed
        out["provenance"] = _jsonable(self.provenance)
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, allow_nan=False)


def _jsonable(v: Any) -> Any:
    """Convert numpy scalars/arrays and tuples to plain JSON types; NaN/inf become None."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return [_jsonable(x) for x in v.tolist()]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, (np.bool_,)):
        return bool(v)
    return v


#: The element types of a flat list or tuple cell that :func:`json.dumps` writes as
#: :func:`_jsonable` would convert them (``np.float64`` is a ``float``: written by ``float.__repr__``).
_FLAT = frozenset({str, int, float, bool, type(None), np.float64})


def _json_cell(x: Any) -> str:
    """One cell of :func:`json_cells` as JSON text: ``json.dumps(_jsonable(x), ensure_ascii=False,
    default=str)``, a set sorted first. A flat list or tuple of :data:`_FLAT` values (most per-item
    cells: a pair's tokens, an item's options) is written by the C encoder directly, with the same
    text (``tests/test_tracker.py``), a NaN or inf written ``null``; anything else goes through
    :func:`_jsonable` (1.4 M calls for the eight-language smoke sweep's 561 tables)."""
    if type(x) in (list, tuple) and _FLAT.issuperset(map(type, x)):
        try:
            return json.dumps(x, ensure_ascii=False, allow_nan=False)
        except ValueError:  # a NaN or inf: None, as in the general path
            return json.dumps([None if isinstance(v, float) and not math.isfinite(v) else v for v in x],
                              ensure_ascii=False, allow_nan=False)
    return json.dumps(_jsonable(sorted(x) if isinstance(x, set) else x), ensure_ascii=False, default=str)


def json_cells(items: pd.DataFrame) -> pd.DataFrame:
    """A copy of a per-item table whose list, tuple, dict and set cells are JSON text (for
    formats without nested values: CSV, MLflow tables), so a reader parses them with
    ``json.loads`` instead of getting Python repr strings such as ``('a', 'b')``."""
    df = items.copy()
    for c in df.columns:
        if df[c].dtype == object:
            df[c] = [_json_cell(x) if isinstance(x, (list, tuple, dict, set, np.ndarray)) else x for x in df[c]]
    df.columns = [str(c) for c in df.columns]
    return df.reset_index(drop=True)

