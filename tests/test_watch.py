"""The release watcher on a local source: spec validation, identities, back-off, decisions from
the MLflow store, and a real Ray head (two watchers racing, a real sweep, a re-run).

The local models are tiny word2vec-text files (``vectors.vec``, 8 dimensions, the words of
WEAT 1) in ``<root>/<model>/<revision>/`` folders, written by the tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from audit.errors import DataError, ParameterError
from jobs import watch as W
from jobs.watch import (AuditIndex, Backoff, LocalSource, SourceUnavailable, Watcher,
                        generate_sweep, load_watch_spec, spec_digest, submission_id)
from ray_jobs import wait_for_job  # noqa: E402
from watch_fakes import Receiver, Recorder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def weat1_words() -> list[str]:
    from audit.runner import load_test

    t = load_test("weat1")
    return sorted({w for s in (*t.targets, *t.attributes) for w in s.words})


def write_vectors(folder: Path, seed: int, mtime: float | None = None) -> Path:
    """A word2vec text file with the WEAT 1 words (random 8-d vectors) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    words = weat1_words()
    rng = np.random.default_rng(seed)
    lines = [f"{len(words)} 8"] + [w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=8)) for w in words]
    p = folder / "vectors.vec"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if mtime is not None:
        os.utime(p, (mtime, mtime))
        os.utime(folder, (mtime, mtime))
    return p


def local_models(tmp_path: Path) -> Path:
    """A folder of local models holding ``tiny/v1/vectors.vec``, written an hour ago (settled)."""
    root = tmp_path / "models"
    write_vectors(root / "tiny" / "v1", 0, mtime=time.time() - 3600)
    return root


def json_hook(tmp_path: Path) -> tuple[str, Path]:
    """A notification command appending each JSON it reads on stdin to a file: (command, file)."""
    out = tmp_path / "hook.jsonl"
    hook = tmp_path / "hook.py"
    hook.write_text("import json, sys\n"
                    f"open({str(out)!r}, 'a').write(json.dumps(json.load(sys.stdin)) + '\\n')\n", encoding="utf-8")
    return f"{sys.executable} {hook}", out


def write_watch(tmp_path: Path, watch: list, name: str = "w", **extra) -> Path:
    data = {
        "name": name,
        "output_dir": str(tmp_path / "watch"),
        "backoff": {"initial": 0.5, "factor": 2, "max": 30, "retries": 2, "jitter": 0},
        "audit": {"spec": "jobs/specs/smoke.yaml",
                  "overrides": {"tests": ["weat1"], "metrics": ["weat"], "permutations": 200, "n_bootstrap": 0,
                                "ray": {"num_cpus": 1, "actor_num_cpus": 0.25, "stats_num_cpus": 0.75}},
                  "model": {"languages": ["en"]}},
        "watch": watch,
        **extra,
    }
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


def decisions(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "watch" / "decisions.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # templates are relative to the current directory, like sweep specs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store: <output_dir>/mlflow.db


# --------------------------------------------------------------------------------------
# the watch spec
# --------------------------------------------------------------------------------------


BAD_SPECS = [
    ({"watch": None}, DataError, "watch: missing required field"),
    ({"watch": [{"repo": "a/b", "author": "c"}]}, DataError, "watch[0]: give exactly one of repo, author, local"),
    ({"watch": [{"repo": "bad id!"}]}, ParameterError, "watch[0].repo: 'bad id!' is not a hub repository id"),
    ({"watch": [{"local": "/x", "branch": "main"}]}, ParameterError, "watch[0].branch: applies to hub entries only"),
    ({"watch": [{"repo": "a/b", "layout": "digest"}]}, ParameterError, "watch[0].layout: applies to `local` entries only"),
    ({"watch": [{"local": "/x", "layout": "flat"}]}, ParameterError, "watch[0].layout: unknown layout 'flat'"),
    ({"watch": [{"repo": "a/b", "model": {"revision": "x"}}]}, ParameterError, "watch[0].model.revision: is set by the watcher"),
    ({"backoff": {"jiter": 0.1}}, DataError, "backoff.jiter: unknown field (did you mean 'jitter'?)"),
    ({"backoff": {"jitter": 1.5}}, ParameterError, "backoff.jitter: must be < 1"),
    ({"interval": 0}, ParameterError, "interval: must be > 0, got 0"),
    ({"interval": float("inf")}, DataError, "interval: expected a finite number, got inf"),
    ({"backoff": {"max": float("nan")}}, DataError, "backoff.max: expected a finite number, got nan"),
    ({"ray": {"max_jobs": 0}}, ParameterError, "ray.max_jobs: must be >= 1, got 0"),
    ({"ray": {"entrypoint_num_cpus": -1}}, ParameterError, "ray.entrypoint_num_cpus: must be >= 0, got -1"),
    ({"max_attempts": 0}, ParameterError, "max_attempts: must be >= 1, got 0"),
    ({"tracking": {"uri": "file:///tmp/x"}}, ParameterError, "tracking.uri: 'file:///tmp/x': use sqlite:///"),
    ({"ray": {"runtime_env": {"env_vars": {"BIASAUDIT_SWEEP_SPEC": "x"}}}}, ParameterError,
     "ray.runtime_env.env_vars.BIASAUDIT_SWEEP_SPEC: is set by the watcher"),
    ({"audit": None}, DataError, "watch[0].audit: no audit to run"),
    ({"nmae": "x"}, DataError, "nmae: unknown field (did you mean 'name'?)"),
]


@pytest.mark.unit
@pytest.mark.parametrize("change,cls,msg", BAD_SPECS, ids=[m.split(":")[0] for _, _, m in BAD_SPECS])
def test_watch_spec_errors_name_the_file_and_field(tmp_path, change, cls, msg):
    base = {"name": "w", "audit": {"spec": "jobs/specs/smoke.yaml"}, "watch": ["org/model"]}
    for k, v in change.items():
        if v is None:
            base.pop(k, None)
        else:
            base[k] = v
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(base), encoding="utf-8")
    with pytest.raises(cls) as e:
        load_watch_spec(p)
    assert str(e.value).startswith(f"{p}: ") and msg in str(e.value)


