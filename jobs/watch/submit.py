"""Submission of generated sweeps as Ray jobs, and what the watcher asks about them."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Protocol

from audit.retry import first_line

#: Ray job states in which a job holds (or waits for) cluster resources.
ACTIVE_STATES = ("PENDING", "RUNNING")


class AlreadySubmitted(Exception):
    """Ray refused the submission id: a job with that id exists."""


class SubmitError(Exception):
    """The job could not be submitted (cluster unreachable, bad runtime_env ...)."""


@dataclasses.dataclass(frozen=True)
class JobState:
    """A Ray job as the watcher sees it: its status (``PENDING``, ``RUNNING``, ``SUCCEEDED``,
    ``FAILED``, ``STOPPED``), the exit status of its entrypoint once it ended (``None`` before,
    or where Ray does not report it) and Ray's one-line message."""

    status: str
    exit_code: int | None = None
    message: str = ""


class Submitter(Protocol):
    """What the watcher needs of a job API (:class:`RaySubmitter`; tests pass an in-memory one)."""

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               metadata: dict[str, str], resources: dict[str, float]) -> str: ...

    def status(self, submission_id: str) -> str | None: ...

    def state(self, submission_id: str) -> JobState | None: ...

    def active(self, metadata: Mapping[str, str]) -> int: ...


def job_state(submitter: Any, submission_id: str) -> JobState | None:
    """``submitter.state(id)``, or a :class:`JobState` without exit status from
    ``submitter.status(id)`` for a submitter that only reports the status."""
    state = getattr(submitter, "state", None)
    if state is not None:
        return state(submission_id)
    st = submitter.status(submission_id)
    return JobState(st) if st is not None else None


class RaySubmitter:
    """Submits through :class:`ray.job_submission.JobSubmissionClient` (created on first use,
    so a poll with nothing to submit needs no cluster).

    address: the job API (``http://head:8265``); ``None``: ``$RAY_ADDRESS`` as Ray reads it.
    """

    def __init__(self, address: str | None = None):
        self.address = address
        self._client = None

    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            try:
                self._client = JobSubmissionClient(self.address)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise SubmitError(f"Ray job API at {self.address or os.environ.get('RAY_ADDRESS') or '(auto)'}: "
                                  f"{first_line(e)}") from None
        return self._client

    def submit(self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any],
               metadata: dict[str, str], resources: dict[str, float]) -> str:
        client = self.client()
        kw: dict[str, Any] = {}
        if resources.get("num_cpus") is not None:
            kw["entrypoint_num_cpus"] = resources["num_cpus"]
        if resources.get("num_gpus") is not None:
            kw["entrypoint_num_gpus"] = resources["num_gpus"]
        try:
            return client.submit_job(entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
                                     metadata=metadata, **kw)
        except RuntimeError as e:
            if "already exists" in str(e):
                raise AlreadySubmitted(submission_id) from None
            raise SubmitError(f"submission {submission_id}: {first_line(e)}") from None
        except (ConnectionError, OSError, ValueError) as e:
            raise SubmitError(f"submission {submission_id}: {type(e).__name__}: {first_line(e)}") from None

    def state(self, submission_id: str) -> JobState | None:
        try:
            info = self.client().get_job_info(submission_id)
        except RuntimeError as e:
            if "404" in str(e) or "does not exist" in str(e):
                return None
            raise SubmitError(f"status of {submission_id}: {first_line(e)}") from None
        except (ConnectionError, OSError) as e:
            raise SubmitError(f"status of {submission_id}: {type(e).__name__}: {first_line(e)}") from None
        code = getattr(info, "driver_exit_code", None)
        message = (info.message or "").strip()
        return JobState(str(info.status.value), int(code) if code is not None else None,
                        message.splitlines()[0] if message else "")

    def status(self, submission_id: str) -> str | None:
        st = self.state(submission_id)
        return st.status if st is not None else None

    def active(self, metadata: Mapping[str, str]) -> int:
        """How many jobs whose metadata holds every item of ``metadata`` are pending or running."""
        try:
            jobs = self.client().list_jobs()
        except (RuntimeError, ConnectionError, OSError) as e:
            raise SubmitError(f"listing jobs: {type(e).__name__}: {first_line(e)}") from None
        return sum(1 for j in jobs if str(j.status.value) in ACTIVE_STATES
                   and all((j.metadata or {}).get(k) == v for k, v in metadata.items()))


__all__ = ["ACTIVE_STATES", "AlreadySubmitted", "SubmitError", "JobState", "Submitter", "job_state", "RaySubmitter"]
