"""Word Embedding Association Test (WEAT), and the input checks shared by the metrics package.

Reference
---------
Caliskan, A., Bryson, J. J. & Narayanan, A. (2017). Semantics derived automatically from
language corpora contain human-like biases. *Science* 356(6334), 183-186.

Definitions (cosine similarity throughout)::

    s(w, A, B)     = mean_{a in A} cos(w, a) - mean_{b in B} cos(w, b)
    s(X, Y, A, B)  = sum_{x in X} s(x, A, B) - sum_{y in Y} s(y, A, B)          (statistic)
    effect size d  = (mean_{x in X} s(x) - mean_{y in Y} s(y)) / std_{w in X u Y} s(w)

Conventions
-----------
* ``ddof=1`` (sample standard deviation, as in the paper's supplementary material) by default;
  ``ddof=0`` reproduces WEFE 1.0.1 and the BIAS Detection Framework. Because both use the same
  sum of squares over the ``n = |X| + |Y|`` pooled scores, ``d_0 = d_1 * sqrt(n / (n - 1))``.
* ``|X| != |Y|`` is allowed: the effect size uses means; the statistic uses sums (as defined).
* Sign: positive when X is closer to A (and/or Y closer to B) than the other way round.
* p-value: permutation test over re-partitions of ``X u Y`` into sets of sizes ``|X|, |Y|``
  of the statistic, with the attribute sets fixed (:func:`audit.stats.permutation_test`).
* Confidence interval of the effect size: percentile bootstrap (Efron & Tibshirani 1993,
  ch. 13; ``numpy.quantile`` with linear interpolation at ``(1 -+ confidence) / 2``), 1000
  resamples by default, with the same ``ddof`` as the effect size. Two intervals, by name
  (parameter and field ``ci_method``):

  - ``"targets"`` (default): resample the target words *with replacement independently
    within X and within Y*, each word keeping its score ``s(w, A, B)``; the attribute sets
    are held fixed. This conditions on A and B exactly as the permutation test does (it
    re-partitions the target words with A and B fixed), so interval and p-value answer the
    same question -- how much does d depend on which target words were sampled? -- and a
    p-value far below 0.05 comes with an interval away from 0. It is
    :func:`scipy.stats.bootstrap` (``method="percentile"``, ``paired=False``) on ``(s_X,
    s_Y)`` with the same Generator (tested).
  - ``"targets_attributes"``: resample the words *within X, Y, A and B* independently and
    recompute every ``s(w)`` from the precomputed cosines. It also counts the sampling of
    the attribute words, so it is wider, and it is not the interval of the permutation
    test's null model: on GloVe 6B 50d (seed 0), WEAT 7 has an exact p of 1.6e-4, a
    ``"targets"`` interval of [1.26, 1.76] and a ``"targets_attributes"`` one of
    [-0.72, 1.80], because a few attribute words (the male/female terms) carry the effect.
    It is :func:`scipy.stats.bootstrap` on the four index samples (tested).

  Resamples in which every resampled target word has the same score (standard deviation 0,
  effect size undefined) are dropped and counted in ``ci_degenerate``; the interval is
  computed from the rest. We compute the intervals ourselves because scipy cannot drop
  undefined resamples (it returns a NaN interval) and because weighting the precomputed
  cosines by per-word resample counts is ~3x faster; no cosine is recomputed.
* Random streams (:mod:`audit.stats`, "Random streams of a task"): the sampled permutation
  test draws from child 0 of ``numpy.random.SeedSequence(seed)`` and the bootstrap from child
  1, so the two never share draws; the same ``seed`` gives the same p-value and interval.
  When ``seed`` is None one is drawn from OS entropy and reported in ``fields["seed"]``.

The helper functions at the top (:func:`as_vectors`, :func:`unit_rows`, :func:`cosine_matrix`,
:func:`check_same_dim`) are the input checks shared by all metrics of :mod:`audit.metrics`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.errors import DataError, ParameterError
from audit.result import MetricOutput
from audit.stats import (
    DEGENERATE_STD,
    STREAMS,
    bootstrap_indices,
    effect_size_bootstrap,
    fresh_seed,
    percentile_interval,
    DEFAULT_P_CONVENTION,
    check_alternative,
    check_bootstrap,
    check_ddof,
    permutation_test,
    resample_counts,
    stream,
    weighted_effect_sizes,
)

__all__ = [
    "CI_METHODS",
    "as_vectors",
    "check_same_dim",
    "unit_rows",
    "cosine_matrix",
    "weat_scores",
    "weat_statistic",
    "weat_effect_size",
    "weat_bootstrap_ci",
    "weat",
]

# --------------------------------------------------------------------------------------------
# Shared input checks
# --------------------------------------------------------------------------------------------


def as_vectors(x: Any, name: str, *, nonzero: bool = False) -> np.ndarray:
    """Validate one word set given as a 2-D array (rows = words) and return it as float64.

    Raises :class:`ParameterError` when ``x`` is not a 2-D numeric array, and
    :class:`DataError` when it has no rows or no columns, holds a NaN/inf, or (with
    ``nonzero=True``, for cosine-based metrics) holds an all-zero row. Messages name ``name``
    and the offending row.
    """
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"{name}: expected a 2-D numeric array of word vectors ({exc})") from None
    if arr.ndim != 2:
        raise ParameterError(
            f"{name}: expected a 2-D array (n_words, dim) of word vectors, got shape {arr.shape}"
        )
    if arr.shape[0] == 0:
        raise DataError(f"{name}: the word set is empty (no vectors)")
    if arr.shape[1] == 0:
        raise DataError(f"{name}: the vectors have dimension 0")
    finite = np.isfinite(arr).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise DataError(f"{name}: row {bad} contains NaN or infinite values")
    if nonzero:
        zero = ~np.any(arr != 0.0, axis=1)
        if zero.any():
            bad = int(np.flatnonzero(zero)[0])
            raise DataError(f"{name}: row {bad} is a zero vector (cosine similarity undefined)")
    return arr


def check_same_dim(named: Sequence[tuple[str, np.ndarray]]) -> int:
    """All arrays have the same number of columns; returns it, else :class:`DataError`."""
    first_name, first = named[0]
    for name, arr in named[1:]:
        if arr.shape[1] != first.shape[1]:
            raise DataError(
                f"{name}: vector dimension {arr.shape[1]} differs from {first_name} "
                f"(dimension {first.shape[1]})"
            )
    return int(first.shape[1])


def unit_rows(arr: np.ndarray) -> np.ndarray:
    """Rows scaled to unit Euclidean norm (rows must be non-zero: see :func:`as_vectors`)."""
    return arr / np.linalg.norm(arr, axis=1, keepdims=True)


def cosine_matrix(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``C[i, j] = cos(u_i, v_j)`` for validated, non-zero rows."""
    return unit_rows(u) @ unit_rows(v).T


