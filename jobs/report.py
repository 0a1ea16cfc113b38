"""Sweep reports: a results table (Parquet), LaTeX tables, plots and a summary.

Written to ``<output_dir>/reports/`` and logged on the sweep's parent run under ``reports/``:

- ``results.parquet``: one row per planned task (the columns of :func:`jobs.tracker.run_row`:
  model, language, test, metric, status, value, effect_size, p_value, p_holm, p_bh, ci_low,
  ci_high, coverage_min, error, key, run_id, ..., n_family, ci_method), readable with
  ``pandas.read_parquet``; ``p_holm``/``p_bh`` are the p-values adjusted for multiple
  comparisons over each *family* of tasks (:func:`adjust_pvalues`; default: all tests of one
  model and metric in the sweep, ``n_family`` of them), configured by the spec's
  ``multiple_comparisons:`` (:class:`jobs.spec.MultipleComparisons`). The file is logged on the
  parent run (``reports/results.parquet``); adjusted p-values depend on the family, i.e. on
  the sweep, so each child run gets its own (``p_holm``, ``p_bh``, ``n_family``, with tags
  naming the family: :meth:`jobs.tracker.Tracker.log_adjusted`) when the report is built;
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

- ``bias_ability.csv``: when the sweep ran an LM-ability metric (perplexity, pseudo-perplexity),
  bias and LM ability side by side, one row per (language, model) (:func:`bias_ability_frame`;
  the terminal summary prints it too).

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

import contextlib
import functools
import gc
import glob
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from audit import registry
from audit.measure.perplexity import PERPLEXITY
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
    """The one order of models in every table, plot and summary: the spec's (``first``), then
    the others in natural order (:func:`audit.naming.natural_key`: ``m2`` before ``m10``)."""
    vals = list(dict.fromkeys(values))
    head = [v for v in (first or []) if v in vals]
    return head + sorted((v for v in vals if v not in head), key=natural_key)




#: At most this many body rows in one ``table`` float (about one page of ``\small`` rows on A4
#: or letter); a longer table is a ``longtable`` (LaTeX package ``longtable``) that breaks across
#: pages and repeats its header on each (:func:`latex_rows_table`).
ROWS_PER_PAGE = 40


def latex_rows_table(colspec: str, header: list[str], rows: list[str], caption: str, label: str | None = None,
                     *, max_rows: int = ROWS_PER_PAGE) -> str:
    r"""A booktabs table of ``rows`` (each ``a & b & c``, without the closing ``\\``): a
    ``table`` float holding a ``tabular`` up to ``max_rows`` rows, else a ``longtable`` (needs
    ``\usepackage{longtable}``) with the caption on top, the header repeated on every page
    (``\endfirsthead``/``\endhead``) and "continued" at the foot of every page but the last."""
    head = [r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    body = [r + r" \\" for r in rows]
    lab = [r"\label{" + label + "}"] if label else []
    if len(rows) <= max_rows:
        return "\n".join([r"\begin{table}[ht]", r"\centering", r"\small", r"\begin{tabular}{" + colspec + "}",
                          *head, *body, r"\bottomrule", r"\end{tabular}", r"\caption{" + caption + "}", *lab,
                          r"\end{table}", ""])
    ncol = len(header)
    return "\n".join([r"\begingroup", r"\small", r"\begin{longtable}{" + colspec + "}",
                      r"\caption{" + caption + "}" + "".join(lab) + r" \\", *head, r"\endfirsthead",
                      r"\multicolumn{" + str(ncol) + r"}{l}{\textit{(continued)}} \\", *head, r"\endhead",
                      r"\midrule", r"\multicolumn{" + str(ncol) + r"}{r}{\textit{continued on the next page}} \\",
                      r"\endfoot", r"\bottomrule", r"\endlastfoot", *body, r"\end{longtable}", r"\endgroup", ""])


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
    rows = [latex_escape(m) + " & " + " & ".join(_cell(cells.get((m, t)), digits, mark_col) for t in tests)
            for m in models]
    ci = ci_text(sub)
    caption = (latex_escape(metric) + f" ({latex_escape(language)}): headline value per model and test. "
               r"$^{*}$~$p<0.05$, $^{**}$~$p<0.01$, $^{***}$~$p<0.001$ (" + latex_escape(marks_text(mc)) + "); "
               + (f"intervals (plots, results.parquet): {latex_escape(ci)}; " if ci else "")
               + r"\textit{fail}: the task failed (see the run log).")
    return latex_rows_table("l" + "r" * len(tests), ["Model", *(latex_escape(t) for t in short)], rows, caption,
                            "tab:" + re.sub(r"[^A-Za-z0-9]+", "-", f"{metric}-{language}"))


#: At most this many models in one plot, and this many panels (tests, categories) or heat-map
#: columns: more are drawn in several files (``<stem>_1of4.png``, ...; :func:`plot_parts`), so
#: every figure stays readable and bounded (about 2,000 x 2,400 px) at any sweep size.
MODELS_PER_PLOT = 50
FACETS_PER_PLOT = 12
FACET_COLUMNS = 6
HEATMAP_COLUMNS = 30
#: No heat map grows past this many inches a side for its labels (2,420 px at PLOT_DPI).
MAX_FIGURE_IN = 22.0
PLOT_DPI = 110
#: Margins of the figures placed by measured text sizes (:func:`_forest_layout`,
#: :func:`_heatmap_layout`), in inches: the padding at the figure's edge, and a tick's length with
#: its label's pad (3.5 + 3.5 points).
EDGE_PAD_IN, TICK_IN = 0.08, 0.1


def _chunks(xs: list, size: int) -> list[list]:
    return [xs[i:i + size] for i in range(0, len(xs), size)] or [[]]


def plot_parts(path: Path, models: list[str], facets: list[str], *, max_models: int = MODELS_PER_PLOT,
               max_facets: int = FACETS_PER_PLOT) -> list[tuple[Path, list[str], list[str]]]:
    """How one plot is split into files: ``(path, models, facets)`` per file, at most
    ``max_models`` models and ``max_facets`` facets each. One file keeps ``path``; several are
    ``<stem>_<i>of<k>.png`` in model-then-facet order. The files of an earlier split of the
    same plot that are not among these are removed (reports are rebuilt on every invocation; a
    sweep that grew past 50 models must not keep its old single file beside the new parts)."""
    groups = [(m, f) for m in _chunks(list(models), max_models) for f in _chunks(list(facets), max_facets)]
    if len(groups) == 1:
        parts = [(path, *groups[0])]
    else:
        parts = [(path.with_name(f"{path.stem}_{i + 1}of{len(groups)}{path.suffix}"), m, f)
                 for i, (m, f) in enumerate(groups)]
    keep = {p for p, _, _ in parts}  # redrawn, or kept where drawn from the same inputs (_drawn)
    for old in [path, *path.parent.glob(f"{glob.escape(path.stem)}_*of*{path.suffix}")]:
        if old not in keep:
            old.unlink(missing_ok=True)  # an earlier invocation's split of the same plot (derived files)
    return parts


#: The PNG text chunk that holds the digest of what a plot file shows (:func:`_figure_digest`).
_DIGEST_KEY = "biasaudit-inputs"


@functools.cache
def _drawing_code() -> bytes:
    import matplotlib

    return Path(__file__).read_bytes() + matplotlib.__version__.encode()


def _figure_digest(*inputs) -> str:
    """SHA-256 of everything one plot file is drawn from: its inputs (data frames by their JSON,
    arrays by their bytes, the rest by ``repr``), this module's code and matplotlib's version."""
    h = hashlib.sha256(_drawing_code())
    for x in inputs:
        if isinstance(x, pd.DataFrame):
            b = x.to_json(orient="split", index=False, double_precision=15).encode()
        elif isinstance(x, np.ndarray):
            b = repr((x.dtype.str, x.shape)).encode() + x.tobytes()
        else:
            b = repr(x).encode()
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()


def _drawn(path: Path, digest: str) -> bool:
    """``path`` is a plot file already drawn from the inputs of ``digest`` (its PNG text chunk,
    :func:`_save`): a report rebuilt over unchanged results (a resumed sweep, a re-run with
    nothing new) keeps the file instead of drawing it again.

    Read without decoding the pixels: the text chunks :func:`_save` writes come before the image
    data, where ``Image.open`` reads them (``im.info``; ``im.text`` decoded the whole image first:
    0.46 against 0.025 CPU-seconds for the 130 plots of the eight-language smoke sweep), and a file
    that does not end with PNG's closing ``IEND`` chunk (cut short while written) is drawn again."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            f.seek(-len(_PNG_END), 2)
            if f.read() != _PNG_END:
                return False
            f.seek(0)
            with Image.open(f) as im:
                return im.format == "PNG" and im.info.get(_DIGEST_KEY) == digest
    except (OSError, ValueError, SyntaxError):  # missing, cut short or not a PNG: drawn again
        return False


