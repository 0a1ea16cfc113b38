"""Which side of a test holds the protected groups is a property of the test (issue 15, item 4).

Every shipped test declares ``protected_groups`` with a reason; BIAS-format files follow a
documented rule; every asymmetric metric takes its group sets from that side unless the task's
``groups`` parameter overrides it; each result records the side and who decided it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from audit import datasets as ds
from audit import registry, runner
from audit.datasets.bias import BIAS_GROUPS_RULE
from audit.metrics import direct_bias, mac, rnd, rnsb, same
from audit.metrics.wefe_family import ect, ripa
from audit.suites import WordSet, WordTest

pytestmark = pytest.mark.unit

ASYMMETRIC = ("same", "direct_bias", "cramers_v", "rnd", "rnsb", "mac", "ect", "ripa")


def test_every_shipped_test_declares_its_groups_with_a_reason():
    for name, path in ds.registry().items():
        if "/" not in name or ds.stub_of(path) is not None:
            continue
        t = ds.read_native(path)
        assert t.groups in ("targets", "attributes") and len(t.groups_reason) > 20, name
    # Caliskan's WEAT 7/8 put the gender terms in the attribute sets; WEAT 6 in the targets
    assert ds.load_test("weat7").groups == ds.load_test("weat8").groups == "attributes"
    assert ds.load_test("weat6").groups == ds.load_test("weat3").groups == "targets"
    assert ds.load_test("de/cw4").groups == "attributes"
    # the side changes the numbers, so it is part of the test's digest
    t = ds.load_test("weat7")
    assert dataclasses.replace(t, groups="targets").digest() != t.digest()


def test_bias_files_follow_the_documented_rule(tmp_path):
    p = tmp_path / "en" / "T.txt"
    p.parent.mkdir()
    p.write_text("a, b\nc, d\ne, f\ng, h\n", encoding="utf-8")
    t = ds.read_bias_weat_txt(p)
    assert t.groups == "targets" and t.groups_reason == BIAS_GROUPS_RULE


def test_the_native_field_is_validated(tmp_path):
    base = ds.dump_native(ds.load_test("weat1")).split("protected_groups:")[0]
    p = tmp_path / "bad.yaml"
    p.write_text(base + "protected_groups: {side: words, reason: x}\n", encoding="utf-8")
    with pytest.raises(ds.DataError if hasattr(ds, "DataError") else Exception,
                       match=r"bad\.yaml: field protected_groups\.side: unknown value 'words'; known: targets, attributes$"):
        ds.read_native(p)


def _vectors(tmp_path, test):
    rng = np.random.default_rng(11)
    words = sorted({w for s in (*test.targets, *test.attributes) for w in s.words})
    f = tmp_path / "v.vec"
    f.write_text(f"{len(words)} 10\n" + "\n".join(w + " " + " ".join(f"{x:.6f}" for x in rng.normal(size=10))
                                                for w in words) + "\n", encoding="utf-8")
    return runner.load_model(str(f))


# A test written the WEAT 7 way: the measured words are the targets, the groups (paired) the attributes
MEASURED = (WordSet("math", ("algebra", "geometry", "calculus", "numbers")),
            WordSet("arts", ("poetry", "dance", "novel", "drama")))
GROUPS = (WordSet("male", ("he", "man", "boy", "father")), WordSet("female", ("she", "woman", "girl", "mother")))
T_ATTR = WordTest("w7like", "en", MEASURED, GROUPS, groups="attributes", groups_reason="the attributes are the groups")
T_TARG = dataclasses.replace(T_ATTR, groups="targets", groups_reason="")


@pytest.mark.parametrize("metric", ASYMMETRIC)
def test_every_asymmetric_metric_uses_the_tests_side(tmp_path, metric):
    model = _vectors(tmp_path, T_ATTR)
    by_test = runner.score(model, T_ATTR, metric, {"n_cases": 3} if metric == "cramers_v" else {}, seed=1)
    by_param = runner.score(model, T_TARG, metric, {"groups": "attributes", **({"n_cases": 3} if metric == "cramers_v" else {})},
                            seed=1)
    assert by_test.value == pytest.approx(by_param.value, abs=1e-12)
    assert by_test.fields["groups"] == "attributes" and by_test.fields["groups_source"] == "test"
    assert by_test.fields["groups_reason"] == "the attributes are the groups"
    assert by_param.fields["groups_source"] == "parameter"
    default = runner.score(model, T_TARG, metric, {"n_cases": 3} if metric == "cramers_v" else {}, seed=1)
    assert default.fields["groups"] == "targets"
    if metric not in ("cramers_v", "mac"):  # MAC over equal-sized sets is symmetric; V can coincide
        assert default.value != pytest.approx(by_test.value, abs=1e-9)


def test_the_side_reaches_the_metric_functions(tmp_path):
    """Independent of the adapters: the metric functions called by hand with the groups as the
    WEFE/SAME "groups" argument and the measured words as the other."""
    model = _vectors(tmp_path, T_ATTR)
    meas = runner.measure(model, T_ATTR, "rnd", {})
    (X, Y), (A, B) = meas.targets, meas.attributes   # X, Y measured; A, B groups
    measured = np.concatenate([X, Y])
    assert runner.score(model, T_ATTR, "rnd").value == pytest.approx(rnd(A, B, measured).value, abs=1e-12)
    assert runner.score(model, T_ATTR, "ect").value == pytest.approx(ect(A, B, measured).value, abs=1e-12)
    assert runner.score(model, T_ATTR, "ripa").value == pytest.approx(ripa(A, B, measured).value, abs=1e-12)
    assert runner.score(model, T_ATTR, "mac").value == pytest.approx(mac([A, B], [X, Y]).value, abs=1e-12)
    assert runner.score(model, T_ATTR, "same").value == pytest.approx(same([X, Y], [A, B]).value, abs=1e-12)
    assert runner.score(model, T_ATTR, "direct_bias").value == pytest.approx(direct_bias([X, Y], [A, B]).value, abs=1e-12)
    assert runner.score(model, T_ATTR, "rnsb", seed=4).value == pytest.approx(
        runner.score(model, T_TARG, "rnsb", {"groups": "attributes"}, seed=4).value, abs=1e-12)
    assert rnsb  # the function behind both


def test_set_counts_follow_the_side():
    three_groups = WordTest("t", "en", MEASURED, (*GROUPS, WordSet("other", ("they", "person", "kid", "parent"))),
                            groups="attributes", groups_reason="x")
    # RND takes exactly two group sets: three on the group side (here the attributes) do not fit
    assert "needs exactly 2 attribute sets, got 3" in registry.applies("rnd", three_groups)
    assert registry.applies("rnd", dataclasses.replace(three_groups, groups="targets")) is None
