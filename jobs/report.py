"""Sweep reports: a results table (Parquet), LaTeX tables, plots and a summary.

Written to ``<output_dir>/reports/`` and logged on the sweep's parent run under ``reports/``:

- ``results.parquet``: one row per planned task (the columns of :func:`jobs.tracker.run_row`:
  model, language, test, metric, status, value, effect_size, p_value, p_holm, p_bh, ci_low,
  ci_high, coverage_min, error, key, run_id, ..., n_family, ci_method), readable with
  ``pandas.read_parquet``; ``p_holm``/``p_bh`` are the p-values adjusted for multiple
  comparisons over each *family* of tasks (:func:`adjust_pvalues`; default: all tests of one
  model and metric in the sweep, ``n_family`` of them), configured by the spec's
  ``multiple_comparisons:`` (:class:`jobs.spec.MultipleComparisons`). The file is logged on the
  parent run (``reports/results.parquet``): adjusted p-values depend on the family, i.e. on
  the sweep, so they live on the parent run, not on the child runs;
- ``tables/<metric>_<language>.tex``: booktabs tables, models (rows) x tests (columns) of the
  headline value (the effect size for WEAT/SEAT) with significance marks (``*`` p < 0.05,
  ``**`` p < 0.01, ``***`` p < 0.001) from the p-value ``multiple_comparisons.marks`` names
  (default: Holm-adjusted; ``bh``; ``raw``: uncorrected), the caption saying which and over
  which family, and the interval method (``ci_method``) of the results; ``fail`` for a failed
  task, empty where a combination was not planned;
- ``plots/effects_<metric>_<language>.png``: the headline value per test and model with its
  confidence interval (when the metric gives one; the title names ``ci_method``);
- ``plots/heatmap_<metric>_<language>.png``: model x test heat map of the headline value
  (diverging colours centred on 0, values annotated with the same marks as the tables and a
  footnote saying which p-values they read, ``fail`` on failed tasks).

When the sweep has debiased copies of static models (``models[i].mitigation``), also:

- ``mitigation/before_after.csv`` and ``.parquet``: one row per (debiased model, language, test,
  metric) with the original's and the debiased model's headline values (see
  :func:`before_after_frame`);
- ``tables/mitigation_<metric>_<language>.tex``: booktabs, test x (original, debiased, change)
  per debiased model;
- ``plots/mitigation_<metric>_<language>.png``: before (original) vs after (debiased) per test;
- ``mitigation/<model>/mitigation.json``: the debiased copy's manifest (original, method,
  parameters, definitions digest, path, revision, size) and, when the matrix is at most
  :data:`jobs.builders.ARTIFACT_MAX_BYTES`, its ``vectors.npy`` + ``vectors.vocab.txt`` (larger
  matrices are logged as that pointer only).

Everything here is a pure function of the results table (and of the manifests the build step
wrote), so reports are regenerated from the tracking store on every invocation (a resumed
sweep reports its old and new results together).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from audit import registry
from audit.multitest import adjust_rows
from audit.naming import natural_key
from jobs.builders import ARTIFACT_MAX_BYTES
from jobs.spec import MultipleComparisons

COLUMNS = [
    "model", "language", "test", "metric", "status", "value", "effect_size", "p_value", "p_holm", "p_bh",
    "ci_low", "ci_high", "coverage_min", "n_items", "error", "key", "run_id", "model_ref", "revision", "backend",
    "embedding", "metric_name", "dataset_digest", "seed", "params", "n_family", "ci_method", "groups",
]

#: The p-value column each ``multiple_comparisons.marks`` reads.
MARK_COLUMNS = {"holm": "p_holm", "bh": "p_bh", "raw": "p_value"}
_MARK_NAMES = {"holm": "Holm-adjusted", "bh": "Benjamini-Hochberg-adjusted", "raw": "uncorrected"}
#: What each WEAT/SEAT interval method resamples (captions).
CI_METHODS = {"targets": "percentile bootstrap of the target words, attribute sets fixed (as the permutation test)",
              "targets_attributes": "percentile bootstrap of the target and the attribute words"}

_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
}


def results_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """The results table with a fixed column order (missing columns filled with ``None``)."""
    df = pd.DataFrame(list(rows))
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    df = df[COLUMNS + [c for c in df.columns if c not in COLUMNS]]
    for c in ("value", "effect_size", "p_value", "p_holm", "p_bh", "ci_low", "ci_high", "coverage_min", "n_items",
              "n_family"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    return df.reset_index(drop=True)


def family_text(family: tuple[str, ...] | list[str]) -> str:
    """How a multiple-comparison family reads in captions."""
    family = tuple(family)
    if not family:
        return "all tests of the sweep"
    if family == ("model", "metric"):
        return "all tests of one model and metric in the sweep"
    return "the tests sharing " + ", ".join(family)


def marks_text(mc: MultipleComparisons | None = None) -> str:
    """What the significance marks read, one phrase: ``Holm-adjusted p-values over all tests of
    one model and metric in the sweep`` / ``uncorrected p-values``."""
    mc = mc or MultipleComparisons()
    if mc.marks == "raw":
        return "uncorrected p-values"
    return f"{_MARK_NAMES[mc.marks]} p-values over {family_text(mc.family)}"


def adjust_pvalues(df: pd.DataFrame, mc: MultipleComparisons | None = None) -> pd.DataFrame:
    """The results table with ``p_holm``, ``p_bh`` and ``n_family``: the p-values of the
    finished tasks adjusted per family (:func:`audit.multitest.adjust_rows`: Holm 1979,
    Benjamini & Hochberg 1995; missing p-values pass through and do not count), the family
    being the rows that share the values of ``mc.family`` (default ``model``, ``metric``).
    Failed tasks get NaN."""
    mc = mc or MultipleComparisons()
    return adjust_rows(df, (df["status"] == "finished").to_numpy(), family=tuple(mc.family))


def _with_adjusted(df: pd.DataFrame, mc: MultipleComparisons | None) -> pd.DataFrame:
    """``df`` itself when it has the adjusted columns (and ``mc`` is not given), else
    :func:`adjust_pvalues`."""
    if mc is None and {"p_holm", "p_bh"} <= set(df.columns) and (df["p_holm"].notna().any() or df["p_value"].isna().all()):
        return df
    return adjust_pvalues(df, mc)


def ci_text(sub: pd.DataFrame) -> str:
    """The interval method(s) of some results, for captions (``""`` when none is recorded)."""
    if "ci_method" not in sub.columns:
        return ""
    methods = sorted({str(m) for m in sub["ci_method"].dropna() if str(m)})
    return "; ".join(f"ci_method {m}: {CI_METHODS.get(m, m)}" for m in methods)


def latex_escape(s: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(s))


def significance_mark(p: float | None) -> str:
    """``***`` p < 0.001, ``**`` p < 0.01, ``*`` p < 0.05, else empty (NaN/None: empty)."""
    if p is None or not isinstance(p, (int, float)) or math.isnan(p):
        return ""
    if p < 0.001:
        return "***"
    if p < 0.01:
        return "**"
    if p < 0.05:
        return "*"
    return ""


def _cell(row: pd.Series | None, digits: int, mark_col: str = "p_value") -> str:
    if row is None:
        return ""
    if row["status"] != "finished":
        return r"\textit{fail}"
    v = row["value"]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "--"
    mark = significance_mark(row[mark_col])
    s = f"{v:.{digits}f}".replace("-", "$-$", 1) if v < 0 else f"{v:.{digits}f}"
    return s + (f"$^{{{mark}}}$" if mark else "")


def _order(values: Iterable[str], first: list[str] | None = None) -> list[str]:
    vals = list(dict.fromkeys(values))
    if first:
        return [v for v in first if v in vals] + [v for v in vals if v not in first]
    return vals




def latex_table(df: pd.DataFrame, metric: str, language: str, *, model_order: list[str] | None = None,
                digits: int = 2, multiple_comparisons: MultipleComparisons | None = None) -> str:
    """A booktabs table (models x tests) of one metric in one language; the significance marks
    read the p-value ``multiple_comparisons.marks`` names (default Holm-adjusted), the caption
    says which, over which family, and the results' interval method."""
    mc = multiple_comparisons or MultipleComparisons()
    df = _with_adjusted(df, multiple_comparisons)
    mark_col = MARK_COLUMNS[mc.marks]
    sub = df[(df["metric"] == metric) & (df["language"] == language)]
    models = _order(sub["model"], model_order)
    tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
    cells = {(r["model"], r["test"]): r for _, r in sub.iterrows()}
    short = [t.split("/", 1)[1] if t.startswith(f"{language}/") else t for t in tests]
    lines = [
        r"\begin{table}[ht]",
        r"\centering",
        r"\small",
        r"\begin{tabular}{l" + "r" * len(tests) + "}",
        r"\toprule",
        "Model & " + " & ".join(latex_escape(t) for t in short) + r" \\",
        r"\midrule",
    ]
    for m in models:
        lines.append(latex_escape(m) + " & " + " & ".join(_cell(cells.get((m, t)), digits, mark_col) for t in tests)
                     + r" \\")
    ci = ci_text(sub)
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{" + latex_escape(metric) + f" ({latex_escape(language)}): headline value per model and test. "
        r"$^{*}$~$p<0.05$, $^{**}$~$p<0.01$, $^{***}$~$p<0.001$ (" + latex_escape(marks_text(mc)) + "); "
        + (f"intervals (plots, results.parquet): {latex_escape(ci)}; " if ci else "")
        + r"\textit{fail}: the task failed (see the run log).}",
        r"\label{tab:" + re.sub(r"[^A-Za-z0-9]+", "-", f"{metric}-{language}") + "}",
        r"\end{table}",
        "",
    ]
    return "\n".join(lines)


