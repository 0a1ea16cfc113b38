"""WEAT: hand-computed values, sign and ddof conventions, p-value and bootstrap plumbing, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from audit.errors import DataError, ParameterError
from audit.metrics import weat, weat_bootstrap_ci, weat_effect_size, weat_scores
from audit.registry import METRICS, run_metric
from audit.registry import get as get_metric
from audit.result import _jsonable
from audit.stats import bootstrap_indices, permutation_test

pytestmark = pytest.mark.unit

# A = e1, B = e2; x0 = e1 (s = 1), x1 = e1 + e2 (s = 0), y0 = e2 (s = -1)
A2 = np.array([[1.0, 0.0]])
B2 = np.array([[0.0, 1.0]])
X2 = np.array([[1.0, 0.0], [1.0, 1.0]])
Y2 = np.array([[0.0, 1.0]])


def _clear_effect(seed: int = 0, n: int = 8, dim: int = 30, shift: float = 1.0):
    """X near A and Y near B: a large positive WEAT effect."""
    rng = np.random.default_rng(seed)
    a_dir, b_dir = rng.normal(size=dim), rng.normal(size=dim)
    A = a_dir + 0.8 * rng.normal(size=(n, dim))
    B = b_dir + 0.8 * rng.normal(size=(n, dim))
    X = shift * a_dir + rng.normal(size=(n, dim))
    Y = shift * b_dir + rng.normal(size=(n, dim))
    return X, Y, A, B


def test_hand_computed_example():
    np.testing.assert_allclose(weat_scores(X2, A2, B2), [1.0, 0.0])
    np.testing.assert_allclose(weat_scores(Y2, A2, B2), [-1.0])
    out = weat(X2, Y2, A2, B2, n_bootstrap=0)
    assert out.fields["statistic"] == pytest.approx(2.0)
    # mean_x - mean_y = 0.5 + 1 = 1.5; std([1, 0, -1], ddof=1) = 1
    assert out.value == pytest.approx(1.5)
    assert out.fields["effect_size"] == out.value
    # ddof=0: std = sqrt(2/3)
    assert weat(X2, Y2, A2, B2, ddof=0, n_bootstrap=0).value == pytest.approx(1.5 / math.sqrt(2 / 3))
    # exact test over the C(3, 2) = 3 partitions: X-sums 1 (observed), 0, -1 -> only the
    # observed one is at least as extreme: p = 1/3, never 0 (Phipson & Smyth 2010)
    assert out.fields["p_method"] == "exact"
    assert out.fields["n_partitions"] == 3
    assert out.fields["p_value"] == 1 / 3 and out.fields["p_min"] == 1 / 3
    assert out.fields["p_convention"] == "phipson_smyth" and out.fields["p_note"] is None
    # Caliskan's strict count, by name: none greater, p = 0 (WEFE's convention)
    strict = weat(X2, Y2, A2, B2, n_bootstrap=0, p_convention="caliskan")
    assert strict.fields["p_value"] == 0.0 and strict.fields["p_min"] == 0.0
    items = out.items
    assert list(items.columns) == ["set", "index", "score", "mean_cos_a", "mean_cos_b"]
    assert list(items["set"]) == ["X", "X", "Y"] and list(items["index"]) == [0, 1, 0]
    np.testing.assert_allclose(items["mean_cos_a"], [1.0, 1 / math.sqrt(2), 0.0])
    np.testing.assert_allclose(items["mean_cos_b"], [0.0, 1 / math.sqrt(2), 1.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ddof_relation_is_exact(seed):
    X, Y, A, B = _clear_effect(seed, n=7)
    Y = Y[:5]  # unequal sizes are allowed
    e1 = weat(X, Y, A, B, ddof=1, n_bootstrap=0, permutations=10, seed=0).value
    e0 = weat(X, Y, A, B, ddof=0, n_bootstrap=0, permutations=10, seed=0).value
    n = X.shape[0] + Y.shape[0]
    assert e0 == pytest.approx(e1 * math.sqrt(n / (n - 1)), rel=1e-12)


def test_sign_conventions_and_scale_invariance():
    X, Y, A, B = _clear_effect(3)
    kw = dict(n_bootstrap=0, permutations=10, seed=0)
    base = weat(X, Y, A, B, **kw)
    assert base.value > 1.0 and base.fields["statistic"] > 0
    assert weat(X, Y, B, A, **kw).value == pytest.approx(-base.value)
    assert weat(Y, X, A, B, **kw).value == pytest.approx(-base.value)
    scaled = weat(X * np.arange(1, 9)[:, None], Y * 0.01, A * 7.0, B, **kw)
    assert scaled.value == pytest.approx(base.value)
    assert scaled.fields["statistic"] == pytest.approx(base.fields["statistic"])


def test_p_value_plumbing_matches_permutation_test():
    X, Y, A, B = _clear_effect(4, n=10)
    out = weat(X, Y, A, B, n_bootstrap=0, alternative="two-sided")
    scores = out.items["score"].to_numpy()
    ref = permutation_test(scores, 10, alternative="two-sided", permutations="exact")
    assert out.fields["p_method"] == "exact"
    assert out.fields["n_partitions"] == math.comb(20, 10)
    assert out.fields["p_value"] == ref.p_value
    assert out.fields["p_value"] < 1e-3  # clear effect
    # sampled: reproducible with a seed, and the seed is reported
    s1 = weat(X, Y, A, B, n_bootstrap=0, permutations=2000, seed=11)
    s2 = weat(X, Y, A, B, n_bootstrap=0, permutations=2000, seed=11)
    assert s1.fields["p_method"] == "sampled" and s1.fields["n_partitions"] == 2000
    assert s1.fields["p_value"] == s2.fields["p_value"]
    assert s1.fields["seed"] == 11
    # no seed: one is drawn and reported, so the run can be repeated
    s3 = weat(X, Y, A, B, n_bootstrap=50, permutations=500)
    again = weat(X, Y, A, B, n_bootstrap=50, permutations=500, seed=s3.fields["seed"])
    assert again.fields["p_value"] == s3.fields["p_value"] and again.fields["ci"] == s3.fields["ci"]
    # the opposite one-sided alternative is not significant
    assert weat(X, Y, A, B, n_bootstrap=0, alternative="less").fields["p_value"] > 0.5


def test_bootstrap_ci_contains_effect_and_is_reproducible():
    X, Y, A, B = _clear_effect(5, n=10)
    out = weat(X, Y, A, B, n_bootstrap=400, seed=7, permutations=10)
    lo, hi = out.fields["ci"]
    assert lo < out.value < hi
    assert lo > 0  # the effect is clear
    assert out.fields["ci_degenerate"] == 0
    assert weat(X, Y, A, B, n_bootstrap=400, seed=7, permutations=10).fields["ci"] == [lo, hi]
    assert weat(X, Y, A, B, n_bootstrap=400, seed=8, permutations=10).fields["ci"] != [lo, hi]
    narrower = weat(X, Y, A, B, n_bootstrap=400, seed=7, permutations=10, confidence=0.5).fields["ci"]
    assert lo < narrower[0] < narrower[1] < hi
    assert weat(X, Y, A, B, n_bootstrap=0, permutations=10).fields["ci"] is None
    json.dumps(_jsonable(out.fields), allow_nan=False)


@pytest.mark.parametrize("method", ["targets", "targets_attributes"])
def test_bootstrap_matches_naive_recomputation(method):
    """The count-weighted bootstrap equals recomputing WEAT on each resample of the words
    (targets: X and Y resampled, A and B as given; targets_attributes: all four resampled)."""
    X, Y, A, B = _clear_effect(6, n=6)
    X = X[:5]
    n_boot, seed, ddof = 60, 3, 1
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    ux, uy, ua, ub = map(unit, (X, Y, A, B))
    ci, n_deg, es = weat_bootstrap_ci(
        ux @ ua.T, ux @ ub.T, uy @ ua.T, uy @ ub.T, method=method, ddof=ddof, n_bootstrap=n_boot, seed=seed
    )
    if method == "targets":
        ix, iy = bootstrap_indices([5, 6], n_boot, seed)
        ia = ib = np.tile(np.arange(6), (n_boot, 1))
    else:
        ix, iy, ia, ib = bootstrap_indices([5, 6, 6, 6], n_boot, seed)
    naive = []
    for r in range(n_boot):
        sx = weat_scores(X[ix[r]], A[ia[r]], B[ib[r]])
        sy = weat_scores(Y[iy[r]], A[ia[r]], B[ib[r]])
        naive.append(weat_effect_size(sx, sy, ddof=ddof))
    assert n_deg == 0
    np.testing.assert_allclose(es, naive, rtol=1e-10)
    np.testing.assert_allclose(ci, np.quantile(naive, [0.025, 0.975]), rtol=1e-10)


def test_degenerate_resamples_are_dropped_and_counted():
    # s(x0) = 0 = s(y0), s(x1) = 1: resamples with X = (x0, x0) have std 0 (probability 1/4)
    X = np.array([[1.0, 1.0], [1.0, 0.0]])
    Y = np.array([[2.0, 2.0]])
    out = weat(X, Y, A2, B2, n_bootstrap=1000, seed=0)
    assert 150 < out.fields["ci_degenerate"] < 350
    lo, hi = out.fields["ci"]
    assert np.isfinite(lo) and np.isfinite(hi)
    # every resample degenerate: no interval (None), never NaN
    c = np.full((2, 1), 0.5)
    for method in ("targets", "targets_attributes"):
        ci, n_deg, es = weat_bootstrap_ci(c, c, c, c, method=method, n_bootstrap=20, seed=0)
        assert ci is None and n_deg == 20 and es.size == 0


def test_undefined_effect_size_raises():
    X = np.array([[1.0, 1.0], [2.0, 2.0]])
    Y = np.array([[3.0, 3.0]])
    with pytest.raises(DataError, match="same association"):
        weat(X, Y, A2, B2)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(X=np.empty((0, 2))), DataError, "X: the word set is empty"),
        (dict(Y=np.ones((2, 3))), DataError, "Y: vector dimension 3 differs from X"),
        (dict(A=np.array([[1.0, 0.0], [0.0, 0.0]])), DataError, "A: row 1 is a zero vector"),
        (dict(B=np.array([[np.nan, 1.0]])), DataError, "B: row 0 contains NaN"),
        (dict(X=np.array([1.0, 0.0])), ParameterError, "X: expected a 2-D array"),
        (dict(X=[["a", "b"]]), ParameterError, "X: expected a 2-D numeric array"),
        (dict(ddof=2), ParameterError, "ddof"),
        (dict(alternative="bigger"), ParameterError, "alternative"),
        (dict(confidence=1.5), ParameterError, "confidence"),
        (dict(n_bootstrap=-1), ParameterError, "n_bootstrap"),
        (dict(seed=-3), ParameterError, "seed"),
        (dict(ci_method="attributes"), ParameterError, "^ci_method: unknown value 'attributes' .*; known: targets, targets_attributes$"),
    ],
)
def test_errors_name_the_argument(kwargs, exc, match):
    args = dict(X=X2, Y=Y2, A=A2, B=B2)
    params = {k: v for k, v in kwargs.items() if k not in args}
    args.update({k: v for k, v in kwargs.items() if k in args})
    with pytest.raises(exc, match=match):
        weat(args["X"], args["Y"], args["A"], args["B"], **params)


def test_registry_weat():
    X, Y, A, B = _clear_effect(8)
    spec = get_metric("weat")
    assert spec.n_targets == (2, 2) and spec.n_attributes == (2, 2) and "seed" in spec.params
    out = run_metric("weat", [X, Y], [A, B], n_bootstrap=0, permutations=10, seed=1)
    assert out.value == pytest.approx(weat(X, Y, A, B, n_bootstrap=0, permutations=10, seed=1).value)
    with pytest.raises(ParameterError, match="exactly 2 target sets, got 3"):
        run_metric("weat", [X, Y, X], [A, B])
    with pytest.raises(ParameterError, match=r"does not accept parameter\(s\) bogus"):
        run_metric("weat", [X, Y], [A, B], bogus=1)
    with pytest.raises(ParameterError, match=r"unknown metric 'weta' \(did you mean 'weat'\?\); known metrics: weat, seat"):
        get_metric("weta")
    assert set(METRICS) == {
        "weat", "seat", "lpbs", "crows_pairs", "honest", "bbq",
        "same", "gweat", "direct_bias", "rnd", "rnsb", "mac", "ect", "ripa", "cramers_v", "perplexity", "bbq_generate",
    }
    for name, s in METRICS.items():
        assert s.name == name and s.headline and s.reference


def _bootstrap_generator(seed: int) -> np.random.Generator:
    """The documented bootstrap stream of a task, derived here independently of audit.stats:
    child 1 of SeedSequence(seed)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed).spawn(2)[1]))


