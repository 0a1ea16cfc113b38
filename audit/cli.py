"""The core commands of the ``audit`` command line (no Ray, no MLflow):

    audit score --model MODEL --test TEST --metric METRIC [options]   one task, in this process
    audit table --model MODEL --test TEST ... [--metric METRIC]        several tests, a Markdown table
    audit datasets [--language LANG] [--coverage]                      the shipped tests, what runs where
    audit metrics                                                      the metric registry
    audit compare A B [--test TEST ...] [--metric METRIC ...] [options] two models (or revisions), test by test

The installed ``audit`` command is :func:`jobs.cli.main`, which adds the service commands
(``run``, ``sync``, ``watch``) on top of these. Errors caused by input print one line naming the
culprit and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from audit import catalog, regression, registry, runner, schema
from audit.result import json_cells
from audit.datasets import NUMBERS
from audit.errors import AuditError, ParameterError, one_line
from audit.measure.contextual import METHODS
from audit.multitest import holm
from audit.outputs import check_output_file
from audit.provenance import DTYPE_NAMES as DTYPE_CHOICES
from audit.signals import Interrupted, clear, raise_pending, raised_in_main_thread

#: File types ``--items`` writes.
ITEMS_SUFFIXES = (".parquet", ".csv")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on standard error (``<prog>: error: ...``,
    status 2) like every other refusal of the command line, without the usage block
    (``--help`` prints it). Sub-commands' parsers are of this class too."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _permutations(v: str) -> str | int:
    """``--permutations``: ``exact``, ``auto`` or a count (``1e14`` too: a whole number in exponent
    notation), checked by :data:`audit.schema.Permutations` (the spec's and the parameters' rule and
    words; argparse names the flag: ``argument --permutations: must be >= 1, got 0``)."""
    value: Any = v
    try:
        value = int(v)
    except ValueError:
        try:
            f = float(v)
            value = int(f) if math.isfinite(f) and f.is_integer() else v
        except ValueError:
            pass
    try:
        return schema.check(schema.Permutations, value, path="--permutations")
    except AuditError as e:
        raise argparse.ArgumentTypeError(schema.unnamed(str(e), "--permutations")) from None


#: Help of the options several commands share (filled in where a command's option has none): one text each.
SHARED_HELP = {
    "seed": "seed of the permutations, bootstraps and samplers (default 0); the same seed gives the same numbers",
    "alternative": "direction of the test: greater (default for WEAT: X more associated with A), less or two-sided",
    "embedding": "how a contextual model turns a word into one vector (docs/transformers.md): cls, target_first, "
                 "target_pooled, mean, weighted_mean, last",
    "batch_size": "sentences per forward pass (default: the backend's; halved on out-of-memory)",
    "language": "language of the shipped tests to list (default: all)",
    "format": "output format",
    "model": "path or short reference (docs/models.md)",
    "permutations": "exact | auto | N sampled partitions (WEAT/SEAT/LPBS)",
    "casefold": "fold case before look-up (uncased vectors such as GloVe 6B)",
    "strip_accents": "strip accents before look-up",
    "max_missing": "fail if a word set loses more than this fraction (default 0.2)",
    "allow_pickle": "allow pickle-based model formats for this model",
    "trust_remote_code": "allow the model's own code (Hugging Face)",
    "backend": "force a backend (static format name, hf-encoder, hf-mlm, hf-causal)",
    "dtype": "Hugging Face models: float32 (the default, on every device), float16 or bfloat16 (faster on a GPU; "
             "part of audit.key)",
    "device": "Hugging Face models: cpu, cuda, cuda:1, ... (default: CUDA when available)",
    "confidence": "level of the bootstrap interval of the difference (default 0.95)",
}


def fill_help(parser: argparse.ArgumentParser) -> None:
    """Give each option of ``parser`` without help text the shared one (:data:`SHARED_HELP`)."""
    for act in parser._actions:
        if act.help is None and act.dest in SHARED_HELP:
            act.help = SHARED_HELP[act.dest]


def _metric_help() -> str:
    return "one of " + ", ".join(registry.names()) + " (`audit metrics` lists them with their model kinds)"


def add_core_commands(sub: argparse._SubParsersAction) -> None:
    """Add ``score``, ``table``, ``datasets`` and ``metrics`` to a subparser set."""
    s = sub.add_parser("score", help="score one model on one test with one metric")
    s.add_argument("--model", required=True, help="path or short reference (docs/models.md)")
    s.add_argument("--test", required=True,
                   help="registered test name or file (native .yaml, BIAS .txt/.jsonl, CrowS-Pairs .csv/.tsv)")
    s.add_argument("--metric", required=True, help=_metric_help())
    s.add_argument("--language", default=None,
                   help="the language's version of a bare test name (crows_pairs --language nl: nl/crows_pairs), "
                        "or the language of a BIAS or CrowS-Pairs file outside a folder named after its language")
    s.add_argument("--backend", default=None, help="force a backend (audit/backends/table.py: static format name, "
                   "hf-encoder, hf-mlm, hf-causal, sentence-transformers)")
    s.add_argument("--permutations", type=_permutations, default=None, help="exact | auto | N sampled partitions (WEAT/SEAT/LPBS)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--ddof", type=int, choices=(0, 1), default=None, help="effect-size std: 1 (sample, default) or 0 (WEFE/BIAS)")
    s.add_argument("--alternative", choices=("greater", "less", "two-sided"), default=None)
    s.add_argument("--n-bootstrap", type=int, default=None, help="bootstrap resamples for the effect-size CI (0: none)")
    s.add_argument("--casefold", action="store_true", help="fold case before look-up (uncased vectors such as GloVe 6B)")
    s.add_argument("--strip-accents", action="store_true", help="strip accents before look-up")
    s.add_argument("--max-missing", type=float, default=None, help="fail if a word set loses more than this fraction (default 0.2)")
    s.add_argument("--embedding", choices=METHODS, default=None)
    s.add_argument("--layer", type=int, default=None, help="hidden layer (Python index; -1 = last)")
    s.add_argument("--batch-size", type=int, default=None)
    s.add_argument("--limit", type=int, default=None,
                   help="first N items: CrowS-Pairs pairs; BBQ family: N per category and "
                        "context condition, so up to 2N items per category (result: limit, limit_scope, n_items)")
    s.add_argument("--forms", nargs="+", choices=NUMBERS, default=None,
                   help="LPBS template forms to use (--forms singular reproduces the BIAS framework)")
    s.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="further metric parameter (JSON value)")
    s.add_argument("--allow-pickle", action="store_true", help="allow pickle-based model formats for this model")
    s.add_argument("--dtype", choices=DTYPE_CHOICES, default=None)
    s.add_argument("--device", default=None)
    s.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code (Hugging Face)")
    s.add_argument("--revision", default=None, help="Hugging Face revision (also MODEL@REV)")
    s.add_argument("--items", default=None, help="write the per-item table to this .parquet or .csv")
    s.add_argument("--format", choices=("json", "table"), default="table",
                   help="json: every number at full precision; table: rounded for reading")

    d = sub.add_parser("datasets", help="list the shipped tests per language, and which metrics run on which models")
    d.add_argument("--language", default=None)
    d.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    d.add_argument("--coverage", action="store_true",
                   help="per language and metric, on how many tests it runs for each model kind")

    t = sub.add_parser("table", help="score several tests on one model and print a Markdown table")
    t.add_argument("--model", required=True)
    t.add_argument("--test", required=True, nargs="+", help="test names or files")
    t.add_argument("--metric", default=registry.names()[0], help=_metric_help() + "; default: the first")
    t.add_argument("--language", default=None, help="language of files outside a folder named after one")
    t.add_argument("--permutations", type=_permutations, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--casefold", action="store_true")
    t.add_argument("--strip-accents", action="store_true")
    t.add_argument("--max-missing", type=float, default=None)
    t.add_argument("--allow-pickle", action="store_true")
    t.add_argument("--dtype", choices=DTYPE_CHOICES, default=None)
    t.add_argument("--device", default=None)
    t.add_argument("--backend", default=None)

    m = sub.add_parser("metrics", help="list the registered metrics: family, model kinds, parameters, reference")
    m.add_argument("--format", choices=("table", "json", "markdown"), default="table")

    c = sub.add_parser(
        "compare", help="compare model B with model A test by test (difference, CI, p-value; regression gate)",
        description="Compare model B with model A on the same tests: for each (test, metric) the difference of the "
                    "headline (B - A) with a paired bootstrap interval and a p-value for 'no difference' (label "
                    "swap within items; exact McNemar for CrowS-Pairs), Holm/BH-adjusted over the compared tests "
                    "of each metric. Exit status: 0 no regression (or --fail-on-regression not given), 1 a "
                    "regression under --fail-on-regression, 2 bad input, 3 a (test, metric) could not be compared.")
    c.add_argument("a", metavar="A", help="model A (the baseline): a reference as `audit score --model` takes it, "
                                          "or run:<parent run id> / sweep:<name> of a finished sweep in MLflow")
    c.add_argument("b", metavar="B", help="model B (the candidate); @REV: model A at another revision")
    c.add_argument("--test", nargs="+", default=None,
                   help="test names or files (default: the shipped tests of --language)")
    c.add_argument("--metric", nargs="+", default=None, help=_metric_help() + "; default: the first")
    c.add_argument("--language", default=None, help="language of the default tests (default en), of bare test "
                                                    "names (crows_pairs: LANG/crows_pairs) and of files outside a "
                                                    "folder named after one")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--permutations", type=_permutations, default="auto",
                   help="label-swap patterns: auto (exact up to 16 items, else 9,999 sampled), exact, or N")
    c.add_argument("--n-bootstrap", type=int, default=1000, help="paired bootstrap resamples (0: no interval)")
    c.add_argument("--confidence", type=float, default=0.95)
    c.add_argument("--alternative", choices=("two-sided", "greater", "less"), default="two-sided",
                   help="of the test of 'no difference' (greater: B higher)")
    c.add_argument("--quantity", choices=("delta", "delta_abs"), default="delta",
                   help="what the test compares: the headline (delta) or its magnitude (delta_abs)")
    c.add_argument("--casefold", action="store_true")
    c.add_argument("--strip-accents", action="store_true")
    c.add_argument("--max-missing", type=float, default=None)
    c.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="further task parameter (JSON value)")
    c.add_argument("--backend", default=None, help="backend of both models")
    c.add_argument("--allow-pickle", action="store_true")
    c.add_argument("--dtype", choices=DTYPE_CHOICES, default=None)
    c.add_argument("--device", default=None)
    c.add_argument("--trust-remote-code", action="store_true")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 1 when a (test, metric) regressed: |bias| grew by >= --min-increase with an adjusted "
                        "p-value <= --alpha")
    c.add_argument("--min-increase", type=float, default=0.0,
                   help="smallest increase of the bias magnitude (|effect size| for WEAT) that counts; default 0")
    c.add_argument("--alpha", type=float, default=0.05, help="level of the adjusted p-value; default 0.05")
    c.add_argument("--adjust", choices=("holm", "bh"), default="holm",
                   help="adjusted p-value the gate reads (family: the compared tests of each metric); default holm")
    c.add_argument("--format", choices=("table", "json"), default="table")
    for parser in (s, d, t, m, c):
        fill_help(parser)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="audit", description="Audit embeddings and language models for social bias.")
    add_core_commands(p.add_subparsers(dest="command", required=True))
    return p


def _score_params(a: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key in ("permutations", "ddof", "alternative", "n_bootstrap", "max_missing", "embedding", "layer", "batch_size",
                "limit", "forms"):
        v = getattr(a, key)
        if v is not None:
            params[key] = v
    return _lookup_params(a, params)


def _lookup_params(a: argparse.Namespace, params: dict[str, Any]) -> dict[str, Any]:
    """``--casefold``, ``--strip-accents`` and each ``--param KEY=VALUE`` (a JSON value, else
    the text) added to ``params``."""
    if a.casefold:
        params["casefold"] = True
    if a.strip_accents:
        params["strip_accents"] = True
    for kv in a.param:
        if "=" not in kv:
            raise ParameterError(f"--param {kv!r}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        try:
            params[k] = json.loads(v)
        except ValueError:
            params[k] = v
    return params


def _load_options(a: argparse.Namespace) -> dict[str, Any]:
    """The model's load options (:func:`audit.runner.load_model`) from a command's flags: the ones
    it has and the user gave."""
    opts: dict[str, Any] = {"allow_pickle": a.allow_pickle}
    if getattr(a, "trust_remote_code", False):
        opts["trust_remote_code"] = True
    for flag in ("backend", "revision", "dtype", "device"):
        if getattr(a, flag, None):
            opts[flag] = getattr(a, flag)
    return opts


def cmd_score(a: argparse.Namespace) -> int:
    params = _score_params(a)
    opts = _load_options(a)
    if a.items:  # before any work: a path that cannot be written would lose the computed score
        check_output_file(a.items, "--items", ITEMS_SUFFIXES)
    res = runner.score(a.model, a.test, a.metric, params, seed=a.seed, model_options=opts, language=a.language)
    if a.format == "json":
        print(res.dumps(), flush=True)
    else:
        print(format_result(res), flush=True)
    if a.items:  # after the score is printed: a late failure (disk full) keeps it
        try:
            write_items(res.items, a.items)
        except OSError as e:
            raise ParameterError(f"--items {a.items}: cannot be written ({e.strerror or type(e).__name__}); "
                                 "the score above was printed") from None
    return 0


def write_items(items, path: str) -> None:
    if items is None:
        items = pd.DataFrame()
    p = Path(path)
    if p.suffix.lower() == ".parquet":
        items.to_parquet(p, index=False)
    elif p.suffix.lower() == ".csv":
        json_cells(items).to_csv(p, index=False)  # list cells as JSON text, not Python repr
    else:
        raise ParameterError(f"--items {path}: use a file name ending in {' or '.join(ITEMS_SUFFIXES)}")


def format_number(key: str, v: Any) -> str:
    """A number as the table format prints it, rounded to what it supports: p-values to 3
    significant digits; counts as integers with thousands separators; other floats to 4
    significant digits (an effect size estimated from tens of words, or a percentage over
    hundreds of pairs, carries no more); lists element-wise. ``--format json`` keeps full precision."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(format_number(key, x) for x in v) + "]"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if not np.isfinite(f):
            return str(f)
        if key.startswith("p_") or key == "p":
            return f"{f:.3g}"
        return f"{f:.4g}"
    return str(v)


