"""MLflow tracking of sweep tasks: child runs with params/metrics/tags/table, failures, resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from actors.stats import TaskOutcome
from audit import runner
from audit.errors import ParameterError
from audit.suites import WordSet, WordTest
from jobs.plan import Task
from jobs.spec import ModelSpec
from jobs.tracker import Tracker, embedding_method, result_metrics

WORDS = {
    "X": ["rose", "tulip", "daisy", "lily"],
    "Y": ["ant", "wasp", "flea", "moth"],
    "A": ["love", "peace", "joy"],
    "B": ["hate", "war", "pain"],
}


@pytest.fixture(scope="module")
def small_result(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    rng = np.random.default_rng(0)
    words = [w for ws in WORDS.values() for w in ws]
    vec = d / "tiny.vec"
    lines = [f"{len(words)} 5"] + [w + " " + " ".join(f"{x:.6f}" for x in rng.normal(size=5)) for w in words]
    vec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    test = WordTest(
        name="flowers_small", language="en",
        targets=(WordSet("flowers", tuple(WORDS["X"])), WordSet("insects", tuple(WORDS["Y"]))),
        attributes=(WordSet("pleasant", tuple(WORDS["A"])), WordSet("unpleasant", tuple(WORDS["B"]))),
    )
    params = {"permutations": "exact", "n_bootstrap": 100}
    res = runner.score(str(vec), test, "weat", params, seed=0)
    return str(vec), test, params, res


@pytest.fixture(scope="module")
def db_uri(tmp_path_factory):
    """One SQLite store for the module (creating one costs seconds); one experiment per test."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def _task(key="k1", metric="weat"):
    return Task(model="tiny", language="en", test="en/flowers_small", metric=metric,
                params={"permutations": "exact", "n_bootstrap": 100}, seed=0, key=key)


@pytest.mark.unit
def test_file_store_refused(tmp_path):
    with pytest.raises(ParameterError, match="file store"):
        Tracker(f"file://{tmp_path}/mlruns", "x")


@pytest.mark.unit
def test_child_run_has_params_metrics_tags_and_table(tmp_path, db_uri, small_result):
    ref, test, params, res = small_result
    tr = Tracker(db_uri, "exp-child")
    parent, resumed = tr.start_parent("s", "abc", spec_text="name: s\n")
    assert not resumed
    outcome = TaskOutcome(index=0, status="finished", result=res, model={"model": ref, "kind": "static",
                          "backend": "fasttext-vec", "revision": res.provenance["revision"]}, measure_s=0.1, analyse_s=0.2)
    task = _task(key=res.provenance["key"])
    run_id = tr.log_task(task, sweep="s", model_spec=ModelSpec(ref=ref, name="tiny"), kind="static",
                         plan_key=task.key, outcome=outcome)
    run = tr.client.get_run(run_id)
    assert run.info.status == "FINISHED"
    t, p, m = run.data.tags, run.data.params, run.data.metrics
    assert t["mlflow.parentRunId"] == parent
    assert t["audit.key"] == res.provenance["key"] == t["audit.plan_key"]
    assert (t["audit.model"], t["audit.test"], t["audit.metric"], t["audit.language"], t["audit.status"]) == (
        "tiny", "en/flowers_small", "weat", "en", "finished")
    assert p["model"] == ref and p["revision"] == res.provenance["revision"].strip()
    assert p["embedding"] == "lookup" and p["seed"] == "0" and p["param.permutations"] == '"exact"'
    assert p["dataset_digest"] == test.digest()
    # the result's string fields: which interval, how the p-value was obtained
    assert (p["ci_method"], p["p_method"]) == (res.fields["ci_method"], res.fields["p_method"]) == ("targets", "exact")
    assert "groups" not in p  # WEAT is symmetric: no protected-group side recorded
    assert m["value"] == pytest.approx(res.value) and m["effect_size"] == pytest.approx(res.value)
    assert m["p_value"] == pytest.approx(res.fields["p_value"])
    assert m["ci_low"] == pytest.approx(res.fields["ci"][0]) and m["ci_high"] == pytest.approx(res.fields["ci"][1])
    assert m["coverage.flowers"] == 1.0 and m["coverage_min"] == 1.0 and m["n_items"] == 8
    # the per-item table and the full result as artifacts
    files = {f.path for f in tr.client.list_artifacts(run_id)}
    assert {"items.json", "result.json"} <= files
    local = Path(tr.client.download_artifacts(run_id, "items.json", str(tmp_path)))
    table = json.loads(local.read_text())
    assert len(table["data"]) == 8 and "score" in table["columns"] and "word" in table["columns"]
    # resume bookkeeping
    assert tr.finished_keys() == {res.provenance["key"]: run_id}
    rows = tr.rows_for([res.provenance["key"]])
    assert rows[res.provenance["key"]]["value"] == pytest.approx(res.value)
    assert rows[res.provenance["key"]]["ci_method"] == "targets"