def _plot_effects(sub: pd.DataFrame, metric: str, language: str, path: Path, model_order: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sub[sub["status"] == "finished"]
    tests = sorted(dict.fromkeys(ok["test"]), key=natural_key)
    models = _order(ok["model"], model_order)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(tests) + 2.5), 3.6), dpi=110, layout="constrained")
    width = 0.8 / max(1, len(models))
    for j, m in enumerate(models):
        rows = ok[ok["model"] == m].set_index("test")
        xs, ys, lo, hi = [], [], [], []
        for i, t in enumerate(tests):
            if t not in rows.index:
                continue
            r = rows.loc[t]
            if isinstance(r, pd.DataFrame):
                r = r.iloc[0]
            if not np.isfinite(r["value"]):
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(r["value"])
            has_ci = np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"])
            lo.append(r["value"] - r["ci_low"] if has_ci else 0.0)
            hi.append(r["ci_high"] - r["value"] if has_ci else 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], fmt="o", capsize=3, label=m, ms=4)
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set_xticks(range(len(tests)))
    ax.set_xticklabels([t.split("/", 1)[-1] for t in tests], rotation=45, ha="right")
    ax.set_ylabel(f"{metric} (headline value)")
    methods = sorted({str(m) for m in ok["ci_method"].dropna() if str(m)}) if "ci_method" in ok.columns else []
    ax.set_title(f"{metric} ({language}): value with confidence interval"
                 + (f" (ci_method {', '.join(methods)})" if methods else ""), fontsize=9)
    if models:
        ax.legend(fontsize=7, loc="best")
    fig.savefig(path)
    plt.close(fig)


