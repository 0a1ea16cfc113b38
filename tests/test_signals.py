"""SIGINT and SIGTERM end a sweep's driver with one line (issue 18, item 4 of "Found"): exit
status 130/143, ``interrupted (SIGTERM): N result(s) kept; resume with: audit run ...``, no
traceback, no Ray C++ stack dump (before: a KeyboardInterrupt traceback, and exit 134 with a
dump for SIGTERM). The results finished before the signal are kept (write-ahead log and
tracking store) and the printed command resumes the sweep without redoing them."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audit import signals
from cli_inputs import subprocess_env
from test_sweep_service import write_spec, write_vec

ROOT = Path(__file__).resolve().parent.parent
TESTS4 = ["weat1", "weat2", "weat6", "weat7"]


def _env() -> dict[str, str]:
    return subprocess_env()


def _wal_records(out: Path) -> list[dict]:
    path = out / "wal.jsonl"
    if not path.is_file():
        return []
    recs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("op") == "task":
            recs.append(e["record"])
    return recs


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_sweep_with_one_line_and_keeps_its_results(tmp_path, sig):
    a = write_vec(tmp_path / "a.vec", 1, tests=TESTS4)
    b = write_vec(tmp_path / "b.vec", 2, tests=TESTS4)
    out = tmp_path / "out"
    spec = write_spec(tmp_path, "sig", f'  - {{name: a, ref: "{a}"}}\n  - {{name: b, ref: "{b}"}}', tests=TESTS4,
                      out=out, ray="num_cpus: 1, actor_num_cpus: 0.5, stats_num_cpus: 0.5, batch_size: 1")
    # sampled permutations (WEAT 1 and 2 hold 25 x 25 targets; 6 and 7 are enumerated exactly) slow
    # enough that the signal, sent at the first result, lands mid-sweep; the resume runs the rest
    spec.write_text(spec.read_text().replace("permutations: 200\n", "permutations: 100000\n"), encoding="utf-8")
    p = subprocess.Popen([sys.executable, "-m", "jobs.cli", "run", str(spec), "--no-progress"], cwd=ROOT, env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not _wal_records(out) and p.poll() is None and time.monotonic() - t0 < 400:
        time.sleep(0.2)
    assert p.poll() is None, "the sweep ended before the first result: make it slower"
    p.send_signal(sig)
    so, se = p.communicate(timeout=180)
    assert p.returncode == 128 + sig, (p.returncode, so[-2000:], se[-3000:])
    assert "Traceback" not in se and "*** SIG" not in se and "Stack trace" not in se, se[-3000:]
    # stderr holds MLflow's and Ray's start-up lines too; the driver's own ending is one line, the last
    lines = [x for x in se.strip().splitlines() if x.strip()]
    assert sum("interrupted" in x.lower() or "KeyboardInterrupt" in x for x in lines) == 1, se[-3000:]
    m = re.fullmatch(rf"interrupted \({sig.name}\): (\d+) result\(s\) kept; resume with: (audit run .+)", lines[-1])
    assert m, se[-3000:]
    kept = int(m.group(1))
    recs = _wal_records(out)
    assert kept == len(recs) and 1 <= kept < 8, (kept, len(recs))
    # the printed command resumes: only the tasks without a result run
    cmd = shlex.split(m.group(2))
    r = subprocess.run([sys.executable, "-m", "jobs.cli", *cmd[1:], "--no-progress"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=600)
    done = sum(1 for x in recs if x.get("status") == "finished")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"{8 - done} task(s) run, {done} resumed" in r.stdout, r.stdout[-2000:]
    # the interrupted driver released its lease: the resume had none to take over
    assert "took over the lease" not in r.stdout + r.stderr, r.stdout[-2000:]


class _LosesASignal:
    """Sends ``sig`` to its own process from its finalizer: the handler runs inside ``__del__``,
    where Python prints the exception it raises and drops it."""

    def __init__(self, sig: int):
        self.sig = sig

    def __del__(self):
        os.kill(os.getpid(), self.sig)
        time.sleep(5)  # not reached: the handler raises first


@pytest.fixture
def unraisable(monkeypatch):
    """What reaches ``sys.unraisablehook`` (a raise lost in a finalizer) while the test runs."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    yield seen
    signals.clear()


@pytest.mark.unit
def test_a_raise_lost_in_a_finalizer_is_raised_again_at_the_next_safe_point(unraisable):
    with signals.raised_in_main_thread():
        _LosesASignal(signal.SIGTERM)  # collected at once: the raise is lost in its __del__
        assert not unraisable  # quiet: the pending signal says it all
        with pytest.raises(signals.Interrupted) as e:
            signals.raise_pending()
    assert e.value.signum == signal.SIGTERM
    signals.clear()
    signals.raise_pending()  # handled: nothing pending
    # the control: without the handler's record, Python's own hook receives the raise and drops it
    def raise_only(signum, frame):
        raise signals.Interrupted(signum)

    sys.unraisablehook, seen = (lambda u: seen.append(u.exc_value)), []
    old = signal.signal(signal.SIGTERM, raise_only)
    try:
        _LosesASignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, old)
    assert [type(x) for x in seen] == [signals.Interrupted]


@pytest.mark.unit
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_core_command_that_lost_its_signal_still_ends_with_its_status(unraisable, capsys, sig):
    import argparse

    from audit.cli import run_command

    def command(a):
        _LosesASignal(sig)
        print("result")
        return 0

    assert run_command(argparse.Namespace(command="score"), command) == 128 + sig
    err = capsys.readouterr().err.strip()
    assert err == (f"audit: {'interrupted' if sig == signal.SIGINT else 'terminated'} ({sig.name}): "
                   "`audit score` stopped before it finished")
    signals.raise_pending()  # the command cleared it


