"""End to end against a loopback Hugging Face Hub (issue 12): a sweep over 12 tiny checkpoints
of four architectures (BERT, RoBERTa, DistilBERT masked LMs; GPT-2) under two authors, served by
``tests/hub_server.LoopbackHub`` and submitted with Ray's job client (what ``ray job submit`` and
the watcher use; ``Cluster.submit``) to a throw-away loopback Ray head
(``jobs.cluster.local_head``); the jobs reach the hub through ``HF_ENDPOINT`` with the real
``huggingface_hub`` client and Transformers.

One hub and one head serve the module's three tests:

* ``test_sweep_resume_branch_move_offline``: every task finished, each model loaded once by a
  small pool of workers, the commits recorded; a second submission runs nothing and loads
  nothing; a branch moved on the hub re-runs only that model's tasks, at the new commit; with
  ``HF_HUB_OFFLINE=1`` the same spec plans the same keys from the cache (no hub request), and a
  deleted result is re-run from the cached commit, the job saying which commit it used;
* ``test_transient_and_permanent_hub_faults``: 503 answers on a model's probe and weights are
  retried and its tasks finish; a missing and a gated repository fail with their one-line
  reason (and the commit the planner resolved), the rest finish;
* ``test_watchers_on_separate_stores_and_racing_watchers``: two processes of one watch (``audit
  watch --once`` and ``python -m jobs.watch --once``) on one store submit a new revision once,
  a watch on another store audits the same revision into its own store.

The metrics are kept small (SEAT on WEAT 7; CrowS-Pairs on 8 pairs): 2 min 49 s here at load
average 3, 3 min 48 s at load average 7 (2 CPUs).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml


sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_server import LoopbackHub, variant_files  # noqa: E402
from ray_jobs import wait_for_job  # noqa: E402

from audit.datasets.external import data_root  # noqa: E402
from audit.tiny_models import tiny_model_dir  # noqa: E402
from jobs.cluster import ray_env  # noqa: E402
from jobs.tracker import Tracker  # noqa: E402
from jobs.watch.index import AuditIndex  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = data_root()
CROWS = SHARED / "crows-pairs" / "crows_pairs_anonymized.csv"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not CROWS.is_file(), reason=f"reference data not found at {SHARED}")]

KINDS = ("bert", "roberta", "distilbert", "gpt2")
BACKEND = {"bert": "hf-mlm", "roberta": "hf-mlm", "distilbert": "hf-mlm", "gpt2": "hf-causal"}
#: 12 checkpoints: 3 of each kind, 6 by each of two authors; every model gets SEAT (on its hidden
#: states for GPT-2) and CrowS-Pairs: 12 * 2 = 24 tasks.
REPOS = [(f"{'acme' if i < 6 else 'umbrella'}/{KINDS[i % 4]}-{i}", KINDS[i % 4]) for i in range(12)]
N_TASKS = 24
SHA = re.compile(r"^[0-9a-f]{40}$")


class Cluster:
    """The module's hub, head and job environment."""

    def __init__(self, hub: LoopbackHub, address: str, root: Path, env: dict[str, str]):
        self.hub, self.address, self.root, self.env = hub, address, root, env

    def job_env(self, **extra: str) -> dict[str, str]:
        return {**self.env, **extra}

    def submit(self, spec: Path, log: str, *, offline: bool = False, args: tuple[str, ...] = ()) -> tuple[int, str]:
        """``python -m jobs.sweep SPEC`` submitted with the working directory, as ``ray job submit
        --working-dir .`` does, through the client that both it and the watcher use
        (:class:`ray.job_submission.JobSubmissionClient`); returns (exit status, output) as the
        command gives them: 1 for a failed job, its logs, then its status and Ray's message (``Job
        entrypoint command failed with exit code 1``). Not the command itself: its log tail sleeps
        a second at every end of the log, 8.7 s for a job that prints one line against 1.2 s here;
        ``test_sweep_e2e`` and ``test_docs_commands`` run ``ray job submit`` as written."""
        from ray.job_submission import JobStatus, JobSubmissionClient

        client = JobSubmissionClient(self.address)
        entrypoint = shlex.join(["python", "-m", "jobs.sweep", str(spec), "--no-progress", "--progress-interval", "10",
                                 *args])
        runtime_env = {"working_dir": str(REPO), "env_vars": self.job_env(HF_HUB_OFFLINE="1" if offline else "0")}
        job = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        status = wait_for_job(client, job, 400)
        info = client.get_job_info(job)
        text = f"{client.get_job_logs(job)}\nJob '{job}' {status.value.lower()}\nStatus message: {info.message}\n"
        (self.root / f"{log}.log").write_text(text, encoding="utf-8")
        return (0 if status == JobStatus.SUCCEEDED else 1), text


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, job_head):
    root = tmp_path_factory.mktemp("hub-e2e")
    hub = LoopbackHub()
    for i, (repo, kind) in enumerate(REPOS):
        hub.add_repo(repo, variant_files(tiny_model_dir(kind), seed=100 + i))
    hub.start()
    home = root / "hf-home"
    (home / "hub").mkdir(parents=True)
    env = {
        "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"),
        "HF_XET_CACHE": str(home / "xet"), "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "TOKENIZERS_PARALLELISM": "false", "BIASAUDIT_DATA": str(SHARED), "BIASAUDIT_CROWS_PAIRS": str(CROWS),
        "BIASAUDIT_HUB_RETRY_DELAY": "0.2", "BIASAUDIT_HUB_RETRIES": "3", "BIASAUDIT_HOME": str(root / "home"),
        # whatever the machine's environment says: no token, Transformers online, no other store
        "HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "", "HF_TOKEN_PATH": str(home / "token"),
        "TRANSFORMERS_OFFLINE": "0", "MLFLOW_TRACKING_URI": "",
    }
    try:
        yield Cluster(hub, job_head, root, env)  # the session's head (tests/conftest.py)
    finally:
        hub.stop()


