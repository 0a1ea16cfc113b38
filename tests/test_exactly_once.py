"""Exactly once on the store a team deploys (issue 18, item 1).

Five invocations of one spec started at once (real ``python -m jobs.sweep`` processes) leave one
FINISHED child run per ``audit.key`` and one writer of the reports, on the embedded SQLite
store and on an MLflow server backed by PostgreSQL (the ``pg_mlflow`` fixture of
``tests/conftest.py``). Before the sweep lease (:mod:`jobs.lease`) two concurrent invocations
ran every task twice. The lease itself: exactly one of several racing acquirers wins; a lease of
a killed driver is taken over; a released one is taken again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jobs.lease import BUSY_EXIT_CODE, Busy, Lease, lease_tag
from jobs.spec import load_spec
from jobs.tracker import Tracker

from cli_inputs import subprocess_env
from test_sweep_service import write_spec, write_vec

ROOT = Path(__file__).resolve().parent.parent
TESTS4 = ["weat1", "weat2", "weat6", "weat7"]


def _env() -> dict[str, str]:
    return subprocess_env(HF_HUB_OFFLINE="1")


def _spec(tmp_path: Path, uri: str | None):
    a = write_vec(tmp_path / "a.vec", 1, tests=TESTS4)
    b = write_vec(tmp_path / "b.vec", 2, tests=TESTS4)
    models = f'  - {{name: a, ref: "{a}"}}\n  - {{name: b, ref: "{b}"}}'
    path = write_spec(tmp_path, "once", models, tests=TESTS4,
                      ray="num_cpus: 1, actor_num_cpus: 0.5, stats_num_cpus: 0.5, batch_size: 1")
    if uri:
        path.write_text(path.read_text() + f"tracking: {{uri: '{uri}'}}\n", encoding="utf-8")
    return path


def _run_concurrently(spec_path: Path, n: int, extra: list[str] = ()) -> list[subprocess.CompletedProcess]:
    """Start ``n`` drivers of one spec at the same moment; wait for all."""
    cmd = [sys.executable, "-m", "jobs.sweep", str(spec_path), "--no-progress", *extra]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=600)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
    return out


def _check_exactly_once(spec_path: Path, results, n_tasks: int) -> None:
    spec = load_spec(spec_path)
    codes = [r.returncode for r in results]
    detail = "\n".join(f"--- exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}" for r in results)
    assert set(codes) <= {0, BUSY_EXIT_CODE}, detail
    writers = [r for r in results if "reports in " in r.stdout]
    ran = [r for r in writers if f"{n_tasks} task(s) run" in r.stdout]
    # one driver ran the tasks; an invocation that came after it ended resumed and ran nothing
    assert len(ran) == 1, detail
    assert all(" 0 task(s) run" in r.stdout or r is ran[0] for r in writers), detail
    busy = [r for r in results if r.returncode == BUSY_EXIT_CODE]
    for r in busy:  # one line naming the holder, no traceback, nothing written
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("audit: busy: sweep once") and " pid " in lines[0], r.stderr
        assert "Traceback" not in r.stderr and "task(s) run" not in r.stdout
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    runs = tr.task_runs()
    finished = [r for r in runs if r.info.status == "FINISHED"]
    keys = [r.data.tags["audit.key"] for r in finished]
    assert len(keys) == n_tasks and len(set(keys)) == n_tasks, (len(keys), len(set(keys)))
    assert len(runs) == n_tasks  # no FAILED/KILLED duplicates either
    parents = tr.sweep_runs()
    assert len(parents) == 1
    p = tr.client.get_run(parents[0].info.run_id)
    assert p.info.status == "FINISHED"
    assert int(p.data.tags["audit.invocations"]) == len(writers)
    assert p.data.metrics["tasks_run_total"] == n_tasks
    # the reports were written by the writers only, one after another: the run log holds one
    # sweep header per writer and no busy invocation's lines
    log = (spec.output_dir / "run.log").read_text(encoding="utf-8")
    assert log.count("=== sweep once") == len(writers), log[-3000:]
    assert (spec.output_dir / "reports" / "results.parquet").is_file()


@pytest.mark.e2e
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_five_concurrent_invocations_finish_each_key_once(tmp_path, store, request):
    uri = None
    if store == "postgresql":
        uri = request.getfixturevalue("pg_mlflow")["uri"]
    spec_path = _spec(tmp_path, uri)
    t0 = time.perf_counter()
    results = _run_concurrently(spec_path, 5)
    print(f"{store}: 5 concurrent invocations in {time.perf_counter() - t0:.1f} s, exits "
          f"{sorted(r.returncode for r in results)}")
    _check_exactly_once(spec_path, results, n_tasks=8)
    # a later invocation resumes: nothing left to run
    again = _run_concurrently(spec_path, 1)[0]
    assert again.returncode == 0 and "0 task(s) run, 8 resumed" in again.stdout, again.stdout + again.stderr
    # no lease left on MLflow's Models page; its generations numbered on across the deletions
    spec = load_spec(spec_path)
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    assert _lease_models(tr) == []
    writers = sum("reports in " in r.stdout for r in results) + 1
    tag = dict(tr.client.get_experiment(tr.experiment_id).tags)[lease_tag(spec.sweep_id())]
    assert writers <= int(tag) <= writers + 4, (writers, tag)  # one generation per writer (+ lost races)


def _lease_models(tr: Tracker) -> list[str]:
    flt = f"name LIKE 'biasaudit-lease.{tr.experiment_id}.%'"
    return [rm.name for rm in tr.client.search_registered_models(filter_string=flt)]


# --------------------------------------------------------------------------------------
# The lease itself
# --------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    return Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "lease-test")


@pytest.mark.e2e
def test_exactly_one_of_many_racing_acquirers_wins(store):
    won, busy, errors = [], [], []
    barrier = threading.Barrier(8)

    def go(i):
        lease = Lease(store.client, store.experiment_id, "s1", driver=f"{os.uname().nodename}:{os.getpid()}:x{i}")
        barrier.wait()
        try:
            won.append(lease.acquire())
        except Busy as b:
            busy.append(b.holder)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(won) == 1 and len(busy) == 7
    assert {b.holder for b in busy} == {won[0].driver}
    won[0].release()
    again = Lease(store.client, store.experiment_id, "s1", driver="h:1:y").acquire()
    assert again.generation == 2 and again.taken_over is None
    assert [g for g, _ in again.generations()] == [2]  # older generations cleaned up
    again.release()


@pytest.mark.e2e
def test_a_killed_drivers_lease_is_taken_over(store, tmp_path):
    from jobs.tracker import driver_id

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = f"{driver_id().rsplit(':', 2)[0]}:{p.pid}:"
        first = Lease(store.client, store.experiment_id, "s2", driver=dead).acquire()
        first._stop.set()  # its "process" stops beating
        with pytest.raises(Busy):  # alive: held
            Lease(store.client, store.experiment_id, "s2", driver=driver_id()).acquire()
    finally:
        p.kill()
        p.wait()
    mine = Lease(store.client, store.experiment_id, "s2", driver=driver_id()).acquire()
    assert mine.taken_over is not None and mine.taken_over.pid == p.pid and mine.generation == 2
    # the old holder, woken up, finds it lost the lease
    assert not first.still_held() and mine.still_held()
    mine.release()


def _acquire_when_stale(store, sweep: str, driver: str, since: float, ttl: float) -> Lease:
    """Poll (every 0.1 s, no fixed sleep) until ``driver`` takes the lease of a holder that stopped
    beating; it must not succeed before ``ttl`` seconds after ``since`` (taken before the holder
    acquired)."""
    deadline = time.monotonic() + ttl + 60
    while True:
        try:
            lease = Lease(store.client, store.experiment_id, sweep, driver=driver).acquire()
        except Busy:
            assert time.monotonic() < deadline, f"the lease of {sweep} never went stale"
            time.sleep(0.1)
            continue
        assert time.monotonic() - since >= ttl, "taken over before its ttl"
        return lease


@pytest.mark.e2e
def test_a_lease_on_another_host_goes_stale_after_its_ttl(store):
    since = time.monotonic()
    other = Lease(store.client, store.experiment_id, "s3", driver="elsewhere:42:1", ttl=5.0).acquire()
    other._stop.set()
    with pytest.raises(Busy, match="host .* pid"):  # (ttl 5 s: a loaded machine took > 1 s between the calls)
        Lease(store.client, store.experiment_id, "s3", driver="here:1:1").acquire()
    mine = _acquire_when_stale(store, "s3", "here:1:1", since, 5.0)
    assert mine.taken_over.holder == "elsewhere:42:1"
    mine.release()


@pytest.mark.e2e
def test_a_normally_ended_lease_is_deleted_and_its_numbers_never_come_back(store):
    """A sweep that ended normally deletes its lease (no registered model left on MLflow's Models
    page), and the next generation is numbered after it all the same: an old holder that was
    paused while its lease was taken over, the taker ending normally and a third driver starting,
    must not find "its" number again and believe it still holds the lease."""
    since = time.monotonic()
    paused = Lease(store.client, store.experiment_id, "s4", driver="elsewhere:42:1", ttl=1.0).acquire()
    paused._stop.set()  # paused: no heartbeat
    taker = _acquire_when_stale(store, "s4", "here:1:1", since, 1.0)
    assert taker.generation == 2 and taker.taken_over.holder == "elsewhere:42:1"
    taker.release(delete=True)
    assert _lease_models(store) == []
    assert dict(store.client.get_experiment(store.experiment_id).tags)[lease_tag("s4")] == "2"
    third = Lease(store.client, store.experiment_id, "s4", driver="here:1:2").acquire()
    assert third.generation == 3 and third.taken_over is None
    assert not paused.still_held() and third.still_held()
    paused.release(delete=True)  # the woken old holder deletes nothing of the lease now held
    assert third.still_held()
    third.release()  # released without deleting (an interrupted sweep): the lease stays, released
    assert len(_lease_models(store)) == 1
    fourth = Lease(store.client, store.experiment_id, "s4", driver="here:1:3").acquire()
    assert fourth.generation == 4
    fourth.release(delete=True)
    assert _lease_models(store) == []


# --------------------------------------------------------------------------------------
# Counters across killed and refused invocations (issue 18, found 7)
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_counters_survive_a_killed_driver_and_ignore_unresolvable_tasks(store):
    """Child runs of a driver killed before it closed the parent count in ``tasks_run_total``;
    a task without ``audit.key`` (a repository that could not be resolved) is not superseded."""
    from types import SimpleNamespace

    import pandas as pd

    from jobs.sweep import parent_summary

    pid, _ = store.start_parent("s", "sid-1")
    for i, key in enumerate(["k1", "k2", "k3", "", "old"]):  # the first invocation was killed: no end_parent
        store.client.create_run(store.experiment_id, run_name=f"t{i}", tags={
            "audit.role": "task", "mlflow.parentRunId": pid, "audit.key": key, "audit.plan_key": key})
    plan = SimpleNamespace(tasks=[SimpleNamespace(key=k) for k in ("k1", "k2", "k3", "")])
    df = pd.DataFrame({"status": ["finished"] * 4})
    m = parent_summary(store, plan, df, ran=0, resumed=3, loads=0, seconds=1.0, workers=0, invocation=2)
    assert m["child_runs"] == 5 and m["child_runs_superseded"] == 1  # "old" only, not the key-less run
    assert m["tasks_run_total"] == 5  # before: 0 (the killed invocation never added its count)


@pytest.mark.e2e
def test_a_refused_sweep_says_no_task_ran(tmp_path, capsys):
    """A sweep refused before anything starts (workers need 2 CPUs on a 1-CPU Ray) ran nothing: its
    summary says so (before: "2 task(s) run"), and it names no worker process."""
    from jobs import sweep

    vec = write_vec(tmp_path / "a.vec", 1)
    spec = load_spec(write_spec(tmp_path, "refused", f'  - {{name: a, ref: "{vec}"}}',
                                ray="num_cpus: 1, actor_num_cpus: 2, stats_num_cpus: 0.5, batch_size: 1"))
    out = sweep.run_sweep(spec, progress=False)
    text = capsys.readouterr().out
    assert out.exit_code == 4 and out.ran == 0, text[-2000:]
    assert "0 task(s) run (2 of 2 not run), 0 resumed" in text and "2 task(s) run" not in text
    assert "models loaded: 0\n" in text and "worker process" not in text


@pytest.mark.unit
def test_a_busy_invocation_names_a_holder_that_has_just_taken_the_lock(tmp_path, capsys):
    """The holder writes ``host H pid P`` just after taking the file lock; an invocation that finds
    the lock taken in between waits for that line instead of naming "another driver" (seen with
    five drivers started at once)."""
    import threading
    import types

    from filelock import FileLock

    from jobs.sweep import _claim_sweep

    out = tmp_path / "out"
    out.mkdir()
    lock = FileLock(str(out / "sweep.lock"))
    lock.acquire()
    try:
        late = threading.Timer(0.5, lambda: (out / "sweep.lock.holder").write_text("host h pid 4242\n"))
        late.start()
        outcome = _claim_sweep(types.SimpleNamespace(name="once", source="once.yaml"), out)
        late.join()
    finally:
        lock.release()
    assert outcome.exit_code == BUSY_EXIT_CODE
    line = capsys.readouterr().err.strip()
    assert line.startswith("audit: busy: sweep once (once.yaml) is being run by host h pid 4242 (lock "), line