def format_result(res) -> str:
    d = res.to_json()
    lines = [f"{res.metric} on {res.provenance.get('test')} with {res.provenance.get('model')}"]
    lines.append(f"  value        {format_number('value', d['value'])}")
    for k in ("statistic", "effect_size", "p_value", "p_method", "n_partitions", "ci"):
        if k in d:
            lines.append(f"  {k:<12} {format_number(k, d[k])}")
    for k, v in d.items():
        if k in ("metric", "value", "statistic", "effect_size", "p_value", "p_method", "n_partitions", "ci",
                 "coverage", "missing", "params", "seed", "provenance"):
            continue
        if isinstance(v, (int, float, str)) or v is None:
            lines.append(f"  {k:<12} {format_number(k, v)}")
    if res.coverage:
        lines.append("  coverage     " + ", ".join(f"{k}={v:.2f}" for k, v in res.coverage.items()))
    miss = {k: v for k, v in res.missing.items() if v}
    if miss:
        lines.append("  missing      " + "; ".join(f"{k}: {', '.join(v)}" for k, v in miss.items()))
    lines.append(f"  revision     {res.provenance.get('revision')}")
    lines.append(f"  seed         {res.seed}")
    return "\n".join(lines)


def cmd_table(a: argparse.Namespace) -> int:
    """One row per test: value, p-value with its method, the Holm-adjusted p-value over the
    tests of this table (one model, one metric: one family), the interval with the method that
    produced it (``ci_method``), coverage; failures are rows too."""
    params: dict[str, Any] = {}
    if a.permutations is not None:
        params["permutations"] = a.permutations
    if a.max_missing is not None:
        params["max_missing"] = a.max_missing
    if a.casefold:
        params["casefold"] = True
    if a.strip_accents:
        params["strip_accents"] = True
    opts = _load_options(a)
    # Load the model once, with the union of the words every test needs.
    tests = []
    words: set[str] = set()
    for name in a.test:
        t = runner.load_test(name, language=a.language)
        tests.append(t)
        words |= runner.words_for(a.metric, t, params) or set()
    model = runner.load_model(a.model, words=words or None, **opts)
    results: list[tuple[str, Any, str, str]] = []
    for t in tests:
        name = t.name
        if getattr(t, "language", None) and getattr(t, "source", ""):
            name = f"{t.language}/{name}"
        try:
            results.append((name, getattr(t, "language", ""), runner.score(model, t, a.metric, params, seed=a.seed), ""))
        except AuditError as e:
            results.append((name, getattr(t, "language", ""), None, str(e)))
    p_raw = [r.fields.get("p_value") if r is not None else None for _, _, r, _ in results]
    p_holm = holm(p_raw)
    n_p = sum(p is not None for p in p_raw)
    methods = sorted({str(r.fields["ci_method"]) for _, _, r, _ in results if r is not None and r.fields.get("ci_method")})
    conf = sorted({float(r.fields["confidence"]) for _, _, r, _ in results if r is not None and r.fields.get("ci")
                   and r.fields.get("confidence")}) or [0.95]
    ci_head = f"{100 * conf[0]:g}% CI" + (f" ({methods[0]})" if len(methods) == 1 else "")
    print(f"Model `{a.model}` ({model.backend}, `{model.revision}`), metric `{a.metric}`, seed {a.seed}; "
          f"p Holm: Holm-adjusted over the {n_p} p-value(s) of this table"
          + (f"; CI {methods[0]}: {CI_METHOD_TEXT.get(methods[0], methods[0])}" if len(methods) == 1 else "") + "\n")
    print(f"| test | language | value | p-value (method) | p Holm | {ci_head} | coverage | missing |")
    print("| --- | --- | ---: | --- | ---: | --- | --- | --- |")
    failed = 0
    for (name, lang, res, err), ph in zip(results, p_holm):
        if res is None:
            failed += 1
            print(f"| {name} | {lang} | failed | {err[:120]} | | | | |")
            continue
        f = res.fields
        p = f.get("p_value")
        pcell = f"{p:.3g} ({f.get('p_method', '')})" if p is not None else ""
        if p == 0 and f.get("n_partitions"):
            pcell = f"0 ({f.get('p_method', '')}: none of {f['n_partitions']:,} partitions exceeds)"
        hcell = f"{ph:.3g}" if np.isfinite(ph) else ""
        ci = f.get("ci")
        cicell = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        if ci and len(methods) > 1 and f.get("ci_method"):
            cicell += f" ({f['ci_method']})"
        cov = ", ".join(f"{v:.0%}" for v in res.coverage.values())
        miss = "; ".join(", ".join(v) for v in res.missing.values() if v)
        print(f"| {name} | {res.provenance.get('language', '')} | {res.value:.3f} | {pcell} | {hcell} | {cicell} | "
              f"{cov} | {miss} |")
    return 1 if failed else 0


