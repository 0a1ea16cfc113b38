"""Reports that cannot mislead and that scale: one name per measurement (masked vs causal),
breakdowns with n and intervals, bounded plots at ~200 models, collapsed summaries."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from actors.stats import TaskOutcome
from audit.metrics.crows_pairs import crows_pairs_metric
from audit.result import Result
from jobs import report
from jobs.plan import Task
from jobs.spec import ModelSpec
from jobs.tracker import _row, result_metrics, task_record


def _pairs(variant: str, disability_won: int) -> pd.DataFrame:
    """A CrowS-Pairs score table: 2 disability pairs (``disability_won`` won by the more
    stereotypical sentence), 6 race-color pairs (4 won)."""
    rows = []
    for i in range(2):
        more = 1.0 if i < disability_won else -1.0
        rows.append(("disability", more, 0.0))
    for i in range(6):
        rows.append(("race-color", 1.0 if i < 4 else -1.0, 0.0))
    return pd.DataFrame({"bias_type": [r[0] for r in rows], "sent_more_score": [r[1] for r in rows],
                         "sent_less_score": [r[2] for r in rows], "stereo_antistereo": "stereo",
                         "variant": variant})


def _crows_row(model: str, metric: str, variant: str, disability_won: int) -> dict:
    out = crows_pairs_metric(_pairs(variant, disability_won))
    res = Result(metric=metric, value=out.value, fields=out.fields, items=None, coverage={}, missing={}, params={},
                 seed=0, provenance={})
    tags = {"audit.model": model, "audit.language": "en", "audit.test": "en/crows_pairs", "audit.metric": metric,
            "audit.status": "finished"}
    return _row(tags, {"metric": metric, "ci_method": "wilson"}, result_metrics(res), None)


@pytest.mark.unit
def test_masked_and_causal_crows_pairs_are_separate_breakdowns_with_n_and_wilson_intervals(tmp_path):
    """A sweep with a masked LM (pseudo-log-likelihood, ``crows_pairs``) and a causal LM
    (log-likelihood, ``crows_pairs_causal``): each measurement gets its own tables, plots and
    Parquet rows; every category carries n and the Wilson interval of ``results.parquet``
    (disability: n = 2, 0 of 2 won: [0, 65.76]). Before, both models shared one ``crows_pairs``
    table and the intervals and n were lost."""
    df = report.results_frame([_crows_row("tiny-bert", "crows_pairs", "masked_pll", 0),
                               _crows_row("tiny-gpt2", "crows_pairs_causal", "causal_ll", 1)])
    (tmp_path / "tables").mkdir()
    (tmp_path / "plots").mkdir()
    names = {p.name for p in report.write_breakdowns(df, tmp_path)}
    assert {"crows_pairs_en_crows_pairs_per_bias_type_metric_score.tex",
            "crows_pairs_causal_en_crows_pairs_per_bias_type_metric_score.tex",
            "crows_pairs_en_crows_pairs_per_bias_type_metric_score.png",
            "crows_pairs_causal_en_crows_pairs_per_bias_type_metric_score.png"} <= names
    bd = pd.read_parquet(tmp_path / "breakdowns.parquet")
    assert bd.groupby("metric")["model"].unique().map(list).to_dict() == {
        "crows_pairs": ["tiny-bert"], "crows_pairs_causal": ["tiny-gpt2"]}
    dis = bd[(bd.category == "disability") & (bd.score == "metric_score")].set_index("metric")
    assert dis.loc["crows_pairs", "n"] == 2 and dis.loc["crows_pairs", "value"] == 0.0
    assert dis.loc["crows_pairs", "low"] == pytest.approx(0.0, abs=1e-9)
    assert dis.loc["crows_pairs", "high"] == pytest.approx(65.7628, abs=1e-3)  # Wilson, 0 of 2, 95 %
    w = binomtest(1, 2).proportion_ci(method="wilson")
    assert (dis.loc["crows_pairs_causal", "low"], dis.loc["crows_pairs_causal", "high"]) == pytest.approx(
        (100 * w.low, 100 * w.high))
    rc = bd[(bd.category == "race-color") & (bd.score == "metric_score")]
    assert set(rc["n"]) == {6.0}
    # stereo_score has no interval of its own: NaN, never the headline's interval
    assert bd[bd.score == "stereo_score"][["low", "high"]].isna().all().all()
    masked = (tmp_path / "tables" / "crows_pairs_en_crows_pairs_per_bias_type_metric_score.tex").read_text()
    assert "disability (n=2)" in masked and "0.000 [0.00, 65.76] n=2" in masked and "tiny-gpt2" not in masked
    assert "wilson confidence interval" in masked
    causal = (tmp_path / "tables" / "crows_pairs_causal_en_crows_pairs_per_bias_type_metric_score.tex").read_text()
    assert "50.000 [9.45, 90.55] n=2" in causal and "tiny-bert" not in causal


@pytest.mark.unit
def test_a_causal_child_run_is_named_by_its_measurement():
    """Run name, ``params.metric`` and the ``audit.metric`` tag say ``crows_pairs_causal`` for
    a causal LM (the run name said ``crows_pairs``)."""
    task = Task(model="tiny-gpt2", language="en", test="en/crows_pairs", metric="crows_pairs", params={})
    rec = task_record(task, sweep="s", model_spec=ModelSpec(ref="hf:tiny-gpt2", name="tiny-gpt2"), kind="causal",
                      plan_key="k", outcome=TaskOutcome(index=0, status="failed", error="boom"))
    assert rec["run_name"] == "tiny-gpt2/en/crows_pairs/crows_pairs_causal"
    assert rec["params"]["metric"] == rec["tags"]["audit.metric"] == "crows_pairs_causal"


@pytest.mark.unit
def test_a_child_run_says_where_its_numbers_came_from():
    """The device and dtype a Hugging Face model was loaded with (its ``describe()``) are tags of
    each child run (``audit.device``, ``audit.dtype``; a device map too): never keyed, they tell a
    GPU sweep's runs from a CPU one's. A static model has none, and a failed load records none."""
    task = Task(model="m", language="en", test="en/crows_pairs", metric="crows_pairs", params={})
    spec = ModelSpec(ref="hf:m", name="m")
    desc = {"model": "hf:m", "backend": "hf-causal", "revision": "abc", "kind": "causal", "dtype": "bfloat16",
            "device": "cuda:0"}
    rec = task_record(task, sweep="s", model_spec=spec, kind="causal", plan_key="k",
                      outcome=TaskOutcome(index=0, status="failed", error="boom", model=desc))
    assert (rec["tags"]["audit.device"], rec["tags"]["audit.dtype"]) == ("cuda:0", "bfloat16")
    assert "audit.device_map" not in rec["tags"]
    rec = task_record(task, sweep="s", model_spec=spec, kind="causal", plan_key="k",
                      outcome=TaskOutcome(index=0, status="failed", error="boom",
                                          model={**desc, "device_map": "auto"}))
    assert rec["tags"]["audit.device_map"] == "auto"
    static = {"model": "v.vec", "backend": "word2vec-text", "revision": "sha256:1", "kind": "static"}
    for model in (static, None):
        rec = task_record(task, sweep="s", model_spec=spec, kind="static", plan_key="k",
                          outcome=TaskOutcome(index=0, status="failed", error="boom", model=model))
        assert not {"audit.device", "audit.dtype", "audit.device_map"} & set(rec["tags"]), rec["tags"]


@pytest.mark.unit
def test_child_runs_carry_adjusted_p_values_with_their_family_and_settings_as_params(tmp_path):
    """Metrics are the numbers a user compares: the seeds, classifier seeds, bootstrap size and
    confidence level of a result are params ``result.<name>``, not metrics; once the report is
    built each finished child run gets ``p_holm``/``p_bh``/``n_family`` and tags naming the
    family and the methods (Holm over p = 0.02, 0.03: 0.04, 0.04; BH: 0.03, 0.03)."""
    from jobs.tracker import P_ADJUST_FAMILY_TAG, P_ADJUST_METHODS_TAG, Tracker, record_row, result_settings

    fields = {"effect_size": 0.5, "seed": 7, "classifier_seeds": [11, 12, 13], "n_bootstrap": 100,
              "confidence": 0.95, "permutation": {"n_extreme": 3, "seed": 7},
              "per_bias_type": {"age": {"metric_score": 60.0, "confidence": 0.95}}}
    res = Result(metric="weat", value=0.5, fields=fields, items=None, coverage={}, missing={}, params={}, seed=7,
                 provenance={"key": "k"})
    m = result_metrics(res)
    assert not [k for k in m if "seed" in k or "confidence" in k or "n_bootstrap" in k], sorted(m)
    assert m["per_bias_type.age.metric_score"] == 60.0 and m["permutation.n_extreme"] == 3.0
    assert result_settings(res) == {"result.seed": "7", "result.classifier_seeds": "[11, 12, 13]",
                                    "result.n_bootstrap": "100", "result.confidence": "0.95"}
    tr = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "exp-adjusted")
    tr.start_parent("s", "sid")
    rows = []
    for i, p in enumerate((0.02, 0.03)):
        r = Result(metric="weat", value=0.5, fields={**fields, "p_value": p}, items=None, coverage={}, missing={},
                   params={}, seed=7, provenance={"key": f"k{i}"})
        task = Task(model="m", language="en", test=f"en/weat{i + 1}", metric="weat", params={}, key=f"k{i}")
        rec = task_record(task, sweep="s", model_spec=ModelSpec(ref="x.vec", name="m"), kind="static",
                          plan_key=f"k{i}", outcome=TaskOutcome(index=i, status="finished", result=r,
                                                                model={"kind": "static", "backend": "b"}))
        assert rec["params"]["result.classifier_seeds"] == "[11, 12, 13]" and "seed" not in rec["metrics"]
        rows.append(record_row(rec, tr.log_record(rec)))
    df = report.adjust_pvalues(report.results_frame(rows))
    assert tr.log_adjusted(df, ("model", "metric")) == 2
    assert tr.log_adjusted(df, ("model", "metric")) == 0  # unchanged: nothing written again
    # the runs the caller searched already (the sweep's report): the same decisions, no search of its own
    assert tr.log_adjusted(df, ("model", "metric"), runs=tr.task_runs()) == 0
    assert tr.log_adjusted(df, ("model", "metric"), runs=[]) == 2  # none known: written again
    got = [tr.client.get_run(r) for r in df["run_id"]]
    assert [g.data.metrics["p_holm"] for g in got] == pytest.approx([0.04, 0.04])
    assert [g.data.metrics["p_bh"] for g in got] == pytest.approx([0.03, 0.03])
    assert [g.data.metrics["n_family"] for g in got] == [2.0, 2.0]
    assert {(g.data.tags[P_ADJUST_FAMILY_TAG], g.data.tags[P_ADJUST_METHODS_TAG]) for g in got} == {
        ("model,metric", "holm,bh")}


# --------------------------------------------------------------------------------------
# 192 models: bounded, readable plots without warnings, collapsed summaries
# --------------------------------------------------------------------------------------

N_MODELS = 192
MAX_PX = 2600  # every figure at most this many pixels wide and high


def _synthetic_sweep(n_models: int = N_MODELS) -> pd.DataFrame:
    """Results of ``n_models`` models (half masked, half causal LMs): WEAT 1-10 with bootstrap
    intervals, CrowS-Pairs per bias type (9 types, Wilson intervals, n) under each
    measurement's own name. A copy of the one frame built per size (:func:`_built_sweep`: the
    same seed, so the same numbers; the 192-model frame's 1,728 Wilson intervals took 0.9
    CPU-seconds, and two tests read it), which a test may change freely."""
    return _built_sweep(n_models).copy()


def _wilson_95(won: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of ``won`` of ``n``: scipy's own arithmetic behind
    ``binomtest(won, n).proportion_ci(method="wilson")`` (``_binom_wilson_conf_int``, Newcombe 1998),
    called without the two-sided p-value ``binomtest`` computes first (the frames of 3, 24, 50, 60
    and 192 models: 2.2 CPU-seconds with ``binomtest``, 0.1 this way; the same floats)."""
    from scipy.stats._binomtest import _binom_wilson_conf_int

    return _binom_wilson_conf_int(won, n, 0.95, "two-sided", False)