def write_spec(path: Path, name: str, models: list[dict], out: Path, uri: str | None = None) -> Path:
    data = {
        "name": name, "seed": 0, "output_dir": str(out), "tracking": {"uri": uri or f"sqlite:///{out}/mlflow.db"},
        "languages": ["en"],
        "permutations": 200, "n_bootstrap": 50,
        "metrics": [{"name": "seat", "tests": ["weat7"]},
                    {"name": "crows_pairs", "params": {"limit": 8}, "tests": ["crows_pairs"]}],
        "models": models,
        # 2 workers on 2 CPUs: fewer processes importing torch at once than the pool's default 3; a whole CPU
        # per statistics task: fewer statistics worker processes (jobs/specs/smoke.yaml)
        "ray": {"actor_num_cpus": 0.5, "stats_num_cpus": 1, "batch_size": 4, "max_workers": 2,
                "pending_timeout_s": 300},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def model_entry(repo: str, kind: str) -> dict:
    return {"ref": repo, "name": repo.replace("/", "--"), "backend": BACKEND[kind], "revision": "main"}


def loads(out: Path) -> list[dict]:
    p = out / "loads.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


def weights_gets(hub: LoopbackHub, repo: str) -> int:
    return hub.count(rf"^/{re.escape(repo)}/resolve/[^/]+/model\.safetensors$", method="GET", status=200)


def by_model(runs) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in runs:
        out.setdefault(r.data.params["model"], []).append(r)
    return out


# --------------------------------------------------------------------------------------------
# the sweep: run, resume, branch move, offline
# --------------------------------------------------------------------------------------------


def test_sweep_resume_branch_move_offline(cluster):
    hub, root = cluster.hub, cluster.root
    out = root / "sweep"
    spec = write_spec(root / "hub-e2e.yaml", "hub-e2e", [model_entry(r, k) for r, k in REPOS], out)
    heads = {r: hub.head(r) for r, _ in REPOS}

    # 1. first submission: every task finishes, each model is loaded once by a few workers
    code, text = cluster.submit(spec, "job1")
    assert code == 0 and "succeeded" in text, text[-4000:]
    assert f"0 of {N_TASKS} tasks already finished, {N_TASKS} to run" in text
    first = loads(out)
    assert sorted(x["ref"] for x in first) == sorted(r for r, _ in REPOS)        # each model once
    pids = {x["pid"] for x in first}
    assert len(pids) < len(REPOS), pids                                         # workers reused
    assert f"models loaded: {len(REPOS)} by {len(pids)} worker process(es)" in text
    assert all(x["revision"] == heads[x["ref"]] for x in first)
    for repo, _ in REPOS:
        assert weights_gets(hub, repo) == 1, repo                              # downloaded once
    assert hub.count(r"/resolve/main/") == 0 and hub.unrouted == []            # files fetched by commit
    tr = Tracker(f"sqlite:///{out}/mlflow.db", "biasaudit-hub-e2e")
    runs = tr.task_runs()
    assert len(runs) == N_TASKS and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["audit.key"] for r in runs}) == N_TASKS
    for repo, kind in REPOS:
        mine = by_model(runs)[repo]
        assert len(mine) == 2, repo                                            # SEAT and CrowS-Pairs
        assert {r.data.params["revision"] for r in mine} == {heads[repo]}       # the commit, never "main"
        assert all("value" in r.data.metrics for r in mine)
        # where the numbers came from: the CPU (no GPU here) in float32, the default
        assert {(r.data.tags.get("audit.device"), r.data.tags.get("audit.dtype")) for r in mine} == {("cpu", "float32")}
    metrics = sorted({r.data.tags["audit.metric"] for r in runs})
    assert metrics == ["crows_pairs", "crows_pairs_causal", "seat"]
    keys1 = {r.data.tags["audit.key"]: r for r in runs}

    # 2. resume: nothing run, nothing loaded, no file downloaded
    n_req = len(hub.requests)
    code, text = cluster.submit(spec, "job2")
    assert code == 0 and "succeeded" in text, text[-4000:]
    assert f"{N_TASKS} of {N_TASKS} tasks already finished, 0 to run" in text
    assert "models loaded: 0" in text and loads(out) == first
    assert len(tr.task_runs()) == N_TASKS
    assert not [r for r in hub.requests[n_req:] if "/resolve/" in r.path]

    # 3. a branch moves on the hub: only that model's tasks run again, at the new commit
    moved, kind = "umbrella/roberta-9", "roberta"
    c2 = hub.commit(moved, {"model.safetensors": variant_files(tiny_model_dir(kind), seed=999)["model.safetensors"]},
                    message="retrained")
    assert c2 != heads[moved]
    code, text = cluster.submit(spec, "job3")
    assert code == 0 and "succeeded" in text, text[-4000:]
    assert f"{N_TASKS - 2} of {N_TASKS} tasks already finished, 2 to run" in text
    new = loads(out)[len(first):]
    assert [(x["ref"], x["revision"]) for x in new] == [(moved, c2)]
    runs3 = tr.task_runs()
    assert len(runs3) == N_TASKS + 2
    mine = by_model(runs3)[moved]
    assert sorted(r.data.params["revision"] for r in mine) == sorted([heads[moved], c2] * 2)
    assert {r.info.status for r in mine} == {"FINISHED"}
    for r in runs3:  # the other models' runs are the first submission's
        if r.data.params["model"] != moved:
            assert r.data.tags["audit.key"] in keys1
    parent = tr.sweep_runs()[0]
    assert parent.data.metrics["tasks"] == N_TASKS and parent.data.metrics["child_runs"] == N_TASKS + 2
    assert parent.data.metrics["child_runs_superseded"] == 2 and parent.data.metrics["tasks_finished"] == N_TASKS

    # 4. offline: the same spec plans the same keys from the cache (no hub request at all); a
    #    result deleted by hand is re-run from the cached commit of the branch, and the job says so
    lost = next(r for r in mine if r.data.params["revision"] == c2 and r.data.tags["audit.metric"] == "crows_pairs")
    tr.client.delete_run(lost.info.run_id)
    n_req = len(hub.requests)
    code, text = cluster.submit(spec, "job4", offline=True)
    assert code == 0 and "succeeded" in text, text[-4000:]
    assert len(hub.requests) == n_req, [r.path for r in hub.requests[n_req:]]
    assert f"{N_TASKS - 1} of {N_TASKS} tasks already finished, 1 to run" in text
    assert f"offline: main resolved to {c2} from the cache" in text
    again = [r for r in tr.task_runs() if r.data.tags["audit.key"] == lost.data.tags["audit.key"]]
    assert len(again) == 1 and again[0].info.run_id != lost.info.run_id and again[0].info.status == "FINISHED"
    assert again[0].data.params["revision"] == c2
    assert again[0].data.metrics["value"] == pytest.approx(lost.data.metrics["value"], abs=1e-9)
    assert [(x["ref"], x["revision"]) for x in loads(out)[len(first) + 1:]] == [(moved, c2)]


