"""The shapes of the metric registry (:mod:`audit.registry`): a *family* is a measure step shared
by metrics, a *metric* is one registry entry, a *measurement* is what the measure step hands to
the analyse step.

A metric is two steps (``docs/architecture.md``):

- *measure* (model-dependent, runs where the model lives): a :class:`Family`'s ``measure``
  turns a loaded model and a test into a :class:`Measurement` of plain arrays and tables;
- *analyse* (model-free, pure, runs on a CPU worker): a :class:`Metric`'s ``analyse`` turns a
  :class:`Measurement` into an :class:`audit.result.MetricOutput`.

This module holds data classes only; it imports nothing of the project but errors and results,
so that measure modules (which define families) and the registry (which lists metrics) can both
use it without an import cycle.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from audit.backends.table import kind_names, kinds_with, model_kinds
from audit.errors import ParameterError
from audit.result import MetricOutput

__all__ = ["MODEL_KINDS", "KIND_NAMES", "PROPERTIES", "Measurement", "Family", "Metric", "check_count"]

#: The model kinds: static word vectors, Hugging Face encoders without LM head, masked LMs,
#: causal LMs, and those the backend table's rows add (sentence-transformers embedding models:
#: ``sentence``, their configured pooling); :func:`audit.backends.table.model_kinds`.
MODEL_KINDS = model_kinds()

#: How messages name each kind ("cannot run on <a masked LM>").
KIND_NAMES = kind_names()

#: The invariance properties every metric declares in :attr:`Metric.properties`, property ->
#: the words its declaration may start with (``tests/test_common.py`` checks each declaration
#: on synthetic measurements of the metric's family, after scikit-learn's
#: ``sklearn/metrics/tests/test_common.py``; ``docs/architecture.md``, "Metric properties"):
#:
#: - ``item_order``: permuting the items (words within a set, rows of a per-item table; paired
#:   sets with one permutation) leaves the headline and every field the seed does not drive
#:   unchanged (``invariant``). The seeded parts (bootstrap intervals, sampled p-values) are
#:   invariant in distribution only: the same seed draws other items after a permutation.
#: - ``group_swap``: swapping the two social groups (target sets, the two target sets of a
#:   table, the two sentences of a pair, the biased and the anti-biased option) ``flips`` the sign
#:   of ``value - no_bias`` or leaves the value ``invariant`` (a magnitude, a symmetric statistic).
#: - ``scale``: multiplying every vector (score) by a positive constant leaves the headline
#:   ``invariant``.
#: - ``seed``: ``deterministic`` (no seed: two runs are bitwise identical) or ``seeded: f1, f2``
#:   (the same seed gives a bitwise identical result; another seed changes only the listed
#:   fields, ``value`` when the headline itself is random; ``a.*.b``: field ``b`` of every entry of
#:   the nested table ``a``).
#: - ``non_finite``: a NaN or infinite number in the measurement is ``refused`` with one
#:   :class:`~audit.errors.AuditError` line, never a NaN result.
#: - ``min_set_size``: a word set with one item is ``refused``
#:   (:data:`audit.metrics.sets.MIN_SET_SIZE`).
#:
#: Where a property does not hold or has no meaning for a metric, its declaration is ``n/a: ``
#: and the reason; ``seed`` and ``non_finite`` hold for every metric (never ``n/a``).
PROPERTIES: dict[str, tuple[str, ...]] = {
    "item_order": ("invariant",),
    "group_swap": ("flips", "invariant"),
    "scale": ("invariant",),
    "seed": ("deterministic", "seeded:"),
    "non_finite": ("refused",),
    "min_set_size": ("refused",),
}


@dataclasses.dataclass
class Measurement:
    """What the measure step hands to the analyse step (picklable, model-free).

    family:     the name of the :class:`Family` that measured it.
    targets/attributes: per-set float64 matrices (word and sentence vectors).
    labels:     set label (``target0``, ``attribute1``, ...) -> the item names in row order.
    set_names:  set label -> the test's set name.
    table:      per-item scores (log-probability families).
    coverage/missing/subword/unpaired: per set name (word look-ups).
    info:       further plain values the analysis or the result needs (e.g. the variant of a
                scoring method, which model kind measured).
    """

    family: str
    targets: list[np.ndarray] = dataclasses.field(default_factory=list)
    attributes: list[np.ndarray] = dataclasses.field(default_factory=list)
    labels: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    set_names: dict[str, str] = dataclasses.field(default_factory=dict)
    table: pd.DataFrame | None = None
    coverage: dict[str, float] = dataclasses.field(default_factory=dict)
    missing: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    subword: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    unpaired: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Family:
    """A measure step shared by several metrics.

    name:       registry key of the family (``association``, ``seat``, ...).
    kinds:      the model kinds it can measure on (a subset of :data:`MODEL_KINDS`).
    test_type:  the type of test object it consumes (``"words"``: a
                :class:`audit.suites.WordTest`; ``"pairs"``: a :class:`audit.suites.SentencePairs`).
    measure:    ``measure(model, test, metric, measure_params, analysis_params) -> Measurement``
                where ``model`` is an :class:`audit.runner.LoadedModel` and ``metric`` the
                :class:`Metric` being measured.
    params:     the measure-step parameters with their defaults (look-up, embedding, batching).
    method:     ``method(kind, params) -> str``: how the numbers are obtained on a model of that
                kind (recorded with every result as its ``embedding`` parameter).
    needs:      ``needs(test) -> reason | None``: what a test must provide beyond its set counts
                (``None``: it provides it).
    words:      for static models: ``words(test, measure_params) -> set[str]``, every spelling
                the look-up may need (``None``: the family loads no static vectors).
    description: one line for listings.
    uses:       the model-interface operations the measure step calls on the kinds other engines
                add (``("embed",)``): every kind of the backend table whose row implements them
                joins ``kinds`` (:attr:`Metric.model_kinds`, :func:`audit.backends.table.kinds_with`).
    ignored_by: parameter -> the model kinds whose measurement does not use it (a static model's
                look-up takes no ``layer``; a masked LM no ``start_token``): given for such a model,
                it is refused in one line (:func:`audit.registry.ignored_params`); inherited by a
                sweep's model from the spec's metric entry, it is left out of that model's tasks.
    """

    name: str
    kinds: tuple[str, ...]
    test_type: str
    measure: Callable[..., Measurement]
    params: Mapping[str, Any]
    method: Callable[[str, Mapping[str, Any]], str]
    needs: Callable[[Any], str | None]
    words: Callable[[Any, Mapping[str, Any]], set[str]] | None = None
    description: str = ""
    uses: tuple[str, ...] = ()
    ignored_by: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def all_kinds(self) -> tuple[str, ...]:
        """``kinds`` and the table's kinds whose engines implement ``uses``."""
        return tuple(dict.fromkeys([*self.kinds, *kinds_with(self.uses)]))


