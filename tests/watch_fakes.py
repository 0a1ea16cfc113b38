"""Test doubles shared by the watcher tests (tests/test_watch.py, tests/test_watch_hub.py)."""

from __future__ import annotations

import threading

from jobs.watch import ACTIVE_STATES, AlreadySubmitted, JobState


class Recorder:
    """Submissions kept in memory, refusing a repeated id like Ray's job manager does.

    ``jobs[sid]["status"]`` starts ``PENDING``; a test sets it (and ``exit_code``) to play the
    job's life."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def submit(self, sid, entrypoint, runtime_env, metadata, resources):
        with self.lock:
            if sid in self.jobs:
                raise AlreadySubmitted(sid)
            self.jobs[sid] = {"entrypoint": entrypoint, "env": runtime_env, "meta": metadata, "status": "PENDING",
                              "exit_code": None, "resources": resources}
        return sid

    def status(self, sid):
        job = self.jobs.get(sid)
        return job["status"] if job else None

    def state(self, sid):
        job = self.jobs.get(sid)
        return JobState(job["status"], job.get("exit_code")) if job else None

    def active(self, metadata):
        return sum(1 for j in self.jobs.values() if j["status"] in ACTIVE_STATES
                   and all(j["meta"].get(k) == v for k, v in metadata.items()))
