"""Permutation tests on per-item scores: exact (meet-in-the-middle counting) and sampled.

Setting
-------
``scores`` holds one number per item (WEAT: the per-word association ``s(w, A, B)`` of the
target words, X first then Y). The first ``n_x`` items form group X, the other
``n_y = N - n_x`` group Y. A *partition* re-splits the N items into groups of the same sizes;
there are ``C(N, n_x)`` of them, the observed one included. Every statistic handled here is an
increasing function of the X-subset sum ``S = sum_{i in X} s_i``:

* WEAT (Caliskan et al. 2017): ``s(X, Y, A, B) = sum_X s - sum_Y s = 2 S - T`` (``T = sum s``);
* a difference of means (LPBS, two groups): ``S / n_x - (T - S) / n_y``.

so a test only has to count the partitions whose X-subset sum lies beyond a threshold.

Conventions (identical for the exact and the sampled test)
----------------------------------------------------------
``obs`` is the observed X-subset sum, ``E = n_x T / N`` its mean over all partitions and
``tol = TIE_RTOL * sum_i |s_i| + TIE_ATOL`` (``TIE_RTOL = 1e-12``, ``TIE_ATOL`` the smallest
normal float64, which only matters when every score is 0) the tie tolerance: subset sums that
are mathematically equal but added in a different order differ by rounding (at most about
``N * 2**-53 * sum |s_i|``), so sums within ``tol`` of each other are treated as ties. The
tolerance is relative, so the p-value does not change when all scores are scaled.
A partition with X-subset sum ``S`` counts as *extreme* under one of two named conventions
(``p_convention``; :data:`P_CONVENTIONS`):

``"phipson_smyth"`` (the default; Phipson & Smyth 2010, "Permutation p-values should never be
zero", Stat. Appl. Genet. Mol. Biol. 9(1):39; what :func:`scipy.stats.permutation_test`
computes): a partition is extreme when its statistic is *at least as extreme* as the observed
one, so the observed partition and its ties always count and ``p > 0``:

* ``"greater"``:   ``S >= obs - tol``;
* ``"less"``:      ``S <= obs + tol``;
* ``"two-sided"``: ``|S - E| >= |obs - E| - tol`` (``p = 1`` when ``|obs - E| <= tol``).

``"caliskan"`` (Caliskan et al. 2017's strict ``Pr[s(X_i, Y_i) > s(X, Y)]``, what WEFE 1.0.1
computes): one-sided tests count only partitions *strictly* beyond the observed one,
``S > obs + tol`` (``"greater"``) or ``S < obs - tol`` (``"less"``), so the observed partition
and its ties never count and an exact ``p`` may be 0. The two-sided test is the same as above
in both conventions (Caliskan et al. define only the one-sided test).

p-values: exact ``p = k / C(N, n_x)`` with ``k`` the number of extreme partitions among all
of them (``phipson_smyth``: the observed one included, so ``p >= 1 / C(N, n_x)``); sampled
``p = (k + 1) / (n + 1)`` with ``k`` the number of extreme partitions among ``n`` i.i.d.
uniform random partitions (Phipson & Smyth's estimator; the +1 counts the observed partition;
WEFE uses it too, with its strict ``k``). The sampled draws are *with* replacement across
partitions (the observed partition may be drawn). ``p_min`` (:func:`p_min`) is the smallest
p-value a test can return: ``1 / (n + 1)`` sampled; exact ``1 / C(N, n_x)`` (``2 / C(N, n_x)``
two-sided with ``n_x = n_y``, where the observed partition and its mirror both count), or 0 for
a one-sided ``caliskan`` count.

A permutation count at or above ``C(N, n_x)`` asks for more random partitions than there are
distinct ones: the exact test is run instead (``method="exact"``, with a ``note`` saying so).

Exact counting
--------------
Meet in the middle (Horowitz & Sahni 1974, for subset sums): the items are split into halves
L and R; for each ``k`` the ascending sums of all size-``k`` subsets of L and of all
size-``(n_x - k)`` subsets of R are built, and the pairs with ``a + b > t`` are counted by
merging one sorted list into the other (a sorted merge, linear in their lengths). All scores
are first shifted by their minimum (every size-``n_x`` sum moves by ``n_x * min``, thresholds
with it), so every subset sum is ``>= 0`` and the merges can sort the int64 bit patterns of
the floats, which is the same order and faster. The sorted sums of each size are built one
item at a time, ``S_k <- merge(S_k, S_{k-1} + w)`` (a stable sort of two sorted runs: timsort
merges them in linear time), or, when the subsets are small and the items many, by halving
the items and merging the rows of outer sums ``S_j(A) + S_{k-j}(B)``; sizes above half a side
come from the complement ``S_{h-k} = T_side - S_k`` without being built. The two sides and
the pieces of the count run in threads (numpy releases the GIL in sorts and ufuncs). Work
and memory grow like ``2**(N/2)``: 25+25 items (``C(50, 25) ~ 1.26e14`` partitions) hold
``2 * 2**24`` sums (270 MB; peak memory about 650 MB with the merge buffers of two threads,
1.3 GB for 26+26) and take 0.6 to 0.8 s of CPU time. Counts are int64 (the
feasibility cap keeps ``C(N, n_x)`` far below ``2**63``); they are exact for every partition
whose sum is not within rounding error (a few ulps) of a threshold, and the tolerance keeps
the thresholds away from ties.

Sampled partitions
------------------
Each partition is a uniform random size-``n_x`` subset: every subset has probability
``1 / C(N, n_x)`` and no item is drawn twice within a partition. It is drawn by selection
sampling (Knuth, TAOCP vol. 2, 3.4.2, Algorithm S: item ``j`` joins X with probability
``(n_x - chosen) / (N - j)``, decided by an unbiased bounded integer draw), or, when the
smaller group is small against ``N`` (``m (m + 4) < 2 N``), by Floyd's algorithm on the
smaller group (Bentley & Floyd 1987), which draws ``m`` integers instead of ``N``. Partitions are
drawn in chunks of :data:`SAMPLE_CHUNK`; chunk ``c`` uses
``numpy.random.Generator(PCG64(seed).jumped(c))`` (chunk 0 is ``Generator(PCG64(seed))``
itself), so the same seed gives the same partitions and p-value whatever the number of
threads. ``seed`` may be an int or a :class:`numpy.random.SeedSequence` (a task's stream,
below); ``PCG64(int)`` is ``PCG64(SeedSequence(int))``.

Random streams of a task
------------------------
A task has one integer ``seed``. Every random procedure of the task draws from its own
stream, child ``i`` of ``numpy.random.SeedSequence(seed)``: ``SeedSequence(seed).spawn(n)[i]``,
which is ``SeedSequence(seed, spawn_key=(i,))`` (:func:`stream`). The index of each procedure
is fixed by :data:`STREAMS`:

=====  ======================  ==============================================================
child  procedure               used by
=====  ======================  ==============================================================
0      ``permutation``         sampled permutation tests (WEAT/SEAT, LPBS)
1      ``bootstrap``           bootstrap confidence intervals (WEAT/SEAT, LPBS)
2      ``compare_bootstrap``   paired bootstrap of a difference between two models
3      ``compare_permutation`` label-swap test of "no difference" between two models
4      ``subsets``             random training subsets (Cramér's V test cases)
5      ``classifier``          integer ``random_state`` of scikit-learn estimators
                               (Cramér's V cases, RNSB iterations: one 32-bit word each)
=====  ======================  ==============================================================

SeedSequence hashes the seed and the spawn key into the generator state, so the streams are
independent (no shared or overlapping draws), and the same seed gives the same results. The
table is append-only: renumbering a procedure changes every result that uses it. Before
this scheme the bootstrap and the sampled permutation test both used ``PCG64(seed)``
(``jumped(0)`` is the identity), i.e. the same draws.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from audit import schema
from audit.errors import DataError, ParameterError

__all__ = [
    "ALTERNATIVES",
    "DEFAULT_P_CONVENTION",
    "P_CONVENTIONS",
    "DEFAULT_PERMUTATIONS",
    "MAX_EXACT_SUMS",
    "SAMPLE_CHUNK",
    "TIE_ATOL",
    "TIE_RTOL",
    "DEGENERATE_STD",
    "STREAMS",
    "PermutationResult",
    "bootstrap_indices",
    "check_alternative",
    "check_bootstrap",
    "effect_size_bootstrap",
    "fresh_seed",
    "percentile_interval",
    "check_resample_memory",
    "physical_memory",
    "p_from_count",
    "p_min",
    "label_swap_test",
    "check_convention",
    "check_seed",
    "check_int_seed",
    "check_ddof",
    "resolve_permutations",
    "swap_extreme",
    "resample_counts",
    "stream",
    "stream_seeds",
    "exact_count_greater",
    "exact_feasible",
    "extreme_thresholds",
    "n_extreme",
    "n_partitions",
    "permutation_test",
    "sample_partitions",
    "sampled_count_greater",
    "tie_tolerance",
    "weighted_effect_sizes",
]

ALTERNATIVES = ("greater", "less", "two-sided")

#: Named conventions of what counts as extreme (module docstring): ``"phipson_smyth"``
#: (at least as extreme, the observed arrangement counted: p is never 0) and ``"caliskan"``
#: (strictly more extreme, one-sided; WEFE 1.0.1's count).
P_CONVENTIONS = ("phipson_smyth", "caliskan")
DEFAULT_P_CONVENTION = "phipson_smyth"

#: Relative tie tolerance: ``tol = TIE_RTOL * sum |s_i| + TIE_ATOL``.
TIE_RTOL = 1e-12
#: Absolute floor of the tie tolerance (smallest normal float64; matters for all-zero scores).
TIE_ATOL = float(np.finfo(np.float64).tiny)

#: Number of random partitions ``permutations="auto"`` draws when the exact test is too large
#: (the default of May et al.'s SEAT code; p-value resolution 1e-5).
DEFAULT_PERMUTATIONS = 100_000

#: Largest number of sorted subset sums (both halves together) an exact count may build.
#: 25+25 items need 2 * 2**24 ~ 3.4e7; 26+26 about 7.5e7; 27+27 (1.3e8) is refused.
MAX_EXACT_SUMS = 80_000_000

#: Rows per chunk of sampled partitions (one random stream per chunk).
SAMPLE_CHUNK = 1 << 15

#: The random procedures of a task, in child order of ``SeedSequence(seed)`` (see the module
#: docstring). Append only.
STREAMS = (
    "permutation",
    "bootstrap",
    "compare_bootstrap",
    "compare_permutation",
    "subsets",
    "classifier",
)

# Below this many sorted sums the exact count runs in the calling thread.
_THREAD_MIN_WORK = 1 << 17


@dataclasses.dataclass(frozen=True)
class PermutationResult:
    """Outcome of :func:`permutation_test`.

    p_value:      exact ``k / C(N, n_x)`` or sampled ``(k + 1) / (n + 1)``.
    method:       ``"exact"`` or ``"sampled"``.
    convention:   ``"phipson_smyth"`` or ``"caliskan"`` (:data:`P_CONVENTIONS`).
    p_min:        the smallest p-value this test could return (:func:`p_min`).
    note:         why the method differs from the one asked for (a permutation count at or
                  above ``C(N, n_x)`` runs the exact test), else None.
    alternative:  ``"greater"``, ``"less"`` or ``"two-sided"``.
    n_partitions: exact: ``C(N, n_x)``; sampled: the number of random partitions drawn.
    n_extreme:    ``k``, the partitions counted as extreme (see the module conventions).
    seed:         the seed of the random partitions as given (an int, or the task's
                  ``permutation`` :class:`numpy.random.SeedSequence`), or drawn from OS
                  entropy and recorded when none was given; ``None`` for an exact test,
                  which draws nothing.
    """

    p_value: float
    method: str
    alternative: str
    n_partitions: int
    n_extreme: int
    seed: int | np.random.SeedSequence | None
    convention: str = DEFAULT_P_CONVENTION
    p_min: float = 0.0
    note: str | None = None


# --------------------------------------------------------------------------- validation


def _as_scores(scores: Any, name: str = "scores") -> np.ndarray:
    """``scores`` as a finite 1-D float64 array with at least two items, or a DataError."""
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: cannot be read as numbers ({exc})") from None
    if s.ndim != 1:
        raise DataError(f"{name}: expected a 1-D array of per-item scores, got shape {s.shape}")
    if s.size < 2:
        raise DataError(f"{name}: need at least 2 items (one per group), got {s.size}")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise DataError(
            f"{name}: {bad.size} non-finite value(s) (NaN or inf), first at index {int(bad[0])} "
            f"({s[bad[0]]!r}); every item needs a finite score"
        )
    if not np.isfinite(np.abs(s).sum()):
        raise DataError(f"{name}: the scores are too large to add up in float64 (sum overflows)")
    return s


def _check_n_x(n_x: Any, n_items: int) -> int:
    """``n_x`` as an int with both groups non-empty, or a ParameterError."""
    n = schema.exact_integer(n_x, "n_x", what="an integer group size")
    if not 1 <= n <= n_items - 1:
        raise ParameterError(
            f"n_x={n} out of range: with {n_items} scores both groups must be non-empty "
            f"(1 <= n_x <= {n_items - 1})"
        )
    return n


def check_alternative(alternative: Any) -> str:
    """``alternative`` as one of :data:`ALTERNATIVES` (the one rule, :mod:`audit.compare` too)."""
    return str(schema.choice(alternative, "alternative", ALTERNATIVES))


def check_convention(convention: Any) -> str:
    """``convention`` as one of :data:`P_CONVENTIONS`, or a ParameterError naming it."""
    return str(schema.choice(convention, "p_convention", P_CONVENTIONS))


def check_ddof(ddof: Any, n: int | None = None) -> int:
    """The delta degrees of freedom of a pooled standard deviation: 0 or 1 (ParameterError
    otherwise); with ``n`` pooled values, also ``n - ddof > 0`` (DataError otherwise)."""
    if not schema.is_exact_integer(ddof) or ddof not in (0, 1):
        raise ParameterError(f"ddof must be 0 or 1, got {ddof!r}")
    if n is not None and n - int(ddof) <= 0:
        raise DataError(f"effect size needs more than {ddof} target words in X and Y together, got {n}")
    return int(ddof)


def _as_thresholds(thresholds: Any) -> np.ndarray:
    t = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    if t.ndim != 1 or t.size == 0:
        raise ParameterError(f"thresholds: expected one or more numbers, got shape {t.shape}")
    if np.isnan(t).any():
        raise ParameterError("thresholds: NaN threshold")
    return t


def check_bootstrap(n_bootstrap: Any, confidence: Any) -> tuple[int, float]:
    """The one rule of a bootstrap interval's parameters: ``n_bootstrap`` an integer >= 0 (0: no
    interval) and ``confidence`` strictly between 0 and 1 (:mod:`audit.schema`'s words)."""
    return (schema.integer(n_bootstrap, "n_bootstrap", 0),
            schema.number(confidence, "confidence", 0.0, strict=True, maximum=1.0))


def check_seed(seed: Any, name: str = "seed") -> int | np.random.SeedSequence | None:
    """The one seed rule of every random procedure: None (a seed is drawn and recorded), a
    :class:`numpy.random.SeedSequence` (a task's stream), or an integer ``>= 0`` of any size
    (``SeedSequence`` takes them all; libraries that need 32 bits get them through
    :func:`stream_seeds`). Anything else is a ParameterError naming ``name``."""
    if isinstance(seed, np.random.SeedSequence):
        return seed
    return check_int_seed(seed, name, allow_none=True)


def check_int_seed(seed: Any, name: str = "seed", *, allow_none: bool = False) -> int | None:
    """:func:`check_seed`'s rule where a procedure needs the integer itself (it derives its
    streams from it, or records it): a non-negative integer of any size (``bool`` is not one),
    ``None`` only where ``allow_none`` (a seed is then drawn by the caller), never a
    ``SeedSequence``; refused in :mod:`audit.schema`'s words (``seed: must be >= 0, got -1``,
    ``seed: expected an integer, got 1.5``), as every count and choice is."""
    if seed is None and allow_none:
        return None
    # one line: numpy writes a SeedSequence's repr over several
    shown = f"SeedSequence(entropy={seed.entropy})" if isinstance(seed, np.random.SeedSequence) else None
    return schema.exact_integer(seed, name, 0, what="an integer or None" if allow_none else "an integer", shown=shown)




# --------------------------------------------------------------------------- random streams


def fresh_seed() -> int:
    """A seed from OS entropy, in ``[0, 2**31)`` (recorded by callers so a run can be repeated)."""
    return int(np.random.SeedSequence().generate_state(1, np.uint32)[0] >> np.uint32(1))


def stream(seed: int, name: str) -> np.random.SeedSequence:
    """The independent stream of procedure ``name`` of a task with seed ``seed``:
    ``SeedSequence(seed).spawn(n)[i]`` with ``i = STREAMS.index(name)`` (module docstring)."""
    if name not in STREAMS:
        raise ParameterError(f"unknown random stream {name!r}; streams: {', '.join(STREAMS)}")
    s = check_int_seed(seed)  # a task's streams derive from its integer seed
    return np.random.SeedSequence(s, spawn_key=(STREAMS.index(name),))


def stream_seeds(seed: int, name: str, n: int) -> list[int]:
    """``n`` 32-bit integer seeds from stream ``name`` of ``seed``, for libraries that take an
    integer ``random_state`` (scikit-learn): ``stream(seed, name).generate_state(n, uint32)``.
    Prefix-stable: the first ``k`` seeds do not depend on ``n``."""
    n = schema.integer(n, "n", 1)
    return [int(v) for v in stream(seed, name).generate_state(n, np.uint32)]


def _generator(seed: Any) -> np.random.Generator:
    """``Generator(PCG64(seed))`` for an int, None or SeedSequence; a Generator is used as is."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.Generator(np.random.PCG64(check_seed(seed)))


def _check_shard(shard: Any) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    try:
        i, m = shard
    except (TypeError, ValueError):
        raise ParameterError(f"shard: expected a pair (i, m) with 0 <= i < m, got {shard!r}") from None
    if not (schema.is_exact_integer(i) and schema.is_exact_integer(m)):
        raise ParameterError(f"shard: expected integers (i, m) with 0 <= i < m, got {shard!r}")
    if not 0 <= i < m:
        raise ParameterError(f"shard: expected 0 <= i < m, got {shard!r}")
    return int(i), int(m)


def _n_threads(threads: int | None) -> int:
    """``threads``, or by default the CPUs this process may use, capped by a positive integer
    ``OMP_NUM_THREADS`` (which Ray sets to a task's CPU count), so workers do not oversubscribe."""
    if threads is None:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            n = os.cpu_count() or 1
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()
        if omp.isdigit() and int(omp) > 0:
            n = min(n, int(omp))
        return max(1, n)
    return schema.exact_integer(threads, "threads", 1, what="an integer or None")


def _map(fn: Callable[[Any], Any], items: Sequence[Any], threads: int) -> list[Any]:
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        return list(pool.map(fn, items))


# --------------------------------------------------------------------------- conventions


def n_partitions(n_items: int, n_x: int) -> int:
    """Number of partitions of ``n_items`` items into groups of ``n_x`` and ``n_items - n_x``
    (``C(n_items, n_x)``, a Python int, exact)."""
    return math.comb(int(n_items), int(n_x))


def _fmt_count(c: int) -> str:
    """A partition count for messages: digits with separators, or ``1.26e+14`` style for any
    size (math.log10 works on Python ints beyond the float range)."""
    if c < 10**15:
        return f"{c:,}"
    e = math.log10(c)
    return f"{10 ** (e - math.floor(e)):.2f}e+{math.floor(e)}"


def tie_tolerance(scores: Any) -> float:
    """Tie tolerance ``TIE_RTOL * sum |s_i| + TIE_ATOL`` (see the module docstring)."""
    return _tolerance(_as_scores(scores))


def _tolerance(s: np.ndarray) -> float:
    return TIE_RTOL * float(np.abs(s).sum()) + TIE_ATOL


def extreme_thresholds(scores: Any, n_x: int, alternative: str = "greater",
                       convention: str = DEFAULT_P_CONVENTION) -> np.ndarray:
    """Thresholds on the X-subset sum whose ``> t`` counts give the extreme partitions.

    Returns, for ``"greater"``, ``[obs - tol]`` (``phipson_smyth``: ``S >= obs``, ties
    counted) or ``[obs + tol]`` (``caliskan``: ``S > obs``); for ``"less"``, ``[obs + tol]``
    (``phipson_smyth``: ``S <= obs`` is the complement of ``S > obs + tol``) or ``[obs - tol]``
    (``caliskan``); for either convention
    ``[E + d - tol, E - d + tol]`` (``d = |obs - E|``) for ``"two-sided"``, or
    ``[-inf, -inf]`` when ``d <= tol`` (every partition is extreme). Feed the counts of
    :func:`exact_count_greater` or :func:`sampled_count_greater` at these thresholds to
    :func:`n_extreme`. A distributed driver calls this once, sends the thresholds to the
    shards and adds their counts. When ``n_x = N - n_x`` the two-sided distribution is
    symmetric (swapping the groups maps ``S`` to ``T - S``), so the second count may be taken
    as ``C(N, n_x)`` minus the first, as :func:`permutation_test` does.
    """
    s = _as_scores(scores)
    n = _check_n_x(n_x, s.size)
    alt = check_alternative(alternative)
    strict = check_convention(convention) == "caliskan"
    tol = _tolerance(s)
    obs = float(s[:n].sum())
    if alt == "greater":
        return np.array([obs + tol if strict else obs - tol])
    if alt == "less":
        return np.array([obs - tol if strict else obs + tol])
    mean = n * float(s.sum()) / s.size
    d = abs(obs - mean)
    if d <= tol:
        return np.array([-np.inf, -np.inf])
    return np.array([mean + d - tol, mean - d + tol])


def n_extreme(counts_greater: Any, total: int, alternative: str = "greater") -> int:
    """Number of extreme partitions from the ``> t`` counts at :func:`extreme_thresholds`.

    ``"greater"``: ``c[0]``; ``"less"``: ``total - c[0]`` (no sum lies within rounding of the
    threshold ``obs -+ tol``, so ``> `` and ``>=`` agree); ``"two-sided"``:
    ``c[0] + total - c[1]``. ``total`` is ``C(N, n_x)`` for exact counts and the number of
    sampled partitions for sampled ones.
    """
    alt = check_alternative(alternative)
    c = [int(v) for v in np.atleast_1d(np.asarray(counts_greater)).tolist()]
    need = 2 if alt == "two-sided" else 1
    if len(c) != need:
        raise ParameterError(f"counts_greater: {alternative} needs {need} count(s), got {len(c)}")
    if alt == "greater":
        return c[0]
    if alt == "less":
        return int(total) - c[0]
    return c[0] + int(total) - c[1]


# --------------------------------------------------------------------------- exact counting


def _incremental_cost(h: int, k_max: int) -> int:
    """Values moved by :func:`_merged_subset_sums` (about twice its output when
    ``k_max ~ h / 2``, but ``~ h / (k_max + 1)`` times it when ``k_max`` is small)."""
    # sum over i <= h of C(i, k) is C(h + 1, k + 1) (hockey-stick identity)
    return sum(math.comb(h + 1, k + 1) for k in range(1, k_max + 1))


def _split_cost(h: int, k_max: int) -> int:
    """Rough cost of :func:`_split_subset_sums` (output times the merge depth, per level)."""
    out = sum(math.comb(h, k) for k in range(min(h, k_max) + 1))
    return 2 * out * (h.bit_length() + 1)


def _sorted_subset_sums(w: np.ndarray, max_size: int) -> list[np.ndarray]:
    """``S[k]``: ascending sums of every size-``k`` subset of ``w >= 0``, ``k = 0..max_size``,
    by whichever of the two builders below moves fewer values."""
    h = w.size
    max_size = min(max_size, h)
    if max_size <= 1:
        return [np.zeros(1), np.sort(w)][: max_size + 1]
    if h > 32 and _split_cost(h, max_size) < _incremental_cost(h, max_size):
        return _split_subset_sums(w, max_size)
    return _merged_subset_sums(w, max_size)


def _merged_subset_sums(w: np.ndarray, max_size: int) -> list[np.ndarray]:
    """Incremental builder: one item at a time, ``S_k <- merge(S_k, S_{k-1} + w_i)`` for ``k``
    descending, in buffers of the final sizes ``C(h, k)``. The merge is an in-place stable sort
    of two sorted runs, which numpy's timsort does in linear time (and without the GIL).
    ``w`` must be non-negative: the sums are then sorted through their int64 bit patterns
    (same order, faster comparisons)."""
    h = w.size
    bufs = [np.empty(math.comb(h, k)) for k in range(max_size + 1)]
    lens = [1] + [0] * max_size
    bufs[0][0] = 0.0
    for i, wi in enumerate(w.tolist()):
        for k in range(min(i + 1, max_size), 0, -1):
            a, b = lens[k], lens[k - 1]
            np.add(bufs[k - 1][:b], wi, out=bufs[k][a : a + b])
            if a:
                bufs[k][: a + b].view(np.int64).sort(kind="stable")
            lens[k] = a + b
    return bufs


def _split_subset_sums(w: np.ndarray, max_size: int) -> list[np.ndarray]:
    """Divide-and-conquer builder for small ``max_size`` and many items: the size-``k`` sums
    of ``A + B`` are the outer sums ``S_j(A) + S_{k-j}(B)``; each row of an outer sum is a
    sorted run, and a stable sort (timsort) merges the runs."""
    half = w.size // 2
    s_a = _sorted_subset_sums(w[:half], max_size)
    s_b = _sorted_subset_sums(w[half:], max_size)
    out = []
    for k in range(max_size + 1):
        parts = [
            np.add.outer(s_a[j], s_b[k - j]).ravel()
            for j in range(max(0, k - len(s_b) + 1), min(k, len(s_a) - 1) + 1)
        ]
        sums = np.concatenate(parts)
        sums.view(np.int64).sort(kind="stable")
        out.append(sums)
    return out


_LOW_BYTE = 0 if sys.byteorder == "little" else 7


class _Scratch(threading.local):
    """Per-thread work buffers, reused across the pieces of one count (fewer page faults)."""

    def floats(self, n: int) -> np.ndarray:
        buf = getattr(self, "_f", None)
        if buf is None or buf.size < n:
            buf = self._f = np.empty(n)
        return buf[:n]

    def bytes(self, n: int) -> np.ndarray:
        buf = getattr(self, "_b", None)
        if buf is None or buf.size < n:
            buf = self._b = np.empty(n, dtype=np.uint8)
        return buf[:n]


def _merge_count_le(y: np.ndarray, buf: np.ndarray, scratch: _Scratch) -> int:
    """``sum_i #{j: y_j <= q_i}`` for ascending ``y >= +0.0`` and the ascending ``q`` (without
    ``-0.0``) held in ``buf[y.size:]``, up to ties within one ulp. ``buf`` is overwritten.

    Only the overlapping ranges are merged (so the merged values are all ``>= +0.0``): the
    middle ``y`` are copied just before the middle ``q``, the lowest mantissa bit tags their
    origin (0 for ``y``, 1 for ``q``: a change of at most one ulp, far below the tie
    tolerance, that keeps ``y <= q`` for equal values), a stable sort of the int64 bit
    patterns (the float order for non-negative values) merges the two runs, and the number of
    ``y`` before each ``q`` follows from the positions of the tags.
    """
    ny = y.size
    q = buf[ny:]
    nq = q.size
    if ny == 0 or nq == 0:
        return 0
    q_lo = int(np.searchsorted(q, y[0], side="left"))  # q[:q_lo] < every y
    q_hi = int(np.searchsorted(q, y[-1], side="right"))  # q[q_hi:] >= every y
    total = (nq - q_hi) * ny
    if q_hi <= q_lo:
        return total
    y_lo = int(np.searchsorted(y, q[q_lo], side="right"))  # y[:y_lo] <= every middle q
    y_hi = int(np.searchsorted(y, q[q_hi - 1], side="right"))  # y[y_hi:] > every middle q
    total += (q_hi - q_lo) * y_lo
    if y_hi <= y_lo:
        return total
    start = ny + q_lo - (y_hi - y_lo)  # >= 0; overwrites only y-room and pruned q
    bits = buf.view(np.uint64)
    clear_low = np.uint64(0xFFFFFFFFFFFFFFFE)
    np.bitwise_and(y[y_lo:y_hi].view(np.uint64), clear_low, out=bits[start : ny + q_lo])
    np.bitwise_or(bits[ny + q_lo : ny + q_hi], np.uint64(1), out=bits[ny + q_lo : ny + q_hi])
    merged = buf[start : ny + q_hi]
    merged.view(np.int64).sort(kind="stable")  # all values >= +0.0: int64 order = float order
    tags = scratch.bytes(merged.size)
    np.bitwise_and(merged.view(np.uint8)[_LOW_BYTE::8], np.uint8(1), out=tags)
    n_mid = q_hi - q_lo
    # the j-th q (0-based) at position p_j has p_j - j values of y before it
    return total + _positions_sum(tags) - n_mid * (n_mid - 1) // 2


def _positions_sum(tags: np.ndarray) -> int:
    """``sum(flatnonzero(tags))`` for a 0/1 uint8 array, by blocks of 64 (two reductions)."""
    width = 64
    nb = tags.size // width
    grid = tags[: nb * width].reshape(nb, width)
    per_block = grid.sum(axis=1, dtype=np.int64)
    per_offset = grid.sum(axis=0, dtype=np.int64)
    tail = np.flatnonzero(tags[nb * width :]) + nb * width
    return (
        int(np.dot(per_block, np.arange(0, nb * width, width, dtype=np.int64)))
        + int(np.dot(per_offset, np.arange(width, dtype=np.int64)))
        + int(tail.sum())
    )


def _side_sums(
    sums: list[np.ndarray], h: int, total: float, k: int
) -> tuple[float, int, np.ndarray]:
    """Size-``k`` subset sums of a side of ``h`` items as ``offset + sign * base`` with an
    ascending built ``base``: ``(0, 1, S_k)``, or the complement ``(T, -1, S_{h-k})``."""
    if k < len(sums):
        return 0.0, 1, sums[k]
    return total, -1, sums[h - k]


def _count_pairs_greater(
    a: tuple[float, int, np.ndarray],
    b: tuple[float, int, np.ndarray],
    ts: np.ndarray,
    scratch: _Scratch,
) -> np.ndarray:
    """For each ``t``: the number of pairs with ``oa + sa * x + ob + sb * y > t`` over the
    bases ``x`` of ``a`` and ``y`` of ``b`` (see :func:`_side_sums`)."""
    (oa, sa, x), (ob, sb, y) = a, b
    pairs = x.size * y.size
    out = np.zeros(ts.size, dtype=np.int64)
    for j, t in enumerate(ts.tolist()):
        if t == -np.inf:
            out[j] = pairs
            continue
        if t == np.inf:
            continue
        c = (t - oa - ob) + 0.0  # + 0.0 turns -0.0 into +0.0, so no q below is -0.0
        buf = scratch.floats(y.size + x.size)
        q = buf[y.size :]  # ascending q, written in place
        if sb == 1:  # #{y > c - sa x} = pairs - #{y <= q}, q = c - sa x
            if sa == 1:
                np.subtract(c, x[::-1], out=q)
            else:
                np.add(x, c, out=q)
            out[j] = pairs - _merge_count_le(y, buf, scratch)
        else:  # #{y < sa x - c}
            if sa == 1:
                np.subtract(x, c, out=q)
            else:
                np.subtract(0.0 - c, x[::-1], out=q)
            out[j] = _merge_count_le(y, buf, scratch)
    return out


def _mitm_plan(n_items: int, n_x: int) -> tuple[int, int, range, int, int]:
    """Split sizes and, per side, the largest subset size built directly."""
    h_l = n_items // 2
    h_r = n_items - h_l
    ks = range(max(0, n_x - h_r), min(n_x, h_l) + 1)
    return h_l, h_r, ks, _peak(h_l, ks[0], ks[-1]), _peak(h_r, n_x - ks[-1], n_x - ks[0])


def _peak(h: int, lo: int, hi: int) -> int:
    """``max(min(k, h - k) for k in range(lo, hi + 1))`` in closed form."""
    if hi < h // 2:
        return hi
    if lo > h // 2:
        return h - lo
    return h // 2


def _sums_held(h: int, k: int, cap: int) -> int:
    """``sum_{j <= k} C(h, j)``, or any value above ``cap`` once the sum passes it (so that
    absurdly large requests are refused without big-integer work)."""
    total = term = 1
    for j in range(k):
        term = term * (h - j) // (j + 1)
        total += term
        if total > cap:
            return total
    return total


def _mitm_work(n_items: int, n_x: int, cap: int | None = None) -> tuple[int, int]:
    """(sorted subset sums held, values moved building them) for an exact count over
    ``n_items`` items; with ``cap``, the held count may stop early anywhere above ``cap``."""
    if n_x <= 0 or n_x >= n_items:
        return 1, 1
    h_l, h_r, _, k_l, k_r = _mitm_plan(n_items, n_x)
    held = moved = 0
    for h, k in ((h_l, k_l), (h_r, k_r)):
        held += _sums_held(h, k, cap if cap is not None else math.inf)
        if cap is not None and held > cap:
            return held, held
        if k <= 1:
            moved += h
        elif h > 32:
            moved += min(_split_cost(h, k), _incremental_cost(h, k))
        else:
            moved += _incremental_cost(h, k)
    return held, moved


def exact_feasible(n_items: int, n_x: int, *, shards: int = 1) -> bool:
    """Whether an exact count of ``C(n_items, n_x)`` partitions is within bounds: at most
    :data:`MAX_EXACT_SUMS` sorted subset sums held, and at most four times that many values
    moved while building them (per shard, when split into ``shards`` pieces with
    :func:`exact_count_greater`). 25+25 and 26+26 items pass, 27+27 does not."""
    n_items, n_x = int(n_items), int(n_x)
    if not 0 < n_x < n_items:
        return True
    r = _n_pivots(shards, n_items)
    for c in range(0, r + 1):
        held, moved = _mitm_work(n_items - r, n_x - c, cap=MAX_EXACT_SUMS)
        if held > MAX_EXACT_SUMS or moved > 4 * MAX_EXACT_SUMS:
            return False
    return True


def _count_core(s: np.ndarray, n: int, ts: np.ndarray, threads: int) -> np.ndarray:
    """``> t`` counts over all size-``n`` subsets of ``s`` (any ``0 <= n <= len(s)``)."""
    n_items = s.size
    if n < 0 or n > n_items:
        return np.zeros(ts.size, dtype=np.int64)
    if n == 0 or n == n_items:
        total = 0.0 if n == 0 else float(s.sum())
        return (total > ts).astype(np.int64)
    h_l, h_r, ks, k_l, k_r = _mitm_plan(n_items, n)
    # shift every score by the minimum: each size-n sum moves by n * min, and all subset sums
    # become >= 0, which the int64-keyed merges need
    low = float(s.min())
    s = s - low
    ts = ts - n * low
    left, right = s[:h_l], s[h_l:]
    th = threads if _mitm_work(n_items, n)[0] >= _THREAD_MIN_WORK else 1
    s_l, s_r = _map(lambda a: _sorted_subset_sums(*a), [(left, k_l), (right, k_r)], th)
    t_l, t_r = float(left.sum()), float(right.sum())

    scratch = _Scratch()

    def piece(k: int) -> np.ndarray:
        a = _side_sums(s_l, h_l, t_l, k)
        b = _side_sums(s_r, h_r, t_r, n - k)
        return _count_pairs_greater(a, b, ts, scratch)

    # largest pieces first so the threads finish together
    order = sorted(ks, key=lambda k: -math.comb(h_l, k) * math.comb(h_r, n - k))
    return np.sum(_map(piece, order, th), axis=0, dtype=np.int64)


def _n_pivots(m: int, n_items: int) -> int:
    r = 0 if m <= 1 else (int(m) - 1).bit_length()
    if r >= n_items:
        raise ParameterError(
            f"shard count {m} too large for {n_items} items (at most {2 ** (n_items - 1)})"
        )
    return r


def _shard_patterns(n_items: int, n_x: int, m: int) -> list[list[int]]:
    """Patterns (bit masks over the pivot items) assigned to each of ``m`` shards.

    The last ``r = ceil(log2 m)`` items are pivots; each of the ``2**r`` in/out patterns of
    the pivots is an independent sub-count over the other items. Patterns go to shards by
    longest-processing-time greedy on their work estimate (deterministic).
    """
    r = _n_pivots(m, n_items)
    rest = n_items - r
    cost = []
    for p in range(1 << r):
        sub = n_x - bin(p).count("1")
        w = sum(_mitm_work(rest, sub)) if 0 <= sub <= rest else 0
        cost.append((w, p))
    cost.sort(key=lambda x: (-x[0], x[1]))
    loads = [0.0] * m
    out: list[list[int]] = [[] for _ in range(m)]
    for w, p in cost:
        j = min(range(m), key=lambda i: (loads[i], i))
        loads[j] += w
        out[j].append(p)
    return out


def exact_count_greater(
    scores: Any,
    n_x: int,
    thresholds: Any,
    *,
    shard: tuple[int, int] | None = None,
    threads: int | None = None,
) -> np.ndarray:
    """Number of size-``n_x`` subsets of the items whose score sum is ``> t``, per threshold.

    Parameters
    ----------
    scores : array-like of shape (N,)
        Finite per-item scores.
    n_x : int
        Subset size (size of group X), ``1 <= n_x <= N - 1``.
    thresholds : float or array-like of shape (T,)
        Thresholds on the subset sum; the count is strict (``sum > t``). Pass thresholds
        from :func:`extreme_thresholds`, which carry the tie tolerance, so that no subset sum
        lies within rounding error of a threshold.
    shard : (i, m), optional
        Count only the ``i``-th of ``m`` disjoint pieces: the last ``ceil(log2 m)`` items
        are pivots, each in/out pattern of the pivots is a sub-count over the other items,
        and the patterns are dealt to the shards. ``sum(exact_count_greater(..., shard=(i, m))
        for i in range(m))`` equals the unsharded count. Each shard builds the sorted sums of
        ``N - ceil(log2 m)`` items, so sharding also cuts each worker's memory.
    threads : int, optional
        Threads to use (default: the CPUs available to this process, at most
        ``OMP_NUM_THREADS`` when that is set, as in a Ray task).

    Returns
    -------
    counts : ndarray of int64, shape (T,)

    Raises
    ------
    DataError
        Non-finite or malformed scores.
    ParameterError
        ``n_x`` out of range, bad shard, or a count too large to do exactly
        (see :func:`exact_feasible`).
    """
    s = _as_scores(scores)
    n = _check_n_x(n_x, s.size)
    ts = _as_thresholds(thresholds)
    i, m = _check_shard(shard)
    th = _n_threads(threads)
    if not exact_feasible(s.size, n, shards=m):
        raise ParameterError(
            f"exact permutation test over C({s.size}, {n}) = {_fmt_count(n_partitions(s.size, n))} "
            f"partitions is too large to count exactly (beyond {MAX_EXACT_SUMS:,} subset sums "
            f"per worker); sample instead, e.g. permutations=100000 (--permutations 100000)"
        )
    if m == 1:
        return _count_core(s, n, ts, th)
    r = _n_pivots(m, s.size)
    rest, piv = s[: s.size - r], s[s.size - r :]
    counts = np.zeros(ts.size, dtype=np.int64)
    for p in _shard_patterns(s.size, n, m)[i]:
        members = [piv[b] for b in range(r) if p >> b & 1]
        counts += _count_core(rest, n - len(members), ts - float(sum(members)), th)
    return counts


# --------------------------------------------------------------------------- sampling


def _use_floyd(n_items: int, n_x: int) -> bool:
    """Floyd's algorithm (``m`` draws, ``m**2 / 2`` comparisons per partition for the smaller
    group of size ``m``) beats selection sampling (``N`` steps) when ``m (m + 4) / 2 < N``."""
    m = min(n_x, n_items - n_x)
    return m * (m + 4) < 2 * n_items


def _draw_chunk(
    gen: np.random.Generator, s: np.ndarray, n: int, rows: int, want_mask: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """X-subset sums (and optionally the X masks) of ``rows`` uniform random partitions."""
    if _use_floyd(s.size, n):
        return _draw_chunk_floyd(gen, s, n, rows, want_mask)
    n_items = s.size
    dt = np.int16 if n_items < 2**15 else np.int64
    need = np.full(rows, n, dtype=dt)
    sums = np.zeros(rows)
    mask = np.zeros((rows, n_items), dtype=bool) if want_mask else None
    take = np.empty(rows, dtype=bool)
    term = np.empty(rows)
    for j, sj in enumerate(s.tolist()):
        # selection sampling: item j joins X when an unbiased draw from [0, N - j) is below
        # the number of items X still needs
        np.less(gen.integers(0, n_items - j, size=rows, dtype=dt), need, out=take)
        need -= take
        np.multiply(take, sj, out=term)  # exact: sj or 0
        sums += term
        if mask is not None:
            mask[:, j] = take
    return sums, mask


def _draw_chunk_floyd(
    gen: np.random.Generator, s: np.ndarray, n: int, rows: int, want_mask: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """The same by Floyd's algorithm (Bentley & Floyd 1987, "A sample of brilliance") on the
    smaller group, of size ``m``: for ``j = N - m .. N - 1`` draw ``t`` uniform in
    ``[0, j]`` and take ``t``, or ``j`` when ``t`` is already taken. The X sum of a partition
    whose Y was drawn is ``T - sum_Y``."""
    n_items = s.size
    m = min(n, n_items - n)
    dt = np.int32 if n_items < 2**31 else np.int64
    chosen = np.empty((rows, m), dtype=dt)
    for i, j in enumerate(range(n_items - m, n_items)):
        t = gen.integers(0, j + 1, size=rows, dtype=dt)
        taken = (chosen[:, :i] == t[:, None]).any(axis=1)
        chosen[:, i] = np.where(taken, j, t)
    part = s[chosen].sum(axis=1)
    sums = part if m == n else float(s.sum()) - part
    mask = None
    if want_mask:
        mask = np.zeros((rows, n_items), dtype=bool)
        mask[np.arange(rows)[:, None], chosen] = True
        if m != n:
            mask = ~mask
    return sums, mask


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(c, min(SAMPLE_CHUNK, n - c * SAMPLE_CHUNK)) for c in range(-(-n // SAMPLE_CHUNK))]


def sampled_count_greater(
    scores: Any,
    n_x: int,
    thresholds: Any,
    n: int,
    *,
    seed: int | np.random.SeedSequence | None,
    threads: int | None = None,
) -> np.ndarray:
    """Number of ``n`` i.i.d. uniform random partitions whose X-subset sum is ``> t``.

    Each partition is a uniform random size-``n_x`` subset of the ``N`` items (no item twice
    within a partition); partitions are independent (the same one may recur). The random
    stream is described in the module docstring: chunk ``c`` of :data:`SAMPLE_CHUNK` rows uses
    ``Generator(PCG64(seed).jumped(c))``; ``seed=None`` takes fresh OS entropy; a
    :class:`numpy.random.SeedSequence` (a task's ``permutation`` stream) may replace the int.

    Parameters
    ----------
    scores, n_x, thresholds
        As for :func:`exact_count_greater` (compare with :func:`extreme_thresholds`).
    n : int
        Number of random partitions, ``>= 1``.
    seed : int, SeedSequence or None
        Non-negative seed (or SeedSequence) of the partition stream.
    threads : int, optional
        Threads drawing chunks in parallel (default as in :func:`exact_count_greater`); the
        result does not depend on it.

    Returns
    -------
    counts : ndarray of int64, shape (T,)
    """
    s = _as_scores(scores)
    k = _check_n_x(n_x, s.size)
    ts = _as_thresholds(thresholds)
    n = schema.integer(n, "n", 1)
    root = np.random.PCG64(check_seed(seed))
    th = _n_threads(threads)

    def chunk(cr: tuple[int, int]) -> np.ndarray:
        c, rows = cr
        sums, _ = _draw_chunk(np.random.Generator(root.jumped(c)), s, k, rows, False)
        return (sums[:, None] > ts[None, :]).sum(axis=0, dtype=np.int64)

    return np.sum(_map(chunk, _chunks(n), th), axis=0, dtype=np.int64)


def sample_partitions(
    n_items: int, n_x: int, n: int, *, seed: int | np.random.SeedSequence | None
) -> Iterator[np.ndarray]:
    """The random partitions :func:`sampled_count_greater` draws for the same arguments, as
    boolean X-membership masks of shape ``(rows, n_items)``, one chunk at a time."""
    n_items = int(n_items)
    k = _check_n_x(n_x, n_items)
    n = schema.integer(n, "n", 1)
    root = np.random.PCG64(check_seed(seed))
    zeros = np.zeros(n_items)
    for c, rows in _chunks(n):
        _, mask = _draw_chunk(np.random.Generator(root.jumped(c)), zeros, k, rows, True)
        yield mask


# --------------------------------------------------------------------------- the test


def p_from_count(k: int, total: int, method: str) -> float:
    """The p-value from ``k`` extreme arrangements among ``total`` (module docstring): exact
    ``k / total`` (every arrangement counted, the observed one among them), sampled
    ``(k + 1) / (total + 1)`` (Phipson & Smyth 2010: the observed arrangement added to
    ``total`` random ones)."""
    if method == "exact":
        return int(k) / int(total)
    return (int(k) + 1) / (int(total) + 1)


def p_min(method: str, total: int, alternative: str = "greater",
          convention: str = DEFAULT_P_CONVENTION, mirrored: bool = False) -> float:
    """Smallest p-value a permutation test can return (module docstring): sampled
    ``1 / (total + 1)``; exact ``1 / total``, ``2 / total`` for a two-sided test whose
    observed arrangement always has a distinct mirror image counted with it (``mirrored``:
    ``n_x = n_y``, or a label swap of all items), and 0 for a one-sided ``caliskan`` count."""
    if method != "exact":
        return 1.0 / (int(total) + 1)
    if check_convention(convention) == "caliskan" and alternative != "two-sided":
        return 0.0
    return min(1.0, (2.0 if mirrored and alternative == "two-sided" else 1.0) / int(total))


def _resolve_permutations(permutations: Any, n_items: int, n: int) -> tuple[str, int, str | None]:
    if isinstance(permutations, str):
        if permutations == "exact":
            if not exact_feasible(n_items, n):
                raise ParameterError(
                    f"permutations='exact': C({n_items}, {n}) = "
                    f"{_fmt_count(n_partitions(n_items, n))} "
                    f"partitions are too many to count exactly on one worker; sample instead, "
                    f"e.g. permutations=100000 (--permutations 100000)"
                )
            return "exact", n_partitions(n_items, n), None
        if permutations == "auto":
            if exact_feasible(n_items, n):
                return "exact", n_partitions(n_items, n), None
            return "sampled", DEFAULT_PERMUTATIONS, None
        raise ParameterError(
            f"permutations={permutations!r}: expected 'exact', 'auto' or a positive integer"
        )
    asked = schema.integer(permutations, "permutations", 1)
    total = n_partitions(n_items, n)
    if asked >= total and exact_feasible(n_items, n):
        return "exact", total, (
            f"permutations={_fmt_count(asked)} >= the {_fmt_count(total)} distinct partitions of "
            f"{n}+{n_items - n} items: exact test run instead"
        )
    return "sampled", asked, None


def resolve_permutations(permutations: Any, n_items: int, n_x: int) -> tuple[str, int, str | None]:
    """``(method, partitions counted or drawn, note)`` for a ``permutations`` setting on
    ``n_items`` scores with ``n_x`` in group X, without computing anything: ``"auto"`` and
    ``"exact"`` as in :func:`permutation_test`; an int at or above ``C(n_items, n_x)`` gives the
    exact test and a note saying so (sampling more partitions than exist adds only noise)."""
    return _resolve_permutations(permutations, int(n_items), _check_n_x(n_x, int(n_items)))


def permutation_test(
    scores: Any,
    n_x: int,
    *,
    alternative: str = "greater",
    permutations: str | int = "auto",
    seed: int | np.random.SeedSequence | None = None,
    p_convention: str = DEFAULT_P_CONVENTION,
) -> PermutationResult:
    """Permutation test of ``sum_X s - sum_Y s`` (or any statistic increasing in it).

    Parameters
    ----------
    scores : array-like of shape (N,)
        Per-item scores; the first ``n_x`` items are group X, the rest group Y.
    n_x : int
        Size of group X, ``1 <= n_x <= N - 1``.
    alternative : {"greater", "less", "two-sided"}, default "greater"
        Which partitions count as extreme; see the module docstring (``"greater"``: X's
        statistic is larger, Caliskan et al.'s one-sided test).
    permutations : "auto", "exact" or int, default "auto"
        ``"exact"`` counts all ``C(N, n_x)`` partitions (ParameterError when
        :func:`exact_feasible` says no); an int draws that many uniform random partitions
        (an int ``>= C(N, n_x)`` runs the exact test instead, with a ``note``);
        ``"auto"`` is exact when feasible (25+25 items and more), else
        :data:`DEFAULT_PERMUTATIONS` random partitions.
    seed : int or SeedSequence, optional
        Seed of the random partitions (a metric passes its task's ``permutation`` stream,
        :func:`stream`). When sampling without one, a seed is drawn from OS entropy and
        recorded in the result so the run can be repeated.
    p_convention : {"phipson_smyth", "caliskan"}, default "phipson_smyth"
        What counts as extreme (module docstring): at least as extreme, the observed
        partition included (never 0), or Caliskan et al.'s strict one-sided count (WEFE).

    Returns
    -------
    PermutationResult

    Examples
    --------
    >>> permutation_test([3.0, 2.0, 1.0, 0.0], 2).p_value   # only X = {3, 2} itself: 1 of 6
    0.16666666666666666
    >>> permutation_test([3.0, 2.0, 1.0, 0.0], 2, p_convention="caliskan").p_value
    0.0
    >>> permutation_test([3.0, 2.0, 1.0, 0.0], 2, alternative="two-sided").p_value
    0.3333333333333333
    """
    s = _as_scores(scores)
    n = _check_n_x(n_x, s.size)
    alt = check_alternative(alternative)
    conv = check_convention(p_convention)
    seed = check_seed(seed)
    method, total, note = _resolve_permutations(permutations, s.size, n)
    ts = extreme_thresholds(s, n, alt, conv)
    floor = p_min(method, total, alt, conv, mirrored=2 * n == s.size)
    if method == "exact":
        if alt == "two-sided" and 2 * n == s.size and np.isfinite(ts[0]):
            # n_x = n_y: S -> T - S (swap the groups) maps partitions onto partitions, so the
            # lower tail mirrors the upper one and one count gives both: c(t2) = total - c(t1)
            c1 = int(exact_count_greater(s, n, ts[:1])[0])
            counts = np.array([c1, total - c1])
        else:
            counts = exact_count_greater(s, n, ts)
        k = n_extreme(counts, total, alt)
        return PermutationResult(p_from_count(k, total, "exact"), "exact", alt, total, k, None, conv, floor, note)
    if seed is None:
        seed = fresh_seed()
    k = n_extreme(sampled_count_greater(s, n, ts, total, seed=seed), total, alt)
    return PermutationResult(p_from_count(k, total, "sampled"), "sampled", alt, total, k, seed, conv, floor)


def _swap_masks_exact(n: int) -> np.ndarray:
    """All 2**n swap patterns as an (2**n, n) boolean array (bit j of the row number)."""
    rows = np.arange(2**n, dtype=np.int64)[:, None]
    return ((rows >> np.arange(n, dtype=np.int64)[None, :]) & 1).astype(bool)


def swap_extreme(t: np.ndarray, obs: float, alternative: str, convention: str = DEFAULT_P_CONVENTION) -> np.ndarray:
    """Which statistics ``t`` of rearranged data are extreme against the observed ``obs``
    (module docstring's conventions for a statistic of any scale, ``tol = 1e-10 max(1, |obs|)``):
    ``phipson_smyth``: ``t >= obs - tol`` / ``t <= obs + tol`` / ``|t| >= |obs| - tol``;
    ``caliskan``: one-sided ``t > obs + tol`` / ``t < obs - tol`` (two-sided as above)."""
    strict = check_convention(convention) == "caliskan"
    tol = 1e-10 * max(1.0, abs(obs))
    with np.errstate(invalid="ignore"):
        if alternative == "greater":
            return t > obs + tol if strict else t >= obs - tol
        if alternative == "less":
            return t < obs - tol if strict else t <= obs + tol
        return np.abs(t) >= abs(obs) - tol


#: Swap patterns evaluated per block by :func:`label_swap_test`.
SWAP_BLOCK = 4096


def label_swap_test(
    n: int,
    t_of: Callable[[np.ndarray], np.ndarray],
    obs: float,
    *,
    alternative: str = "two-sided",
    exact: bool,
    n_draw: int = DEFAULT_PERMUTATIONS,
    seed: int | np.random.SeedSequence | None = None,
    p_convention: str = DEFAULT_P_CONVENTION,
) -> PermutationResult:
    """Paired permutation (label swap within items) test on ``n`` items: under H0 each item's
    two measurements are exchangeable (Fisher 1935; Good 2005, *Permutation, Parametric and
    Bootstrap Tests of Hypotheses*, ch. 3). ``t_of(masks)`` returns the statistic for an
    ``(R, n)`` boolean block of swap patterns (True: swapped); ``t_of(zeros)`` is ``obs``, and
    swapping every item exchanges the two samples, which must negate the statistic
    (``t_of(~m) = -t_of(m)``).

    ``exact``: all ``2**n`` patterns (half evaluated: each pattern's complement gives ``-t``),
    ``p = k / 2**n``, the observed pattern among them. Otherwise ``n_draw`` patterns of ``n``
    fair bits from ``Generator(PCG64(seed))``, ``p = (k + 1) / (n_draw + 1)``. Extreme
    patterns: :func:`swap_extreme` with ``p_convention``; p-values: :func:`p_from_count`.
    """
    alt = check_alternative(alternative)
    conv = check_convention(p_convention)
    k = total = 0
    if exact:
        half = _swap_masks_exact(n - 1) if n > 1 else np.zeros((1, 0), dtype=bool)
        masks = np.concatenate([half, np.zeros((half.shape[0], 1), dtype=bool)], axis=1)
        blocks: Any = [masks[i : i + SWAP_BLOCK] for i in range(0, masks.shape[0], SWAP_BLOCK)]
    else:
        n_draw = schema.integer(n_draw, "permutations", 1)
        seed = fresh_seed() if seed is None else check_seed(seed)
        gen = np.random.Generator(np.random.PCG64(seed))
        sizes = [min(SWAP_BLOCK, n_draw - i) for i in range(0, n_draw, SWAP_BLOCK)]
        # each pattern: n independent fair bits (the bits of uniform random bytes)
        blocks = (
            np.unpackbits(gen.integers(0, 256, size=(r, -(-n // 8)), dtype=np.uint8), axis=1, count=n).astype(bool)
            for r in sizes
        )
    for m in blocks:
        t = t_of(m)
        k += int(swap_extreme(t, obs, alt, conv).sum())
        total += m.shape[0]
        if exact:
            k += int(swap_extreme(-t, obs, alt, conv).sum())
            total += m.shape[0]
    method = "exact" if exact else "sampled"
    return PermutationResult(p_from_count(k, total, method), method, alt, total, k,
                             None if exact else seed, conv, p_min(method, total, alt, conv, mirrored=True))


# --------------------------------------------------------------------------- bootstrap


def bootstrap_indices(
    sizes: Sequence[int], n_resamples: int, seed: int | np.random.SeedSequence | np.random.Generator | None
) -> list[np.ndarray]:
    """Stratified bootstrap resamples: for each group size ``m``, an int array of shape
    ``(n_resamples, m)`` of indices drawn uniformly with replacement from ``range(m)``.

    Groups are resampled independently (stratified, as :func:`scipy.stats.bootstrap` does
    for several samples with ``paired=False``) from one ``Generator(PCG64(seed))`` (or the
    given Generator), group after group, ``integers(0, m, size=(n_resamples, m))`` each: the
    draws scipy makes from the same Generator.
    """
    n_resamples = schema.integer(n_resamples, "n_resamples", 1)
    gen = _generator(seed)
    out = []
    for m in sizes:
        if not schema.is_exact_integer(m) or m < 1:
            raise ParameterError(f"sizes: group size {m!r} is not a positive integer")
        out.append(gen.integers(0, int(m), size=(n_resamples, int(m))))
    return out


# --------------------------------------------------------------------------- sharded exact test


#: Exact tests over more partitions than this are worth splitting across workers.
SHARD_MIN_PARTITIONS = 10**9


def shards_worthwhile(n_items: int, n_x: int, permutations: Any, shards: int) -> bool:
    """Whether an exact test over C(n_items, n_x) partitions should be split into ``shards``
    pieces: more than :data:`SHARD_MIN_PARTITIONS` partitions, an exact test asked for
    (``"exact"``, or ``"auto"`` where exact is feasible) and each piece feasible."""
    if shards <= 1 or n_partitions(n_items, n_x) <= SHARD_MIN_PARTITIONS:
        return False
    if permutations == "exact" or (permutations == "auto" and exact_feasible(n_items, n_x)):
        return exact_feasible(n_items, n_x, shards=shards)
    return False


def sharded_exact_p_value(
    scores: Any,
    n_x: int,
    alternative: str,
    shards: int,
    map_fn: Callable[[Callable[..., Any], list[tuple[int, int]]], Sequence[Any]] | None = None,
    p_convention: str = DEFAULT_P_CONVENTION,
) -> dict[str, Any]:
    """The exact permutation p-value of :func:`permutation_test`, its count split into
    ``shards`` disjoint pieces (:func:`exact_count_greater` with ``shard=(i, shards)``).

    ``map_fn(count, pieces)`` applies ``count(shard)`` to every ``(i, shards)`` of ``pieces`` and
    returns the counts in order; a distributed caller passes a parallel map (one worker per
    piece), the default is the builtin sequential map. The thresholds are computed once here
    (:func:`extreme_thresholds`), so every piece counts against the same ones, and the sum of the
    pieces is the unsharded count: the p-value is ``n_extreme / C(N, n_x)``, identical to the
    unsharded exact test.

    Returns ``{"p_value", "p_method": "exact", "n_partitions", "n_extreme", "exact_shards",
    "p_convention", "p_min"}``.
    """
    s = _as_scores(scores)
    n = _check_n_x(n_x, s.size)
    conv = check_convention(p_convention)
    ts = extreme_thresholds(s, n, alternative, conv)

    def count(piece: tuple[int, int]) -> np.ndarray:
        return exact_count_greater(s, n, ts, shard=piece)

    pieces = [(i, int(shards)) for i in range(int(shards))]
    counts = list(map_fn(count, pieces)) if map_fn is not None else [count(p) for p in pieces]
    total = n_partitions(s.size, n)
    k = n_extreme(np.sum(counts, axis=0), total, alternative)
    return {"p_value": p_from_count(k, total, "exact"), "p_method": "exact", "n_partitions": total,
            "n_extreme": k, "exact_shards": int(shards), "p_convention": conv,
            "p_min": p_min("exact", total, alternative, conv, mirrored=2 * n == s.size)}


def physical_memory() -> int | None:
    """Bytes of physical memory of this machine (``os.sysconf``), or None where unknown."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def _fmt_bytes(b: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if b < 1024 or unit == "PiB":
            return f"{b:,.0f} {unit}" if unit == "bytes" else f"{b:,.1f} {unit}"
        b /= 1024
    return f"{b:.1f} PiB"  # pragma: no cover


def check_resample_memory(name: str, n: Any, items: int, *, memory: int | None = None) -> None:
    """Refuse, before any work, a resample count whose draws cannot fit in memory.

    A bootstrap of ``n`` resamples over ``items`` items holds at least ``n * items`` int64
    indices at once (:func:`bootstrap_indices`), ``8 n items`` bytes. When that exceeds the
    machine's physical memory (``memory``, default :func:`physical_memory`) a ParameterError
    names the parameter, the size and the largest count that fits. ``n`` may be an int or an
    integral float (``--param n_bootstrap=1e11``); anything else is left to the metric's own
    validation.
    """
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Real):
        return
    try:
        count = int(n) if float(n).is_integer() else None
    except (OverflowError, ValueError):
        count = None
    if count is None or count <= 0 or items <= 0:
        return
    mem = physical_memory() if memory is None else int(memory)
    need = 8 * count * int(items)
    if mem is not None and need > mem:
        fits = max(1, mem // (8 * int(items)))
        raise ParameterError(
            f"{name}={_fmt_count(count)}: {_fmt_count(count)} resamples of {items} items need at least "
            f"{_fmt_bytes(need)} of memory, more than this machine's {_fmt_bytes(mem)}; "
            f"use at most {fits:,}"
        )


def resample_counts(idx: np.ndarray, m: int) -> np.ndarray:
    """Per-resample counts (shape (B, m)) of bootstrap indices ``idx`` (shape (B, m))."""
    b = idx.shape[0]
    flat = (idx + m * np.arange(b)[:, None]).ravel()
    return np.bincount(flat, minlength=b * m).reshape(b, m)


def percentile_interval(values: Any, confidence: float) -> list[float] | None:
    """Percentile bootstrap interval (Efron & Tibshirani 1993, ch. 13): the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of the finite ``values``
    (``numpy.quantile``, linear interpolation, as :func:`scipy.stats.bootstrap`'s
    ``method="percentile"``); ``None`` when no value is finite."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    alpha = 1.0 - float(confidence)
    lo, hi = np.quantile(v, [alpha / 2.0, 1.0 - alpha / 2.0])
    return [float(lo), float(hi)]


#: At or below this pooled standard deviation a resampled effect size is undefined (absolute:
#: WEAT scores are differences of mean cosines, |s| <= 2).
DEGENERATE_STD = 1e-12


def weighted_effect_sizes(
    s_x: np.ndarray, s_y: np.ndarray, c_x: np.ndarray, c_y: np.ndarray, ddof: int
) -> np.ndarray:
    """Effect sizes ``(mean_x - mean_y) / std_pooled`` of resamples given by counts.

    ``s_x`` (shape (n_x,) or (B, n_x)) and ``s_y`` are the item scores (per resample when
    2-D), ``c_x`` (B, n_x) and ``c_y`` (B, n_y) how often each item was drawn. Means are
    count-weighted; the pooled standard deviation is over the ``n = n_x + n_y`` drawn items
    with ``ddof``. Resamples whose standard deviation is ``<= 1e-12`` give NaN.
    """
    s_x = np.broadcast_to(s_x, c_x.shape)
    s_y = np.broadcast_to(s_y, c_y.shape)
    n_x, n_y = c_x.shape[1], c_y.shape[1]
    mean_x = (c_x * s_x).sum(axis=1) / n_x
    mean_y = (c_y * s_y).sum(axis=1) / n_y
    n = n_x + n_y
    pooled = (mean_x * n_x + mean_y * n_y) / n
    ss = (c_x * (s_x - pooled[:, None]) ** 2).sum(axis=1) + (c_y * (s_y - pooled[:, None]) ** 2).sum(axis=1)
    std = np.sqrt(ss / (n - ddof))
    with np.errstate(invalid="ignore", divide="ignore"):
        es = (mean_x - mean_y) / std
    es[~(std > DEGENERATE_STD)] = np.nan
    return es


def effect_size_bootstrap(
    s_x: Any,
    s_y: Any,
    *,
    ddof: int,
    n_resamples: int,
    confidence: float = 0.95,
    seed: int | np.random.SeedSequence | np.random.Generator | None = None,
) -> tuple[list[float] | None, int, np.ndarray]:
    """Percentile bootstrap interval of a two-group effect size, item scores held fixed.

    ``d = (mean(s_x) - mean(s_y)) / std(s_x u s_y, ddof)`` (WEAT's effect size over target
    words, LPBS's over attribute words). Each resample draws ``|X|`` items with replacement
    from X and ``|Y|`` from Y (stratified, :func:`bootstrap_indices`, X then Y) and recomputes
    ``d``; the scores themselves are not recomputed, so whatever they were computed from
    (WEAT: the attribute sets) is conditioned on, as in the permutation test of the same
    items. Resamples with a pooled standard deviation ``<= 1e-12`` (``d`` undefined) are
    dropped and counted. With none dropped the interval is :func:`scipy.stats.bootstrap`'s
    ``method="percentile"`` with ``paired=False`` on ``(s_x, s_y)`` and the same Generator.

    Returns ``(ci, n_degenerate, effect_sizes)``: ``ci`` = :func:`percentile_interval` of the
    finite effect sizes (``None`` if every resample was degenerate).
    """
    s_x = _as_scores_1d(s_x, "s_x")
    s_y = _as_scores_1d(s_y, "s_y")
    ix, iy = bootstrap_indices([s_x.size, s_y.size], n_resamples, seed)
    es = weighted_effect_sizes(
        s_x, s_y, resample_counts(ix, s_x.size), resample_counts(iy, s_y.size), int(ddof)
    )
    ok = np.isfinite(es)
    return percentile_interval(es[ok], confidence), int(es.size - ok.sum()), es[ok]


def _as_scores_1d(x: Any, name: str) -> np.ndarray:
    try:
        s = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{name}: cannot be read as numbers ({exc})") from None
    if s.ndim != 1 or s.size < 1:
        raise DataError(f"{name}: expected a non-empty 1-D array of item scores, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise DataError(f"{name}: non-finite score at index {int(np.flatnonzero(~np.isfinite(s))[0])}")
    return s
