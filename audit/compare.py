"""Paired comparison of two models on the same test: did the headline change?

The same items (words, sentences, sentence pairs) are measured on model **A** (the baseline,
e.g. the previous revision) and model **B** (the candidate). For one test and metric this
module gives ``delta = headline(B) - headline(A)``, a confidence interval for it and a p-value
for "no difference", using the pairing: an item's two measurements are compared with each
other, not with other items.

Interval
--------
Paired percentile bootstrap (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*,
ch. 13): each resample draws the items with replacement, *the same items for both models*,
stratified within the metric's item groups (X and Y for WEAT, A and B for LPBS, the sets for
SAME), and recomputes both headlines; the interval is the ``(1 -+ confidence) / 2`` quantiles
of ``delta*`` (:func:`audit.stats.percentile_interval`). Resamples where a headline is
undefined (zero spread) are dropped and counted (``ci_degenerate``). ``ci_abs`` is the same
for ``|headline(B)| - |headline(A)|`` (the change in magnitude, whatever the sign).

Test
----
Label swap within items (a paired permutation test; Fisher 1935, Good 2005 *Permutation,
Parametric and Bootstrap Tests of Hypotheses* ch. 3): under H0 the two models' measurements
of each item are exchangeable, so swapping them in any subset of items gives an equally likely
data set. ``T`` is ``delta`` (``quantity="delta"``) or ``|headline(B)| - |headline(A)|``
(``"delta_abs"``); a swap pattern counts as extreme when ``|T*| >= |T| - tol`` (two-sided,
the observed pattern included), ``T* >= T - tol`` (``"greater"``: B more than A) or ``T* <=
T + tol`` (``"less"``), ``tol = 1e-10 max(1, |T|)``: the observed pattern always counts,
so ``p > 0`` (the ``phipson_smyth`` convention of :mod:`audit.stats`, whose
:func:`audit.stats.label_swap_test` runs the test). ``permutations="auto"`` (default) enumerates all ``2**n``
patterns when ``n <= EXACT_MAX_ITEMS`` (``p = k / 2**n``; swapping the complement of a
pattern exchanges the two models, ``T -> -T``, so half of them are evaluated) and otherwise
draws :data:`DEFAULT_PERMUTATIONS` uniform random patterns (``p = (k + 1) / (N + 1)``,
Phipson & Smyth 2010); an int draws that many; ``"exact"`` enumerates (up to
``EXACT_LIMIT_ITEMS`` items). For a proportion of 0/1 outcomes
(CrowS-Pairs) the label swap of ``delta`` is McNemar's exact test (McNemar 1947): only
discordant pairs move, and their count for B is Binomial(n_discordant, 1/2) under H0; it is
computed exactly with :func:`scipy.stats.binomtest`.

Families
--------
============================  ======================  ==================  =======================================
metric                        items (strata)          headline            test of "no difference"
============================  ======================  ==================  =======================================
WEAT, SEAT                    target words or         effect size d       :func:`compare_weat` on vectors in one
(:func:`compare_weat`,        sentences (X, Y)                            space (revisions of a model): swap of
:func:`compare_effect_size`)                                              every word's two vectors (targets and
                                                                          attributes), cosines recomputed; else
                                                                          (different spaces, per-item tables):
                                                                          swap of the per-item scores
                                                                          ``s(w, A, B)``, attribute sets
                                                                          conditioned on, each model's scores
                                                                          standardised first
LPBS (:func:`compare_lpbs`)   attribute words (A, B)  d, ddof = 0         swap of the per-attribute scores
                                                                          (targets, templates conditioned on),
                                                                          standardised
CrowS-Pairs                   sentence pairs          % pairs won by      exact McNemar (label swap of the 0/1
(:func:`compare_crows_pairs`)                         ``sent_more``       outcomes), neutral pairs count as 0
SAME, Direct Bias, RIPA,      scored words (sets)     mean of a per-item  label swap = sign flip of the per-item
RND, MAC                                              value               differences
(:func:`compare_item_means`)
gWEAT                         target words (groups)   sum of group means  label swap (``statistic="sum_of_group_means"``)
ECT, RNSB, Cramér's V         --                      not item means      not offered: a correlation / classifiers
                                                                          retrained per run; use
                                                                          :func:`paired_compare` with a statistic
============================  ======================  ==================  =======================================

Effect sizes are invariant to a shift and a positive scaling of each model's scores, so for
the swap of item scores each model's scores are standardised (mean 0, standard deviation 1
over its items): two models that differ only in the scale of their cosines have the same
``d`` and exchangeable standardised scores.

What a swap of item scores conditions on: the scores of WEAT target words (LPBS attribute
words, SAME/Direct Bias scored words) were measured against sets of the same model (attribute
words, templates, group words). Retraining noise in *those* words moves all item scores of a
group together, which no per-item swap reproduces, so under "the two revisions are
exchangeable draws" such a test rejects more often than alpha (about 0.065 at alpha = 0.05 in
``benchmarks/regression_power.py``); it is exact for the narrower null "given each model's
own attribute sets, the items are exchangeable". :func:`compare_weat` avoids this whenever
the two models share a vector space by swapping every word.

Random streams: the bootstrap draws from ``stream(seed, "compare_bootstrap")`` and the sampled
label swaps from ``stream(seed, "compare_permutation")`` (children 2 and 3 of
``SeedSequence(seed)``, :mod:`audit.stats`); the same seed gives the same interval and
p-value. No model is loaded here: inputs are arrays or per-item tables.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.errors import DataError, ParameterError
from audit.metrics.weat import as_vectors, check_same_dim, unit_rows
from audit.stats import (
    DEGENERATE_STD,
    DEFAULT_P_CONVENTION,
    STREAMS,
    PermutationResult,
    bootstrap_indices,
    check_alternative,
    check_bootstrap,
    check_ddof,
    label_swap_test,
    fresh_seed,
    percentile_interval,
    resample_counts,
    stream,
    weighted_effect_sizes,
)

__all__ = [
    "ALIGNED_MIN_COSINE",
    "PERPLEXITY_COMPARER",
    "compare_perplexity",
    "COMPARE_OPTIONS",
    "EFFECT_SIZE_COMPARER",
    "LPBS_COMPARER",
    "MetricComparer",
    "PROPORTION_COMPARER",
    "align_items",
    "item_mean_comparer",
    "row_mean_comparer",
    "DEFAULT_PERMUTATIONS",
    "EXACT_MAX_ITEMS",
    "Comparison",
    "compare_crows_pairs",
    "compare_effect_size",
    "compare_item_means",
    "compare_lpbs",
    "compare_proportions",
    "compare_weat",
    "compare_weat_items",
    "effect_size_statistic",
    "paired_compare",
]

#: ``permutations="auto"``: up to this many items all 2**n label-swap patterns are enumerated
#: (65,536 at 16, half of them evaluated).
EXACT_MAX_ITEMS = 16
#: ``permutations="exact"`` refuses more items than this (2**22 patterns).
EXACT_LIMIT_ITEMS = 22
#: Random swap patterns drawn by ``permutations="auto"`` beyond EXACT_MAX_ITEMS.
DEFAULT_PERMUTATIONS = 9999
#: Swap patterns (or bootstrap resamples) evaluated per block.
_BLOCK = 4096
_QUANTITIES = ("delta", "delta_abs")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Outcome of a paired comparison of model B against model A on one test.

    family:          which comparison (``"effect_size"``, ``"proportion"``, ``"mean"``, ...).
    value_a/value_b: the headline of each model on the full data.
    delta:           ``value_b - value_a``; ``delta_abs``: ``|value_b| - |value_a|``.
    ci, ci_abs:      paired percentile bootstrap intervals of ``delta`` and ``delta_abs``
                     (None without resamples or when all were degenerate).
    ci_method:       what was resampled; ``confidence``, ``n_bootstrap``, ``ci_degenerate``.
    p_value:         for "no difference" in ``quantity`` (``"delta"``/``"delta_abs"``) under
                     ``alternative``; ``p_method``: ``"exact label swap"``, ``"sampled label
                     swap"`` or ``"exact McNemar"``; ``null_hypothesis``: what is exchangeable
                     under H0 (which items were swapped); ``n_permutations``: patterns counted
                     (``2**n`` when exact; the discordant pairs for McNemar); ``p_convention``:
                     :data:`audit.stats.P_CONVENTIONS` (the observed arrangement counts);
                     ``p_min``: the smallest p-value the test could give.
    n_items:         paired items; ``strata``: items per stratum.
    seed:            the task seed; ``random_streams``: procedure -> child of SeedSequence(seed).
    """

    family: str
    value_a: float
    value_b: float
    delta: float
    delta_abs: float
    ci: list[float] | None
    ci_abs: list[float] | None
    ci_method: str
    confidence: float
    n_bootstrap: int
    ci_degenerate: int
    p_value: float | None
    p_method: str
    null_hypothesis: str
    alternative: str
    quantity: str
    n_permutations: int
    n_items: int
    strata: list[int]
    seed: int
    random_streams: dict[str, int]
    p_convention: str = DEFAULT_P_CONVENTION
    p_min: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------- checks