# --------------------------------------------------------------------------------------------
# WEAT
# --------------------------------------------------------------------------------------------




def weat_scores(T: Any, A: Any, B: Any) -> np.ndarray:
    """Association ``s(w, A, B) = mean_a cos(w, a) - mean_b cos(w, b)`` of each row of ``T``.

    Parameters
    ----------
    T, A, B : array-like of shape (n_words, dim)
        Target vectors and the two attribute sets (non-empty, finite, non-zero rows).

    Returns
    -------
    ndarray of shape (len(T),)
    """
    T = as_vectors(T, "T", nonzero=True)
    A = as_vectors(A, "A", nonzero=True)
    B = as_vectors(B, "B", nonzero=True)
    check_same_dim([("T", T), ("A", A), ("B", B)])
    return cosine_matrix(T, A).mean(axis=1) - cosine_matrix(T, B).mean(axis=1)


def weat_statistic(s_x: np.ndarray, s_y: np.ndarray) -> float:
    """``sum(s_x) - sum(s_y)``: the WEAT test statistic from per-word scores."""
    return float(np.sum(s_x) - np.sum(s_y))


def weat_effect_size(s_x: np.ndarray, s_y: np.ndarray, ddof: int = 1) -> float:
    """``(mean(s_x) - mean(s_y)) / std(concat(s_x, s_y), ddof)``.

    Raises :class:`DataError` when the pooled standard deviation is 0 (every target word has
    the same association score, so the effect size is undefined).
    """
    s_x = np.asarray(s_x, dtype=np.float64)
    s_y = np.asarray(s_y, dtype=np.float64)
    pooled = np.concatenate([s_x, s_y])
    ddof = check_ddof(ddof, pooled.size)
    std = float(np.std(pooled, ddof=ddof))
    if not std > _DEGENERATE_STD:
        raise DataError(
            "WEAT effect size undefined: all target words (X and Y) have the same association "
            "score s(w, A, B), so its standard deviation is 0"
        )
    return float((s_x.mean() - s_y.mean()) / std)


#: Below this pooled standard deviation of s(w, A, B) (cosines: |s| <= 2) the effect size is
#: treated as undefined.
_DEGENERATE_STD = DEGENERATE_STD

#: Bootstrap intervals of the WEAT effect size, by name (module docstring); the first is the
#: default.
CI_METHODS = ("targets", "targets_attributes")