def _plot_heatmap(sub: pd.DataFrame, metric: str, language: str, path: Path, model_order: list[str],
                  mc: MultipleComparisons | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = sub[sub["status"] == "finished"]
    tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
    models = _order(sub["model"], model_order)
    mc = mc or MultipleComparisons()
    mat = np.full((len(models), len(tests)), np.nan)
    marks = {}
    for _, r in ok.iterrows():
        mat[models.index(r["model"]), tests.index(r["test"])] = r["value"]
        marks[(r["model"], r["test"])] = significance_mark(r[MARK_COLUMNS[mc.marks]])
    vmax = np.nanmax(np.abs(mat)) if np.isfinite(mat).any() else 1.0
    vmax = vmax if vmax > 0 else 1.0
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * len(tests) + 2.5), max(2.6, 0.5 * len(models) + 1.8)), dpi=110,
                           layout="constrained")
    im = ax.imshow(np.ma.masked_invalid(mat), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto")
    failed = {(r["model"], r["test"]) for _, r in sub.iterrows() if r["status"] != "finished"}
    for i in range(len(models)):
        for j in range(len(tests)):
            if np.isfinite(mat[i, j]):
                ax.text(j, i, f"{mat[i, j]:.2f}{marks.get((models[i], tests[j]), '')}", ha="center", va="center",
                        fontsize=7,
                        color="white" if abs(mat[i, j]) > 0.6 * vmax else "black")
            elif (models[i], tests[j]) in failed:
                ax.text(j, i, "fail", ha="center", va="center", fontsize=7, color="0.45", style="italic")
    ax.set_xticks(range(len(tests)))
    ax.set_xticklabels([t.split("/", 1)[-1] for t in tests], rotation=45, ha="right")
    ax.set_yticks(range(len(models)))
    ax.set_yticklabels(models)
    ax.set_title(f"{metric} ({language})")
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.text(0.01, 0.005, f"* p<0.05, ** p<0.01, *** p<0.001: {marks_text(mc)}", fontsize=6, color="0.3",
             ha="left", va="bottom", wrap=True)
    fig.savefig(path)
    plt.close(fig)


def plot_comparison(table: pd.DataFrame, path: Path, *, title: str, new_label: str = "new",
                    baseline_label=lambda b: f"baseline {b}") -> None:
    """Two revisions side by side (the watcher's regression report): per compared (baseline,
    test, metric) row of a comparison table (:mod:`audit.regression`, with each side's own
    interval ``ci_a_low`` ... ``ci_b_high``), the baseline's headline (grey) and the new
    revision's (blue; red where the row is flagged a regression), each with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = table[table["status"] == "compared"]
    base_col = ok["baseline"] if "baseline" in ok.columns else pd.Series([""] * len(ok), index=ok.index)
    names = ok["language"].astype(str) + "/" + ok["test"].astype(str)
    keys = sorted(dict.fromkeys(zip(base_col, names, ok["metric"])), key=lambda k: (str(k[0]), natural_key(k[1]), k[2]))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(keys) + 2.5), 3.8), dpi=110, layout="constrained")
    for i, (base, test, metric) in enumerate(keys):
        r = ok[(base_col == base) & (names == test) & (ok["metric"] == metric)].iloc[0]
        flagged = bool(r.get("regression")) if r.get("regression") is not None else False
        for dx, v, lo, hi, colour, label in (
                (-0.15, r["value_a"], r.get("ci_a_low"), r.get("ci_a_high"), "0.5", baseline_label(base)),
                (0.15, r["value_b"], r.get("ci_b_low"), r.get("ci_b_high"), "tab:red" if flagged else "tab:blue",
                 new_label + (" (regression)" if flagged else ""))):
            has = lo is not None and hi is not None and np.isfinite(lo) and np.isfinite(hi)
            err = [[max(v - lo, 0.0)], [max(hi - v, 0.0)]] if has else None
            ax.errorbar([i + dx], [v], yerr=err, fmt="o", color=colour, capsize=3, ms=5, label=label)
    ax.axhline(0, color="0.7", lw=0.8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{t.split('/', 1)[-1]}\n{m}" for _, t, m in keys], fontsize=8)
    ax.set_ylabel("headline value (interval: each audit's own)")
    ax.set_title(title, fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="best")
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# Breakdowns: a headline by category, group or bias type (the registry entry's ``breakdowns``)
# --------------------------------------------------------------------------------------


def breakdown_frame(df: pd.DataFrame, metric: str, table: str, scores: Iterable[str]) -> pd.DataFrame:
    """Long table of one breakdown of ``metric``'s finished results: ``model, language, test,
    category, score, value, low, high`` from the results' ``breakdowns`` column (the flattened
    ``<table>.<category>.<score>`` and ``<table>.<category>.ci.<score>_low/_high`` numbers)."""
    rows = []
    scores = list(scores)
    sub = df[(df["metric"].isin(_metric_names(metric))) & (df["status"] == "finished")]
    for r in sub.itertuples(index=False):
        raw = getattr(r, "breakdowns", None)
        if not isinstance(raw, str) or not raw:
            continue
        nums = json.loads(raw)
        cats = sorted({k[len(table) + 1:].split(".", 1)[0] for k in nums if k.startswith(table + ".")}, key=natural_key)
        for c in cats:
            for s in scores:
                v = nums.get(f"{table}.{c}.{s}")
                if v is None:
                    continue
                rows.append({"model": r.model, "language": r.language, "test": r.test, "category": c, "score": s,
                             "value": v, "low": nums.get(f"{table}.{c}.ci.{s}_low"),
                             "high": nums.get(f"{table}.{c}.ci.{s}_high")})
    return pd.DataFrame(rows, columns=["model", "language", "test", "category", "score", "value", "low", "high"])


def _metric_names(metric: str) -> set[str]:
    """The names results of a registered metric are recorded under (its name per model kind)."""
    e = registry.get(metric)
    return {metric, *e.result_names.values()}


def breakdown_latex(bd: pd.DataFrame, metric: str, table: str, score: str, *, model_order: list[str] | None = None,
                    digits: int = 3) -> str:
    """Model x category table of one score of a breakdown (intervals in brackets when present)."""
    sub = bd[bd["score"] == score]
    cats = sorted(dict.fromkeys(sub["category"]), key=natural_key)
    rows = _order(sub["model"], model_order)
    lines = ["\\begin{table}[ht]", "\\centering", "\\small",
             f"\\begin{{tabular}}{{l{'r' * len(cats)}}}", "\\toprule",
             "model & " + " & ".join(latex_escape(c) for c in cats) + " \\\\", "\\midrule"]
    for m in rows:
        cells = []
        for c in cats:
            x = sub[(sub["model"] == m) & (sub["category"] == c)]
            if not len(x):
                cells.append("--")
                continue
            v, lo, hi = x.iloc[0][["value", "low", "high"]]
            cell = f"{v:.{digits}f}"
            if pd.notna(lo) and pd.notna(hi):
                cell += f" [{lo:.2f}, {hi:.2f}]"
            cells.append(cell)
        lines.append(latex_escape(m) + " & " + " & ".join(cells) + " \\\\")
    tests = ", ".join(sorted(dict.fromkeys(sub["test"])))
    lines += ["\\bottomrule", "\\end{tabular}",
              f"\\caption{{{latex_escape(metric)}: {latex_escape(score)} by {latex_escape(table.replace('per_', ''))} "
              f"({latex_escape(tests)}); brackets: confidence interval where the metric gives one.}}",
              "\\end{table}", ""]
    return "\n".join(lines)


def _plot_breakdown(bd: pd.DataFrame, metric: str, table: str, score: str, path: Path, model_order: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = bd[bd["score"] == score]
    cats = sorted(dict.fromkeys(sub["category"]), key=natural_key)
    models = _order(sub["model"], model_order)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(cats) * max(1, len(models)) + 2.0), 3.6), dpi=110,
                           layout="constrained")
    width = 0.8 / max(1, len(models))
    for j, m in enumerate(models):
        x = sub[sub["model"] == m].set_index("category")
        pos = [i - 0.4 + width * (j + 0.5) for i, c in enumerate(cats) if c in x.index]
        vals = [float(x.loc[c, "value"]) for c in cats if c in x.index]
        lo = [float(x.loc[c, "value"] - x.loc[c, "low"]) if pd.notna(x.loc[c, "low"]) else 0.0 for c in cats if c in x.index]
        hi = [float(x.loc[c, "high"] - x.loc[c, "value"]) if pd.notna(x.loc[c, "high"]) else 0.0 for c in cats if c in x.index]
        ax.bar(pos, vals, width=width, label=m, yerr=[np.maximum(lo, 0), np.maximum(hi, 0)], capsize=2)
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(score)
    ax.set_title(f"{metric}: {score} by {table.replace('per_', '')}", fontsize=9)
    if models:
        ax.legend(fontsize=7, loc="best")
    fig.savefig(path)
    plt.close(fig)


def write_breakdowns(df: pd.DataFrame, out_dir: str | Path, *, model_order: list[str] | None = None) -> list[Path]:
    """For every metric whose registry entry declares breakdowns, and every language and test
    (one language may hold several tests of a metric, e.g. CrowS-Pairs and its revised set): a
    LaTeX table (model x category) of each score and a bar plot of the first, under ``tables/``
    and ``plots/``; plus ``breakdowns.parquet`` (the long table of all of them)."""
    out = Path(out_dir)
    written: list[Path] = []
    frames = []
    if "breakdowns" not in df.columns:
        return written
    for name, e in registry.METRICS.items():
        for table, scores in e.breakdowns:
            bd = breakdown_frame(df, name, table, scores)
            if not len(bd):
                continue
            frames.append(bd.assign(metric=name, table=table))
            for (lang, test), sub in bd.groupby(["language", "test"], sort=True):
                for k, score in enumerate(scores):
                    if not (sub["score"] == score).any():
                        continue
                    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{name}_{lang}_{str(test).rsplit('/', 1)[-1]}_{table}_{score}")
                    tp = out / "tables" / f"{stem}.tex"
                    tp.write_text(breakdown_latex(sub, name, table, score, model_order=model_order), encoding="utf-8")
                    written.append(tp)
                    if k == 0:
                        pp = out / "plots" / f"{stem}.png"
                        _plot_breakdown(sub, name, table, score, pp, model_order or [])
                        written.append(pp)
    if frames:
        p = out / "breakdowns.parquet"
        pd.concat(frames, ignore_index=True).to_parquet(p, index=False)
        written.append(p)
    return written


def write_reports(df: pd.DataFrame, out_dir: str | Path, *, model_order: list[str] | None = None,
                  mitigations: dict[str, dict] | None = None,
                  multiple_comparisons: MultipleComparisons | None = None) -> list[Path]:
    """Write the Parquet table (with the adjusted p-values of :func:`adjust_pvalues`), LaTeX
    tables and plots; return the paths written.

    multiple_comparisons: the family and the marks (the spec's ``multiple_comparisons:``;
                 default: family model x metric, Holm-adjusted marks).

    mitigations: debiased model name -> its manifest (``base_model``, ``method``, ...). ``None``
                 finds them for the models of ``df`` whose reference is ``built:<name>`` in
                 ``<out_dir>/../models/<name>/mitigation.json`` (the sweep's layout:
                 ``<output_dir>/reports`` next to ``<output_dir>/models``).
    """
    out = Path(out_dir)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    written = []
    mc = multiple_comparisons or MultipleComparisons()
    df = adjust_pvalues(df, mc)
    p = out / "results.parquet"
    df.to_parquet(p, index=False)
    written.append(p)
    for (metric, lang), sub in df.groupby(["metric", "language"], sort=True):
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{metric}_{lang}")
        t = out / "tables" / f"{stem}.tex"
        t.write_text(latex_table(df, metric, lang, model_order=model_order, multiple_comparisons=mc), encoding="utf-8")
        written.append(t)
        if (sub["status"] == "finished").any():
            e = out / "plots" / f"effects_{stem}.png"
            _plot_effects(sub, metric, lang, e, model_order or [])
            h = out / "plots" / f"heatmap_{stem}.png"
            _plot_heatmap(sub, metric, lang, h, model_order or [], mc)
            written += [e, h]
    written += write_breakdowns(df, out, model_order=model_order)
    if mitigations is None:
        mitigations = find_mitigations(df, out.parent / "models")
    if mitigations:
        written += write_mitigation_reports(df, out, mitigations, multiple_comparisons=mc)
    return written


# --------------------------------------------------------------------------------------
# Debiasing: before/after
# --------------------------------------------------------------------------------------

BEFORE_AFTER_COLUMNS = [
    "model", "base_model", "method", "language", "test", "metric", "value_before", "value_after", "change",
    "abs_change", "p_before", "p_after", "status_before", "status_after", "revision_before", "revision_after",
    "p_marks_before", "p_marks_after",
]


def find_mitigations(df: pd.DataFrame, models_dir: str | Path) -> dict[str, dict]:
    """Manifests (``<models_dir>/<name>/mitigation.json``) of the models of ``df`` whose
    reference is ``built:<name>``; name -> manifest."""
    import json

    out: dict[str, dict] = {}
    if df.empty or "model_ref" not in df.columns:
        return out
    refs = df[["model", "model_ref"]].dropna().drop_duplicates()
    for _, r in refs.iterrows():
        ref = str(r["model_ref"])
        if not ref.startswith("built:"):
            continue
        p = Path(models_dir) / ref[len("built:"):] / "mitigation.json"
        if p.is_file():
            try:
                out[str(r["model"])] = json.loads(p.read_text(encoding="utf-8"))
            except ValueError:
                continue
    return out


def before_after_frame(df: pd.DataFrame, mitigations: dict[str, dict],
                       multiple_comparisons: MultipleComparisons | None = None) -> pd.DataFrame:
    """One row per (debiased model, language, test, metric) that the original also ran.

    ``value_before``/``value_after``: the headline value (WEAT/SEAT: the effect size *d*) of the
    original and of the debiased model; ``change = after - before``; ``abs_change = |after| -
    |before|`` (negative: the association shrank; *d* is scale-free and may flip sign, see
    ``docs/mitigation.md``); ``p_before``/``p_after`` their raw p-values, ``p_marks_before``/
    ``p_marks_after`` the p-values the significance marks read (``multiple_comparisons.marks``:
    Holm-adjusted by default, over the sweep's families). A failed task leaves its
    value NaN (``status_before``/``status_after`` say why). Rows follow the order of
    ``mitigations``, then natural test order.
    """
    mark_col = MARK_COLUMNS[(multiple_comparisons or MultipleComparisons()).marks]
    df = _with_adjusted(df, multiple_comparisons)
    rows = []
    for name, man in mitigations.items():
        base = man.get("base_model")
        after = df[df["model"] == name]
        before = df[df["model"] == base].set_index(["language", "test", "metric"])
        for _, a in after.iterrows():
            k = (a["language"], a["test"], a["metric"])
            if k not in before.index:
                continue
            b = before.loc[k]
            if isinstance(b, pd.DataFrame):
                b = b.iloc[0]
            vb = b["value"] if b["status"] == "finished" else np.nan
            va = a["value"] if a["status"] == "finished" else np.nan
            rows.append({
                "model": name, "base_model": base, "method": man.get("method"), "language": a["language"],
                "test": a["test"], "metric": a["metric"], "value_before": vb, "value_after": va,
                "change": va - vb, "abs_change": abs(va) - abs(vb),
                "p_before": b["p_value"] if b["status"] == "finished" else np.nan,
                "p_after": a["p_value"] if a["status"] == "finished" else np.nan,
                "status_before": b["status"], "status_after": a["status"],
                "revision_before": b.get("revision"), "revision_after": a.get("revision"),
                "p_marks_before": b[mark_col] if b["status"] == "finished" else np.nan,
                "p_marks_after": a[mark_col] if a["status"] == "finished" else np.nan,
            })
    out = pd.DataFrame(rows, columns=BEFORE_AFTER_COLUMNS)
    for c in ("value_before", "value_after", "change", "abs_change", "p_before", "p_after", "p_marks_before",
              "p_marks_after"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    if len(out):
        order = {n: i for i, n in enumerate(mitigations)}
        keys = sorted(range(len(out)), key=lambda i: (order[out["model"].iat[i]], out["metric"].iat[i],
                                                       out["language"].iat[i], natural_key(out["test"].iat[i])))
        out = out.iloc[keys]
    return out.reset_index(drop=True)


def _num(v: float, digits: int, *, sign: bool = False, mark: str = "") -> str:
    if v is None or not np.isfinite(v):
        return "--"
    s = f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"
    s = s.replace("-", "$-$", 1) if s.startswith("-") else s
    return s + (f"$^{{{mark}}}$" if mark else "")


def before_after_latex(ba: pd.DataFrame, metric: str, language: str, *, digits: int = 2,
                       multiple_comparisons: MultipleComparisons | None = None) -> str:
    """A booktabs table (tests x debiased models) of one metric and language: for each debiased
    model its original's value, its own value and the change (after - before), with the
    significance marks of :func:`significance_mark` on ``p_marks_before``/``p_marks_after``."""
    sub = ba[(ba["metric"] == metric) & (ba["language"] == language)]
    models = list(dict.fromkeys(sub["model"]))
    tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
    cells = {(r["model"], r["test"]): r for _, r in sub.iterrows()}
    head1 = "Test & " + " & ".join(r"\multicolumn{3}{c}{" + latex_escape(m) + "}" for m in models) + r" \\"
    rules = " ".join(rf"\cmidrule(lr){{{2 + 3 * i}-{4 + 3 * i}}}" for i in range(len(models)))
    head2 = " & " + " & ".join(["before & after & change"] * len(models)) + r" \\"
    lines = [r"\begin{table}[ht]", r"\centering", r"\small", r"\begin{tabular}{l" + "rrr" * len(models) + "}",
             r"\toprule", head1, rules, head2, r"\midrule"]
    for t in tests:
        short = t.split("/", 1)[1] if t.startswith(f"{language}/") else t
        parts = []
        for m in models:
            r = cells.get((m, t))
            if r is None:
                parts += ["", "", ""]
                continue
            parts += [_num(r["value_before"], digits, mark=significance_mark(r["p_marks_before"])),
                      _num(r["value_after"], digits, mark=significance_mark(r["p_marks_after"])),
                      _num(r["change"], digits, sign=True)]
        lines.append(latex_escape(short) + " & " + " & ".join(parts) + r" \\")
    methods = ", ".join(f"{latex_escape(m)} = {latex_escape(str(sub[sub['model'] == m]['base_model'].iloc[0]))} "
                        f"debiased with {latex_escape(str(sub[sub['model'] == m]['method'].iloc[0]))}" for m in models)
    lines += [r"\bottomrule", r"\end{tabular}",
              r"\caption{" + latex_escape(metric) + f" ({latex_escape(language)}) before and after debiasing "
              f"({methods}): headline value of the original (before) and of the debiased copy (after), "
              r"change = after $-$ before. $^{*}$~$p<0.05$, $^{**}$~$p<0.01$, $^{***}$~$p<0.001$ ("
              + latex_escape(marks_text(multiple_comparisons)) + ").}",
              r"\label{tab:mitigation-" + re.sub(r"[^A-Za-z0-9]+", "-", f"{metric}-{language}") + "}",
              r"\end{table}", ""]
    return "\n".join(lines)


def _plot_before_after(ba: pd.DataFrame, metric: str, language: str, path: Path) -> None:
    """Per test: the original's value (grey) and each debiased copy's (colour), joined by an
    arrow from before to after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sub = ba[(ba["metric"] == metric) & (ba["language"] == language)]
    tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
    models = list(dict.fromkeys(sub["model"]))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 * len(tests) + 2.5), 3.6), dpi=110, layout="constrained")
    width = 0.8 / max(1, len(models))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, m in enumerate(models):
        rows = sub[sub["model"] == m].set_index("test")
        c = colours[j % len(colours)]
        for i, t in enumerate(tests):
            if t not in rows.index:
                continue
            r = rows.loc[t]
            x = i - 0.4 + width * (j + 0.5)
            b, a = r["value_before"], r["value_after"]
            if np.isfinite(b):
                ax.plot([x], [b], "o", color="0.55", ms=5, label="original" if (j == 0 and i == 0) else None)
            if np.isfinite(a):
                ax.plot([x], [a], "D", color=c, ms=5, label=m if i == 0 else None)
            if np.isfinite(a) and np.isfinite(b) and a != b:
                ax.annotate("", xy=(x, a), xytext=(x, b), arrowprops={"arrowstyle": "->", "color": c, "lw": 1})
    ax.axhline(0, color="0.6", lw=0.8)
    ax.set_xticks(range(len(tests)))
    ax.set_xticklabels([t.split("/", 1)[-1] for t in tests], rotation=45, ha="right")
    ax.set_ylabel(f"{metric} (headline value)")
    ax.set_title(f"{metric} ({language}): before (grey) and after debiasing")
    ax.legend(fontsize=7, loc="best")
    fig.savefig(path)
    plt.close(fig)