@pytest.mark.unit
def test_cli_reports_a_bad_spec_in_one_line(tmp_path, capsys):
    p = tmp_path / "bad.yaml"
    p.write_text("name: w\nwatch: [org/model]\naudit: {spec: jobs/specs/smoke.yaml}\nintervall: 5\n", encoding="utf-8")
    assert W.main([str(p), "--once"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"audit: error: {p}: intervall: unknown field (did you mean 'interval'?); allowed fields: " \
                  "audit, backoff, description, hub, interval, max_attempts, name, notify, output_dir, ray, regression, " \
                  "sweep_output_dir, " \
                  "tracking, watch"


@pytest.mark.unit
def test_shipped_watch_examples_parse(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    hub = load_watch_spec(REPO / "jobs" / "specs" / "watch-example.yaml")
    assert [e.describe() for e in hub.entries] == [
        "repo google-bert/bert-base-uncased", "repo FacebookAI/roberta-base",
        "author distilbert search 'base-uncased'", "repo openai-community/gpt2"]
    assert hub.ray.address == "http://127.0.0.1:8265" and hub.tracking_uri is None
    assert hub.backoff == Backoff(initial=5, factor=2, max=300, retries=4, jitter=0.2, seed=0, max_interval=86400)
    monkeypatch.setenv("BIASAUDIT_MODELS", str(tmp_path))
    local = load_watch_spec(REPO / "jobs" / "specs" / "watch-local-example.yaml")
    assert local.entries[0].kind == "local" and local.entries[0].target == str(tmp_path) and local.entries[0].settle == 120
    # every hub example's generated sweep is a valid sweep spec
    rel = W.Release("hub", "google-bert/bert-base-uncased", "google-bert--bert-base-uncased", "f" * 40,
                    "google-bert/bert-base-uncased", pin="f" * 40)
    g = generate_sweep(hub, hub.entries[0], rel)
    from jobs.spec import parse_spec

    s = parse_spec(g.raw, source="generated")
    assert [(m.ref, m.options) for m in s.models] == [("google-bert/bert-base-uncased", {"backend": "hf-mlm", "revision": "f" * 40})]
    assert [m.name for m in s.metrics] == ["seat", "lpbs", "crows_pairs"] and s.languages == ("en",)
    assert s.experiment == "biasaudit-hub-releases"
    # settings that cannot deadlock a small cluster: the sweep's driver reserves no CPU (two drivers
    # holding both CPUs of a 2-CPU head starved their model actors), at most max_jobs sweeps at once
    # (each model actor takes actor_num_cpus), a GPU per model only where the cluster has GPUs
    assert hub.ray.entrypoint_num_cpus == 0 and hub.ray.max_jobs == 1
    assert s.ray.actor_num_gpus == "auto" and s.ray.actor_num_cpus * hub.ray.max_jobs <= 2


# --------------------------------------------------------------------------------------
# identities and back-off
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_submission_id_and_spec_digest_are_deterministic(tmp_path, monkeypatch):
    sc = '["w", "biasaudit-watch-w", "sqlite:////srv/mlflow.db"]'
    sid = submission_id("hub", "org/m", "a" * 40, "d" * 64, scope=sc)
    assert sid == submission_id("hub", "org/m", "a" * 40, "d" * 64, scope=sc) and sid.startswith("audit-") and len(sid) == 22
    assert sid == "audit-" + __import__("hashlib").sha256(
        json.dumps(["hub", "org/m", "a" * 40, "d" * 64, sc]).encode()).hexdigest()[:16]
    assert len({sid, submission_id("hub", "org/m", "b" * 40, "d" * 64, scope=sc),
                submission_id("hub", "org/m", "a" * 40, "e" * 64, scope=sc),
                submission_id("local", "org/m", "a" * 40, "d" * 64, scope=sc),
                submission_id("hub", "org/m", "a" * 40, "d" * 64, scope=sc.replace("srv", "other"))}) == 5
    assert submission_id("hub", "org/m", "a" * 40, "d" * 64, attempt=2, scope=sc) == sid + "-2"
    raw = {"name": "x", "metrics": ["weat"], "models": [{"ref": "m"}], "output_dir": "/a", "tracking": {"uri": "sqlite:///a"},
           "ray": {"num_cpus": 1}, "description": "d"}
    same = dict(raw, name="y", output_dir="/b", tracking={}, ray={"num_cpus": 8}, description="other")
    assert spec_digest(raw) == spec_digest(same) != spec_digest(dict(raw, metrics=["same"]))
    # ${VAR} is hashed unexpanded: the same audit has the same identity on every machine
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}]))
    entry = dataclasses.replace(spec.entries[0], audit=dataclasses.replace(
        spec.entries[0].audit, overrides={**spec.entries[0].audit.overrides,
                                          "tests": ["weat1", "${BIASAUDIT_DATA:-../shared/data}/x.yaml"]}))
    rel = LocalSource().releases(str(root / "m"), entry)[0]
    monkeypatch.setenv("BIASAUDIT_DATA", "/one")
    g1 = generate_sweep(spec, entry, rel)
    monkeypatch.setenv("BIASAUDIT_DATA", "/two")
    g2 = generate_sweep(spec, entry, rel)
    assert g1.digest == g2.digest and g1.name == g2.name and "${BIASAUDIT_DATA:-../shared/data}/x.yaml" in g1.text


