"""The write-ahead log of a sweep's results, and ``audit sync``: nothing computed is lost.

Every task outcome becomes a *record* (:func:`jobs.tracker.task_record`: tags, params,
metrics, the per-item table, the result or the error) that the driver appends to
``<output_dir>/wal.jsonl`` *before* writing it to MLflow, then marks as synced once its child
run is complete. A driver killed mid-sweep, or a tracking server that stops answering, leaves
records without a synced mark: they are *pending*, and

* the next run of the spec (``audit run SPEC``) uploads them before planning, or
* ``audit sync SPEC`` uploads them (e.g. once the MLflow server is back),

each exactly once: a record whose id (tag ``audit.record``) already has a complete run, or a
finished record whose ``audit.key`` already has a FINISHED run, is marked synced without a new
run. Half-written runs of dead drivers (RUNNING) are marked KILLED first
(:meth:`jobs.tracker.Tracker.reap_stale_runs`).

The file is JSON lines, append-only, one writer (the driver), each line flushed and fsync'ed::

    {"op": "task", "record": {...}}                                       # a task's outcome
    {"op": "synced", "id": "<record id>", "run_id": "...", "uri": "...", "how": "logged"}

A torn last line (the driver killed while writing it) is ignored on reading, and the next
append starts on a fresh line. While the tracking store is unreachable the sweep goes on: its
results are in the WAL and in ``reports/results.parquet``, and the exit status is 3 (results
complete, upload pending) unless a task failed (1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from audit.cli import OneLineParser
from audit.errors import AuditError, ParameterError, one_line
from audit.outputs import output_dir_problem
from audit.signals import deferred
from jobs.spec import load_spec
from jobs.tracker import Tracker, TrackingUnavailable, driver_alive, record_row, redact_uri, unavailable
from jobs.uris import store_identity

log = logging.getLogger("jobs.wal")

WAL_NAME = "wal.jsonl"

#: MLflow HTTP client settings used by sweeps and ``audit sync`` unless the environment sets
#: them: a refused connection fails after ~3 s (2 retries, backoff 1 s) instead of MLflow's
#: default of minutes (7 retries, backoff 2 s), so a dead server costs one short wait per sweep
#: (the recorder then stays offline), not one per task. Going offline early loses nothing:
#: the results wait in the write-ahead log and are uploaded at the end of the sweep if the
#: server is back, else by ``audit sync``.
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "60",
}


@contextlib.contextmanager
def mlflow_http_defaults() -> Iterator[None]:
    """Apply :data:`MLFLOW_HTTP_DEFAULTS` for the variables the environment leaves unset, and
    keep urllib3's per-retry warnings off the terminal (the sweep reports an outage once)."""
    added = [k for k in MLFLOW_HTTP_DEFAULTS if k not in os.environ]
    for k in added:
        os.environ[k] = MLFLOW_HTTP_DEFAULTS[k]
    pool_log = logging.getLogger("urllib3.connectionpool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        pool_log.setLevel(level)
        for k in added:
            os.environ.pop(k, None)


def wal_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / WAL_NAME


class WriteAheadLog:
    """Append-only JSON-lines log of task records and their synced marks (see the module
    docstring). One writer per file (the sweep's driver, or ``audit sync``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # ------------------------------------------------------------------ writing
    def _append(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with deferred(), open(self.path, "ab") as fh:  # a signal waits for the line and its fsync
            if fh.tell() > 0:  # a torn last line (writer killed mid-line) must not swallow this one
                with open(self.path, "rb") as rd:
                    rd.seek(-1, os.SEEK_END)
                    if rd.read(1) != b"\n":
                        fh.write(b"\n")
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: dict[str, Any], *, uri: str | None = None) -> None:
        """Durably append a task record (before it is written anywhere else); ``uri``: the
        tracking store it is meant for, kept (credentials redacted) so that ``audit sync``
        uploads it there (:meth:`pending_targets`)."""
        entry: dict[str, Any] = {"op": "task", "record": record}
        if uri:
            entry["uri"] = redact_uri(uri)
        self._append(entry)

    def mark_synced(self, record_id: str, *, run_id: str | None, uri: str, how: str = "logged") -> None:
        """Record that ``record_id`` has a complete run in the tracking store at ``uri``
        (``how``: ``logged`` now, ``present`` already there, ``duplicate`` of another FINISHED
        run with the same key)."""
        self._append({"op": "synced", "id": record_id, "run_id": run_id, "uri": redact_uri(uri), "how": how})

    # ------------------------------------------------------------------ reading
    def entries(self) -> list[dict[str, Any]]:
        """Every well-formed line (a torn or corrupt line is skipped with a warning)."""
        if not self.path.is_file():
            return []
        out = []
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    e = json.loads(line)
                except ValueError:
                    log.warning("%s: line %d is not complete JSON (a write cut short); ignored", self.path, n)
                    continue
                if isinstance(e, dict) and e.get("op") in ("task", "synced"):
                    out.append(e)
        return out

    def records(self) -> list[dict[str, Any]]:
        """Every task record, oldest first."""
        return [e["record"] for e in self.entries() if e["op"] == "task" and isinstance(e.get("record"), dict)]

    def synced_ids(self) -> set[str]:
        return {e.get("id") for e in self.entries() if e["op"] == "synced"}

    def pending(self) -> list[dict[str, Any]]:
        """Task records without a synced mark, oldest first."""
        done = self.synced_ids()
        return [r for r in self.records() if r.get("id") not in done]

    def pending_targets(self) -> set[str]:
        """The tracking stores (redacted URIs) the pending records were meant for."""
        done = self.synced_ids()
        return {e["uri"] for e in self.entries() if e["op"] == "task" and e.get("uri")
                and isinstance(e.get("record"), dict) and e["record"].get("id") not in done}

    def finished_keys(self, *, pending_only: bool = False) -> set[str]:
        """``audit.key`` and plan keys of the finished records (all, or only pending ones)."""
        recs = self.pending() if pending_only else self.records()
        out = set()
        for r in recs:
            if r.get("status") == "finished":
                out |= {k for k in (r.get("key"), r.get("plan_key")) if k}
        return out

    def rows_for(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """For each key, the :func:`jobs.tracker.record_row` of its best record (finished over
        failed, then newest), with ``run_id`` where the record was synced."""
        wanted = {k for k in keys if k}
        run_ids = {e.get("id"): e.get("run_id") for e in self.entries() if e["op"] == "synced"}
        best: dict[str, dict[str, Any]] = {}
        for r in self.records():
            k = next((x for x in (r.get("plan_key"), r.get("key")) if x in wanted), None)
            if k is None:
                continue
            rank = (r.get("status") == "finished", r.get("time_ms") or 0)
            cur = best.get(k)
            if cur is None or rank > (cur.get("status") == "finished", cur.get("time_ms") or 0):
                best[k] = r
        return {k: {**record_row(r, run_ids.get(r["id"])), "_time_ms": r.get("time_ms") or 0} for k, r in best.items()}


# --------------------------------------------------------------------------------------
# The recorder: WAL first, then MLflow while it answers
# --------------------------------------------------------------------------------------


class Recorder:
    """Where a sweep's outcomes go: the WAL first, then MLflow through ``tracker`` while it
    answers. After the first tracking failure the recorder is *offline*: later records stay
    pending in the WAL (no further wait on a dead server)."""

    def __init__(self, wal: WriteAheadLog, tracker: Tracker | None, uri: str):
        self.wal = wal
        self.tracker = tracker
        self.uri = uri
        self.error: str | None = None
        self.logged = 0
        self.deferred = 0

    @property
    def online(self) -> bool:
        return self.tracker is not None and self.error is None

    def go_offline(self, e: BaseException) -> None:
        if self.error is None:
            self.error = str(e)
            log.warning("tracking store unreachable, results stay in %s until `audit sync`: %s", self.wal.path, e)
            print(f"warning: {e}; results are kept in {self.wal.path} and reports/results.parquet; "
                  "they are uploaded by `audit sync SPEC` or the next run", file=sys.stderr, flush=True)

    def record(self, rec: dict[str, Any]) -> str | None:
        """Append ``rec`` to the WAL, then log it (if online). Returns the run id or ``None``."""
        self.wal.append(rec, uri=self.uri)
        if not self.online:
            self.deferred += 1
            return None
        try:
            run_id = self.tracker.log_record(rec)
        except Exception as e:  # noqa: BLE001 - TrackingUnavailable or any store failure
            self.go_offline(e)
            self.deferred += 1
            return None
        self.wal.mark_synced(rec["id"], run_id=run_id, uri=self.uri)
        self.logged += 1
        return run_id


# --------------------------------------------------------------------------------------
# Sync
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class SyncOutcome:
    """What :func:`sync_records` did.

    uploaded: records logged as new runs; present: records whose run was already complete
    (a driver died after logging it); duplicates: finished records whose key already had a
    FINISHED run (not logged again); reaped: half-written runs marked KILLED; pending: records
    still waiting (the store failed during the sync).
    """

    uploaded: int = 0
    present: int = 0
    duplicates: int = 0
    reaped: int = 0
    pending: int = 0
    error: str | None = None


def sync_records(wal: WriteAheadLog, tracker: Tracker, *, spec_text: str | None = None,
                 report_dir: Path | None = None, close_parents: bool = True) -> SyncOutcome:
    """Upload the pending records of ``wal`` through ``tracker``, each exactly once.

    Stale RUNNING child runs of dead drivers are marked KILLED first. A record goes under the
    parent run of its sweep (tag ``audit.sweep_id``), created if missing (with ``spec_text``
    as ``spec.yaml``). A parent left RUNNING by a dead driver is closed: FAILED if a latest
    record of one of its keys failed, else FINISHED, with ``report_dir`` logged under
    ``reports/`` (``close_parents=False``: left to the caller). Raises :class:`TrackingUnavailable` if the store cannot be read at all; a
    failure mid-way stops the upload and leaves the rest pending (``error`` says why).
    """
    out = SyncOutcome()
    pending = wal.pending()
    try:
        out.reaped = len(tracker.reap_stale_runs())
        if not pending:
            return out
        runs = tracker.task_runs()  # one search for both tables
        by_record = tracker.runs_by_record(runs)
        finished = tracker.finished_keys(runs)
    except TrackingUnavailable:
        raise
    except Exception as e:  # noqa: BLE001

        raise unavailable(tracker.uri, e) from None
    parents: dict[str, str] = {}
    try:
        for rec in pending:
            run = by_record.get(rec["id"])
            if run is not None and run.info.status in ("FINISHED", "FAILED"):
                wal.mark_synced(rec["id"], run_id=run.info.run_id, uri=tracker.uri, how="present")
                out.present += 1
                continue
            if rec.get("status") == "finished" and rec.get("key") in finished:
                wal.mark_synced(rec["id"], run_id=finished[rec["key"]], uri=tracker.uri, how="duplicate")
                out.duplicates += 1
                continue
            sid = rec.get("sweep_id") or ""
            if sid not in parents:
                parents[sid] = _ensure_parent(tracker, rec.get("sweep") or "sweep", sid, spec_text)
            run_id = tracker.log_record(rec, parent_id=parents[sid])
            wal.mark_synced(rec["id"], run_id=run_id, uri=tracker.uri)
            if rec.get("status") == "finished":
                finished[rec["key"]] = run_id
            out.uploaded += 1
        for sid in {r.get("sweep_id") or "" for r in pending} - set(parents):
            found = tracker.find_parent(sid) if sid else None
            if found is not None:
                parents[sid] = found.info.run_id
        if close_parents:
            _close_parents(tracker, wal, parents, report_dir)
    except Exception as e:  # noqa: BLE001 - the store failed mid-way: the rest stays pending
        out.error = str(e)
    out.pending = len(wal.pending())
    return out


def _ensure_parent(tracker: Tracker, sweep: str, sweep_id: str, spec_text: str | None) -> str:
    found = tracker.find_parent(sweep_id) if sweep_id else None
    if found is not None:
        return found.info.run_id
    saved = tracker.parent_id
    run_id, _ = tracker.start_parent(sweep, sweep_id or "unknown", spec_text=spec_text,
                                     params={"created_by": "audit sync"})
    tracker.parent_id = saved
    return run_id


def _close_parents(tracker: Tracker, wal: WriteAheadLog, parents: dict[str, str], report_dir: Path | None) -> None:
    """Close the parents left RUNNING by a dead driver (or just created by this sync)."""
    latest: dict[str, dict[str, str]] = {}
    for r in wal.records():
        latest.setdefault(r.get("sweep_id") or "", {})[r.get("key") or r["id"]] = r.get("status")
    for sid, run_id in parents.items():
        run = tracker.client.get_run(run_id)
        if run.info.status != "RUNNING" or run_id == tracker.parent_id:
            continue
        drv = run.data.tags.get("audit.driver")
        if drv != tracker.driver and driver_alive(drv):
            continue  # a live sweep owns it
        if report_dir is not None and Path(report_dir).is_dir():
            tracker.client.log_artifacts(run_id, str(report_dir), "reports")
        failed = any(s != "finished" for s in latest.get(sid, {}).values())
        tracker.client.set_terminated(run_id, "FAILED" if failed else "FINISHED")


def sync_spec(spec, *, quiet: bool = False) -> SyncOutcome:
    """``audit sync``: upload the pending records of ``spec``'s output directory to its
    tracking store. Raises :class:`TrackingUnavailable` when the store cannot be reached."""
    wal = WriteAheadLog(wal_path(spec.output_dir.resolve()))
    spec_text = Path(spec.source).read_text(encoding="utf-8") if spec.source and Path(spec.source).is_file() else None
    with mlflow_http_defaults():
        n = len(wal.pending())
        tracker = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
        out = sync_records(wal, tracker, spec_text=spec_text, report_dir=spec.output_dir.resolve() / "reports")
    if not quiet:
        msg = (f"sync {spec.name}: {n} pending record(s) in {wal.path}: {out.uploaded} uploaded, "
               f"{out.present} already present, {out.duplicates} duplicate(s) of finished runs; "
               f"{out.reaped} half-written run(s) marked KILLED; {out.pending} still pending")
        print(msg + (f" ({out.error})" if out.error else ""), flush=True)
    return out


def sync_hint(source: str | None, output_dir: Path, uri: str) -> str:
    """The ``audit sync`` command that uploads a sweep's pending results to the store they were
    meant for, to run verbatim: the spec, its output directory and tracking URI as this run used
    them (an ``--output-dir`` or ``--tracking-uri`` given to ``audit run`` is not in the spec).
    Credentials in the URI are printed redacted (``***``): put them back, or set
    ``MLFLOW_TRACKING_URI``."""
    import shlex

    return (f"audit sync {shlex.quote(str(source or 'SPEC'))} --output-dir {shlex.quote(str(output_dir))} "
            f"--tracking-uri {shlex.quote(redact_uri(uri))}")


def sync_target(wal: WriteAheadLog, uri: str, *, explicit: bool) -> str:
    """The tracking URI ``audit sync`` uploads to: ``uri`` when given on the command line
    (``explicit``) or when it is the store the pending records were meant for (recorded in the
    log); else the one store they were meant for, when its URI holds no credentials. Raises
    :class:`audit.errors.ParameterError` naming the store when the records were meant for another
    store than ``uri`` and it cannot be used as recorded."""
    targets = wal.pending_targets()
    if explicit or not targets or store_identity(uri) in {store_identity(t) for t in targets}:
        return uri
    if len(targets) == 1:
        (t,) = targets
        if "***@" not in t:
            return t
    names = ", ".join(sorted(targets))
    raise ParameterError(f"{wal.path}: {len(wal.pending())} pending result(s) were meant for {names}, not "
                         f"{redact_uri(uri)}: give --tracking-uri (with its credentials)")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="audit sync", description="Upload the results a sweep could not log to MLflow.")
    p.add_argument("spec", help="the sweep spec (its output_dir holds wal.jsonl)")
    p.add_argument("--output-dir", default=None, help="override the spec's output_dir")
    p.add_argument("--tracking-uri", default=None, help="override the spec's tracking.uri")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 nothing left pending; 3 records still pending (store unreachable);
    2 invalid spec or option."""
    a = build_parser().parse_args(argv)
    try:
        spec = load_spec(a.spec, output_dir=a.output_dir, tracking_uri=a.tracking_uri)
        if (problem := output_dir_problem(spec.output_dir)) is not None:  # bad input, not an unreachable store
            raise ParameterError(f"{spec.source}: output_dir: {problem}")
        lock = _sweep_lock(spec.output_dir.resolve())
        if lock is None:
            print(f"audit: busy: a sweep driver of {spec.output_dir} is running (lock "
                  f"{spec.output_dir / 'sweep.lock'}); it uploads its results itself: nothing synced (exit status 5)",
                  file=sys.stderr)
            return 5
        try:
            return _sync_main(a, spec)
        finally:
            if lock is not True:
                lock.release()
    except TrackingUnavailable as e:
        print(f"audit: error: {one_line(e)}; nothing uploaded, the records stay pending", file=sys.stderr)
        return 3
    except AuditError as e:
        print(f"audit: error: {one_line(e)}", file=sys.stderr)
        return 2


def _sweep_lock(out_dir: Path):
    """The sweep's file lock on ``<output_dir>/sweep.lock`` (:func:`jobs.sweep._claim_sweep`), acquired
    (``True`` when there is no output directory), or ``None`` when a driver holds it: a sync must not
    upload the records a live driver is writing (they would get two runs)."""
    from filelock import FileLock, Timeout

    if not out_dir.is_dir():
        return True  # no output directory: no driver, nothing to lock
    lock = FileLock(str(out_dir / "sweep.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock


def _sync_main(a, spec) -> int:
    """Upload the pending results to the store they were meant for; 3 while some stay pending.
    Its errors reach :func:`main`'s one-line handlers (status 3: store unreachable; 2: bad input)."""
    target = sync_target(WriteAheadLog(wal_path(spec.output_dir.resolve())), spec.resolved_tracking_uri,
                         explicit=bool(a.tracking_uri))
    if target != spec.resolved_tracking_uri:
        print(f"sync: the pending results were meant for {redact_uri(target)}: uploading there", flush=True)
        spec = load_spec(a.spec, output_dir=a.output_dir, tracking_uri=target)
    out = sync_spec(spec)
    return 3 if out.pending else 0


__all__ = ["WriteAheadLog", "Recorder", "SyncOutcome", "sync_records", "sync_spec", "wal_path",
           "mlflow_http_defaults", "main", "sync_hint", "sync_target"]