def write_mitigation_reports(df: pd.DataFrame, out_dir: str | Path, mitigations: dict[str, dict], *,
                             multiple_comparisons: MultipleComparisons | None = None) -> list[Path]:
    """The before/after table (CSV, Parquet, LaTeX), plots and the debiased models' manifests
    (with the vectors themselves when small); return the paths written."""
    import json
    import shutil


    out = Path(out_dir)
    mdir = out / "mitigation"
    mdir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ba = before_after_frame(df, mitigations, multiple_comparisons)
    for ext in ("csv", "parquet"):
        p = mdir / f"before_after.{ext}"
        ba.to_csv(p, index=False) if ext == "csv" else ba.to_parquet(p, index=False)
        written.append(p)
    for (metric, lang), sub in ba.groupby(["metric", "language"], sort=True):
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"mitigation_{metric}_{lang}")
        t = out / "tables" / f"{stem}.tex"
        t.parent.mkdir(parents=True, exist_ok=True)
        t.write_text(before_after_latex(ba, metric, lang, multiple_comparisons=multiple_comparisons), encoding="utf-8")
        written.append(t)
        if np.isfinite(sub[["value_before", "value_after"]].to_numpy()).any():
            p = out / "plots" / f"{stem}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            _plot_before_after(ba, metric, lang, p)
            written.append(p)
    for name, man in mitigations.items():
        d = mdir / re.sub(r"[^A-Za-z0-9_.+-]+", "-", name)
        d.mkdir(parents=True, exist_ok=True)
        small = int(man.get("bytes") or 0) <= ARTIFACT_MAX_BYTES
        files = [Path(man["matrix"]), Path(man["vocab"])] if man.get("matrix") and man.get("vocab") else []
        logged = small and files and all(f.is_file() for f in files)
        for f in files:
            if logged:
                dst = d / f.name
                if not dst.is_file() or dst.stat().st_size != f.stat().st_size or dst.stat().st_mtime < f.stat().st_mtime:
                    shutil.copyfile(f, dst)
                written.append(dst)
            elif (d / f.name).exists():
                (d / f.name).unlink()  # a stale copy from a smaller earlier build
        pointer = {**man, "artifact": "vectors logged here" if logged else
                   f"pointer only: {man.get('bytes')} bytes > {ARTIFACT_MAX_BYTES} (jobs.builders.ARTIFACT_MAX_BYTES); "
                   "load the matrix from 'ref' and check it against 'revision'"}
        p = d / "mitigation.json"
        p.write_text(json.dumps(pointer, indent=1, sort_keys=True, default=str), encoding="utf-8")
        written.append(p)
    return written