#: The last 12 bytes of every whole PNG file: the empty ``IEND`` chunk and its CRC.
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _save(fig, path: Path, digest: str) -> None:
    """Write ``fig`` to ``path`` with ``digest`` in its metadata, then close it."""
    fig.savefig(path, metadata={_DIGEST_KEY: digest})
    _pyplot().close(fig)


@contextlib.contextmanager
def _figure_collected():
    """Draw one figure with the cyclic garbage collector paused, then collect its young
    generation once: the figure (its axes, ticks, texts and transforms: 7,500 to 36,000
    objects in reference cycles) is garbage once the drawing function returns and
    :func:`_save` has closed it. Collected as it was built, each young collection walked the
    half-built figure and moved it to an older generation, so every closed figure stayed behind
    until a full collection walked the whole heap again (the 192-model sweep of
    ``tests/test_reports_scale.py``: 2.0 of 12.0 CPU-seconds in collections, seven full ones;
    0.7 of 10.2 this way, and a lower peak memory). The drawing does not depend on the
    collector; a caller that turned it off keeps it off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _no_bias(metric: str) -> float:
    """The value of no bias for ``metric`` (a registered or a recorded name): its entry's
    :attr:`~audit.entries.Metric.no_bias`."""
    for name, e in registry.METRICS.items():
        if metric == name or metric in e.result_names.values():
            return e.no_bias
    return 0.0


def _wrap(text: str, width_in: float, fontsize: float = 8.0) -> str:
    """``text`` broken into lines that fit a figure ``width_in`` inches wide (a title never
    runs past the figure's edge)."""
    import textwrap

    return textwrap.fill(text, width=max(20, int(width_in * 72 / (0.55 * fontsize))))


def _n_text(ns: pd.Series) -> str:
    ns = pd.to_numeric(ns, errors="coerce").dropna()
    if not len(ns):
        return ""
    lo, hi = int(ns.min()), int(ns.max())
    return f"n={lo}" if lo == hi else f"n={lo}-{hi}"


def _lines_in(n: int, fontsize: float) -> float:
    """Height in inches of ``n`` lines of text at ``fontsize`` points (matplotlib's line spacing, 1.2)."""
    return n * fontsize * 1.2 / 72


def _text_width_in(fig, text: str, fontsize: float) -> float:
    """Width in inches of the widest line of ``text`` at ``fontsize`` points, as the figure's
    renderer draws it.

    Measured through matplotlib's own cache of text sizes (per renderer; the same renderer
    method, so the same widths): when the figure is drawn, its tick labels of the same size are
    found there instead of being measured again (the model names of every plot, measured for
    its layout: the 192-model sweep of ``tests/test_reports_scale.py`` measured 3,801 texts,
    2,413 this way)."""
    from matplotlib.font_manager import FontProperties

    r = fig.canvas.get_renderer()
    fp = FontProperties(size=fontsize)
    try:
        from matplotlib.text import _get_text_metrics_with_cache as measure
    except ImportError:  # a matplotlib without it: measured directly
        def measure(r, s, fp, ismath, dpi):
            return r.get_text_width_height_descent(s, fp, ismath=ismath)
    return max(measure(r, ln or " ", fp, False, fig.dpi)[0] for ln in text.split("\n")) / fig.dpi


def _widen_for(fig, labels: Iterable[str], fontsize: float, *, room_in: float, extra_in: float = 0.0,
               taller: bool = False) -> None:
    """Grow ``fig`` (at most :data:`MAX_FIGURE_IN`) by what the widest of ``labels`` at
    ``fontsize`` (plus ``extra_in``: a legend's marker and padding) needs beyond ``room_in``
    inches: wider, or ``taller`` for labels turned 45 degrees below the axes. A layout engine
    only shares out the figure it is given: a long model name left a one-test heat map or a
    before/after plot no axes at all (matplotlib's "constrained_layout not applied")."""
    need = max([_text_width_in(fig, t, fontsize) for t in labels] or [0.0]) + extra_in
    if taller:
        need *= math.sqrt(0.5)
    w_in, h_in = fig.get_size_inches()
    grow = max(0.0, need - room_in)
    if taller:
        fig.set_size_inches(w_in, min(h_in + grow, MAX_FIGURE_IN))
    else:
        fig.set_size_inches(min(w_in + grow, MAX_FIGURE_IN), h_in)


def _unlabelled(ax) -> None:
    """Tell matplotlib that ``ax`` has no axis labels to place (the figure's own ``supxlabel``
    names the values) and its title sits at its top (no tick labels above it; pass ``y=1.0`` to
    ``set_title``): otherwise each draw measures every tick label of the axes twice more, once
    to place each empty axis label below or beside them and once to lift the title over them
    (the dot-and-interval figures of ``tests/test_reports_scale.py``'s 192-model sweep under
    cProfile: 35.0 → 21.1 s). The pixels are the same: an empty label is not drawn, and nothing
    lies above the axes."""
    ax.xaxis.set_label_coords(0.5, 0.0)
    ax.yaxis.set_label_coords(0.0, 0.5)


def _forest_layout(fig, *, nrows: int, ncols: int, ylabels: list[str], ylabel_size: float, title: str,
                   xlabel: str, panel_title_lines: int) -> None:
    """Place the panels of :func:`_plot_forest`, its title (``fontsize`` 8) and x label (7) by
    measured text sizes instead of a layout engine: matplotlib's constrained layout measured every
    tick label of every panel on an extra draw (the default audit's reports: 20.1 CPU-seconds with
    it, 14.3 without; ``benchmarks/reports.py``). Margins in inches: left, the longest model
    label; top, the figure title and the panel titles; bottom, the x tick labels and the x label;
    between rows, a panel title and the x tick labels."""
    w_in, h_in = fig.get_size_inches()
    pad, tick = EDGE_PAD_IN, TICK_IN
    fig.suptitle(title, fontsize=8, y=1 - pad / h_in, va="top")
    fig.supxlabel(xlabel, fontsize=7, y=pad / h_in, va="bottom")
    label_w = max([_text_width_in(fig, t, ylabel_size) for t in ylabels] or [0.0])
    title_h = _lines_in(title.count("\n") + 1, 8) if title else 0.0
    ptitle_h = _lines_in(panel_title_lines, 7) + 0.04
    xtick_h = _lines_in(1, 6) + tick
    left = pad + label_w + tick
    right = 0.18  # half of the last panel's widest x tick label
    top = pad + title_h + 0.06 + ptitle_h
    bottom = pad + _lines_in(1, 7) + 0.04 + xtick_h
    between_rows = ptitle_h + xtick_h + 0.06
    between_cols = 0.3  # the inner panels share the left panel's labels
    panel_w = max(0.3, (w_in - left - right - (ncols - 1) * between_cols) / ncols)
    panel_h = max(0.2, (h_in - top - bottom - (nrows - 1) * between_rows) / nrows)
    fig.subplots_adjust(left=left / w_in, right=1 - right / w_in, top=1 - top / h_in, bottom=bottom / h_in,
                        wspace=between_cols / panel_w, hspace=between_rows / panel_h)


def _draw_forest(long: pd.DataFrame, part: Path, group: list[str], fs: list[str], i: int, n_parts: int,
                 digest: str, *, title: str, xlabel: str, ref: float) -> None:
    """File ``i`` of ``n_parts`` of :func:`_plot_forest`: the models ``group`` in the panels ``fs``,
    drawn and saved to ``part`` (a function of its own: the figure is garbage on return,
    :func:`_figure_collected`)."""
    plt = _pyplot()
    ncols = min(FACET_COLUMNS, max(1, len(fs)))
    nrows = max(1, math.ceil(len(fs) / ncols))
    panel_h = 0.15 * len(group) + 0.8
    width = max(4.5, 1.8 * ncols + 1.6)
    fig = plt.figure(figsize=(width, nrows * panel_h + 1.1), dpi=PLOT_DPI)
    ypos = {m: k for k, m in enumerate(group)}
    ylabel_size = 6 if len(group) > 20 else 7
    title_lines = 1
    for k in range(max(1, len(fs))):
        ax = fig.add_subplot(nrows, ncols, k + 1)
        ax.set_ylim(len(group) - 0.5, -0.5)
        ax.tick_params(axis="x", labelsize=6)
        if k % ncols == 0:  # the first panel of a row names the models
            ax.set_yticks(range(len(group)), group, fontsize=ylabel_size)
        else:
            ax.set_yticks([])
        # the rows' lines, one artist (a grid on the y ticks drew one line per tick and panel)
        ax.hlines(range(len(group)), 0, 1, transform=ax.get_yaxis_transform(), color="0.93", lw=0.5,
                  zorder=1)
        _unlabelled(ax)
        if k >= len(fs):
            continue
        f = fs[k]
        d = long[(long["facet"] == f) & long["model"].isin(group)]
        d = d[np.isfinite(d["value"].astype("float64"))]
        y = d["model"].map(ypos).to_numpy(dtype=np.float64)
        v = d["value"].to_numpy(dtype=np.float64)
        lo = pd.to_numeric(d["low"], errors="coerce").to_numpy(dtype=np.float64)
        hi = pd.to_numeric(d["high"], errors="coerce").to_numpy(dtype=np.float64)
        has = np.isfinite(lo) & np.isfinite(hi)
        ax.axvline(ref, color="0.6", lw=0.8)
        if has.any():
            ax.errorbar(v[has], y[has], xerr=[np.maximum(v[has] - lo[has], 0), np.maximum(hi[has] - v[has], 0)],
                        fmt="o", ms=3, capsize=2, lw=0.8, color="tab:blue")
        if (~has).any():
            ax.plot(v[~has], y[~has], "o", ms=3, color="tab:blue", mfc="white")
        n = _n_text(d["n"]) if "n" in d.columns else ""
        ax.set_title(f"{f}" + (f"\n({n})" if n else ""), fontsize=7, y=1.0)
        title_lines = max(title_lines, 2 if n else 1)
    what = f" [file {i + 1} of {n_parts}: models {group[0]} .. {group[-1]}]" if n_parts > 1 and group else ""
    _forest_layout(fig, nrows=nrows, ncols=ncols, ylabels=group, ylabel_size=ylabel_size,
                   title=_wrap(title + what, width), xlabel=xlabel, panel_title_lines=title_lines)
    _save(fig, part, digest)


def _plot_forest(long: pd.DataFrame, facets: list[str], models: list[str], path: Path, *, title: str,
                 xlabel: str, ref: float = 0.0) -> list[Path]:
    """Dot-and-interval panels: one panel per facet (a test, a category: column ``facet``),
    the models on the y axis (the same rows in every panel, in ``models`` order, labelled on
    the left, so no legend covers the data), each value a dot with its interval (``low``,
    ``high``) as a horizontal bar (none where the result has no interval), a grey line at
    ``ref`` (no bias). A panel title carries the facet's ``n`` (column ``n``, when given: the
    items the value is over; a range when models differ). Split into files by
    :func:`plot_parts`; placed by :func:`_forest_layout`; returns the paths written."""
    written = []
    parts = plot_parts(path, models, facets)
    for i, (part, group, fs) in enumerate(parts):
        digest = _figure_digest("forest", long[long["facet"].isin(fs) & long["model"].isin(group)], group, fs, title,
                                xlabel, ref, i, len(parts))
        written.append(part)
        if _drawn(part, digest):
            continue
        with _figure_collected():
            _draw_forest(long, part, group, fs, i, len(parts), digest, title=title, xlabel=xlabel, ref=ref)
    return written


def _plot_effects(sub: pd.DataFrame, metric: str, language: str, path: Path, model_order: list[str]) -> list[Path]:
    """The headline value per test (one panel each) and model (rows) with its confidence
    interval (:func:`_plot_forest`); the title names ``ci_method``."""
    ok = sub[sub["status"] == "finished"]
    tests = sorted(dict.fromkeys(ok["test"]), key=natural_key)
    models = _order(ok["model"], model_order)
    long = pd.DataFrame({"model": ok["model"], "facet": ok["test"].astype(str).str.split("/", n=1).str[-1],
                         "value": ok["value"], "low": ok["ci_low"], "high": ok["ci_high"], "n": ok["n_items"]})
    methods = sorted({str(m) for m in ok["ci_method"].dropna() if str(m)}) if "ci_method" in ok.columns else []
    title = (f"{metric} ({language}): headline value per model, bars: confidence interval"
             + (f" ({', '.join(methods)})" if methods else "") + "; hollow: no interval")
    return _plot_forest(long, [t.split("/", 1)[-1] for t in tests], models, path, title=title,
                        xlabel=f"{metric} (headline value)", ref=_no_bias(metric))


def _heatmap_layout(fig, ax, cax, *, ylabels: list[str], ylabel_size: float, xlabels: list[str], title: str,
                    footnote: str) -> None:
    """Place :func:`_plot_heatmap`'s map ``ax`` and its colour bar ``cax`` by measured text sizes
    instead of a layout engine, as :func:`_forest_layout` does: with matplotlib's constrained
    layout, ``savefig`` drew each map twice (once to measure, once to render: its 600 cell labels
    and every tick label) and the engine measured each part again (the 192-model sweep's maps
    under cProfile: 30.8 → 16.2 s).

    Margins in inches: left, the longest model label (``ylabel_size``); bottom, the test labels
    (7 points, turned 45 degrees, anchored at their right end) and the ``footnote`` (6 points,
    the x label, with matplotlib's label pad of 4 points); top, the ``title`` (9 points, its pad
    of 6 points); right, the colour bar (0.16 inches wide, as tall as 80 % of the map and centred
    on it, as ``shrink=0.8`` drew it) and its tick labels (the default 10 points, measured on the
    ticks it will draw). ``tests/test_reports_scale.py`` checks that the parts lie inside the
    figure and apart."""
    w_in, h_in = fig.get_size_inches()
    pad, tick = EDGE_PAD_IN, TICK_IN
    label_w = max([_text_width_in(fig, t, ylabel_size) for t in ylabels] or [0.0])
    xtick_w = max([_text_width_in(fig, t, 7) for t in xlabels] or [0.0])
    xtick_h = (xtick_w + _lines_in(1, 7)) * math.sqrt(0.5)  # a label turned 45 degrees: its box's height
    cb = cax.yaxis
    cb_labels = cb.get_major_formatter().format_ticks(list(cb.get_majorticklocs()))
    cb_w = max([_text_width_in(fig, t, 10) for t in cb_labels] or [0.0])
    left = pad + label_w + tick
    bottom = pad + _lines_in(footnote.count("\n") + 1, 6) + 4 / 72 + xtick_h + tick
    top = pad + _lines_in(title.count("\n") + 1, 9) + 6 / 72
    bar_w, gap = 0.16, 0.15
    right = pad + cb_w + tick + bar_w + gap
    map_w = max(0.3, w_in - left - right)
    map_h = max(0.2, h_in - top - bottom)
    ax.set_position((left / w_in, bottom / h_in, map_w / w_in, map_h / h_in))
    cax.set_position(((left + map_w + gap) / w_in, (bottom + 0.1 * map_h) / h_in, bar_w / w_in,
                      0.8 * map_h / h_in))
    ax.yaxis.set_label_coords(0.0, 0.5)  # no y label: not placed beside the 50 model names on each draw


def _draw_heatmap(mat: np.ndarray, part: Path, group: list[str], ts: list[str], i: int, n_parts: int,
                  digest: str, *, marks: dict, failed: set, metric: str, language: str, ref: float,
                  span: float, mc: MultipleComparisons) -> None:
    """File ``i`` of ``n_parts`` of :func:`_plot_heatmap`: the models ``group`` x the tests ``ts``
    (values ``mat``), drawn and saved to ``part`` (a function of its own: the figure is garbage
    on return, :func:`_figure_collected`)."""
    plt = _pyplot()
    fig = plt.figure(figsize=(max(4.0, 0.6 * len(ts) + 3.0), max(2.6, 0.22 * len(group) + 1.8)), dpi=PLOT_DPI)
    ylabel_size = 6 if len(group) > 20 else 7
    xlabels = [t.split("/", 1)[-1] for t in ts]
    _widen_for(fig, group, ylabel_size, room_in=1.0)  # the model names, left
    _widen_for(fig, xlabels, 7, room_in=0.6, taller=True)  # the tests, below
    ax, cax = fig.add_axes((0.1, 0.1, 0.6, 0.8)), fig.add_axes((0.8, 0.1, 0.05, 0.8))
    im = ax.imshow(np.ma.masked_invalid(mat), cmap="RdBu_r", vmin=ref - span, vmax=ref + span, aspect="auto")
    for a in range(len(group)):
        for b in range(len(ts)):
            if np.isfinite(mat[a, b]):
                ax.text(b, a, f"{mat[a, b]:.2f}{marks.get((group[a], ts[b]), '')}", ha="center", va="center",
                        fontsize=6, color="white" if abs(mat[a, b] - ref) > 0.6 * span else "black")
            elif (group[a], ts[b]) in failed:
                ax.text(b, a, "fail", ha="center", va="center", fontsize=6, color="0.45", style="italic")
    ax.set_xticks(range(len(ts)))
    ax.set_xticklabels(xlabels, rotation=45, ha="right", fontsize=7)
    ax.set_yticks(range(len(group)))
    ax.set_yticklabels(group, fontsize=ylabel_size)
    what = f" [file {i + 1} of {n_parts}]" if n_parts > 1 else ""
    title = _wrap(f"{metric} ({language}){what}", 0.6 * len(ts) + 2.0, 9)
    ax.set_title(title, fontsize=9, y=1.0)
    fig.colorbar(im, cax=cax)
    footnote = _wrap(f"* p<0.05, ** p<0.01, *** p<0.001: {marks_text(mc)}", 0.6 * len(ts) + 2.0, 6)
    ax.set_xlabel(footnote, fontsize=6, color="0.3")
    _heatmap_layout(fig, ax, cax, ylabels=group, ylabel_size=ylabel_size, xlabels=xlabels, title=title,
                    footnote=footnote)
    _save(fig, part, digest)


def _plot_heatmap(sub: pd.DataFrame, metric: str, language: str, path: Path, model_order: list[str],
                  mc: MultipleComparisons | None = None) -> list[Path]:
    """Model x test heat map of the headline value (diverging colours centred on no bias,
    the entry's ``no_bias``, one colour scale over all files), annotated with the significance marks; split by :func:`plot_parts`."""
    ok = sub[sub["status"] == "finished"]
    tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
    models = _order(sub["model"], model_order)
    mc = mc or MultipleComparisons()
    # by column, not by row (``iterrows`` built a Series per row: 0.8 of the 192-model sweep's
    # CPU-seconds under cProfile, three passes over its 1,920 rows); the same values
    keys = list(zip(ok["model"], ok["test"]))
    vals = dict(zip(keys, ok["value"]))
    marks = dict(zip(keys, map(significance_mark, ok[MARK_COLUMNS[mc.marks]])))
    failed = {k for k, st in zip(zip(sub["model"], sub["test"]), sub["status"]) if st != "finished"}
    ref = _no_bias(metric)  # the colours diverge from no bias (CrowS-Pairs: 50)
    finite = [abs(v - ref) for v in vals.values() if v is not None and np.isfinite(v)]
    span = max(finite) if finite and max(finite) > 0 else 1.0
    written = []
    parts = plot_parts(path, models, tests, max_facets=HEATMAP_COLUMNS)
    for i, (part, group, ts) in enumerate(parts):
        mat = np.array([[vals.get((m, t), np.nan) for t in ts] for m in group],
                       dtype=np.float64).reshape(len(group), len(ts))
        digest = _figure_digest("heatmap", mat, [[marks.get((m, t), "") for t in ts] for m in group],
                                [[(m, t) in failed for t in ts] for m in group], group, ts, metric, language, ref,
                                span, marks_text(mc), i, len(parts))
        written.append(part)
        if _drawn(part, digest):
            continue
        with _figure_collected():
            _draw_heatmap(mat, part, group, ts, i, len(parts), digest, marks=marks, failed=failed, metric=metric,
                          language=language, ref=ref, span=span, mc=mc)
    return written


def plot_comparison(table: pd.DataFrame, path: Path, *, title: str, new_label: str = "new",
                    baseline_label=lambda b: f"baseline {b}") -> None:
    """Two revisions side by side (the watcher's regression report): per compared (baseline,
    test, metric) row of a comparison table (:mod:`audit.regression`, with each side's own
    interval ``ci_a_low`` ... ``ci_b_high``), the baseline's headline (grey) and the new
    revision's (blue; red where the row is flagged a regression), each with its interval."""
    plt = _pyplot()
    ok = table[table["status"] == "compared"]
    base_col = ok["baseline"] if "baseline" in ok.columns else pd.Series([""] * len(ok), index=ok.index)
    names = ok["language"].astype(str) + "/" + ok["test"].astype(str)
    keys = sorted(dict.fromkeys(zip(base_col, names, ok["metric"])), key=lambda k: (str(k[0]), natural_key(k[1]), k[2]))
    fig, ax = plt.subplots(figsize=(max(4.5, 0.9 * len(keys) + 2.5), 3.8), dpi=110, layout="constrained")
    ticks = [f"{t.split('/', 1)[-1]}\n{m}" for _, t, m in keys]
    each = max([_text_width_in(fig, x, 8) for x in ticks] or [0.0]) + 0.1  # a tick label's width, side by side
    fig.set_size_inches(min(max(4.5, max(0.9, each) * len(keys) + 2.5), MAX_FIGURE_IN), 3.8)
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
    ax.set_xticklabels(ticks, fontsize=8)
    ax.set_ylabel("headline value (interval: each audit's own)")
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles))
    # the legend beside the axes, never over the data or the axis label; the figure grows by its width
    ax.legend(seen.values(), seen.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes_w = fig.get_size_inches()[0] - 1.0  # the title is centred on the axes: wrapped to their width
    _widen_for(fig, seen.keys(), 7, room_in=0.0, extra_in=0.6)
    ax.set_title(_wrap(title, axes_w, 9), fontsize=9)
    fig.savefig(path)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# Breakdowns: a headline by category, group or bias type (the registry entry's ``breakdowns``)
# --------------------------------------------------------------------------------------


#: Where a breakdown category's item count is recorded, first found wins: CrowS-Pairs
#: ``n_pairs``, BBQ ``n_items``.
N_FIELDS = ("n_pairs", "n_items", "n_templates", "n")
BREAKDOWN_COLUMNS = ["model", "language", "test", "category", "score", "value", "low", "high", "n", "ci_method"]


def breakdown_frame(df: pd.DataFrame, metric: str, table: str, scores: Iterable[str]) -> pd.DataFrame:
    """Long table of one breakdown of the finished results recorded as ``metric`` (the
    measurement's own name: ``crows_pairs`` for masked LMs and ``crows_pairs_causal`` for
    causal ones are different measurements and never mixed): ``model, language, test,
    category, score, value, low, high, n, ci_method`` from the results' ``breakdowns`` column
    (the flattened ``<table>.<category>.<score>`` numbers).

    The interval of a score is ``<table>.<category>.ci.<score>_low/_high`` (BBQ: one per
    score) or, for the first score the registry lists (the headline, e.g. CrowS-Pairs
    ``metric_score``), the category's unnamed ``ci_low/ci_high`` (CrowS-Pairs: the Wilson
    interval); NaN where the metric gives none. ``n``: the category's item count (the first
    of :data:`N_FIELDS` recorded: pairs, questions), NaN when none is. ``ci_method``: the
    results' interval method."""
    rows = []
    scores = list(scores)
    sub = df[(df["metric"] == metric) & (df["status"] == "finished")]
    for r in sub.itertuples(index=False):
        raw = getattr(r, "breakdowns", None)
        if not isinstance(raw, str) or not raw:
            continue
        nums = json.loads(raw)
        cats = sorted({k[len(table) + 1:].split(".", 1)[0] for k in nums if k.startswith(table + ".")}, key=natural_key)
        for c in cats:
            pre = f"{table}.{c}."
            n = next((nums[pre + f] for f in N_FIELDS if nums.get(pre + f) is not None), None)
            for j, s in enumerate(scores):
                v = nums.get(pre + s)
                if v is None:
                    continue
                lo, hi = nums.get(f"{pre}ci.{s}_low"), nums.get(f"{pre}ci.{s}_high")
                if lo is None and hi is None and j == 0:
                    lo, hi = nums.get(pre + "ci_low"), nums.get(pre + "ci_high")
                rows.append({"model": r.model, "language": r.language, "test": r.test, "category": c, "score": s,
                             "value": v, "low": lo, "high": hi, "n": n,
                             "ci_method": getattr(r, "ci_method", None) if lo is not None else None})
    out = pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)
    for c in ("value", "low", "high", "n"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("float64")
    return out


def _recorded_names(name: str) -> list[str]:
    """The measurements a registered metric records (its name per model kind, e.g.
    ``crows_pairs`` and ``crows_pairs_causal``): each is reported on its own."""
    e = registry.get(name)
    return list(dict.fromkeys([name, *e.result_names.values()]))


def breakdown_latex(bd: pd.DataFrame, metric: str, table: str, score: str, *, model_order: list[str] | None = None,
                    digits: int = 3) -> str:
    """Model x category table of one score of a breakdown: each cell the value, its interval in
    brackets where the metric gives one, and its item count ``n``; the header names each
    category's n when every model has the same (the usual case: one data set)."""
    sub = bd[bd["score"] == score]
    cats = sorted(dict.fromkeys(sub["category"]), key=natural_key)
    rows_models = _order(sub["model"], model_order)
    head = []
    for c in cats:
        n = _n_text(sub[sub["category"] == c]["n"])
        head.append(latex_escape(c) + (f" ({n})" if n else ""))
    first: dict[tuple, tuple] = {}  # (model, category) -> its first row's value, low, high, n
    for key, vals in zip(zip(sub["model"], sub["category"]),
                         sub[["value", "low", "high", "n"]].itertuples(index=False, name=None)):
        first.setdefault(key, vals)
    rows = []
    for m in rows_models:
        cells = []
        for c in cats:
            if (m, c) not in first:
                cells.append("--")
                continue
            v, lo, hi, n = first[(m, c)]
            cell = f"{v:.{digits}f}"
            if pd.notna(lo) and pd.notna(hi):
                cell += f" [{lo:.2f}, {hi:.2f}]"
            if pd.notna(n):
                cell += f" n={int(n)}"
            cells.append(cell)
        rows.append(latex_escape(m) + " & " + " & ".join(cells))
    tests = ", ".join(sorted(dict.fromkeys(sub["test"])))
    methods = sorted({str(x) for x in sub["ci_method"].dropna() if str(x)}) if "ci_method" in sub.columns else []
    ci = (f"brackets: {', '.join(methods)} confidence interval" if methods else
          "brackets: confidence interval where the metric gives one")
    caption = (f"{latex_escape(metric)}: {latex_escape(score)} by {latex_escape(table.replace('per_', ''))} "
               f"({latex_escape(tests)}); {latex_escape(ci)}; n: items in the category.")
    return latex_rows_table("l" + "r" * len(cats), ["model", *head], rows, caption)


def _plot_breakdown(bd: pd.DataFrame, metric: str, table: str, score: str, path: Path,
                    model_order: list[str]) -> list[Path]:
    """One panel per category (titled with its n), models as rows, the score with its interval
    as error bars (:func:`_plot_forest`)."""
    sub = bd[bd["score"] == score]
    cats = sorted(dict.fromkeys(sub["category"]), key=natural_key)
    models = _order(sub["model"], model_order)
    methods = sorted({str(x) for x in sub["ci_method"].dropna() if str(x)}) if "ci_method" in sub.columns else []
    long = sub.rename(columns={"category": "facet"})
    tests = ", ".join(sorted(dict.fromkeys(sub["test"].astype(str))))
    title = (f"{metric} ({tests}): {score} by {table.replace('per_', '')}; bars: "
             + (f"{', '.join(methods)} confidence interval" if methods else "confidence interval")
             + "; hollow: no interval")
    return _plot_forest(long, cats, models, path, title=title, xlabel=score,
                        ref=_no_bias(metric) if score.endswith("_score") else 0.0)


def write_breakdowns(df: pd.DataFrame, out_dir: str | Path, *, model_order: list[str] | None = None) -> list[Path]:
    """For every metric whose registry entry declares breakdowns, each measurement it records
    (``crows_pairs`` and ``crows_pairs_causal`` apart), and every language and test (one
    language may hold several tests of a metric, e.g. CrowS-Pairs and its revised set): a
    LaTeX table (model x category) of each score and a plot of the first, under ``tables/``
    and ``plots/``; plus ``breakdowns.parquet`` (the long table of all of them, with ``n`` and
    the interval, ``metric`` the measurement's name)."""
    out = Path(out_dir)
    written: list[Path] = []
    frames = []
    if "breakdowns" not in df.columns:
        return written
    for entry_name, e in registry.METRICS.items():
        for name in _recorded_names(entry_name):
            for table, scores in e.breakdowns:
                bd = breakdown_frame(df, name, table, scores)
                if not len(bd):
                    continue
                frames.append(bd.assign(metric=name, table=table))
                for (lang, test), sub in bd.groupby(["language", "test"], sort=True):
                    for k, score in enumerate(scores):
                        if not (sub["score"] == score).any():
                            continue
                        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-",
                                      f"{name}_{lang}_{str(test).rsplit('/', 1)[-1]}_{table}_{score}")
                        tp = out / "tables" / f"{stem}.tex"
                        tp.write_text(breakdown_latex(sub, name, table, score, model_order=model_order),
                                      encoding="utf-8")
                        written.append(tp)
                        if k == 0:
                            written += _plot_breakdown(sub, name, table, score, out / "plots" / f"{stem}.png",
                                                       model_order or [])
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
            written += _plot_effects(sub, metric, lang, out / "plots" / f"effects_{stem}.png", model_order or [])
            written += _plot_heatmap(sub, metric, lang, out / "plots" / f"heatmap_{stem}.png", model_order or [], mc)
    written += write_breakdowns(df, out, model_order=model_order)
    ability = bias_ability_frame(df, model_order=model_order)
    if not ability.empty:
        p = out / "bias_ability.csv"
        ability.to_csv(p, index=False)
        written.append(p)
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
    plt = _pyplot()
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
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the data
    axes_w = fig.get_size_inches()[0] - 1.0 - 1.0  # the title is centred on the axes: wrapped to their width
    _widen_for(fig, ["original", *models], 7, room_in=1.0, extra_in=0.6)  # the legend's width, right
    _widen_for(fig, [t.split("/", 1)[-1] for t in tests], 10, room_in=0.8, taller=True)  # the tests, below
    ax.set_title(_wrap(f"{metric} ({language}): before (grey) and after debiasing", axes_w, 12))
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