def test_bootstrap_ci_equals_scipy_percentile_bootstrap():
    """Without degenerate resamples each interval is scipy.stats.bootstrap's percentile interval
    on the same Generator: over (s_X, s_Y) for "targets" (the default), over the four index
    samples for "targets_attributes"."""
    from scipy.stats import bootstrap

    X, Y, A, B = _clear_effect(9, n=9)
    A = A[:7]
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    ux, uy, ua, ub = map(unit, (X, Y, A, B))
    cxa, cxb, cya, cyb = ux @ ua.T, ux @ ub.T, uy @ ua.T, uy @ ub.T

    def d(sx, sy):
        return (sx.mean(-1) - sy.mean(-1)) / np.concatenate([sx, sy], -1).std(-1, ddof=1)

    def stat4(ix, iy, ia, ib, axis=-1):
        sx = cxa[ix[..., :, None], ia[..., None, :]].mean(-1) - cxb[ix[..., :, None], ib[..., None, :]].mean(-1)
        sy = cya[iy[..., :, None], ia[..., None, :]].mean(-1) - cyb[iy[..., :, None], ib[..., None, :]].mean(-1)
        return d(sx, sy)

    out = weat(X, Y, A, B, n_bootstrap=300, seed=5, permutations=10)
    assert out.fields["ci_method"] == "targets"
    s_x, s_y = cxa.mean(1) - cxb.mean(1), cya.mean(1) - cyb.mean(1)
    ref = bootstrap((s_x, s_y), lambda a, b, axis=-1: d(a, b), n_resamples=300, vectorized=True,
                    paired=False, method="percentile", rng=_bootstrap_generator(5))
    np.testing.assert_allclose(out.fields["ci"], [ref.confidence_interval.low, ref.confidence_interval.high],
                               rtol=1e-10)

    both = weat(X, Y, A, B, n_bootstrap=300, seed=5, permutations=10, ci_method="targets_attributes")
    assert both.fields["ci_method"] == "targets_attributes"
    ref = bootstrap(
        [np.arange(9), np.arange(9), np.arange(7), np.arange(9)], stat4,
        n_resamples=300, vectorized=True, paired=False, method="percentile", rng=_bootstrap_generator(5),
    )
    np.testing.assert_allclose(both.fields["ci"], [ref.confidence_interval.low, ref.confidence_interval.high],
                               rtol=1e-10)


