"""MLflow tracking of a sweep: the only module that writes to the tracking store.

Layout of an experiment (one per spec by default, ``biasaudit-<name>``):

- one *parent* run per sweep (tag ``audit.role=sweep``, ``audit.sweep_id`` = the spec's
  :meth:`jobs.spec.SweepSpec.sweep_id`, and the spec's ``tags:``); re-running the same spec
  resumes it (the same parent gets the new child runs and the regenerated reports, among them
  ``reports/results.parquet`` with the raw and the Holm/BH-adjusted p-values of every task;
  adjusted p-values depend on the sweep's families, so the child runs get them when the report
  is built, with tags naming the family: :meth:`Tracker.log_adjusted`);
- one *child* run per task (tag ``audit.role=task``, ``mlflow.parentRunId``) with
  params   ``model``, ``model_name``, ``revision``, ``backend``, ``kind``, ``embedding``, ``test``,
           ``language``, ``metric``, ``dataset_digest``, ``seed``, ``param.<name>`` for each
           metric parameter (JSON-encoded) and the result's string fields of
           :data:`RESULT_STRING_FIELDS` (``ci_method``, ``p_method``, ``p_convention``,
           ``p_note``, ``p_value_counts``, ``groups``, ``groups_source``) where it has them;
           and the result's settings and bookkeeping numbers (:data:`SETTING_FIELDS`: seeds,
           classifier seeds, bootstrap size, confidence) as ``result.<name>`` (JSON);
  metrics  ``value`` (the headline number), ``effect_size``, ``p_value``, ``statistic``,
           ``ci_low``/``ci_high``, ``coverage.<set>`` and ``coverage_min``, every other numeric
           field of the result, ``n_items``, ``measure_seconds``/``analyse_seconds``; once the
           sweep's report is built (its families complete), ``p_holm``, ``p_bh`` and
           ``n_family`` with tags ``audit.p_adjust.family``/``.methods``/``.n_family``
           (:meth:`Tracker.log_adjusted`);
  tags     ``audit.key`` (:func:`audit.provenance.task_key`), ``audit.plan_key`` (the key the
           planner computed before loading; equal to ``audit.key`` unless the model's revision
           changed between planning and loading), ``audit.model``, ``audit.test``,
           ``audit.metric``, ``audit.language``, ``audit.status`` (``finished``/``failed``),
           ``audit.error`` (the failure reason) and ``version.<package>``;
  artifacts the per-item table (``items.json`` via :meth:`MlflowClient.log_table`), the full
           result (``result.json``) or, for a failed task, ``error.txt`` with the traceback.

Nothing is overwritten: a task whose key already has a FINISHED run is skipped
(:meth:`Tracker.finished_keys`); a failed task is re-run into a new child run, the failed one
stays (its status is FAILED).

Writes go through a *record* (:func:`task_record`): a JSON-ready dict holding everything a child
run consists of (tags, params, metrics, the per-item table as the exact ``items.json`` text, the
result or the error text). The driver appends each record to the write-ahead log
(:mod:`jobs.wal`) before :meth:`Tracker.log_record` writes it, so a record survives a dead
driver or an unreachable tracking server and can be uploaded later (``audit sync``). A child run
is created RUNNING, filled, and set FINISHED/FAILED last: a run that is not RUNNING is complete.
Runs carry ``audit.record`` (the record's id, which makes uploads idempotent) and
``audit.driver`` (``host:pid:start``): a RUNNING run whose driver process is gone was
half-written by a dead driver and is marked KILLED by :meth:`Tracker.reap_stale_runs`.

The default store is SQLite (``sqlite:///<output_dir>/mlflow.db``; MLflow 3 refuses the
plain file store), with artifacts under ``<output_dir>/mlartifacts``; ``mlflow ui
--backend-store-uri sqlite:///<output_dir>/mlflow.db`` opens it. Any other tracking URI
(``http://host:5000`` for an ``mlflow server``) works the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pandas as pd
from filelock import FileLock

from audit import registry
from audit.errors import AuditError, ParameterError
from audit.outputs import cache_dir, write_atomic
from audit.result import json_cells
from audit.signals import deferred
from jobs.uris import redact_uri

log = logging.getLogger("jobs.tracker")

ROLE_SWEEP = "sweep"
#: Parent-run tags of the contract with the watcher (:mod:`jobs.watch`): ``audit.state`` is
#: ``running``, ``finished``, ``failed`` or ``stuck``; a sweep whose work waited too long for
#: resources sets ``stuck`` with ``audit.stuck_reason`` (the pending demand) and exits with
#: :data:`STUCK_EXIT_CODE`.
STATE_TAG = "audit.state"
STUCK_REASON_TAG = "audit.stuck_reason"
STUCK = "stuck"
STUCK_EXIT_CODE = 4
ROLE_TASK = "task"
_MAX_TAG = 5000
_MAX_PARAM = 6000

#: Fields of a result that become MLflow metrics under a fixed name.
HEADLINE_FIELDS = ("effect_size", "p_value", "statistic")
#: String fields of a result logged as params of its child run (where the result has them):
#: which interval (``ci_method``: ``targets``/``targets_attributes``), how the p-value was
#: obtained and what it counts, which side held the protected groups and who said so.
RESULT_STRING_FIELDS = ("ci_method", "p_method", "p_convention", "p_note", "p_value_counts", "groups",
                        "groups_source", "protocol", "start_token", "harness_task")

#: Numeric result fields that are settings or bookkeeping (seeds, random streams, bootstrap size,
#: confidence level, rounding, iteration counts), not numbers a user compares: a child run
#: records them as params ``result.<name>`` (JSON), never as metrics. Matched on each part of
#: a dotted name (``permutation.seed``); a nested one is dropped when the top level has it
#: (CrowS-Pairs repeats ``confidence`` per bias type).
SETTING_FIELDS = frozenset({
    "seed", "seed_used", "seeds", "classifier_seeds", "iteration_seeds", "random_streams", "n_bootstrap",
    "confidence", "permutations", "decimals", "train_fraction", "n_cases", "n_iterations", "holdout", "ddof", "k",
    "hurtlex",
})
#: Tags naming the multiple-comparison family of a child run's adjusted p-values
#: (:meth:`Tracker.log_adjusted`; tags, not params: a resumed sweep may grow the family).
P_ADJUST_FAMILY_TAG = "audit.p_adjust.family"
P_ADJUST_METHODS_TAG = "audit.p_adjust.methods"
P_ADJUST_SIZE_TAG = "audit.p_adjust.n_family"
P_ADJUST_PARENT_TAG = "audit.p_adjust.parent"  # the sweep (parent run) whose families they are

#: The tag MLflow's ``log_table`` sets to list a run's tables (the UI's evaluation view).
_LOGGED_ARTIFACTS_TAG = "mlflow.loggedArtifacts"


class TrackingUnavailable(AuditError):
    """The tracking store cannot be reached or written (server down, network, locked store).
    The message names the (redacted) tracking URI."""


#: Seconds a driver waits for another process that is creating or migrating the same SQLite
#: store (a few seconds normally) before treating the store as unavailable.
STORE_LOCK_TIMEOUT = 300.0


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI (``None`` for any other URI)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


class _WholeWrites:
    """An :class:`mlflow.MlflowClient` whose every call runs whole with respect to SIGINT and
    SIGTERM (:func:`audit.signals.deferred`): see :func:`tracking_client`."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def whole(*args, **kwargs):
            with deferred():
                return attr(*args, **kwargs)

        return whole


