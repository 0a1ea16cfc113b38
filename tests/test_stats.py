"""Tests of audit.stats: exact and sampled permutation tests, shards, ties, errors."""

from __future__ import annotations

import doctest
import itertools
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from audit import stats
from audit.errors import DataError, ParameterError

pytestmark = pytest.mark.unit

ALTS = ("greater", "less", "two-sided")


# --------------------------------------------------------------------------- references


def brute_sums(s: np.ndarray, n_x: int) -> np.ndarray:
    """X-subset sums of every partition, by enumeration (one Python sum per partition)."""
    return np.array([math.fsum(s[list(c)]) for c in itertools.combinations(range(s.size), n_x)])


def brute_extreme(s: np.ndarray, n_x: int, alternative: str, convention: str = "phipson_smyth") -> tuple[int, int]:
    """(n_extreme, n_partitions) by enumeration, following the documented conventions
    (phipson_smyth: at least as extreme, ties and the observed partition counted; caliskan:
    strictly more extreme one-sided)."""
    sums = brute_sums(s, n_x)
    tol = 1e-12 * np.abs(s).sum() + np.finfo(float).tiny
    obs = math.fsum(s[:n_x])
    mean = n_x * math.fsum(s) / s.size
    strict = convention == "caliskan"
    if alternative == "greater":
        k = int((sums > obs + tol).sum()) if strict else int((sums >= obs - tol).sum())
    elif alternative == "less":
        k = int((sums < obs - tol).sum()) if strict else int((sums <= obs + tol).sum())
    else:
        k = int((np.abs(sums - mean) >= abs(obs - mean) - tol).sum())
    return k, sums.size


def dp_count_greater(values: list[int], n_x: int, threshold: float) -> int:
    """Number of size-n_x subsets of non-negative integers with sum > threshold, by a
    polynomial (size, sum) count in Python ints: independent of the meet-in-the-middle code."""
    top = sum(sorted(values)[-n_x:])
    ways = [[0] * (top + 1) for _ in range(n_x + 1)]
    ways[0][0] = 1
    for v in values:
        for k in range(n_x, 0, -1):
            row, prev = ways[k], ways[k - 1]
            for total in range(top, v - 1, -1):
                if prev[total - v]:
                    row[total] += prev[total - v]
    return sum(c for total, c in enumerate(ways[n_x]) if total > threshold)


def scores_cases() -> list[tuple[str, np.ndarray, int]]:
    rng = np.random.default_rng(20240501)
    cases = []
    for n_x, n_y in [(4, 6), (7, 7), (8, 8), (5, 9), (1, 5), (6, 1), (2, 2), (3, 8), (9, 4)]:
        n = n_x + n_y
        cases.append((f"float-{n_x}+{n_y}", rng.normal(size=n), n_x))
        cases.append((f"int-{n_x}+{n_y}", rng.integers(-3, 4, size=n).astype(float), n_x))
        rep = rng.normal(size=n)
        rep[rng.integers(0, n, size=n // 2)] = rep[0]  # repeated scores
        cases.append((f"repeat-{n_x}+{n_y}", rep, n_x))
    cases.append(("all-equal", np.full(10, 0.7), 5))
    cases.append(("all-zero", np.zeros(8), 4))
    cases.append(("observed-max", np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0]), 3))
    cases.append(("observed-min", np.array([-5.0, -4.0, 3.0, 2.0, 1.0, 0.0]), 2))
    return cases


CASES = scores_cases()


# --------------------------------------------------------------------------- exact


