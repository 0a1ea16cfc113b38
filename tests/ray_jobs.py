"""Waiting for a Ray job from a test (``tests/test_hub_e2e.py``, ``test_watch.py``, ``test_cluster.py``)."""

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
