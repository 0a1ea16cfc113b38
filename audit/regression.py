"""Release-over-release comparison of two models, test by test, and the regression rule.

``audit compare A B`` (:func:`compare_models`) measures both models on the same tests and, for
each shared (test, metric), compares the headlines with the metric's paired comparison (its
:class:`audit.compare.MetricComparer`, declared in the registry: :func:`audit.registry.comparer`):
the difference ``delta = value_B - value_A`` with a paired bootstrap interval, the change in
bias magnitude ``delta_abs = |value_B - neutral| - |value_A - neutral|`` (neutral 0; 50 for
CrowS-Pairs), and a p-value for "no difference" (two-sided by default). The p-values are
adjusted for multiple comparisons over the compared tests of each metric (Holm and
Benjamini-Hochberg, :mod:`audit.multitest`; family: ``metric``).

Same items on both models
-------------------------
Both models are measured on the same words: a static model may lack a word the other has (or
drop a pair whose partner it lacks); those words are left out of *both* models' measurements
(the test is measured again on the words found in both) and listed in ``missing_a`` /
``missing_b`` (the words of the test model A or B lacks). Sentence tests (SEAT, LPBS,
CrowS-Pairs) measure every item on every model; a per-item table that still differs is matched
on the items both hold and the others are listed in ``dropped_items``.

The regression rule (:func:`flag_regressions`; ``audit compare --fail-on-regression`` and the
watcher's regression check, :mod:`jobs.watch.regression`, use this one function)::

    regression  <=>  status == "compared"  and  delta_abs >= min_increase  and  p_adj <= alpha

where ``p_adj`` is the Holm-adjusted p-value (``adjust="bh"``: Benjamini-Hochberg) of the
comparison's test. ``delta_abs`` is the *increase in bias magnitude* (|effect size| for WEAT);
a change of sign with a smaller magnitude is not a regression.

No Ray, no MLflow here: the comparison of two finished sweeps in MLflow is
:mod:`jobs.compare_runs`, which uses the same comparers on the stored per-item tables.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Sequence

import pandas as pd

from audit import catalog, registry, runner
from audit import schema
from audit.errors import AuditError, DataError, ParameterError
from audit.measure.words import paired_role
from audit.multitest import METHODS, adjust_rows
from audit.suites import WordSet, WordTest

__all__ = [
    "COLUMNS", "EXIT_OK", "EXIT_REGRESSION", "EXIT_INPUT", "EXIT_INCOMPLETE", "RUN_PREFIXES",
    "FAMILY", "second_reference", "common_test", "comparison_row", "compare_task", "compare_models",
    "adjust", "flag_regressions", "exit_status", "format_markdown", "default_tests",
]

#: ``audit compare`` exit statuses: no regression (or not asked for); a regression under
#: ``--fail-on-regression``; bad input (one line); some (test, metric) could not be compared.
EXIT_OK, EXIT_REGRESSION, EXIT_INPUT, EXIT_INCOMPLETE = 0, 1, 2, 3

#: References to finished sweeps in MLflow (``run:<parent run id>``, ``sweep:<sweep name>``):
#: compared by the service command (:mod:`jobs.compare_runs`), not here.
RUN_PREFIXES = ("run:", "sweep:")

#: The multiple-comparison family of a comparison table: all compared tests of one metric.
FAMILY = ("metric",)

#: The columns of a comparison table, in order.
COLUMNS = [
    "test", "language", "metric", "status", "value_a", "value_b", "delta", "ci_low", "ci_high", "delta_abs",
    "ci_abs_low", "ci_abs_high", "p_value", "p_method", "p_holm", "p_bh", "n_family", "n_items", "missing_a",
    "missing_b", "dropped_items", "ci_method", "null_hypothesis", "alternative", "quantity", "regression", "error",
]


def second_reference(a: str, b: str) -> str:
    """Model B's reference: ``@rev`` means model A at revision ``rev`` (``org/name@v1`` and
    ``@v2`` -> ``org/name@v2``); anything else is a reference of its own."""
    if b.startswith("@"):
        if not b[1:]:
            raise ParameterError("model B '@': give a revision after '@'")
        return a.split("@", 1)[0] + b
    return b


def default_tests(language: str) -> list[str]:
    """The shipped tests of ``language`` whose data is present (qualified names)."""
    df = catalog.list_tests(language)
    return [str(r["name"]) for _, r in df.iterrows() if bool(r.get("available", True))]


# --------------------------------------------------------------------------------------
# The same words on both models
# --------------------------------------------------------------------------------------


def common_test(test: WordTest, meas_a, meas_b, metric: str, params: dict[str, Any]
                ) -> tuple[WordTest | None, dict[str, list[str]], dict[str, list[str]]]:
    """The test restricted to the words both measurements hold, or ``None`` when they hold the
    same words; and, per set name, the test's words each model lacks (``missing_a``,
    ``missing_b``). Sets whose rows pair up (the metric's paired side) keep position ``i`` only
    when every one of their words at ``i`` is in both models, so the pairs stay aligned."""
    labels = [f"target{i}" for i in range(len(test.targets))] + [f"attribute{i}" for i in range(len(test.attributes))]
    sets = [*test.targets, *test.attributes]
    found_a = {k: set(meas_a.labels.get(k, ())) for k in labels}
    found_b = {k: set(meas_b.labels.get(k, ())) for k in labels}
    missing_a = {s.name: [w for w in s.words if w not in found_a[k]] for k, s in zip(labels, sets)}
    missing_b = {s.name: [w for w in s.words if w not in found_b[k]] for k, s in zip(labels, sets)}
    if all(list(meas_a.labels.get(k, ())) == list(meas_b.labels.get(k, ())) for k in labels):
        return None, missing_a, missing_b
    both = {k: found_a[k] & found_b[k] for k in labels}
    paired = paired_role(registry.get(metric), params, test)
    keep: dict[str, list[str]] = {k: [w for w in s.words if w in both[k]] for k, s in zip(labels, sets)}
    for side, prefix in (("targets", "target"), ("attributes", "attribute")):
        group = [k for k in labels if k.startswith(prefix)]
        group_sets = [s for k, s in zip(labels, sets) if k.startswith(prefix)]
        if paired == side and len({len(s.words) for s in group_sets}) == 1:
            pos = [i for i in range(len(group_sets[0].words))
                   if all(s.words[i] in both[k] for k, s in zip(group, group_sets))]
            for k, s in zip(group, group_sets):
                keep[k] = [s.words[i] for i in pos]
    empty = [s.name for k, s in zip(labels, sets) if not keep[k]]
    if empty:
        raise DataError(f"test {test.name}: no word of set(s) {', '.join(empty)} is in both models")
    nt = len(test.targets)
    reduced = dataclasses.replace(
        test,
        targets=tuple(WordSet(s.name, tuple(keep[k])) for k, s in zip(labels[:nt], test.targets)),
        attributes=tuple(WordSet(s.name, tuple(keep[k])) for k, s in zip(labels[nt:], test.attributes)),
    )
    return reduced, missing_a, missing_b


def _words(missing: dict[str, list[str]]) -> str:
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in missing.items() if v)


# --------------------------------------------------------------------------------------
# One (test, metric)
# --------------------------------------------------------------------------------------


def comparison_row(comparison, comparer, *, test: str, language: str, metric: str,
                   dropped: Sequence[tuple] = (), missing_a: str = "", missing_b: str = "") -> dict[str, Any]:
    """A row of the comparison table from an :class:`audit.compare.Comparison` (the magnitude
    change measured from the metric's neutral value)."""
    n = float(comparison_neutral(comparer))
    va, vb = comparison.value_a, comparison.value_b
    ci = comparison.ci or [None, None]
    ci_abs = (comparison.ci_abs or [None, None]) if n == 0.0 else [None, None]
    return {
        "test": test, "language": language, "metric": metric, "status": "compared", "value_a": va, "value_b": vb,
        "delta": comparison.delta, "ci_low": ci[0], "ci_high": ci[1], "delta_abs": abs(vb - n) - abs(va - n),
        "ci_abs_low": ci_abs[0], "ci_abs_high": ci_abs[1], "p_value": comparison.p_value,
        "p_method": comparison.p_method, "p_min": getattr(comparison, "p_min", None),
        "p_convention": getattr(comparison, "p_convention", None), "n_items": comparison.n_items,
        "missing_a": missing_a,
        "missing_b": missing_b, "dropped_items": "; ".join("/".join(map(str, d)) for d in dropped),
        "ci_method": comparison.ci_method, "null_hypothesis": comparison.null_hypothesis,
        "alternative": comparison.alternative, "quantity": comparison.quantity, "error": None,
    }


def comparison_neutral(comparer) -> float:
    return float(getattr(comparer, "neutral", 0.0))


def _skip(test: str, language: str, metric: str, status: str, why: str) -> dict[str, Any]:
    return {"test": test, "language": language, "metric": metric, "status": status, "error": why}


def compare_task(model_a: runner.LoadedModel, model_b: runner.LoadedModel, test, metric: str,
                 params: dict[str, Any] | None = None, *, seed: int | None = 0, **options: Any) -> dict[str, Any]:
    """One row of the comparison table: measure ``test`` on both models (on the words both
    hold), analyse each, compare. ``options``: :data:`audit.compare.COMPARE_OPTIONS` except
    ``seed``. A metric without a comparer gives a ``not comparable`` row."""
    params = dict(params or {})
    e = registry.get(metric)
    name, language = test.name, test.language
    comp = registry.comparer(metric)
    if comp is None:
        return _skip(name, language, metric, "not comparable",
                     f"{metric} offers no paired comparison (no per-item statistic)")
    for which, model in (("A", model_a), ("B", model_b)):
        why = registry.kind_reason(metric, model.kind)
        if why:
            return _skip(name, language, e.result_name(model.kind), "not applicable", f"model {which}: {why}")
    ma = _measure(model_a, test, metric, params, "A")
    mb = _measure(model_b, test, metric, params, "B")
    missing_a = missing_b = ""
    if isinstance(test, WordTest):
        _, ap = registry.split_params(metric, params)
        reduced, ma_missing, mb_missing = common_test(test, ma, mb, metric, ap)
        missing_a, missing_b = _words(ma_missing), _words(mb_missing)
        if reduced is not None:
            ma = _measure(model_a, reduced, metric, params, "A")
            mb = _measure(model_b, reduced, metric, params, "B")
    full = {**e.params, **registry.split_params(metric, params)[1]}
    opts = {**options, "seed": seed}
    if comp.vectors is not None and ma.targets and mb.targets:
        c, dropped = comp.from_measurements(ma, mb, full, **opts), []
    else:
        oa = runner.analyse(ma, metric, params, seed=seed)
        ob = runner.analyse(mb, metric, params, seed=seed)
        c, dropped = comp.from_items(oa.items, ob.items, full, **opts)
    return comparison_row(c, comp, test=name, language=language, metric=e.result_name(model_a.kind),
                          dropped=dropped, missing_a=missing_a, missing_b=missing_b)


def _measure(model, test, metric: str, params: dict[str, Any], which: str):
    try:
        return runner.measure(model, test, metric, params)
    except AuditError as err:
        raise type(err)(f"model {which} ({model.ref}): {err}") from None


# --------------------------------------------------------------------------------------
# Many tests
# --------------------------------------------------------------------------------------


def compare_models(
    a: str | runner.LoadedModel,
    b: str | runner.LoadedModel,
    *,
    tests: Sequence[Any] | None = None,
    metrics: Sequence[str] | None = None,
    language: str | None = None,
    params: dict[str, Any] | None = None,
    seed: int | None = 0,
    options_a: dict[str, Any] | None = None,
    options_b: dict[str, Any] | None = None,
    say: Callable[[str], None] | None = None,
    **options: Any,
) -> tuple[pd.DataFrame, dict[str, dict[str, str]]]:
    """Compare model B with model A on ``tests`` x ``metrics``.

    a, b:      references as ``audit score`` takes them (or loaded models); B as ``@rev`` is
               A's model at another revision (:func:`second_reference`).
    tests:     names, files or test objects (default: the shipped tests of ``language``, English
               when ``None``); a bare name with ``language`` is that language's version.
    metrics:   metric names (default: the first registered metric, WEAT).
    params:    task parameters of every task (look-up, ``ddof``, ``ci_method`` ...).
    options:   ``alternative``, ``quantity``, ``n_bootstrap``, ``permutations``, ``confidence``
               of the comparisons (:mod:`audit.compare`).

    Returns the comparison table (:data:`COLUMNS`, one row per (test, metric) the metric
    applies to; the p-values adjusted per metric: :func:`adjust`) and each model's description
    (``model``, ``backend``, ``revision``, ``kind``).
    """
    params = dict(params or {})
    metrics = list(metrics or [registry.names()[0]])
    for m in metrics:
        registry.get(m)
    explicit = tests is not None
    loaded = [runner.load_test(t, language=language) for t in (tests if explicit else default_tests(language or "en"))]
    pairs = [(t, m) for t in loaded for m in metrics if registry.applies(m, t, params=params) is None]
    if explicit:
        for t in loaded:
            for m in metrics:
                why = registry.applies(m, t, params=params)
                if why and say:
                    say(f"skipped {t.name} x {m}: {why}")
    if not pairs:
        raise ParameterError(f"no test applies to metric(s) {', '.join(metrics)} "
                             f"({len(loaded)} test(s) of language {language!r} tried)")
    words: set[str] = set()
    for t, m in pairs:
        words |= runner.words_for(m, t, params) or set()
    if isinstance(a, str) and isinstance(b, str):
        b = second_reference(a, b)
    models = []
    for which, ref, opts in (("A", a, options_a), ("B", b, options_b)):
        if isinstance(ref, runner.LoadedModel):
            models.append(ref)
            continue
        try:
            models.append(runner.load_model(ref, words=words or None, **(opts or {})))
        except AuditError as err:
            raise type(err)(f"model {which}: {err}") from None
    model_a, model_b = models
    rows = []
    for t, m in pairs:
        if say:
            say(f"comparing {t.language}/{t.name} x {m}")
        try:
            rows.append(compare_task(model_a, model_b, t, m, params, seed=seed, **options))
        except AuditError as err:
            rows.append(_skip(t.name, t.language, m, "failed", str(err)))
    return adjust(pd.DataFrame(rows)), {"A": model_a.describe(), "B": model_b.describe()}


def adjust(df: pd.DataFrame, family: Sequence[str] = FAMILY) -> pd.DataFrame:
    """The comparison table with every column of :data:`COLUMNS` and the Holm and
    Benjamini-Hochberg adjusted p-values of the compared rows per ``family`` (default: each
    metric's compared tests; rows not compared get none)."""
    df = df.copy()
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    for c in ("value_a", "value_b", "delta", "ci_low", "ci_high", "delta_abs", "ci_abs_low", "ci_abs_high",
              "p_value"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    df = adjust_rows(df, (df["status"] == "compared").to_numpy(), family=tuple(family), unadjusted_n_family=0)
    df["n_family"] = df["n_family"].astype("int64")
    return df[COLUMNS + [c for c in df.columns if c not in COLUMNS]].reset_index(drop=True)


def flag_regressions(df: pd.DataFrame, *, min_increase: float = 0.0, alpha: float = 0.05,
                     adjust_method: str = "holm") -> pd.DataFrame:
    """The table with ``regression`` set (module docstring): compared, ``delta_abs >=
    min_increase`` and the adjusted p-value (``adjust_method``: ``holm`` or ``bh``) ``<= alpha``."""
    if adjust_method not in METHODS:
        raise ParameterError(f"unknown p-value adjustment {adjust_method!r}; methods: {', '.join(METHODS)}")
    min_increase = schema.number(min_increase, "min_increase", 0.0)
    alpha = schema.number(alpha, "alpha", 0.0, strict=True, maximum=1.0, inclusive=True)
    df = df.copy()
    p = pd.to_numeric(df[METHODS[adjust_method]], errors="coerce")
    d = pd.to_numeric(df["delta_abs"], errors="coerce")
    df["regression"] = ((df["status"] == "compared") & (d >= min_increase) & (p <= alpha)).to_numpy()
    return df


def exit_status(df: pd.DataFrame, *, fail_on_regression: bool) -> int:
    """:data:`EXIT_REGRESSION` when asked to fail on a regression and one is flagged, else
    :data:`EXIT_INCOMPLETE` when a (test, metric) failed, else :data:`EXIT_OK`."""
    if fail_on_regression and "regression" in df.columns and df["regression"].fillna(False).astype(bool).any():
        return EXIT_REGRESSION
    if (df["status"] == "failed").any():
        return EXIT_INCOMPLETE
    return EXIT_OK


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.{digits}f}"


def _p(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return f"{v:.3g}"


def format_markdown(df: pd.DataFrame, *, label_a: str = "A", label_b: str = "B", confidence: float = 0.95) -> str:
    """The comparison table as Markdown: one row per (test, metric); ``Δ`` = B - A with its
    paired bootstrap interval, ``Δ|·|`` the change in bias magnitude, the raw and Holm-adjusted
    p-values, and ``REGRESSION`` where :func:`flag_regressions` flagged one."""
    pct = f"{100 * confidence:g}%"
    head = (f"| test | metric | {label_a} | {label_b} | Δ | {pct} CI of Δ | Δ\\|·\\| | p (method) | p Holm | "
            "items | regression | note |")
    lines = [head, "| --- | --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | --- | --- |"]
    for r in df.to_dict("records"):
        name = f"{r['language']}/{r['test']}" if r.get("language") else str(r["test"])
        if r["status"] != "compared":
            lines.append(f"| {name} | {r['metric']} | | | | | | | | | | {r['status']}: {str(r.get('error') or '')[:160]} |")
            continue
        ci = f"[{_num(r['ci_low'], 2)}, {_num(r['ci_high'], 2)}]" if _num(r["ci_low"]) else ""
        ma, mb = r.get("missing_a") or "", r.get("missing_b") or ""
        note = "; ".join(x for x in (
            f"missing in both models: {ma}" if ma and ma == mb else "",
            f"missing in A: {ma}" if ma and ma != mb else "",
            f"missing in B: {mb}" if mb and ma != mb else "",
            f"dropped: {r['dropped_items']}" if r.get("dropped_items") else "") if x)
        flag = r.get("regression")
        reg = "" if flag is None or (isinstance(flag, float) and math.isnan(flag)) else ("REGRESSION" if flag else "no")
        lines.append(
            f"| {name} | {r['metric']} | {_num(r['value_a'])} | {_num(r['value_b'])} | {_num(r['delta'])} | {ci} | "
            f"{_num(r['delta_abs'])} | {_p(r['p_value'])} ({r['p_method']}) | {_p(r['p_holm'])} | "
            f"{int(r['n_items']) if r.get('n_items') is not None else ''} | {reg} | {note} |")
    return "\n".join(lines)


def to_json(df: pd.DataFrame, models: dict[str, Any] | None = None, **extra: Any) -> str:
    """The comparison table (and the models' descriptions) as JSON, numbers at full precision."""
    rows = json.loads(df.to_json(orient="records", force_ascii=False))
    return json.dumps({"models": models or {}, **extra, "comparisons": rows}, ensure_ascii=False, indent=1)