def weat_bootstrap_ci(
    cos_xa: np.ndarray,
    cos_xb: np.ndarray,
    cos_ya: np.ndarray,
    cos_yb: np.ndarray,
    *,
    method: str = "targets",
    ddof: int = 1,
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    seed: int | np.random.SeedSequence | np.random.Generator | None = None,
) -> tuple[list[float] | None, int, np.ndarray]:
    """Percentile bootstrap interval of the WEAT effect size from the cosine blocks.

    ``method="targets"``: X and Y words are resampled with replacement within their set
    (:func:`audit.stats.effect_size_bootstrap`; draws: X then Y), each keeping its
    ``s(w, A, B)``. ``method="targets_attributes"``: X, Y, A and B words are resampled
    independently (:func:`audit.stats.bootstrap_indices`, groups in that order), the draws
    are turned into per-word counts, and every s(w) and the effect size are recomputed from
    the precomputed cosines with the pooled, count-weighted standard deviation. Either way
    resamples with standard deviation <= 1e-12 are dropped. ``seed``: an int, the task's
    ``bootstrap`` SeedSequence, or a Generator.

    Returns
    -------
    ci : [low, high] (``numpy.quantile`` with linear interpolation at ``(1-confidence)/2`` and
        ``(1+confidence)/2``), or ``None`` when every resample was degenerate.
    n_degenerate : number of dropped resamples.
    effect_sizes : the finite bootstrap effect sizes.
    """
    schema.choice(method, "ci_method", CI_METHODS)
    n_x, n_a = cos_xa.shape
    n_y, n_b = cos_yb.shape
    if method == "targets":
        s_x = cos_xa.mean(axis=1) - cos_xb.mean(axis=1)
        s_y = cos_ya.mean(axis=1) - cos_yb.mean(axis=1)
        return effect_size_bootstrap(
            s_x, s_y, ddof=ddof, n_resamples=n_bootstrap, confidence=confidence, seed=seed
        )
    idx = bootstrap_indices([n_x, n_y, n_a, n_b], n_bootstrap, seed)
    c_x, c_y, c_a, c_b = (resample_counts(i, m) for i, m in zip(idx, (n_x, n_y, n_a, n_b)))  # (B, m)
    # s of every target word under each resample of the attribute sets: (B, n_words)
    s_x = c_a @ cos_xa.T / n_a - c_b @ cos_xb.T / n_b
    s_y = c_a @ cos_ya.T / n_a - c_b @ cos_yb.T / n_b
    es = weighted_effect_sizes(s_x, s_y, c_x, c_y, ddof)
    ok = np.isfinite(es)
    return percentile_interval(es[ok], confidence), int(es.size - ok.sum()), es[ok]


