"""End to end: ``audit watch`` over a local model folder detects a planted bias regression.

Three revisions of one static model (word2vec text, the WEAT 1 and WEAT 7 words) appear one
after another in ``<root>/m/<revision>/``: v1, v2 = v1 plus small retraining noise (no change),
v3 = v2 with its target words moved along the bias direction (a planted increase of |d|). The
watcher submits each revision's sweep to an in-process submitter that runs it at once on a local
Ray (the real sweep driver, MLflow store, per-item tables), then checks each finished revision
against the previous one. v2 is ``compared`` (no regression); v3 is a ``regression``: tags on its
parent run, the diff report attached, a decision line, the notification (a command and an HTTP
POST to a loopback receiver) and exit status 3, also from the command line. Unit tests of the
spec's ``regression:`` section, the choice of baselines and a failing notification follow.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import pytest
import yaml

from audit.errors import DataError, ParameterError
from jobs import watch as W
from jobs.watch import AuditIndex, SweepRecord, Watcher, load_watch_spec
from jobs.watch.regression import baselines_of, notify
from test_regression import planted_models, write_w2v
from watch_fakes import InlineSubmitter, Receiver

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the sweep template is relative to the current directory
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def add_revision(root: Path, name: str, vectors: dict, mtime: float) -> Path:
    p = Path(write_w2v(root / "m" / name / "vectors.vec", vectors))
    os.utime(p, (mtime, mtime))
    os.utime(p.parent, (mtime, mtime))
    return p


def watch_spec(tmp_path: Path, root: Path, tracking: dict | None = None, **regression) -> Path:
    data = {
        "name": "rel" if tracking is None else "rel-pg",
        **({"tracking": tracking} if tracking else {}),
        "output_dir": str(tmp_path / "watch"),
        "backoff": {"initial": 0.1, "retries": 0, "jitter": 0},
        "audit": {"spec": "jobs/specs/smoke.yaml",
                  "overrides": {"tests": ["weat1", "weat7"], "metrics": ["weat"], "permutations": 300, "n_bootstrap": 100,
                                "ray": {"num_cpus": 2, "actor_num_cpus": 0.25, "stats_num_cpus": 1}},
                  "model": {"languages": ["en"]}},
        "watch": [{"local": str(root), "file": "vectors.vec"}],
        "regression": {"metrics": ["weat"], "min_increase": 0.2, "alpha": 0.05, "n_bootstrap": 200,
                       "permutations": 2000, **regression},
    }
    p = tmp_path / "watch.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    return p


def decisions(tmp_path: Path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "watch" / "decisions.jsonl").read_text().splitlines()]


def parent_of(spec, revision: str):
    from mlflow import MlflowClient

    idx = AuditIndex.load(spec.resolved_tracking_uri, spec.resolved_experiment)
    [rec] = [r for r in idx.sweeps.values() if r.revision == revision]
    return rec, MlflowClient(tracking_uri=spec.resolved_tracking_uri).get_run(rec.run_id)


@pytest.mark.parametrize("store", [pytest.param("sqlite", marks=pytest.mark.ray),
                                   pytest.param("postgresql", marks=pytest.mark.e2e)])
def test_watch_detects_a_planted_bias_increase_and_not_a_revision_without_change(tmp_path, local_ray, store, request):
    """On the embedded SQLite store and on an MLflow server backed by PostgreSQL (``pg_mlflow``)."""
    tracking = {"uri": request.getfixturevalue("pg_mlflow")["uri"]} if store == "postgresql" else None
    root = tmp_path / "models"
    v1, v2, v3 = planted_models(seed=11, delta=0.8)
    t0 = time.time() - 3600
    hook_out = tmp_path / "hook.json"
    hook = tmp_path / "hook.py"
    hook.write_text("import json, os, sys\n"
                    "body = json.load(sys.stdin)\n"
                    "same = json.load(open(os.environ['AUDIT_REGRESSION_JSON'])) == body\n"
                    f"open({str(hook_out)!r}, 'a').write(json.dumps({{'same_file': same, 'body': body}}) + '\\n')\n",
                    encoding="utf-8")
    with Receiver() as rx:
        p = watch_spec(tmp_path, root, tracking, notify={"command": f"{shlex.quote(sys.executable)} "
                                                                    f"{shlex.quote(str(hook))}",
                                                         "url": rx.url, "timeout": 20})
        spec = load_watch_spec(p)
        sub = InlineSubmitter()

        def poll():
            return Watcher(spec, submitter=sub, out=None).poll()

        # v1: audited; then checked: nothing earlier to compare with
        add_revision(root, "v1", v1, t0)
        r = poll()
        assert [d.revision for d in r.submitted] == ["v1"] and r.exit_code == 0
        assert [o.exit_code for o in sub.outcomes.values()] == [0]
        r = poll()
        [c] = [d for d in r.decisions if d.action == "compared"]
        assert c.revision == "v1" and c.reason == f"no earlier audited revision of {root / 'm'}" and r.exit_code == 0
        rec1, run1 = parent_of(spec, "v1")
        assert run1.data.tags["audit.regression"] == "false" and run1.data.tags["audit.regression_baseline"] == "none"
        assert (run1.data.tags["audit.watch.repo"], run1.data.tags["audit.watch.revision"]) == (str(root / "m"), "v1")

        # v2: no change (retraining noise only): compared with v1, no regression
        add_revision(root, "v2", v2, t0 + 60)
        assert [d.revision for d in poll().submitted] == ["v2"]
        r = poll()
        [c] = [d for d in r.decisions if d.action == "compared"]
        assert c.revision == "v2" and c.reason.startswith("no regression against v1 (2 (test, metric) pair(s) compared")
        assert r.exit_code == 0 and not r.regressions
        rec2, run2 = parent_of(spec, "v2")
        assert run2.data.tags["audit.regression"] == "false" and run2.data.tags["audit.regression_baseline"] == "v1"
        table = json.loads((tmp_path / "watch" / "regressions" / rec2.name / "comparison.json").read_text())
        assert [x["regression"] for x in table["comparisons"]] == [False, False]
        assert all(abs(x["delta_abs"]) < 0.2 for x in table["comparisons"])
        assert rx.bodies == [] and not hook_out.exists()

        # v3: the planted increase: a regression, from the command line too (exit status 3)
        add_revision(root, "v3", v3, t0 + 120)
        assert [d.revision for d in poll().submitted] == ["v3"]
        assert W.main([str(p), "--once", "--quiet"]) == 3
        rec3, run3 = parent_of(spec, "v3")
        tags = run3.data.tags
        assert tags["audit.regression"] == "true" and tags["audit.regression_baseline"] == "v2"
        assert tags["audit.regression_tests"] == "en/weat1 weat, en/weat7 weat"
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=spec.resolved_tracking_uri)
        files = {f.path for f in client.list_artifacts(rec3.run_id, "regression")}
        assert files == {"regression/regression.md", "regression/regression.png", "regression/comparison.json",
                         "regression/comparison.csv"}
        md = Path(client.download_artifacts(rec3.run_id, "regression/regression.md", str(tmp_path))).read_text()
        assert "- result: **REGRESSION: en/weat1 weat, en/weat7 weat**" in md and "## Against v2 (sweep" in md
        assert "| en/weat1 | weat |" in md and "| REGRESSION |" in md
        png = (tmp_path / "watch" / "regressions" / rec3.name / "regression.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        # the numbers: each revision's stored headline, the change, its adjusted p-value
        rows = {x["test"]: x for x in json.loads(
            (tmp_path / "watch" / "regressions" / rec3.name / "comparison.json").read_text())["comparisons"]}
        for test in ("weat1", "weat7"):
            x = rows[test]
            mb = client.search_runs([run3.info.experiment_id],
                                    f"tags.`mlflow.parentRunId` = '{rec3.run_id}' and tags.`audit.test` = 'en/{test}'")
            assert x["value_b"] == pytest.approx(mb[0].data.metrics["value"], abs=1e-8)
            assert x["delta_abs"] >= 0.2 and x["p_holm"] <= 0.05 and x["regression"] is True
        # the decision line
        [reg] = [x for x in decisions(tmp_path) if x["action"] == "regression"]
        assert reg["revision"] == "v3" and reg["sweep"] == rec3.name
        assert reg["reason"].startswith("more biased than v2: en/weat1 weat: ")
        assert "(notified: command " in reg["reason"] and f"POST {rx.url} 204" in reg["reason"]
        # the notifications: the same JSON by command (stdin and file) and by HTTP POST
        [posted] = rx.bodies
        assert posted["path"] == "/hooks/bias" and posted["type"] == "application/json"
        body = posted["json"]
        assert (body["event"], body["watch"], body["repo"], body["revision"], body["baselines"]) == (
            "bias_regression", "rel" if tracking is None else "rel-pg", str(root / "m"), "v3", ["v2"])
        assert body["tests"] == ["en/weat1 weat", "en/weat7 weat"] and body["run_id"] == rec3.run_id
        assert {x["test"] for x in body["regressions"]} == {"weat1", "weat7"}
        [line] = hook_out.read_text().splitlines()
        assert json.loads(line) == {"same_file": True, "body": body}

        # once only: the next poll sees the tag
        r = poll()
        assert r.exit_code == 0 and not r.regressions and len(rx.bodies) == 1
        assert [d.action for d in r.decisions if d.revision == "v3"] == ["found", "skipped"]


# --------------------------------------------------------------------------------------
# units: the spec section, the baselines, a failing notification
# --------------------------------------------------------------------------------------


BAD = [
    ({"metrics": ["ect"]}, ParameterError, "regression.metrics[0]: ect offers no paired comparison; comparable: weat"),
    ({"metrics": ["wat"]}, ParameterError, "regression.metrics[0]: unknown metric 'wat'"),
    ({"alpha": 0}, ParameterError, "regression.alpha: must be > 0, got 0"),
    ({"alpha": 2}, ParameterError, "regression.alpha: must be <= 1, got 2"),
    ({"min_increase": "big"}, DataError, "regression.min_increase: expected a number, got 'big'"),
    ({"adjust": "bonf"}, ParameterError, "regression.adjust: unknown adjustment 'bonf'"),
    ({"previous": False}, ParameterError, "regression.previous: false needs a `baseline` revision"),
    ({"notify": {}}, DataError, "regression.notify: give a `command`, a `url` or both"),
    ({"notify": {"url": "ftp://x"}}, ParameterError, "regression.notify.url: 'ftp://x': expected an http(s):// URL"),
    ({"notify": {"command": "'unclosed"}}, ParameterError, "regression.notify.command: \"'unclosed\": cannot be split"),
    ({"notfy": {}}, DataError, "regression.notfy: unknown field (did you mean 'notify'?)"),
    ({"permutations": "many"}, ParameterError, "regression.permutations: expected exact, auto or a positive integer"),
]


@pytest.mark.unit
@pytest.mark.parametrize("change,cls,msg", BAD, ids=[m.split(":")[0] + str(i) for i, (_, _, m) in enumerate(BAD)])
def test_regression_section_errors_name_the_field(tmp_path, change, cls, msg):
    data = {"name": "w", "audit": {"spec": "jobs/specs/smoke.yaml"}, "watch": ["org/model"], "regression": change}
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(cls) as e:
        load_watch_spec(p)
    assert str(e.value).startswith(f"{p}: ") and msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.unit
def test_regression_section_defaults(tmp_path):
    data = {"name": "w", "audit": {"spec": "jobs/specs/smoke.yaml"}, "watch": ["org/model"],
            "regression": {"baseline": 3, "notify": {"url": "https://hooks.example/x"}}}
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(data), encoding="utf-8")
    rs = load_watch_spec(p).regression
    assert (rs.metrics, rs.min_increase, rs.alpha, rs.adjust, rs.baseline, rs.previous) == (None, 0.0, 0.05, "holm", "3", True)
    assert rs.notify == W.Notify(command=None, url="https://hooks.example/x", timeout=10.0)


def _rec(rev, when, status="FINISHED", repo="/m", start=0):
    return SweepRecord(f"run-{rev}", status, 1, name=f"s-{rev}", source="local", repo=repo, revision=rev, when=when,
                       start_time=start)


@pytest.mark.unit
def test_baselines_previous_pinned_and_waiting(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump({"name": "w", "audit": {"spec": "jobs/specs/smoke.yaml"}, "watch": ["org/model"],
                                 "regression": {"baseline": "v1"}}), encoding="utf-8")
    spec = load_watch_spec(p)
    idx = AuditIndex(sweeps={r.name: r for r in (
        _rec("v1", "2025-01-01"), _rec("v2", "2025-02-01"), _rec("v3", "2025-03-01"), _rec("x9", "2025-02-15", repo="/other"),
        _rec("v4", "2025-04-01", status="FAILED"), _rec("v5", "2025-05-01"))})
    got, notes, wait = baselines_of(spec, idx, idx.sweeps["s-v3"])
    assert [b.revision for b in got] == ["v2", "v1"] and notes == [] and not wait
    got, notes, wait = baselines_of(spec, idx, idx.sweeps["s-v5"])  # v4 failed: v3 is the previous audited one
    assert [b.revision for b in got] == ["v3", "v1"]
    got, notes, wait = baselines_of(spec, idx, idx.sweeps["s-v1"])
    assert got == [] and notes == ["no earlier audited revision of /m"] and not wait
    idx.sweeps["s-v4"] = _rec("v4", "2025-04-01", status="RUNNING")  # an earlier revision still being audited
    assert baselines_of(spec, idx, idx.sweeps["s-v5"]) == ([], [], True)


@pytest.mark.unit
def test_failing_notifications_are_reported(tmp_path):
    n = W.Notify(command=f"{shlex.quote(sys.executable)} -c 'import sys; sys.exit(7)'", url="http://127.0.0.1:9/x",
                 timeout=5)
    done, failed = notify(n, {"event": "bias_regression"})
    assert done == []
    assert failed[0].startswith("notification command ") and failed[0].endswith("exited 7")
    assert failed[1].startswith("notification POST http://127.0.0.1:9/x: ")
