"""The throw-away loopback head of :func:`jobs.cluster.local_head`: its jobs connect to it, also
when another head was started on the machine after it."""

from __future__ import annotations

import json
import time

import pytest


from jobs.cluster import local_head  # noqa: E402

pytestmark = pytest.mark.e2e

PROBE = ("python -c \"import json, os, ray; ray.init(); "
         "print('PROBE', json.dumps([os.environ['RAY_ADDRESS'], ray.cluster_resources().get('CPU')]))\"")


def _probe(address: str) -> tuple[str, float]:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    sid = client.submit_job(entrypoint=PROBE)
    deadline = time.monotonic() + 90
    while (st := client.get_job_status(sid).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, f"job on {address} did not end: {client.get_job_logs(sid)[-2000:]}"
        time.sleep(0.5)
    logs = client.get_job_logs(sid)
    assert st == "SUCCEEDED", logs[-2000:]
    line = next(x for x in logs.splitlines() if x.startswith("PROBE "))
    addr, cpus = json.loads(line[6:])
    return addr, cpus


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