@pytest.mark.unit
def test_watches_on_separate_stores_each_audit_and_one_store_submits_once(tmp_path):
    """The submission id covers the watch and its tracking store: a second watch with its own
    store audits into it (it used to get "already submitted" for ever), two watcher processes of
    one watch on one store still submit once."""
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0, mtime=time.time() - 3600)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = load_watch_spec(write_watch(tmp_path / "a", [{"local": str(root), "file": "vectors.vec"}]))
    b = load_watch_spec(write_watch(tmp_path / "b", [{"local": str(root), "file": "vectors.vec"}]))
    assert a.resolved_tracking_uri != b.resolved_tracking_uri and a.name == b.name
    cluster = Recorder()  # one Ray cluster for both
    ra = Watcher(a, submitter=cluster, out=None).poll()
    rb = Watcher(b, submitter=cluster, out=None).poll()
    assert len(ra.submitted) == 1 and len(rb.submitted) == 1, [d.line() for d in rb.decisions]
    sa, sb = ra.submitted[0], rb.submitted[0]
    assert sa.submission_id != sb.submission_id and len(cluster.jobs) == 2
    for spec, d in ((a, sa), (b, sb)):
        g = yaml.safe_load(cluster.jobs[d.submission_id]["env"]["env_vars"]["BIASAUDIT_SWEEP_SPEC"])
        assert g["tracking"]["uri"] == spec.resolved_tracking_uri  # each audit goes to its own store
        assert cluster.jobs[d.submission_id]["meta"]["biasaudit.store"] == spec.resolved_tracking_uri
    # a second process of watch a (same store): Ray refuses the id, nothing new
    again = Watcher(load_watch_spec(tmp_path / "a" / "w.yaml"), submitter=cluster, out=None).poll()
    assert again.submitted == [] and len(cluster.jobs) == 2
    assert [d.reason for d in again.decisions if d.action == "skipped"] == [
        f"already submitted as {sa.submission_id} (Ray job status PENDING)"]
    # credentials in the URI do not make another store
    c = dataclasses.replace(a, tracking_uri="postgresql://u:p1@db/mlflow")
    d = dataclasses.replace(a, tracking_uri="postgresql://v:p2@db/mlflow?sslmode=require")
    assert c.scope == d.scope and "p1" not in c.scope and c.scope != a.scope


@pytest.mark.unit
def test_the_watch_store_follows_mlflow_tracking_uri(tmp_path, monkeypatch):
    """--tracking-uri > tracking.uri > $MLFLOW_TRACKING_URI > sqlite:///<output_dir>/mlflow.db,
    and every generated sweep writes where the watcher reads."""
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0, mtime=time.time() - 3600)
    p = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}])
    assert load_watch_spec(p).resolved_tracking_uri == f"sqlite:///{tmp_path / 'watch' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env.example:5000")
    spec = load_watch_spec(p)
    assert spec.resolved_tracking_uri == "http://env.example:5000"
    rel = LocalSource().releases(str(root / "m"), spec.entries[0])[0]
    assert generate_sweep(spec, spec.entries[0], rel).raw["tracking"]["uri"] == "http://env.example:5000"
    pinned = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}], name="pinned",
                         tracking={"uri": "http://spec.example:5000"})
    assert load_watch_spec(pinned).resolved_tracking_uri == "http://spec.example:5000"
    assert load_watch_spec(pinned, tracking_uri="http://flag.example:5000").resolved_tracking_uri == "http://flag.example:5000"
    with pytest.raises(ParameterError, match="--tracking-uri: 'file:///x': use sqlite:///"):
        load_watch_spec(p, tracking_uri="file:///x")


@pytest.mark.unit
def test_a_template_variable_holding_a_secret_is_refused_before_submitting(tmp_path, monkeypatch):
    """The template is expanded as the job will see it, with the sweep spec's rule: a variable
    that holds a secret is never interpolated (the job would refuse the spec; the secret would
    be stored with the sweep)."""
    monkeypatch.setenv("BIASAUDIT_API_KEY", "s3cret")
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0, mtime=time.time() - 3600)
    tpl = tmp_path / "template.yaml"
    tpl.write_text("name: t\nmetrics: [weat]\ntests: ['${BIASAUDIT_API_KEY}']\nmodels: [x]\n", encoding="utf-8")
    p = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}],
                    audit={"spec": str(tpl), "model": {"languages": ["en"]}},
                    ray={"runtime_env": {"env_vars": {"HF_TOKEN": "hf_x"}}})
    spec = load_watch_spec(p)
    rel = LocalSource().releases(str(root / "m"), spec.entries[0])[0]
    with pytest.raises(DataError, match=r"tests\[0\]: \$\{BIASAUDIT_API_KEY\} looks like a secret"):
        generate_sweep(spec, spec.entries[0], rel)
    rec = Recorder()
    r = Watcher(spec, submitter=rec, out=None).poll()
    assert rec.jobs == {} and r.exit_code == 1
    [err] = r.errors
    assert err.reason.startswith(f"invalid generated sweep: {tpl} (generated for ") and "looks like a secret" in err.reason
    assert "s3cret" not in (tmp_path / "watch" / "decisions.jsonl").read_text()


@pytest.mark.unit
def test_backoff_delays_are_exponential_capped_and_seeded():
    b = Backoff(initial=1, factor=2, max=5, retries=4, jitter=0)
    assert [b.delay(k) for k in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    j = Backoff(initial=1, factor=2, max=5, jitter=0.5, seed=7)
    import random

    r1, r2 = random.Random(7), random.Random(7)
    d1 = [j.delay(k, r1) for k in range(5)]
    assert d1 == [j.delay(k, r2) for k in range(5)]
    base = [1, 2, 4, 5, 5]
    assert all(0.5 * x <= d <= min(5.0, 1.5 * x) for d, x in zip(d1, base, strict=True)) and d1 != [float(x) for x in base]
    assert b.poll_delay(60, 0) == 60 and b.poll_delay(60, 1) == 120 and b.poll_delay(60, 3) == 480
    assert Backoff(max_interval=600).poll_delay(60, 20) == 600


# --------------------------------------------------------------------------------------
# local source, decisions (submissions recorded in memory)
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_new_local_revision_is_audited_once(tmp_path):
    root = tmp_path / "models"
    t0 = time.time() - 3600
    write_vectors(root / "tiny" / "v1", 0, mtime=t0)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}]))
    rec = Recorder()

    r1 = Watcher(spec, submitter=rec, out=None).poll()
    assert [(d.repo, d.revision, d.attempt) for d in r1.submitted] == [(str(root / "tiny"), "v1", 1)]
    sid = r1.submitted[0].submission_id
    job = rec.jobs[sid]
    assert job["entrypoint"] == "python -m jobs.watch --run-spec-env BIASAUDIT_SWEEP_SPEC --no-progress"
    g = yaml.safe_load(job["env"]["env_vars"]["BIASAUDIT_SWEEP_SPEC"])
    assert g["models"] == [{"ref": str(root / "tiny" / "v1" / "vectors.vec"), "name": "tiny", "languages": ["en"]}]
    assert g["name"].startswith("w-tiny-v1-") and g["tracking"] == {"uri": f"sqlite:///{tmp_path / 'watch' / 'mlflow.db'}",
                                                                   "experiment": "biasaudit-watch-w"}
    assert g == yaml.safe_load(Path(r1.submitted[0].spec_path).read_text())

    # a re-run submits nothing: Ray refuses the same id; the decision says so
    r2 = Watcher(spec, submitter=rec, out=None).poll()
    assert r2.submitted == [] and len(rec.jobs) == 1 and r2.exit_code == 0
    [skip] = [d for d in r2.decisions if d.action == "skipped"]
    assert skip.reason == f"already submitted as {sid} (Ray job status PENDING)"

    # a newer revision folder: one new job, for it only
    write_vectors(root / "tiny" / "v2", 1, mtime=t0 + 60)
    r3 = Watcher(spec, submitter=rec, out=None).poll()
    assert [d.revision for d in r3.submitted] == ["v2"] and len(rec.jobs) == 2
    log = decisions(tmp_path)
    assert [(x["action"], x.get("revision")) for x in log if x["action"] in ("submitted", "skipped")] == [
        ("submitted", "v1"), ("skipped", "v1"), ("submitted", "v2")]
    assert all(x["watch"] == "w" and x["entry"] == f"local {root}" for x in log)