def _check_common(alternative: Any, quantity: Any, confidence: Any, n_bootstrap: Any,
                  permutations: Any, seed: Any) -> tuple[str, str, float, int, str | int, int]:
    check_alternative(alternative)
    schema.choice(quantity, "quantity", _QUANTITIES)
    n_bootstrap, confidence = check_bootstrap(n_bootstrap, confidence)
    if permutations not in ("auto", "exact"):
        permutations = schema.integer(permutations, "permutations", 1)
    if seed is None:
        seed = fresh_seed()
    seed = schema.integer(seed, "seed", 0)
    return str(alternative), str(quantity), float(confidence), n_bootstrap, permutations, seed


def _paired_values(a: Any, b: Any, names: tuple[str, str] = ("a", "b")) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for x, name in zip((a, b), names):
        try:
            v = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{name}: cannot be read as numbers ({exc})") from None
        if v.ndim not in (1, 2) or v.shape[0] == 0:
            raise DataError(f"{name}: expected one value (or row) per item, got shape {v.shape}")
        bad = np.flatnonzero(~np.isfinite(v.reshape(v.shape[0], -1)).all(axis=1))
        if bad.size:
            raise DataError(f"{name}: item {int(bad[0])} has a non-finite value")
        out.append(v)
    if out[0].shape != out[1].shape:
        raise DataError(
            f"{names[0]} and {names[1]} must hold the same items (paired), got shapes {out[0].shape} and {out[1].shape}"
        )
    return out[0], out[1]


def _check_strata(strata: Sequence[int] | None, n: int) -> list[int]:
    if strata is None:
        return [n]
    s = [schema.integer(v, "strata", 1) for v in strata]
    if sum(s) != n:
        raise ParameterError(f"strata {s} must add up to the number of items ({n})")
    return s


# --------------------------------------------------------------------------------- engine


def _stratified_index(strata: list[int], n_resamples: int, gen: np.random.Generator) -> np.ndarray:
    """(R, n) item indices: within each stratum (contiguous, in order) drawn with replacement."""
    parts = bootstrap_indices(strata, n_resamples, gen)
    offsets = np.cumsum([0] + strata[:-1])
    return np.concatenate([p + o for p, o in zip(parts, offsets)], axis=1)


def _quantity(ta: np.ndarray, tb: np.ndarray, quantity: str) -> np.ndarray:
    return tb - ta if quantity == "delta" else np.abs(tb) - np.abs(ta)