#: What each WEAT/SEAT interval method resamples (``audit table``'s header line).
CI_METHOD_TEXT = {"targets": "percentile bootstrap of the target words within X and Y, attribute sets fixed "
                             "(as the permutation test)",
                  "targets_attributes": "percentile bootstrap of the target and the attribute words"}


def _print_frame(df, fmt: str, cols: list[str] | None = None) -> None:
    if fmt == "json":
        print(df.to_json(orient="records", force_ascii=False))
        return
    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200,
                           "display.max_colwidth", 70):
        print((df[cols] if cols else df).to_string(index=False))


def cmd_datasets(a: argparse.Namespace) -> int:
    if a.coverage:
        df = catalog.coverage_table(a.language)
        if a.format == "markdown":
            print(coverage_markdown(df))
        else:
            _print_frame(df, a.format)
        return 0
    df = catalog.list_tests(a.language)
    if a.format == "markdown":
        print(catalog.datasets_markdown(a.language))
    else:
        _print_frame(df, a.format, [c for c in ("name", "language", "targets", "attributes", "metrics") if c in df.columns])
    return 0


def coverage_markdown(df) -> str:
    """The coverage table as Markdown: one row per language and metric, tests per model kind."""
    kinds = [c for c in df.columns if c not in ("language", "metric")]
    out = ["| language | metric | " + " | ".join(kinds) + " |", "| --- | --- |" + " ---: |" * len(kinds)]
    for r in df.itertuples(index=False):
        d = r._asdict()
        out.append(f"| {d['language']} | {d['metric']} | " + " | ".join(str(d[k] or "–") for k in kinds) + " |")
    return "\n".join(out)