@pytest.mark.unit
def test_revisions_order_and_count(tmp_path):
    root = tmp_path / "models"
    t0 = time.time() - 3600
    for i, name in enumerate(["b", "c", "a"]):  # mtime order b < c < a; name order a < b < c
        write_vectors(root / "m" / name, i, mtime=t0 + i)
    src = LocalSource()
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "revisions": 2, "file": "vectors.vec"},
                                                  {"local": str(root), "revisions": 2, "order": "name", "file": "vectors.vec"}]))
    assert [r.revision for r in src.releases(str(root / "m"), spec.entries[0])] == ["a", "c"]
    assert [r.revision for r in src.releases(str(root / "m"), spec.entries[1])] == ["c", "b"]


@pytest.mark.unit
def test_digest_layout_follows_the_content(tmp_path):
    root = tmp_path / "models"
    vec = write_vectors(root / "m", 0, mtime=time.time() - 3600)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "layout": "digest", "file": "vectors.vec"}]))
    rec = Recorder()
    r1 = Watcher(spec, submitter=rec, out=None).poll()
    [d1] = r1.submitted
    from audit.backends.static import content_digest

    assert d1.revision == content_digest([vec]) and d1.revision.startswith("sha256:")
    assert Watcher(spec, submitter=rec, out=None).poll().submitted == []
    write_vectors(root / "m", 5, mtime=time.time() - 1800)  # the model replaced in place
    [d2] = Watcher(spec, submitter=rec, out=None).poll().submitted
    assert d2.revision == content_digest([vec]) != d1.revision and len(rec.jobs) == 2


@pytest.mark.unit
def test_a_folder_still_being_written_waits(tmp_path):
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0)  # modified just now
    rec = Recorder()
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec", "settle": 600}]))
    r = Watcher(spec, submitter=rec, out=None).poll()
    assert r.submitted == [] and rec.jobs == {} and r.exit_code == 0
    [d] = [d for d in r.decisions if d.action == "skipped"]
    assert "(settle: 600 s); next poll" in d.reason and str(root / "m" / "v1") in d.reason


class Flaky:
    """A source that fails ``n`` times (transiently) before answering like ``inner``."""

    def __init__(self, inner, n: int, repos_fail: bool = False):
        self.inner, self.n, self.calls, self.repos_fail = inner, n, 0, repos_fail

    def repos(self, entry):
        if self.repos_fail:
            raise SourceUnavailable(f"listing {entry.target}: connection reset")
        return self.inner.repos(entry)

    def releases(self, repo, entry):
        self.calls += 1
        if self.calls <= self.n:
            raise SourceUnavailable(f"{repo}: HTTP 503 (overloaded)")
        return self.inner.releases(repo, entry)


@pytest.mark.unit
def test_source_errors_are_retried_with_backoff_and_reported(tmp_path):
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0, mtime=time.time() - 3600)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}]))
    rec, sleeps = Recorder(), []
    flaky = Flaky(LocalSource(), 2)
    r = Watcher(spec, submitter=rec, sources={"local": flaky}, sleep=sleeps.append, out=None).poll()
    assert sleeps == [0.5, 1.0] and flaky.calls == 3
    assert [(d.action, d.delay) for d in r.decisions if d.action == "retry"] == [("retry", 0.5), ("retry", 1.0)]
    assert "HTTP 503 (overloaded) (retry 1 of 2 in 0.50 s)" in r.decisions[0].reason
    assert len(r.submitted) == 1 and r.exit_code == 0

    # failing beyond the retries: an error, the poll goes on with the other entries, exit status 1
    other = tmp_path / "other"
    write_vectors(other / "n" / "v1", 1, mtime=time.time() - 3600)
    spec2 = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"},
                                                   {"local": str(tmp_path / "missing")},
                                                   {"local": str(other), "file": "vectors.vec"}], name="w2"))
    sleeps.clear()

    class Routed:
        def __init__(self):
            self.bad, self.good = Flaky(LocalSource(), 10**6), LocalSource()

        def repos(self, entry):
            return self.good.repos(entry)

        def releases(self, repo, entry):
            return (self.bad if repo.startswith(str(root)) else self.good).releases(repo, entry)

    r2 = Watcher(spec2, submitter=Recorder(), sources={"local": Routed()}, sleep=sleeps.append, out=None).poll()
    assert sleeps == [0.5, 1.0]
    errors = [(d.entry, d.reason) for d in r2.errors]
    assert errors[0] == (f"local {root}", f"{root / 'm'}: HTTP 503 (overloaded)")
    assert errors[1] == (f"local {tmp_path / 'missing'}", f"watch[1].local: {tmp_path / 'missing'} is not a directory")
    assert [d.repo for d in r2.submitted] == [str(other / "n")] and r2.exit_code == 1
    assert [x["action"] for x in decisions(tmp_path) if x["watch"] == "w2"].count("error") == 2