def _swap_test(n: int, t_of: Callable[[np.ndarray], np.ndarray], obs: float, alternative: str,
               permutations: str | int, seed: int) -> PermutationResult:
    """Label-swap test over swap patterns of ``n`` items (module docstring) on
    :func:`audit.stats.label_swap_test`, the engine's paired test, with its default
    ``p_convention`` (``phipson_smyth``: the observed pattern counts). ``t_of(masks)`` gives the
    statistic for a (R, n) boolean block of patterns (True: swapped). A sampled count at or
    above ``2**n`` enumerates the patterns instead."""
    exact = permutations == "exact" or (permutations == "auto" and n <= EXACT_MAX_ITEMS)
    if permutations == "exact" and n > EXACT_LIMIT_ITEMS:
        raise ParameterError(
            f"permutations='exact': {n} items have 2**{n} swap patterns, more than enumerated here "
            f"(up to {EXACT_LIMIT_ITEMS} items); sample instead, e.g. permutations=9999"
        )
    n_draw = DEFAULT_PERMUTATIONS if permutations in ("auto", "exact") else int(permutations)
    if not exact and n <= EXACT_LIMIT_ITEMS and n_draw >= 2**n:
        exact = True  # more draws than distinct patterns: enumerate them instead
    return label_swap_test(n, t_of, obs, alternative=alternative, exact=exact, n_draw=n_draw,
                           seed=stream(seed, "compare_permutation"), p_convention=DEFAULT_P_CONVENTION)


def paired_compare(
    a: Any,
    b: Any,
    statistic: Callable[[np.ndarray], np.ndarray],
    *,
    strata: Sequence[int] | None = None,
    family: str = "custom",
    swap_values: tuple[Any, Any] | None = None,
    alternative: str = "two-sided",
    quantity: str = "delta",
    n_bootstrap: int = 1000,
    permutations: str | int = "auto",
    confidence: float = 0.95,
    seed: int | None = None,
    ci_method: str | None = None,
    null_hypothesis: str | None = None,
) -> Comparison:
    """Paired bootstrap interval and label-swap test for any vectorised headline.

    Parameters
    ----------
    a, b : array-like (n,) or (n, k)
        Model A's and model B's measurement of the same n items, in the same order, items of
        each stratum contiguous (in ``strata`` order).
    statistic : callable
        ``statistic(values)`` with ``values`` of shape (R, n) or (R, n, k) returns the R
        headlines (NaN where undefined); items keep their positions, so it may use the
        strata layout (e.g. the first ``n_x`` items are X).
    strata : sizes of the item groups (default: one group). The bootstrap resamples within
        each.
    swap_values : optional (a', b') used for the label swap instead of (a, b), e.g.
        standardised scores (the statistic must give the same headline on them).
    alternative, quantity, n_bootstrap, permutations, confidence, seed :
        See the module docstring; ``seed`` is the task seed (its ``compare_bootstrap`` and
        ``compare_permutation`` streams are used), drawn from OS entropy when None.
    ci_method, null_hypothesis : descriptions recorded in the result.
    """
    alternative, quantity, confidence, n_bootstrap, permutations, seed = _check_common(
        alternative, quantity, confidence, n_bootstrap, permutations, seed
    )
    a, b = _paired_values(a, b)
    n = a.shape[0]
    strata_l = _check_strata(strata, n)
    va = float(statistic(a[None])[0])
    vb = float(statistic(b[None])[0])
    if not (math.isfinite(va) and math.isfinite(vb)):
        raise DataError(f"{family}: the headline is undefined for model {'A' if not math.isfinite(va) else 'B'} "
                        "(e.g. every item has the same score)")
    obs = float(_quantity(np.array([va]), np.array([vb]), quantity)[0])

    ci = ci_abs = None
    n_deg = 0
    if n_bootstrap > 0:
        gen = np.random.Generator(np.random.PCG64(stream(seed, "compare_bootstrap")))
        deltas, abs_deltas = [], []
        for start in range(0, n_bootstrap, _BLOCK):
            r = min(_BLOCK, n_bootstrap - start)
            idx = _stratified_index(strata_l, r, gen)
            ta, tb = statistic(a[idx]), statistic(b[idx])
            deltas.append(tb - ta)
            abs_deltas.append(np.abs(tb) - np.abs(ta))
        d = np.concatenate(deltas)
        ok = np.isfinite(d)
        n_deg = int(d.size - ok.sum())
        ci = percentile_interval(d[ok], confidence)
        ci_abs = percentile_interval(np.concatenate(abs_deltas)[ok], confidence)

    sa, sb = (a, b) if swap_values is None else _paired_values(*swap_values, names=("swap a", "swap b"))

    def t_of(m: np.ndarray) -> np.ndarray:
        mm = m.reshape(m.shape + (1,) * (sa.ndim - 1))
        xa = np.where(mm, sb[None], sa[None])
        xb = np.where(mm, sa[None], sb[None])
        return _quantity(statistic(xa), statistic(xb), quantity)

    perm = _swap_test(n, t_of, obs, alternative, permutations, seed)
    strata_desc = "" if len(strata_l) == 1 else f" within {len(strata_l)} strata"
    return Comparison(
        family=family, value_a=va, value_b=vb, delta=vb - va, delta_abs=abs(vb) - abs(va),
        ci=ci, ci_abs=ci_abs,
        ci_method=ci_method or f"paired percentile bootstrap: items resampled jointly{strata_desc}",
        confidence=confidence, n_bootstrap=n_bootstrap, ci_degenerate=n_deg,
        p_value=float(perm.p_value), p_method=f"{perm.method} label swap",
        null_hypothesis=null_hypothesis or "each item's two measurements are exchangeable between the models",
        alternative=alternative, quantity=quantity, n_permutations=int(perm.n_partitions), n_items=int(n),
        strata=strata_l, seed=seed,
        random_streams={s: STREAMS.index(s) for s in ("compare_bootstrap", "compare_permutation")},
        p_convention=perm.convention, p_min=perm.p_min,
    )


# --------------------------------------------------------------------------------- statistics


