"""Run a sweep spec on Ray, track it in MLflow, write the reports.

    python -m jobs.sweep SPEC [--dry-run] [--output-dir DIR] [--tracking-uri URI] [--address ADDR]
    audit run SPEC [--dry-run] [...]                       (the same, through the audit command)
    ray job submit --working-dir . -- python -m jobs.sweep SPEC --output-dir /shared/out

Steps (``docs/service.md``):

1. read and validate the spec (:mod:`jobs.spec`), build tiny models it asks for
   (:mod:`jobs.builders`), expand it into tasks and print what is dropped and why
   (:mod:`jobs.plan`); ``--dry-run`` stops here, having loaded no model;
2. probe each model's revision without loading it and compute every task's ``audit.key``;
   refuse two models that are the same model (same reference, revision and options: their
   tasks would be the same tasks); skip the keys that already have a FINISHED run in the
   tracking store (resume); with nothing left, no Ray is started and no model is loaded;
3. start an embedded local Ray (``ray.init(address="local", ...)``), or connect to the cluster
   when running inside ``ray job submit`` (``RAY_ADDRESS`` set) or given ``--address``; check
   that the cluster can run what the spec asks for (else exit 4 with one line naming the
   resources); run the tasks on a bounded pool of model workers (:mod:`jobs.pool`: workers
   reused from model to model, each releasing a model completely before loading the next,
   restarted with their pending requests if they die; Hub snapshots of the next models
   prefetched; work that waits longer than ``ray.pending_timeout_s`` for resources fails with
   the demand named); the analyse step as CPU tasks; the driver logs each outcome to MLflow as
   it arrives (:mod:`jobs.tracker`, the only writer) and reports progress (a bar on a
   terminal, else a plain line every ``--progress-interval`` seconds: :mod:`jobs.progress`);
4. regenerate the reports from the tracking store (:mod:`jobs.report`) into
   ``<output_dir>/reports`` and onto the parent run, print a summary (counts, the headline
   values per metric, each distinct failure once with its count).

Inside a Ray job, relative output paths are anchored at ``$BIASAUDIT_HOME`` (default
``~/.biasaudit``), never at the driver's working directory: Ray's temporary copy of the working
directory (``ray job submit --working-dir``), which Ray deletes, or, without one, the directory
the node's ``ray start`` ran in (:func:`job_output_dir`).

Exit status: 0 when every planned task has a finished result, 1 when any failed (the summary
lists each failure's reason), 2 for an invalid spec or option (one line naming the culprit),
3 when every task finished but some results could not be written to the tracking store (they
wait in ``<output_dir>/wal.jsonl`` for ``audit sync``; see :mod:`jobs.wal`), 4 when the sweep is
*stuck*: the cluster cannot run what the spec asks for, or work waited longer than
``ray.pending_timeout_s`` for resources (the parent run is tagged ``audit.state=stuck`` and
``audit.stuck_reason``), 5 when another driver runs the same sweep (one line naming it; nothing
written: :mod:`jobs.lease`), 130/143 on SIGINT/SIGTERM (one line: the results kept and the command
that resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from audit import schema
from audit.cli import OneLineParser
from audit.errors import AuditError, ParameterError, one_line
from audit.outputs import ensure_output_dir, output_dir_problem, write_text_atomic
from audit.signals import Interrupted, clear, install, interrupt, raise_pending, raised_in_main_thread
from jobs import report
from jobs.builders import build_models
from jobs.plan import attach_keys, check_chat_templates, expand, spec_field, words_for_tasks
from jobs.pool import SchedulingError, in_ray_job, run_tasks
from jobs.progress import Progress, use_bar
from jobs.spec import SweepSpec, load_spec
from jobs.tracker import (
    STUCK_EXIT_CODE,
    Tracker,
    TrackingUnavailable,
    driver_id,
    record_row,
    redact_uri,
    sqlite_path,
    tracking_env_note,
    unavailable,
)
from jobs.lease import BUSY_EXIT_CODE, DEFAULT_TTL, Busy, Lease
from jobs.wal import Recorder, WriteAheadLog, mlflow_http_defaults, sync_hint, sync_records, wal_path

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
    reaped:   half-written child runs of dead drivers this run marked KILLED;
    stuck:    why the sweep is stuck (exit status 4), else ``None``;
    workers:  model worker processes this run started.
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
    stuck: str | None = None
    workers: int = 0


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
    if _SIGNALS_HANDLED:
        on_signals()
    return True


def _raise_interrupted(signum, frame) -> None:  # noqa: ARG001 - the signal module's signature
    import logging
    import signal

    install(signal.SIG_IGN)  # one interruption: a second signal does not cut the cleanup
    # A database store's writes run whole (jobs.tracker.tracking_client: raised when the call
    # returns); a call to an MLflow server can still be cut, and MLflow logs the cut call with a
    # traceback. The results are in the write-ahead log and the driver's one line says so.
    logging.getLogger("mlflow").setLevel(logging.CRITICAL)
    interrupt(signum)  # recorded first: a raise lost in a finalizer is raised again (audit.signals)


def on_signals() -> None:
    """Make SIGINT and SIGTERM raise :class:`audit.signals.Interrupted` in the main thread (the
    driver then shuts Ray down, marks the parent run KILLED, releases the sweep's lease and exits
    130/143 with one line). Installed by :func:`main`, and again after ``ray.init``, which installs
    its own SIGTERM handler (a C++ stack dump and exit status 134). Only from the main thread;
    elsewhere a no-op. A raise that lands in a finalizer is lost there; the signal stays recorded
    and the scheduling loop raises it again at its next tick (:func:`audit.signals.raise_pending`)."""
    install(_raise_interrupted)


def _words_for(plan, tasks) -> list[str] | None:
    """Union of the words the association tasks of a static model need (``None``: keep all)."""
    words = words_for_tasks(plan, tasks)
    return sorted(words) if words else None


def _execute(plan, todo, recorder, ctx: SweepContext, *, address: str | None, progress: bool,
             progress_interval: float, on_outcome: Callable | None, load_log: Path,
             server_cls: type | None = None):
    """Run ``todo`` on Ray (:func:`jobs.pool.run_tasks`); record each outcome as it arrives
    (write-ahead log, then MLflow: :class:`jobs.wal.Recorder`). Returns the
    :class:`jobs.pool.PoolResult`, its load ids completed from the load log. Raises
    :class:`jobs.pool.SchedulingError` when the cluster cannot run the spec."""
    import ray

    spec = plan.spec
    log_start = load_log.stat().st_size if load_log.is_file() else 0
    started = _init_ray(spec, address)
    prog = Progress(len(todo), label=spec.name, bar=use_bar(progress), interval=progress_interval, say=_say)
    ok = False
    try:
        res = run_tasks(plan, todo, recorder, ctx, load_log=load_log, say=_say, progress=prog, on_outcome=on_outcome,
                        server_cls=server_cls, words_for=_words_for)
        ok = True
    finally:
        prog.close(final_line=ok)
        if started:
            ray.shutdown()
    res.load_ids |= _logged_loads(load_log, log_start)
    return res


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
    return check_chat_templates(plan)  # a model without the chat template a task asks for: before any load


def check_duplicate_models(plan) -> None:
    """Refuse two models of a spec that are the same model: same reference, resolved revision
    and options, so that their tasks have the same ``audit.key`` (the same tasks: loaded and run
    twice, and reported under one name). Before keys are known (a dry run, a revision that
    cannot be probed) models with the same reference, options, parameters and build are the same.
    Raises :class:`audit.errors.ParameterError` naming both spec fields."""
    spec = plan.spec
    index = {m.name: i for i, m in enumerate(spec.models)}
    owner: dict[str, str] = {}
    pair = None
    for t in plan.tasks:
        if not t.key:
            continue
        first = owner.setdefault(t.key, t.model)
        if first != t.model:
            pair = (first, t.model)
            break
    if pair is None:
        seen: dict[str, str] = {}
        keyed = {t.model for t in plan.tasks if t.key}
        for m in spec.models:
            if m.name in keyed:
                continue
            ident = json.dumps([m.ref, dict(m.options), dict(m.params), dict(m.build or {}), m.tests],
                               sort_keys=True, default=str)
            if ident in seen:
                pair = (seen[ident], m.name)
                break
            seen[ident] = m.name
    if pair is None:
        return
    a, b = pair
    ma = spec.models[index[a]]
    info = plan.models.get(a)
    rev = getattr(info, "revision", None) or ma.options.get("revision")
    what = f"{ma.ref}" + (f" at revision {str(rev)[:40]}" if rev else "")
    raise ParameterError(
        f"{spec.source or 'spec'}: {spec_field(spec, index[b])}: model {b!r} is the same model as "
        f"{spec_field(spec, index[a])} ({a!r}): {what}, same options; its tasks would be {a!r}'s tasks, "
        "loaded and run twice; list it once (or give it different params)"
    )


def persistent_home() -> Path:
    """Where sweeps inside a Ray job write relative output paths: ``$BIASAUDIT_HOME``, default
    ``~/.biasaudit``."""
    return Path(os.environ.get("BIASAUDIT_HOME") or "~/.biasaudit").expanduser()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def check_output_dir(spec: SweepSpec, *, create: bool) -> None:
    """Refuse an ``output_dir`` that cannot be written, naming it (:mod:`audit.outputs`); with
    ``create`` make it and write a probe file (a dry run only looks)."""
    what = f"{spec.source or 'spec'}: output_dir"
    if create:
        ensure_output_dir(spec.output_dir, what)
    elif (problem := output_dir_problem(spec.output_dir)) is not None:
        raise ParameterError(f"{what}: {problem}")


def job_output_dir(spec: SweepSpec, *, job: dict | None = None, cwd: Path | None = None) -> tuple[SweepSpec, str | None]:
    """Keep a sweep run inside ``ray job submit`` from writing where nobody finds the results.

    Inside a Ray job (``RAY_JOB_CONFIG_JSON_ENV_VAR`` set by Ray for the entrypoint) the driver's
    working directory is either Ray's temporary copy of the working directory (the job has a
    ``working_dir``, or the current directory is under Ray's ``runtime_resources``), deleted
    with the job, or, for a job without one (the package installed from a wheel through the
    runtime_env's ``pip``), the directory the node's ``ray start`` ran in, not the submitter's.
    So a relative ``output_dir`` (the spec's or ``--output-dir``'s) is anchored at
    :func:`persistent_home`: ``out/smoke`` becomes ``~/.biasaudit/out/smoke``. A relative SQLite
    tracking URI, and an absolute output directory or SQLite store inside the copy, are refused.
    Returns the (possibly changed) spec and a line saying what changed (``None`` when nothing
    did). Outside a job nothing changes."""
    job = in_ray_job() if job is None else job
    if job is None:
        return spec, None
    cwd = Path.cwd() if cwd is None else Path(cwd)
    copy = bool((job.get("runtime_env") or {}).get("working_dir")) or "runtime_resources" in cwd.resolve().parts
    where = (f"the Ray job's temporary copy of the working directory ({cwd}), deleted after the job" if copy else
             f"the Ray job driver's working directory ({cwd}, where the node's `ray start` ran)")
    src = spec.source or "spec"
    db = sqlite_path(spec.tracking_uri) if spec.tracking_uri else None
    if db is not None and (not db.is_absolute() or (copy and _inside(db, cwd))):
        raise ParameterError(f"{src}: tracking.uri: {spec.tracking_uri} lies in {where}; give an absolute path on "
                             "persistent storage or an MLflow server")
    out = spec.output_dir
    if out.is_absolute():
        if copy and _inside(out, cwd):
            raise ParameterError(f"{src}: output_dir: {out} lies in {where}; give a path on persistent storage "
                                 "(--output-dir)")
        return spec, None
    new = persistent_home() / out
    note = (f"inside a Ray job: output directory {out} -> {new} (relative output paths are anchored at "
            f"$BIASAUDIT_HOME, default ~/.biasaudit, not at {where}; see docs/service.md)")
    return dataclasses.replace(spec, output_dir=new), note


def dry_run(spec: SweepSpec) -> int:
    """Print the plan (task count per model and metric, dropped combinations); load nothing."""
    plan = plan_sweep(spec, build=False)
    check_duplicate_models(plan)
    print(plan.describe())
    for name, info in plan.models.items():
        print(f"model {name}: {info.spec.ref} ({info.kind})")

    print(f"tracking: {redact_uri(spec.resolved_tracking_uri)} (experiment {spec.resolved_experiment}); "
          f"output: {spec.output_dir}")
    return 0


def run_sweep(spec: SweepSpec, *, address: str | None = None, progress: bool = True,
              on_outcome: Callable | None = None, server_cls: type | None = None,
              progress_interval: float = 30.0) -> SweepOutcome:
    """Run a validated spec end to end (see the module docstring).

    progress:   a bar when stderr is a terminal; otherwise (or ``False``) a plain progress line
                every ``progress_interval`` seconds.
    on_outcome: called as ``on_outcome(task, outcome, ctx)`` after each task is recorded
                (``ctx.actors`` holds the live model workers by model name).
    server_cls: a :class:`actors.model_actor.ModelServer` subclass to run as the model worker
                (tests inject slow or failing servers).

    Nothing computed is lost (``docs/failures.md``): each outcome goes to the write-ahead log
    ``<output_dir>/wal.jsonl`` before MLflow; results an earlier run could not log are uploaded
    first, and half-written runs of a dead driver are marked KILLED (their tasks are redone).
    When the tracking store cannot be reached, at any point (opening it included), the sweep
    runs on: the reports come from the write-ahead log and the exit status is 3 until
    ``audit sync`` uploads them.
    """
    with mlflow_http_defaults():
        return _run_sweep(spec, address=address, progress=progress, on_outcome=on_outcome, server_cls=server_cls,
                          progress_interval=progress_interval)


def _connect(spec: SweepSpec, wal, spec_text: str | None, *, close_parents: bool = True, tracker=None):
    """Connect to the tracking store (unless ``tracker`` is given) and upload what earlier runs
    left pending. Returns ``(tracker or None, sync outcome or None, reason when offline)``."""
    try:
        tracker = tracker or Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
        so = sync_records(wal, tracker, spec_text=spec_text, close_parents=close_parents)
    except TrackingUnavailable as e:
        return None, None, str(e)
    if so.error:
        return None, so, so.error
    return tracker, so, None


def _run_sweep(spec: SweepSpec, *, address: str | None, progress: bool, on_outcome: Callable | None,
               server_cls: type | None, progress_interval: float = 30.0) -> SweepOutcome:
    t0 = time.perf_counter()
    out_dir = spec.output_dir.resolve()
    uri = spec.resolved_tracking_uri
    claim = _claim_sweep(spec, out_dir)
    if isinstance(claim, SweepOutcome):
        return claim
    local_lock, tracker, lease, offline_at_start = claim
    aborted = False
    handler = _setup_logging(out_dir)
    try:
        _say(f"=== sweep {spec.name} ({spec.source or 'spec'}) at {time.strftime('%Y-%m-%d %H:%M:%S')}")
        plan = plan_sweep(spec)
        _say(plan.describe())
        attach_keys(plan)
        check_duplicate_models(plan)
        wal = WriteAheadLog(wal_path(out_dir))
        spec_text = Path(spec.source).read_text(encoding="utf-8") if spec.source and Path(spec.source).is_file() else None
        if lease is not None and lease.taken_over is not None:
            _say(f"took over the lease of a driver that is gone: {lease.taken_over.describe()}")
            tracker.dead_drivers.add(lease.taken_over.holder)  # its RUNNING runs are half-written: KILLED
        if tracker is not None:
            tracker, so, offline = _connect(spec, wal, spec_text, tracker=tracker)
        else:
            so, offline = None, offline_at_start
        synced = so.uploaded if so else 0
        reaped = so.reaped if so else 0
        if so and (so.uploaded or so.present or so.duplicates or so.reaped):
            _say(f"write-ahead log: {so.uploaded} pending result(s) uploaded, {so.present} already present, "
                 f"{so.duplicates} duplicate(s) skipped; {so.reaped} half-written run(s) of a dead driver marked KILLED")
        parent_id = None
        resumed = False
        invocation = 1
        if tracker is not None:
            try:
                parent_id, resumed = tracker.start_parent(
                    spec.name, spec.sweep_id(), spec_text=spec_text,
                    params={"spec": spec.source, "seed": spec.seed, "models": ",".join(m.name for m in spec.models),
                            "metrics": ",".join(m.name for m in spec.metrics), "tasks": len(plan.tasks)},
                    tags=dict(spec.tags),
                )
                invocation = int(tracker.client.get_run(parent_id).data.tags.get("audit.invocations", "1"))
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
        stuck: str | None = None
        workers = 0
        if todo:
            try:
                res = _execute(plan, todo, recorder, ctx, address=address, progress=progress,
                               progress_interval=progress_interval, on_outcome=on_outcome,
                               load_log=out_dir / "loads.jsonl", server_cls=server_cls)
                records, load_ids, stuck, workers = res.records, res.load_ids, res.stuck, res.workers_started
                if res.prefetch is not None and (res.prefetch.fetched or res.prefetch.failed):
                    _say(f"prefetched {res.prefetch.fetched} Hub snapshot(s) ({res.prefetch.bytes / 2**20:.1f} MiB) "
                         f"while measuring; {res.prefetch.failed} prefetch(es) failed (those models downloaded at load)")
            except SchedulingError as e:
                stuck = str(e)
                print(f"audit: error: {spec.source or spec.name}: {e}", file=sys.stderr, flush=True)
                log.error("%s", e)
        else:
            _say("nothing to run: every task already has a finished run; no model loaded")
        ran_now = recorder.logged + recorder.deferred  # outcomes recorded: a refused or stuck sweep ran none
        _say(f"models loaded: {len(load_ids)}" + (f" by {workers} worker process(es)" if workers and load_ids else ""))
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
        if lease is not None and lease.lost:
            _say(f"the sweep lease {lease.name} was taken over by another driver while this one was paused; "
                 "its results are kept (write-ahead log, tracking store); the reports are left to that driver")
            return SweepOutcome(exit_code=BUSY_EXIT_CODE, planned=len(plan.tasks), skipped_existing=done_before,
                                ran=ran_now, failed=0, loads=len(load_ids), parent_run_id=parent_id,
                                seconds=time.perf_counter() - t0, workers=workers)
        # --- reports from the tracking store and the write-ahead log (old and new results)
        keys = [t.key for t in plan.tasks if t.key]
        rows_by_key: dict[str, dict] = {}
        # one search of the experiment's task runs (all child runs are written by now) serves the
        # report's rows, the adjusted p-values and the parent's totals
        task_runs = None
        if recorder.online:
            try:
                task_runs = tracker.task_runs()
                rows_by_key = tracker.rows_for(keys, runs=task_runs)
            except Exception as e:  # noqa: BLE001
                recorder.go_offline(e)
        for k, row in wal.rows_for(keys).items():
            cur = rows_by_key.get(k)
            if cur is None or (row["status"] == "finished" and cur.get("status") != "finished"):
                rows_by_key[k] = row
        rows = []
        for i, t in enumerate(todo):
            if not t.key and i in records:
                rows.append(record_row(records[i]))
        # a key's run may come from another sweep (or name) in the experiment: report it under this plan's name
        rows += [{**rows_by_key[t.key], "model": t.model} for t in plan.tasks if t.key and t.key in rows_by_key]
        rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
        mc = spec.multiple_comparisons
        df = report.adjust_pvalues(report.results_frame(rows), mc)
        failed = int((df["status"] != "finished").sum()) if len(df) else 0
        missing = len(plan.tasks) - len(df)
        model_order = [m.name for m in spec.models]
        report.write_reports(df, rep_dir, model_order=model_order, multiple_comparisons=mc)
        if recorder.online:  # the families are complete: each child run gets its adjusted p-values
            try:
                tracker.log_adjusted(df, mc.family, runs=task_runs)
            except Exception as e:  # noqa: BLE001 - results.parquet has them; the next invocation retries
                _say(f"warning: could not log the adjusted p-values on the child runs: {e}")
        summary = report.summary_table(df, model_order=model_order, multiple_comparisons=mc)
        _say("summary:\n" + summary)
        if missing:
            _say(f"{missing} planned task(s) have no run in the tracking store")
        pending = len(wal.pending())
        seconds = time.perf_counter() - t0
        not_run = f" ({len(todo) - ran_now} of {len(todo)} not run)" if ran_now < len(todo) else ""
        _say(f"{ran_now} task(s) run{not_run}"
             + f", {done_before} resumed, {failed} failed, in {seconds:.1f} s; "
             f"reports in {rep_dir}; {tracking_env_note(uri)}")
        if pending:
            _say(f"{pending} result(s) are not in the tracking store {redact_uri(uri)} ({recorder.error or 'upload incomplete'}); "
                 f"they are kept in {wal.path} and reports/results.parquet: "
                 f"run `{sync_hint(spec.source, out_dir, uri)}` "
                 "when it is back (the next run of this spec with the same options uploads them too)")
        if stuck:
            _say(f"the sweep is stuck (exit status 4): {stuck}")
        handler.flush()
        import shutil

        shutil.copyfile(out_dir / "run.log", rep_dir / "run.log")
        if recorder.online and tracker.parent_id is not None:
            try:
                tracker.end_parent(
                    failed=failed + missing, step=invocation, stuck_reason=stuck,
                    summary=parent_summary(tracker, plan, df, ran=ran_now, resumed=done_before, loads=len(load_ids),
                                           seconds=seconds, workers=workers, invocation=invocation,
                                           runs=task_runs),
                    report_dir=rep_dir,
                )
            except Exception as e:  # noqa: BLE001 - the parent stays RUNNING; `audit sync` closes it
                _say(f"warning: could not close the parent run: {e}")
        code = STUCK_EXIT_CODE if stuck else 1 if (failed or missing) else (3 if pending else 0)
        return SweepOutcome(
            exit_code=code, planned=len(plan.tasks), skipped_existing=done_before,
            ran=ran_now, failed=failed, loads=len(load_ids), parent_run_id=parent_id, results=df,
            report_dir=rep_dir, seconds=seconds, pending=pending, synced=synced, reaped=reaped, stuck=stuck,
            workers=workers,
        )
    except BaseException:
        aborted = True
        if tracker is not None and tracker.parent_id is not None:
            try:
                tracker.client.set_terminated(tracker.parent_id, "KILLED")
            except Exception:  # noqa: BLE001
                pass
        raise
    finally:
        logging.getLogger("jobs").removeHandler(handler)
        handler.close()
        if lease is not None:  # a sweep that ended normally leaves no registered model behind
            lease.release(delete=not aborted)
        local_lock.release()


def lease_ttl() -> float:
    """Seconds without a heartbeat after which another driver's sweep lease is stale:
    ``BIASAUDIT_LEASE_TTL``, default :data:`jobs.lease.DEFAULT_TTL`."""
    return float(os.environ.get("BIASAUDIT_LEASE_TTL") or DEFAULT_TTL)


def _busy(spec: SweepSpec, who: str) -> SweepOutcome:
    """The outcome of an invocation that found the sweep being run by another driver: one line
    on stderr naming the holder, exit status :data:`jobs.lease.BUSY_EXIT_CODE`, nothing written."""
    print(f"audit: busy: sweep {spec.name} ({spec.source or 'spec'}) is being run by {who}; this invocation ran "
          f"nothing and wrote nothing (exit status {BUSY_EXIT_CODE}); run it again after that one ends to resume",
          file=sys.stderr, flush=True)
    return SweepOutcome(exit_code=BUSY_EXIT_CODE, planned=0, skipped_existing=0, ran=0, failed=0, loads=0,
                        parent_run_id=None)


def _lock_holder(out_dir: Path, wait_s: float = 5.0) -> str:
    """``host H pid P`` of the driver holding ``<output_dir>/sweep.lock``, as it wrote it just after
    taking the lock (waiting up to ``wait_s`` for a driver that has just taken it), else "another driver"."""
    path = out_dir / "sweep.lock.holder"
    deadline = time.monotonic() + wait_s
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        return path.read_text(encoding="utf-8").strip() or "another driver"
    except OSError:
        return "another driver"


def _claim_sweep(spec: SweepSpec, out_dir: Path):
    """Make this driver the only one of the sweep (:mod:`jobs.lease`): a file lock on
    ``<output_dir>/sweep.lock`` (drivers sharing an output directory, the tracking store
    reachable or not), then the sweep's lease in the tracking store (drivers on any machine).
    Returns ``(file lock, tracker or None, lease or None, reason when offline)``, or the busy
    :class:`SweepOutcome` when another driver holds either."""
    from filelock import FileLock, Timeout

    out_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out_dir / "sweep.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return _busy(spec, f"{_lock_holder(out_dir)} (lock {out_dir / 'sweep.lock'})")
    try:
        # renamed into place: never read half-written
        write_text_atomic(out_dir / "sweep.lock.holder", f"host {driver_id().rsplit(':', 2)[0]} pid {os.getpid()}\n")
        try:
            tracker = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
        except TrackingUnavailable as e:
            return lock, None, None, str(e)
        try:
            lease = Lease(tracker.client, tracker.experiment_id, spec.sweep_id(), driver=tracker.driver,
                          ttl=lease_ttl()).acquire()
        except Busy as b:
            lock.release()
            return _busy(spec, b.holder.describe())
        except Exception as e:  # noqa: BLE001 - the store failed between two calls: run offline
            return lock, None, None, str(unavailable(spec.resolved_tracking_uri, e))
        return lock, tracker, lease, None
    except BaseException:
        lock.release()
        raise


def parent_summary(tracker, plan, df, *, ran: int, resumed: int, loads: int, seconds: float, workers: int,
                   invocation: int, runs=None) -> dict[str, float]:
    """The parent run's metrics: the sweep as a whole across invocations.

    ``tasks`` (planned now), ``tasks_finished``/``tasks_failed``/``tasks_missing`` (the best
    result of each planned task, whichever invocation produced it); ``child_runs`` under the
    parent over all invocations, by status, and ``child_runs_superseded`` (runs of tasks no
    longer planned: an earlier commit of a moved branch); ``invocations``; this invocation's
    ``tasks_run``, ``tasks_resumed``, ``models_loaded``, ``workers_started``, ``seconds``
    (logged at step = invocation number, so their history lists every invocation), the
    running totals ``tasks_run_total``, ``models_loaded_total``, ``seconds_total``, and the
    finished tasks significant at 0.05 by their raw, Holm- and BH-adjusted p-values
    (``significant_raw``, ``significant_holm``, ``significant_bh``; the adjusted ones over the
    families of ``multiple_comparisons``, as in ``reports/results.parquet``). ``runs``: the
    experiment's task runs the report was built from (:meth:`jobs.tracker.Tracker.sweep_totals`)."""
    n_ok = int((df["status"] == "finished").sum()) if len(df) else 0
    sig = {f"significant_{k}": float((df[c].astype("float64") < 0.05).sum()) if c in df.columns and len(df) else 0.0
           for k, c in (("raw", "p_value"), ("holm", "p_holm"), ("bh", "p_bh"))}
    totals = tracker.sweep_totals([t.key for t in plan.tasks if t.key], runs=runs)
    prev = {k.split(".", 1)[1]: totals.pop(k) for k in list(totals) if k.startswith("previous.")}
    return {
        "tasks": len(plan.tasks), "tasks_finished": n_ok, "tasks_failed": len(df) - n_ok,
        "tasks_missing": len(plan.tasks) - len(df), **totals, "invocations": invocation,
        "tasks_run": ran, "tasks_resumed": resumed, "models_loaded": loads, "workers_started": workers,
        # a killed driver never adds its tasks to the running total: every child run is a task run
        "seconds": seconds, "tasks_run_total": max(prev["tasks_run_total"] + ran, totals["child_runs"]),
        "models_loaded_total": prev["models_loaded_total"] + loads, "seconds_total": prev["seconds_total"] + seconds,
        **sig,
    }


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m jobs.sweep", description="Run a biasaudit sweep spec on Ray.")
    p.add_argument("spec", help="YAML sweep spec (see jobs/specs/ and docs/service.md)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; load no model, start no Ray")
    p.add_argument("--output-dir", default=None, help="override the spec's output_dir")
    p.add_argument("--tracking-uri", default=None, help="override the spec's tracking.uri (e.g. http://127.0.0.1:5000)")
    p.add_argument("--address", default=None, help="Ray address to connect to (default: local Ray, or the job's cluster)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar: plain progress lines instead (also when stderr is not a terminal)")
    p.add_argument("--progress-interval", type=float, default=30.0, metavar="SECONDS",
                   help="seconds between plain progress lines (default 30)")
    return p


#: Whether this process's driver turns SIGINT/SIGTERM into :class:`Interrupted` (set by :func:`main`).
_SIGNALS_HANDLED = False


def interrupted_line(spec: SweepSpec, signum: int, since_ms: int) -> str:
    """The one line a sweep interrupted by a signal prints: how many results this invocation
    kept (records in the write-ahead log, uploaded or pending) and the command that resumes it."""
    import shlex
    import signal

    wal = WriteAheadLog(wal_path(spec.output_dir.resolve()))
    kept = sum(1 for r in wal.records() if int(r.get("time_ms") or 0) >= since_ms)
    cmd = (f"audit run {shlex.quote(str(spec.source or 'SPEC'))} --output-dir {shlex.quote(str(spec.output_dir))} "
           f"--tracking-uri {shlex.quote(redact_uri(spec.resolved_tracking_uri))}")
    return f"interrupted ({signal.Signals(signum).name}): {kept} result(s) kept; resume with: {cmd}"


def main(argv: Sequence[str] | None = None) -> int:
    global _SIGNALS_HANDLED
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a = build_parser().parse_args(argv)
    import signal

    _SIGNALS_HANDLED = True
    since_ms = int(time.time() * 1000)
    try:
        try:
            with raised_in_main_thread(_raise_interrupted):
                code = _main(a)
                raise_pending()  # a signal whose raise a finalizer lost after the last safe point
                return code
        except KeyboardInterrupt:
            raise Interrupted(signal.SIGINT) from None
    except Interrupted as e:
        clear()
        try:
            line = interrupted_line(job_output_dir(load_spec(a.spec, output_dir=a.output_dir,
                                                             tracking_uri=a.tracking_uri))[0], e.signum, since_ms)
        except Exception:  # noqa: BLE001 - interrupted before the spec was read
            line = f"interrupted ({signal.Signals(e.signum).name}): 0 result(s) kept; resume with: audit run {a.spec}"
        print(line, file=sys.stderr, flush=True)
        return 128 + int(e.signum)
    finally:
        _SIGNALS_HANDLED = False


def _main(a) -> int:
    try:
        schema.number(a.progress_interval, "--progress-interval", 0.0, strict=True)
        spec = load_spec(a.spec, output_dir=a.output_dir, tracking_uri=a.tracking_uri)
        spec, note = job_output_dir(spec)
        if note:
            print(note, flush=True)
        check_output_dir(spec, create=not a.dry_run)  # before any work: a traceback after it loses the results
        if a.dry_run:
            return dry_run(spec)
        return run_sweep(spec, address=a.address, progress=not a.no_progress,
                         progress_interval=a.progress_interval).exit_code
    except AuditError as e:
        print(f"audit: error: {one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