@pytest.mark.parametrize("name,s,n_x", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("alternative", ALTS)
def test_exact_matches_enumeration(name, s, n_x, alternative):
    res = stats.permutation_test(s, n_x, alternative=alternative, permutations="exact")
    k, total = brute_extreme(s, n_x, alternative)
    assert res.method == "exact" and res.alternative == alternative and res.seed is None
    assert res.n_partitions == total == math.comb(s.size, n_x)
    assert res.n_extreme == k
    assert res.p_value == k / total


def test_exact_known_values():
    s = np.array([3.0, 2.0, 1.0, 0.0])  # X = {3, 2}: sums over the 6 partitions 5,4,3,3,2,1
    # the default counts the observed partition: p = 1/6, never 0 (Phipson & Smyth 2010)
    top = stats.permutation_test(s, 2)
    assert (top.p_value, top.n_extreme, top.p_min, top.convention) == (1 / 6, 1, 1 / 6, "phipson_smyth")
    assert stats.permutation_test(s, 2, alternative="less").n_extreme == 6
    assert stats.permutation_test(s[::-1], 2, alternative="less").p_value == 1 / 6
    # Caliskan's strict count (WEFE): nothing is greater than the observed 5, p = 0
    strict = stats.permutation_test(s, 2, p_convention="caliskan")
    assert (strict.p_value, strict.p_min) == (0.0, 0.0)
    assert stats.permutation_test(s, 2, alternative="less", p_convention="caliskan").n_extreme == 5
    assert stats.permutation_test(s[::-1], 2, alternative="less", p_convention="caliskan").p_value == 0.0
    # |S - 3| >= 2: the sums 5 and 1, in both conventions; p_min 2/6 (the mirror counts too)
    for conv in stats.P_CONVENTIONS:
        two = stats.permutation_test(s, 2, alternative="two-sided", p_convention=conv)
        assert (two.n_extreme, two.p_min) == (2, 2 / 6)
    with pytest.raises(ParameterError, match=r"^p_convention: unknown value 'wefe'; known: phipson_smyth, caliskan$"):
        stats.permutation_test(s, 2, p_convention="wefe")
    all_same = stats.permutation_test(np.ones(6), 3, alternative="two-sided")
    assert all_same.p_value == 1.0 and all_same.n_extreme == 20


def test_rounding_ties_do_not_count():
    # 0.1 + 0.2 != 0.3 in float64; swapping the two is a tie, not a "greater" partition
    s = np.array([0.3, 0.5, 0.1 + 0.2, 0.0])
    assert 0.1 + 0.2 > 0.3
    res = stats.permutation_test(s, 2, alternative="greater", p_convention="caliskan")
    assert res.n_extreme == 0  # a naive '>' would count {0.1+0.2, 0.5}
    # 0.6, 0.5, 0.3, 0.3 are strictly less than the observed 0.8
    assert stats.permutation_test(s, 2, alternative="less", p_convention="caliskan").n_extreme == 4
    # at least as extreme: the observed {0.3, 0.5} and its rounding tie {0.1+0.2, 0.5}
    assert stats.permutation_test(s, 2, alternative="greater").n_extreme == 2
    assert stats.permutation_test(s, 2, alternative="less").n_extreme == 6
    two = stats.permutation_test(s, 2, alternative="two-sided")
    # the observed partition and its swapped tie, and their mirror images
    assert two.n_extreme == brute_extreme(s, 2, "two-sided")[0] == 4


def test_count_greater_matches_enumeration_at_arbitrary_thresholds():
    rng = np.random.default_rng(3)
    s = rng.normal(size=13)
    sums = brute_sums(s, 6)
    ts = np.concatenate([rng.normal(scale=2.0, size=20), [-np.inf, np.inf, sums.min() - 1]])
    got = stats.exact_count_greater(s, 6, ts)
    want = [(sums > t).sum() for t in ts]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("m", [2, 3, 4, 5, 7, 8])
def test_shards_add_up(m):
    rng = np.random.default_rng(m)
    for s, n_x in [(rng.normal(size=20), 10), (rng.integers(0, 5, 19).astype(float), 7)]:
        for alt in ALTS:
            ts = stats.extreme_thresholds(s, n_x, alt)
            whole = stats.exact_count_greater(s, n_x, ts)
            parts = [stats.exact_count_greater(s, n_x, ts, shard=(i, m)) for i in range(m)]
            np.testing.assert_array_equal(np.sum(parts, axis=0), whole)
            assert sum(int(p.sum()) > 0 for p in parts) >= min(m, 2)  # the work is split
    assert stats.exact_count_greater(s, n_x, ts, shard=(0, 1)).tolist() == whole.tolist()


def test_exact_threads_agree():
    rng = np.random.default_rng(11)
    s = rng.normal(size=30)
    ts = stats.extreme_thresholds(s, 15, "two-sided")
    one = stats.exact_count_greater(s, 15, ts, threads=1)
    two = stats.exact_count_greater(s, 15, ts, threads=2)
    np.testing.assert_array_equal(one, two)
    assert one[0] < one[1] <= math.comb(30, 15)


def test_default_threads_follow_omp_num_threads(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert stats._n_threads(None) == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert stats._n_threads(None) >= 1
    assert stats._n_threads(3) == 3
    with pytest.raises(ParameterError, match="threads"):
        stats._n_threads(0)


def test_exact_25_plus_25_matches_polynomial_count():
    rng = np.random.default_rng(2017)
    values = rng.integers(0, 10, size=50).tolist()
    s = np.array(values, dtype=float)
    res = stats.permutation_test(s, 25)  # "auto" must choose the exact test here
    assert res.method == "exact" and res.n_partitions == math.comb(50, 25)
    obs = sum(values[:25])
    assert res.n_extreme == dp_count_greater(values, 25, obs - 0.5)  # integer sums >= obs
    assert res.p_value == res.n_extreme / math.comb(50, 25)
    strict = stats.permutation_test(s, 25, p_convention="caliskan")
    assert strict.n_extreme == dp_count_greater(values, 25, obs)
    # two-sided by the n_x = n_y mirror shortcut equals both tails counted separately
    two = stats.permutation_test(s, 25, alternative="two-sided")
    d = abs(obs - sum(values) / 2)
    upper = dp_count_greater(values, 25, sum(values) / 2 + d - 0.5)
    lower = math.comb(50, 25) - dp_count_greater(values, 25, sum(values) / 2 - d + 0.5)
    assert two.n_extreme == upper + lower


def test_subset_sum_builders_agree():
    rng = np.random.default_rng(8)
    w = rng.integers(0, 50, size=40).astype(float)  # integer sums: exact in any order
    merged = stats._merged_subset_sums(w, 3)
    split = stats._split_subset_sums(w, 3)
    for k in range(4):
        assert merged[k].size == split[k].size == math.comb(40, k)
        np.testing.assert_array_equal(merged[k], split[k])
        np.testing.assert_array_equal(
            split[k], np.sort([sum(c) for c in itertools.combinations(w.tolist(), k)])
        )


@pytest.mark.parametrize("n_items,n_x", [(300, 2), (301, 299), (90, 3)])
def test_exact_many_items_small_group(n_items, n_x):
    rng = np.random.default_rng(n_items)
    s = rng.normal(size=n_items)
    small = min(n_x, n_items - n_x)
    sub = s[:small] if n_x == small else s[n_x:]  # count via the smaller group
    sums = brute_sums(s, small)
    obs = math.fsum(sub)
    tol = 1e-12 * np.abs(s).sum() + np.finfo(float).tiny
    res = stats.permutation_test(s, n_x, alternative="greater", p_convention="caliskan")
    want = (sums > obs + tol).sum() if n_x == small else (sums < obs - tol).sum()
    ps = stats.permutation_test(s, n_x, alternative="greater")
    assert ps.n_extreme == ((sums >= obs - tol).sum() if n_x == small else (sums <= obs + tol).sum())
    assert res.method == "exact" and res.n_partitions == math.comb(n_items, n_x)
    assert res.n_extreme == want


def test_feasibility_and_sizes():
    assert stats.n_partitions(50, 25) == 126410606437752
    assert stats.exact_feasible(50, 25)
    assert stats.exact_feasible(200, 2)
    assert stats.exact_feasible(52, 26)
    assert not stats.exact_feasible(54, 27)
    assert not stats.exact_feasible(60, 30)
    # a shard of m works on N - ceil(log2 m) items: 4 shards of 27+27 are 52-item counts
    assert stats.exact_feasible(54, 27, shards=4)


# --------------------------------------------------------------------------- sampled


def test_sampled_approaches_exact_and_is_reproducible():
    rng = np.random.default_rng(5)
    s = rng.normal(size=18)  # C(18, 9) = 48,620 > the 20,000 draws: sampled
    for alt in ALTS:
        exact = stats.permutation_test(s, 9, alternative=alt, permutations="exact")
        n = 20_000
        a = stats.permutation_test(s, 9, alternative=alt, permutations=n, seed=42)
        b = stats.permutation_test(s, 9, alternative=alt, permutations=n, seed=42)
        c = stats.permutation_test(s, 9, alternative=alt, permutations=n, seed=43)
        assert a == b
        assert a.method == "sampled" and a.n_partitions == n and a.seed == 42
        assert a.p_value == (a.n_extreme + 1) / (n + 1)
        assert a.n_extreme != c.n_extreme
        se = math.sqrt(exact.p_value * (1 - exact.p_value) / n)
        assert abs(a.n_extreme / n - exact.p_value) < 4 * se
        assert abs(c.n_extreme / n - exact.p_value) < 4 * se


def test_sampled_without_seed_records_one():
    s = np.arange(12.0)  # C(12, 6) = 924 partitions > 500 draws
    res = stats.permutation_test(s, 6, permutations=500)
    assert isinstance(res.seed, int) and res.seed >= 0
    again = stats.permutation_test(s, 6, permutations=500, seed=res.seed)
    assert again.n_extreme == res.n_extreme


def test_sampled_partitions_are_uniform_subsets():
    # every one of the C(6, 3) = 20 subsets is equally likely
    masks = np.concatenate(list(stats.sample_partitions(6, 3, 40_000, seed=7)))
    assert masks.shape == (40_000, 6) and masks.dtype == bool
    assert (masks.sum(axis=1) == 3).all()  # exactly n_x distinct items per partition
    codes = masks @ (1 << np.arange(6))
    subsets = [sum(1 << i for i in c) for c in itertools.combinations(range(6), 3)]
    freq = np.array([(codes == code).sum() for code in subsets])
    assert freq.sum() == 40_000
    assert sps.chisquare(freq).pvalue > 1e-3


@pytest.mark.parametrize("n_x", [2, 10])
def test_floyd_partitions_are_uniform_subsets(n_x):
    # many items, one small group: Floyd's algorithm on the smaller group (Y when n_x = 10)
    assert stats._use_floyd(12, n_x) and not stats._use_floyd(12, 4)
    masks = np.concatenate(list(stats.sample_partitions(12, n_x, 66_000, seed=n_x)))
    assert (masks.sum(axis=1) == n_x).all()
    codes = masks @ (1 << np.arange(12))
    _, freq = np.unique(codes, return_counts=True)
    assert freq.size == math.comb(12, 2)
    assert sps.chisquare(freq).pvalue > 1e-3
    s = np.random.default_rng(n_x).normal(size=12)
    ts = np.array([-0.5, 0.0, 0.7])
    got = stats.sampled_count_greater(s, n_x, ts, 66_000, seed=n_x)
    sums = masks.astype(float) @ s
    tol = 1e-12 * np.abs(s).sum()  # X sums of drawn Y groups are T - sum_Y
    assert all(abs(g - (sums > t).sum()) <= ((abs(sums - t) < tol).sum()) for g, t in zip(got, ts))


def test_sampled_inclusion_frequencies():
    n, n_items, n_x = 50_000, 50, 25
    masks = np.concatenate(list(stats.sample_partitions(n_items, n_x, n, seed=2)))
    assert (masks.sum(axis=1) == n_x).all()
    p = n_x / n_items
    z = (masks.sum(axis=0) - n * p) / math.sqrt(n * p * (1 - p))
    assert sps.chi2.sf((z**2).sum(), df=n_items - 1) > 1e-3
    assert not (masks[1:] == masks[:-1]).all(axis=1).any()  # partitions do not repeat in a row


def test_sampled_counts_use_the_documented_stream():
    rng = np.random.default_rng(9)
    s = rng.normal(size=12)
    n = 3 * stats.SAMPLE_CHUNK + 17  # several chunks, the last one partial
    ts = np.array([0.0, 0.5, -1.0])
    got = stats.sampled_count_greater(s, 4, ts, n, seed=123, threads=2)
    one = stats.sampled_count_greater(s, 4, ts, n, seed=123, threads=1)
    masks = np.concatenate(list(stats.sample_partitions(12, 4, n, seed=123)))
    sums = masks.astype(float) @ s
    np.testing.assert_array_equal(got, one)
    np.testing.assert_array_equal(got, [(sums > t).sum() for t in ts])
    first = next(stats.sample_partitions(12, 4, 10, seed=123))
    gen = np.random.Generator(np.random.PCG64(123))  # chunk 0 is Generator(PCG64(seed))
    need = np.full(10, 4)
    for j in range(12):
        take = gen.integers(0, 12 - j, size=10, dtype=np.int16) < need
        need -= take
        np.testing.assert_array_equal(first[:, j], take)


def test_auto_samples_when_exact_is_too_large():
    s = np.random.default_rng(1).normal(size=60)
    res = stats.permutation_test(s, 30, seed=0)
    assert res.method == "sampled" and res.n_partitions == stats.DEFAULT_PERMUTATIONS
    assert 0 < res.p_value <= 1


# --------------------------------------------------------------------------- properties

small_scores = st.lists(st.integers(-8, 8), min_size=2, max_size=10).map(
    lambda v: np.array(v, dtype=float) / 4
)


@settings(max_examples=60, deadline=None)
@given(small_scores, st.data())
def test_property_negation_and_tails(s, data):
    n_x = data.draw(st.integers(1, s.size - 1))
    res = {a: stats.permutation_test(s, n_x, alternative=a, p_convention="caliskan") for a in ALTS}
    neg = {a: stats.permutation_test(-s, n_x, alternative=a, p_convention="caliskan") for a in ALTS}
    ps = {a: stats.permutation_test(s, n_x, alternative=a) for a in ALTS}
    assert ps["two-sided"].n_extreme == res["two-sided"].n_extreme
    assert ps["greater"].p_value > 0 and ps["less"].p_value > 0
    assert res["greater"].n_extreme == neg["less"].n_extreme
    assert res["less"].n_extreme == neg["greater"].n_extreme
    assert res["two-sided"].n_extreme == neg["two-sided"].n_extreme
    sums = brute_sums(s, n_x)
    obs = float(s[:n_x].sum())
    ties = int((sums == obs).sum())  # quarter-integers: sums are exact
    total = res["greater"].n_partitions
    assert ties >= 1
    assert res["greater"].n_extreme + res["less"].n_extreme + ties == total
    assert ps["greater"].n_extreme == res["greater"].n_extreme + ties
    assert ps["less"].n_extreme == res["less"].n_extreme + ties
    two = res["two-sided"]
    assert two.n_extreme >= 1 and two.p_value >= 1 / total
    if obs >= n_x * s.sum() / s.size:
        assert two.n_extreme >= res["greater"].n_extreme + ties
    else:
        assert two.n_extreme >= res["less"].n_extreme + ties


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_subnormal=False), min_size=3, max_size=11), st.data())
def test_property_scale_invariance_and_enumeration(values, data):
    s = np.array(values)
    n_x = data.draw(st.integers(1, s.size - 1))
    base = stats.permutation_test(s, n_x, alternative="two-sided")
    scaled = stats.permutation_test(s * 2.0, n_x, alternative="two-sided")
    assert scaled.n_extreme == base.n_extreme
    k, _ = brute_extreme(s, n_x, "two-sided")
    assert base.n_extreme == k