def effect_size_statistic(n_x: int, ddof: int) -> Callable[[np.ndarray], np.ndarray]:
    """Vectorised ``d = (mean X - mean Y) / std(X u Y, ddof)`` over rows whose first ``n_x``
    items are X (NaN where the standard deviation is <= 1e-12)."""

    def stat(v: np.ndarray) -> np.ndarray:
        mx = v[:, :n_x].mean(axis=1)
        my = v[:, n_x:].mean(axis=1)
        sd = v.std(axis=1, ddof=ddof)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (mx - my) / sd
        out[~(sd > DEGENERATE_STD)] = np.nan
        return out

    return stat


def _standardise(v: np.ndarray) -> np.ndarray:
    sd = v.std()
    return (v - v.mean()) / sd if sd > DEGENERATE_STD else v - v.mean()




def compare_effect_size(
    s_x_a: Any, s_y_a: Any, s_x_b: Any, s_y_b: Any, *, ddof: int = 1, **kwargs: Any
) -> Comparison:
    """WEAT/SEAT (per target word or sentence ``s(w, A, B)``) or LPBS (per attribute word
    ``score(a)``, ``ddof=0``): paired comparison of the two-group effect size d.

    ``s_x_a``, ``s_y_a``: model A's item scores of groups X and Y; ``s_x_b``, ``s_y_b`` model
    B's for the same items in the same order. The bootstrap resamples within X and within Y
    (the ``targets`` interval of :mod:`audit.metrics.weat`); the label swap uses each model's
    standardised scores. Other keyword arguments: :func:`paired_compare`.
    """
    ddof = check_ddof(ddof)
    xa, xb = _paired_values(s_x_a, s_x_b, ("s_x_a", "s_x_b"))
    ya, yb = _paired_values(s_y_a, s_y_b, ("s_y_a", "s_y_b"))
    if xa.ndim != 1 or ya.ndim != 1:
        raise DataError("effect size comparison: expected one score per item")
    a = np.concatenate([xa, ya])
    b = np.concatenate([xb, yb])
    if a.size - ddof <= 0 or xa.size == 0 or ya.size == 0:
        raise DataError("effect size comparison: need items in both groups")
    kwargs.setdefault("ci_method", "paired percentile bootstrap: items resampled jointly within X and within Y")
    kwargs.setdefault(
        "null_hypothesis",
        "each X/Y item's standardised score is exchangeable between the models "
        "(what the scores were measured against, e.g. the attribute sets, conditioned on)",
    )
    return paired_compare(
        a, b, effect_size_statistic(xa.size, ddof), strata=[xa.size, ya.size], family="effect_size",
        swap_values=(_standardise(a), _standardise(b)), **kwargs,
    )


def _weat_blocks(sets: Sequence[Any], name: str) -> tuple[np.ndarray, ...]:
    if isinstance(sets, np.ndarray) or not isinstance(sets, Sequence) or len(sets) != 4:
        raise ParameterError(f"{name}: expected the four word sets (X, Y, A, B) as 2-D arrays")
    X, Y, A, B = (as_vectors(s, f"{name}[{i}]", nonzero=True) for i, s in enumerate(sets))
    check_same_dim([(f"{name}[{i}]", s) for i, s in enumerate((X, Y, A, B))])
    ux, uy, ua, ub = map(unit_rows, (X, Y, A, B))
    return ux @ ua.T, ux @ ub.T, uy @ ua.T, uy @ ub.T


#: ``swap="auto"`` treats the two models' vectors as one space (swaps whole words) when their
#: dimensions agree and the median cosine between a word's two vectors is at least this.
ALIGNED_MIN_COSINE = 0.5


def _unit_sets(sets: Sequence[Any], name: str) -> list[np.ndarray]:
    if isinstance(sets, np.ndarray) or not isinstance(sets, Sequence) or len(sets) != 4:
        raise ParameterError(f"{name}: expected the four word sets (X, Y, A, B) as 2-D arrays")
    arrs = [as_vectors(v, f"{name}[{i}]", nonzero=True) for i, v in enumerate(sets)]
    check_same_dim([(f"{name}[{i}]", v) for i, v in enumerate(arrs)])
    return [unit_rows(v) for v in arrs]