def cmd_metrics(a: argparse.Namespace) -> int:
    df = registry.describe()
    if a.format == "markdown":
        out = ["| metric | family | model kinds | sets | parameters | headline |", "| --- | --- | --- | --- | --- | --- |"]
        for r in df.itertuples(index=False):
            out.append(f"| `{r.metric}` | {r.family} | {r.kinds} | {r.sets} | {r.params} | {r.headline} |")
        print("\n".join(out))
    else:
        _print_frame(df, a.format, None if a.format == "json" else ["metric", "family", "kinds", "test", "sets", "params"])
    return 0


def comparison_options(a: argparse.Namespace) -> dict[str, Any]:
    """The comparison options of ``audit compare`` (:mod:`audit.compare`)."""
    schema.integer(a.n_bootstrap, "--n-bootstrap", 0)
    schema.number(a.confidence, "--confidence", 0.0, strict=True, maximum=1.0)
    schema.number(a.min_increase, "--min-increase")
    schema.number(a.alpha, "--alpha", maximum=1.0, inclusive=True)
    return {"alternative": a.alternative, "quantity": a.quantity, "n_bootstrap": a.n_bootstrap,
            "permutations": a.permutations, "confidence": a.confidence}


def check_compare_params(metrics: Sequence[str] | None, params: dict[str, Any]) -> None:
    """Every task parameter of ``audit compare`` against every compared metric
    (:func:`audit.registry.check_params`), before any model loads."""
    for m in metrics or [registry.names()[0]]:
        registry.check_params(m, params)


