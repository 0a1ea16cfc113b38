"""``audit sync`` keeps the tracking URI and the output directory of the run that failed (issue 18,
item 2 of "Found"): ``audit run SPEC --tracking-uri http://HOST:PORT --output-dir DIR`` with the
server down exits 3 and prints a hint; following it verbatim uploads into that server. Before,
the hint said ``audit sync SPEC``, which uploaded into a new local ``mlflow.db`` (and a later sync
with the right URI found 0 pending)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from audit.errors import ParameterError
from jobs.wal import WriteAheadLog, sync_target

from pg_server import PostgresMlflow
from cli_inputs import subprocess_env
from test_sweep_service import write_spec, write_vec

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return subprocess_env()


def _audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.e2e
def test_the_printed_sync_hint_uploads_into_the_server_the_run_named(tmp_path):
    vec = write_vec(tmp_path / "a.vec", 1)
    spec = write_spec(tmp_path, "hint", f'  - {{name: a, ref: "{vec}"}}', out=tmp_path / "spec-out",
                      ray="num_cpus: 1, actor_num_cpus: 0.5, stats_num_cpus: 0.5, batch_size: 1")
    server = PostgresMlflow()  # ports chosen, not started: the server is down
    out_dir = tmp_path / "elsewhere"
    r = _audit("run", str(spec), "--tracking-uri", server.uri, "--output-dir", str(out_dir), "--no-progress")
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    m = re.search(r"run `(audit sync [^`]+)`", r.stdout)
    assert m, r.stdout[-2000:]
    hint = shlex.split(m.group(1))
    assert hint[:3] == ["audit", "sync", str(spec)] and server.uri in hint and str(out_dir) in hint
    try:
        server.start()
        s = _audit(*hint[1:])  # verbatim (the `audit` entry point is `python -m jobs.cli`)
        assert s.returncode == 0, s.stdout + s.stderr
        assert "2 uploaded" in s.stdout and "0 still pending" in s.stdout, s.stdout
        from mlflow import MlflowClient

        c = MlflowClient(tracking_uri=server.uri)
        exp = c.get_experiment_by_name("biasaudit-hint")
        runs = c.search_runs([exp.experiment_id], filter_string="tags.`audit.role` = 'task'")
        assert sorted(x.info.status for x in runs) == ["FINISHED", "FINISHED"]
        again = _audit(*hint[1:])
        assert again.returncode == 0 and "0 pending record(s)" in again.stdout, again.stdout
        assert not (tmp_path / "spec-out" / "mlflow.db").exists()  # no stray local store
    finally:
        server.stop()


@pytest.mark.e2e
def test_a_plain_sync_uploads_to_the_store_the_records_were_meant_for(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal.jsonl")
    wal.append({"id": "r1", "status": "finished", "key": "k1"}, uri="http://mlflow.example:5000")
    local = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert sync_target(wal, local, explicit=False) == "http://mlflow.example:5000"
    assert sync_target(wal, local, explicit=True) == local  # --tracking-uri given: the user's choice
    assert sync_target(wal, "http://mlflow.example:5000/", explicit=False) == "http://mlflow.example:5000/"
    wal2 = WriteAheadLog(tmp_path / "wal2.jsonl")
    wal2.append({"id": "r2", "status": "finished", "key": "k2"}, uri="http://user:secret@mlflow.example:5000")
    with pytest.raises(ParameterError, match=r"wal2.jsonl: 1 pending result\(s\) were meant for "
                                             r"http://\*\*\*@mlflow.example:5000, not sqlite"):
        sync_target(wal2, local, explicit=False)
    assert "secret" not in (tmp_path / "wal2.jsonl").read_text()
    assert json.loads((tmp_path / "wal.jsonl").read_text())["uri"] == "http://mlflow.example:5000"


@pytest.mark.e2e
def test_sync_while_a_driver_runs_uploads_nothing(tmp_path):
    """A live driver holds ``<output_dir>/sweep.lock``: ``audit sync`` would upload the record the
    driver is writing a second time; it exits 5 with one line instead, and works once the lock is free."""
    from filelock import FileLock

    from jobs import wal as walmod

    vec = write_vec(tmp_path / "a.vec", 1)
    spec = write_spec(tmp_path, "lk", f'  - {{name: a, ref: "{vec}"}}', out=tmp_path / "out")
    (tmp_path / "out").mkdir()
    lock = FileLock(str(tmp_path / "out" / "sweep.lock"))
    lock.acquire()
    try:
        r = subprocess.run([sys.executable, "-m", "jobs.cli", "sync", str(spec)], cwd=ROOT, env=_env(),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 5 and r.stderr.startswith("audit: busy: a sweep driver of ") and \
            len(r.stderr.strip().splitlines()) == 1, r.stderr
    finally:
        lock.release()
    assert walmod.main([str(spec)]) == 0