def compare_weat(
    sets_a: Sequence[Any],
    sets_b: Sequence[Any],
    *,
    ddof: int = 1,
    ci_method: str = "targets",
    swap: str = "auto",
    alternative: str = "two-sided",
    quantity: str = "delta",
    n_bootstrap: int = 1000,
    permutations: str | int = "auto",
    confidence: float = 0.95,
    seed: int | None = None,
) -> Comparison:
    """WEAT/SEAT effect size of model B against model A from the vectors of the same words
    (or sentences).

    ``sets_a = (X, Y, A, B)``: model A's vectors, rows = words; ``sets_b`` model B's for the
    same words in the same order.

    Test (``swap``):

    * ``"words"``: every word -- targets *and* attributes -- is an item whose two vectors are
      swapped between the models, and all cosines are recomputed (from the four precomputed
      blocks ``cos(T_a|T_b, Att_a|Att_b)``). Exact under "the two revisions are exchangeable
      draws of every word" (e.g. retraining noise), including noise in the attribute words,
      which shifts all X scores against all Y scores at once and which a swap of target
      scores alone cannot reproduce (its false-positive rate then exceeds alpha:
      ``benchmarks/regression_power.py``). Needs vectors in one space: the same dimension and
      comparable coordinates (revisions of one model; not two independently trained models).
    * ``"targets"``: :func:`compare_effect_size` on the per-target scores ``s(w, A, B)``: only
      target words are swapped, each model's attribute sets conditioned on, as in the
      single-model permutation test. For models in different spaces.
    * ``"auto"`` (default): ``"words"`` when the dimensions agree and the median cosine
      between a word's vectors in the two models is >= :data:`ALIGNED_MIN_COSINE`, else
      ``"targets"``; the choice is in ``null_hypothesis``.

    ``ci_method``: ``"targets"`` (default, as :func:`audit.metrics.weat.weat`) resamples X and
    Y jointly for both models; ``"targets_attributes"`` also resamples A and B (the same words
    for both models) and recomputes every score.
    """
    if ci_method not in ("targets", "targets_attributes"):
        raise ParameterError(f"ci_method must be 'targets' or 'targets_attributes', got {ci_method!r}")
    if swap not in ("auto", "words", "targets"):
        raise ParameterError(f"swap must be 'auto', 'words' or 'targets', got {swap!r}")
    ddof = check_ddof(ddof)
    ua = _unit_sets(sets_a, "sets_a")
    ub = _unit_sets(sets_b, "sets_b")
    for i, (p, q) in enumerate(zip(ua, ub)):
        if p.shape[0] != q.shape[0]:
            raise DataError(
                f"sets_a and sets_b must hold the same words: set {'XYAB'[i]} has {p.shape[0]} words in "
                f"model A and {q.shape[0]} in model B"
            )
    same_dim = ua[0].shape[1] == ub[0].shape[1]
    if swap == "words" and not same_dim:
        raise DataError(
            f"swap='words' needs both models' vectors in one space; dimensions {ua[0].shape[1]} and "
            f"{ub[0].shape[1]} differ (use swap='targets')"
        )
    if swap == "auto":
        agree = same_dim and float(np.median(np.concatenate(
            [(p * q).sum(axis=1) for p, q in zip(ua, ub)]))) >= ALIGNED_MIN_COSINE
        swap = "words" if agree else "targets"

    def blocks(u: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        x, y, a, b = u
        return x @ a.T, x @ b.T, y @ a.T, y @ b.T

    blocks_a, blocks_b = blocks(ua), blocks(ub)
    n_x, n_a = blocks_a[0].shape
    n_y, n_b = blocks_a[3].shape

    def scores(bl: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
        xa, xb, ya, yb = bl
        return xa.mean(axis=1) - xb.mean(axis=1), ya.mean(axis=1) - yb.mean(axis=1)

    (sxa, sya), (sxb, syb) = scores(blocks_a), scores(blocks_b)
    ci_desc = {
        "targets": "targets: paired percentile bootstrap of X and Y words, jointly for both models",
        "targets_attributes": "targets_attributes: paired percentile bootstrap of X, Y, A and B words, "
                              "jointly for both models",
    }[ci_method]
    res = compare_effect_size(
        sxa, sya, sxb, syb, ddof=ddof, alternative=alternative, quantity=quantity,
        n_bootstrap=n_bootstrap if ci_method == "targets" else 0,
        permutations=permutations if swap == "targets" else 1, confidence=confidence, seed=seed,
        ci_method=ci_desc,
    )
    if ci_method == "targets_attributes" and n_bootstrap > 0:
        gen = np.random.Generator(np.random.PCG64(stream(res.seed, "compare_bootstrap")))
        idx = bootstrap_indices([n_x, n_y, n_a, n_b], int(n_bootstrap), gen)
        c_x, c_y, c_a, c_b = (resample_counts(i, m) for i, m in zip(idx, (n_x, n_y, n_a, n_b)))

        def es(bl: tuple[np.ndarray, ...]) -> np.ndarray:
            xa, xb, ya, yb = bl
            s_x = c_a @ xa.T / n_a - c_b @ xb.T / n_b
            s_y = c_a @ ya.T / n_a - c_b @ yb.T / n_b
            return weighted_effect_sizes(s_x, s_y, c_x, c_y, ddof)

        ea, eb = es(blocks_a), es(blocks_b)
        d = eb - ea
        ok = np.isfinite(d)
        res = dataclasses.replace(
            res, ci=percentile_interval(d[ok], confidence),
            ci_abs=percentile_interval((np.abs(eb) - np.abs(ea))[ok], confidence),
            n_bootstrap=int(n_bootstrap), ci_degenerate=int(d.size - ok.sum()),
        )
    if swap == "targets":
        return res

    # swap every word: cell (i, j) of a mixed model comes from the revision of target i and of
    # attribute j; four precomputed blocks, rows = X then Y, columns = A then B
    t_a, t_b = np.concatenate(ua[:2]), np.concatenate(ub[:2])
    at_a, at_b = np.concatenate(ua[2:]), np.concatenate(ub[2:])
    c_aa, c_ab, c_ba, c_bb = t_a @ at_a.T, t_a @ at_b.T, t_b @ at_a.T, t_b @ at_b.T
    w = np.concatenate([np.full(n_a, 1.0 / n_a), np.full(n_b, -1.0 / n_b)])
    base_a, base_b = c_aa @ w, c_ba @ w  # scores with model A's attributes, targets from A / B
    d_a, d_b = (c_ab - c_aa).T, (c_bb - c_ba).T  # (n_att, n_t): switching attribute j to B
    n_t = n_x + n_y
    stat = effect_size_statistic(n_x, ddof)

    def mixed(rows_b: np.ndarray, cols_b: np.ndarray) -> np.ndarray:
        mw = cols_b * w
        return np.where(rows_b, base_b + mw @ d_b, base_a + mw @ d_a)

    def t_of(m: np.ndarray) -> np.ndarray:
        rows, cols = m[:, :n_t], m[:, n_t:]
        return _quantity(stat(mixed(rows, cols)), stat(mixed(~rows, ~cols)), quantity)

    perm = _swap_test(n_t + n_a + n_b, t_of, float(_quantity(
        np.array([res.value_a]), np.array([res.value_b]), quantity)[0]), alternative, permutations, res.seed)
    return dataclasses.replace(
        res, p_value=float(perm.p_value), p_method=f"{perm.method} label swap",
        n_permutations=int(perm.n_partitions), p_min=perm.p_min,
        null_hypothesis="every word's (X, Y, A, B) two vectors are exchangeable between the models "
                        "(one vector space; all cosines recomputed)",
    )


def compare_proportions(outcome_a: Any, outcome_b: Any, *, confidence: float = 0.95,
                        n_bootstrap: int = 1000, seed: int | None = None,
                        alternative: str = "two-sided") -> Comparison:
    """Percentage of items with outcome 1, model B against model A (CrowS-Pairs).

    ``outcome_a``/``outcome_b``: 0/1 per item (the same items). ``delta`` is in percentage
    points. p-value: McNemar's exact test, :func:`scipy.stats.binomtest` of the ``n_01``
    pairs (0 for A, 1 for B) out of the ``n_01 + n_10`` discordant pairs against 1/2 (the
    label swap's exact distribution); ``alternative="greater"``: B higher. 1 when no pair is
    discordant. Interval: paired percentile bootstrap over items. ``quantity`` is ``delta``
    (for percentages around 50 the magnitude is not the bias: compare ``|value - 50|``
    yourself if needed).
    """
    alternative, _, confidence, n_bootstrap, _, seed = _check_common(
        alternative, "delta", confidence, n_bootstrap, 1, seed
    )
    a, b = _paired_values(outcome_a, outcome_b, ("outcome_a", "outcome_b"))
    for v, name in ((a, "outcome_a"), (b, "outcome_b")):
        bad = np.flatnonzero((v != 0) & (v != 1))
        if v.ndim != 1 or bad.size:
            raise DataError(f"{name}: expected 0/1 outcomes per item, item {int(bad[0]) if bad.size else 0} is not")
    # the engine gives the interval (its label-swap p is replaced by McNemar's exact one)
    res = paired_compare(
        a, b, lambda v: 100.0 * v.mean(axis=1), family="proportion", n_bootstrap=n_bootstrap,
        permutations=1, confidence=confidence, seed=seed, alternative=alternative,
        ci_method="paired percentile bootstrap: items resampled jointly",
    )
    n01 = int(((a == 0) & (b == 1)).sum())
    n10 = int(((a == 1) & (b == 0)).sum())
    from scipy.stats import binomtest  # local: see audit/multitest.py

    p = 1.0 if n01 + n10 == 0 else float(binomtest(n01, n01 + n10, 0.5, alternative=alternative).pvalue)
    floor = min(1.0, (2.0 if alternative == "two-sided" else 1.0) * 0.5 ** (n01 + n10))
    return dataclasses.replace(res, p_value=p, p_method="exact McNemar", n_permutations=n01 + n10, p_min=floor,
                               null_hypothesis="each pair's two outcomes are exchangeable between the models")


def _join_items(items_a: pd.DataFrame, items_b: pd.DataFrame, keys: Sequence[str], value: str,
                what: str) -> pd.DataFrame:
    for df, name in ((items_a, "items_a"), (items_b, "items_b")):
        if not isinstance(df, pd.DataFrame):
            raise ParameterError(f"{name}: expected the per-item table (DataFrame) of a {what} result")
        missing = [c for c in [*keys, value] if c not in df.columns]
        if missing:
            raise DataError(f"{name}: per-item table lacks column(s) {', '.join(missing)} ({what})")
        dup = df.duplicated(list(keys))
        if dup.any():
            raise DataError(f"{name}: item {tuple(df.loc[dup.idxmax(), list(keys)])} appears twice ({what})")
    j = items_a[[*keys, value]].merge(items_b[[*keys, value]], on=list(keys), how="outer",
                                      suffixes=("_a", "_b"), indicator=True, sort=False)
    lonely = j[j["_merge"] != "both"]
    if len(lonely):
        r = lonely.iloc[0]
        side = "model A" if r["_merge"] == "left_only" else "model B"
        raise DataError(
            f"{what}: {len(lonely)} item(s) measured on one model only, first {tuple(r[list(keys)])} "
            f"(only {side}); compare results on the same items (same test version and coverage)"
        )
    order = items_a[list(keys)].reset_index(drop=True).assign(_order=np.arange(len(items_a)))
    return j.drop(columns="_merge").merge(order, on=list(keys)).sort_values("_order", kind="stable")


def _item_key(items: pd.DataFrame) -> list[str]:
    return ["set", "word"] if "word" in items.columns else ["set", "index"]


def compare_weat_items(items_a: pd.DataFrame, items_b: pd.DataFrame, *, ddof: int = 1,
                       **kwargs: Any) -> Comparison:
    """WEAT/SEAT from the two results' per-item tables (columns ``set`` = X/Y or
    target0/target1, ``word`` or ``index``, ``score`` = s(w, A, B)), matched by item."""
    key = _item_key(items_a)
    j = _join_items(items_a, items_b, key, "score", "WEAT")
    x = j["set"].astype(str).isin(["X", "target0"]).to_numpy()
    return compare_effect_size(j.loc[x, "score_a"], j.loc[~x, "score_a"], j.loc[x, "score_b"],
                               j.loc[~x, "score_b"], ddof=ddof, **kwargs)


def compare_lpbs(items_a: pd.DataFrame, items_b: pd.DataFrame, **kwargs: Any) -> Comparison:
    """LPBS from the two results' per-attribute tables (``set`` = A/B, ``attribute``,
    ``score``), matched by attribute word; effect size with ``ddof=0``."""
    j = _join_items(items_a, items_b, ["set", "attribute"], "score", "LPBS")
    x = (j["set"].astype(str) == "A").to_numpy()
    return compare_effect_size(j.loc[x, "score_a"], j.loc[~x, "score_a"], j.loc[x, "score_b"],
                               j.loc[~x, "score_b"], ddof=0, **kwargs)


def compare_crows_pairs(items_a: pd.DataFrame, items_b: pd.DataFrame, **kwargs: Any) -> Comparison:
    """CrowS-Pairs from the two results' per-pair tables (``pair_id``, ``score`` = 1 when
    ``sent_more`` won, neutral pairs 0), matched by ``pair_id``: :func:`compare_proportions`."""
    j = _join_items(items_a, items_b, ["pair_id"], "score", "CrowS-Pairs")
    return compare_proportions(j["score_a"], j["score_b"], **kwargs)


def compare_item_means(items_a: pd.DataFrame, items_b: pd.DataFrame, *, value: str = "bias",
                       statistic: str = "mean", **kwargs: Any) -> Comparison:
    """Metrics whose headline is built from per-item values (SAME and Direct Bias: ``bias``;
    RIPA, RND, MAC: their per-item column; gWEAT: ``score`` with
    ``statistic="sum_of_group_means"``), matched by (``set``, ``word`` or ``index``).

    ``statistic="mean"``: the mean over all items (SAME, Direct Bias, ...); the label swap is
    the sign flip of the per-item differences. ``"sum_of_group_means"``: the sum over sets of
    each set's mean (gWEAT). The bootstrap resamples within each set.
    """
    if statistic not in ("mean", "sum_of_group_means"):
        raise ParameterError(f"statistic must be 'mean' or 'sum_of_group_means', got {statistic!r}")
    key = _item_key(items_a)
    j = _join_items(items_a, items_b, key, value, f"per-item '{value}'")
    j = j.assign(_set=pd.Categorical(j["set"].astype(str), categories=list(dict.fromkeys(j["set"].astype(str)))))
    j = j.sort_values(["_set", "_order"], kind="stable")
    sizes = j.groupby("_set", observed=True, sort=True).size().tolist()
    if statistic == "mean":
        def stat(v: np.ndarray) -> np.ndarray:
            return v.mean(axis=1)
    else:
        bounds = np.cumsum([0] + sizes)

        def stat(v: np.ndarray) -> np.ndarray:
            return sum(v[:, bounds[i]:bounds[i + 1]].mean(axis=1) for i in range(len(sizes)))
    return paired_compare(j[f"{value}_a"].to_numpy(), j[f"{value}_b"].to_numpy(), stat, strata=sizes,
                          family=statistic, **kwargs)



# --------------------------------------------------------------------------------- per metric


def align_items(items_a: pd.DataFrame, items_b: pd.DataFrame, keys: Sequence[str]
                ) -> tuple[pd.DataFrame, pd.DataFrame, list[tuple]]:
    """The rows of two per-item tables whose ``keys`` appear in both, and the keys of the rows
    left out (measured on one model only, e.g. a word missing from one revision's vocabulary),
    each as ``(side, *key)`` with side ``"A"`` or ``"B"``: the model that has the item."""
    for df, name in ((items_a, "items_a"), (items_b, "items_b")):
        if not isinstance(df, pd.DataFrame):
            raise ParameterError(f"{name}: expected a per-item table (DataFrame), got {type(df).__name__}")
        missing = [c for c in keys if c not in df.columns]
        if missing:
            raise DataError(f"{name}: per-item table lacks column(s) {', '.join(missing)}")
    ka = [tuple(r) for r in items_a[list(keys)].astype(str).itertuples(index=False)]
    kb = [tuple(r) for r in items_b[list(keys)].astype(str).itertuples(index=False)]
    sa, sb = set(ka), set(kb)
    dropped = [("A", *k) for k in ka if k not in sb] + [("B", *k) for k in kb if k not in sa]
    keep_a = np.fromiter((k in sb for k in ka), dtype=bool, count=len(ka))
    keep_b = np.fromiter((k in sa for k in kb), dtype=bool, count=len(kb))
    return items_a[keep_a].reset_index(drop=True), items_b[keep_b].reset_index(drop=True), dropped


#: Options of the comparison functions a :class:`MetricComparer` forwards.
COMPARE_OPTIONS = ("alternative", "quantity", "n_bootstrap", "permutations", "confidence", "seed")


@dataclasses.dataclass(frozen=True)
class MetricComparer:
    """How two models' results of one metric are compared (the metric registry declares one
    per comparable metric: :func:`audit.registry.comparer`).

    items:    ``items(items_a, items_b, params, **options) -> Comparison`` from the two
              results' per-item tables, matched by ``keys(items)`` (rows on one model only are
              left out first: :meth:`from_items`).
    vectors:  optional ``vectors(measurement_a, measurement_b, params, **options)`` from the two
              measurements of the same items in the same order (the live comparison of
              :mod:`audit.regression`; WEAT/SEAT: :func:`compare_weat`, every word swapped).
    test:     one line naming the test of "no difference" (listings, docs).
    neutral:  the headline of no bias: the bias magnitude is ``|value - neutral|`` (0; 50 for
              CrowS-Pairs).
    options:  which of :data:`COMPARE_OPTIONS` the functions take (CrowS-Pairs' exact McNemar
              has no permutation count and compares the proportion itself).
    """

    items: Callable[..., Comparison]
    keys: Callable[[pd.DataFrame], list[str]]
    test: str
    vectors: Callable[..., Comparison] | None = None
    neutral: float = 0.0
    options: tuple[str, ...] = COMPARE_OPTIONS

    def _opts(self, options: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in options.items() if k in self.options and v is not None}

    def from_items(self, items_a: pd.DataFrame, items_b: pd.DataFrame, params: dict[str, Any] | None = None,
                   **options: Any) -> tuple[Comparison, list[tuple]]:
        """The comparison on the items both tables hold, and the items left out
        (:func:`align_items`)."""
        if items_a is None or items_b is None:
            raise DataError("a result has no per-item table to compare")
        keys = self.keys(items_a)
        ia, ib, dropped = align_items(items_a, items_b, keys)
        if ia.empty:
            raise DataError(f"the two results share no item (matched by {', '.join(keys)})")
        return self.items(ia, ib, dict(params or {}), **self._opts(options)), dropped

    def from_measurements(self, meas_a: Any, meas_b: Any, params: dict[str, Any] | None = None,
                          **options: Any) -> Comparison:
        """The comparison from two measurements of the same items (``vectors``)."""
        if self.vectors is None:
            raise ParameterError("this metric is compared from its per-item tables (from_items)")
        return self.vectors(meas_a, meas_b, dict(params or {}), **self._opts(options))


def _weat_items(ia: pd.DataFrame, ib: pd.DataFrame, params: dict[str, Any], **kw: Any) -> Comparison:
    return compare_weat_items(ia, ib, ddof=params.get("ddof", 1), **kw)


def _weat_vectors(ma: Any, mb: Any, params: dict[str, Any], **kw: Any) -> Comparison:
    sets_a = [*ma.targets, *ma.attributes]
    sets_b = [*mb.targets, *mb.attributes]
    return compare_weat(sets_a, sets_b, ddof=params.get("ddof", 1), ci_method=params.get("ci_method", "targets"),
                        **kw)


def _lpbs_items(ia: pd.DataFrame, ib: pd.DataFrame, params: dict[str, Any], **kw: Any) -> Comparison:
    return compare_lpbs(ia, ib, **kw)


def _crows_items(ia: pd.DataFrame, ib: pd.DataFrame, params: dict[str, Any], **kw: Any) -> Comparison:
    return compare_crows_pairs(ia, ib, **kw)


def _item_means(value: str, statistic: str = "mean") -> Callable[..., Comparison]:
    def compare(ia: pd.DataFrame, ib: pd.DataFrame, params: dict[str, Any], **kw: Any) -> Comparison:
        return compare_item_means(ia, ib, value=value, statistic=statistic, **kw)

    compare.__name__ = f"compare_{statistic}_of_{value}"
    return compare


def _row_mean_of(prefix: str) -> Callable[..., Comparison]:
    """Per-item tables with one column per measured set (``<prefix><set>``): each item's mean
    over them, then :func:`compare_item_means` (the mean over (item, set) pairs, as MAC's
    headline, since every item has every set)."""

    def compare(ia: pd.DataFrame, ib: pd.DataFrame, params: dict[str, Any], **kw: Any) -> Comparison:
        out = []
        for df, name in ((ia, "items_a"), (ib, "items_b")):
            cols = [c for c in df.columns if str(c).startswith(prefix)]
            if not cols:
                raise DataError(f"{name}: per-item table has no {prefix}* column")
            out.append(df.assign(_row_mean=df[cols].apply(pd.to_numeric, errors="coerce").mean(axis=1)))
        return compare_item_means(out[0], out[1], value="_row_mean", **kw)

    return compare


def _pair_key(items: pd.DataFrame) -> list[str]:
    return ["pair_id"]


def _lpbs_key(items: pd.DataFrame) -> list[str]:
    return ["set", "attribute"]


_SWAP_ITEMS = "label swap of the per-item values (paired permutation test), paired bootstrap CI"

#: WEAT and SEAT: effect size d.
EFFECT_SIZE_COMPARER = MetricComparer(
    items=_weat_items, vectors=_weat_vectors, keys=_item_key,
    test="live: every word's two vectors swapped (compare_weat); stored results: swap of the standardised "
         "per-target scores, attribute sets conditioned on (compare_weat_items); paired bootstrap CI",
)
#: LPBS: effect size over attribute words (ddof 0).
LPBS_COMPARER = MetricComparer(items=_lpbs_items, keys=_lpbs_key,
                               test="swap of the standardised per-attribute scores; paired bootstrap CI")
#: CrowS-Pairs: percentage of pairs won by the more stereotypical sentence (50: no preference).
PROPORTION_COMPARER = MetricComparer(
    items=_crows_items, keys=_pair_key, neutral=50.0, options=("alternative", "n_bootstrap", "confidence", "seed"),
    test="exact McNemar test of the discordant pairs; paired bootstrap CI",
)


def compare_perplexity(items_a: pd.DataFrame, items_b: pd.DataFrame, **kwargs: Any) -> Comparison:
    """Perplexity (or pseudo-perplexity) of two models on the same held-out sentences, matched by
    ``line``: each side's headline ``exp(-sum ll / sum n_tokens)`` (:mod:`audit.measure.perplexity`);
    :func:`paired_compare` resamples the sentences (paired bootstrap) and swaps each sentence's
    ``(ll, n_tokens)`` between the models (label swap). ``delta = B - A`` (positive: B models the
    text worse). The token counts may differ between tokenizers; the ratio is taken per side."""
    ja = _join_items(items_a, items_b, ["line"], "ll", "held-out text")
    jn = _join_items(items_a, items_b, ["line"], "n_tokens", "held-out text")
    a = np.column_stack([ja["ll_a"].to_numpy(float), jn["n_tokens_a"].to_numpy(float)])
    b = np.column_stack([ja["ll_b"].to_numpy(float), jn["n_tokens_b"].to_numpy(float)])

    def stat(v: np.ndarray) -> np.ndarray:
        return np.exp(-v[..., 0].sum(axis=-1) / v[..., 1].sum(axis=-1))

    return paired_compare(a, b, stat, **kwargs)


#: Perplexity / pseudo-perplexity (LM ability, not a bias score): :func:`compare_perplexity`.
PERPLEXITY_COMPARER = MetricComparer(
    items=lambda ia, ib, params, **kw: compare_perplexity(ia, ib, **kw), keys=lambda items: ["line"],
    test="label swap of each sentence's (log-likelihood, tokens) between the models; paired bootstrap CI",
)


def item_mean_comparer(value: str, statistic: str = "mean") -> MetricComparer:
    """A metric whose headline is the mean (or the sum of group means) of a per-item column."""
    return MetricComparer(items=_item_means(value, statistic), keys=_item_key, test=_SWAP_ITEMS)


def row_mean_comparer(prefix: str) -> MetricComparer:
    """A metric whose headline is the mean of several per-item columns (``<prefix>*``)."""
    return MetricComparer(items=_row_mean_of(prefix), keys=_item_key, test=_SWAP_ITEMS)