def _headline_distribution(sub: pd.DataFrame, metric: str, lang: str, tests: list[str], mark_col: str,
                           mc: MultipleComparisons, digits: int) -> str:
    """One line per test instead of one per model: how many models, how many failed, the
    smallest, median and largest headline value (with the models holding the extremes) and how
    many are significant at 0.05 (the p-value the marks read)."""
    rows = []
    for t in tests:
        x = sub[sub["test"] == t]
        ok = x[(x["status"] == "finished") & np.isfinite(x["value"].astype("float64"))]
        v = ok["value"].astype("float64")
        lo, hi = (ok.loc[v.idxmin()], ok.loc[v.idxmax()]) if len(ok) else (None, None)
        rows.append({"test": t.split("/", 1)[1] if t.startswith(f"{lang}/") else t, "models": x["model"].nunique(),
                     "failed": int((x["status"] != "finished").sum()),
                     "min": f"{lo['value']:.{digits}f} ({lo['model']})" if lo is not None else "",
                     "median": f"{v.median():.{digits}f}" if len(ok) else "",
                     "max": f"{hi['value']:.{digits}f} ({hi['model']})" if hi is not None else "",
                     "p<0.05": int((ok[mark_col].astype("float64") < 0.05).sum())})
    tab = pd.DataFrame(rows).set_index("test")
    n = sub["model"].nunique()
    return (f"{metric} ({lang}): headline value over {n} models, per test (per model: tables/, "
            f"results.parquet); p<0.05: {marks_text(mc)}\n" + tab.to_string())