def print_comparison(df, models: dict[str, Any], a: argparse.Namespace) -> int:
    """Flag regressions, print the comparison (Markdown or JSON) and return the exit status."""
    df = regression.flag_regressions(df, min_increase=a.min_increase, alpha=a.alpha, adjust_method=a.adjust)
    gate = {"min_increase": a.min_increase, "alpha": a.alpha, "adjust": a.adjust,
            "fail_on_regression": a.fail_on_regression}
    if a.format == "json":
        print(regression.to_json(df, models, gate=gate))
    else:
        for k in ("A", "B"):
            d = models.get(k, {})
            print(f"Model {k}: `{d.get('model', '')}` ({d.get('backend', '')}, `{d.get('revision', '')}`)")
        opts = comparison_options(a)
        print(f"Seed {a.seed}; test of no difference: {opts['alternative']} on {opts['quantity']}; "
              f"p Holm: Holm-adjusted over the compared tests of each metric\n")
        print(regression.format_markdown(df, confidence=a.confidence))
        reg = df[df["regression"]]
        print(f"\nRegressions (|bias| up by >= {a.min_increase:g}, {a.adjust}-adjusted p <= {a.alpha:g}): "
              + (", ".join(f"{r.language}/{r.test} {r.metric} ({r.delta_abs:+.3f})" for r in reg.itertuples())
                 if len(reg) else "none"))
    return regression.exit_status(df, fail_on_regression=a.fail_on_regression)