def _attribute_driven_effect(seed: int = 6, n: int = 8, dim: int = 40):
    """Targets split along the direction of the *first* word of A (e0) and of B (e1); the
    other attribute words are random. Given A and B every x scores above every y (exact p = 0),
    but a resample of A and B that drops those two words measures the targets against random
    words, and d takes either sign."""
    rng = np.random.default_rng(seed)
    e = np.eye(dim)
    A = np.vstack([e[0], rng.normal(size=(n - 1, dim))])
    B = np.vstack([e[1], rng.normal(size=(n - 1, dim))])
    X = 3.0 * e[0] + 0.5 * rng.normal(size=(n, dim))
    Y = 3.0 * e[1] + 0.5 * rng.normal(size=(n, dim))
    return X, Y, A, B


def test_default_interval_is_coherent_with_the_permutation_test():
    """Issue 15, fix 2: the default interval conditions on the attribute sets, as the exact
    permutation test does. On data whose effect rests on one word of A and one of B, the old
    interval (resampling A and B too) reached down to 0 next to p < 1e-3; the default one does
    not, and the old one stays available by name."""
    X, Y, A, B = _attribute_driven_effect()
    out = weat(X, Y, A, B, seed=0)
    assert out.fields["p_method"] == "exact" and out.fields["p_value"] < 1e-3
    assert out.fields["ci_method"] == "targets"
    lo, hi = out.fields["ci"]
    assert 0 < lo < out.value < hi
    old = weat(X, Y, A, B, seed=0, ci_method="targets_attributes")
    assert old.fields["ci_method"] == "targets_attributes"
    assert old.fields["ci"][0] < 0 < old.fields["ci"][1]
    assert old.value == out.value and old.fields["p_value"] == out.fields["p_value"]
    assert json.loads(json.dumps(_jsonable(out.fields)))["ci_method"] == "targets"


