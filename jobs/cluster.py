"""A throw-away Ray head on loopback, for tests, the screenshot script and local trials of
``ray job submit``.

:func:`local_head` starts ``ray start --head --block`` in its own process group with every port
chosen free (so it never collides with another Ray on the machine), waits until the job API
answers and the node has started (a start that Ray gives up under load is tried again), yields
its dashboard address (``http://127.0.0.1:<port>``, what ``ray job submit --address`` takes),
and stops it by killing that process group. It never runs ``ray stop``
(which would stop every Ray of the machine).

Each head gets a private temporary directory (``ray start --temp-dir``), removed when it stops.
Ray's job supervisor gives a job's entrypoint the address of "its" cluster from the file
``<temp dir>/ray_current_cluster``, which every ``ray start`` on the machine overwrites when they
share the default ``/tmp/ray``: with another head started after this one (another test, another
user), this head's jobs connected to that other cluster (or to a stopped one, waiting for ever).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def short_temp_dir(prefix: str) -> str:
    """A new private temporary directory under ``/tmp`` when there is one: Ray's Unix socket paths
    live below a session's temporary directory and may not exceed 107 bytes, which a deep
    ``$TMPDIR`` (a pytest-xdist worker's ``tmp_path``) can break."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp" if os.path.isdir("/tmp") else None)


def ray_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a local head and ``ray job submit``: no auth on loopback, the
    virtualenv's ``python``/``ray`` first on ``PATH``."""
    env = dict(os.environ)
    env.update({"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_USAGE_STATS_ENABLED": "0"})
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.pop("RAY_ADDRESS", None)
    if extra:
        env.update(extra)
    return env


#: What ``ray start`` prints once its node is up (the raylet registered with the GCS).
_STARTED = b"Ray runtime started."


class HeadExited(RuntimeError):
    """``ray start`` exited before its head was ready."""


def _wait_ready(url: str, timeout: float, proc: subprocess.Popen, output) -> None:
    """Wait until the job API at ``url`` answers and ``output()`` (what ``ray start`` printed)
    says the node started; :class:`HeadExited` with its last line if ``ray start`` exits first."""
    deadline = time.monotonic() + timeout
    last, answered, started = None, False, False
    pause = 0.05  # doubled up to 0.5 s: a start that ends (or exits) at once is seen at once
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = [ln for ln in output().decode("utf-8", "replace").splitlines() if ln.strip()]
            raise HeadExited(f"ray start exited with status {proc.returncode}"
                             + (f": {lines[-1].strip()}" if lines else ""))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback
                answered = r.status == 200
        except OSError as e:
            answered, last = False, e
        started = _STARTED in output()
        if answered and started:
            return
        time.sleep(pause)
        pause = min(0.5, 2 * pause)
    raise TimeoutError(f"the Ray head of {url} was not ready within {timeout:.0f} s (job API: "
                       f"{'answered' if answered else last}; node started: {'yes' if started else 'no'})")


def _stop_head(proc: subprocess.Popen, temp_dir: str, stop_timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=stop_timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _start_head(num_cpus: int, object_store_memory: int, env: dict[str, str] | None,
                log) -> tuple[subprocess.Popen, str, str]:
    """``ray start --head --block`` on free loopback ports; ``(process, job API address, temp dir)``."""
    dash = free_port()
    ports = {
        "--port": free_port(), "--dashboard-port": dash, "--ray-client-server-port": free_port(),
        "--dashboard-agent-listen-port": free_port(), "--dashboard-agent-grpc-port": free_port(),
        "--runtime-env-agent-port": free_port(), "--metrics-export-port": free_port(),
        "--node-manager-port": free_port(), "--object-manager-port": free_port(),
    }
    # short (Unix socket paths live below it) and private (see the module docstring)
    temp_dir = short_temp_dir("ray-")
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--dashboard-host", "127.0.0.1", "--include-dashboard", "true", "--num-cpus", str(num_cpus),
           "--object-store-memory", str(object_store_memory), "--disable-usage-stats", "--temp-dir", temp_dir]
    for k, v in ports.items():
        cmd += [k, str(v)]
    proc = subprocess.Popen(cmd, env=ray_env(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{dash}", temp_dir


@contextlib.contextmanager
def local_head(*, num_cpus: int = 2, object_store_memory: int = 200_000_000, timeout: float = 90.0,
               env: dict[str, str] | None = None, log_path: str | Path | None = None,
               stop_timeout: float = 5.0, attempts: int = 2) -> Iterator[str]:
    """Start a Ray head on 127.0.0.1 and yield its dashboard (job API) address.

    The head is ready when its job API answers and ``ray start`` has said that the node started.
    ``ray start`` gives up when its raylet does not register within 30 s (a limit fixed in Ray: a
    machine busy with other work can reach it); the head is then started again on new ports, up
    to ``attempts`` starts in all, each one's output in ``log_path``.

    On exit the head's process group gets SIGTERM, then SIGKILL after ``stop_timeout`` seconds
    (a graceful ``ray start --block`` shutdown takes ~15 s here; nothing of value is lost).
    """
    log = open(log_path, "a+b") if log_path else tempfile.TemporaryFile()  # noqa: SIM115 - read: _wait_ready
    try:
        for attempt in range(1, attempts + 1):
            start = log.tell()
            proc, address, temp_dir = _start_head(num_cpus, object_store_memory, env, log)
            try:
                _wait_ready(f"{address}/api/version", timeout, proc,
                            functools.partial(os.pread, log.fileno(), 1 << 20, start))
                break
            except HeadExited:
                _stop_head(proc, temp_dir, stop_timeout)
                if attempt == attempts:
                    raise
                log.seek(0, os.SEEK_END)
            except BaseException:
                _stop_head(proc, temp_dir, stop_timeout)
                raise
        try:
            yield address
        finally:
            _stop_head(proc, temp_dir, stop_timeout)
    finally:
        log.close()
