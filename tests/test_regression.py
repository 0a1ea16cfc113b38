"""``audit compare``: two models test by test (audit.regression), its regression gate and exit
statuses, on word2vec files written here (the WEAT 1 and WEAT 7 words, a planted bias change).

Cross-checks: each model's headline against ``audit score`` of that model alone (on the words
both models hold), the adjusted p-values against a hand-written Holm and scipy's BH, the
comparison against :mod:`audit.compare` called on the arrays directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control

from audit import cli, regression, registry, runner
from audit.compare import compare_weat
from audit.datasets.external import data_root
from audit.errors import DataError, ParameterError
from audit.suites import WordSet
from test_multitest import _holm_by_hand  # the hand-written Holm of the adjustment tests

pytestmark = pytest.mark.unit

TESTS = ("weat1", "weat7")


def set_words(names=TESTS) -> dict[str, list[list[str]]]:
    """Per test, its four sets' words."""
    out = {}
    for n in names:
        t = runner.load_test(n)
        out[n] = [list(s.words) for s in (*t.targets, *t.attributes)]
    return out


def planted_models(seed: int = 0, *, dim: int = 24, noise: float = 0.05, delta: float = 0.0,
                   drop: dict[int, set[str]] | None = None) -> list[dict[str, np.ndarray]]:
    """Three "revisions" of one model: the base, base + small noise (no change), and that plus
    a planted bias change of size ``delta`` along ``g`` (X words +delta g, Y words -delta g, in
    every test). ``drop``: revision index -> words it lacks."""
    rng = np.random.default_rng(seed)
    g = np.zeros(dim)
    g[0] = 1.0
    base: dict[str, np.ndarray] = {}
    for sets in set_words().values():
        for i, words in enumerate(sets):
            sign = (1.0, -1.0, 2.0, -2.0)[i]
            for w in words:
                if w not in base:
                    base[w] = rng.normal(size=dim) + 0.6 * sign * g
    v2 = {w: v + noise * rng.normal(size=dim) for w, v in base.items()}
    v3 = dict(v2)
    for sets in set_words().values():
        for w in sets[0]:
            v3[w] = v2[w] + delta * g
        for w in sets[1]:
            v3[w] = v2[w] - delta * g
    revs = [base, v2, v3]
    for i, words in (drop or {}).items():
        revs[i] = {w: v for w, v in revs[i].items() if w not in words}
    return revs


