"""Paired comparison of two models (audit.compare): label-swap p-values against brute force,
McNemar, paired bootstrap intervals against a naive loop, per-item tables, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from audit.compare import (
    compare_crows_pairs,
    compare_effect_size,
    compare_item_means,
    compare_lpbs,
    compare_proportions,
    compare_weat,
    compare_weat_items,
    paired_compare,
)
from audit.errors import DataError, ParameterError
from audit.metrics import gweat, same, weat, weat_effect_size, weat_scores

pytestmark = pytest.mark.unit


def _d(sx, sy, ddof=1):
    allv = np.concatenate([sx, sy])
    return (np.mean(sx) - np.mean(sy)) / np.std(allv, ddof=ddof)


def _z(v):
    return (v - v.mean()) / v.std()


def _swap_p_brute_force(a, b, stat, alternative="two-sided"):
    """Every subset of items swapped, written out with itertools."""
    obs = stat(b) - stat(a)
    n = len(a)
    k = total = 0
    for mask in itertools.product([False, True], repeat=n):
        m = np.array(mask)
        xa, xb = np.where(m, b, a), np.where(m, a, b)
        t = stat(xb) - stat(xa)
        tol = 1e-10 * max(1.0, abs(obs))
        hit = abs(t) >= abs(obs) - tol if alternative == "two-sided" else t >= obs - tol
        k += bool(hit)
        total += 1
    return k / total


def _vectors(seed, n=6, dim=12, shift=0.6):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, dim)) + 1.0
    B = rng.normal(size=(n, dim)) - 1.0
    X = rng.normal(size=(n, dim)) + shift * A.mean(0)
    Y = rng.normal(size=(n, dim)) + shift * B.mean(0)
    return X, Y, A, B


def test_effect_size_label_swap_is_exact_enumeration():
    rng = np.random.default_rng(1)
    sxa, sya = rng.normal(0.3, 1, 5), rng.normal(0, 1, 4)
    sxb, syb = sxa + rng.normal(0.4, 0.3, 5), sya + rng.normal(0, 0.3, 4)
    res = compare_effect_size(sxa, sya, sxb, syb, seed=0, n_bootstrap=0)
    a, b = _z(np.r_[sxa, sya]), _z(np.r_[sxb, syb])
    ref = _swap_p_brute_force(a, b, lambda v: _d(v[:5], v[5:]))
    assert res.p_method == "exact label swap" and res.n_permutations == 2**9
    assert res.p_value == pytest.approx(ref, abs=1e-15)
    assert res.value_a == pytest.approx(_d(sxa, sya)) and res.value_b == pytest.approx(_d(sxb, syb))
    assert res.delta == pytest.approx(_d(sxb, syb) - _d(sxa, sya))
    one = compare_effect_size(sxa, sya, sxb, syb, seed=0, n_bootstrap=0, alternative="greater")
    assert one.p_value == pytest.approx(
        _swap_p_brute_force(a, b, lambda v: _d(v[:5], v[5:]), alternative="greater"), abs=1e-15)


def test_no_difference_and_scale_only_difference():
    X, Y, A, B = _vectors(2)
    same_model = compare_weat((X, Y, A, B), (X, Y, A, B), seed=3)
    assert same_model.delta == 0.0 and same_model.ci == [0.0, 0.0] and same_model.p_value == 1.0
    # model B's scores are an affine image of A's: same d, exchangeable standardised scores
    sx, sy = weat_scores(X, A, B), weat_scores(Y, A, B)
    res = compare_effect_size(sx, sy, 3 * sx + 1, 3 * sy + 1, seed=3)
    assert res.delta == pytest.approx(0.0, abs=1e-12) and res.p_value == pytest.approx(1.0)


def test_paired_bootstrap_interval_against_naive_loop():
    """The CI resamples the same words for both models (child 2 of SeedSequence(seed),
    X then Y), and recomputes both effect sizes."""
    X, Y, A, B = _vectors(4, n=10)
    rng = np.random.default_rng(5)
    Xb, Yb = X + 0.3 * rng.normal(size=X.shape) + 0.4 * A.mean(0), Y + 0.3 * rng.normal(size=Y.shape)
    res = compare_weat((X, Y, A, B), (Xb, Yb, A, B), seed=11, n_bootstrap=200)
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(11).spawn(4)[2]))
    ix, iy = gen.integers(0, 10, size=(200, 10)), gen.integers(0, 10, size=(200, 10))
    deltas = []
    for r in range(200):
        da = weat_effect_size(weat_scores(X[ix[r]], A, B), weat_scores(Y[iy[r]], A, B))
        db = weat_effect_size(weat_scores(Xb[ix[r]], A, B), weat_scores(Yb[iy[r]], A, B))
        deltas.append(db - da)
    np.testing.assert_allclose(res.ci, np.quantile(deltas, [0.025, 0.975]), rtol=1e-10)
    assert res.ci_method.startswith("targets:") and res.random_streams == {"compare_bootstrap": 2,
                                                                            "compare_permutation": 3}
    assert res.p_method == "sampled label swap" and res.n_permutations == 9999  # DEFAULT_PERMUTATIONS
    again = compare_weat((X, Y, A, B), (Xb, Yb, A, B), seed=11, n_bootstrap=200)
    assert again == res
    assert res.ci[0] < res.delta < res.ci[1]


def test_targets_attributes_interval_resamples_all_four_sets_jointly():
    X, Y, A, B = _vectors(6, n=5)
    rng = np.random.default_rng(7)
    vb = [v + 0.2 * rng.normal(size=v.shape) for v in (X, Y, A, B)]
    res = compare_weat((X, Y, A, B), vb, seed=2, n_bootstrap=60, ci_method="targets_attributes")
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence(2, spawn_key=(2,))))
    ix, iy, ia, ib = (gen.integers(0, 5, size=(60, 5)) for _ in range(4))
    deltas = [
        weat(vb[0][ix[r]], vb[1][iy[r]], vb[2][ia[r]], vb[3][ib[r]], n_bootstrap=0, permutations=2).value
        - weat(X[ix[r]], Y[iy[r]], A[ia[r]], B[ib[r]], n_bootstrap=0, permutations=2).value
        for r in range(60)
    ]
    np.testing.assert_allclose(res.ci, np.quantile(deltas, [0.025, 0.975]), rtol=1e-10)
    assert res.ci_method.startswith("targets_attributes:")
    # the test does not depend on the interval
    assert res.p_value == compare_weat((X, Y, A, B), vb, seed=2, n_bootstrap=60).p_value


def test_per_item_tables_match_the_array_functions():
    X, Y, A, B = _vectors(8, n=9)
    rng = np.random.default_rng(9)
    Xb = X + 0.5 * rng.normal(size=X.shape)
    out_a = weat(X, Y, A, B, n_bootstrap=0)
    out_b = weat(Xb, Y, A, B, n_bootstrap=0)
    words = [f"x{i}" for i in range(9)] + [f"y{i}" for i in range(9)]
    ia, ib = out_a.items.assign(word=words), out_b.items.assign(word=words)
    via_items = compare_weat_items(ia, ib.iloc[::-1], seed=5)  # order of B's table does not matter
    direct = compare_weat((X, Y, A, B), (Xb, Y, A, B), seed=5, swap="targets")
    assert via_items.p_value == direct.p_value and via_items.ci == pytest.approx(direct.ci)
    assert via_items.delta == pytest.approx(out_b.value - out_a.value)
    with pytest.raises(DataError, match=r"1 item\(s\) measured on one model only, first \('X', 'x0'\)"):
        compare_weat_items(ia, ib.iloc[1:], seed=5)
    with pytest.raises(DataError, match="lacks column.*score"):
        compare_weat_items(ia, ib.drop(columns="score"))


def test_word_swap_is_exact_enumeration_of_mixed_models():
    """swap="words": every word's two vectors are exchangeable; the p-value is the share of
    the 2**8 mixed models (recomputed here with weat() on the mixed vectors) at least as far
    from 0 as the observed change."""
    rng = np.random.default_rng(21)
    base = [rng.normal(size=(2, 6)) + s * np.eye(6)[0] for s in (1.0, -1.0, 2.0, -2.0)]
    va = [v + 0.4 * rng.normal(size=v.shape) for v in base]
    vb = [v + 0.4 * rng.normal(size=v.shape) for v in base]
    vb[0] = vb[0] + 0.5 * np.eye(6)[0]
    res = compare_weat(va, vb, swap="words", n_bootstrap=0, seed=0)
    assert res.p_method == "exact label swap" and res.n_permutations == 2**8
    assert res.null_hypothesis.startswith("every word's")

    def d(sets):
        return weat(*sets, n_bootstrap=0, permutations=2).value

    obs = d(vb) - d(va)
    k = 0
    for mask in itertools.product([False, True], repeat=8):
        m = np.array(mask).reshape(4, 2)
        ma = [np.where(m[i][:, None], vb[i], va[i]) for i in range(4)]
        mb = [np.where(m[i][:, None], va[i], vb[i]) for i in range(4)]
        k += abs(d(mb) - d(ma)) >= abs(obs) - 1e-10 * max(1, abs(obs))
    assert res.p_value == pytest.approx(k / 256, abs=1e-15)
    assert res.delta == pytest.approx(obs)
    # auto: the same space (a word's vectors agree) -> words; unrelated spaces -> targets
    assert compare_weat(va, vb, n_bootstrap=0, seed=0).p_value == res.p_value
    rot = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    other = compare_weat(va, [v @ rot for v in vb], n_bootstrap=0, seed=0)
    assert other.null_hypothesis.startswith("each X/Y item") and other.delta == pytest.approx(obs)


def test_proportions_are_mcnemar_and_match_the_exact_label_swap():
    a = np.array([1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 0])
    b = np.array([1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0])
    res = compare_proportions(a, b, seed=0)
    n01, n10 = 4, 1  # positions 2, 3, 8, 9 go 0 -> 1; position 6 goes 1 -> 0
    assert res.p_method == "exact McNemar" and res.n_permutations == n01 + n10
    assert res.p_value == pytest.approx(binomtest(n01, n01 + n10, 0.5).pvalue)
    swap = paired_compare(a, b, lambda v: 100 * v.mean(axis=1), seed=0, n_bootstrap=0)
    assert swap.p_method == "exact label swap" and swap.p_value == pytest.approx(res.p_value, abs=1e-12)
    assert res.delta == pytest.approx(100 * (b.mean() - a.mean()))
    assert compare_proportions(a, a, seed=0).p_value == 1.0
    greater = compare_proportions(a, b, seed=0, alternative="greater")
    assert greater.p_value == pytest.approx(binomtest(4, 5, 0.5, alternative="greater").pvalue)
    with pytest.raises(DataError, match="outcome_b: expected 0/1 outcomes per item, item 1"):
        compare_proportions(a, np.r_[1, 2, b[2:]])


def test_crows_pairs_tables():
    ids = np.arange(40)
    rng = np.random.default_rng(3)
    sa = rng.integers(0, 2, 40)
    sb = np.where(rng.random(40) < 0.3, 1, sa)
    ta = pd.DataFrame({"pair_id": ids, "score": sa})
    tb = pd.DataFrame({"pair_id": ids[::-1], "score": sb[::-1]})
    res = compare_crows_pairs(ta, tb, seed=1)
    assert res.value_a == pytest.approx(100 * sa.mean()) and res.value_b == pytest.approx(100 * sb.mean())
    n01 = int(((sa == 0) & (sb == 1)).sum())
    assert res.p_value == pytest.approx(binomtest(n01, n01, 0.5).pvalue)
    assert res.ci[0] <= res.delta <= res.ci[1]


def test_lpbs_tables_use_ddof_0():
    rng = np.random.default_rng(4)
    items = pd.DataFrame({"set": ["A"] * 5 + ["B"] * 6, "attribute": [f"w{i}" for i in range(11)],
                          "score": rng.normal(size=11) + np.r_[np.ones(5), np.zeros(6)]})
    other = items.assign(score=items["score"] + rng.normal(0, 0.2, 11))
    res = compare_lpbs(items, other, seed=0)
    sa, sb = items["score"].to_numpy(), other["score"].to_numpy()
    assert res.value_a == pytest.approx(_d(sa[:5], sa[5:], ddof=0))
    assert res.value_b == pytest.approx(_d(sb[:5], sb[5:], ddof=0))
    ref = _swap_p_brute_force(_z(sa), _z(sb), lambda v: _d(v[:5], v[5:], ddof=0))
    assert res.p_value == pytest.approx(ref, abs=1e-15)


def test_item_means_same_and_gweat():
    rng = np.random.default_rng(6)
    groups = [rng.normal(size=(4, 8)) + 1, rng.normal(size=(4, 8)) - 1]
    words = [rng.normal(size=(3, 8)), rng.normal(size=(4, 8))]
    words_b = [w + 0.3 * groups[0].mean(0) for w in words]
    a, b = same(words, groups), same(words_b, groups)
    res = compare_item_means(a.items, b.items, seed=0)
    assert res.delta == pytest.approx(b.value - a.value)
    ba, bb = a.items["bias"].to_numpy(), b.items["bias"].to_numpy()
    assert res.p_value == pytest.approx(_swap_p_brute_force(ba, bb, np.mean), abs=1e-15)
    assert res.strata == [3, 4]
    g_a = gweat(words, groups)
    g_b = gweat(words_b, groups)
    res = compare_item_means(g_a.items, g_b.items, value="score", statistic="sum_of_group_means", seed=0)
    assert res.value_a == pytest.approx(g_a.value) and res.value_b == pytest.approx(g_b.value)


def test_errors():
    X, Y, A, B = _vectors(0)
    with pytest.raises(DataError, match="same words: set X has 6 words in model A and 5 in model B"):
        compare_weat((X, Y, A, B), (X[:5], Y, A, B))
    with pytest.raises(DataError, match="swap='words' needs both models' vectors in one space"):
        compare_weat((X, Y, A, B), (X[:, :5], Y[:, :5], A[:, :5], B[:, :5]), swap="words")
    with pytest.raises(ParameterError, match="swap must be"):
        compare_weat((X, Y, A, B), (X, Y, A, B), swap="all")
    with pytest.raises(ParameterError, match="ci_method"):
        compare_weat((X, Y, A, B), (X, Y, A, B), ci_method="all")
    with pytest.raises(ParameterError, match="alternative"):
        compare_effect_size([1.0, 2.0], [0.0, 1.0], [1.0, 2.0], [0.0, 1.0], alternative="up")
    with pytest.raises(ParameterError, match="quantity"):
        compare_effect_size([1.0, 2.0], [0.0, 1.0], [1.0, 2.0], [0.0, 1.0], quantity="ratio")
    with pytest.raises(DataError, match="paired"):
        paired_compare([1.0, 2.0], [1.0], np.mean)
    with pytest.raises(DataError, match="undefined for model B"):
        compare_effect_size([1.0, 2.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(ParameterError, match="seed"):
        compare_effect_size([1.0, 2.0], [0.0, 1.0], [1.0, 2.0], [0.0, 1.0], seed=-1)


def test_permutations_parameter():
    rng = np.random.default_rng(12)
    a = rng.normal(size=30)
    b = a + rng.normal(0.3, 1, 30)
    sampled = paired_compare(a, b, lambda v: v.mean(axis=1), permutations=999, seed=1, n_bootstrap=0)
    assert sampled.p_method == "sampled label swap" and sampled.n_permutations == 999
    assert paired_compare(a, b, lambda v: v.mean(axis=1), permutations=999, seed=1, n_bootstrap=0) == sampled
    exact = paired_compare(a[:18], b[:18], lambda v: v.mean(axis=1), permutations="exact", n_bootstrap=0, seed=0)
    assert exact.p_method == "exact label swap" and exact.n_permutations == 2**18
    ref = _swap_p_brute_force(a[:12], b[:12], np.mean)
    assert paired_compare(a[:12], b[:12], lambda v: v.mean(axis=1), n_bootstrap=0, seed=0).p_value == \
        pytest.approx(ref, abs=1e-15)
    with pytest.raises(ParameterError, match="permutations='exact': 30 items"):
        paired_compare(a, b, lambda v: v.mean(axis=1), permutations="exact")
    with pytest.raises(ParameterError, match="permutations"):
        paired_compare(a, b, lambda v: v.mean(axis=1), permutations=0)
