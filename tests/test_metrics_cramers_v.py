"""Cramér's V classifier method: contingency statistics, constructed embeddings, seeds, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from audit.errors import DataError, ParameterError
from audit.metrics import contingency_association, cramers_v
from audit.registry import run_metric
from audit.result import _jsonable

pytestmark = pytest.mark.unit


def _clusters(seed: int, n_classes: int = 2, n_prot: int = 20, n_ster: int = 15, dim: int = 16, noise: float = 0.5):
    """Protected words around class centres; stereotyped words of class j around centre j."""
    rng = np.random.default_rng(seed)
    centres = 3.0 * rng.normal(size=(n_classes, dim))
    protected = [c + noise * rng.normal(size=(n_prot, dim)) for c in centres]
    stereotyped = [0.6 * c + noise * rng.normal(size=(n_ster, dim)) for c in centres]
    return protected, stereotyped


def test_contingency_association_known_tables():
    v, chi2, p, degen = contingency_association([[10, 0], [0, 10]])
    assert (v, chi2, degen) == (pytest.approx(1.0), pytest.approx(20.0), False)
    assert p < 1e-4
    v, chi2, p, degen = contingency_association([[5, 5], [5, 5]])
    assert v == pytest.approx(0.0) and chi2 == pytest.approx(0.0) and p == pytest.approx(1.0)
    # a 3 x 2 table: V = sqrt(chi2 / (n (min(r, c) - 1))), Pearson chi2 without continuity correction
    t = np.array([[8, 2], [3, 7], [5, 5]])
    v, chi2, p, _ = contingency_association(t)
    ref = chi2_contingency(t, correction=False)
    assert chi2 == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    assert v == pytest.approx(math.sqrt(ref.statistic / (t.sum() * 1)))
    # an empty column (a class never predicted) is dropped
    dropped = contingency_association([[6, 1], [0, 7]])[0]
    assert contingency_association([[6, 0, 1], [0, 0, 7]])[0] == pytest.approx(dropped)
    # everything predicted as one class: no association measurable
    assert contingency_association([[3, 0], [2, 0]]) == (0.0, 0.0, 1.0, True)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("classifier", ["svm", "logistic"])
def test_stereotyped_words_near_their_class_give_v_close_to_one(n_classes, classifier):
    protected, stereotyped = _clusters(n_classes, n_classes=n_classes)
    out = cramers_v(protected, stereotyped, classifier=classifier, n_cases=5, seed=0)
    assert out.value > 0.95
    assert out.fields["cramers_v_std"] < 0.05
    table = np.asarray(out.fields["contingency"])
    assert table.shape == (n_classes, n_classes)
    assert table.sum() == pytest.approx(15 * n_classes)
    assert np.trace(table) > 0.95 * table.sum()  # stereotype class j predicted as protected class j
    assert (out.items["predicted"].to_numpy() == np.repeat(np.arange(n_classes), 15)).mean() > 0.95
    assert all(p < 1e-6 for p in out.fields["p_values"])
    json.dumps(_jsonable(out.fields), allow_nan=False)


def test_random_stereotyped_words_give_small_v():
    rng = np.random.default_rng(1)
    protected, _ = _clusters(1, n_prot=30)
    # stereotype labels independent of the geometry
    stereotyped = [3.0 * rng.normal(size=(40, 16)) for _ in range(2)]
    out = cramers_v(protected, stereotyped, n_cases=10, seed=2)
    assert out.value < 0.25
    assert 0.0 <= min(out.fields["v_per_case"]) and max(out.fields["v_per_case"]) <= 1.0


def test_seed_reproducibility():
    protected, stereotyped = _clusters(4, noise=3.0)
    a = cramers_v(protected, stereotyped, n_cases=6, train_fraction=0.5, seed=123)
    b = cramers_v(protected, stereotyped, n_cases=6, train_fraction=0.5, seed=123)
    c = cramers_v(protected, stereotyped, n_cases=6, train_fraction=0.5, seed=124)
    assert a.fields == b.fields
    assert a.items.equals(b.items)
    assert a.fields["v_per_case"] != c.fields["v_per_case"]
    assert len(set(a.fields["v_per_case"])) > 1  # the cases differ (random training subsets)
    # documented streams: children 4 (subsets) and 5 (classifier seeds) of SeedSequence(123)
    assert a.fields["random_streams"] == {"subsets": 4, "classifier": 5}
    want = np.random.SeedSequence(123, spawn_key=(5,)).generate_state(6, np.uint32).tolist()
    assert a.fields["classifier_seeds"] == want
    unseeded = cramers_v(protected, stereotyped, n_cases=3, train_fraction=0.5)
    again = cramers_v(protected, stereotyped, n_cases=3, train_fraction=0.5, seed=unseeded.fields["seed"])
    assert again.fields == unseeded.fields


def test_degenerate_case_counted_not_nan():
    # every stereotyped word lies deep in class 0: all predicted as 0
    protected, _ = _clusters(5)
    stereotyped = [protected[0][:3] * 1.0, protected[0][3:6] * 1.0]
    out = cramers_v(protected, stereotyped, n_cases=2, seed=0)
    assert out.value == 0.0 and out.fields["degenerate_cases"] == 2


def test_registry_roles():
    protected, stereotyped = _clusters(6)
    direct = cramers_v(protected, stereotyped, n_cases=3, seed=1)
    # default: the protected classes are the test's target sets, stereotyped words its attributes
    default = run_metric("cramers_v", protected, stereotyped, n_cases=3, seed=1)
    assert default.value == direct.value
    assert set(default.items["set"]) == {"attribute0", "attribute1"}
    swapped = run_metric("cramers_v", stereotyped, protected, n_cases=3, seed=1, groups="attributes")
    assert swapped.value == direct.value
    assert set(swapped.items["set"]) == {"target0", "target1"}
    with pytest.raises(ParameterError, match="groups"):
        run_metric("cramers_v", protected, stereotyped, groups="both")


def test_errors():
    protected, stereotyped = _clusters(7)
    with pytest.raises(ParameterError, match="protected: expected a list of at least 2"):
        cramers_v(protected[:1], stereotyped)
    with pytest.raises(ParameterError, match="train_fraction"):
        cramers_v(protected, stereotyped, train_fraction=0.0)
    with pytest.raises(ParameterError, match="classifier"):
        cramers_v(protected, stereotyped, classifier="tree")
    with pytest.raises(ParameterError, match="n_cases"):
        cramers_v(protected, stereotyped, n_cases=0)
    with pytest.raises(DataError, match=r"stereotyped\[1\]: vector dimension 4"):
        cramers_v(protected, [stereotyped[0], np.ones((3, 4))])
    with pytest.raises(DataError, match=r"protected\[0\]: row 1 contains NaN"):
        cramers_v([np.vstack([protected[0][:1], [np.nan] * 16]), protected[1]], stereotyped)