# --------------------------------------------------------------------------- errors


def test_errors_name_the_culprit():
    s = np.arange(6.0)
    with pytest.raises(ParameterError, match="n_x=0"):
        stats.permutation_test(s, 0)
    with pytest.raises(ParameterError, match="n_x=6"):
        stats.permutation_test(s, 6)
    with pytest.raises(ParameterError, match="n_x"):
        stats.permutation_test(s, 2.5)
    with pytest.raises(DataError, match="at least 2"):
        stats.permutation_test([], 1)
    with pytest.raises(DataError, match="index 2"):
        stats.permutation_test([1.0, 2.0, np.nan, 4.0], 2)
    with pytest.raises(DataError, match="non-finite"):
        stats.exact_count_greater([1.0, np.inf, 0.0], 1, 0.0)
    with pytest.raises(DataError, match="1-D"):
        stats.permutation_test(np.ones((3, 2)), 1)
    with pytest.raises(DataError, match="numbers"):
        stats.permutation_test(["a", "b"], 1)
    for bad in (0, -5):
        with pytest.raises(ParameterError, match="permutations"):
            stats.permutation_test(s, 3, permutations=bad)
    with pytest.raises(ParameterError, match="permutations"):
        stats.permutation_test(s, 3, permutations="many")
    with pytest.raises(ParameterError, match="alternative"):
        stats.permutation_test(s, 3, alternative="bigger")
    with pytest.raises(ParameterError, match="seed"):
        stats.permutation_test(s, 3, permutations=10, seed=-1)
    with pytest.raises(ParameterError, match=r"--permutations 100000"):
        stats.permutation_test(np.zeros(60), 30, permutations="exact")
    with pytest.raises(ParameterError, match="too large"):
        stats.exact_count_greater(np.zeros(60), 30, 0.0)
    with pytest.raises(ParameterError, match="shard"):
        stats.exact_count_greater(s, 3, 0.0, shard=(3, 3))
    with pytest.raises(ParameterError, match="shard"):
        stats.exact_count_greater(s, 3, 0.0, shard=5)
    with pytest.raises(ParameterError, match="thresholds"):
        stats.exact_count_greater(s, 3, [np.nan])
    with pytest.raises(ParameterError, match="^n: must be >= 1, got 0$"):
        stats.sampled_count_greater(s, 3, 0.0, 0, seed=1)
    with pytest.raises(ParameterError, match="counts_greater"):
        stats.n_extreme([1], 10, "two-sided")


