"""The throw-away loopback head of :func:`jobs.cluster.local_head`: its jobs connect to it, also
when another head was started on the machine after it."""

from __future__ import annotations

import json

import pytest


from jobs.cluster import local_head  # noqa: E402
from ray_jobs import wait_for_job  # noqa: E402

PROBE = ("python -c \"import json, os, ray; ray.init(); "
         "print('PROBE', json.dumps([os.environ['RAY_ADDRESS'], ray.cluster_resources().get('CPU')]))\"")


def _probe(address: str) -> tuple[str, float]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    sid = client.submit_job(entrypoint=PROBE)
    st = wait_for_job(client, sid, 90, poll=0.5).value
    logs = client.get_job_logs(sid)
    assert st == "SUCCEEDED", logs[-2000:]
    line = next(x for x in logs.splitlines() if x.startswith("PROBE "))
    addr, cpus = json.loads(line[6:])
    return addr, cpus


@pytest.mark.e2e
def test_jobs_connect_to_their_own_head_whatever_other_heads_do(tmp_path):
    """Head A (1 CPU); head B (2 CPUs) started, then stopped: A's jobs keep the address of A.
    Before each head had its own ``--temp-dir``, B's start overwrote the machine's
    ``/tmp/ray/ray_current_cluster``, from which Ray gives a job its cluster's address: A's jobs
    got B's address, and once B was gone they waited for ever (found when another user's head
    started and stopped during the end-to-end test)."""
    with local_head(num_cpus=1, log_path=tmp_path / "a.log") as a:
        addr_a, cpus_a = _probe(a)
        with local_head(num_cpus=2, log_path=tmp_path / "b.log") as b:
            addr_b, cpus_b = _probe(b)
            during = _probe(a)
        after = _probe(a)
    assert (cpus_a, cpus_b) == (1.0, 2.0) and addr_a != addr_b
    assert during == after == (addr_a, 1.0)


_FAKE_HEAD = """
import http.server, sys
print({said!r}, flush=True)
if {exit_code} is not None:
    sys.exit({exit_code})
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", {port}), Ok).serve_forever()
"""


@pytest.mark.unit
def test_a_head_whose_start_ray_gives_up_is_started_again_and_one_that_never_starts_is_refused(tmp_path,
                                                                                              monkeypatch):
    """``ray start`` exits when its raylet does not register within Ray's fixed 30 s (a loaded
    machine; found in CI: the session's job head died while its job API had answered, and three
    tests failed): ``local_head`` waits for the node to start, not only for the job API, starts
    the head again on new ports, and after ``attempts`` failed starts raises one line naming
    Ray's reason. A job API that answers before the node started is not taken as ready."""
    import subprocess
    import sys

    from jobs import cluster

    starts = []
    plan = []  # per start: (what the fake `ray start` prints, its exit status or None to serve)

    def fake_start(num_cpus, object_store_memory, env, log):
        said, code = plan[len(starts)]
        port = cluster.free_port()
        src = _FAKE_HEAD.format(said=said, exit_code=code, port=port)
        proc = subprocess.Popen([sys.executable, "-c", src], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        starts.append(port)
        return proc, f"http://127.0.0.1:{port}", str(tmp_path / f"t{len(starts)}")

    monkeypatch.setattr(cluster, "_start_head", fake_start)
    timed_out = "Exception: The current node timed out during startup."
    plan[:] = [(timed_out, 1), ("Ray runtime started.", None)]
    with cluster.local_head(log_path=tmp_path / "head.log", timeout=30) as address:
        assert len(starts) == 2 and address == f"http://127.0.0.1:{starts[1]}"
    log = (tmp_path / "head.log").read_text()
    assert timed_out in log and "Ray runtime started." in log
    starts.clear()
    plan[:] = [(timed_out, 1), (timed_out, 1)]
    with pytest.raises(cluster.HeadExited, match="exited with status 1: Exception: The current node timed out"):
        with cluster.local_head(timeout=30):
            pass
    assert len(starts) == 2
    starts.clear()
    plan[:] = [("starting", None)]  # the job API answers, the node never says it started
    with pytest.raises(TimeoutError, match="job API: answered; node started: no"):
        with cluster.local_head(timeout=3, attempts=1):
            pass
