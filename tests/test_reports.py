"""Sweep reports: Parquet table, booktabs LaTeX with significance marks, plots, summary."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from jobs import report
from jobs.spec import MultipleComparisons

pytestmark = pytest.mark.unit

ROWS = [
    {"model": "glove_6b", "language": "en", "test": "en/weat1", "metric": "weat", "status": "finished",
     "value": 1.5312, "effect_size": 1.5312, "p_value": 0.0004, "ci_low": 1.1, "ci_high": 1.8, "key": "a"},
    {"model": "glove_6b", "language": "en", "test": "en/weat2", "metric": "weat", "status": "finished",
     "value": -0.25, "effect_size": -0.25, "p_value": 0.30, "ci_low": -0.7, "ci_high": 0.2, "key": "b"},
    {"model": "minilm", "language": "en", "test": "en/weat1", "metric": "weat", "status": "finished",
     "value": 0.61, "effect_size": 0.61, "p_value": 0.03, "ci_low": None, "ci_high": None, "key": "c"},
    {"model": "minilm", "language": "en", "test": "en/weat2", "metric": "weat", "status": "failed",
     "value": None, "error": "CoverageError: set 'weapons' lost 40%", "key": "d"},
    {"model": "minilm", "language": "en", "test": "en/weat10", "metric": "weat", "status": "finished",
     "value": 0.2, "p_value": 0.008, "key": "e"},
    {"model": "minilm", "language": "en", "test": "en/weat1", "metric": "same", "status": "finished",
     "value": 0.12, "key": "f"},
]


@pytest.fixture()
def df():
    return report.results_frame(ROWS)


def test_significance_marks():
    assert [report.significance_mark(p) for p in (0.0004, 0.001, 0.009, 0.049, 0.05, None, math.nan)] == [
        "***", "**", "**", "*", "", "", ""]


def test_latex_table_is_booktabs_with_marks_escapes_and_failures(df):
    tex = report.latex_table(df, "weat", "en", model_order=["glove_6b", "minilm"])
    lines = tex.splitlines()
    assert r"\toprule" in lines and r"\midrule" in lines and r"\bottomrule" in lines
    assert r"\begin{tabular}{lrrr}" in lines
    # natural test order (weat2 before weat10) and the language prefix dropped in the header
    assert "Model & weat1 & weat2 & weat10 \\\\" in lines
    # marks from Holm-adjusted p-values, family model x metric: glove 0.0004, 0.30 -> 0.0008, 0.30;
    # minilm 0.03, (failed), 0.008 -> 0.03, 0.016
    assert r"glove\_6b & 1.53$^{***}$ & $-$0.25 &  \\" in lines
    assert r"minilm & 0.61$^{*}$ & \textit{fail} & 0.20$^{*}$ \\" in lines
    assert r"\label{tab:weat-en}" in lines
    assert ("(Holm-adjusted p-values over all tests of one model and metric in the sweep); "
            r"\textit{fail}") in tex
    # raw marks on request; the caption says so
    raw = report.latex_table(df, "weat", "en", model_order=["glove_6b", "minilm"],
                             multiple_comparisons=MultipleComparisons(marks="raw"))
    assert r"minilm & 0.61$^{*}$ & \textit{fail} & 0.20$^{**}$ \\" in raw.splitlines()
    assert "(uncorrected p-values)" in raw
    # one family for the whole sweep: 0.0004, 0.008, 0.03, 0.30 -> Holm 0.0016, 0.024, 0.06, 0.30
    one = report.latex_table(df, "weat", "en", multiple_comparisons=MultipleComparisons(family=()))
    assert r"minilm & 0.61 & \textit{fail} & 0.20$^{*}$ \\" in one.splitlines()
    assert "(Holm-adjusted p-values over all tests of the sweep)" in one


def test_write_reports_files(df, tmp_path):
    written = report.write_reports(df, tmp_path, model_order=["glove_6b", "minilm"])
    names = {p.relative_to(tmp_path).as_posix() for p in written}
    assert names == {"results.parquet", "tables/weat_en.tex", "tables/same_en.tex", "plots/effects_weat_en.png",
                     "plots/heatmap_weat_en.png", "plots/effects_same_en.png", "plots/heatmap_same_en.png"}
    back = pd.read_parquet(tmp_path / "results.parquet")
    assert len(back) == len(ROWS) and list(back.columns[:6]) == ["model", "language", "test", "metric", "status", "value"]
    assert back.loc[0, "p_value"] == pytest.approx(0.0004) and math.isnan(back.loc[3, "value"])
    for png in tmp_path.glob("plots/*.png"):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_the_report_step_loads_neither_scipy_nor_sklearn(tmp_path):
    """A sweep's driver ends with the adjusted p-values, the report files and the summary; none of
    them imports scipy or sklearn (``scipy.stats`` for Benjamini-Hochberg alone cost every driver
    ~1.1 CPU-seconds; audit.multitest). In a fresh process, so that no other test's imports count."""
    code = ("import sys; from jobs import report; from tests.test_reports import ROWS; "
            "df = report.adjust_pvalues(report.results_frame(ROWS)); "
            f"report.write_reports(df, {str(tmp_path)!r}); report.summary_table(df); "
            "assert {'p_holm', 'p_bh'} <= set(df.columns) and df['p_bh'].notna().sum() == 4, df; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'sklearn'})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == [], f"the report step loads {p.stdout.strip()}"
    assert (tmp_path / "plots" / "effects_weat_en.png").is_file()


def test_summary_lists_counts_and_failure_reasons(df):
    s = report.summary_table(df)
    assert "failed" in s and "finished" in s
    assert "minilm | en | en/weat2 | weat: CoverageError: set 'weapons' lost 40%" in s
    assert report.summary_table(report.results_frame([])) == "no tasks"


def test_latex_escape():
    assert report.latex_escape("a_b & 50% #1 {x}") == r"a\_b \& 50\% \#1 \{x\}"


def test_summary_headline_values_model_by_test_with_marks(df):
    s = report.summary_table(df, model_order=["glove_6b", "minilm"])
    lines = s.splitlines()
    note = "Holm-adjusted p-values over all tests of one model and metric in the sweep"
    i = lines.index(f"weat (en): headline value per model and test; * p<0.05, ** p<0.01, *** p<0.001 ({note})")
    assert lines[i + 1].split() == ["weat1", "weat2", "weat10"]  # natural order, language prefix dropped
    assert lines[i + 3].split() == ["glove_6b", "1.531***", "-0.250"]
    assert lines[i + 4].split() == ["minilm", "0.610*", "fail", "0.200*"]
    j = lines.index(f"same (en): headline value per model and test; * p<0.05, ** p<0.01, *** p<0.001 ({note})")
    assert lines[j + 3].split() == ["minilm", "0.120"]
    # wide tables are split into blocks of at most max_columns tests
    wide = report.results_frame([{"model": "m", "language": "en", "test": f"en/t{k}", "metric": "weat",
                                  "status": "finished", "value": k / 10, "p_value": 0.5} for k in range(11)])
    text = report.headline_tables(wide, max_columns=4)
    assert [ln.split() for ln in text.splitlines() if ln.startswith("  ")] == [
        ["t0", "t1", "t2", "t3"], ["t4", "t5", "t6", "t7"], ["t8", "t9", "t10"]]


def test_summary_lists_each_distinct_failure_once_with_its_count():
    rows = [{"model": "bert", "language": "en", "test": f"en/weat{k}", "metric": "seat", "status": "failed",
             "error": "model 'x' could not be loaded: ModelError: no weights"} for k in (1, 2, 6, 7, 8)]
    rows += [{"model": "ft", "language": "en", "test": "en/weat1", "metric": "weat", "status": "failed",
              "error": "CoverageError: lost 40%"},
             {"model": "ft", "language": "en", "test": "en/weat2", "metric": "weat", "status": "finished", "value": 0.5}]
    s = report.summary_table(report.results_frame(rows))
    assert "6 failed task(s), 2 distinct failure(s):" in s
    assert ("  bert: 5 tasks (en/weat1 seat, en/weat2 seat, en/weat6 seat, +2 more): "
            "model 'x' could not be loaded: ModelError: no weights") in s
    assert s.count("could not be loaded") == 1
    assert "  ft | en | en/weat1 | weat: CoverageError: lost 40%" in s


def test_breakdowns_by_category_from_the_registry(tmp_path):
    """A metric whose registry entry declares breakdowns (BBQ: per category) gets a model x
    category LaTeX table per score and a bar plot, from the flattened numbers of its MLflow rows."""
    import json as _json

    from audit.result import Result
    from jobs.report import breakdown_frame, results_frame, write_breakdowns
    from jobs.tracker import _row, result_metrics

    def row(model, s_amb_age, lo, hi, test="en/bbq"):
        res = Result(metric="bbq", value=0.1, items=None, coverage={}, missing={}, params={}, seed=0, provenance={},
                     fields={"per_category": {"Age": {"s_amb": s_amb_age, "s_dis": 0.5, "ci": {"s_amb": [lo, hi]}},
                                              "Religion": {"s_amb": -0.25, "s_dis": 0.0}}})
        tags = {"audit.model": model, "audit.language": "en", "audit.test": test, "audit.metric": "bbq",
                "audit.status": "finished"}
        return _row(tags, {}, result_metrics(res), None)

    # a second test of the same metric in the same language gets its own table, never mixed in
    df = results_frame([row("m1", 0.125, 0.05, 0.2), row("m2", -0.5, -0.7, -0.3),
                        row("m1", 0.75, 0.7, 0.8, test="en/bbq_other"), row("m2", 0.5, 0.4, 0.6, test="en/bbq_other")])
    assert _json.loads(df["breakdowns"][0])["per_category.Age.ci.s_amb_low"] == 0.05
    bd = breakdown_frame(df, "bbq", "per_category", ["s_amb", "s_dis"])
    age = bd[(bd.category == "Age") & (bd.score == "s_amb") & (bd.test == "en/bbq")].set_index("model")
    assert age.loc["m1", "value"] == 0.125 and (age.loc["m2", "low"], age.loc["m2", "high"]) == (-0.7, -0.3)
    (tmp_path / "tables").mkdir()
    (tmp_path / "plots").mkdir()
    paths = {p.name for p in write_breakdowns(df, tmp_path, model_order=["m2", "m1"])}
    assert {"bbq_en_bbq_per_category_s_amb.tex", "bbq_en_bbq_per_category_s_dis.tex",
            "bbq_en_bbq_per_category_s_amb.png", "bbq_en_bbq_other_per_category_s_amb.tex",
            "bbq_en_bbq_other_per_category_s_amb.png", "breakdowns.parquet"} <= paths
    tex = (tmp_path / "tables" / "bbq_en_bbq_per_category_s_amb.tex").read_text()
    assert "model & Age & Religion" in tex and "m1 & 0.125 [0.05, 0.20] & -0.250" in tex
    assert tex.index("m2 &") < tex.index("m1 &")
    other = (tmp_path / "tables" / "bbq_en_bbq_other_per_category_s_amb.tex").read_text()
    assert "m1 & 0.750 [0.70, 0.80]" in other and "0.125" not in other