def headline_tables(df: pd.DataFrame, *, model_order: list[str] | None = None, digits: int = 3,
                    max_columns: int = 8, multiple_comparisons: MultipleComparisons | None = None,
                    max_models: int = 30) -> str:
    """The headline values as plain text, one block per metric and language like the LaTeX
    tables: models (rows) x tests (columns), the value with the significance marks of
    :func:`significance_mark`, ``fail`` for a failed task, empty where nothing was planned;
    several tasks in one cell (the metric with two parameter sets) are joined with ``/``.
    Blocks wider than ``max_columns`` tests are split. Over ``max_models`` models a block is
    one line per test instead (:func:`_headline_distribution`: models, failures, min, median,
    max, how many significant). ``""`` when nothing finished."""
    if df.empty or not (df["status"] == "finished").any():
        return ""
    mc = multiple_comparisons or MultipleComparisons()
    df = _with_adjusted(df, multiple_comparisons)
    mark_col = MARK_COLUMNS[mc.marks]
    blocks = []
    for (metric, lang), sub in df.groupby(["metric", "language"], sort=True):
        models = _order(sub["model"], model_order)
        tests = sorted(dict.fromkeys(sub["test"]), key=natural_key)
        if len(models) > max_models:
            blocks.append(_headline_distribution(sub, metric, lang, tests, mark_col, mc, digits))
            continue
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


