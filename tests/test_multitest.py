"""Holm and Benjamini-Hochberg adjustment over families of tests (audit.multitest)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import false_discovery_control

from audit.errors import DataError, ParameterError
from audit.multitest import add_adjusted_pvalues, adjust_pvalues, benjamini_hochberg, holm

pytestmark = pytest.mark.unit


def _holm_by_hand(p):
    """Holm's step-down procedure written out: the adjusted p of the i-th smallest is the
    largest (m - j + 1) p_(j) over j <= i, capped at 1."""
    m = len(p)
    order = sorted(range(m), key=lambda i: (p[i], i))
    out = [0.0] * m
    for rank, i in enumerate(order):
        out[i] = min(1.0, max((m - j) * p[order[j]] for j in range(rank + 1)))
    return out


def test_holm_on_known_inputs():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.5, 0.5, 0.9]), [1.0, 1.0, 1.0])
    np.testing.assert_allclose(holm([0.2]), [0.2])
    np.testing.assert_allclose(holm([0.01, 0.01, 0.02]), [0.03, 0.03, 0.03])  # ties


def test_bh_on_known_inputs_and_scipy():
    # sorted 0.005, 0.01, 0.03, 0.04: m p / j = 0.02, 0.02, 0.04, 0.04 (running min from the top)
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03, 0.005]), [0.02, 0.04, 0.04, 0.02])
    p = np.random.default_rng(0).uniform(size=50) ** 3
    np.testing.assert_allclose(benjamini_hochberg(p), false_discovery_control(p, method="bh"), rtol=1e-15)
    # scipy's arithmetic step for step (audit.multitest): equal to the last bit, ties and ones included
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 10, 57, 200):
        q = np.round(rng.uniform(size=n) ** 3, int(rng.integers(1, 4)))
        np.testing.assert_array_equal(benjamini_hochberg(q), false_discovery_control(q, method="bh"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0), st.none(), st.just(float("nan"))), min_size=0, max_size=30))
def test_adjustments_against_references_with_missing_values(values):
    """Holm against the hand-written procedure and BH against scipy on the non-missing
    values; missing ones pass through as NaN and do not count in m."""
    h = holm(values)
    b = benjamini_hochberg(values)
    missing = np.array([v is None or np.isnan(v) for v in values], dtype=bool)
    assert np.isnan(h[missing]).all() and np.isnan(b[missing]).all()
    present = [v for v in values if v is not None and not np.isnan(v)]
    if present:
        np.testing.assert_allclose(h[~missing], _holm_by_hand(present), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(b[~missing], false_discovery_control(present, method="bh"), rtol=1e-12)
        raw = np.asarray(present)
        assert (h[~missing] >= raw - 1e-15).all() and (h[~missing] >= b[~missing] - 1e-15).all()
        assert (b[~missing] >= raw - 1e-15).all() and (h[~missing] <= 1.0).all()


def test_adjust_errors_name_the_entry():
    with pytest.raises(DataError, match="entry 1 is 1.5, outside"):
        holm([0.1, 1.5])
    with pytest.raises(DataError, match="entry 0 is not a number"):
        benjamini_hochberg(["low"])
    with pytest.raises(ParameterError, match="unknown p-value adjustment 'bonf'"):
        adjust_pvalues([0.1], "bonf")
    np.testing.assert_allclose(adjust_pvalues([0.1, 0.2], "holm"), [0.2, 0.2])


def _results():
    return pd.DataFrame({
        "model": ["m1"] * 4 + ["m2"] * 3,
        "metric": ["weat", "weat", "weat", "seat", "weat", "weat", "weat"],
        "test": ["weat1", "weat2", "weat3", "weat1", "weat1", "weat2", "weat3"],
        "p_value": [0.01, 0.04, None, 0.03, 0.005, np.nan, 0.5],
    }, index=[10, 11, 12, 13, 14, 15, 16])


def test_add_adjusted_pvalues_default_family_is_model_and_metric():
    df = _results()
    out = add_adjusted_pvalues(df)
    assert list(out.index) == list(df.index) and list(out.columns[:4]) == list(df.columns)
    assert df.columns.tolist() == ["model", "metric", "test", "p_value"]  # input untouched
    # family (m1, weat): 0.01, 0.04 (None passes through); (m1, seat): 0.03 alone; (m2, weat): 0.005, 0.5
    np.testing.assert_allclose(out["p_holm"], [0.02, 0.04, np.nan, 0.03, 0.01, np.nan, 0.5])
    np.testing.assert_allclose(out["p_bh"], [0.02, 0.04, np.nan, 0.03, 0.01, np.nan, 0.5])
    assert out["n_family"].tolist() == [2, 2, 2, 1, 2, 2, 2]
    pd.testing.assert_series_equal(out["p_value"], df["p_value"])  # raw column untouched


def test_add_adjusted_pvalues_other_families_and_errors():
    df = _results()
    one = add_adjusted_pvalues(df, family=())
    present = [0.01, 0.04, 0.03, 0.005, 0.5]
    np.testing.assert_allclose(one["p_holm"].dropna(), _holm_by_hand(present))
    np.testing.assert_allclose(one["p_bh"].dropna(), false_discovery_control(present, method="bh"))
    by_test = add_adjusted_pvalues(df, family=("test",), methods=("holm",))
    assert "p_bh" not in by_test.columns
    np.testing.assert_allclose(by_test["p_holm"], [0.02, 0.04, np.nan, 0.03, 0.015, np.nan, 0.5])
    with pytest.raises(ParameterError, match="lacks column.*language"):
        add_adjusted_pvalues(df, family=("model", "language"))
    with pytest.raises(ParameterError, match="unknown p-value adjustment"):
        add_adjusted_pvalues(df, methods=("fdr",))
    bad = df.assign(p_value=[0.1, 2.0, None, 0.1, 0.1, 0.1, 0.1])
    with pytest.raises(DataError, match="column 'p_value': entry 1 is 2.0"):
        add_adjusted_pvalues(bad)


# --------------------------------------------------------------------------------------
# The report level: jobs.report and the spec's multiple_comparisons
# --------------------------------------------------------------------------------------


def _sweep_rows():
    """Two models x two metrics x tests, a failed task, a metric without p-values, two
    parameter settings of one metric."""
    rng = np.random.default_rng(3)
    rows = []
    for model in ("glove", "fasttext"):
        for k in range(1, 8):
            rows.append({"model": model, "language": "en", "test": f"en/weat{k}", "metric": "weat",
                         "status": "finished", "value": float(rng.normal()), "p_value": float(rng.uniform() ** 4),
                         "params": '{"ddof": 1}', "ci_method": "targets", "key": f"{model}-w{k}"})
        rows.append({"model": model, "language": "de", "test": "de/cw1", "metric": "weat", "status": "failed",
                     "value": None, "p_value": None, "error": "CoverageError", "key": f"{model}-de"})
        for k in (1, 2, 3):
            rows.append({"model": model, "language": "en", "test": f"en/weat{k}", "metric": "seat",
                         "status": "finished", "value": 0.1 * k, "p_value": [0.004, 0.02, 0.3][k - 1] * (1 + (model == "glove")),
                         "params": '{"ddof": 0}', "key": f"{model}-s{k}"})
        rows.append({"model": model, "language": "en", "test": "en/weat7", "metric": "same", "status": "finished",
                     "value": 0.1, "p_value": None, "key": f"{model}-same"})
    return rows


def test_report_adjusts_per_family_against_scipy_and_hand_written_holm(tmp_path):
    from jobs import report
    from jobs.spec import MultipleComparisons

    df = report.results_frame(_sweep_rows())
    out = report.adjust_pvalues(df)
    for (model, metric), g in out.groupby(["model", "metric"]):
        ok = g[g["p_value"].notna()]
        if ok.empty:
            assert g["p_holm"].isna().all() and g["p_bh"].isna().all()
            continue
        p = ok["p_value"].tolist()
        np.testing.assert_allclose(ok["p_holm"], _holm_by_hand(p), rtol=1e-12)
        np.testing.assert_allclose(ok["p_bh"], false_discovery_control(p, method="bh"), rtol=1e-12)
        assert (ok["n_family"] == len(p)).all()
    failed = out[out["status"] == "failed"]
    assert failed["p_holm"].isna().all() and failed["p_bh"].isna().all()
    # known values: seat of fasttext 0.004, 0.02, 0.3 -> Holm 0.012, 0.04, 0.3; BH 0.012, 0.03, 0.3
    seat = out[(out["model"] == "fasttext") & (out["metric"] == "seat")]
    np.testing.assert_allclose(seat["p_holm"], [0.012, 0.04, 0.3])
    np.testing.assert_allclose(seat["p_bh"], [0.012, 0.03, 0.3])
    # another family: by test across models and metrics
    by_test = report.adjust_pvalues(df, MultipleComparisons(family=("test",)))
    g = by_test[(by_test["test"] == "en/weat1") & by_test["p_value"].notna()]
    np.testing.assert_allclose(g["p_holm"], _holm_by_hand(g["p_value"].tolist()), rtol=1e-12)
    assert (g["n_family"] == 4).all()

    # the Parquet table carries them; the LaTeX marks and the caption follow the spec
    report.write_reports(df, tmp_path / "holm")
    back = pd.read_parquet(tmp_path / "holm" / "results.parquet")
    np.testing.assert_allclose(back["p_holm"], out["p_holm"], equal_nan=True)
    np.testing.assert_allclose(back["p_bh"], out["p_bh"], equal_nan=True)
    tex = (tmp_path / "holm" / "tables" / "seat_en.tex").read_text()
    # fasttext seat marks: Holm 0.012 -> *, 0.04 -> *, 0.3 -> none (raw: 0.004 -> **)
    assert r"fasttext & 0.10$^{*}$ & 0.20$^{*}$ & 0.30 \\" in tex.splitlines()
    assert "Holm-adjusted p-values over all tests of one model and metric in the sweep" in tex
    weat_tex = (tmp_path / "holm" / "tables" / "weat_en.tex").read_text()
    assert r"ci\_method targets: percentile bootstrap of the target words" in weat_tex
    report.write_reports(df, tmp_path / "bh", multiple_comparisons=MultipleComparisons(marks="bh"))
    tex = (tmp_path / "bh" / "tables" / "seat_en.tex").read_text()
    assert r"fasttext & 0.10$^{*}$ & 0.20$^{*}$ & 0.30 \\" in tex.splitlines()
    assert "Benjamini-Hochberg-adjusted p-values" in tex
    report.write_reports(df, tmp_path / "raw", multiple_comparisons=MultipleComparisons(marks="raw"))
    tex = (tmp_path / "raw" / "tables" / "seat_en.tex").read_text()
    assert r"fasttext & 0.10$^{**}$ & 0.20$^{*}$ & 0.30 \\" in tex.splitlines() and "uncorrected p-values" in tex
    for d in ("holm", "bh", "raw"):
        assert (tmp_path / d / "plots" / "heatmap_seat_en.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("value,cls,msg", [
    ({"family": "model"}, DataError, "multiple_comparisons.family: expected a list of column names"),
    ({"family": ["model", "modle"]}, ParameterError,
     "multiple_comparisons.family[1]: unknown column 'modle' (did you mean 'model'?)"),
    ({"family": ["model", "model"]}, ParameterError, "multiple_comparisons.family: duplicate column"),
    ({"marks": "bonferroni"}, ParameterError, "multiple_comparisons.marks: unknown marks 'bonferroni'"),
    ({"method": "holm"}, DataError, "multiple_comparisons.method: unknown field"),
])
def test_spec_multiple_comparisons_errors_name_the_field(value, cls, msg):
    from jobs.spec import parse_spec

    base = {"name": "s", "models": ["glove-6b-50d"], "metrics": ["weat"], "multiple_comparisons": value}
    with pytest.raises(cls) as e:
        parse_spec(base, "s.yaml")
    assert str(e.value).startswith("s.yaml: ") and msg in str(e.value) and "\n" not in str(e.value)


def test_spec_multiple_comparisons_default_and_sweep_identity():
    from jobs.spec import MultipleComparisons, parse_spec

    base = {"name": "s", "models": ["glove-6b-50d"], "metrics": ["weat"]}
    s0 = parse_spec(base, "s.yaml")
    assert s0.multiple_comparisons == MultipleComparisons(family=("model", "metric"), marks="holm")
    s1 = parse_spec({**base, "multiple_comparisons": {"family": [], "marks": "raw"}, "tags": {"team": "nlp"}}, "s.yaml")
    assert s1.multiple_comparisons == MultipleComparisons(family=(), marks="raw") and s1.tags == {"team": "nlp"}
    assert s0.sweep_id() == s1.sweep_id()  # how a sweep is reported does not change its tasks
    with pytest.raises(ParameterError, match="tags.audit.key: tags starting with 'audit.' are set by biasaudit"):
        parse_spec({**base, "tags": {"audit.key": "x"}}, "s.yaml")


def test_audit_table_shows_holm_over_its_tests_and_the_interval_method(tmp_path, capsys):
    from audit import cli, runner
    from test_regression import planted_models, write_w2v

    vec = write_w2v(tmp_path / "m.vec", planted_models(seed=4)[0])
    assert cli.main(["table", "--model", vec, "--test", "weat1", "weat7", "--metric", "weat"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "p Holm: Holm-adjusted over the 2 p-value(s) of this table; CI targets: percentile bootstrap" in lines[0]
    assert lines[2] == "| test | language | value | p-value (method) | p Holm | 95% CI (targets) | coverage | missing |"
    raw = [runner.score(vec, t, "weat", seed=0).fields["p_value"] for t in ("weat1", "weat7")]
    cells = [ln.split(" | ") for ln in lines[4:6]]
    assert [c[0] for c in cells] == ["| en/weat1", "| en/weat7"]
    assert [c[4] for c in cells] == [f"{x:.3g}" for x in _holm_by_hand(raw)]
    assert [c[3].split(" ")[0] for c in cells] == [f"{x:.3g}" for x in raw]


def test_one_wrapper_adjusts_the_selected_rows_for_reports_and_comparisons():
    """jobs.report.adjust_pvalues (finished tasks) and audit.regression.adjust (compared tests)
    are both audit.multitest.adjust_rows: Holm/BH over the selected rows per family only."""
    import pandas as pd

    from audit import multitest, regression
    from jobs import report

    p = [0.01, 0.04, 0.03, None, 0.2]
    df = pd.DataFrame({"model": ["m"] * 5, "metric": ["weat"] * 5, "test": list("abcde"), "p_value": p,
                       "status": ["finished", "finished", "failed", "finished", "finished"]})
    out = multitest.adjust_rows(df, (df["status"] == "finished").to_numpy())
    # family: the finished rows with a p-value (0.01, 0.04, 0.2): Holm 0.03, 0.08, 0.2
    np.testing.assert_allclose(out["p_holm"].to_numpy(), [0.03, 0.08, np.nan, np.nan, 0.2])
    np.testing.assert_allclose(out["n_family"].to_numpy(), [3, 3, np.nan, 3, 3])
    pd.testing.assert_frame_equal(report.adjust_pvalues(df), out)
    cmp = df.assign(status=df["status"].replace({"finished": "compared", "failed": "skipped"}))
    reg = regression.adjust(cmp.drop(columns=["model"]), family=("metric",))
    np.testing.assert_allclose(reg["p_holm"].to_numpy(), [0.03, 0.08, np.nan, np.nan, 0.2])
    assert reg["n_family"].tolist() == [3, 3, 0, 3, 3]