# --------------------------------------------------------------------------------------------
# faults
# --------------------------------------------------------------------------------------------


def test_transient_and_permanent_hub_faults(cluster):
    """A model whose probe answers 503 once and whose weights answer 503 twice is retried and
    finishes; a missing repository (the hub answers 401 RepoNotFound without a token, as
    huggingface.co does) and a gated one (metadata visible, files 401 GatedRepo) fail their
    tasks with one line each saying what to do, recorded with the revision the planner resolved;
    the summary lists each distinct failure once; the exit status is 1."""
    hub, root = cluster.hub, cluster.root
    hub.add_repo("acme/flaky-bert", variant_files(tiny_model_dir("bert"), seed=300))
    hub.add_repo("umbrella/gated-gpt2", variant_files(tiny_model_dir("gpt2"), seed=301), gated=True)
    probe = hub.fail(r"^/api/models/acme/flaky-bert/revision/main$", 503, times=1)
    weights = hub.fail(r"^/acme/flaky-bert/resolve/[0-9a-f]{40}/model\.safetensors$", 503, times=2, method="GET")
    out = root / "faults"
    spec = write_spec(root / "hub-faults.yaml", "hub-faults",
                      [model_entry("acme/flaky-bert", "bert"), model_entry("acme/no-such-model", "bert"),
                       model_entry("umbrella/gated-gpt2", "gpt2")], out)
    code, text = cluster.submit(spec, "faults")
    assert code != 0 and "exit code 1" in text, text[-4000:]
    assert probe.hits == 1 and weights.hits == 2
    assert weights_gets(hub, "acme/flaky-bert") == 1 and weights_gets(hub, "umbrella/gated-gpt2") == 0
    runs = by_model(Tracker(f"sqlite:///{out}/mlflow.db", "biasaudit-hub-faults").task_runs())
    flaky = runs["acme/flaky-bert"]
    assert len(flaky) == 2 and {r.info.status for r in flaky} == {"FINISHED"}
    assert {r.data.params["revision"] for r in flaky} == {hub.head("acme/flaky-bert")}
    endpoint = hub.endpoint
    missing = (f"repository 'acme/no-such-model' not found on {endpoint}, or private (HTTP 401, no token sent); "
               "check the id, or set HF_TOKEN to a token that can read it")
    gated = (f"is gated (HTTP 401): log in at {endpoint}/umbrella/gated-gpt2, accept its licence on the model "
             "page, then set HF_TOKEN to a token of that account")
    for repo, line, n in (("acme/no-such-model", missing, 2), ("umbrella/gated-gpt2", gated, 2)):
        failed = runs[repo]
        assert len(failed) == n and {r.info.status for r in failed} == {"FAILED"}
        for r in failed:
            error = r.data.tags["audit.error"]
            assert line in error and "\n" not in error, error
    # the gated model's probe got its commit (metadata is public): recorded with the failed load
    assert {r.data.params["revision"] for r in runs["umbrella/gated-gpt2"]} == {hub.head("umbrella/gated-gpt2")}
    assert "4 failed task(s), 2 distinct failure(s):" in text
    summary = text.split("4 failed task(s), 2 distinct failure(s):", 1)[1].splitlines()[1:3]
    assert summary[0].startswith("  acme--no-such-model: 2 tasks (") and missing in summary[0], summary
    assert summary[1].startswith("  umbrella--gated-gpt2: 2 tasks (") and gated in summary[1], summary
    # the retries were said in the job's log
    assert "model 'acme/flaky-bert': hub: HTTP 503 (retry 1 of 3 in 0.20 s)" in text
    assert "model 'acme/flaky-bert': download: HTTP 503 (retry 2 of 3 in 0.40 s)" in text