# --------------------------------------------------------------------------- bootstrap, docs


def test_bootstrap_indices():
    a = stats.bootstrap_indices([3, 5], 1000, seed=4)
    b = stats.bootstrap_indices([3, 5], 1000, seed=4)
    assert [x.shape for x in a] == [(1000, 3), (1000, 5)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert a[0].min() == 0 and a[0].max() == 2 and a[1].max() == 4
    counts = np.bincount(a[1].ravel(), minlength=5)
    assert sps.chisquare(counts).pvalue > 1e-3
    with pytest.raises(ParameterError, match="group size 0"):
        stats.bootstrap_indices([3, 0], 10, seed=1)
    with pytest.raises(ParameterError, match="n_resamples"):
        stats.bootstrap_indices([3], 0, seed=1)


def test_docstring_examples():
    assert doctest.testmod(stats, raise_on_error=False).failed == 0


def test_task_streams_are_seedsequence_children():
    """stats.stream(seed, name) is child STREAMS.index(name) of SeedSequence(seed); children
    share no draws; stream_seeds is prefix-stable."""
    from audit.stats import STREAMS, stream, stream_seeds

    kids = np.random.SeedSequence(42).spawn(len(STREAMS))
    draws = []
    for i, name in enumerate(STREAMS):
        s = stream(42, name)
        assert s.spawn_key == (i,) and (s.generate_state(4) == kids[i].generate_state(4)).all()
        draws.append(np.random.Generator(np.random.PCG64(s)).integers(0, 2**63, 500))
    assert len(np.unique(np.concatenate(draws))) == 500 * len(STREAMS)
    assert stream_seeds(42, "classifier", 5)[:2] == stream_seeds(42, "classifier", 2)
    with pytest.raises(ParameterError, match="unknown random stream 'boot'"):
        stream(42, "boot")
    with pytest.raises(ParameterError, match="seed"):
        stream(-1, "bootstrap")


# --------------------------------------------------------------------------- p-value conventions


def _scipy_sum_x(x, y, axis=-1):
    return np.sum(x, axis=axis)


@pytest.mark.parametrize("kind", ["float", "int"])
@pytest.mark.parametrize("alternative", ALTS)
def test_exact_equals_scipy_permutation_test(kind, alternative):
    """scipy.stats.permutation_test counts the observed arrangement, as the default
    (phipson_smyth) does: identical exact p-values on identical inputs (ties included)."""
    rng = np.random.default_rng(11)
    s = rng.normal(size=15) if kind == "float" else rng.integers(-3, 4, size=15).astype(float)
    n_x = 7
    ours = stats.permutation_test(s, n_x, alternative=alternative, permutations="exact")
    total = math.comb(15, 7)
    if alternative == "two-sided":  # ours: |S - E| >= |obs - E|, i.e. scipy's "greater" on |S - E|
        mean = n_x * s.sum() / s.size
        ref = sps.permutation_test((s[:n_x], s[n_x:]), lambda x, y, axis: np.abs(np.sum(x, axis=axis) - mean),
                                   permutation_type="independent", vectorized=True, n_resamples=10**9,
                                   alternative="greater")
    else:
        ref = sps.permutation_test((s[:n_x], s[n_x:]), _scipy_sum_x, permutation_type="independent",
                                   vectorized=True, n_resamples=10**9, alternative=alternative)
    assert ref.null_distribution.size == total  # scipy enumerated every partition
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    assert ours.p_value >= ours.p_min >= 1 / total > 0


@pytest.mark.parametrize("alternative", ALTS)
def test_sampled_agrees_with_scipy_permutation_test(alternative):
    """Sampled: both are (k + 1) / (n + 1) estimates of the same exact p-value."""
    rng = np.random.default_rng(12)
    s = rng.normal(size=24) + np.r_[np.full(12, 0.3), np.zeros(12)]
    n, mean = 20_000, 12 * s.sum() / 24
    ours = stats.permutation_test(s, 12, alternative=alternative, permutations=n, seed=3)
    stat = (lambda x, y, axis: np.abs(np.sum(x, axis=axis) - mean)) if alternative == "two-sided" else _scipy_sum_x
    ref = sps.permutation_test((s[:12], s[12:]), stat, permutation_type="independent", vectorized=True,
                               n_resamples=n, alternative="greater" if alternative == "two-sided" else alternative,
                               random_state=np.random.default_rng(4))
    exact = stats.permutation_test(s, 12, alternative=alternative, permutations="exact").p_value
    se = math.sqrt(exact * (1 - exact) / n)
    assert ours.method == "sampled" and ours.p_value == (ours.n_extreme + 1) / (n + 1)
    assert abs(ours.p_value - ref.pvalue) < 6 * se + 2 / n
    assert ours.p_min == 1 / (n + 1)


@pytest.mark.parametrize("alternative", ALTS)
def test_label_swap_equals_scipy_paired_permutation_test(alternative):
    """audit.compare's paired test runs on stats.label_swap_test: scipy's ``samples``
    permutation type (sign flips of the differences), exact, gives the same p-value."""
    rng = np.random.default_rng(13)
    a, b = rng.normal(size=11), rng.normal(size=11) + 0.4
    d = b - a

    def t_of(m):
        return np.where(m, -d, d).mean(axis=1)

    ours = stats.label_swap_test(11, t_of, float(d.mean()), alternative=alternative, exact=True)
    ref = sps.permutation_test((a, b), lambda x, y, axis: np.mean(y - x, axis=axis), permutation_type="samples",
                               vectorized=True, n_resamples=10**9, alternative=alternative)
    assert ours.n_partitions == 2**11 and ours.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    assert ours.p_min == (2 if alternative == "two-sided" else 1) / 2**11
    # compare.py's paired test gives the same number
    from audit.compare import paired_compare

    res = paired_compare(a, b, lambda v: v.mean(axis=1), family="mean", n_bootstrap=0, alternative=alternative,
                         seed=0)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-12) and res.p_min == ours.p_min
    assert res.p_convention == "phipson_smyth"