def headline_tables(df: pd.DataFrame, *, model_order: list[str] | None = None, digits: int = 3,
                    max_columns: int = 8, multiple_comparisons: MultipleComparisons | None = None) -> str:
    """The headline values as plain text, one block per metric and language like the LaTeX
    tables: models (rows) x tests (columns), the value with the significance marks of
    :func:`significance_mark`, ``fail`` for a failed task, empty where nothing was planned;
    several tasks in one cell (the metric with two parameter sets) are joined with ``/``.
    Blocks wider than ``max_columns`` tests are split. ``""`` when nothing finished."""
    if df.empty or not (df["status"] == "finished").any():
        return ""
    mc = multiple_comparisons or MultipleComparisons()
    df = _with_adjusted(df, multiple_comparisons)
    mark_col = MARK_COLUMNS[mc.marks]
    blocks = []
    for (metric, lang), sub in df.groupby(["metric", "language"], sort=True):
        models = _order(sub["model"], model_order)
        tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
        cells = {}
        for _, r in sub.iterrows():
            if r["status"] != "finished":
                text = "fail"
            elif r["value"] is None or not np.isfinite(r["value"]):
                text = "--"
            else:
                text = f"{r['value']:.{digits}f}{significance_mark(r[mark_col])}"
            key = (r["model"], r["test"])
            cells[key] = f"{cells[key]}/{text}" if key in cells else text  # e.g. two parameter sets
        short = [t.split("/", 1)[1] if t.startswith(f"{lang}/") else t for t in tests]
        head = f"{metric} ({lang}): headline value per model and test; * p<0.05, ** p<0.01, *** p<0.001 ({marks_text(mc)})"
        parts = [head]
        for j in range(0, len(tests), max_columns):
            cols = tests[j:j + max_columns]
            tab = pd.DataFrame([[cells.get((m, t), "") for t in cols] for m in models], index=models,
                               columns=short[j:j + max_columns])
            tab.index.name = "model"
            parts.append(tab.to_string())
        blocks.append("\n".join(parts))
    return "\n\n".join(blocks)