def tracking_client(uri: str):
    """The :class:`mlflow.MlflowClient` of ``uri`` that every writer of a tracking store uses.

    For a database store (SQLite, PostgreSQL, MySQL, MSSQL: MLflow's own ``DATABASE_ENGINES``,
    a SQLAlchemy store in this process) each call runs whole: a SIGINT or SIGTERM that arrives
    meanwhile is raised when the call returns (:func:`audit.signals.deferred`). Raised inside a
    commit, it left the connection's write transaction open, and the next write of the same
    process waited 20 s for SQLite's lock and failed ("database is locked"): the sweep's cleanup
    after a signal (parent run KILLED, lease released) took about 50 s and did neither. An HTTP
    store holds no lock in this process: its client is MLflow's own, and a signal stops a call
    that waits for the server at once."""
    import urllib.parse

    from mlflow import MlflowClient
    from mlflow.store.db.db_types import DATABASE_ENGINES

    client = MlflowClient(tracking_uri=uri)
    if urllib.parse.urlparse(uri).scheme.split("+", 1)[0] in DATABASE_ENGINES:
        return _WholeWrites(client)
    return client


@contextlib.contextmanager
def store_lock(uri: str, timeout: float = STORE_LOCK_TIMEOUT) -> Iterator[None]:
    """Hold an inter-process file lock (``<db>.lock``, :mod:`filelock`) next to a SQLite store
    while it is opened, so that exactly one process creates and migrates a new store.

    MLflow creates a missing SQLite store, and migrates an old one, in the first
    ``MlflowClient`` call of a process, without a lock: several drivers starting together on a
    new store ran the same Alembic migrations at once and died (``table _alembic_tmp_experiments
    already exists``, ``Online migration expected to match one row``), leaving a half-migrated
    store. Under this lock the first process creates the store and the others wait, then find
    it complete. Other URIs (an MLflow server, a database server) need no lock: a no-op. A
    lock not obtained within ``timeout`` seconds raises :class:`filelock.Timeout`.
    """
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(db) + ".lock", timeout=timeout):
        yield


def sqlite_schema_template() -> Path | None:
    """An empty SQLite MLflow store already migrated to this MLflow version's schema (tables and
    Alembic revision, no experiment), kept in the user cache (:func:`audit.outputs.cache_dir`:
    ``mlflow/sqlite-schema-<mlflow version>.db``) and built there once, under a file lock, into a
    temporary file renamed into place; ``None`` where it cannot be built (a read-only cache, an
    MLflow whose internals moved): the caller then lets MLflow migrate as usual."""
    import mlflow
    import sqlalchemy
    from mlflow.store.db import utils as db_utils

    template = cache_dir() / "mlflow" / f"sqlite-schema-{mlflow.__version__}.db"
    if template.is_file():
        return template

    def migrate(tmp: Path) -> None:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            db_utils._initialize_tables(engine)  # MLflow's own creation and migrations
        finally:
            engine.dispose()

    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(template) + ".lock", timeout=STORE_LOCK_TIMEOUT):
            if not template.is_file():
                write_atomic(template, migrate)
    except Exception as e:  # noqa: BLE001 - best effort: MLflow creates the store itself
        log.debug("no SQLite schema template (%s: %s)", type(e).__name__, e)
        return None
    return template