# --------------------------------------------------------------------------------------------
# watchers
# --------------------------------------------------------------------------------------------


def write_watch(cluster: Cluster, name: str, template: Path, uri: str | None = None,
                repo: str = "umbrella/gpt2-7") -> Path:
    out = cluster.root / name
    data = {
        "name": "hub-e2e-watch", "output_dir": str(out), "tracking": {"uri": uri or f"sqlite:///{out}/mlflow.db"},
        "backoff": {"initial": 0.5, "factor": 2, "max": 5, "retries": 2, "jitter": 0},
        "hub": {"endpoint": cluster.hub.endpoint},
        "ray": {"address": cluster.address, "entrypoint_num_cpus": 0,
                "runtime_env": {"working_dir": str(REPO), "env_vars": cluster.job_env(HF_HUB_OFFLINE="0")}},
        "audit": {"spec": str(template), "model": {"languages": ["en"]},
                  "overrides": {"metrics": [{"name": "crows_pairs", "params": {"limit": 8},
                                             "tests": ["crows_pairs"]}]}},
        "watch": [{"repo": repo, "model": {"backend": "hf-causal"}}],
    }
    path = cluster.root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_watchers_on_separate_stores_and_racing_watchers(cluster):
    """A new commit on the hub; at the same moment, two processes of watch A (``audit watch
    --once`` and ``python -m jobs.watch --once``) and one of watch B, which writes to another
    store: A submits the audit once (the other process is told it is already submitted or in
    progress), B audits the same revision into its own store; both jobs finish."""
    from ray.job_submission import JobSubmissionClient

    hub, root = cluster.hub, cluster.root
    weights = variant_files(tiny_model_dir("gpt2"), seed=777)["model.safetensors"]
    new = hub.commit("umbrella/gpt2-7", {"model.safetensors": weights}, message="new release")
    template = write_spec(root / "watch-template.yaml", "template", [model_entry("umbrella/gpt2-7", "gpt2")],
                          root / "unused")
    a, b = write_watch(cluster, "watch-a", template), write_watch(cluster, "watch-b", template)
    env = ray_env({**cluster.job_env(HF_HUB_OFFLINE="0"), "PYTHONPATH": str(REPO)})
    audit = str(Path(sys.executable).parent / "audit")
    cmds = {"a1": [audit, "watch", str(a), "--once"], "a2": [sys.executable, "-m", "jobs.watch", str(a), "--once"],
            "b": [audit, "watch", str(b), "--once"]}
    client = JobSubmissionClient(cluster.address)
    jobs_before = {j.submission_id for j in client.list_jobs()}  # the session's head ran other jobs before
    procs = {k: subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k, c in cmds.items()}
    outs = {k: p.communicate(timeout=180)[0] for k, p in procs.items()}
    for k, p in procs.items():
        (root / f"watch-{k}.log").write_text(outs[k], encoding="utf-8")
        assert p.returncode == 0, (k, outs[k][-3000:])

    def decisions(name: str) -> list[dict]:
        return [json.loads(x) for x in (root / name / "decisions.jsonl").read_text().splitlines()]

    da, db = decisions("watch-a"), decisions("watch-b")
    sub_a = [d for d in da if d["action"] == "submitted"]
    sub_b = [d for d in db if d["action"] == "submitted"]
    assert len(sub_a) == 1 and len(sub_b) == 1, (outs["a1"], outs["a2"], outs["b"])
    assert sub_a[0]["revision"] == sub_b[0]["revision"] == new
    other = [d for d in da if d["action"] == "skipped"]
    assert len(other) == 1 and other[0]["pid"] != sub_a[0]["pid"], da
    assert (other[0]["reason"].startswith(f"already submitted as {sub_a[0]['submission_id']}")
            or other[0]["reason"].startswith("in progress")), other
    assert sub_a[0]["submission_id"] != sub_b[0]["submission_id"]

    ids = [sub_a[0]["submission_id"], sub_b[0]["submission_id"]]
    watch_jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("biasaudit.watch")]
    assert sorted(j.submission_id for j in watch_jobs if j.submission_id not in jobs_before) == sorted(ids)
    deadline = time.monotonic() + 240  # for both jobs
    for sid in ids:
        st = wait_for_job(client, sid, deadline - time.monotonic()).value
        assert st == "SUCCEEDED", client.get_job_logs(sid)[-3000:]
    for name in ("watch-a", "watch-b"):
        index = AuditIndex.load(f"sqlite:///{root / name}/mlflow.db", "biasaudit-watch-hub-e2e-watch")
        assert index.finished_revisions("umbrella/gpt2-7") == {new: 1}, name