def write_w2v(path: Path, vectors: dict[str, np.ndarray]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    dim = len(next(iter(vectors.values())))
    lines = [f"{len(vectors)} {dim}"] + [w + " " + " ".join(f"{x:.6f}" for x in v) for w, v in vectors.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def revisions(tmp_path_factory):
    d = tmp_path_factory.mktemp("revisions")
    return [write_w2v(d / f"v{i + 1}" / "vectors.vec", v) for i, v in enumerate(planted_models(delta=0.8))]


def test_compare_models_values_are_each_models_audit_and_the_comparison_is_compare_weat(revisions):
    v1, v2, v3 = revisions
    df, models = regression.compare_models(v2, v3, tests=list(TESTS), seed=3, n_bootstrap=200)
    assert df["status"].tolist() == ["compared", "compared"] and df["metric"].tolist() == ["weat", "weat"]
    assert set(models) == {"A", "B"} and models["A"]["model"] == v2 and models["B"]["revision"].startswith("sha256:")
    for r in df.itertuples():
        a = runner.score(v2, r.test, "weat", seed=3)
        b = runner.score(v3, r.test, "weat", seed=3)
        assert r.value_a == pytest.approx(a.value, abs=1e-12) and r.value_b == pytest.approx(b.value, abs=1e-12)
        assert r.delta == pytest.approx(b.value - a.value, abs=1e-12)
        assert r.delta_abs == pytest.approx(abs(b.value) - abs(a.value), abs=1e-12)
        # the same numbers as audit.compare on the arrays (every word's vectors swapped: one space)
        ma = runner.measure(runner.load_model(v2), runner.load_test(r.test), "weat")
        mb = runner.measure(runner.load_model(v3), runner.load_test(r.test), "weat")
        direct = compare_weat([*ma.targets, *ma.attributes], [*mb.targets, *mb.attributes], seed=3, n_bootstrap=200)
        assert r.p_value == direct.p_value and [r.ci_low, r.ci_high] == pytest.approx(direct.ci)
        assert r.p_method == "sampled label swap" and "every word" in r.null_hypothesis
    # the planted change (0.8 along the bias direction) is found in both tests
    assert (df["delta"] > 0.3).all() and (df["p_value"] <= 0.001).all()
    p = df["p_value"].tolist()
    np.testing.assert_allclose(df["p_holm"], _holm_by_hand(p), rtol=1e-12)
    np.testing.assert_allclose(df["p_bh"], false_discovery_control(p, method="bh"), rtol=1e-12)
    assert df["n_family"].tolist() == [2, 2]


def test_words_missing_in_either_model_are_dropped_from_both_and_named(tmp_path):
    v1, v2, _ = planted_models(seed=1)
    # B lacks a flower (target X of WEAT 1) and a pleasant word (attribute A); A lacks an insect
    b_path = write_w2v(tmp_path / "b.vec", {w: v for w, v in v2.items() if w not in ("aster", "caress")})
    a_path = write_w2v(tmp_path / "a.vec", {w: v for w, v in v1.items() if w != "ant"})
    df, _ = regression.compare_models(a_path, b_path, tests=["weat1"], seed=0, n_bootstrap=0)
    [r] = df.to_dict("records")
    assert r["missing_a"] == "insects: ant" and r["missing_b"] == "flowers: aster; pleasant: caress"
    # both headlines are each model's WEAT on the words both hold
    t = runner.load_test("weat1")
    keep = {"aster", "caress", "ant"}
    reduced = type(t)(**{**t.__dict__, "targets": tuple(WordSet(s.name, tuple(w for w in s.words if w not in keep))
                                                         for s in t.targets),
                         "attributes": tuple(WordSet(s.name, tuple(w for w in s.words if w not in keep))
                                             for s in t.attributes)})
    assert r["value_a"] == pytest.approx(runner.score(a_path, reduced, "weat", seed=0).value, abs=1e-12)
    assert r["value_b"] == pytest.approx(runner.score(b_path, reduced, "weat", seed=0).value, abs=1e-12)
    assert r["n_items"] == sum(len(s.words) for s in reduced.targets)


def test_paired_groups_stay_aligned_when_a_word_is_missing(tmp_path):
    """Direct Bias pairs the protected-group sets row by row (WEAT 7: male/female terms): a
    term missing in one model drops its partner in both models."""
    v1, v2, _ = planted_models(seed=2)
    a_path = write_w2v(tmp_path / "a.vec", v1)
    b_path = write_w2v(tmp_path / "b.vec", {w: v for w, v in v2.items() if w != "brother"})
    t = runner.load_test("weat7")
    male, female = t.attributes
    i = male.words.index("brother")
    df, _ = regression.compare_models(a_path, b_path, tests=["weat7"], metrics=["direct_bias"], seed=0,
                                      n_bootstrap=50)
    [r] = df.to_dict("records")
    assert r["status"] == "compared", r["error"]
    assert r["missing_b"] == f"{male.name}: brother; {female.name}: {female.words[i]}" and r["missing_a"] == ""
    reduced = type(t)(**{**t.__dict__, "attributes": tuple(
        WordSet(s.name, tuple(w for j, w in enumerate(s.words) if j != i)) for s in t.attributes)})
    assert r["value_a"] == pytest.approx(runner.score(a_path, reduced, "direct_bias").value, abs=1e-12)
    assert r["value_b"] == pytest.approx(runner.score(b_path, reduced, "direct_bias").value, abs=1e-12)


def test_item_mean_metrics_and_not_comparable_ones(revisions):
    _, v2, v3 = revisions
    df, _ = regression.compare_models(v2, v3, tests=["weat7"], metrics=["same", "mac", "gweat", "ect"], seed=0,
                                      n_bootstrap=50)
    by = df.set_index("metric")
    for m in ("same", "mac", "gweat"):
        assert by.loc[m, "status"] == "compared", by.loc[m, "error"]
        assert by.loc[m, "value_a"] == pytest.approx(runner.score(v2, "weat7", m).value, abs=1e-12)
        assert by.loc[m, "value_b"] == pytest.approx(runner.score(v3, "weat7", m).value, abs=1e-12)
    assert by.loc["ect", "status"] == "not comparable" and np.isnan(by.loc["ect", "p_holm"])
    assert by.loc["ect", "n_family"] == 0 and registry.comparer("ect") is None
    assert registry.comparer("crows_pairs_causal") is registry.comparer("crows_pairs")


def test_regression_rule():
    df = regression.adjust(pd.DataFrame([
        {"test": "t1", "language": "en", "metric": "weat", "status": "compared", "delta_abs": 0.5, "p_value": 0.001},
        {"test": "t2", "language": "en", "metric": "weat", "status": "compared", "delta_abs": 0.1, "p_value": 0.001},
        {"test": "t3", "language": "en", "metric": "weat", "status": "compared", "delta_abs": 0.9, "p_value": 0.03},
        {"test": "t4", "language": "en", "metric": "weat", "status": "compared", "delta_abs": -0.6, "p_value": 0.0001},
        {"test": "t5", "language": "en", "metric": "weat", "status": "failed", "error": "x"},
    ]))
    # Holm over the 4 compared: 0.001*3=0.003 (t1, t2 tie after t4: 0.0004), t3: 0.03*1 -> 0.03
    np.testing.assert_allclose(df["p_holm"][:4], [0.003, 0.003, 0.03, 0.0004])
    flagged = regression.flag_regressions(df, min_increase=0.2, alpha=0.05)
    assert flagged["regression"].tolist() == [True, False, True, False, False]
    assert regression.flag_regressions(df, min_increase=0.2, alpha=0.01)["regression"].tolist() == [
        True, False, False, False, False]
    assert regression.exit_status(flagged, fail_on_regression=True) == regression.EXIT_REGRESSION
    assert regression.exit_status(flagged, fail_on_regression=False) == regression.EXIT_INCOMPLETE
    assert regression.exit_status(flagged[:4], fail_on_regression=False) == regression.EXIT_OK
    with pytest.raises(ParameterError, match=r"^alpha: must be > 0, got 0$"):
        regression.flag_regressions(df, alpha=0)
    with pytest.raises(ParameterError, match="unknown p-value adjustment"):
        regression.flag_regressions(df, adjust_method="bonferroni")


def test_second_reference():
    assert regression.second_reference("org/name@v1", "@v2") == "org/name@v2"
    assert regression.second_reference("org/name", "@abc") == "org/name@abc"
    assert regression.second_reference("/a/m1", "/a/m2") == "/a/m2"
    with pytest.raises(ParameterError, match="give a revision"):
        regression.second_reference("x", "@")


def test_cli_fail_on_regression_exit_statuses(revisions, capsys):
    v1, v2, v3 = revisions
    base = ["compare", "--test", "weat1", "weat7", "--n-bootstrap", "100", "--fail-on-regression",
            "--min-increase", "0.2"]
    # no change between v1 and v2 (small noise): exit 0
    assert cli.main([*base[:1], v1, v2, *base[1:]]) == 0
    out = capsys.readouterr().out
    assert "Regressions (|bias| up by >= 0.2, holm-adjusted p <= 0.05): none" in out
    assert "| en/weat1 | weat |" in out and "| no |" in out
    # the planted bias increase: exit 1, both tests named
    assert cli.main([*base[:1], v2, v3, *base[1:]]) == regression.EXIT_REGRESSION == 1
    out = capsys.readouterr().out
    assert "| REGRESSION |" in out and "Regressions (|bias| up by >= 0.2, holm-adjusted p <= 0.05): en/weat1 weat (+" in out
    # without the gate the same comparison exits 0; a threshold above the change exits 0 too
    assert cli.main(["compare", v2, v3, "--test", "weat1", "--n-bootstrap", "0"]) == 0
    capsys.readouterr()
    assert cli.main([*base[:1], v2, v3, *base[1:-1], "5"]) == 0
    capsys.readouterr()
    # JSON: every number at full precision, the gate recorded
    assert cli.main([*base[:1], v2, v3, *base[1:], "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["gate"] == {"min_increase": 0.2, "alpha": 0.05, "adjust": "holm", "fail_on_regression": True}
    assert [c["regression"] for c in doc["comparisons"]] == [True, True]
    assert all(c["p_holm"] <= 0.05 and c["delta_abs"] >= 0.2 for c in doc["comparisons"])


def test_cli_incomplete_and_bad_input(revisions, tmp_path, capsys):
    v1, v2, _ = revisions
    # model B lacks most of WEAT 7's math words: that comparison fails, WEAT 1 is compared -> exit 3
    vecs = planted_models()[1]
    sparse = write_w2v(tmp_path / "sparse.vec", {w: v for w, v in vecs.items()
                                                 if w not in runner.load_test("weat7").targets[0].words[:5]})
    assert cli.main(["compare", v1, sparse, "--test", "weat1", "weat7", "--n-bootstrap", "0"]) == 3
    out = capsys.readouterr().out
    assert "| en/weat7 | weat | | | | | | | | | | failed: model B (" in out
    assert cli.main(["compare", v1, v2, "--metric", "wat"]) == 2
    assert "unknown metric 'wat'" in capsys.readouterr().err
    assert cli.main(["compare", "run:abc", v2]) == 2
    assert "needs the service command" in capsys.readouterr().err
    assert cli.main(["compare", v1, v2, "--test", "weat1", "--n-bootstrap", "-1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "audit: error: --n-bootstrap: must be >= 0, got -1"


def test_default_tests_are_the_languages_shipped_tests(revisions):
    names = regression.default_tests("en")
    assert "en/weat1" in names and all(n.startswith("en/") for n in names)
    with pytest.raises(DataError):
        regression.common_test(runner.load_test("weat1"),
                               type("M", (), {"labels": {"target0": [], "target1": ["x"], "attribute0": ["a"],
                                                         "attribute1": ["b"]}})(),
                               type("M", (), {"labels": {"target0": ["aster"], "target1": ["ant"],
                                                         "attribute0": ["caress"], "attribute1": ["abuse"]}})(),
                               "weat", {})


CROWS = data_root() / "crows-pairs" / "crows_pairs_anonymized.csv"


@pytest.mark.skipif(not CROWS.is_file(), reason=f"CrowS-Pairs data not found at {CROWS} ($BIASAUDIT_DATA)")
def test_masked_lms_crows_pairs_mcnemar_and_lpbs_from_per_item_tables():
    """Two tiny masked LMs: CrowS-Pairs (exact McNemar on the pairs' outcomes) and LPBS (swap of
    the per-attribute scores) from each model's per-item table, as audit score gives them."""
    import torch
    from scipy.stats import binomtest

    from audit import tiny_models
    from audit.datasets.crows_pairs import load_crows_pairs

    torch.set_num_threads(1)
    bert, roberta = (str(tiny_models.tiny_model_dir(k)) for k in ("bert", "roberta"))
    pairs = load_crows_pairs(CROWS, limit=40)
    df, models = regression.compare_models(bert, roberta, tests=[pairs, "en/gender_math"], metrics=["crows_pairs", "lpbs"],
                                           seed=0, n_bootstrap=100)
    assert models["A"]["kind"] == models["B"]["kind"] == "mlm"
    by = df.set_index("metric")
    assert by["status"].tolist() == ["compared", "compared"], by["error"].tolist()
    a = runner.score(bert, pairs, "crows_pairs")
    b = runner.score(roberta, pairs, "crows_pairs")
    c = by.loc["crows_pairs"]
    assert (c.value_a, c.value_b) == pytest.approx((a.value, b.value), abs=1e-9) and c.p_method == "exact McNemar"
    oa, ob = a.items.set_index("pair_id")["score"], b.items.set_index("pair_id")["score"].reindex(a.items["pair_id"])
    n01, n10 = int(((oa.values == 0) & (ob.values == 1)).sum()), int(((oa.values == 1) & (ob.values == 0)).sum())
    assert c.p_value == pytest.approx(binomtest(n01, n01 + n10, 0.5).pvalue if n01 + n10 else 1.0)
    assert c.delta_abs == pytest.approx(abs(b.value - 50) - abs(a.value - 50)) and np.isnan(c.ci_abs_low)
    lp = by.loc["lpbs"]
    assert lp.value_a == pytest.approx(runner.score(bert, "en/gender_math", "lpbs").value, abs=1e-9)
    assert lp.value_b == pytest.approx(runner.score(roberta, "en/gender_math", "lpbs").value, abs=1e-9)
    assert lp.n_items == 16 and 0 <= lp.p_value <= 1


def test_installed_version_is_the_projects():
    """The version in pyproject.toml is part of every task's ``audit.key`` through the installed
    metadata (``audit.provenance.code_version``): an editable install made before a version bump
    keeps the old version, and a resumed sweep would reuse results of the old statistics.
    Reinstall (``scripts/setup.sh``, or ``pip install -e .``) after changing it."""
    import re

    from audit.provenance import code_version

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r'^version = "([^"]+)"', text, re.MULTILINE).group(1)
    assert declared == "0.2.0"  # issue 15 changed intervals, random streams, SAME and roles
    assert code_version() == declared, f"installed biasaudit {code_version()} != pyproject {declared}: reinstall"
