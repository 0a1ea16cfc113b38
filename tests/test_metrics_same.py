"""SAME, gWEAT and Direct Bias: reference formulas, properties (hypothesis) and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.errors import DataError, ParameterError
from audit.metrics import bias_subspace, direct_bias, gweat, same, same_directions
from audit.metrics.same import paired_defining_sets
from audit.registry import run_metric

pytestmark = pytest.mark.unit

# ------------------------------------------------------------------------------ helpers


def _unit(m: np.ndarray) -> np.ndarray:
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _cos(u: np.ndarray, v: np.ndarray) -> float:
    return float(u @ v / np.linalg.norm(u) / np.linalg.norm(v))


def _groups(seed: int, dim: int = 12, n_groups: int = 2, n_attr: int = 5, n_targets=(6, 4)):
    rng = np.random.default_rng(seed)
    attrs = [rng.normal(size=dim) + rng.normal(size=(n_attr, dim)) for _ in range(n_groups)]
    targets = [rng.normal(size=(n, dim)) for n in n_targets]
    return targets, attrs


def _paper_same(targets, attrs):
    """SAME as Schröder et al. (2021, eqs. 14-16) define it, written out here: a_j = mean of the
    unit vectors of group j; bias directions a_j - a_0 made orthonormal by (classical)
    Gram-Schmidt; per target, the Euclidean length of its vector of cosines with the
    directions; SAME = mean over all targets. Returns (SAME, per-word b(t), per-word signed
    cosine with a_0 - a_1)."""
    means = [_unit(a).mean(axis=0) for a in attrs]
    basis = []
    for j in range(1, len(attrs)):
        v = means[0] - means[j]
        for u in basis:
            v = v - (v @ u) * u
        basis.append(v / np.linalg.norm(v))
    words = np.concatenate(targets)
    b = np.array([np.sqrt(sum(_cos(w, u) ** 2 for u in basis)) for w in words])
    return b.mean(), b, np.array([_cos(w, means[0] - means[1]) for w in words])


def _projection_length(words, attrs):
    """Independent route to the same b(t): the length of the projection of t/||t|| onto
    span(a_j - a_0) by least squares (no Gram-Schmidt)."""
    means = [_unit(a).mean(axis=0) for a in attrs]
    D = np.stack([means[j] - means[0] for j in range(1, len(attrs))], axis=1)  # (dim, J-1)
    t = _unit(words)
    coef, *_ = np.linalg.lstsq(D, t.T, rcond=None)
    return np.linalg.norm(D @ coef, axis=0)


def _rotation(seed: int, dim: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, dim)))
    return q * np.sign(np.diag(r))


# ------------------------------------------------------------------------------ SAME


@pytest.mark.parametrize("n_groups", [2, 3, 4])
def test_same_matches_paper_formula(n_groups):
    targets, attrs = _groups(n_groups, n_groups=n_groups)
    ref_value, ref_b, ref_signed = _paper_same(targets, attrs)
    out = same(targets, attrs)
    assert out.value == pytest.approx(ref_value, rel=1e-12)
    np.testing.assert_allclose(out.items["bias"], ref_b, rtol=1e-12)
    np.testing.assert_allclose(out.items["bias"], _projection_length(np.concatenate(targets), attrs), rtol=1e-10)
    assert out.fields["per_set"] == pytest.approx([ref_b[:6].mean(), ref_b[6:].mean()], rel=1e-12)
    if n_groups == 2:
        # signed cosine with a_0 - a_1 (positive: closer to group 0)
        np.testing.assert_allclose(out.items["score"], ref_signed, rtol=1e-12)
        np.testing.assert_allclose(out.items["bias"], np.abs(ref_signed), rtol=1e-12)
        signed = out.items["score"].to_numpy()
        assert out.fields["skew"] == pytest.approx(signed.mean())
        assert out.fields["stereotype"] == pytest.approx(signed.std())
        assert out.fields["combine"] is None
    else:
        components = [c for c in out.items.columns if c.startswith("component")]
        assert components == [f"component{j}" for j in range(1, n_groups)]
        comp = out.items[components].to_numpy()
        np.testing.assert_allclose(np.linalg.norm(comp, axis=1), ref_b, rtol=1e-12)
        assert out.fields["combine"] == "norm"


def test_same_one_target_in_the_plane_of_three_means():
    """Issue 15: a target in the plane of three attribute means has SAME 1.0 (the paper's
    bound), not 1.414 (the removed sum of absolute cosines)."""
    e = np.eye(3)
    attrs = [e[:1], e[1:2], -e[:1]]  # a_0 = e1, a_1 = e2, a_2 = -e1: directions span the e1-e2 plane
    out = same([e[:1]], attrs)
    # u_1 = (e1 - e2)/sqrt2, u_2 = (e1 + e2)/sqrt2: t = e1 has cosine 1/sqrt2 with both
    np.testing.assert_allclose(out.items[["component1", "component2"]].to_numpy(), [[2**-0.5, 2**-0.5]])
    assert out.value == pytest.approx(1.0, abs=1e-15)
    assert np.abs(out.items[["component1", "component2"]].to_numpy()).sum() == pytest.approx(np.sqrt(2))
    off = same([e[2:]], attrs)  # orthogonal to the plane
    assert off.value == pytest.approx(0.0, abs=1e-15)
    both = same([e[:1], np.array([[0.0, 5.0, 0.0], [0.0, 0.0, 2.0]])], attrs)
    assert both.value == pytest.approx(2 / 3)
    assert both.fields["per_set"] == pytest.approx([1.0, 0.5])
    with pytest.raises(ParameterError, match="'sum' was removed"):
        same([e[:1]], attrs, combine="sum")


def test_same_hand_example():
    # a_0 = e1, a_1 = e2: direction e1 - e2; t = e1 -> cos = 1/sqrt2; t = e3 -> 0; t = e2 -> -1/sqrt2
    attrs = [np.array([[2.0, 0, 0]]), np.array([[0, 3.0, 0]])]
    out = same([np.array([[1.0, 0, 0], [0, 0, 1.0]]), np.array([[0, 5.0, 0]])], attrs)
    s = 1 / np.sqrt(2)
    np.testing.assert_allclose(out.items["score"], [s, 0.0, -s], atol=1e-15)
    assert out.value == pytest.approx(2 * s / 3)
    assert out.fields["skew"] == pytest.approx(0.0, abs=1e-15)
    assert list(out.items["set"]) == ["target0", "target0", "target1"]


vec_seeds = st.integers(min_value=0, max_value=2**31 - 1)


@settings(max_examples=40, deadline=None)
@given(seed=vec_seeds, dim=st.integers(3, 16))
def test_same_binary_in_unit_interval_and_flips_sign(seed, dim):
    targets, attrs = _groups(seed, dim=dim)
    out = same(targets, attrs)
    assert 0.0 <= out.value <= 1.0
    assert ((out.items["bias"] >= 0) & (out.items["bias"] <= 1 + 1e-12)).all()
    swapped = same(targets, attrs[::-1])
    assert swapped.value == pytest.approx(out.value, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(swapped.items["score"], -out.items["score"], rtol=1e-10, atol=1e-14)


@settings(max_examples=40, deadline=None)
@given(seed=vec_seeds, dim=st.integers(3, 12), n_groups=st.integers(2, 4))
def test_same_invariant_to_positive_scaling_and_rotation(seed, dim, n_groups):
    targets, attrs = _groups(seed, dim=dim, n_groups=n_groups)
    rng = np.random.default_rng(seed + 1)
    scale = lambda m: m * rng.uniform(0.01, 100.0, size=(m.shape[0], 1))  # noqa: E731
    rot = _rotation(seed, dim)
    base = same(targets, attrs)
    scaled = same([scale(t) for t in targets], [scale(a) for a in attrs])
    rotated = same([t @ rot for t in targets], [a @ rot for a in attrs])
    for other in (scaled, rotated):
        assert other.value == pytest.approx(base.value, rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(other.items["score"], base.items["score"], rtol=1e-8, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=vec_seeds, n_groups=st.integers(3, 5))
def test_same_theorem2_bounds_and_group_order(seed, n_groups):
    """b(t) in [0, 1]; 1 for targets in span(a_j - a_0), 0 for targets orthogonal to it; SAME
    does not depend on the order of the groups."""
    dim = 10
    targets, attrs = _groups(seed, dim=dim, n_groups=n_groups)
    out = same(targets, attrs)
    assert 0.0 <= out.value <= 1.0
    assert ((out.items["bias"] >= 0) & (out.items["bias"] <= 1 + 1e-12)).all()
    perm = np.random.default_rng(seed).permutation(n_groups)
    assert same(targets, [attrs[i] for i in perm]).value == pytest.approx(out.value, rel=1e-9)
    U = same_directions(attrs)
    np.testing.assert_allclose(U @ U.T, np.eye(n_groups - 1), atol=1e-12)
    means = [_unit(a).mean(axis=0) for a in attrs]
    D = np.stack([means[j] - means[0] for j in range(1, n_groups)])  # (J-1, dim)
    rng = np.random.default_rng(seed + 7)
    inside = rng.normal(size=(4, n_groups - 1)) @ D
    np.testing.assert_allclose(same([inside], attrs).items["bias"], 1.0, rtol=1e-9)
    q, _ = np.linalg.qr(D.T)
    outside = rng.normal(size=(4, dim))
    outside -= outside @ q @ q.T
    np.testing.assert_allclose(same([outside], attrs).items["bias"], 0.0, atol=1e-9)


def test_same_errors():
    targets, attrs = _groups(0)
    with pytest.raises(ParameterError, match="attributes: needs at least 2 word sets, got 1"):
        same(targets, attrs[:1])
    with pytest.raises(DataError, match=r"attributes\[1\]: the mean direction"):
        same(targets, [attrs[0], attrs[0] * 3.0])
    with pytest.raises(DataError, match=r"targets\[1\]: vector dimension 5 differs"):
        same([targets[0], np.ones((2, 5))], attrs)
    with pytest.raises(DataError, match=r"targets\[0\]: row 2 is a zero vector"):
        same([np.vstack([targets[0][:2], np.zeros((1, 12))])], attrs)
    with pytest.raises(ParameterError, match="combine must be 'norm', got 'max'"):
        same(targets, attrs, combine="max")
    with pytest.raises(DataError, match="need 3 independent directions"):
        same([np.ones((1, 2))], [np.eye(2)[:1], np.eye(2)[1:], np.ones((1, 2)), -np.eye(2)[:1]])


# ------------------------------------------------------------------------------ gWEAT


@pytest.mark.parametrize("n_groups", [2, 3])
def test_gweat_matches_reference_formula(n_groups):
    targets, attrs = _groups(10 + n_groups, n_groups=n_groups, n_targets=(5, 7, 4)[:n_groups])
    mean_a = [_unit(a).mean(axis=0) for a in attrs]
    mu_a = np.mean(mean_a, axis=0)
    mean_x = [_unit(t).mean(axis=0) for t in targets]
    mu_x = np.mean(mean_x, axis=0)
    ref = sum((mean_x[i] - mu_x) @ (mean_a[i] - mu_a) for i in range(n_groups))
    out = gweat(targets, attrs)
    assert out.value == pytest.approx(ref, rel=1e-12)
    assert sum(out.fields["per_group"]) == pytest.approx(ref, rel=1e-12)
    if n_groups == 2:
        assert out.value == pytest.approx((mean_x[0] - mean_x[1]) @ (mean_a[0] - mean_a[1]) / 2, rel=1e-12)
        # swapping the attribute groups flips the sign
        assert gweat(targets, attrs[::-1]).value == pytest.approx(-out.value, rel=1e-9)
    np.testing.assert_allclose(
        out.items["score"], np.concatenate([_unit(t) @ (mean_a[i] - mu_a) for i, t in enumerate(targets)]), rtol=1e-12
    )
    with pytest.raises(ParameterError, match="as many target sets as attribute sets"):
        gweat(targets, attrs + [attrs[0]])


# ------------------------------------------------------------------------------ Direct Bias


def _defining_pairs(seed: int, dim: int = 8, n: int = 6):
    """Pairs b_i +/- e1 with b_i orthogonal to e1: the centred pairs are exactly +/- e1."""
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(n, dim))
    b[:, 0] = 0.0
    e1 = np.eye(dim)[0]
    return [b + e1, b - e1]


@pytest.mark.parametrize("normalize", [True, False])
def test_direct_bias_one_on_direction_zero_orthogonal(normalize):
    pairs = _defining_pairs(0)
    G, evr = bias_subspace(paired_defining_sets(pairs), normalize=normalize)
    np.testing.assert_allclose(G[0], np.eye(8)[0], atol=1e-12)  # oriented towards set 0
    assert evr[0] == pytest.approx(1.0)
    on = np.array([[3.0, 0, 0, 0, 0, 0, 0, 0], [-0.5, 0, 0, 0, 0, 0, 0, 0]])
    off = np.random.default_rng(1).normal(size=(5, 8))
    off[:, 0] = 0.0
    assert direct_bias([on], pairs, normalize=normalize).value == pytest.approx(1.0)
    assert direct_bias([off], pairs, normalize=normalize).value == pytest.approx(0.0, abs=1e-12)
    out = direct_bias([on, off], pairs, normalize=normalize)
    assert out.value == pytest.approx(2 / 7)
    assert out.fields["per_set"] == pytest.approx([1.0, 0.0], abs=1e-12)
    np.testing.assert_allclose(out.items["cos"][:2], [1.0, -1.0])


@settings(max_examples=40, deadline=None)
@given(seed=vec_seeds, c=st.floats(0.0, 4.0), k=st.integers(1, 3))
def test_direct_bias_in_unit_interval_and_strictness(seed, c, k):
    rng = np.random.default_rng(seed)
    pairs = [rng.normal(size=(6, 10)) for _ in range(2)]
    words = [rng.normal(size=(7, 10))]
    out = direct_bias(words, pairs, c=c, k=k)
    assert 0.0 <= out.value <= 1.0
    G, _ = bias_subspace(paired_defining_sets(pairs), k, normalize=True)
    proj = np.linalg.norm(_unit(words[0]) @ G.T, axis=1)
    assert out.value == pytest.approx(np.mean(proj**c), rel=1e-9, abs=1e-12)
    if k == 1:
        one = direct_bias(words, pairs, c=1.0)
        np.testing.assert_allclose(one.items["bias"], np.abs(one.items["cos"]))


def test_direct_bias_matches_bolukbasi_pca():
    """g = first PC of the pair-centred defining vectors (debiaswe doPCA), up to sign."""
    rng = np.random.default_rng(3)
    pairs = [rng.normal(size=(5, 6)) for _ in range(2)]
    unit = [_unit(p) for p in pairs]
    centre = (unit[0] + unit[1]) / 2
    rows = np.concatenate([unit[0] - centre, unit[1] - centre])
    g = np.linalg.svd(rows - rows.mean(axis=0))[2][0]
    G, _ = bias_subspace(paired_defining_sets(pairs), normalize=True)
    assert abs(G[0] @ g) == pytest.approx(1.0)
    w = rng.normal(size=(4, 6))
    assert direct_bias([w], pairs, c=2.0).value == pytest.approx(np.mean([_cos(x, g) ** 2 for x in w]))


def test_one_bias_subspace_for_metrics_and_mitigation():
    """Issue 15: one bias_subspace (audit.metrics.same), used by Direct Bias and by the
    mitigation methods; defining sets of different sizes (Manzini et al.'s multiclass sets)
    against an SVD written here, orientation towards the first word of each set."""
    from audit.mitigation import base

    assert base.bias_subspace is bias_subspace
    rng = np.random.default_rng(11)
    sets = [rng.normal(size=(3, 7)), rng.normal(size=(2, 7)), rng.normal(size=(4, 7))]
    rows = np.concatenate([d - d.mean(axis=0) for d in sets])
    _, sv, vt = np.linalg.svd(rows, full_matrices=False)
    G, evr = bias_subspace(sets, 2)
    for j in range(2):
        assert abs(G[j] @ vt[j]) == pytest.approx(1.0, abs=1e-12)
        assert np.mean([d[0] - d.mean(axis=0) for d in sets], axis=0) @ G[j] >= 0
    np.testing.assert_allclose(evr, sv[:2] ** 2 / (sv**2).sum(), rtol=1e-10)
    # capped at the number of rows without require_rank; refused with it
    assert bias_subspace([sets[1]], 5)[0].shape == (2, 7)
    with pytest.raises(DataError, match="span 1 dimension"):
        bias_subspace([sets[1]], 2, require_rank=True)
    # Direct Bias: paired sets -> one defining set per row, row j = group j's word
    pairs = [rng.normal(size=(5, 7)) for _ in range(2)]
    tuples = paired_defining_sets(pairs)
    assert len(tuples) == 5 and all((t == np.stack([pairs[0][i], pairs[1][i]])).all() for i, t in enumerate(tuples))
    g = bias_subspace(tuples, normalize=True)[0][0]
    words = rng.normal(size=(4, 7))
    assert direct_bias([words], pairs).value == pytest.approx(np.mean([abs(_cos(w, g)) for w in words]))


def test_direct_bias_errors():
    pairs = _defining_pairs(0)
    w = [np.ones((2, 8))]
    with pytest.raises(DataError, match=r"attributes\[1\]: Direct Bias needs paired defining sets"):
        direct_bias(w, [pairs[0], pairs[1][:4]])
    with pytest.raises(DataError, match="span 1 dimension"):
        direct_bias(w, pairs, k=2)
    with pytest.raises(ParameterError, match="strictness"):
        direct_bias(w, pairs, c=-1)
    with pytest.raises(ParameterError, match=r"^k: must be >= 1, got 0$"):
        direct_bias(w, pairs, k=0)
    with pytest.raises(DataError, match=r"targets\[0\]: vector dimension 3"):
        direct_bias([np.ones((2, 3))], pairs)


def test_registry_geometric_metrics_roles():
    words, groups = _groups(4)
    # default (WEFE roles): the groups are the test's target sets, the attribute words are scored
    out = run_metric("same", groups, words)
    ref = same(words, groups)
    assert out.value == pytest.approx(ref.value)
    assert list(out.items["set"]) == ["attribute0"] * 6 + ["attribute1"] * 4
    np.testing.assert_allclose(out.items["score"], ref.items["score"])
    # groups="attributes": a test written the other way round (e.g. WEAT 7/8)
    swapped = run_metric("same", words, groups, groups="attributes")
    assert swapped.value == pytest.approx(ref.value)
    assert list(swapped.items["set"]) == ["target0"] * 6 + ["target1"] * 4
    assert run_metric("gweat", words, groups).value == pytest.approx(gweat(words, groups).value)
    assert run_metric("gweat", groups, words).value == pytest.approx(gweat(words, groups).value)  # symmetric
    pairs = [g[:5] for g in groups]
    expected = direct_bias(words, pairs, c=0.5).value
    assert run_metric("direct_bias", pairs, words, c=0.5).value == pytest.approx(expected)
    assert run_metric("direct_bias", words, pairs, c=0.5, groups="attributes").value == pytest.approx(expected)
    with pytest.raises(ParameterError, match="at least 2 target sets, got 1"):
        run_metric("same", groups[:1], words)
    with pytest.raises(ParameterError, match="at least 2 attribute sets, got 1"):
        run_metric("same", words, groups[:1], groups="attributes")
    with pytest.raises(ParameterError, match="groups must be 'targets' or 'attributes'"):
        run_metric("same", groups, words, groups="both")
