"""Test doubles shared by the watcher tests (tests/test_watch.py, tests/test_watch_hub.py)."""

from __future__ import annotations

import http.server
import json
import threading

from hub_server import serve_in_thread
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


class Receiver:
    """A loopback HTTP server that keeps the JSON bodies POSTed to it."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append({"path": self.path, "type": self.headers.get("Content-Type"),
                                     "json": json.loads(self.rfile.read(n).decode("utf-8"))})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/bias"
        self.thread = serve_in_thread(self.server)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class InlineSubmitter(Recorder):
    """Runs each submitted sweep at once, in this process, on the local Ray: the job's
    entrypoint (``--run-spec-env``) without the job API."""

    def __init__(self):
        super().__init__()
        self.outcomes = {}

    def submit(self, sid, entrypoint, runtime_env, metadata, resources):
        super().submit(sid, entrypoint, runtime_env, metadata, resources)
        from jobs.spec import parse_spec
        from jobs.sweep import run_sweep
        from jobs.validators import parse_yaml

        text = runtime_env["env_vars"]["BIASAUDIT_SWEEP_SPEC"]
        spec = parse_spec(parse_yaml(text, "$BIASAUDIT_SWEEP_SPEC"), source="$BIASAUDIT_SWEEP_SPEC")
        out = run_sweep(spec, progress=False)
        self.outcomes[sid] = out
        self.jobs[sid].update(status="SUCCEEDED" if out.exit_code == 0 else "FAILED", exit_code=out.exit_code)
        return sid