@pytest.mark.unit
def test_an_invalid_template_is_an_error_naming_the_field(tmp_path):
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0, mtime=time.time() - 3600)
    p = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec", "audit": {"overrides": {"metrics": ["wat"]}}}])
    rec = Recorder()
    r = Watcher(load_watch_spec(p), submitter=rec, out=None).poll()
    assert rec.jobs == {} and r.exit_code == 1
    assert "invalid generated sweep: jobs/specs/smoke.yaml (generated for" in r.errors[0].reason
    assert "metrics[0].name: unknown metric 'wat' (did you mean 'weat'?)" in r.errors[0].reason


# --------------------------------------------------------------------------------------
# decisions from the tracking store (parent runs written by jobs.tracker)
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_store_decides_audited_failed_and_running(tmp_path, store, request):
    """On the embedded SQLite store and on an MLflow server backed by PostgreSQL (``pg_mlflow``)."""
    from jobs.tracker import Tracker

    root = tmp_path / "models"
    for m in ("done", "failed", "twice", "busy"):
        write_vectors(root / m / "v1", 0, mtime=time.time() - 3600)
    uri = request.getfixturevalue("pg_mlflow")["uri"] if store == "postgresql" else None
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}]), tracking_uri=uri)
    dry = Watcher(spec, submitter=Recorder(), dry_run=True, out=None).poll()
    names = {Path(d.repo).name: d.sweep for d in dry.decisions if d.action == "dry_run"}
    assert sorted(names) == ["busy", "done", "failed", "twice"]
    assert not (tmp_path / "watch" / "mlflow.db").exists()  # reading an absent store creates nothing

    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    tr.start_parent(names["done"], "id-done")
    tr.end_parent(failed=0, summary={"tasks_failed": 0})
    tr.start_parent(names["failed"], "id-failed")
    tr.end_parent(failed=1, summary={"tasks_failed": 1})
    for _ in range(2):  # ran twice, failed twice: max_attempts (2) reached
        tr.start_parent(names["twice"], "id-twice")
        tr.end_parent(failed=3, summary={"tasks_failed": 3})
    tr.start_parent(names["busy"], "id-busy")  # RUNNING, its driver (this process) alive

    index = AuditIndex.load(spec.resolved_tracking_uri, spec.resolved_experiment)
    assert {k: (v.status, v.invocations) for k, v in index.sweeps.items()} == {
        names["done"]: ("FINISHED", 1), names["failed"]: ("FAILED", 1), names["twice"]: ("FAILED", 2),
        names["busy"]: ("RUNNING", 1)}
    rec = Recorder()
    r = Watcher(spec, submitter=rec, out=None).poll()
    by = {Path(d.repo).name: d for d in r.decisions if d.action in ("submitted", "skipped")}
    assert by["done"].action == "skipped" and by["done"].reason.startswith("already audited: sweep run ")
    assert by["busy"].action == "skipped" and by["busy"].reason.startswith("in progress: sweep run ")
    fails = {Path(d.repo).name: d.reason for d in r.failed}
    assert "twice" not in by and fails["twice"].startswith(
        "gave up: the sweep ran 2 time(s), last FAILED (3 failed task(s)); max_attempts is 2")
    assert fails["failed"].startswith("sweep run ") and fails["failed"].endswith(
        "ended FAILED (1 failed task(s)) after 1 of 2 attempt(s); submitting it again")
    assert r.exit_code == 1
    f = by["failed"]
    assert f.action == "submitted" and f.attempt == 2 and f.submission_id.endswith("-2")
    assert f.reason == "re-run after a FAILED sweep (1 failed task(s))" and list(rec.jobs) == [f.submission_id]


@pytest.mark.unit
def test_a_stuck_sweep_is_reported_as_stuck_not_in_progress(tmp_path):
    """The sweep's contract: tasks that waited too long for resources tag the parent run
    ``audit.state=stuck`` with ``audit.stuck_reason`` and exit with status 4. A running job with
    that tag, an ended one, and a job that exited 4 without the tag are all ``stuck``."""
    import io

    from jobs.tracker import Tracker

    root = tmp_path / "models"
    for m in ("ended", "exited", "waiting"):
        write_vectors(root / m / "v1", 0, mtime=time.time() - 3600)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}]))
    rec = Recorder()
    sub = {Path(d.repo).name: d for d in Watcher(spec, submitter=rec, out=None).poll().submitted}
    assert sorted(sub) == ["ended", "exited", "waiting"]
    reason = "3 task(s) waited 600 s for {'CPU': 2.0} (cluster: {'CPU': 1.0} free of 2.0)"
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    tr.start_parent(sub["ended"].sweep, "id-ended")  # the sweep ended its run as stuck (the tags), exited 4
    tr.end_parent(failed=2, summary={"tasks_failed": 2}, stuck_reason=reason)
    tr.start_parent(sub["exited"].sweep, "id-exited")  # exited 4, no tag (the store was unreachable)
    tr.end_parent(failed=1, summary={"tasks_failed": 1})
    tr.start_parent(sub["waiting"].sweep, "id-waiting")  # still running, tagged
    tr.client.set_tag(tr.parent_id, "audit.state", "stuck")
    tr.client.set_tag(tr.parent_id, "audit.stuck_reason", reason)
    for name, status, code in (("ended", "FAILED", 4), ("exited", "FAILED", 4), ("waiting", "RUNNING", None)):
        rec.jobs[sub[name].submission_id].update(status=status, exit_code=code)

    out = io.StringIO()
    r = Watcher(spec, submitter=rec, out=out).poll()
    assert not [d for d in r.decisions if "in progress" in d.reason]
    stuck = {Path(d.repo).name: d for d in r.decisions if d.action == "stuck"}
    assert sorted(stuck) == ["ended", "exited", "waiting"] and r.stuck == list(stuck.values())
    assert stuck["waiting"].reason.startswith(reason + " (sweep run ")
    assert stuck["ended"].reason.startswith(reason + " (sweep run ")
    sid = sub["exited"].submission_id
    assert stuck["exited"].reason == (f"job {sid} exited with status 4: its tasks waited too long for resources "
                                      f"(the pending demand is in `ray job logs {sid}`)")
    # an ended stuck sweep is submitted again while attempts remain; the running one is left alone
    again = {Path(d.repo).name: d for d in r.submitted}
    assert sorted(again) == ["ended", "exited"] and all(d.attempt == 2 for d in again.values())
    assert again["ended"].reason == "re-run after a stuck sweep (2 failed task(s))"
    assert r.exit_code == 1 and "3 stuck" in r.summary()
    printed = out.getvalue()
    assert f"watch w: stuck     {root / 'waiting'}@v1: {reason} (sweep run " in printed
    logged = [x for x in decisions(tmp_path) if x["action"] == "stuck"]
    assert sorted(Path(x["repo"]).name for x in logged) == ["ended", "exited", "waiting"]
    assert all(x["sweep"] and x["reason"] for x in logged)