def weat(
    X: Any,
    Y: Any,
    A: Any,
    B: Any,
    *,
    ddof: int = 1,
    alternative: str = "greater",
    permutations: int | str = "auto",
    seed: int | None = None,
    n_bootstrap: int = 1000,
    confidence: float = 0.95,
    ci_method: str = "targets",
    p_convention: str = DEFAULT_P_CONVENTION,
) -> MetricOutput:
    """WEAT statistic, effect size, permutation p-value and bootstrap CI (Caliskan et al. 2017).

    Parameters
    ----------
    X, Y : array-like of shape (n_x, dim), (n_y, dim)
        Target word vectors (e.g. flowers, insects). Sizes may differ.
    A, B : array-like of shape (n_a, dim), (n_b, dim)
        Attribute word vectors (e.g. pleasant, unpleasant).
    ddof : {1, 0}, default=1
        Delta degrees of freedom of the pooled standard deviation of the effect size
        (1: sample std as in the paper; 0: WEFE / BIAS framework).
    alternative : {"greater", "less", "two-sided"}, default="greater"
        Alternative hypothesis of the permutation test on the statistic ("greater": X is
        more associated with A than Y is, the paper's one-sided test).
    permutations : "auto", "exact" or int, default="auto"
        Passed to :func:`audit.stats.permutation_test` ("auto": exact when feasible, i.e. up
        to about 26+26 target words, otherwise 100 000 sampled partitions; an int: that many
        sampled partitions; "exact": exact or an error).
    seed : int or None
        Seed of the task: the sampled permutation test and the bootstrap draw from its
        independent streams ``permutation`` and ``bootstrap`` (children 0 and 1 of
        ``SeedSequence(seed)``, :func:`audit.stats.stream`).
    n_bootstrap : int, default=1000
        Bootstrap resamples of the effect size CI; 0 disables it (``ci`` is None).
    confidence : float, default=0.95
        Confidence level of the percentile interval.
    ci_method : {"targets", "targets_attributes"}, default="targets"
        Which words are resampled (module docstring): target words only, conditioning on the
        attribute sets as the permutation test does (default), or all four sets.
    p_convention : {"phipson_smyth", "caliskan"}, default="phipson_smyth"
        What the permutation test counts (:mod:`audit.stats`): partitions at least as extreme
        as the observed one, itself included (p is never 0; Phipson & Smyth 2010), or
        Caliskan et al.'s strictly greater ones (WEFE 1.0.1; an exact p may be 0).

    Returns
    -------
    MetricOutput
        ``value`` = effect size. ``fields``: ``statistic``, ``effect_size``, ``p_value``,
        ``p_method``, ``p_convention``, ``p_min`` (the smallest attainable p), ``p_note`` (why
        the method differs from the one asked for, else None), ``n_partitions``, ``ci``
        ([low, high] or None), ``ci_method``
        (``"targets"`` / ``"targets_attributes"``, None without a CI), ``ci_degenerate``,
        ``n_bootstrap``, ``confidence``, ``ddof``, ``alternative``, ``seed``,
        ``random_streams`` (procedure -> child index of ``SeedSequence(seed)``), ``n_x``,
        ``n_y``, ``n_a``, ``n_b``. ``items``: one row per target word with
        ``set`` ("X"/"Y"), ``index``, ``score`` = s(w, A, B), ``mean_cos_a``, ``mean_cos_b``.
    """
    X = as_vectors(X, "X", nonzero=True)
    Y = as_vectors(Y, "Y", nonzero=True)
    A = as_vectors(A, "A", nonzero=True)
    B = as_vectors(B, "B", nonzero=True)
    check_same_dim([("X", X), ("Y", Y), ("A", A), ("B", B)])
    ddof = check_ddof(ddof, X.shape[0] + Y.shape[0])
    check_alternative(alternative)
    check_bootstrap(n_bootstrap, confidence)
    schema.choice(ci_method, "ci_method", CI_METHODS)

    ua, ub = unit_rows(A), unit_rows(B)
    ux, uy = unit_rows(X), unit_rows(Y)
    cos_xa, cos_xb = ux @ ua.T, ux @ ub.T
    cos_ya, cos_yb = uy @ ua.T, uy @ ub.T
    ma_x, mb_x = cos_xa.mean(axis=1), cos_xb.mean(axis=1)
    ma_y, mb_y = cos_ya.mean(axis=1), cos_yb.mean(axis=1)
    s_x, s_y = ma_x - mb_x, ma_y - mb_y

    statistic = weat_statistic(s_x, s_y)
    effect_size = weat_effect_size(s_x, s_y, ddof=ddof)

    if seed is None:
        seed = fresh_seed()
    perm = permutation_test(
        np.concatenate([s_x, s_y]), X.shape[0], alternative=alternative, permutations=permutations,
        seed=stream(seed, "permutation"), p_convention=p_convention,
    )

    ci: list[float] | None = None
    n_degenerate = 0
    if n_bootstrap > 0:
        ci, n_degenerate, _ = weat_bootstrap_ci(
            cos_xa, cos_xb, cos_ya, cos_yb, method=ci_method,
            ddof=ddof, n_bootstrap=int(n_bootstrap), confidence=float(confidence), seed=stream(seed, "bootstrap"),
        )

    items = pd.DataFrame(
        {
            "set": ["X"] * X.shape[0] + ["Y"] * Y.shape[0],
            "index": np.concatenate([np.arange(X.shape[0]), np.arange(Y.shape[0])]),
            "score": np.concatenate([s_x, s_y]),
            "mean_cos_a": np.concatenate([ma_x, ma_y]),
            "mean_cos_b": np.concatenate([mb_x, mb_y]),
        }
    )
    fields: dict[str, Any] = {
        "statistic": statistic,
        "effect_size": effect_size,
        "p_value": float(perm.p_value),
        "p_method": perm.method,
        "p_convention": perm.convention,
        "p_min": perm.p_min,
        "p_note": perm.note,
        "n_partitions": perm.n_partitions,
        "n_extreme": perm.n_extreme,
        "ci": ci,
        "ci_method": ci_method if n_bootstrap > 0 else None,
        "ci_degenerate": n_degenerate,
        "n_bootstrap": int(n_bootstrap),
        "confidence": float(confidence),
        "ddof": ddof,
        "alternative": alternative,
        "seed": seed,
        "random_streams": {k: STREAMS.index(k) for k in ("permutation", "bootstrap")},
        "n_x": int(X.shape[0]),
        "n_y": int(Y.shape[0]),
        "n_a": int(A.shape[0]),
        "n_b": int(B.shape[0]),
    }
    return MetricOutput(value=effect_size, fields=fields, items=items)