def seed_sqlite_store(uri: str) -> bool:
    """Create a missing SQLite store as a copy of :func:`sqlite_schema_template`
    (:func:`audit.outputs.write_atomic`: a reader never sees half a file), so that MLflow finds
    every table at the current revision and skips its schema migrations (every sweep into a new
    output folder: 0.8 instead of 1.7 CPU-seconds to open the store on this machine). MLflow
    then checks the revision and creates the Default experiment as for a store it migrated
    itself. Called under :func:`store_lock`; returns whether it seeded (``False``: not SQLite,
    the file exists, or no template, and MLflow creates the store).

    The copy is switched to SQLite's write-ahead journal (``PRAGMA journal_mode=WAL``, kept in
    the file; :func:`_wal_journal`) before it is renamed into place: a commit then appends to
    ``mlflow.db-wal`` and syncs that one file, instead of writing a rollback journal, the
    database and deleting the journal, each synced (``synchronous`` stays SQLite's ``FULL``: a
    committed run survives a crash as before). A task's child run (create, one batch, artifacts,
    terminate; ``benchmarks/tracker.py``) took 23.5 instead of 29.4 ms (1.25x) and 22.1 instead of
    25.7 CPU-ms on a quiet 2-core machine, 58-65 instead of 95-120 ms on the same machine loaded.
    SQLite's WAL needs the store's folder on a local file system (shared memory beside the file),
    as SQLite's locking already does: teams share an MLflow server instead (``infra/mlflow/``)."""
    db = sqlite_path(uri)
    if db is None or db.exists():
        return False
    template = sqlite_schema_template()
    if template is None:
        return False

    def copy(tmp: Path) -> None:
        shutil.copyfile(template, tmp)
        _wal_journal(tmp)

    try:
        write_atomic(db, copy)
    except OSError as e:
        log.debug("SQLite store %s not seeded (%s)", db, e)
        return False
    return True


def _wal_journal(db: Path) -> None:
    """Switch the SQLite file ``db`` to the write-ahead journal (persistent: SQLite records it in
    the file's header, every later connection uses it); raises :class:`OSError` where SQLite
    refuses (then the store is not seeded and MLflow creates it as usual)."""
    import sqlite3

    con = sqlite3.connect(db)
    try:
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    except sqlite3.Error as e:
        raise OSError(f"{db}: {e}") from e
    finally:
        con.close()
    if str(mode).lower() != "wal":
        raise OSError(f"{db}: SQLite kept journal mode {mode!r}")


def _proc_start(pid: int) -> str:
    """The start time of a process in clock ticks since boot (``/proc/<pid>/stat`` field 22),
    which tells a live process from a later one that reused its pid; ``""`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def driver_id() -> str:
    """``host:pid:start`` of this process: the ``audit.driver`` tag of the runs it writes."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start(pid)}"


def driver_alive(driver: str | None) -> bool | None:
    """Whether the process named by an ``audit.driver`` tag still runs: ``True``/``False`` on
    this host, ``None`` for another host (cannot tell) or a missing tag."""
    if not driver:
        return False
    try:
        host, pid_s, start = driver.rsplit(":", 2)
        pid = int(pid_s)
    except ValueError:
        return False
    if host != socket.gethostname():
        return None
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not start or _proc_start(pid) == start


def _sanitize(name: str) -> str:
    """An MLflow metric/param name: word characters, ``. - / : space`` (others -> ``_``)."""
    return re.sub(r"[^\w.\-/: ]", "_", str(name)).strip() or "_"