def status_counts(df: pd.DataFrame, *, model_order: list[str] | None = None) -> str:
    """Task counts per model and status, what is uniform collapsed: ``192 models: all 576 tasks
    finished`` when every task finished; otherwise a totals line, one line for the models
    whose tasks all finished, and a model x status table of the others only (models in the
    one order of every table: :func:`_order`)."""
    models = _order(df["model"], model_order)
    statuses = sorted(set(df["status"].astype(str)), key=lambda st: (st != "finished", st))
    tab = pd.crosstab(df["model"].astype(str), df["status"].astype(str)).reindex(index=models, columns=statuses,
                                                                                fill_value=0)
    n_done = int(tab["finished"].sum()) if "finished" in tab.columns else 0
    clean = [m for m in models if tab.loc[m].sum() == tab.loc[m].get("finished", 0)]
    word = "model" if len(models) == 1 else "models"
    if len(clean) == len(models):
        return f"{len(models)} {word}: all {n_done} task(s) finished"
    totals = ", ".join(f"{int(tab[st].sum())} {st}" for st in statuses)
    lines = [f"{len(models)} {word}, {len(df)} task(s): {totals}"]
    if clean:
        done = int(tab.loc[clean].sum().sum())
        lines.append(f"{len(clean)} model(s): all {done} of their task(s) finished")
    rest = tab.loc[[m for m in models if m not in clean]]
    rest.index.name, rest.columns.name = "model", None
    lines.append(rest.to_string())
    return "\n".join(lines)