@dataclasses.dataclass(frozen=True)
class Metric:
    """One registry entry: everything the runner, planner, tracker, reports and CLI know of a
    metric.

    name:         registry key (what specs, the CLI and results use).
    family:       its measure step (:class:`Family`).
    analyse:      ``analyse(measurement, **analysis_params) -> MetricOutput`` (pure).
    params:       the analysis parameters with their defaults (``seed`` where random: the task's
                  seed is passed unless the parameters set one).
    headline:     what ``MetricOutput.value`` is, one line.
    reference:    the paper (and implementation) it follows.
    n_targets / n_attributes: allowed (min, max) numbers of target and attribute sets of a word
                  test (max ``None`` = unbounded), for the default roles.
    kinds:        model kinds it runs on (``None``: its family's).
    result_names: model kind -> the name results record (default: ``name``), e.g. CrowS-Pairs
                  on a causal LM is recorded as ``crows_pairs_causal``.
    items:        what one row of its per-item table is.
    paired:       ``"targets"`` when row i of the two target sets forms a pair, ``"groups"`` when
                  the protected-group sets do (RIPA, Direct Bias): the measure step then drops a
                  pair whose partner is missing.
    roles:        ``True`` for an asymmetric metric: one side of the test holds the social groups
                  (the test's ``groups`` field, :attr:`audit.suites.WordTest.groups`), the other
                  the words measured; a ``groups`` parameter overrides the test (the set counts
                  swap with the side).
    breakdowns:   ``(table, scores)`` pairs: nested tables of the result's fields (``per_category``:
                  category -> {score: value, ``ci``: {score: [low, high]}}) that the reports turn
                  into a model x category LaTeX table of each score and a bar plot of the first.
    no_bias:      the headline's value of no bias (0 for effect sizes and bias scores; 50 for a
                  percentage of pairs such as CrowS-Pairs): the reference line of plots and the
                  centre of their colour scales.
    sharded:      optional ``sharded(measurement, params, seed, shards, map_fn) -> MetricOutput |
                  None``: the analysis with its exact permutation count split into ``shards``
                  pieces mapped by ``map_fn`` (``None`` when splitting does not pay).
    properties:   property -> declaration, for every property of :data:`PROPERTIES` (what holds,
                  or ``n/a: <reason>``); ``tests/test_common.py`` fails on a metric that declares
                  none or violates one.
    comparer:     how two models' results of the metric are compared (an
                  :class:`audit.compare.MetricComparer`: ``audit compare``, the watcher's regression
                  check); ``None``: the metric offers no paired comparison.
    """

    name: str
    family: Family
    analyse: Callable[..., MetricOutput]
    params: Mapping[str, Any]
    headline: str
    reference: str
    n_targets: tuple[int, int | None] = (1, None)
    n_attributes: tuple[int, int | None] = (1, None)
    kinds: tuple[str, ...] | None = None
    result_names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    items: str = ""
    paired: str | None = None
    roles: bool = False
    sharded: Callable[..., MetricOutput | None] | None = None
    breakdowns: tuple[tuple[str, tuple[str, ...]], ...] = ()
    no_bias: float = 0.0
    properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    comparer: Any = None

    @property
    def model_kinds(self) -> tuple[str, ...]:
        return self.kinds if self.kinds is not None else self.family.all_kinds

    def result_name(self, kind: str) -> str:
        """The metric name results record for a model of ``kind``."""
        return self.result_names.get(kind, self.name)

    def set_counts(self, params: Mapping[str, Any] | None = None) -> tuple[tuple[int, int | None], tuple[int, int | None]]:
        """``(n_targets, n_attributes)`` bounds, swapped when ``groups="attributes"`` swaps the roles."""
        if self.roles and ((params or {}).get("groups") or self.params.get("groups")) == "attributes":
            return self.n_attributes, self.n_targets
        return self.n_targets, self.n_attributes


def check_count(what: str, n: int, bounds: tuple[int, int | None], metric: str) -> str | None:
    """``None`` when ``n`` sets of kind ``what`` fit ``bounds``, else the reason."""
    lo, hi = bounds
    if n < lo or (hi is not None and n > hi):
        want = f"exactly {lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
        return f"metric {metric!r} needs {want} {what} sets, got {n}"
    return None


def require(reason: str | None) -> None:
    """Raise :class:`ParameterError` with ``reason`` when it is not ``None``."""
    if reason is not None:
        raise ParameterError(reason)