@pytest.mark.unit
def test_a_sweep_driver_that_lost_its_signal_exits_with_its_status_and_one_line(unraisable, capsys, monkeypatch,
                                                                                tmp_path):
    import logging

    import jobs.sweep as sweep

    monkeypatch.setattr(logging.getLogger("mlflow"), "level", logging.getLogger("mlflow").level)

    def finished(a):
        _LosesASignal(signal.SIGTERM)  # e.g. after the scheduling loop's last tick
        return 0

    monkeypatch.setattr(sweep, "_main", finished)
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert sweep.main([str(tmp_path / "missing.yaml")]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interrupted (SIGTERM): 0 result(s) kept; resume with: audit run {tmp_path / 'missing.yaml'}"]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    signals.raise_pending()


@pytest.fixture
def signal_in_each_commit(monkeypatch):
    """SIGTERM sent to this process from inside every SQLAlchemy commit while ``armed`` holds a
    count (Python then runs the handler inside the commit: where a signal can land in a sweep's
    driver); yields ``armed``."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    armed = [0]

    def on_commit(conn):
        if armed[0]:
            armed[0] -= 1
            os.kill(os.getpid(), signal.SIGTERM)

    event.listen(Engine, "commit", on_commit)
    try:
        yield armed
    finally:
        event.remove(Engine, "commit", on_commit)
        signals.clear()


@pytest.mark.unit
def test_a_signal_inside_a_store_commit_is_raised_after_it_and_the_cleanup_writes_at_once(tmp_path,
                                                                                          signal_in_each_commit):
    """SIGTERM in the middle of a commit to the SQLite store: the tracker's client finishes the
    write and raises :class:`audit.signals.Interrupted` when the call returns, and the writes a
    driver makes after a signal (its parent run KILLED, its lease) go through at once. Before, the
    signal was raised inside the commit, the connection kept its write transaction open, and the
    next write waited 20 s for SQLite's lock and failed ("database is locked"). The control: the
    same signal through MLflow's own client is raised inside the call, before the write is done."""
    from jobs.tracker import Tracker

    tr = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "signals")
    run = tr.client.create_run(tr.experiment_id).info.run_id
    signal_in_each_commit[0] = 1
    with signals.raised_in_main_thread(), pytest.raises(signals.Interrupted):
        tr.client.set_tag(run, "written", "yes")
    signals.clear()
    assert signal_in_each_commit[0] == 0  # the signal came, inside the commit
    t0 = time.monotonic()
    tr.client.set_terminated(run, "KILLED")
    assert time.monotonic() - t0 < 2.0
    got = tr.client.get_run(run)
    assert got.data.tags["written"] == "yes" and got.info.status == "KILLED"
    # the control, on a store of its own: MLflow's client is cut inside the commit
    other = Tracker(f"sqlite:///{tmp_path / 'other.db'}", "signals")
    raw = other.client._client
    run2 = raw.create_run(other.experiment_id).info.run_id
    signal_in_each_commit[0] = 1
    with signals.raised_in_main_thread(), pytest.raises(signals.Interrupted):
        raw.set_tag(run2, "written", "yes")
    assert signal_in_each_commit[0] == 0


@pytest.mark.unit
def test_deferred_raises_at_the_end_of_the_outermost_block_and_only_in_the_main_thread():
    import threading

    got = []
    with signals.raised_in_main_thread():
        with pytest.raises(signals.Interrupted) as e:
            with signals.deferred():
                with signals.deferred():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.01)  # the handler runs here and only records it
                    got.append("inner done")
                got.append("outer done")
        assert e.value.signum == signal.SIGTERM and got == ["inner done", "outer done"]
        signals.clear()
        # a block that raises keeps its own exception; the signal stays pending for the next safe
        # point, and the writes of the cleanup after it run whole, raising nothing again
        with pytest.raises(KeyError):
            with signals.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.01)
                raise KeyError("x")
        with pytest.raises(signals.Interrupted):
            signals.raise_pending()
        with signals.deferred():
            got.append("cleanup after the exception")
        signals.clear()
        # a signal raised where it landed (outside any block): the cleanup's blocks before clear()
        # raise nothing (the sweep's lease release had been cut after its first write)
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        with signals.deferred():
            got.append("cleanup 1")
        with signals.deferred():
            got.append("cleanup 2")
        assert got[-3:] == ["cleanup after the exception", "cleanup 1", "cleanup 2"]
        signals.clear()
        # another thread's block defers nothing: the main thread's signal is raised where it lands
        inside = threading.Event()
        release = threading.Event()

        def other():
            with signals.deferred():
                inside.set()
                release.wait(5)

        t = threading.Thread(target=other)
        t.start()
        inside.wait(5)
        try:
            with pytest.raises(signals.Interrupted):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
        finally:
            release.set()
            t.join()
        signals.clear()


@pytest.mark.unit
def test_a_signal_during_a_write_ahead_log_append_waits_for_the_line_and_its_fsync(tmp_path, monkeypatch):
    from jobs.wal import WriteAheadLog

    wal = WriteAheadLog(tmp_path / "wal.jsonl")
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        if not synced:
            os.kill(os.getpid(), signal.SIGTERM)  # lands before the fsync below
            time.sleep(0.01)
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with signals.raised_in_main_thread(), pytest.raises(signals.Interrupted):
        wal.append({"id": "r1", "key": "k"})
    signals.clear()
    assert len(synced) == 1 and [r["id"] for r in wal.records()] == ["r1"]