#: LM-ability metrics as results record them (the metrics of the perplexity family and their
#: per-kind result names; lower = better model), reported beside the bias scores.
ABILITY_METRICS = tuple(dict.fromkeys(
    n for m in registry.names() if registry.get(m).family is PERPLEXITY
    for n in (m, *registry.get(m).result_names.values())))


def bias_ability_frame(df: pd.DataFrame, *, model_order: list[str] | None = None) -> pd.DataFrame:
    """Bias and LM ability side by side: one row per (language, model), one column per metric:
    for a bias metric the mean of its finished headline values over the language's tests (the
    effect size for WEAT/SEAT/LPBS; ``<metric>_n``: how many tests), for an LM-ability metric
    (:data:`ABILITY_METRICS`) its value on the held-out text. Empty when the sweep ran no
    LM-ability metric or nothing finished (docs/mitigation.md)."""
    fin = df[df["status"] == "finished"] if not df.empty else df
    if fin.empty or not fin["metric"].isin(ABILITY_METRICS).any():
        return pd.DataFrame()
    metrics = sorted(set(fin["metric"]) - set(ABILITY_METRICS)) + [m for m in ABILITY_METRICS
                                                                     if m in set(fin["metric"])]
    rows = []
    for lang in sorted(set(fin["language"])):
        sub = fin[fin["language"] == lang]
        for model in _order(sub["model"], model_order):
            ms = sub[sub["model"] == model]
            row: dict = {"language": lang, "model": model}
            for metric in metrics:
                vals = pd.to_numeric(ms.loc[ms["metric"] == metric, "value"], errors="coerce")
                row[metric] = float(vals.mean()) if vals.notna().any() else np.nan
                if metric not in ABILITY_METRICS:
                    row[f"{metric}_n"] = int(vals.notna().sum())
            rows.append(row)
    return pd.DataFrame(rows)