def test_p_values_are_never_zero_by_default():
    s = np.arange(16.0)[::-1]  # X holds the 8 largest: the most extreme partition
    total = math.comb(16, 8)
    for alt, want in (("greater", 1), ("two-sided", 2)):
        res = stats.permutation_test(s, 8, alternative=alt)
        assert res.n_extreme == want and res.p_value == want / total == res.p_min
    strict = stats.permutation_test(s, 8, p_convention="caliskan")
    assert strict.p_value == 0.0 and strict.p_min == 0.0
    shard = stats.sharded_exact_p_value(s, 8, "greater", 3)
    assert shard["p_value"] == 1 / total and shard["p_convention"] == "phipson_smyth" and shard["p_min"] == 1 / total
    assert stats.sharded_exact_p_value(s, 8, "greater", 3, p_convention="caliskan")["p_value"] == 0.0


def test_more_permutations_than_partitions_runs_the_exact_test_at_once():
    import time

    s = np.random.default_rng(14).normal(size=16)
    t0 = time.perf_counter()
    res = stats.permutation_test(s, 8, permutations=10**14, seed=0)  # 8+8: 12,870 partitions
    assert time.perf_counter() - t0 < 5
    exact = stats.permutation_test(s, 8, permutations="exact")
    assert res.method == "exact" and res.n_partitions == 12_870 and res.p_value == exact.p_value
    assert res.note == "permutations=100,000,000,000,000 >= the 12,870 distinct partitions of 8+8 items: " \
                       "exact test run instead"
    assert stats.resolve_permutations(12_869, 16, 8) == ("sampled", 12_869, None)
    assert stats.resolve_permutations(12_870, 16, 8)[:2] == ("exact", 12_870)


