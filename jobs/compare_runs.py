"""Compare two finished sweeps in MLflow, task by task, from their stored per-item tables.

    audit compare run:<parent run id> run:<parent run id> [--tracking-uri URI] [--model-a M] [--model-b M]
    audit compare sweep:<name> sweep:<name> [--experiment E] [--test ...] [--metric ...] [--fail-on-regression ...]

The live comparison of two models is :mod:`audit.regression` (no MLflow in the core); this is
its counterpart for results already in a tracking store (written by :mod:`jobs.tracker`). A
sweep is its *parent* run (``run:<id>``, or ``sweep:<name>``: the parent run tagged
``audit.sweep=<name>``, the earliest one as the tracker resumes it, in ``--experiment`` or in
any experiment). Its FINISHED child runs are matched by (language, test, metric, parameters) and,
when a sweep audited several models, by the model chosen with ``--model-a``/``--model-b``. For
each matched pair the per-item tables (``items.json`` of each child run, the exact text
:meth:`mlflow.MlflowClient.log_table` writes) are compared with the metric's comparer
(:func:`audit.registry.comparer`; the parameters that say how the model is used,
``chat_template`` and ``system_instruction``, do not enter the matching): WEAT/SEAT with
:func:`audit.compare.compare_weat_items` (swap of the standardised per-target scores; the attribute sets of each model conditioned
on, since the vectors are not stored), LPBS with :func:`audit.compare.compare_lpbs`,
CrowS-Pairs with :func:`audit.compare.compare_crows_pairs` (exact McNemar), the per-item-mean
metrics with :func:`audit.compare.compare_item_means`. Items present in one run only (a word
one revision lacks) are left out and listed (``dropped_items``). The table, its Holm/BH
adjustment over the compared tests of each metric, the regression rule and the exit statuses
are those of :mod:`audit.regression`.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from audit import cli as core_cli
from audit import regression, registry
from audit.entries import KIND_NAMES
from audit.errors import AuditError, DataError, ParameterError
from jobs.tracker import ROLE_SWEEP, ROLE_TASK, search_all as _search, tracking_client, unavailable
from jobs.uris import TRACKING_URI_ENV, tracking_uri_problem

__all__ = ["find_parent", "finished_tasks", "load_items", "left_out", "compare_parents", "command", "add_options"]


def _experiments(client, experiment: str | None) -> list[str]:
    if experiment:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise DataError(f"MLflow experiment {experiment!r} not found")
        return [exp.experiment_id]
    return [e.experiment_id for e in client.search_experiments()]


def find_parent(client, ref: str, *, experiment: str | None = None):
    """The parent run a reference names: ``run:<id>`` (checked to be a sweep's parent run) or
    ``sweep:<name>`` (the earliest parent run tagged ``audit.sweep=<name>``)."""
    if ref.startswith("run:"):
        run_id = ref[4:]
        try:
            run = client.get_run(run_id)
        except Exception as e:  # noqa: BLE001 - MlflowException for an unknown id
            raise DataError(f"{ref}: no such run ({str(e).splitlines()[0][:160]})") from None
        if run.data.tags.get("audit.role") != ROLE_SWEEP:
            raise DataError(f"{ref}: not a sweep's parent run (tag audit.role is {run.data.tags.get('audit.role')!r})")
        return run
    if ref.startswith("sweep:"):
        name = ref[6:].replace("'", "")
        found = _search(client, _experiments(client, experiment),
                        f"tags.`audit.role` = '{ROLE_SWEEP}' and tags.`audit.sweep` = '{name}'")
        if not found:
            raise DataError(f"{ref}: no sweep of that name" + (f" in experiment {experiment!r}" if experiment else ""))
        found.sort(key=lambda r: r.info.start_time or 0)
        return found[0]
    raise ParameterError(f"{ref!r}: a finished sweep is run:<parent run id> or sweep:<name>")


#: Parameters that say how the model is used (a chat template and its system turn,
#: audit.backends.chat), not what is measured: left out of the matching, so a model audited
#: with and without its template is compared task by task.
MODEL_USE_PARAMS = ("chat_template", "system_instruction")


def _identity(run) -> tuple[str, str, str, str]:
    p, t = run.data.params, run.data.tags
    params = {k[6:]: v for k, v in p.items() if k.startswith("param.") and k[6:] not in MODEL_USE_PARAMS}
    return (t.get("audit.language", ""), t.get("audit.test", ""), t.get("audit.metric", ""),
            json.dumps(params, sort_keys=True))


def finished_tasks(client, parent, *, model: str | None = None) -> dict[tuple[str, str, str, str], Any]:
    """The parent's FINISHED child runs of one model, by (language, test, metric, parameters
    as JSON); the latest run of a task that ran more than once. ``model``: the model's name in
    the sweep (required when the sweep audited several)."""
    runs = _search(client, [parent.info.experiment_id],
                   f"tags.`audit.role` = '{ROLE_TASK}' and tags.`mlflow.parentRunId` = '{parent.info.run_id}' "
                   "and attributes.status = 'FINISHED'")
    models = sorted({r.data.tags.get("audit.model", "") for r in runs})
    sweep = parent.data.tags.get("audit.sweep", parent.info.run_id)
    if model is None:
        if len(models) > 1:
            raise ParameterError(f"sweep {sweep} audited {len(models)} models ({', '.join(models)}); "
                                 "choose one with --model-a/--model-b")
    elif model not in models:
        raise DataError(f"sweep {sweep} has no finished run of model {model!r}; its models: {', '.join(models) or 'none'}")
    out: dict[tuple[str, str, str, str], Any] = {}
    for r in sorted(runs, key=lambda r: r.info.start_time or 0):
        if model is None or r.data.tags.get("audit.model") == model:
            out[_identity(r)] = r
    return out


def load_items(client, run_id: str) -> pd.DataFrame:
    """A child run's per-item table (``items.json``, MLflow's ``orient="split"`` table), with the
    values as stored (no type guessing)."""
    with tempfile.TemporaryDirectory(prefix="biasaudit-items-") as d:
        try:
            path = client.download_artifacts(run_id, "items.json", d)
        except Exception as e:  # noqa: BLE001 - missing artifact, store unreachable
            raise DataError(f"run {run_id}: no per-item table items.json ({str(e).splitlines()[0][:160]})") from None
        text = Path(path).read_text(encoding="utf-8")
    return pd.read_json(io.StringIO(text), orient="split", dtype=False)


def _entry(metric: str):
    for e in registry.METRICS.values():
        if metric == e.name or metric in e.result_names.values():
            return e
    return registry.get(metric)  # the one-line error naming the known metrics


def left_out(ta: dict, tb: dict, *, keep: Callable[[str, str], bool] = lambda test, metric: True) -> list[dict]:
    """The tasks of one side that have no counterpart on the other (``finished_tasks`` of A and
    B), one row each (``test``, ``language``, ``metric``, ``status = "not compared"``,
    ``error`` = the reason):

    - the same test measured differently: one registered metric recorded under two names
      (:meth:`audit.entries.Metric.result_name`: ``crows_pairs`` on a masked LM is a
      pseudo-log-likelihood, ``crows_pairs_causal`` on a causal LM a log-likelihood), so the
      two numbers are different measurements; one row names both;
    - the same measurement with other parameters (both parameter sets named);
    - a task only one sweep ran.

    ``keep(test, metric)``: the ``--test``/``--metric`` selection."""
    only_a, only_b = set(ta) - set(tb), set(tb) - set(ta)
    rows, used_b = [], set()

    def desc(run) -> str:
        p = run.data.params
        return f"{run.data.tags.get('audit.metric', '')} on {KIND_NAMES.get(p.get('kind', ''), p.get('kind', '?'))} " \
               f"({p.get('embedding') or 'its own measurement'})"

    for key in sorted(only_a):
        language, test, metric, params_json = key
        e = _entry(metric)
        twins = sorted(k for k in only_b if k[:2] == (language, test) and k[2] != metric
                       and _entry(k[2]).name == e.name and k[3] == params_json)
        same = sorted(k for k in only_b if k[:3] == (language, test, metric))
        short = test.split("/", 1)[-1]
        if twins:
            kb = twins[0]
            used_b.add(kb)
            if keep(test, metric) or keep(test, kb[2]):
                rows.append({"test": short, "language": language, "metric": f"{metric} (A) / {kb[2]} (B)",
                             "status": "not compared",
                             "error": f"different measurements: A is {desc(ta[key])}, B is {desc(tb[kb])}"})
        elif same:
            used_b.update(same)
            if keep(test, metric):
                rows.append({"test": short, "language": language, "metric": metric, "status": "not compared",
                             "error": f"different parameters: A {params_json}, B "
                                      + ", ".join(k[3] for k in same)})
        elif keep(test, metric):
            rows.append({"test": short, "language": language, "metric": metric, "status": "not compared",
                         "error": "only sweep A has a finished run of it"})
    for key in sorted(only_b - used_b):
        language, test, metric, _ = key
        if keep(test, metric):
            rows.append({"test": test.split("/", 1)[-1], "language": language, "metric": metric,
                         "status": "not compared", "error": "only sweep B has a finished run of it"})
    return rows


def compare_parents(client, parent_a, parent_b, *, model_a: str | None = None, model_b: str | None = None,
                    metrics: Sequence[str] | None = None, tests: Sequence[str] | None = None, seed: int | None = 0,
                    say: Callable[[str], None] | None = None, **options: Any) -> tuple[pd.DataFrame, dict]:
    """Compare the tasks two finished sweeps share (module docstring). ``metrics``/``tests``
    restrict them (test names with or without the language prefix). Returns the comparison
    table of :mod:`audit.regression` (plus each side's child run, ``run_a``/``run_b``, and the
    interval of its own headline, ``ci_a_low`` ... ``ci_b_high``) and a description of each
    side (parent run, sweep, model, revision)."""
    ta = finished_tasks(client, parent_a, model=model_a)
    tb = finished_tasks(client, parent_b, model=model_b)
    wanted_m = set(metrics or ())
    wanted_t = set(tests or ())
    def keep(test: str, metric: str) -> bool:
        return ((not wanted_m or metric in wanted_m or _entry(metric).name in wanted_m)
                and (not wanted_t or test in wanted_t or test.split("/", 1)[-1] in wanted_t))

    rows = []
    for key in sorted(set(ta) & set(tb)):
        language, test, metric, params_json = key
        e = _entry(metric)
        if not keep(test, metric):
            continue
        comp = registry.comparer(metric)
        short = test.split("/", 1)[-1]
        if comp is None:
            rows.append({"test": short, "language": language, "metric": metric, "status": "not comparable",
                         "error": f"{metric} offers no paired comparison (no per-item statistic)"})
            continue
        if say:
            say(f"comparing {test} x {metric}")
        try:
            params = {**e.params, **{k: json.loads(v) for k, v in json.loads(params_json).items()}}
            ia, ib = load_items(client, ta[key].info.run_id), load_items(client, tb[key].info.run_id)
            c, dropped = comp.from_items(ia, ib, params, seed=seed, **options)
            row = regression.comparison_row(c, comp, test=short, language=language, metric=metric, dropped=dropped)
            for side, run in (("a", ta[key]), ("b", tb[key])):  # each audit's own interval of its headline
                m = run.data.metrics
                row[f"ci_{side}_low"], row[f"ci_{side}_high"] = m.get("ci_low"), m.get("ci_high")
                row[f"run_{side}"] = run.info.run_id
            rows.append(row)
        except AuditError as err:
            rows.append({"test": short, "language": language, "metric": metric, "status": "failed", "error": str(err)})
    skipped = left_out(ta, tb, keep=keep)
    if not rows:
        why = "; ".join(f"{r['language']}/{r['test']} {r['metric']}: {r['error']}" for r in skipped[:3])
        more = f"; +{len(skipped) - 3} more" if len(skipped) > 3 else ""
        raise DataError(f"the two sweeps share no finished task ({len(ta)} and {len(tb)} finished task(s)"
                        + (", after --test/--metric" if wanted_m or wanted_t else "") + ")"
                        + (f"; left out: {why}{more}" if why else ""))
    if say:
        for r in skipped:
            say(f"left out {r['language']}/{r['test']} {r['metric']}: {r['error']}")
    rows += skipped

    def side(parent, tasks) -> dict[str, str]:
        run = next(iter(tasks.values()), None)
        return {"run_id": parent.info.run_id, "sweep": parent.data.tags.get("audit.sweep", ""),
                "model": run.data.tags.get("audit.model", "") if run else "",
                "ref": run.data.params.get("model", "") if run else "",
                "revision": run.data.params.get("revision", "") if run else ""}

    return regression.adjust(pd.DataFrame(rows)), {"A": side(parent_a, ta), "B": side(parent_b, tb)}


# --------------------------------------------------------------------------------------
# Command line: `audit compare run:... run:...` (jobs.cli hands it here)
# --------------------------------------------------------------------------------------


def add_options(p: argparse.ArgumentParser) -> None:
    """The options ``audit compare`` takes for finished sweeps, on top of the core ones."""
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store of run:/sweep: references (default $MLFLOW_TRACKING_URI)")
    p.add_argument("--experiment", default=None, help="experiment in which sweep:<name> is looked up (default: all)")
    p.add_argument("--model-a", default=None, help="model of sweep A to compare (when it audited several)")
    p.add_argument("--model-b", default=None, help="model of sweep B to compare (when it audited several)")


def _left_out_line(message: str) -> None:
    """Progress for stderr: only what the comparison leaves out, and why (the table has it too)."""
    if message.startswith("left out "):
        print(f"audit: {message}", file=sys.stderr)


def command(a: argparse.Namespace) -> int:
    """``audit compare`` of two finished sweeps: print the table and return the exit status of
    :func:`audit.regression.exit_status`."""
    refs = (a.a, a.b)
    if not all(r.startswith(regression.RUN_PREFIXES) for r in refs):
        raise ParameterError(f"compare {a.a} {a.b}: give two finished sweeps (run:<id>, sweep:<name>) or two models, "
                             "not one of each")
    uri = a.tracking_uri or os.environ.get(TRACKING_URI_ENV)
    if not uri:
        raise ParameterError(f"run:/sweep: references need --tracking-uri or ${TRACKING_URI_ENV}")
    problem = tracking_uri_problem(uri)
    if problem:
        raise ParameterError(f"--tracking-uri: {problem}")
    try:
        client = tracking_client(uri)
        pa = find_parent(client, a.a, experiment=a.experiment)
        pb = find_parent(client, a.b, experiment=a.experiment)
        df, sides = compare_parents(client, pa, pb, model_a=a.model_a, model_b=a.model_b, metrics=a.metric,
                                    tests=a.test, seed=a.seed, say=_left_out_line, **core_cli.comparison_options(a))
    except AuditError:
        raise
    except Exception as e:  # noqa: BLE001 - the store is unreachable or refuses
        raise unavailable(uri, e) from None
    models = {k: {**v, "model": f"{v['model']} (sweep {v['sweep']}, run {v['run_id']})", "backend": v["ref"]}
              for k, v in sides.items()}
    return core_cli.print_comparison(df, models, a)