@pytest.mark.unit
def test_asymmetric_results_log_their_groups_and_parent_runs_their_tags(db_uri, small_result):
    ref, test, _, _ = small_result
    res = runner.score(ref, test, "same", seed=0)
    assert (res.fields["groups"], res.fields["groups_source"]) == ("targets", "test")
    tr = Tracker(db_uri, "exp-groups")
    parent, _ = tr.start_parent("s", "grp", tags={"audit.watch.repo": "/m", "team": "nlp"})
    assert {k: tr.client.get_run(parent).data.tags[k] for k in ("audit.watch.repo", "team")} == {
        "audit.watch.repo": "/m", "team": "nlp"}
    again, resumed = tr.start_parent("s", "grp", tags={"team": "bias"})
    assert resumed and again == parent and tr.client.get_run(parent).data.tags["team"] == "bias"
    o = TaskOutcome(index=0, status="finished", result=res, model={"model": ref, "kind": "static",
                    "backend": "fasttext-vec", "revision": res.provenance["revision"]})
    run_id = tr.log_task(_task(key=res.provenance["key"], metric="same"), sweep="s",
                         model_spec=ModelSpec(ref=ref, name="tiny"), kind="static", plan_key=None, outcome=o)
    p = tr.client.get_run(run_id).data.params
    assert (p["groups"], p["groups_source"]) == ("targets", "test") and "ci_method" not in p
    assert tr.rows_for([res.provenance["key"]])[res.provenance["key"]]["groups"] == "targets"


@pytest.mark.unit
def test_failed_task_is_recorded_and_not_counted_as_finished(db_uri):
    tr = Tracker(db_uri, "exp-failed")
    tr.start_parent("s", "abc")
    o = TaskOutcome(index=0, status="failed", error="CoverageError: test weat1: set 'flowers' lost 40% (aster, clover)",
                    traceback="Traceback ...")
    run_id = tr.log_task(_task(key="kf"), sweep="s", model_spec=ModelSpec(ref="m.vec", name="tiny"), kind="static",
                         plan_key="kf", outcome=o)
    run = tr.client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["audit.status"] == "failed"
    assert run.data.tags["audit.error"].startswith("CoverageError: test weat1")
    assert "error.txt" in {f.path for f in tr.client.list_artifacts(run_id)}
    assert tr.finished_keys() == {}
    assert tr.rows_for(["kf"])["kf"]["error"].startswith("CoverageError")


@pytest.mark.unit
def test_parent_is_resumed_and_finished_beats_failed(db_uri, small_result):
    _, _, _, res = small_result
    uri = db_uri
    tr = Tracker(uri, "exp-resume")
    p1, r1 = tr.start_parent("s", "abc")
    fail = TaskOutcome(index=0, status="failed", error="RuntimeError: boom")
    ok = TaskOutcome(index=0, status="finished", result=res, model={"model": "m", "kind": "static", "backend": "b",
                     "revision": res.provenance["revision"]})
    tr.log_task(_task(key="k"), sweep="s", model_spec=ModelSpec(ref="m", name="tiny"), kind="static", plan_key="k", outcome=fail)
    tr.end_parent(failed=1)
    tr2 = Tracker(uri, "exp-resume")
    p2, r2 = tr2.start_parent("s", "abc")
    assert (p2, r2) == (p1, True)
    assert tr2.client.get_run(p2).data.tags["audit.invocations"] == "2"
    tr2.log_task(_task(key="k"), sweep="s", model_spec=ModelSpec(ref="m", name="tiny"), kind="static", plan_key="k", outcome=ok)
    row = tr2.rows_for(["k"])["k"]
    assert row["status"] == "finished" and row["value"] == pytest.approx(res.value)
    assert len(tr2.task_runs()) == 2  # the failed run is kept, not overwritten
    p3, r3 = tr2.start_parent("s", "other-spec")
    assert p3 != p1 and not r3