def test_procedures_that_need_the_integer_seed_refuse_alike():
    """Where a procedure needs the seed's integer (a task's streams, the corpus builder, sampled
    generation, BBQ's bootstrap, where ``None`` draws one), :func:`audit.stats.check_int_seed`
    refuses with one wording
    (before: four hand-written checks, three wordings, and ``numpy`` integers of any kind)."""
    from audit.datasets import corpus_from_tests

    big = 2**40
    assert stats.check_int_seed(big) == big and stats.check_int_seed(np.int64(3)) == 3
    assert stats.check_int_seed(None, allow_none=True) is None
    for bad, why in ((-1, "must be >= 0, got -1"), (1.5, "expected an integer, got 1.5"),
                     (True, "expected an integer, got True"), ("1", "expected an integer, got '1'"),
                     (None, "expected an integer, got None"),
                     (np.random.SeedSequence(1), "expected an integer, got SeedSequence(entropy=1)")):
        with pytest.raises(ParameterError, match=rf"^seed: {re.escape(why)}$"):
            stats.stream(bad, "permutation")
        with pytest.raises(ParameterError, match=rf"^seed: {re.escape(why)}$"):
            corpus_from_tests(["fr"], seed=bad)
    with pytest.raises(ParameterError, match=r"^seed: expected an integer or None, got SeedSequence\(entropy=1\)$"):
        stats.check_int_seed(np.random.SeedSequence(1), allow_none=True)
    assert stats.stream(big, "permutation").entropy == big


def test_one_seed_rule_for_every_random_procedure():
    """stats and the WEFE-family metrics accept the same seeds (before: any int >= 0 in
    stats, only < 2**32 in RNSB and Cramér's V)."""
    from audit.metrics import rnsb

    assert stats.check_seed(2**40) == 2**40
    rng = np.random.default_rng(3)
    X, Y, A, B = (rng.normal(size=(6, 4)) for _ in range(4))
    big = rnsb([X, Y], A, B, seed=2**40, n_iterations=2)
    assert big.value == rnsb([X, Y], A, B, seed=2**40, n_iterations=2).value
    for bad in (-1, 1.5, True, "1"):
        why = r"must be >= 0, got -1" if bad == -1 else r"expected an integer or None, got .*"
        with pytest.raises(ParameterError, match=rf"^seed: {why}$"):
            rnsb([X, Y], A, B, seed=bad)
        with pytest.raises(ParameterError, match=rf"^seed: {why}$"):
            stats.permutation_test(np.arange(6.0), 3, permutations=5, seed=bad)