@pytest.mark.unit
def test_max_jobs_defers_new_audits_until_the_cluster_has_room(tmp_path):
    root = tmp_path / "models"
    for m in ("a", "b", "c"):
        write_vectors(root / m / "v1", 0, mtime=time.time() - 3600)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}],
                                       ray={"max_jobs": 2, "entrypoint_num_cpus": 0}))
    rec = Recorder()
    r1 = Watcher(spec, submitter=rec, out=None).poll()
    assert [Path(d.repo).name for d in r1.submitted] == ["a", "b"] and len(rec.jobs) == 2
    [wait] = [d for d in r1.decisions if d.action == "deferred"]
    assert Path(wait.repo).name == "c" and wait.reason == (
        "new revision; waits for a later poll: 2 of this watch's sweeps pending or running, ray.max_jobs is 2")
    assert all(j["resources"] == {"num_cpus": 0, "num_gpus": None} for j in rec.jobs.values())
    assert r1.exit_code == 0 and "1 deferred" in r1.summary()
    # both still pending: the submitted ones are "already submitted", c still waits
    r2 = Watcher(spec, submitter=rec, out=None).poll()
    assert r2.submitted == [] and [Path(d.repo).name for d in r2.decisions if d.action == "deferred"] == ["c"]
    assert sum("already submitted" in d.reason for d in r2.decisions) == 2
    # one finished: room for c; another watch's jobs do not count
    rec.jobs[r1.submitted[0].submission_id]["status"] = "SUCCEEDED"
    rec.jobs["other"] = {"status": "RUNNING", "meta": {"biasaudit.watch": "other"}}
    r3 = Watcher(spec, submitter=rec, out=None).poll()
    assert [Path(d.repo).name for d in r3.submitted] == ["c"]
    # a dry run counts what it would submit
    dry = Watcher(dataclasses.replace(spec, output_dir=tmp_path / "dry"), submitter=Recorder(), dry_run=True, out=None).poll()
    assert [d.action for d in dry.decisions if d.action in ("dry_run", "deferred")] == ["dry_run", "dry_run", "deferred"]


# --------------------------------------------------------------------------------------
# a real Ray head: two watchers racing, the sweep itself, a re-run
# --------------------------------------------------------------------------------------


class Barrier:
    """A submitter wrapper that holds every submission until both watchers are about to submit."""

    def __init__(self, inner, barrier: threading.Barrier):
        self.inner, self.barrier = inner, barrier

    def submit(self, *args):
        self.barrier.wait(timeout=60)
        return self.inner.submit(*args)

    def status(self, sid):
        return self.inner.status(sid)


@pytest.mark.e2e
def test_real_ray_head_racing_watchers_submit_one_job_which_audits_the_revision(tmp_path, monkeypatch, job_head):
    from ray.job_submission import JobSubmissionClient

    from jobs.cluster import ray_env

    for k, v in ray_env().items():
        if k.startswith("RAY_"):
            monkeypatch.setenv(k, v)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    root = tmp_path / "models"
    vec = write_vectors(root / "tiny" / "v1", 0, mtime=time.time() - 3600)
    address = job_head  # the session's head (tests/conftest.py): count only this test's jobs
    client = JobSubmissionClient(address)
    before = {j.submission_id for j in client.list_jobs()}

    def new_jobs() -> list[str]:
        return [j.submission_id for j in client.list_jobs() if j.submission_id not in before]

    p = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}],
                    ray={"address": address, "runtime_env": {"env_vars": {"HF_HUB_OFFLINE": "1"}}})
    spec = load_watch_spec(p)
    barrier = threading.Barrier(2)
    reports = [None, None]

    def run(i):
        reports[i] = Watcher(spec, submitter=Barrier(W.RaySubmitter(address), barrier), out=None).poll()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    subs = [d for r in reports for d in r.submitted]
    skips = [d for r in reports for d in r.decisions if d.action == "skipped"]
    assert len(subs) == 1 and len(skips) == 1, [d.line() for r in reports for d in r.decisions]
    sid = subs[0].submission_id
    assert skips[0].submission_id == sid and skips[0].reason.startswith(f"already submitted as {sid} (Ray job status ")
    assert new_jobs() == [sid]

    st = wait_for_job(client, sid, 240).value
    logs = client.get_job_logs(sid)
    assert st == "SUCCEEDED", logs[-3000:]
    assert "1 task(s) run, 0 resumed, 0 failed" in logs
    info = client.get_job_info(sid)
    assert info.metadata["biasaudit.revision"] == "v1" and info.metadata["biasaudit.attempt"] == "1"

    # the store now holds the audit of this revision (revision = the file's content digest)
    index = AuditIndex.load(spec.resolved_tracking_uri, spec.resolved_experiment)
    assert index.finished_revisions(str(vec)) == {W.local_revision(vec): 1}
    assert index.sweeps[subs[0].sweep].status == "FINISHED"

    # a re-run (a cron tick, through the command line) submits nothing
    env = {**os.environ}
    r = subprocess.run([sys.executable, "-m", "jobs.watch", str(p), "--once"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"skipped   {root / 'tiny'}@v1: already audited: sweep run " in r.stdout
    assert "0 submitted, 1 skipped" in r.stdout
    assert new_jobs() == [sid]
    log = decisions(tmp_path)
    assert sorted(x["action"] for x in log if x["action"] in ("submitted", "skipped")) == ["skipped", "skipped", "submitted"]
    assert len({x["pid"] for x in log}) == 2  # this process (two threads) and the command line


@pytest.mark.unit
def test_poll_loop_backs_off_after_failed_polls_and_stops(tmp_path):
    root = tmp_path / "models"
    write_vectors(root / "m" / "v1", 0, mtime=time.time() - 3600)
    p = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}], interval=0.02,
                    backoff={"initial": 0.01, "factor": 3, "max": 0.01, "retries": 0, "max_interval": 0.2})
    spec = load_watch_spec(p)
    waits = []

    class Stop(threading.Event):
        def wait(self, timeout=None):
            waits.append(round(timeout, 6))
            return False

    flaky = Flaky(LocalSource(), 2)  # the first two polls fail (no retries), the third succeeds
    rec = Recorder()
    code = Watcher(spec, submitter=rec, sources={"local": flaky}, out=None).run(max_polls=4, stop=Stop())
    assert code == 1 and len(rec.jobs) == 1  # the failed polls are not hidden by the good one after them
    assert waits == [0.06, 0.18, 0.02]  # interval * 3**n after n failed polls in a row, then the interval again
    polls = [x["poll"] for x in decisions(tmp_path)]
    assert len(set(polls)) == 4
    assert [x["action"] for x in decisions(tmp_path) if x["action"] in ("error", "submitted")] == ["error", "error", "submitted"]


