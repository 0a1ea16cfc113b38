"""End to end: a real Ray head on loopback, the smoke spec submitted with ``ray job submit``,
the MLflow store checked, then submitted again: no new child run, no model loaded.

Takes about two minutes (tiny model builds, 52 tasks, a second job); the session's
``job_head`` (tests/conftest.py) runs the jobs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest


from audit.datasets.external import data_root  # noqa: E402
from jobs.cluster import ray_env  # noqa: E402
from jobs.plan import attach_keys, expand  # noqa: E402
from jobs.spec import load_spec  # noqa: E402
from jobs.tracker import Tracker  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = data_root()
CROWS = SHARED / "crows-pairs" / "crows_pairs_anonymized.csv"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not CROWS.is_file(), reason=f"reference data not found at {SHARED}")]


def submit(address: str, out: Path, log: Path) -> subprocess.CompletedProcess:
    runtime_env = {"env_vars": {
        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
        "BIASAUDIT_DATA": str(SHARED), "BIASAUDIT_CROWS_PAIRS": str(CROWS),
    }}
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
           "--runtime-env-json", json.dumps(runtime_env), "--",
           "python", "-m", "jobs.sweep", "jobs/specs/smoke.yaml", "--output-dir", str(out), "--no-progress"]
    r = subprocess.run(cmd, cwd=REPO, env=ray_env(), capture_output=True, text=True, timeout=400)
    log.write_text(r.stdout + "\n--- stderr ---\n" + r.stderr, encoding="utf-8")
    return r


def load_lines(out: Path) -> list[dict]:
    p = out / "loads.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


def test_ray_job_submit_smoke_then_resume(tmp_path, monkeypatch, job_head):
    monkeypatch.setenv("BIASAUDIT_DATA", str(SHARED))
    out = tmp_path / "out"
    planned = expand(load_spec(REPO / "jobs" / "specs" / "smoke.yaml", output_dir=out)).tasks
    address = job_head  # the session's head (tests/conftest.py)
    r1 = submit(address, out, tmp_path / "job1.log")
    assert r1.returncode == 0 and "succeeded" in r1.stdout, (r1.stdout[-3000:], r1.stderr[-3000:])
    first_loads = load_lines(out)
    assert sorted(x["model"] for x in first_loads) == ["tiny-bert", "tiny-fasttext", "tiny-gpt2", "tiny-llama"]
    assert f"0 of {len(planned)} tasks already finished, {len(planned)} to run" in r1.stdout
    assert "models loaded: 4" in r1.stdout

    tr = Tracker(f"sqlite:///{out}/mlflow.db", "biasaudit-smoke")
    parents = tr.sweep_runs()
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = tr.task_runs()
    assert len(children) == len(planned) == 52
    assert {c.info.status for c in children} == {"FINISHED"}
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    assert len({c.data.tags["audit.key"] for c in children}) == 52
    # the keys the driver planned (models now built, so their revisions can be probed here)
    keyed = attach_keys(expand(load_spec(REPO / "jobs" / "specs" / "smoke.yaml", output_dir=out))).tasks
    assert {c.data.tags["audit.key"] for c in children} == {t.key for t in keyed}
    for c in children:
        assert "value" in c.data.metrics and c.data.params["revision"].startswith("sha256:")
        files = {f.path for f in tr.client.list_artifacts(c.info.run_id)}
        assert {"items.json", "result.json"} <= files, c.data.tags["mlflow.runName"]
    by_metric = {}
    for c in children:
        by_metric.setdefault(c.data.tags["audit.metric"], []).append(c)
    assert sorted((k, len(v)) for k, v in by_metric.items()) == [
        ("crows_pairs", 1), ("crows_pairs_causal", 2), ("lpbs", 1), ("lpbs_causal", 2), ("same", 20),
        ("seat", 6), ("weat", 20)]
    weat = [c for c in by_metric["weat"]]
    assert all("p_value" in c.data.metrics and "ci_low" in c.data.metrics for c in weat)

    pid = parents[0].info.run_id
    tables = {f.path for f in tr.client.list_artifacts(pid, "reports/tables")}
    plots = {f.path for f in tr.client.list_artifacts(pid, "reports/plots")}
    top = {f.path for f in tr.client.list_artifacts(pid, "reports")}
    assert "reports/tables/weat_en.tex" in tables and "reports/tables/crows_pairs_causal_en.tex" in tables
    assert "reports/plots/heatmap_weat_en.png" in plots and "reports/plots/effects_seat_en.png" in plots
    assert {"reports/results.parquet", "reports/run.log"} <= top
    tex = (out / "reports" / "tables" / "weat_en.tex").read_text()
    assert r"\toprule" in tex and "tiny-fasttext" in tex and "tiny-bert" in tex

    # second submission: everything is finished, nothing is loaded, no new child run
    r2 = submit(address, out, tmp_path / "job2.log")
    assert r2.returncode == 0 and "succeeded" in r2.stdout, (r2.stdout[-3000:], r2.stderr[-3000:])
    assert f"{len(planned)} of {len(planned)} tasks already finished, 0 to run" in r2.stdout
    assert "no model loaded" in r2.stdout and "models loaded: 0" in r2.stdout
    assert load_lines(out) == first_loads
    tr2 = Tracker(f"sqlite:///{out}/mlflow.db", "biasaudit-smoke")
    assert len(tr2.task_runs()) == 52
    parents2 = tr2.sweep_runs()
    assert len(parents2) == 1 and parents2[0].data.tags["audit.invocations"] == "2"


def _submit(address: str, args: list[str], env_vars: dict[str, str], log: Path, extra: list[str] = ()) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
           "--runtime-env-json", json.dumps({"env_vars": env_vars}), *extra, "--", "python", "-m", "jobs.sweep", *args]
    r = subprocess.run(cmd, cwd=REPO, env=ray_env(), capture_output=True, text=True, timeout=400)
    log.write_text(r.stdout + "\n--- stderr ---\n" + r.stderr, encoding="utf-8")
    return r


def test_ray_job_submit_literal_output_location_and_impossible_resources(tmp_path, job_head):
    """The README's ``ray job submit ... -- python -m jobs.sweep SPEC`` without ``--output-dir``:
    the spec's relative output_dir is written under ``$BIASAUDIT_HOME``, not in Ray's temporary
    copy of the working directory. A driver holding 1 of the head's 2 CPUs
    (``--entrypoint-num-cpus 1``) with model workers asking for 2: refused at once, exit 4, one
    line naming the resources and the driver's reservation (before: a silent wait forever)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_sweep_service import write_spec, write_vec

    vec = write_vec(tmp_path / "m.vec", 0)
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "literal", f'  - {{name: a, ref: "{vec}"}}', out=Path("out/literal"),
                      ray="actor_num_cpus: 0.5, stats_num_cpus: 0.5, batch_size: 1")
    big = write_spec(tmp_path, "toolarge", f'  - {{name: a, ref: "{vec}"}}', out=tmp_path / "big",
                     ray="actor_num_cpus: 2, stats_num_cpus: 1")
    env = {"BIASAUDIT_HOME": str(home), "TOKENIZERS_PARALLELISM": "false", "BIASAUDIT_DATA": str(SHARED)}
    address = job_head  # the session's head (tests/conftest.py)
    r = _submit(address, [str(spec), "--no-progress"], env, tmp_path / "literal.log")
    assert r.returncode == 0 and "succeeded" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
    target = home / "out" / "literal"
    assert f"inside a Ray job: output directory out/literal -> {target}" in r.stdout
    assert (target / "reports" / "results.parquet").is_file() and (target / "mlflow.db").is_file()
    tr = Tracker(f"sqlite:///{target}/mlflow.db", "biasaudit-literal")
    assert len(tr.task_runs()) == 2 and {c.info.status for c in tr.task_runs()} == {"FINISHED"}
    assert not (REPO / "out" / "literal").exists()

    t0 = time.monotonic()
    r2 = _submit(address, [str(big), "--no-progress"], env, tmp_path / "toolarge.log",
                 extra=["--entrypoint-num-cpus", "1"])
    seconds = time.monotonic() - t0
    assert r2.returncode != 0, (r2.stdout[-3000:], r2.stderr[-3000:])
    text = r2.stdout + r2.stderr
    assert "exit code 4" in text or "exited with code 4" in text, text[-3000:]
    lines = [x for x in text.splitlines() if "audit: error:" in x]
    assert lines and ("cannot schedule: a model worker (ray.actor_num_cpus=2) needs {'CPU': 2} on one node, but no "
                      "node offers it (node 127.0.0.1 has {'CPU': 2}, {'CPU': 1} of which this job's driver holds") in lines[0]
    p = Tracker(f"sqlite:///{tmp_path / 'big'}/mlflow.db", "biasaudit-toolarge").sweep_runs()[0]
    assert p.data.tags["audit.state"] == "stuck" and p.info.status == "FAILED"
    print(f"\nimpossible spec refused in {seconds:.1f} s (job submission included)", file=sys.stderr)