def _finite(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    try:
        import numpy as np

        if isinstance(v, (np.integer, np.floating)):
            f = float(v)
            return f if math.isfinite(f) else None
    except ImportError:  # pragma: no cover
        pass
    return None


def embedding_method(kind: str, metric: str, params: dict[str, Any]) -> str:
    """How the model's numbers are obtained (the ``embedding`` param of a child run): the
    metric's measure step says (:attr:`audit.entries.Family.method`)."""
    return registry.get(metric).family.method(kind, params)


#: At most this many metrics per child run (nested per-category tables are flattened into them).
MAX_RUN_METRICS = 1000


def _flatten_fields(prefix: str, x: Any, out: dict[str, float]) -> None:
    """Finite numbers of a (nested) field as dotted metric names: ``per_category.Age.s_amb``; a
    two-number interval (a key named ``ci``, or any key under ``cis``) as ``<name>_low`` /
    ``<name>_high``; a short list of numbers element-wise (``<name>.0``, ...). Settings
    (:data:`SETTING_FIELDS`) are left out (:func:`result_settings` has them)."""
    if len(out) >= MAX_RUN_METRICS:
        return
    if isinstance(x, dict):
        for k, v in x.items():
            if str(k) not in SETTING_FIELDS:
                _flatten_fields(f"{prefix}.{k}" if prefix else str(k), v, out)
        return
    if isinstance(x, (list, tuple)):
        parts = prefix.split(".")
        if len(x) == 2 and (parts[-1] == "ci" or (len(parts) > 1 and parts[-2] in ("ci", "cis"))):
            for end, v in zip(("low", "high"), x):
                f = _finite(v)
                if f is not None:
                    out[_sanitize(f"{prefix}_{end}")] = f
        elif len(x) <= 20:
            for i, v in enumerate(x):
                f = _finite(v)
                if f is not None:
                    out[_sanitize(f"{prefix}.{i}")] = f
        return
    f = _finite(x)
    if f is not None:
        out[_sanitize(prefix)] = f


def result_metrics(res) -> dict[str, float]:
    """The MLflow metrics of a :class:`audit.result.Result`: the headline ``value``, every finite
    number of its fields (nested tables flattened by :func:`_flatten_fields`: per bias type, per
    category, per group; the headline interval as ``ci_low``/``ci_high``), coverage per set and
    its minimum, and the number of items."""
    out: dict[str, float] = {}
    v = _finite(res.value)
    if v is not None:
        out["value"] = v
    _flatten_fields("", res.fields or {}, out)
    covs = []
    for k, c in (res.coverage or {}).items():
        f = _finite(c)
        if f is not None:
            out[_sanitize(f"coverage.{k}")] = f
            covs.append(f)
    if covs:
        out["coverage_min"] = min(covs)
    if res.items is not None:
        out["n_items"] = float(len(res.items))
    return out


def result_settings(res) -> dict[str, str]:
    """The settings and bookkeeping numbers of a result (:data:`SETTING_FIELDS`: the seed it
    used, classifier seeds, bootstrap size, confidence level ...) as child-run params
    ``result.<dotted name>`` = JSON; nested ones only where the top level lacks the name."""
    out: dict[str, str] = {}
    top = res.fields or {}

    def walk(prefix: str, x: Any, depth: int) -> None:
        if not isinstance(x, dict):
            return
        for k, v in x.items():
            name = f"{prefix}.{k}" if prefix else str(k)
            if str(k) in SETTING_FIELDS:
                if depth == 0 or str(k) not in top:
                    if v is not None:
                        out[_sanitize(f"result.{name}")] = json.dumps(v, sort_keys=True, default=_json_default)
            elif depth < 2:
                walk(name, v, depth + 1)

    walk("", top, 0)
    return out


def _table_for_mlflow(items: pd.DataFrame) -> pd.DataFrame:
    """A JSON-safe copy of a per-item table (lists/tuples/dicts as JSON text, NaN kept:
    :func:`audit.result.json_cells`, the rule of ``audit score --items x.csv`` too)."""
    return json_cells(items)


class Tracker:
    """Writes a sweep to MLflow (driver side, one writer).

    uri:        tracking URI (``sqlite:///...``, ``http://...``).
    experiment: experiment name; created (with ``artifact_location``) if missing.
    artifact_location: where a new experiment stores artifacts (default: next to a SQLite DB,
                ``<db folder>/mlartifacts``).
    """

    def __init__(self, uri: str, experiment: str, *, artifact_location: str | Path | None = None):
        if uri.startswith("file:") or (not re.match(r"^[a-z][a-z0-9+]*:", uri)):
            raise ParameterError(
                f"tracking URI {uri!r}: MLflow 3 does not support the file store; use "
                "sqlite:///path/to/mlflow.db or an http(s):// MLflow server"
            )
        self.uri = uri
        self.experiment_name = experiment
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            if artifact_location is None:
                artifact_location = db.parent / "mlartifacts"
        self.driver = driver_id()
        try:
            with store_lock(uri):  # create and migrate a new SQLite store once, whoever comes first
                seed_sqlite_store(uri)  # a new one starts as the migrated schema's copy
                self.client = tracking_client(uri)
                exp = self.client.get_experiment_by_name(experiment)
                if exp is None:
                    loc = Path(artifact_location).resolve().as_uri() if isinstance(artifact_location, Path) else artifact_location
                    try:
                        self.experiment_id = self.client.create_experiment(experiment, artifact_location=loc)
                    except Exception as e:  # noqa: BLE001 - another writer created it just now
                        if getattr(e, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                            raise
                        exp = self.client.get_experiment_by_name(experiment)
                        if exp is None:
                            raise
                if exp is not None:
                    if exp.lifecycle_stage == "deleted":
                        raise ParameterError(f"MLflow experiment {experiment!r} is deleted; restore it or choose another name")
                    self.experiment_id = exp.experiment_id
        except AuditError:
            raise
        except Exception as e:  # noqa: BLE001 - server down, refused, timeout, locked or half-created store ...
            raise unavailable(uri, e) from None
        self.parent_id: str | None = None
        #: ``audit.driver`` ids known dead on any host (the holder of a stale sweep lease this
        #: driver took over, :mod:`jobs.lease`): :meth:`reap_stale_runs` marks their runs KILLED
        self.dead_drivers: set[str] = set()

    # ------------------------------------------------------------------ queries
    def _search(self, filter_string: str) -> list:
        return search_all(self.client, [self.experiment_id], filter_string)

    def task_runs(self) -> list:
        """Every child (task) run of the experiment."""
        return self._search(f"tags.`audit.role` = '{ROLE_TASK}'")

    def sweep_runs(self) -> list:
        """Every parent (sweep) run of the experiment."""
        return self._search(f"tags.`audit.role` = '{ROLE_SWEEP}'")

    def finished_keys(self, runs: Iterable[Any] | None = None) -> dict[str, str]:
        """``audit.key`` (and ``audit.plan_key``) -> run id of every FINISHED child run (the first
        in the search's order where two runs have a key).

        runs: the experiment's task runs (:meth:`task_runs`) when the caller has searched them
              already; default: the FINISHED ones searched here."""
        if runs is None:
            runs = self._search(f"tags.`audit.role` = '{ROLE_TASK}' and attributes.status = 'FINISHED'")
        else:
            runs = [r for r in runs if r.info.status == "FINISHED"]
        out: dict[str, str] = {}
        for r in runs:
            for tag in ("audit.key", "audit.plan_key"):
                k = r.data.tags.get(tag)
                if k:
                    out.setdefault(k, r.info.run_id)
        return out

    # ------------------------------------------------------------------ parent
    def start_parent(self, sweep_name: str, sweep_id: str, *, spec_text: str | None = None,
                     params: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> tuple[str, bool]:
        """Create the sweep's parent run, or reopen the one of an earlier run of the same spec.
        ``tags``: extra tags of the parent run (the spec's ``tags:``; the watcher's
        ``audit.watch.*``), set on creation and again on resumption. Returns ``(run_id, resumed)``."""
        extra = {str(k): str(v)[:_MAX_TAG] for k, v in (tags or {}).items()}
        found = self._search(f"tags.`audit.role` = '{ROLE_SWEEP}' and tags.`audit.sweep_id` = '{sweep_id}'")
        if found:
            found.sort(key=lambda r: r.info.start_time or 0)
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            for k, v in extra.items():
                self.client.set_tag(run_id, k, v)
            n = int(found[0].data.tags.get("audit.invocations", "1")) + 1
            self.client.set_tag(run_id, "audit.invocations", str(n))
            self.client.set_tag(run_id, "audit.driver", self.driver)
            self.client.set_tag(run_id, STATE_TAG, "running")
            if STUCK_REASON_TAG in found[0].data.tags:
                self.client.delete_tag(run_id, STUCK_REASON_TAG)
            self.parent_id = run_id
            return run_id, True
        run = self.client.create_run(
            self.experiment_id, run_name=f"sweep:{sweep_name}",
            tags={**extra, "audit.role": ROLE_SWEEP, "audit.sweep_id": sweep_id, "audit.sweep": sweep_name,
                  "audit.invocations": "1", "audit.driver": self.driver, STATE_TAG: "running"},
        )
        self.parent_id = run.info.run_id
        if params:
            from mlflow.entities import Param

            self.client.log_batch(self.parent_id, params=[Param(_sanitize(k), str(v)[:_MAX_PARAM]) for k, v in params.items()])
        if spec_text is not None:
            self.client.log_text(self.parent_id, spec_text, "spec.yaml")
        return self.parent_id, False

    def end_parent(self, *, failed: int, summary: dict[str, float] | None = None,
                   report_dir: Path | None = None, step: int = 0, stuck_reason: str | None = None) -> None:
        """Close the parent run: ``summary`` metrics (at ``step``: the invocation number), the
        reports under ``reports/``, tag ``audit.state`` (``finished``, ``failed``, or ``stuck``
        with ``audit.stuck_reason``: work waited longer than ``ray.pending_timeout_s`` for
        resources, or the cluster cannot run the spec), status FINISHED or FAILED."""
        from mlflow.entities import Metric, RunTag

        if self.parent_id is None:
            return
        ts = int(time.time() * 1000)
        if summary:
            self.client.log_batch(self.parent_id, metrics=[Metric(_sanitize(k), float(v), ts, step) for k, v in summary.items()])
        if report_dir is not None and Path(report_dir).is_dir():
            self.client.log_artifacts(self.parent_id, str(report_dir), "reports")
        state = STUCK if stuck_reason else ("failed" if failed else "finished")
        tags = [RunTag(STATE_TAG, state)]
        if stuck_reason:
            tags.append(RunTag(STUCK_REASON_TAG, stuck_reason.splitlines()[0][:_MAX_TAG]))
        self.client.log_batch(self.parent_id, tags=tags)
        self.client.set_terminated(self.parent_id, "FAILED" if (failed or stuck_reason) else "FINISHED")

    def log_adjusted(self, df: pd.DataFrame, family: Iterable[str], *, runs: Iterable[Any] | None = None) -> int:
        """Give each finished child run of ``df`` (the sweep's results table after
        :func:`jobs.report.adjust_pvalues`, column ``run_id``) its adjusted p-values as metrics
        ``p_holm``, ``p_bh`` and ``n_family``, and tags naming the family
        (:data:`P_ADJUST_FAMILY_TAG`: the columns it shares, e.g. ``model,metric``; ``all``
        for the whole sweep), the methods (``holm,bh``: Holm 1979; Benjamini & Hochberg 1995)
        and its size, and the sweep's parent run. Called when the sweep's report is built, i.e.
        when the family is complete; a resumed sweep logs the new values again (the metric history keeps the old
        ones); runs whose values and tags are already these are not written again. Returns the
        number of runs written.

        runs: the experiment's task runs as read for the report (:meth:`task_runs`, the search
              :meth:`rows_for` was given), so that the sweep's end searches them once; default:
              searched here. A run changed since that search is at worst written again."""
        from mlflow.entities import Metric, RunTag

        if df.empty or "run_id" not in df.columns:
            return 0
        fam = ",".join(family) or "all"
        ts = int(time.time() * 1000)
        n = 0
        ok = df[(df["status"] == "finished") & df["run_id"].notna() & df["p_holm"].notna()]
        if ok.empty:
            return 0
        current = {r.info.run_id: r for r in (self.task_runs() if runs is None else runs)}  # not one read per run
        for r in ok.itertuples(index=False):
            metrics = {k: float(getattr(r, k)) for k in ("p_holm", "p_bh", "n_family")
                       if _finite(getattr(r, k)) is not None}
            tags = {P_ADJUST_FAMILY_TAG: fam, P_ADJUST_METHODS_TAG: "holm,bh", P_ADJUST_SIZE_TAG: str(int(r.n_family)),
                    P_ADJUST_PARENT_TAG: self.parent_id or ""}
            run = current.get(str(r.run_id))
            if run is not None and all(run.data.metrics.get(k) == v for k, v in metrics.items()) and all(
                    run.data.tags.get(k) == v for k, v in tags.items()):
                continue  # a resumed sweep whose families did not change: nothing to write
            self.client.log_batch(str(r.run_id), metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()],
                                  tags=[RunTag(k, v) for k, v in tags.items()])
            n += 1
        return n

    def sweep_totals(self, plan_keys: Iterable[str], parent_id: str | None = None, *,
                     runs: Iterable[Any] | None = None) -> dict[str, float]:
        """The parent run's child runs over every invocation: ``child_runs``, by status
        (``child_runs_finished``/``_failed``/``_killed``), and ``child_runs_superseded``: child
        runs of tasks that are no longer in the plan (an earlier revision of a model whose branch
        moved, a test since removed from the spec); with the previous totals of the parent's
        cumulative metrics (``tasks_run_total``, ``models_loaded_total``, ``seconds_total``)
        under ``previous.<name>``.

        runs: the experiment's task runs as the caller searched them last (:meth:`task_runs`; the
              sweep's end, after its last child run was written), filtered here to the parent's;
              default: the parent's child runs searched here."""
        pid = parent_id or self.parent_id
        keys = {k for k in plan_keys if k}
        if runs is None:
            runs = self._search(f"tags.`audit.role` = '{ROLE_TASK}' and tags.`mlflow.parentRunId` = '{pid}'")
        else:
            runs = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == pid]
        out = {"child_runs": float(len(runs))}
        for st in ("FINISHED", "FAILED", "KILLED"):
            out[f"child_runs_{st.lower()}"] = float(sum(r.info.status == st for r in runs))
        # a run without a key (a repository that could not be resolved) belongs to no revision: never superseded
        out["child_runs_superseded"] = float(sum(
            bool(ks) and not (ks & keys)
            for ks in ({r.data.tags.get("audit.key"), r.data.tags.get("audit.plan_key")} - {None, ""} for r in runs)))
        prev = self.client.get_run(pid).data.metrics
        for k in ("tasks_run_total", "models_loaded_total", "seconds_total"):
            out[f"previous.{k}"] = float(prev.get(k, 0.0))
        return out

    # ------------------------------------------------------------------ children
    def log_task(self, task, *, sweep: str, model_spec, kind: str, plan_key: str | None,
                 outcome, sweep_id: str = "") -> str:
        """Write one child run for a task outcome (:class:`actors.stats.TaskOutcome`):
        :meth:`log_record` of :func:`task_record`."""
        rec = task_record(task, sweep=sweep, sweep_id=sweep_id, model_spec=model_spec, kind=kind,
                          plan_key=plan_key, outcome=outcome)
        return self.log_record(rec)

    def log_record(self, rec: dict[str, Any], *, parent_id: str | None = None) -> str:
        """Write one child run from a :func:`task_record` (under ``parent_id``, default this
        tracker's parent run) and return its run id.

        The run is created RUNNING with its tags (``audit.record`` = the record's id,
        ``audit.driver`` = this process), then gets its params and metrics in one batch, its
        artifacts (``items.json`` and ``result.json``, or ``error.txt``), and is set
        FINISHED/FAILED last. If a write fails half-way the run is marked KILLED (best effort:
        with the server down it stays RUNNING until :meth:`reap_stale_runs`) and the error is
        raised as :class:`TrackingUnavailable`.
        """
        from mlflow.entities import Metric, Param

        tags = dict(rec["tags"])
        tags["mlflow.parentRunId"] = parent_id or self.parent_id or ""
        tags["audit.record"] = rec["id"]
        tags["audit.driver"] = self.driver
        if rec.get("items_json") is not None:
            tags[_LOGGED_ARTIFACTS_TAG] = json.dumps([{"path": "items.json", "type": "table"}])
        run_id = None
        try:
            run = self.client.create_run(self.experiment_id, run_name=rec["run_name"],
                                         tags={k: str(v) for k, v in tags.items()})
            run_id = run.info.run_id
            ts = int(rec.get("time_ms") or time.time() * 1000)
            self.client.log_batch(
                run_id,
                metrics=[Metric(k, float(v), ts, 0) for k, v in rec["metrics"].items()],
                params=[Param(k, v) for k, v in rec["params"].items()],
            )
            texts = {}
            if rec.get("items_json") is not None:
                # the text MlflowClient.log_table writes (orient="split"), without its extra
                # round trips; the tag above lists it as a table like log_table does
                texts["items.json"] = rec["items_json"]
            if rec.get("result_json") is not None:
                texts["result.json"] = rec["result_json"]
            else:
                texts["error.txt"] = rec.get("error_text") or ""
            self._log_texts(run.info.artifact_uri, texts)
            self.client.set_terminated(run_id, "FINISHED" if rec["status"] == "finished" else "FAILED")
        except Exception as e:  # noqa: BLE001
            if run_id is not None:
                try:
                    self.client.set_terminated(run_id, "KILLED")
                except Exception:  # noqa: BLE001 - the store is gone; reap_stale_runs marks it later
                    pass
            raise unavailable(self.uri, e) from None
        return run_id

    def _log_texts(self, artifact_uri: str, texts: dict[str, str]) -> None:
        """Write ``{file name: text}`` as a run's artifacts in one upload, into the run's
        ``artifact_uri`` (what :meth:`mlflow.MlflowClient.log_text` does file by file, which
        reads the run back from the store to find that location each time)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
        from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

        uri = add_databricks_profile_info_to_artifact_uri(artifact_uri, self.uri)  # as MLflow's client does
        with tempfile.TemporaryDirectory(prefix="biasaudit-artifacts-") as d:
            for name, text in texts.items():
                Path(d, name).write_text(text, encoding="utf-8")
            get_artifact_repository(uri, tracking_uri=self.uri).log_artifacts(d)

    def reap_stale_runs(self) -> list[str]:
        """Mark KILLED every RUNNING child run whose driver process is gone (on this host):
        runs half-written by a driver that died. Their tasks have no FINISHED run, so the next
        sweep redoes them. Runs of a live driver (a concurrent sweep) and of drivers on other
        hosts are left alone, except those of :attr:`dead_drivers`. Returns the ids of the runs marked."""
        reaped = []
        for r in self._search(f"tags.`audit.role` = '{ROLE_TASK}' and attributes.status = 'RUNNING'"):
            drv = r.data.tags.get("audit.driver")
            alive = False if drv in self.dead_drivers else driver_alive(drv)
            if alive is None and drv:
                log.warning("run %s is RUNNING under driver %s on another host; left as is", r.info.run_id, drv)
                continue
            if alive:
                continue
            self.client.set_tag(r.info.run_id, "audit.status", "killed")
            self.client.set_tag(r.info.run_id, "mlflow.note.content",
                                f"Killed: its driver ({drv or 'unknown'}) died before the run was complete")
            self.client.set_terminated(r.info.run_id, "KILLED")
            reaped.append(r.info.run_id)
        return reaped

    def runs_by_record(self, runs: Iterable[Any] | None = None) -> dict[str, Any]:
        """``audit.record`` -> run, for every child run that has the tag (of ``runs``, the
        experiment's task runs when the caller has searched them; default: searched here)."""
        return {r.data.tags["audit.record"]: r for r in (self.task_runs() if runs is None else runs)
                if r.data.tags.get("audit.record")}

    def find_parent(self, sweep_id: str):
        """The oldest parent run of ``sweep_id`` (``None`` if none)."""
        found = self._search(f"tags.`audit.role` = '{ROLE_SWEEP}' and tags.`audit.sweep_id` = '{sweep_id}'")
        if not found:
            return None
        found.sort(key=lambda r: r.info.start_time or 0)
        return found[0]

    # ------------------------------------------------------------------ reading back
    def rows_for(self, keys: Iterable[str], *, runs: Iterable[Any] | None = None) -> dict[str, dict[str, Any]]:
        """For each key, the row of its latest FINISHED run (else its latest failed run).

        runs: the experiment's task runs (:meth:`task_runs`) when the caller has searched them
              already (the sweep's end passes the same list to :meth:`log_adjusted` and
              :meth:`sweep_totals`); default: searched here. The search costs about 2.3 ms of CPU
              per run in a SQLite store."""
        wanted = set(k for k in keys if k)
        best: dict[str, Any] = {}
        for r in (self.task_runs() if runs is None else runs):
            k = None
            for tag in ("audit.plan_key", "audit.key"):
                if r.data.tags.get(tag) in wanted:
                    k = r.data.tags[tag]
                    break
            if k is None:
                continue
            cur = best.get(k)
            rank = (r.info.status == "FINISHED", r.info.start_time or 0)
            if cur is None or rank > (cur.info.status == "FINISHED", cur.info.start_time or 0):
                best[k] = r
        return {k: run_row(r) for k, r in best.items()}


def _row(t: dict, p: dict, m: dict, run_id: str | None) -> dict[str, Any]:
    return {
        "model": t.get("audit.model"),
        "language": t.get("audit.language"),
        "test": t.get("audit.test"),
        "metric": t.get("audit.metric"),
        "status": t.get("audit.status"),
        "value": m.get("value"),
        "effect_size": m.get("effect_size"),
        "p_value": m.get("p_value"),
        "p_min": m.get("p_min"),
        "p_method": p.get("p_method"),
        "p_convention": p.get("p_convention"),
        "ci_low": m.get("ci_low"),
        "ci_high": m.get("ci_high"),
        "coverage_min": m.get("coverage_min"),
        "n_items": m.get("n_items"),
        "error": t.get("audit.error"),
        "key": t.get("audit.key"),
        "run_id": run_id,
        "model_ref": p.get("model"),
        "revision": p.get("revision"),
        "backend": p.get("backend"),
        "embedding": p.get("embedding"),
        "metric_name": p.get("metric"),
        "dataset_digest": p.get("dataset_digest"),
        "seed": int(p["seed"]) if p.get("seed") not in (None, "None", "") else None,
        "ci_method": p.get("ci_method"),
        "groups": p.get("groups"),
        "params": json.dumps({k[6:]: json.loads(v) for k, v in p.items() if k.startswith("param.")}, sort_keys=True),
        # the nested numbers (per category, group, bias type) the reports break a headline down by
        "breakdowns": json.dumps({k: v for k, v in m.items() if k.startswith("per_")}, sort_keys=True),
    }


def run_row(r) -> dict[str, Any]:
    """A flat record of a child run: identity, status, headline numbers, coverage."""
    return _row(r.data.tags, r.data.params, r.data.metrics, r.info.run_id)


def record_row(rec: dict[str, Any], run_id: str | None = None) -> dict[str, Any]:
    """The :func:`run_row` of a :func:`task_record` (a result not, or not yet, in MLflow)."""
    return _row(rec["tags"], rec["params"], rec["metrics"], run_id)


def _json_default(x: Any) -> Any:
    try:
        import numpy as np

        if isinstance(x, np.integer):
            return int(x)
        if isinstance(x, np.floating):
            return float(x)
        if isinstance(x, np.ndarray):
            return x.tolist()
    except ImportError:  # pragma: no cover
        pass
    return str(x)


#: How a Hugging Face model's weights were loaded (:meth:`audit.runner.LoadedModel.describe`), recorded
#: on each child run as ``audit.<name>`` tags: a sweep whose model workers hold GPUs and one whose
#: workers do not give the same keys (the device never enters a key) and numbers equal to float32
#: rounding, and these tags tell them apart.
LOAD_TAGS = ("device", "dtype", "device_map")


def task_record(task, *, sweep: str, model_spec, kind: str, plan_key: str | None, outcome,
                sweep_id: str = "", revision: str | None = None) -> dict[str, Any]:
    """Everything a task's child run consists of, as a JSON-ready dict (no I/O).

    Keys: ``id`` (a fresh UUID: the ``audit.record`` tag), ``time_ms``, ``sweep``,
    ``sweep_id``, ``key`` (``audit.key``), ``plan_key``, ``status`` (``finished``/``failed``),
    ``run_name``, ``tags``, ``params`` (names sanitised, values as MLflow strings),
    ``metrics`` (finite floats), ``items_json`` (the per-item table exactly as
    :meth:`mlflow.MlflowClient.log_table` writes ``items.json``, or ``None``), ``result_json``
    (the :class:`audit.result.Result` JSON) or ``error_text`` (reason and traceback).

    ``revision``: the revision the planner resolved for the model, recorded when the outcome
    has none (a model that could not be loaded), so a failed load still says which commit
    was tried.
    """
    res = outcome.result
    desc = outcome.model or {}
    key = (res.provenance.get("key") if res is not None else None) or plan_key or ""
    metric = res.metric if res is not None else registry.get(task.metric).result_name(desc.get("kind") or kind)
    tags = {
        "audit.role": ROLE_TASK,
        "audit.sweep": sweep,
        "audit.key": key,
        "audit.plan_key": plan_key or "",
        "audit.model": task.model,
        "audit.test": task.test_name,
        "audit.metric": metric,
        "audit.language": task.language,
        "audit.status": outcome.status,
    }
    if plan_key and key and plan_key != key:
        tags["audit.revision_changed"] = "true"
    if outcome.error:
        tags["audit.error"] = outcome.error[:_MAX_TAG]
        tags["mlflow.note.content"] = f"Failed: {outcome.error[:_MAX_TAG]}"
    if outcome.load_id:
        tags["audit.load_id"] = outcome.load_id
    for k in LOAD_TAGS:  # where the numbers came from (a GPU or the CPU, the weights' dtype): not keyed
        if desc.get(k):
            tags[f"audit.{k}"] = str(desc[k])
    for k, v in (getattr(model_spec, "run_tags", None) or {}).items():  # e.g. audit.mitigation
        tags.setdefault(str(k), str(v))
    params: dict[str, Any] = {
        "model": model_spec.ref,
        "model_name": task.model,
        "revision": desc.get("revision") or revision or "",
        "backend": desc.get("backend") or model_spec.options.get("backend") or "",
        "kind": desc.get("kind") or kind,
        "embedding": embedding_method(desc.get("kind") or kind, task.metric, task.params),
        "test": task.test_name,
        "test_ref": task.test,
        "language": task.language,
        "metric": metric,
        "seed": task.seed,
    }
    if res is not None:
        params["dataset_digest"] = res.provenance.get("dataset_digest", "")
        if res.provenance.get("chat_template_digest"):  # audit.backends.chat: the template applied
            params["chat_template_digest"] = res.provenance["chat_template_digest"]
        for k in RESULT_STRING_FIELDS:  # how the numbers were obtained: the interval, the groups' side ...
            v = (res.fields or {}).get(k)
            if isinstance(v, str) and v:
                params.setdefault(k, v)
        for pkg, ver in (res.provenance.get("versions") or {}).items():
            tags[f"version.{pkg}"] = str(ver)
    if res is not None:
        for k, v in result_settings(res).items():  # seeds, bootstrap size ...: params, not metrics
            params.setdefault(k, v)
    for k, v in sorted(task.params.items()):
        params[f"param.{k}"] = json.dumps(v, sort_keys=True, default=str)
    for k, v in (model_spec.options or {}).items():
        if k not in ("backend",):
            params[f"model.{k}"] = json.dumps(v, default=str) if not isinstance(v, str) else v
    for k, v in (getattr(model_spec, "run_params", None) or {}).items():  # e.g. mitigation.param.<name>
        params.setdefault(str(k), v)
    metrics = result_metrics(res) if res is not None else {}
    metrics["measure_seconds"] = float(outcome.measure_s)
    metrics["analyse_seconds"] = float(outcome.analyse_s)
    items_json = None
    if res is not None and res.items is not None and len(res.items):
        items_json = _table_for_mlflow(res.items).to_json(orient="split", index=False, date_format="iso",
                                                          default_handler=str)
    return {
        "id": uuid.uuid4().hex,
        "time_ms": int(time.time() * 1000),
        "sweep": sweep,
        "sweep_id": sweep_id,
        "key": key,
        "plan_key": plan_key or "",
        "status": outcome.status,
        # the measurement's own name (crows_pairs_causal on a causal LM), as in params and tags
        "run_name": dataclasses.replace(task, metric=metric).run_name,
        "tags": {k: str(v) for k, v in tags.items()},
        "params": {_sanitize(k): str(v)[:_MAX_PARAM] for k, v in params.items()},
        "metrics": metrics,
        "items_json": items_json,
        "result_json": res.dumps() if res is not None else None,
        "error_text": None if res is not None else (outcome.error or "") + "\n\n" + (outcome.traceback or ""),
    }


def all_pages(search: Callable[..., Any], *args: Any, **kwargs: Any) -> list:
    """Every item an MLflow ``search_*`` call finds (``search_runs``, ``search_registered_models``):
    ``search(*args, **kwargs, max_results=1000, page_token=...)`` page after page until the last."""
    out, token = [], None
    while True:
        page = search(*args, **kwargs, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def search_all(client: Any, experiment_ids: list[str], filter_string: str) -> list:
    """Every run of ``experiment_ids`` that ``filter_string`` selects (MLflow's ``search_runs``)."""
    return all_pages(client.search_runs, experiment_ids, filter_string=filter_string)


def unavailable(uri: str, e: BaseException) -> TrackingUnavailable:
    """A :class:`TrackingUnavailable` for an exception met while talking to ``uri``: one line,
    the socket error when there is one (``[Errno 111] Connection refused``), credentials in the
    URI redacted."""
    text = str(e).strip()
    m = re.search(r"\[Errno -?\d+\] [^\"'()\]]+", text)
    if m:
        msg = m.group(0).strip()
    elif re.search(r"timed? ?out", text, re.IGNORECASE):
        msg = "timed out"
    else:
        msg = (text.splitlines() or [""])[0].replace(uri, redact_uri(uri))
        if len(msg) > 200:
            msg = msg[:197] + "..."
    return TrackingUnavailable(f"MLflow tracking store {redact_uri(uri)} unreachable ({type(e).__name__}: {msg})")


def tracking_env_note(uri: str) -> str:
    """How to open a tracking store in the MLflow UI (credentials in the URI redacted)."""
    if uri.startswith("sqlite:"):
        return f"mlflow ui --backend-store-uri {uri}"
    return f"open {redact_uri(uri)} (MLflow server)"


__all__ = ["Tracker", "TrackingUnavailable", "task_record", "record_row", "run_row", "result_metrics",
           "embedding_method", "tracking_env_note", "redact_uri", "driver_id", "driver_alive", "store_lock",
           "sqlite_path", "search_all", "all_pages"]