@pytest.mark.unit
def test_run_spec_env_needs_the_variable(monkeypatch, capsys):
    monkeypatch.delenv("BIASAUDIT_SWEEP_SPEC", raising=False)
    assert W.main(["--run-spec-env", "BIASAUDIT_SWEEP_SPEC"]) == 2
    assert "BIASAUDIT_SWEEP_SPEC is not set" in capsys.readouterr().err
    monkeypatch.setenv("BIASAUDIT_SWEEP_SPEC", "name: x\nmodels: [glove-6b-50d]\nmetrics: [wat]\n")
    assert W.main(["--run-spec-env", "BIASAUDIT_SWEEP_SPEC"]) == 2
    assert "metrics[0].name: unknown metric 'wat'" in capsys.readouterr().err


@pytest.mark.parametrize("store", [pytest.param("sqlite", marks=pytest.mark.unit),
                                   pytest.param("postgresql", marks=pytest.mark.e2e)])
def test_a_failed_audit_job_makes_watch_once_exit_1_and_notify_both_channels(tmp_path, monkeypatch, capsys, store,
                                                                             request):
    """The recipe's failure: the job dies before its sweep writes a run (``No module named
    'pandas'``). ``audit watch --once`` exits 1 and notifies (command and POST) when it sees the
    failed job (submitting attempt 2), then again when it gives up; repeated polls keep exit 1 for
    the given-up audit without notifying twice; a submission the cluster refuses is exit 1 too.
    On the embedded SQLite store and on an MLflow server backed by PostgreSQL (``pg_mlflow``)."""
    pg = {"name": "w-failed-pg", "tracking": {"uri": request.getfixturevalue("pg_mlflow")["uri"]}} \
        if store == "postgresql" else {}
    root = local_models(tmp_path)
    hook, hook_out = json_hook(tmp_path)
    rec = Recorder()
    monkeypatch.setattr("jobs.watch.watcher.RaySubmitter", lambda address=None: rec)  # the CLI's submitter
    with Receiver() as rx:
        p = write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}],
                        notify={"command": hook, "url": rx.url, "timeout": 20}, **pg)
        assert not pg or not (tmp_path / "watch" / "mlflow.db").exists()

        def once() -> tuple[int, str]:
            code = W.main([str(p), "--once"])
            return code, capsys.readouterr().out

        code, out = once()
        assert code == 0 and "1 submitted" in out and not hook_out.exists() and rx.bodies == []
        [sid] = rec.jobs
        rec.jobs[sid].update(status="FAILED", exit_code=1)  # ModuleNotFoundError: No module named 'pandas'

        code, out = once()
        assert code == 1 and "1 submitted" in out and "1 failed" in out
        assert (f"failed    {root / 'tiny'}@v1 [{sid}]: job {sid} FAILED (exit status 1); "
                "submitting attempt 2 of 2") in out
        bodies = [json.loads(x) for x in hook_out.read_text().splitlines()]
        assert [(b["event"], b["submission_id"], b["attempt"]) for b in bodies] == [("audit_failed", sid, 1)]
        assert [(b["path"], b["json"]) for b in rx.bodies] == [("/hooks/bias", bodies[0])]
        assert bodies[0]["repo"] == str(root / "tiny") and bodies[0]["revision"] == "v1"
        assert sorted(rec.jobs) == [sid, sid + "-2"]

        code, out = once()  # attempt 2 still pending: attempt 1's failure was told already
        assert code == 0 and "0 failed" in out and len(rx.bodies) == 1

        rec.jobs[sid + "-2"].update(status="FAILED", exit_code=1)
        for k in range(2):  # given up: exit 1 on every poll, one notification
            code, out = once()
            assert code == 1 and f"gave up: job {sid}-2 FAILED (exit status 1) and max_attempts is 2" in out
            assert [b["json"]["event"] for b in rx.bodies] == ["audit_failed", "audit_gave_up"]
        assert len(hook_out.read_text().splitlines()) == 2
        log = decisions(tmp_path)
        assert [x["submission_id"] for x in log if x["action"] == "failed"] == [sid, sid + "-2", sid + "-2"]

        # a submission the cluster refuses: exit 1 and one notification
        from jobs.watch import SubmitError

        class Refusing(Recorder):
            def submit(self, sid, *a):
                if sid in self.jobs:
                    return super().submit(sid, *a)  # Ray's "already exists" comes before the new job
                raise SubmitError(f"submission {sid}: Ray job API at http://head:8265: connection refused")

        refusing = Refusing()
        refusing.jobs = rec.jobs
        monkeypatch.setattr("jobs.watch.watcher.RaySubmitter", lambda address=None: refusing)
        write_vectors(root / "other" / "v1", 1, mtime=time.time() - 3600)
        code, out = once()
        assert code == 1 and "connection refused" in out
        assert [b["json"]["event"] for b in rx.bodies] == ["audit_failed", "audit_gave_up", "audit_not_submitted"]
        assert rx.bodies[-1]["json"]["repo"] == str(root / "other")


