"""A PostgreSQL server and an MLflow tracking server backed by it, on loopback, for tests.

What ``infra/mlflow/docker-compose.yaml`` deploys (``mlflow server --backend-store-uri
postgresql://...``), started from the machine's Debian packages (``initdb``, ``postgres``; on PATH
or in ``/usr/lib/postgresql/<version>/bin``) in a temporary directory, on free loopback ports,
and stopped by PID. PostgreSQL refuses to run as root: when the tests run as root (CI), the
database runs as the ``postgres`` user (``runuser``), which owns the temporary directory.
``.ci/run`` installs the ``postgresql`` package on a machine without ``initdb``.
"""

from __future__ import annotations

import glob
import http.client
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PG_USER = "postgres"

#: The environment every ``mlflow server`` of the tests gets on top of the suite's, as
#: ``infra/mlflow/docker-compose.yaml`` deploys it (``tests/test_infra.py`` checks they agree):
#: no MLflow job execution. MLflow 3 otherwise starts a job runner and eight ``huey`` consumer
#: processes per server (its GenAI jobs, which biasaudit never submits): measured on the 2-core
#: machine, 22 CPU-seconds and 16 s until ``/health`` answers, against 5 CPU-seconds and 8 s without.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def mlflow_server(args: list[str], log) -> subprocess.Popen:
    """``mlflow server ARGS`` (this environment's) in a session of its own, output to ``log``,
    with :data:`SERVER_ENV`."""
    return subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", *args], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **SERVER_ENV})


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports: all bound at once, so two calls cannot return the same
    port (a closed socket's port may be handed out again at once: the MLflow server then failed
    to bind and the health check reached PostgreSQL)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pg_bin(name: str) -> str | None:
    """The path of a PostgreSQL server program (``initdb``, ``postgres``), ``None`` if not installed."""
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


class PostgresMlflow:
    """``start()`` PostgreSQL then ``mlflow server`` on it; ``stop()`` both by PID; ``uri`` is
    the tracking URI (``http://127.0.0.1:<port>``), ``db_uri`` the database's."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="biasaudit-pg-"))
        self.pg_port, self.port = free_ports(2)
        self.uri = f"http://127.0.0.1:{self.port}"
        self.db_uri = f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{self.pg_port}/mlflow"
        self.pg: subprocess.Popen | None = None
        self.server: subprocess.Popen | None = None
        self.seconds: dict[str, float] = {}

    def _as_pg(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", PG_USER, "--", *cmd] if os.getuid() == 0 else cmd

    def start(self, timeout: float = 400) -> "PostgresMlflow":
        initdb, postgres = pg_bin("initdb"), pg_bin("postgres")
        if not (initdb and postgres):
            raise RuntimeError("PostgreSQL server programs (initdb, postgres) not found: install the Debian package "
                               "postgresql (.ci/run does)")
        data, sock = self.root / "data", self.root / "sock"
        sock.mkdir(parents=True, exist_ok=True)
        if os.getuid() == 0:
            pw = pwd.getpwnam(PG_USER)
            for p in (self.root, sock):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        t0 = time.monotonic()
        subprocess.run(self._as_pg([initdb, "-D", str(data), "-A", "trust", "-U", PG_USER, "-E", "UTF8",
                                    "--no-sync", "--no-locale"]), check=True, capture_output=True)
        self._pg_log = open(self.root / "postgres.log", "wb")
        self.pg = subprocess.Popen(
            self._as_pg([postgres, "-D", str(data), "-p", str(self.pg_port), "-h", "127.0.0.1", "-k", str(sock),
                         "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]),
            stdout=self._pg_log, stderr=subprocess.STDOUT, start_new_session=True)
        import psycopg2

        while True:
            if self.pg.poll() is not None:
                raise RuntimeError("postgres exited: " + (self.root / "postgres.log").read_text()[-2000:])
            try:
                conn = psycopg2.connect(host="127.0.0.1", port=self.pg_port, user=PG_USER, dbname="postgres")
                break
            except psycopg2.OperationalError:
                if time.monotonic() - t0 > timeout:
                    raise
                time.sleep(0.2)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE mlflow")
        conn.close()
        self.seconds["postgres"] = time.monotonic() - t0
        t1 = time.monotonic()
        (self.root / "artifacts").mkdir(exist_ok=True)
        self._srv_log = open(self.root / "mlflow.log", "wb")
        self.server = mlflow_server(["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                                     "--backend-store-uri", self.db_uri,
                                     "--artifacts-destination", str(self.root / "artifacts")], self._srv_log)
        while True:
            if self.server.poll() is not None:
                raise RuntimeError("mlflow server exited: " + (self.root / "mlflow.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    break
            except (OSError, http.client.HTTPException):  # not up yet, or another server on the port
                if time.monotonic() - t1 > timeout:
                    raise TimeoutError("mlflow server did not answer: "
                                       + (self.root / "mlflow.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        self.seconds["mlflow"] = time.monotonic() - t1
        return self

    def stop(self) -> None:
        """Stop the MLflow server (its process group) and PostgreSQL (SIGINT: fast shutdown), by PID."""
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(timeout=30)
        if self.pg is not None and self.pg.poll() is None:
            os.killpg(self.pg.pid, signal.SIGINT)
            try:
                self.pg.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.pg.pid, signal.SIGKILL)
                self.pg.wait(timeout=30)
        for fh in (getattr(self, "_srv_log", None), getattr(self, "_pg_log", None)):
            if fh is not None:
                fh.close()
        shutil.rmtree(self.root, ignore_errors=True)