# --------------------------------------------------------------------------------------------
# the same on the store a team deploys: an MLflow server backed by PostgreSQL
# --------------------------------------------------------------------------------------------


def test_sweep_and_watch_on_a_postgresql_tracking_server(cluster, pg_mlflow):
    """The sweep and the watcher of the tests above, writing to an MLflow tracking server backed
    by PostgreSQL (``pg_mlflow``) instead of the embedded SQLite file: one model of each kind is
    audited, every key FINISHED exactly once on the server; a second submission resumes from the
    server (nothing run, nothing downloaded); a ``audit watch --once`` on that server submits a new
    hub revision once, a second one skips it, and the job's results land on the server."""
    from ray.job_submission import JobSubmissionClient

    hub, root, uri = cluster.hub, cluster.root, pg_mlflow["uri"]
    repos = [(f"pg/{k}-{i}", k) for i, k in enumerate(KINDS)]
    for i, (repo, kind) in enumerate(repos):
        hub.add_repo(repo, variant_files(tiny_model_dir(kind), seed=500 + i))
    out = root / "pg-sweep"
    spec = write_spec(root / "hub-pg.yaml", "hub-pg", [model_entry(r, k) for r, k in repos], out, uri=uri)
    n = 2 * len(repos)
    code, text = cluster.submit(spec, "pg-job1")
    assert code == 0 and "succeeded" in text, text[-4000:]
    assert f"0 of {n} tasks already finished, {n} to run" in text
    assert not (out / "mlflow.db").exists()                                     # nothing on the local file
    tr = Tracker(uri, "biasaudit-hub-pg")
    runs = tr.task_runs()
    assert len(runs) == n and {r.info.status for r in runs} == {"FINISHED"}
    assert len({r.data.tags["audit.key"] for r in runs}) == n
    assert {r.data.params["model"]: r.data.params["revision"] for r in runs} == {r: hub.head(r) for r, _ in repos}
    assert all(np.isfinite(r.data.metrics["value"]) for r in runs)
    [parent] = tr.sweep_runs()
    assert parent.data.metrics["tasks_run_total"] == n

    n_req = len(hub.requests)
    code, text = cluster.submit(spec, "pg-job2")
    assert code == 0 and "succeeded" in text, text[-4000:]
    assert f"{n} of {n} tasks already finished, 0 to run" in text and "models loaded: 0" in text
    assert not [r for r in hub.requests[n_req:] if "/resolve/" in r.path]
    assert len(tr.task_runs()) == n
    [parent] = tr.sweep_runs()
    assert int(parent.data.tags["audit.invocations"]) == 2 and parent.data.metrics["tasks_run_total"] == n

    # the watcher on the same server: a new revision is submitted once, the audit lands there
    watched = repos[3][0]                                                       # pg/gpt2-3
    new = hub.commit(watched, {"model.safetensors": variant_files(tiny_model_dir("gpt2"), seed=888)[
        "model.safetensors"]}, message="new release")
    template = write_spec(root / "pg-watch-template.yaml", "template", [model_entry(watched, "gpt2")], root / "unused")
    w = write_watch(cluster, "pg-watch", template, uri=uri, repo=watched)
    env = ray_env({**cluster.job_env(HF_HUB_OFFLINE="0"), "PYTHONPATH": str(REPO)})
    audit = str(Path(sys.executable).parent / "audit")
    first = subprocess.run([audit, "watch", str(w), "--once"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=180)
    second = subprocess.run([audit, "watch", str(w), "--once"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=180)
    assert first.returncode == 0 and second.returncode == 0, first.stdout + first.stderr + second.stdout
    log = [json.loads(x) for x in (root / "pg-watch" / "decisions.jsonl").read_text().splitlines()]
    sub = [d for d in log if d["action"] == "submitted"]
    assert len(sub) == 1 and sub[0]["revision"] == new, log
    skipped = [d for d in log if d["action"] == "skipped"]
    assert len(skipped) == 1 and (skipped[0]["reason"].startswith("already submitted as ")
                                  or skipped[0]["reason"].startswith("in progress")), skipped
    assert not (root / "pg-watch" / "mlflow.db").exists()
    client = JobSubmissionClient(cluster.address)
    sid = sub[0]["submission_id"]
    st = wait_for_job(client, sid, 240).value
    assert st == "SUCCEEDED", client.get_job_logs(sid)[-3000:]
    index = AuditIndex.load(uri, "biasaudit-watch-hub-e2e-watch")
    assert index.finished_revisions(watched) == {new: 1}