def bias_ability_text(df: pd.DataFrame, *, model_order: list[str] | None = None, digits: int = 3) -> str:
    """:func:`bias_ability_frame` as plain text blocks, one per language (``""`` when empty)."""
    ba = bias_ability_frame(df, model_order=model_order)
    if ba.empty:
        return ""
    blocks = []
    for lang, sub in ba.groupby("language", sort=True):
        tab = sub.drop(columns=["language"] + [c for c in sub.columns if c.endswith("_n")]).set_index("model")
        tab = tab.dropna(axis=1, how="all")
        head = (f"bias and LM ability ({lang}): mean headline value over the tests per bias metric; "
                "perplexity / pseudo-perplexity on the held-out text (lower = better model)")
        blocks.append(head + "\n" + tab.to_string(float_format=lambda v: f"{v:.{digits}f}", na_rep=""))
    return "\n\n".join(blocks)


def summary_table(df: pd.DataFrame, *, model_order: list[str] | None = None,
                  multiple_comparisons: MultipleComparisons | None = None) -> str:
    """A terminal summary: counts per model and status, the headline values (model x test per
    metric and language, :func:`headline_tables`), then each distinct failure once with its
    count (:func:`failure_summary`)."""
    if df.empty:
        return "no tasks"
    lines = [status_counts(df, model_order=model_order)]
    heads = headline_tables(df, model_order=model_order, multiple_comparisons=multiple_comparisons)
    if heads:
        lines.append("\n" + heads)
    ability = bias_ability_text(df, model_order=model_order)
    if ability:
        lines.append("\n" + ability)
    fails = failure_summary(df)
    if fails:
        n = int((df["status"] != "finished").sum())
        lines.append(f"\n{n} failed task(s), {len(fails)} distinct failure(s):")
        lines.extend(fails)
    return "\n".join(lines)
