"""The watcher's hub path: ``huggingface_hub``'s real client against a hub on 127.0.0.1.

A ``http.server`` in a thread answers the endpoints the watcher uses, with the JSON shapes of
``huggingface_hub.hf_api`` (``ModelInfo``, ``GitCommitInfo``) and its error headers
(``X-Error-Code: RepoNotFound``):

    GET /api/models/<org>/<name>                      model_info(repo)
    GET /api/models/<org>/<name>/revision/<rev>       model_info(repo, revision=rev)
    GET /api/models?author=<a>&search=<s>&limit=<n>   list_models(author=, search=, limit=)
    GET /api/models/<org>/<name>/commits/<rev>        list_repo_commits(repo, revision=rev)

``HF_ENDPOINT`` points at it and ``HF_HUB_OFFLINE`` is lifted inside these tests only. Sweeps are
"submitted" to a recorder with Ray's "already exists" rule (tests/test_watch.py submits to a real
Ray head).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml


from jobs.watch import Watcher, load_watch_spec, submission_id  # noqa: E402
from hub_server import serve_in_thread  # noqa: E402
from watch_fakes import Recorder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

C1 = "1" * 40
C2 = "2" * 40
C3 = "3" * 40
G1 = "a" * 40


class FakeHub:
    """The state of the loopback hub: repositories, their commits (newest first), failures."""

    def __init__(self):
        self.repos = {
            "acme/bert-tiny": {"commits": [C2, C1], "config": {"architectures": ["BertForMaskedLM"]},
                               "pipeline_tag": "fill-mask"},
            "acme/gpt-tiny": {"commits": [G1], "config": {"architectures": ["GPT2LMHeadModel"]},
                              "pipeline_tag": "text-generation"},
            "other/bert-tiny": {"commits": [C1], "config": {"architectures": ["BertModel"]}},
        }
        self.fail: dict[str, int] = {}   # repo -> number of 503 answers still to give
        self.requests: list[str] = []
        self.lock = threading.Lock()

    def info(self, repo: str) -> dict:
        r = self.repos[repo]
        return {"id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": r["commits"][0],
                "lastModified": "2025-07-01T12:00:00.000Z", "private": False, "tags": [],
                "pipeline_tag": r.get("pipeline_tag"), "config": r["config"], "siblings": [{"rfilename": "config.json"}]}


def make_handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, code: int, body, headers: dict | None = None):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            with hub.lock:
                hub.requests.append(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
            if parts[:2] != ["api", "models"]:
                return self._send(404, {"error": "not found"})
            if len(parts) == 2:  # list_models
                q = urllib.parse.parse_qs(url.query)
                author = q.get("author", [""])[0]
                search = q.get("search", [""])[0]
                limit = int(q.get("limit", ["1000"])[0])
                ids = [r for r in sorted(hub.repos) if r.split("/")[0] == author and search in r.split("/")[1]]
                return self._send(200, [{"id": r, "modelId": r, "private": False} for r in ids[:limit]])
            repo = "/".join(parts[2:4])
            if repo not in hub.repos:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            with hub.lock:
                if hub.fail.get(repo, 0) > 0:
                    hub.fail[repo] -= 1
                    return self._send(503, {"error": "Service Unavailable"})
            rest = parts[4:]
            commits = hub.repos[repo]["commits"]
            if not rest or (rest[0] == "revision" and len(rest) == 2):
                if rest and rest[1] not in ("main", *commits):
                    return self._send(404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"})
                return self._send(200, hub.info(repo))
            if rest[0] == "commits" and len(rest) == 2:
                return self._send(200, [{"id": c, "title": f"commit {c[:7]}", "message": "", "date": f"2025-07-0{9 - i}T00:00:00.000Z",
                                         "authors": [{"user": "someone"}]} for i, c in enumerate(commits)])
            return self._send(404, {"error": "not found"})

    return Handler


@pytest.fixture
def hub(monkeypatch):
    """A loopback hub; HF_ENDPOINT points at it, offline mode lifted for this test only."""
    from huggingface_hub import constants

    state = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = serve_in_thread(server)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    state.endpoint = endpoint
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def write_spec(tmp_path: Path, watch: list, **extra) -> Path:
    data = {
        "name": "hubwatch",
        "output_dir": str(tmp_path / "watch"),
        "backoff": {"initial": 0.5, "factor": 2, "max": 30, "retries": 2, "jitter": 0},
        "audit": {"spec": str(REPO / "jobs" / "specs" / "hub-example.yaml"),
                  "overrides": {"languages": ["en"], "tests": ["weat7"], "metrics": ["seat"]},
                  "model": {"languages": ["en"]}},
        "watch": watch,
        **extra,
    }
    p = tmp_path / "watch.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


def generated(decision) -> dict:
    return yaml.safe_load(Path(decision.spec_path).read_text(encoding="utf-8"))


@pytest.mark.unit
def test_hub_new_commit_is_submitted_once(tmp_path, hub):
    spec = load_watch_spec(write_spec(tmp_path, [{"repo": "acme/bert-tiny"}, {"author": "acme", "search": "tiny"}]))
    rec, sleeps = Recorder(), []
    w = Watcher(spec, submitter=rec, sleep=sleeps.append, out=None)

    r1 = w.poll()
    assert r1.exit_code == 0 and sleeps == []
    # the exact id and the author listing both lead to acme/bert-tiny@C2: one job; gpt-tiny@G1: one job
    subs = r1.submitted
    assert sorted((d.repo, d.revision) for d in subs) == [("acme/bert-tiny", C2), ("acme/gpt-tiny", G1)]
    assert len(rec.jobs) == 2
    dup = [d for d in r1.decisions if d.action == "skipped"]
    assert len(dup) == 1 and dup[0].repo == "acme/bert-tiny" and "already submitted" in dup[0].reason
    # the real client's requests: model_info at the followed branch, the listing with its filters
    assert "/api/models/acme/bert-tiny/revision/main" in hub.requests
    listing = [urllib.parse.urlsplit(p) for p in hub.requests if urllib.parse.urlsplit(p).path == "/api/models"]
    assert len(listing) == 1 and urllib.parse.parse_qs(listing[0].query) == {"author": ["acme"], "search": ["tiny"], "limit": ["50"]}
    # the generated sweep pins the commit; the backend comes from the hub's config
    bert = next(d for d in subs if d.repo == "acme/bert-tiny")
    g = generated(bert)
    assert g["models"] == [{"ref": "acme/bert-tiny", "name": "acme--bert-tiny", "languages": ["en"],
                            "backend": "hf-mlm", "revision": C2}]
    assert generated(next(d for d in subs if d.repo == "acme/gpt-tiny"))["models"][0]["backend"] == "hf-causal"
    assert g["tracking"]["experiment"] == "biasaudit-watch-hubwatch" and g["metrics"] == ["seat"]
    job = rec.jobs[bert.submission_id]
    assert job["meta"]["biasaudit.revision"] == C2 and yaml.safe_load(job["env"]["env_vars"]["BIASAUDIT_SWEEP_SPEC"]) == g
    assert bert.submission_id == submission_id("hub", "acme/bert-tiny", C2, _digest_of(bert), scope=spec.scope)

    # a re-run submits nothing new
    r2 = w.poll()
    assert r2.submitted == [] and len(rec.jobs) == 2 and r2.exit_code == 0

    # a new commit on main: exactly one new job, for that commit
    hub.repos["acme/bert-tiny"]["commits"].insert(0, C3)
    r3 = Watcher(spec, submitter=rec, sleep=sleeps.append, out=None).poll()
    assert [(d.repo, d.revision) for d in r3.submitted] == [("acme/bert-tiny", C3)]
    assert len(rec.jobs) == 3
    lines = [json.loads(x) for x in (tmp_path / "watch" / "decisions.jsonl").read_text().splitlines()]
    assert [x["revision"] for x in lines if x["action"] == "submitted"] == [C2, G1, C3]
    assert {x["watch"] for x in lines} == {"hubwatch"} and len({x["poll"] for x in lines}) == 3


def _digest_of(decision) -> str:
    text = Path(decision.spec_path).read_text(encoding="utf-8")
    return text.split("spec digest ", 1)[1].split(".", 1)[0]


@pytest.mark.unit
def test_hub_errors_are_retried_with_backoff_and_reported(tmp_path, hub):
    hub.repos["acme/flaky"] = {"commits": [C1], "config": {"architectures": ["BertForMaskedLM"]}}
    hub.repos["acme/down"] = {"commits": [C2], "config": {"architectures": ["BertForMaskedLM"]}}
    hub.fail = {"acme/flaky": 2, "acme/down": 10**6}
    spec = load_watch_spec(write_spec(tmp_path, ["acme/flaky", "acme/down", "acme/missing", "acme/gpt-tiny"]))
    rec, sleeps = Recorder(), []
    report = Watcher(spec, submitter=rec, sleep=sleeps.append, out=None).poll()

    # flaky: two 503s, retried after 0.5 s and 1.0 s, then submitted
    retries = [d for d in report.decisions if d.action == "retry"]
    assert [(d.repo, d.delay) for d in retries] == [("acme/flaky", 0.5), ("acme/flaky", 1.0),
                                                    ("acme/down", 0.5), ("acme/down", 1.0)]
    assert sleeps == [0.5, 1.0, 0.5, 1.0]
    assert "HTTP 503" in retries[0].reason and "retry 1 of 2" in retries[0].reason
    assert sorted(d.repo for d in report.submitted) == ["acme/flaky", "acme/gpt-tiny"]
    # down: given up after 2 retries; missing: not retried (404 is not transient); both reported
    errors = {d.repo: d.reason for d in report.errors}
    assert set(errors) == {"acme/down", "acme/missing"}
    assert "HTTP 503" in errors["acme/down"]
    assert "repository not found" in errors["acme/missing"] and "'acme/missing'" in errors["acme/missing"]
    assert sum(p.startswith("/api/models/acme/missing") for p in hub.requests) == 1
    assert sum(p.startswith("/api/models/acme/down") for p in hub.requests) == 3
    assert report.exit_code == 1


@pytest.mark.unit
def test_hub_history_uses_the_commit_list(tmp_path, hub):
    spec = load_watch_spec(write_spec(tmp_path, [{"repo": "acme/bert-tiny", "revisions": 2, "model": {"backend": "hf-encoder"}}]))
    rec = Recorder()
    report = Watcher(spec, submitter=rec, sleep=lambda s: None, out=None).poll()
    assert [d.revision for d in report.submitted] == [C2, C1]
    assert "/api/models/acme/bert-tiny/commits/main" in hub.requests
    assert {generated(d)["models"][0]["backend"] for d in report.submitted} == {"hf-encoder"}  # the spec's wins
    assert len({d.submission_id for d in report.submitted}) == 2


@pytest.mark.unit
def test_hub_offline_mode_is_a_clear_error(tmp_path, hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    spec = load_watch_spec(write_spec(tmp_path, ["acme/bert-tiny"]))
    report = Watcher(spec, submitter=Recorder(), sleep=lambda s: None, out=None).poll()
    assert report.exit_code == 1 and "HF_HUB_OFFLINE is set" in report.errors[0].reason
    assert hub.requests == []


@pytest.mark.e2e
def test_cli_dry_run_against_the_loopback_hub(tmp_path, hub):
    """``python -m jobs.watch --once --dry-run`` in a fresh process reads HF_ENDPOINT itself."""
    p = write_spec(tmp_path, [{"author": "acme", "search": "bert"}])
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env["HF_ENDPOINT"] = hub.endpoint
    r = subprocess.run([sys.executable, "-m", "jobs.watch", str(p), "--once", "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"dry_run   acme/bert-tiny@{C2[:19]}" in r.stdout and "new revision; would submit (attempt 1)" in r.stdout
    assert "1 revision(s) seen: 0 submitted, 0 skipped, 1 to submit (dry run), 0 error(s)" in r.stdout
    specs = list((tmp_path / "watch" / "specs").glob("*.yaml"))
    assert len(specs) == 1 and specs[0].name.startswith("hubwatch-acme--bert-tiny-222222222222-")