def test_permutation_and_bootstrap_draw_from_independent_streams():
    """Issue 15, fix 3: the sampled permutation test and the bootstrap used to draw from the same
    PCG64(seed) stream (jumped(0) is the identity). Now they use children 0 and 1 of
    SeedSequence(seed), derived here independently of audit.stats."""
    X, Y, A, B = _clear_effect(12, n=9)
    out = weat(X, Y, A, B, seed=21, permutations=3000, n_bootstrap=200)
    scores = out.items["score"].to_numpy()
    children = np.random.SeedSequence(21).spawn(2)
    perm = permutation_test(scores, 9, permutations=3000, seed=np.random.SeedSequence(21, spawn_key=(0,)))
    assert out.fields["p_method"] == "sampled" and out.fields["p_value"] == perm.p_value
    ci, _, _ = weat_bootstrap_ci(
        *(u @ v.T for u in (X / np.linalg.norm(X, axis=1, keepdims=True), Y / np.linalg.norm(Y, axis=1, keepdims=True))
          for v in (A / np.linalg.norm(A, axis=1, keepdims=True), B / np.linalg.norm(B, axis=1, keepdims=True))),
        n_bootstrap=200, seed=np.random.Generator(np.random.PCG64(children[1])),
    )
    assert out.fields["ci"] == ci
    assert out.fields["random_streams"] == {"permutation": 0, "bootstrap": 1}
    # the two streams share no draws, where the old ones were identical
    a = np.random.Generator(np.random.PCG64(children[0])).integers(0, 2**63, 1000)
    b = np.random.Generator(np.random.PCG64(children[1])).integers(0, 2**63, 1000)
    assert np.intersect1d(a, b).size == 0
    old_a = np.random.Generator(np.random.PCG64(21).jumped(0)).integers(0, 2**63, 1000)
    old_b = np.random.Generator(np.random.PCG64(21)).integers(0, 2**63, 1000)
    assert (old_a == old_b).all()
    # bootstrap draws do not move with the number of permutations (they used to share a stream;
    # now they are separate streams, so the interval is identical whatever the permutations)
    again = weat(X, Y, A, B, seed=21, permutations=500, n_bootstrap=200)
    assert again.fields["ci"] == out.fields["ci"] and again.fields["p_value"] != out.fields["p_value"]