def failure_summary(df: pd.DataFrame, *, max_len: int = 300, max_tasks: int = 3) -> list[str]:
    """Each distinct failure once: a reason shared by several tasks of a model (a model that
    could not be loaded, the same coverage error) is one line with its count and the first
    tasks; a failure of one task keeps the ``model | language | test | metric: reason`` form."""
    fails = df[df["status"] != "finished"]
    if fails.empty:
        return []
    groups: dict[tuple[str, str], list] = {}
    for _, r in fails.iterrows():
        err = str(r["error"]) if r["error"] is not None and r["error"] == r["error"] else "no result"
        groups.setdefault((str(r["model"]), err), []).append(r)
    lines = []
    for (model, err), rows in groups.items():
        err = err if len(err) <= max_len else err[:max_len - 3] + "..."
        if len(rows) == 1:
            r = rows[0]
            lines.append(f"  {model} | {r['language']} | {r['test']} | {r['metric']}: {err}")
        else:
            first = ", ".join(f"{r['test']} {r['metric']}" for r in rows[:max_tasks])
            more = f", +{len(rows) - max_tasks} more" if len(rows) > max_tasks else ""
            lines.append(f"  {model}: {len(rows)} tasks ({first}{more}): {err}")
    return lines


def summary_table(df: pd.DataFrame, *, model_order: list[str] | None = None,
                  multiple_comparisons: MultipleComparisons | None = None) -> str:
    """A terminal summary: counts per model and status, the headline values (model x test per
    metric and language, :func:`headline_tables`), then each distinct failure once with its
    count (:func:`failure_summary`)."""
    if df.empty:
        return "no tasks"
    counts = pd.crosstab(df["model"], df["status"], margins=True, margins_name="total")
    lines = [counts.to_string()]
    heads = headline_tables(df, model_order=model_order, multiple_comparisons=multiple_comparisons)
    if heads:
        lines.append("\n" + heads)
    fails = failure_summary(df)
    if fails:
        n = int((df["status"] != "finished").sum())
        lines.append(f"\n{n} failed task(s), {len(fails)} distinct failure(s):")
        lines.extend(fails)
    return "\n".join(lines)