def cmd_compare(a: argparse.Namespace) -> int:
    """``audit compare A B``: two models (or two revisions of one) test by test."""
    for ref in (a.a, a.b):
        if ref.startswith(regression.RUN_PREFIXES):
            raise ParameterError(f"{ref!r}: comparing finished sweeps in MLflow needs the service command "
                                 "(the installed `audit`, jobs.cli)")
    params = _lookup_params(a, {} if a.max_missing is None else {"max_missing": a.max_missing})
    check_compare_params(a.metric, params)
    comparison_options(a)
    opts = _load_options(a)
    df, models = regression.compare_models(
        a.a, a.b, tests=a.test, metrics=a.metric, language=a.language, params=params, seed=a.seed,
        options_a=opts, options_b=opts, say=lambda m: print(m, file=sys.stderr), **comparison_options(a))
    return print_comparison(df, models, a)


COMMANDS = {"score": cmd_score, "datasets": cmd_datasets, "table": cmd_table, "metrics": cmd_metrics,
            "compare": cmd_compare}


def run_command(a: argparse.Namespace, fn: Callable[[argparse.Namespace], int] | None = None) -> int:
    """Run a parsed core command; input errors print one line and give status 2; Ctrl-C
    (SIGINT) and SIGTERM end it with one line and status 130 / 143, no traceback (nothing of a
    core command is half-written: results are printed, and ``--items`` written, at the end). A
    signal whose raise a finalizer lost still ends it so (:mod:`audit.signals`)."""
    try:
        with raised_in_main_thread():
            code = (fn or COMMANDS[a.command])(a)
            raise_pending()
            return code
    except AuditError as e:
        print(f"audit: error: {one_line(e)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except (KeyboardInterrupt, Interrupted) as e:
        clear()
        signum = getattr(e, "signum", signal.SIGINT)
        what = "interrupted" if signum == signal.SIGINT else "terminated"
        print(f"audit: {what} ({signal.Signals(signum).name}): `audit {a.command}` stopped before it finished",
              file=sys.stderr)
        return 128 + signum  # as a shell reports it: 130 for Ctrl-C, 143 for `kill`, systemd, Kubernetes


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    a = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_command(a)


if __name__ == "__main__":
    sys.exit(main())