@functools.cache
def _built_sweep(n_models: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    types = ["age", "disability", "gender", "nationality", "physical-appearance", "race-color", "religion",
             "sexual-orientation", "socioeconomic"]
    n_pairs = dict(zip(types, (87, 2, 262, 159, 63, 516, 105, 84, 172)))
    rows = []
    for i in range(n_models):
        model = f"tiny-{i}"
        for k in range(1, 11):
            d = float(rng.normal(0.3, 0.5))
            rows.append({"model": model, "language": "en", "test": f"en/weat{k}", "metric": "weat",
                         "status": "finished", "value": d, "effect_size": d, "p_value": float(rng.uniform(0, 0.2)),
                         "ci_low": d - 0.4, "ci_high": d + 0.4, "n_items": 16, "ci_method": "targets"})
        metric = "crows_pairs" if i % 2 == 0 else "crows_pairs_causal"
        nums = {}
        for t in types:
            won = int(rng.integers(0, n_pairs[t] + 1))
            low, high = _wilson_95(won, n_pairs[t])
            nums.update({f"per_bias_type.{t}.metric_score": 100 * won / n_pairs[t],
                         f"per_bias_type.{t}.stereo_score": 100 * won / n_pairs[t],
                         f"per_bias_type.{t}.ci_low": 100 * low, f"per_bias_type.{t}.ci_high": 100 * high,
                         f"per_bias_type.{t}.n_pairs": n_pairs[t]})
        rows.append({"model": model, "language": "en", "test": "en/crows_pairs", "metric": metric,
                     "status": "finished", "value": float(rng.uniform(40, 70)), "p_value": 0.01, "ci_low": 40.0,
                     "ci_high": 70.0, "n_items": 1508, "ci_method": "wilson", "breakdowns": json.dumps(nums)})
    return report.results_frame(rows)


@pytest.mark.unit
def test_reports_of_192_models_have_bounded_plots_and_no_warnings(tmp_path, layouts_checked):
    """Every plot of a 192-model sweep fits in MAX_PX x MAX_PX pixels (the CrowS-Pairs per-bias
    -type PNG was 114,268 px wide), draws no legend over the data (models are the rows), keeps
    its labels inside and apart (:func:`_check_forest_layout`, :func:`_check_heatmap_layout`: every
    figure), and rendering raises no warning
    (matplotlib's "constrained_layout not applied" from 48 models)."""
    from PIL import Image

    df = _synthetic_sweep()
    df.loc[df["model"] == "tiny-1", "model"] = LONG_NAME
    order = [LONG_NAME if i == 1 else f"tiny-{i}" for i in range(N_MODELS)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = report.write_reports(df, tmp_path, model_order=order, mitigations={})
    assert [str(w.message) for w in caught] == []
    pngs = sorted(p for p in written if p.suffix == ".png")
    sizes, levels = {}, {}
    for p in pngs:  # each file opened and decoded once: its size, and the grey levels its pixels take
        with Image.open(p) as im:
            sizes[p.name] = im.size
            levels[p.name] = sum(1 for count in im.convert("L").histogram() if count)
    assert max(w for w, _ in sizes.values()) <= MAX_PX and max(h for _, h in sizes.values()) <= MAX_PX, sizes
    # 192 models in files of at most 50: 4 files per WEAT plot, 2 per CrowS-Pairs measurement (96 models each)
    assert [n for n in sizes if n.startswith("effects_weat_en")] == [f"effects_weat_en_{i}of4.png" for i in range(1, 5)]
    assert {n for n in sizes if "per_bias_type" in n} == {
        f"{m}_en_crows_pairs_per_bias_type_metric_score_{i}of2.png" for m in ("crows_pairs", "crows_pairs_causal")
        for i in (1, 2)}
    for p in pngs:  # not blank: the figure drew something (more than 10 distinct grey levels)
        assert levels[p.name] > 10, p.name
    assert len(layouts_checked) == len(pngs)


def _overlaps(a, b, tol: float = 0.5) -> bool:
    return a.x0 < b.x1 - tol and b.x0 < a.x1 - tol and a.y0 < b.y1 - tol and b.y0 < a.y1 - tol


def _assert_inside(boxes, box) -> None:
    """Each of ``boxes`` lies inside the figure's ``box`` (within half a pixel)."""
    for b in boxes:
        assert b.x0 >= -0.5 and b.y0 >= -0.5 and b.x1 <= box.x1 + 0.5 and b.y1 <= box.y1 + 0.5, (b, box)


def _check_forest_layout(fig) -> bool:
    """In a dot-and-interval figure (placed by ``report._forest_layout``, not by a layout engine):
    each panel with its title and tick labels, the figure title and the x label lie inside the
    figure, and none of them overlaps another. Returns whether ``fig`` is such a figure."""
    if fig._supxlabel is None:  # a heat map
        return False
    r = fig.canvas.get_renderer()
    box = fig.bbox
    parts = [ax.get_tightbbox(r) for ax in fig.axes if ax.get_visible()]
    parts += [fig._suptitle.get_window_extent(r), fig._supxlabel.get_window_extent(r)]
    _assert_inside(parts, box)
    for i, a in enumerate(parts):
        for b in parts[i + 1:]:
            assert not _overlaps(a, b), (a, b)
    return True


def _check_heatmap_layout(fig) -> bool:
    """In a heat map (placed by ``report._heatmap_layout``, not by a layout engine): the map with
    its title, tick labels and footnote, and the colour bar with its tick labels, lie inside the
    figure and apart; the map is wider and taller than its labels' margins (at least 1 inch by
    0.5). Returns whether ``fig`` is such a figure."""
    if fig._supxlabel is not None or len(fig.axes) != 2:
        return False
    r = fig.canvas.get_renderer()
    box = fig.bbox
    ax, cax = fig.axes
    # the map's parts: the cells, the test labels with the footnote below them, the model labels, the title
    xaxis, yaxis, title = ax.xaxis.get_tightbbox(r), ax.yaxis.get_tightbbox(r), ax.title.get_window_extent(r)
    bar = cax.get_tightbbox(r)
    _assert_inside((ax.bbox, xaxis, yaxis, title, bar), box)
    for a, b in ((bar, ax.bbox), (bar, xaxis), (bar, yaxis), (bar, title), (title, xaxis), (title, yaxis)):
        assert not _overlaps(a, b), (a, b)
    assert ax.bbox.width >= fig.dpi and ax.bbox.height >= 0.5 * fig.dpi, ax.bbox
    return True


@pytest.fixture
def layouts_checked(monkeypatch):
    """Every figure the reports close is checked first (:func:`_check_forest_layout`,
    :func:`_check_heatmap_layout`); yields the list of the figures checked (one entry each)."""
    import matplotlib.pyplot as plt

    checked = []
    close = plt.close

    def check_then_close(fig=None):
        if fig is not None and (_check_forest_layout(fig) or _check_heatmap_layout(fig)):
            checked.append(fig.number)
        close(fig)

    monkeypatch.setattr(plt, "close", check_then_close)
    return checked


LONG_NAME = "a-very-long-model-name/with-an-org-prefix-and-revision-0123456789"


@pytest.mark.unit
@pytest.mark.parametrize("n_models", [3, 50])
def test_plots_keep_every_label_inside_the_figure_and_apart(tmp_path, layouts_checked, n_models):
    """:func:`_check_forest_layout` and :func:`_check_heatmap_layout` on a long model name, a title
    wrapped over lines, one row of panels and two (the 192-model sweep: the test above); no
    warning either: the heat maps make room for the long name (with 3 models its one-test maps
    had collapsed under matplotlib's constrained layout, "constrained_layout not applied", the
    name and the footnote cut off)."""
    df = _synthetic_sweep(n_models)
    df.loc[df["model"] == "tiny-1", "model"] = LONG_NAME
    order = [LONG_NAME if i == 1 else f"tiny-{i}" for i in range(n_models)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = report.write_reports(df, tmp_path, model_order=order, mitigations={})
    assert [str(w.message) for w in caught] == []
    assert len(layouts_checked) == sum(1 for p in written if p.suffix == ".png")


@pytest.fixture
def figures_closed(monkeypatch):
    """The figures the plotting functions close (``plt.close(fig)``), kept open for inspection."""
    import matplotlib.pyplot as plt

    seen = []
    close = plt.close

    def keep(fig=None):
        seen.append(fig)

    monkeypatch.setattr(plt, "close", keep)
    yield seen
    for fig in seen:
        close(fig)


def _texts_outside(fig) -> list[str]:
    """The visible texts of ``fig`` (titles, tick labels, legend entries) that reach past its edges."""
    from matplotlib.text import Text

    r = fig.canvas.get_renderer()
    box = fig.bbox
    out = []
    for t in fig.findobj(Text):
        if t.get_visible() and t.get_text().strip() and t.get_figure(root=True) is fig:
            b = t.get_window_extent(r)
            if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > box.x1 + 0.5 or b.y1 > box.y1 + 0.5:
                out.append(t.get_text())
    return out


@pytest.mark.unit
def test_before_after_and_comparison_plots_make_room_for_long_names(tmp_path, figures_closed):
    """A before/after plot of a debiased copy with a long name, and the watcher's comparison of two
    revisions of a long-named model on a long-named test: no warning, every text inside the figure
    and the legend beside the axes. Before, the before/after axes collapsed (matplotlib's
    "constrained_layout not applied"), and the comparison's title ran past both edges and its
    legend sat on the data and the axis label."""
    ba = pd.DataFrame([{"model": LONG_NAME + "-hard-debiased", "metric": "weat", "language": "en",
                        "test": "en/weat7", "value_before": 0.5, "value_after": 0.1}])
    table = pd.DataFrame([{"status": "compared", "baseline": "v1", "language": "en",
                           "test": "a-long-test-name_revised_variant", "metric": "crows_pairs_causal",
                           "value_a": 0.5, "value_b": 0.6, "ci_a_low": 0.4, "ci_a_high": 0.6, "ci_b_low": 0.5,
                           "ci_b_high": 0.7, "regression": True}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report._plot_before_after(ba, "weat", "en", tmp_path / "ba.png")
        report.plot_comparison(table, tmp_path / "cmp.png", title=f"weat: {LONG_NAME} against its baseline release",
                               new_label=LONG_NAME, baseline_label=lambda b: f"baseline {LONG_NAME}")
    assert [str(w.message) for w in caught] == []
    assert len(figures_closed) == 2
    r = figures_closed[0].canvas.get_renderer()
    for fig in figures_closed:
        fig.canvas.draw()
        assert _texts_outside(fig) == []
        ax, legend = fig.axes[0], fig.axes[0].get_legend()
        assert legend.get_window_extent(r).x0 >= ax.get_window_extent(r).x1  # beside the data, not on it
    assert (tmp_path / "ba.png").is_file() and (tmp_path / "cmp.png").is_file()


@pytest.mark.unit
def test_plot_parts_split_models_and_facets():
    from pathlib import Path

    models, facets = [f"m{i}" for i in range(120)], [f"t{i}" for i in range(13)]
    parts = report.plot_parts(Path("p/x.png"), models, facets)
    assert [p.name for p, _, _ in parts] == [f"x_{i}of6.png" for i in range(1, 7)]
    assert [(len(m), len(f)) for _, m, f in parts] == [(50, 12), (50, 1), (50, 12), (50, 1), (20, 12), (20, 1)]
    assert report.plot_parts(Path("p/x.png"), models[:3], facets[:2]) == [(Path("p/x.png"), models[:3], facets[:2])]


@pytest.mark.unit
def test_status_summary_collapses_what_is_uniform_in_the_one_model_order():
    df = _synthetic_sweep(24)
    s = report.summary_table(df)
    assert s.splitlines()[0] == "24 models: all 264 task(s) finished"
    # up to 30 models: model x test rows, in natural order (tiny-2 before tiny-10)
    weat = s[s.index("weat (en)"):]
    names = [ln.split()[0] for ln in weat.splitlines()[3:27]]
    assert names == [f"tiny-{i}" for i in range(24)]
    df.loc[(df.model == "tiny-10") & (df.test == "en/weat3"), "status"] = "failed"
    lines = report.status_counts(df).splitlines()
    assert lines[0] == "24 models, 264 task(s): 263 finished, 1 failed"
    assert lines[1] == "23 model(s): all 253 of their task(s) finished"
    assert lines[2].split() == ["finished", "failed"] and lines[4].split() == ["tiny-10", "10", "1"]
    assert len(lines) == 5  # the 23 clean models are one line, not 23 rows
    big = report.summary_table(_synthetic_sweep())
    assert big.splitlines()[0] == "192 models: all 2112 task(s) finished"
    assert "weat (en): headline value over 192 models, per test" in big
    assert len(big.splitlines()) < 60  # not one row per model


@pytest.mark.unit
def test_plan_counts_collapse_equal_rows_over_20_models():
    from jobs.plan import collapse_rows

    df = pd.DataFrame([{"model": f"m{i}", "metric": m} for i in range(30)
                       for m in (["seat", "seat", "crows_pairs"] if i != 7 else ["crows_pairs"])])
    tab = pd.crosstab(df["model"], df["metric"], margins=True, margins_name="total")
    tab = tab.loc[[f"m{i}" for i in range(30)] + ["total"]]
    out = collapse_rows(tab)
    assert list(out.index) == ["29 models: m0 .. m29", "m7", "total"]
    assert out.loc["29 models: m0 .. m29"].tolist() == [1, 2, 3] and out.loc["total"].tolist() == [30, 58, 88]
    assert collapse_rows(tab.iloc[:5]).equals(tab.iloc[:5])


@pytest.mark.unit
def test_a_grown_sweep_replaces_its_earlier_plot_files(tmp_path):
    """Reports are rebuilt on every invocation: a sweep that grew from 3 to 60 models gets
    ``effects_weat_en_1of2.png`` and ``_2of2.png`` and no stale ``effects_weat_en.png``."""
    small = _synthetic_sweep(3)
    report.write_reports(small[small.metric == "weat"], tmp_path, mitigations={})
    assert (tmp_path / "plots" / "effects_weat_en.png").is_file()
    big = _synthetic_sweep(60)
    report.write_reports(big[big.metric == "weat"], tmp_path, mitigations={})
    assert sorted(p.name for p in (tmp_path / "plots").glob("effects_*")) == [
        "effects_weat_en_1of2.png", "effects_weat_en_2of2.png"]


@pytest.mark.unit
def test_reports_over_unchanged_results_keep_their_plots_and_redraw_only_what_changed(tmp_path, monkeypatch):
    """A report rebuilt over the same results (a resumed sweep, a re-run with nothing new) draws no
    plot again and keeps every file byte for byte; a changed value redraws only the files that
    show it, with the pixels a fresh report draws; a file cut short, or one written without the
    digest (an earlier version), is drawn again."""
    import matplotlib.figure
    from PIL import Image

    df = _synthetic_sweep(3)
    first = report.write_reports(df, tmp_path / "a", mitigations={})
    pngs = sorted(p for p in first if p.suffix == ".png")
    assert len(pngs) == 8  # effects and heat map of WEAT and of each CrowS-Pairs measurement, and its breakdown
    before = {p: p.read_bytes() for p in pngs}
    saved = []
    real = matplotlib.figure.Figure.savefig

    def counting(fig, path, *a, **k):
        saved.append(Path(path).name)
        return real(fig, path, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", counting)
    assert report.write_reports(df, tmp_path / "a", mitigations={}) == first
    assert saved == [] and all(p.read_bytes() == before[p] for p in pngs)
    changed = df.copy()  # one WEAT value of one model
    changed.loc[changed.index[(changed.metric == "weat") & (changed.test == "en/weat3")][0], "value"] += 0.25
    assert report.write_reports(changed, tmp_path / "a", mitigations={}) == first
    assert sorted(saved) == ["effects_weat_en.png", "heatmap_weat_en.png"]
    fresh = report.write_reports(changed, tmp_path / "b", mitigations={})
    for p in (p for p in fresh if p.suffix == ".png"):
        kept = tmp_path / "a" / p.relative_to(tmp_path / "b")
        assert np.array_equal(np.asarray(Image.open(p)), np.asarray(Image.open(kept))), p.name
    saved.clear()
    cut = tmp_path / "a" / "plots" / "effects_weat_en.png"
    cut.write_bytes(cut.read_bytes()[:200])
    old = tmp_path / "a" / "plots" / "heatmap_weat_en.png"
    with Image.open(old) as im:
        im.load()
        im.save(old)  # the pixels without the text chunk
    late = tmp_path / "a" / "plots" / "effects_crows_pairs_en.png"
    late.write_bytes(late.read_bytes()[:-40])  # cut inside the image data: the digest chunk is whole
    report.write_reports(changed, tmp_path / "a", mitigations={})
    assert sorted(saved) == ["effects_crows_pairs_en.png", "effects_weat_en.png", "heatmap_weat_en.png"]


def _environments_balanced(tex: str) -> list[str]:
    """The environments opened in ``tex``, outermost first, after checking every ``\\end`` closes
    the innermost open ``\\begin`` and every group closes (LaTeX's own rule, without LaTeX)."""
    import re

    stack, opened = [], []
    for kind, name in re.findall(r"\\(begin|end)(?:\{([^}]*)\}|group)", tex):
        name = name or "group"
        if kind == "begin":
            stack.append(name)
            opened.append(name)
        else:
            assert stack and stack.pop() == name, (kind, name, stack)
    assert stack == []
    depth = 0
    for ch in re.sub(r"\\[{}]", "", tex):  # braces balance, never below zero
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0
    return opened


@pytest.mark.unit
def test_latex_tables_of_192_models_break_across_pages_with_the_header_repeated():
    """At 192 models the headline and breakdown tables are ``longtable`` s (a ``table`` float of
    192 rows ran off the page): balanced environments and braces, every row once, the header on
    the first page (``\\endfirsthead``) and repeated on every later one (``\\endhead``), the
    caption and label kept; up to :data:`report.ROWS_PER_PAGE` models it stays a float."""
    models = [f"ckpt-{i:03d}" for i in range(192)]
    rows = [{"model": m, "language": "en", "test": f"en/weat{t}", "metric": "weat", "status": "finished",
             "value": 0.01 * i + t, "effect_size": 0.01 * i + t, "p_value": 0.5, "key": f"{m}-{t}"}
            for i, m in enumerate(models) for t in (1, 2)]
    df = report.results_frame(rows)
    tex = report.latex_table(df, "weat", "en", model_order=models)
    assert _environments_balanced(tex) == ["group", "longtable"]
    lines = tex.splitlines()
    assert lines[2] == r"\begin{longtable}{lrr}" and r"\begin{table}[ht]" not in lines
    header = r"Model & weat1 & weat2 \\"
    assert lines.count(header) == 2
    first, repeat, foot = lines.index(r"\endfirsthead"), lines.index(r"\endhead"), lines.index(r"\endlastfoot")
    assert lines.index(header) < first < len(lines) - 1 - lines[::-1].index(header) < repeat < foot
    body = [x for x in lines[foot + 1:] if x.startswith("ckpt-")]
    assert len(body) == 192 and body[0] == r"ckpt-000 & 1.00 & 2.00 \\" and body[-1] == r"ckpt-191 & 2.91 & 3.91 \\"
    assert lines[3].startswith(r"\caption{weat (en): headline value per model") and lines[3].endswith(
        r"\label{tab:weat-en} \\")
    # 40 models: one float, as before
    small = report.latex_table(df[df["model"].isin(models[:40])], "weat", "en", model_order=models[:40])
    assert _environments_balanced(small) == ["table", "tabular"] and "longtable" not in small

    bd = pd.DataFrame([{"model": m, "test": "en/crows_pairs", "category": c, "score": "metric_score", "value": 50.0,
                        "low": 40.0, "high": 60.0, "n": 10, "ci_method": "wilson"}
                       for m in models for c in ("age", "race-color")])
    btex = report.breakdown_latex(bd, "crows_pairs", "per_bias_type", "metric_score", model_order=models)
    assert _environments_balanced(btex) == ["group", "longtable"]
    blines = btex.splitlines()
    assert blines.count(r"model & age (n=10) & race-color (n=10) \\") == 2
    assert sum(x.startswith("ckpt-") for x in blines) == 192 and r"\endhead" in blines
