"""Run a sweep spec on Ray, track it in MLflow, write the reports.

    python -m jobs.sweep SPEC [--dry-run] [--output-dir DIR] [--tracking-uri URI] [--address ADDR]
    audit run SPEC [--dry-run] [...]                       (the same, through the audit command)
    ray job submit --working-dir . -- python -m jobs.sweep SPEC --output-dir /shared/out

Steps (``docs/service.md``):

1. read and validate the spec (:mod:`jobs.spec`), build tiny models it asks for
   (:mod:`jobs.builders`), expand it into tasks and print what is dropped and why
   (:mod:`jobs.plan`); ``--dry-run`` stops here, having loaded no model;
2. probe each model's revision without loading it and compute every task's ``audit.key``;
   skip the keys that already have a FINISHED run in the tracking store (resume); with nothing
   left, no Ray is started and no model is loaded;
3. start an embedded local Ray (``ray.init(address="local", ...)``), or connect to the cluster
   when running inside ``ray job submit`` (``RAY_ADDRESS`` set) or given ``--address``; one
   :class:`actors.model_actor.ModelServer` actor per model (restarted with its pending requests
   if it dies), measure requests in batches, the analyse step as CPU tasks; the driver logs each
   outcome to MLflow as it arrives (:mod:`jobs.tracker`, the only writer) and shows a progress
   bar; an actor is released as soon as its model's requests are done;
4. regenerate the reports from the tracking store (:mod:`jobs.report`) into
   ``<output_dir>/reports`` and onto the parent run, print a summary table.

Exit status: 0 when every planned task has a finished result, 1 when any failed (the summary
lists each failure's reason), 2 for an invalid spec or option (one line naming the culprit),
3 when every task finished but some results could not be written to the tracking store (they
wait in ``<output_dir>/wal.jsonl`` for ``audit sync``; see :mod:`jobs.wal`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

from audit.errors import AuditError
from jobs.builders import build_models
from jobs.plan import expand
from jobs.spec import SweepSpec, load_spec

log = logging.getLogger("jobs.sweep")


@dataclasses.dataclass
class SweepContext:
    """What a hook can see while a sweep runs (tests use it to kill an actor mid-sweep)."""

    spec: SweepSpec
    actors: dict[str, Any] = dataclasses.field(default_factory=dict)
    remaining: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SweepOutcome:
    """The end state of :func:`run_sweep`.

    planned:  tasks in the plan; skipped_existing: already finished before this run (resume);
    ran:      tasks run now; failed: tasks whose final state is failed (this run or before);
    loads:    model loads made by this run (distinct load ids seen; restarts included);
    results:  the report table (one row per planned task);
    pending:  results in the write-ahead log not (yet) in the tracking store (it was
              unreachable): ``audit sync`` or the next run uploads them;
    synced:   earlier pending results this run uploaded (before or after its own tasks);
    reaped:   half-written child runs of dead drivers this run marked KILLED.
    """

    exit_code: int
    planned: int
    skipped_existing: int
    ran: int
    failed: int
    loads: int
    parent_run_id: str | None
    results: Any = None
    report_dir: Path | None = None
    seconds: float = 0.0
    pending: int = 0
    synced: int = 0
    reaped: int = 0


# --------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------


def _setup_logging(out_dir: Path) -> logging.Handler:
    out_dir.mkdir(parents=True, exist_ok=True)
    fh = logging.FileHandler(out_dir / "run.log", encoding="utf-8")
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    fh.setLevel(logging.INFO)
    root = logging.getLogger("jobs")
    root.setLevel(logging.INFO)
    root.addHandler(fh)
    return fh


def _say(msg: str) -> None:
    """Print to the terminal (stdout) and to the run log."""
    print(msg, flush=True)
    for line in msg.splitlines():
        log.info(line)


# --------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------


def _init_ray(spec: SweepSpec, address: str | None) -> bool:
    """Start or connect to Ray; returns whether this call initialised it (and must shut down).

    The embedded local Ray starts no dashboard, and keeps Ray's token authentication (on by
    default for a new local cluster in Ray 2.60): its internal gRPC ports listen on every
    interface of the machine (``ray.init`` cannot bind them to loopback), so without a token
    anyone who reaches them could run code. ``RAY_AUTH_MODE`` is never changed here: set it
    in the environment only for clusters that need it (``disabled`` for a head bound to
    127.0.0.1, as :func:`jobs.cluster.local_head` starts; see ``SECURITY.md``).
    """
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    addr = address or spec.ray.address
    if addr:
        ray.init(address=addr, log_to_driver=True)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)  # inside `ray job submit`: the job's cluster
    else:
        kw: dict[str, Any] = {"address": "local", "include_dashboard": False,
                              "object_store_memory": spec.ray.object_store_memory}
        if spec.ray.num_cpus is not None:
            kw["num_cpus"] = spec.ray.num_cpus
        ray.init(**kw)
    return True


def _words_for(plan, tasks) -> list[str] | None:
    """Union of the words the association tasks of a static model need (``None``: keep all)."""
    from jobs.plan import words_for_tasks

    words = words_for_tasks(plan, tasks)
    return sorted(words) if words else None


def _chunks(xs: list, n: int) -> list[list]:
    return [xs[i:i + n] for i in range(0, len(xs), n)]


def _execute(plan, todo, recorder, ctx: SweepContext, *, address: str | None, progress: bool,
             on_outcome: Callable | None, load_log: Path, server_cls: type | None = None) -> tuple[dict, set[str]]:
    """Run ``todo`` on Ray; record each outcome as it arrives (write-ahead log, then MLflow:
    :class:`jobs.wal.Recorder`). Returns (task index -> record, load ids seen)."""
    import ray

    from actors.model_actor import MeasureRequest, actor_options, format_error, model_actor_class
    from actors.stats import AnalyseRequest, TaskOutcome, stats_task
    from jobs.tracker import task_record

    spec = plan.spec
    log_start = load_log.stat().st_size if load_log.is_file() else 0
    started = _init_ray(spec, address)
    records: dict[int, dict] = {}
    load_ids: set[str] = set()
    sweep_id = spec.sweep_id()
    bar = None
    try:
        cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        Actor = model_actor_class(server_cls)
        analyse = stats_task(num_cpus=spec.ray.stats_num_cpus)
        by_model: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        for i, t in enumerate(todo):
            by_model[t.model].append((i, t))
        needed = {t.test for t in todo}
        tests_ref = ray.put({k: v for k, v in plan.tests.items() if k in needed})
        stats_refs: dict[Any, tuple[str, list[int]]] = {}
        measure_refs: dict[Any, str] = {}
        per_model_pending: dict[str, int] = {}
        for m in spec.models:
            if m.name not in by_model:
                continue
            info = plan.models[m.name]
            items = by_model[m.name]
            words = _words_for(plan, [t for _, t in items]) if info.kind == "static" else None
            opts = actor_options(kind=info.kind, num_cpus=spec.ray.actor_num_cpus, num_gpus=spec.ray.actor_num_gpus,
                                 cluster_gpus=cluster_gpus, max_restarts=spec.ray.max_restarts,
                                 max_task_retries=spec.ray.max_task_retries)
            actor = Actor.options(**opts).remote(m.name, m.ref, info.local_ref, dict(m.options), words, str(load_log))
            ctx.actors[m.name] = actor
            log.info("actor for %s: %s", m.name, json.dumps(opts))
            per_model_pending[m.name] = 0
            for batch in _chunks(items, spec.ray.batch_size):
                reqs = [MeasureRequest(index=i, test=t.test, metric=t.metric, params=t.params) for i, t in batch]
                mref = actor.measure_batch.remote(reqs, tests_ref)
                areqs = [AnalyseRequest(index=i, test=t.test, metric=t.metric, params=t.params, seed=t.seed,
                                        exact_shards=spec.ray.exact_shards) for i, t in batch]
                sref = analyse.remote(areqs, mref, tests_ref)
                measure_refs[mref] = m.name
                stats_refs[sref] = (m.name, [i for i, _ in batch])
                per_model_pending[m.name] += 1
            ctx.remaining[m.name] = len(items)
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(todo), desc=spec.name, unit="task", file=sys.stderr, mininterval=0.5,
                       dynamic_ncols=True)
        done = failed = 0
        step = max(1, len(todo) // 10)
        while stats_refs or measure_refs:
            ready, _ = ray.wait(list(stats_refs) + list(measure_refs), num_returns=1)
            ref = ready[0]
            if ref in measure_refs:
                name = measure_refs.pop(ref)
                per_model_pending[name] -= 1
                if per_model_pending[name] == 0:  # the model's work is done: release it
                    actor = ctx.actors.pop(name, None)
                    if actor is not None:
                        ray.kill(actor, no_restart=True)
                        log.info("released the actor of %s", name)
                continue
            name, indices = stats_refs.pop(ref)
            try:
                outcomes = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - the actor died for good, or a worker crashed
                err = format_error(getattr(e, "cause", None) or e)
                outcomes = [TaskOutcome(index=i, status="failed", error=f"system error: {err}") for i in indices]
            for o in outcomes:
                task = todo[o.index]
                info = plan.models[task.model]
                rec = task_record(task, sweep=spec.name, sweep_id=sweep_id, model_spec=info.spec, kind=info.kind,
                                  plan_key=task.key, outcome=o)
                recorder.record(rec)
                records[o.index] = rec
                if o.load_id:
                    load_ids.add(f"{task.model}@{o.load_id}")
                if o.status != "finished":
                    log.warning("failed: %s: %s", task.label, o.error)
                ctx.remaining[task.model] -= 1
                done += 1
                failed += o.status != "finished"
                if done == len(todo) or done % step == 0:
                    log.info("progress: %d/%d tasks, %d failed", done, len(todo), failed)
                if bar is not None:
                    bar.update(1)
                if on_outcome is not None:
                    on_outcome(task, o, ctx)
    finally:
        if bar is not None:
            bar.close()
        for actor in list(ctx.actors.values()):
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
        ctx.actors.clear()
        if started:
            ray.shutdown()
    load_ids |= _logged_loads(load_log, log_start)
    return records, load_ids


def _logged_loads(load_log: Path, start: int) -> set[str]:
    """Load ids appended to the actors' load log since byte ``start`` (a load whose actor died
    before answering shows up only there; on a cluster without a shared output directory the
    log may not reach this node, and the ids seen in outcomes are all there is)."""
    if not load_log.is_file():
        return set()
    out = set()
    with open(load_log, encoding="utf-8") as fh:
        fh.seek(start)
        for line in fh:
            try:
                d = json.loads(line)
                out.add(f"{d['model']}@{d['load_id']}")
            except (ValueError, KeyError):
                continue
    return out


# --------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------


def plan_sweep(spec: SweepSpec, *, build: bool = True):
    """Expand the spec (no model needed), then build the models it asks for (not in dry runs):
    spec -> plan -> built models, each step reading only the one before."""
    plan = expand(spec)
    if build:
        built = build_models(spec, plan)
        for name, path in built.items():
            log.info("built model %s at %s", name, path)
    return plan


def dry_run(spec: SweepSpec) -> int:
    """Print the plan (task count per model and metric, dropped combinations); load nothing."""
    plan = plan_sweep(spec, build=False)
    print(plan.describe())
    for name, info in plan.models.items():
        print(f"model {name}: {info.spec.ref} ({info.kind})")
    from jobs.tracker import redact_uri

    print(f"tracking: {redact_uri(spec.resolved_tracking_uri)} (experiment {spec.resolved_experiment}); "
          f"output: {spec.output_dir}")
    return 0


def run_sweep(spec: SweepSpec, *, address: str | None = None, progress: bool = True,
              on_outcome: Callable | None = None, server_cls: type | None = None) -> SweepOutcome:
    """Run a validated spec end to end (see the module docstring).

    on_outcome: called as ``on_outcome(task, outcome, ctx)`` after each task is recorded
                (``ctx.actors`` holds the live model actors).
    server_cls: a :class:`actors.model_actor.ModelServer` subclass to run as the model actor
                (tests inject slow or failing servers).

    Nothing computed is lost (``docs/failures.md``): each outcome goes to the write-ahead log
    ``<output_dir>/wal.jsonl`` before MLflow; results an earlier run could not log are uploaded
    first, and half-written runs of a dead driver are marked KILLED (their tasks are redone).
    When the tracking store cannot be reached the sweep runs on: the reports come from the
    write-ahead log and the exit status is 3 until ``audit sync`` uploads them.
    """
    from jobs.wal import mlflow_http_defaults

    with mlflow_http_defaults():
        return _run_sweep(spec, address=address, progress=progress, on_outcome=on_outcome, server_cls=server_cls)


def _connect(spec: SweepSpec, wal, spec_text: str | None, *, close_parents: bool = True):
    """Connect to the tracking store and upload what earlier runs left pending.
    Returns ``(tracker or None, sync outcome or None, reason when offline)``."""
    from jobs.tracker import Tracker, TrackingUnavailable
    from jobs.wal import sync_records

    try:
        tracker = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
        so = sync_records(wal, tracker, spec_text=spec_text, close_parents=close_parents)
    except TrackingUnavailable as e:
        return None, None, str(e)
    if so.error:
        return None, so, so.error
    return tracker, so, None


def _run_sweep(spec: SweepSpec, *, address: str | None, progress: bool, on_outcome: Callable | None,
               server_cls: type | None) -> SweepOutcome:
    from jobs import report
    from jobs.plan import attach_keys
    from jobs.tracker import redact_uri, tracking_env_note
    from jobs.wal import Recorder, WriteAheadLog, wal_path

    t0 = time.perf_counter()
    out_dir = spec.output_dir.resolve()
    handler = _setup_logging(out_dir)
    tracker = None
    uri = spec.resolved_tracking_uri
    try:
        _say(f"=== sweep {spec.name} ({spec.source or 'spec'}) at {time.strftime('%Y-%m-%d %H:%M:%S')}")
        plan = plan_sweep(spec)
        _say(plan.describe())
        attach_keys(plan)
        wal = WriteAheadLog(wal_path(out_dir))
        spec_text = Path(spec.source).read_text(encoding="utf-8") if spec.source and Path(spec.source).is_file() else None
        tracker, so, offline = _connect(spec, wal, spec_text)
        synced = so.uploaded if so else 0
        reaped = so.reaped if so else 0
        if so and (so.uploaded or so.present or so.duplicates or so.reaped):
            _say(f"write-ahead log: {so.uploaded} pending result(s) uploaded, {so.present} already present, "
                 f"{so.duplicates} duplicate(s) skipped; {so.reaped} half-written run(s) of a dead driver marked KILLED")
        parent_id = None
        resumed = False
        if tracker is not None:
            try:
                parent_id, resumed = tracker.start_parent(
                    spec.name, spec.sweep_id(), spec_text=spec_text,
                    params={"spec": spec.source, "seed": spec.seed, "models": ",".join(m.name for m in spec.models),
                            "metrics": ",".join(m.name for m in spec.metrics), "tasks": len(plan.tasks)},
                )
                finished = set(tracker.finished_keys())
            except Exception as e:  # noqa: BLE001 - the store failed between two calls
                tracker, offline = None, str(e)
        recorder = Recorder(wal, tracker, uri)
        if tracker is None:
            recorder.go_offline(RuntimeError(offline or "tracking store unreachable"))
            finished = wal.finished_keys()  # every result this output directory holds
        else:
            finished |= wal.finished_keys(pending_only=True)
        todo = [t for t in plan.tasks if not (t.key and t.key in finished)]
        done_before = len(plan.tasks) - len(todo)
        where = f"parent run {parent_id}{' (resumed)' if resumed else ''}" if parent_id else \
            f"tracking store {redact_uri(uri)} unreachable (results go to {wal.path})"
        _say(f"{where}; {done_before} of {len(plan.tasks)} tasks already finished, {len(todo)} to run")
        ctx = SweepContext(spec=spec)
        records: dict[int, dict] = {}
        load_ids: set[str] = set()
        if todo:
            records, load_ids = _execute(plan, todo, recorder, ctx, address=address, progress=progress,
                                         on_outcome=on_outcome, load_log=out_dir / "loads.jsonl",
                                         server_cls=server_cls)
        else:
            _say("nothing to run: every task already has a finished run; no model loaded")
        _say(f"models loaded: {len(load_ids)}")
        # --- the tracking store went away: one more try to upload before reporting
        rep_dir = out_dir / "reports"
        if not recorder.online and wal.pending():
            tracker2, so2, _ = _connect(spec, wal, spec_text, close_parents=False)
            if so2 is not None:
                synced += so2.uploaded
            if tracker2 is not None:
                _say(f"tracking store back: {so2.uploaded} pending result(s) uploaded")
                try:
                    found = tracker2.find_parent(spec.sweep_id())
                    tracker2.parent_id = parent_id = found.info.run_id if found is not None else None
                    tracker = tracker2
                    recorder = Recorder(wal, tracker, uri)
                except Exception:  # noqa: BLE001 - gone again
                    pass
        # --- reports from the tracking store and the write-ahead log (old and new results)
        keys = [t.key for t in plan.tasks if t.key]
        rows_by_key: dict[str, dict] = {}
        if recorder.online:
            try:
                rows_by_key = tracker.rows_for(keys)
            except Exception as e:  # noqa: BLE001
                recorder.go_offline(e)
        for k, row in wal.rows_for(keys).items():
            cur = rows_by_key.get(k)
            if cur is None or (row["status"] == "finished" and cur.get("status") != "finished"):
                rows_by_key[k] = row
        rows = []
        for i, t in enumerate(todo):
            if not t.key and i in records:
                from jobs.tracker import record_row

                rows.append(record_row(records[i]))
        rows += [rows_by_key[t.key] for t in plan.tasks if t.key and t.key in rows_by_key]
        rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
        df = report.results_frame(rows)
        failed = int((df["status"] != "finished").sum()) if len(df) else 0
        missing = len(plan.tasks) - len(df)
        report.write_reports(df, rep_dir, model_order=[m.name for m in spec.models])
        summary = report.summary_table(df)
        _say("summary:\n" + summary)
        if missing:
            _say(f"{missing} planned task(s) have no run in the tracking store")
        pending = len(wal.pending())
        seconds = time.perf_counter() - t0
        _say(f"{len(todo)} task(s) run, {done_before} resumed, {failed} failed, in {seconds:.1f} s; "
             f"reports in {rep_dir}; {tracking_env_note(uri)}")
        if pending:
            _say(f"{pending} result(s) are not in the tracking store {redact_uri(uri)} ({recorder.error or 'upload incomplete'}); "
                 f"they are kept in {wal.path} and reports/results.parquet: run `audit sync {spec.source or 'SPEC'}` "
                 "when it is back (the next run of this spec uploads them too)")
        handler.flush()
        import shutil

        shutil.copyfile(out_dir / "run.log", rep_dir / "run.log")
        if recorder.online and tracker.parent_id is not None:
            try:
                tracker.end_parent(
                    failed=failed + missing,
                    summary={"tasks": len(plan.tasks), "tasks_run": len(todo), "tasks_resumed": done_before,
                             "tasks_failed": failed, "models_loaded": len(load_ids), "seconds": seconds},
                    report_dir=rep_dir,
                )
            except Exception as e:  # noqa: BLE001 - the parent stays RUNNING; `audit sync` closes it
                _say(f"warning: could not close the parent run: {e}")
        code = 1 if (failed or missing) else (3 if pending else 0)
        return SweepOutcome(
            exit_code=code, planned=len(plan.tasks), skipped_existing=done_before,
            ran=len(todo), failed=failed, loads=len(load_ids), parent_run_id=parent_id, results=df,
            report_dir=rep_dir, seconds=seconds, pending=pending, synced=synced, reaped=reaped,
        )
    except BaseException:
        if tracker is not None and tracker.parent_id is not None:
            try:
                tracker.client.set_terminated(tracker.parent_id, "KILLED")
            except Exception:  # noqa: BLE001
                pass
        raise
    finally:
        logging.getLogger("jobs").removeHandler(handler)
        handler.close()


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jobs.sweep", description="Run a biasaudit sweep spec on Ray.")
    p.add_argument("spec", help="YAML sweep spec (see jobs/specs/ and docs/service.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; load no model, start no Ray")
    p.add_argument("--output-dir", default=None, help="override the spec's output_dir")
    p.add_argument("--tracking-uri", default=None, help="override the spec's tracking.uri (e.g. http://127.0.0.1:5000)")
    p.add_argument("--address", default=None, help="Ray address to connect to (default: local Ray, or the job's cluster)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a = build_parser().parse_args(argv)
    try:
        spec = load_spec(a.spec, output_dir=a.output_dir, tracking_uri=a.tracking_uri)
        if a.dry_run:
            return dry_run(spec)
        return run_sweep(spec, address=a.address, progress=not a.no_progress).exit_code
    except AuditError as e:
        print(f"audit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