@pytest.mark.unit
def test_result_metrics_skip_non_finite_and_embedding_names(small_result):
    _, _, _, res = small_result
    import dataclasses

    r = dataclasses.replace(res, fields={**res.fields, "p_value": float("nan"), "ci": None})
    m = result_metrics(r)
    assert "p_value" not in m and "ci_low" not in m and m["value"] == pytest.approx(res.value)
    assert embedding_method("encoder", "weat", {}) == "target_pooled"
    assert embedding_method("mlm", "seat", {"embedding": "mean"}) == "mean"
    assert embedding_method("causal", "crows_pairs", {}) == "log-likelihood"


# --------------------------------------------------------------------------------------
# Several drivers opening one new SQLite store at the same moment
# --------------------------------------------------------------------------------------

_CHILD = r"""
import json, sys, time
from pathlib import Path
from jobs.tracker import Tracker, TrackingUnavailable
from jobs.wal import Recorder, WriteAheadLog
import mlflow  # noqa: F401  (imported before the start signal: the processes then race on the store only)

uri, exp, rec_path, wal_path, ready, go = sys.argv[1:7]
rec = json.loads(Path(rec_path).read_text())
Path(ready).touch()
while not Path(go).exists():
    time.sleep(0.002)
error = None
try:
    tracker = Tracker(uri, exp)
    tracker.start_parent(rec["sweep"], rec["sweep_id"])
except TrackingUnavailable as e:
    tracker, error = None, str(e)
recorder = Recorder(WriteAheadLog(wal_path), tracker, uri)
if tracker is None:
    recorder.go_offline(RuntimeError(error))
run_id = recorder.record(rec)
print(json.dumps({"run_id": run_id, "error": recorder.error}))
"""


@pytest.mark.unit
def test_a_new_sqlite_store_is_the_migrated_schema_copied(tmp_path, monkeypatch):
    """A new store starts as a copy of the schema template in the user cache (built once, by
    MLflow's own migrations): the same tables and Alembic revision as a store MLflow migrated
    itself, and MLflow opens it as one (Default experiment, the sweep's experiment with its
    artifact location); an existing store is never replaced; no template, no seeding."""
    import sqlite3

    from mlflow import MlflowClient

    from jobs.tracker import seed_sqlite_store, sqlite_schema_template

    def schema(db: Path):
        with sqlite3.connect(db) as c:
            tables = sorted(r[0] for r in c.execute("select name from sqlite_master where type='table'"))
            return tables, c.execute("select version_num from alembic_version").fetchall()

    monkeypatch.setenv("BIASAUDIT_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "a" / "mlflow.db"
    tr = Tracker(f"sqlite:///{db}", "exp")
    template = sqlite_schema_template()
    assert template is not None and template.parent == tmp_path / "cache" / "mlflow"
    mine = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'b.db'}")  # created and migrated by MLflow
    mine.search_experiments()
    assert schema(db) == schema(tmp_path / "b.db") and schema(template)[1] == schema(db)[1]
    # the copy runs on SQLite's write-ahead journal, kept in its header; MLflow's own store does not
    with sqlite3.connect(db) as c, sqlite3.connect(tmp_path / "b.db") as d:
        assert c.execute("pragma journal_mode").fetchone() == ("wal",)
        assert d.execute("pragma journal_mode").fetchone() == ("delete",)
    exp = tr.client.get_experiment(tr.experiment_id)
    assert exp.artifact_location == (tmp_path / "a" / "mlartifacts").resolve().as_uri()
    assert tr.client.get_experiment_by_name("Default") is not None
    assert not seed_sqlite_store(f"sqlite:///{db}")  # an existing store is left as it is
    assert tr.client.get_experiment_by_name("exp").experiment_id == tr.experiment_id
    assert not seed_sqlite_store("http://127.0.0.1:5000")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("BIASAUDIT_CACHE", str(tmp_path / "file"))  # no cache folder can be made
    assert sqlite_schema_template() is None and not seed_sqlite_store(f"sqlite:///{tmp_path / 'c.db'}")
    assert not (tmp_path / "c.db").exists()
    Tracker(f"sqlite:///{tmp_path / 'c.db'}", "exp")  # MLflow creates and migrates it itself
    assert schema(tmp_path / "c.db") == schema(db)