@pytest.mark.unit
def test_a_failed_notification_is_an_error_and_retried(tmp_path):
    root = local_models(tmp_path)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}],
                                       notify={"command": f"{sys.executable} -c 'import sys; sys.exit(5)'"}))
    rec = Recorder()
    Watcher(spec, submitter=rec, out=None).poll()
    [sid] = rec.jobs
    rec.jobs[sid].update(status="STOPPED")
    for _ in range(2):  # the notification fails: an error, and the next poll tells the failure again
        r = Watcher(spec, submitter=rec, out=None).poll()
        assert r.exit_code == 1 and [d.action for d in r.failed] == ["failed"]
        assert [e.reason for e in r.errors] == [f"notification command {sys.executable} exited 5"]


@pytest.mark.unit
def test_a_local_folder_the_run_could_not_load_is_not_submitted(tmp_path):
    """A revision folder with neither config.json nor a vectors file: refused by the planner's rule
    before submission (an error, exit 1), not submitted as a job that fails every task."""
    root = tmp_path / "models"
    (root / "m" / "v1").mkdir(parents=True)
    (root / "m" / "v1" / "notes.md").write_text("no model here\n", encoding="utf-8")
    old = time.time() - 3600
    os.utime(root / "m" / "v1", (old, old))
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root)}]))
    rec = Recorder()
    r = Watcher(spec, submitter=rec, out=None).poll()
    assert rec.jobs == {} and r.exit_code == 1
    [e] = r.errors
    assert e.reason.startswith("invalid generated sweep: ") and "is a folder without config.json" in e.reason


@pytest.mark.unit
def test_a_busy_job_is_retried_at_the_next_poll_not_failed_nor_counted(tmp_path, capsys):
    """A job that exits 5 (another driver holds the sweep's lease, it ran nothing) is ``busy``:
    one line, submitted again as ``<id>-busy<k>`` at the poll that sees it, exit status 0, no
    notification, and it does not use up ``max_attempts`` (1 here); a real failure after it still
    gives up. While the other driver's sweep run is RUNNING, a busy job does not make it stale."""
    from jobs.tracker import Tracker

    root = local_models(tmp_path)
    hook, hook_out = json_hook(tmp_path)
    spec = load_watch_spec(write_watch(tmp_path, [{"local": str(root), "file": "vectors.vec"}], max_attempts=1,
                                       notify={"command": hook}))
    rec = Recorder()
    import io

    def poll():
        out = io.StringIO()
        return Watcher(spec, submitter=rec, out=out).poll(), out.getvalue()

    r, _ = poll()
    [sid] = rec.jobs
    rec.jobs[sid].update(status="FAILED", exit_code=5)
    r, out = poll()
    assert r.exit_code == 0 and r.failed == [] and not hook_out.exists()
    assert sorted(rec.jobs) == [sid, sid + "-busy1"]
    [busy] = [d for d in r.decisions if d.action == "busy"]
    assert busy.reason == (f"job {sid} exited with status 5: another driver holds this sweep (it ran nothing); "
                           f"submitting it again as {sid}-busy1, not counted towards max_attempts (1 of 1)")
    assert [d.submission_id for d in r.submitted] == [sid + "-busy1"]
    assert "1 busy" in r.summary()
    assert len([x for x in out.splitlines() if x.startswith("watch w: busy ")]) == 1

    # the other driver's sweep run is RUNNING in the store: in progress, not stale, nothing submitted
    rec.jobs[sid + "-busy1"].update(status="FAILED", exit_code=5)
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    tr.start_parent(r.submitted[0].sweep, "id-other")
    r, _ = poll()
    assert [d.action for d in r.decisions if d.action != "found"] == ["skipped"]
    assert r.decisions[-1].reason.startswith("in progress: sweep run ") and r.exit_code == 0
    assert sorted(rec.jobs) == [sid, sid + "-busy1"]
    tr.end_parent(failed=0, summary={"tasks_failed": 0})  # the other driver finished it
    r, _ = poll()
    assert r.decisions[-1].reason.startswith("already audited") and r.exit_code == 0

    # without a store run: a busy chain is followed, and a real failure of the retry gives up (1 attempt)
    write_vectors(root / "fresh" / "v1", 1, mtime=time.time() - 3600)
    r, _ = poll()
    [new] = [d.submission_id for d in r.submitted]
    rec.jobs[new].update(status="FAILED", exit_code=5)
    r, _ = poll()
    rec.jobs[new + "-busy1"].update(status="FAILED", exit_code=1)
    r, out = poll()
    assert r.exit_code == 1 and [d.submission_id for d in r.failed] == [new + "-busy1"]
    assert f"gave up: job {new}-busy1 FAILED (exit status 1) and max_attempts is 1" in out
    assert sorted(rec.jobs) == sorted([sid, sid + "-busy1", new, new + "-busy1"])
    assert [json.loads(x)["event"] for x in hook_out.read_text().splitlines()] == ["audit_gave_up"]


@pytest.mark.unit
def test_hub_source_classifies_failures_by_the_one_retry_rule(monkeypatch):
    """The hub source's transient/permanent split is ``audit.retry.transient_reason``'s (before: a
    rule of its own that retried every ``OSError`` and never HTTP 408 or 425)."""
    import errno

    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    from audit.errors import ModelError
    from jobs.watch import HubSource

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    req = httpx2.Request("GET", "http://127.0.0.1/x")

    def http(status):
        return HfHubHTTPError(f"{status} Error.\n\nmore", response=httpx2.Response(status, request=req))

    def outcome(exc):
        def fn():
            raise exc
        try:
            HubSource("http://127.0.0.1:9")._call("listing", fn)
        except SourceUnavailable as e:
            return "transient", str(e)
        except ModelError as e:
            return "permanent", str(e)

    assert outcome(http(408)) == ("transient", "listing: HTTP 408 (408 Error.)")
    assert outcome(http(425))[0] == outcome(http(429))[0] == outcome(http(503))[0] == "transient"
    assert outcome(http(404)) == ("permanent", "listing: HTTP 404 (404 Error.)")
    assert outcome(ConnectionResetError("reset")) == ("transient", "listing: ConnectionResetError: reset")
    assert outcome(OSError(errno.ENETUNREACH, "Network is unreachable"))[0] == "transient"
    assert outcome(PermissionError(errno.EACCES, "denied")) == (
        "permanent", "listing: PermissionError: [Errno 13] denied")
    with pytest.raises(ValueError, match="a bug"):
        outcome(ValueError("a bug"))
