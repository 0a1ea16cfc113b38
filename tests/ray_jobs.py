"""Waiting for a Ray job from a test (``tests/test_hub_e2e.py``, ``test_watch.py``, ``test_cluster.py``),
and a local Ray whose state API answers, for the child scripts of ``test_contention.py`` and
``test_sweep_pool.py``."""

from __future__ import annotations

import time


def wait_for_job(client, submission_id: str, timeout: float, *, poll: float = 0.2):
    """The terminal :class:`ray.job_submission.JobStatus` of ``submission_id`` (``SUCCEEDED``,
    ``FAILED`` or ``STOPPED``), asked of ``client`` (a ``JobSubmissionClient``) every ``poll``
    seconds; fails with the job's last log lines when it is still running after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not (status := client.get_job_status(submission_id)).is_terminal():
        assert time.monotonic() < deadline, (
            f"job {submission_id} still {status.value} after {timeout:g} s: {client.get_job_logs(submission_id)[-3000:]}")
        time.sleep(poll)
    return status


def init_ray_with_dashboard(*, timeout: float = 90, **init_kw) -> None:
    """``ray.init(address="local", **init_kw)`` with its dashboard on a free loopback port, as under
    ``ray job submit``, then wait (up to ``timeout`` s) until Ray's state API answers
    (:func:`jobs.contention.cluster_snapshot`): the dashboard does some seconds after ``ray.init``."""
    import socket

    import ray

    from jobs.contention import cluster_snapshot

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(address="local", include_dashboard=True, dashboard_host="127.0.0.1", dashboard_port=port, **init_kw)
    deadline = time.monotonic() + timeout
    while cluster_snapshot() is None and time.monotonic() < deadline:
        time.sleep(1)