@pytest.mark.unit
def test_write_atomic_leaves_the_old_file_or_the_whole_new_one(tmp_path):
    from audit.outputs import write_atomic, write_text_atomic

    f = write_text_atomic(tmp_path / "d" / "f.txt", "old")

    def half(tmp: Path) -> None:
        tmp.write_text("ha")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(f, half)
    assert f.read_text() == "old" and [p.name for p in f.parent.iterdir()] == ["f.txt"]
    write_atomic(f, lambda tmp: tmp.write_bytes(b"new"))
    assert f.read_text() == "new" and [p.name for p in f.parent.iterdir()] == ["f.txt"]


@pytest.mark.e2e
@pytest.mark.parametrize("template", ["built by the racers", "none"])
def test_five_drivers_create_one_new_sqlite_store_at_once(tmp_path, small_result, template):
    """Five processes open the same *new* SQLite store at the same moment (the watcher's first
    poll submits several sweeps): the store is created and migrated once (a file lock), every
    process logs its result, each result is in the store exactly once. Before the lock, most of
    them died in MLflow's migrations (``table ... already exists``) with a traceback. Either the
    five also race to build the schema template in an empty user cache (one builds it, under its
    own lock, and the store is its copy), or no template can be made (the cache is a file) and
    MLflow migrates the store itself."""
    import subprocess
    import sys
    from collections import Counter

    from jobs.tracker import task_record
    from jobs.wal import WriteAheadLog

    ref, _, _, res = small_result
    repo = Path(__file__).resolve().parents[1]
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    n = 5
    procs, recs = [], []
    for i in range(n):
        o = TaskOutcome(index=0, status="finished", result=res, model={"model": ref, "kind": "static",
                        "backend": "fasttext-vec", "revision": res.provenance["revision"]})
        task = _task(key=f"key-{i}")
        rec = task_record(task, sweep=f"sweep{i}", sweep_id=f"sid{i}", model_spec=ModelSpec(ref=ref, name="tiny"),
                          kind="static", plan_key=task.key, outcome=o)
        recs.append(rec)
        (tmp_path / f"rec{i}.json").write_text(json.dumps(rec))
        args = [sys.executable, "-c", _CHILD, uri, "shared-experiment", str(tmp_path / f"rec{i}.json"),
                str(tmp_path / f"wal{i}.jsonl"), str(tmp_path / f"ready{i}"), str(tmp_path / "go")]
        cache = tmp_path / "cache"
        if template == "none":
            cache.write_text("")
        procs.append(subprocess.Popen(args, cwd=repo, env={**__import__("os").environ, "PYTHONPATH": str(repo),
                                                           "BIASAUDIT_CACHE": str(cache)},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    import time

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not all((tmp_path / f"ready{i}").exists() for i in range(n)):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        time.sleep(0.05)
    (tmp_path / "go").touch()  # all five start at the same moment
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
        d = json.loads(so.strip().splitlines()[-1])
        assert d["error"] is None and d["run_id"], d  # online: no process fell back to its log
    assert (cache / "mlflow").is_dir() == (template != "none")
    tr = Tracker(uri, "shared-experiment")
    runs = tr.task_runs()
    assert Counter(r.data.tags["audit.record"] for r in runs) == Counter({r["id"]: 1 for r in recs})
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.data.tags["audit.sweep"] for r in tr.sweep_runs()) == [f"sweep{i}" for i in range(n)]
    for i in range(n):
        assert WriteAheadLog(tmp_path / f"wal{i}.jsonl").pending() == []
    for r in runs:
        assert r.data.metrics["value"] == pytest.approx(res.value)


@pytest.mark.unit
def test_store_errors_at_construction_go_to_the_write_ahead_log_path(tmp_path, monkeypatch):
    """Any error while opening the store, also one raised by ``MlflowClient(...)`` itself, is a
    :class:`TrackingUnavailable` (the sweep then writes its write-ahead log), not a traceback."""
    import mlflow

    from jobs.tracker import TrackingUnavailable

    class Broken:
        def __init__(self, *a, **k):
            import sqlite3

            raise sqlite3.OperationalError("table _alembic_tmp_experiments already exists")

    monkeypatch.setattr(mlflow, "MlflowClient", Broken)
    with pytest.raises(TrackingUnavailable, match=r"unreachable \(OperationalError: table _alembic_tmp_experiments"):
        Tracker(f"sqlite:///{tmp_path}/mlflow.db", "x")


@pytest.mark.unit
def test_nested_fields_reach_mlflow_as_dotted_metrics():
    """Per-category / per-group tables (BBQ, HONEST, CrowS-Pairs per bias type) are flattened into
    child-run metrics; intervals become _low/_high; strings and non-finite numbers stay out."""
    from audit.result import Result
    from jobs.tracker import result_metrics

    res = Result(metric="bbq", value=0.1, items=None, coverage={}, missing={}, params={}, seed=0, provenance={},
                 fields={"per_category": {"Age": {"s_amb": 0.2, "ci": [0.1, 0.3]}}, "cis": {"s_dis": [-0.1, 0.4]},
                         "ci": [0.0, 0.2], "p_value_counts": "non-neutral pairs", "n_attributes": [8, 9],
                         "bad": float("nan")})
    m = result_metrics(res)
    assert m["per_category.Age.s_amb"] == 0.2
    assert (m["per_category.Age.ci_low"], m["per_category.Age.ci_high"]) == (0.1, 0.3)
    assert (m["cis.s_dis_low"], m["cis.s_dis_high"]) == (-0.1, 0.4) and (m["ci_low"], m["ci_high"]) == (0.0, 0.2)
    assert (m["n_attributes.0"], m["n_attributes.1"]) == (8.0, 9.0)
    assert "bad" not in m and not any("p_value_counts" in k for k in m) and m["value"] == 0.1


@pytest.mark.unit
def test_list_cells_are_json_text_whichever_path_writes_them():
    """``audit.result.json_cells``: a flat list or tuple cell goes straight to the C encoder, any
    other cell through ``_jsonable``; both give the text of ``json.dumps(_jsonable(cell))`` (the
    rule before the fast path, written here without it), NaN and inf as ``null``, numpy scalars as
    plain numbers, sets sorted, other objects as their ``str``."""
    import pandas as pd

    from audit.result import json_cells

    def rule(x):  # the general path, element by element (NaN/inf -> None, numpy -> Python)
        def plain(v):
            if isinstance(v, dict):
                return {str(k): plain(e) for k, e in v.items()}
            if isinstance(v, (list, tuple, np.ndarray)):
                return [plain(e) for e in (v.tolist() if isinstance(v, np.ndarray) else v)]
            if isinstance(v, (np.integer, np.bool_)):
                return v.item()
            if isinstance(v, (float, np.floating)):
                return float(v) if np.isfinite(v) else None
            return v
        return json.dumps(plain(sorted(x) if isinstance(x, set) else x), ensure_ascii=False, default=str)

    cells = [["Ärger", "naïve", "x"], ("a", "b"), [1, 2.5, -0.0, True, None, 10**20], [np.float64(0.1), 1e-300],
             [1.0, float("nan")], (float("inf"), "w"), [np.int64(3), np.float32(0.5), np.bool_(True)],
             [[1, 2], [3.0, float("-inf")]], [{"k": 1, 2: float("nan")}], {"b": (1, 2), 3: np.float64(2.0)},
             {"z", "a"}, np.array([0.25, np.nan]), [Path("/p")], []]
    out = json_cells(pd.DataFrame({"c": pd.Series(cells, dtype=object), "n": range(len(cells))}))
    assert out["c"].tolist() == [rule(x) for x in cells]
    assert out["c"].tolist()[:6] == ['["Ärger", "naïve", "x"]', '["a", "b"]', "[1, 2.5, -0.0, true, null, 100000000000000000000]",
                                     "[0.1, 1e-300]", "[1.0, null]", '[null, "w"]']
    assert out["c"].tolist()[10] == '["a", "z"]' and out["n"].tolist() == list(range(len(cells)))
