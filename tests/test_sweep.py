"""Sweeps on an embedded local Ray: a model actor killed mid-sweep, failures recorded, resume.

One local Ray (2 CPUs, 200 MB object store) serves the module; the models are tiny fastText
models built by the spec itself (``build: {kind: fasttext}``), so the module runs in seconds.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from actors.model_actor import ModelServer  # noqa: E402
from audit import runner  # noqa: E402
from jobs.spec import load_spec  # noqa: E402
from jobs.sweep import run_sweep  # noqa: E402
from jobs.tracker import Tracker  # noqa: E402

pytestmark = pytest.mark.ray

TESTS = ["weat1", "weat2", "weat6", "weat7", "weat8", "weat9"]


class SlowServer(ModelServer):
    """A model server that takes 0.5 s per request, so a kill lands while work is pending."""

    def measure_batch(self, requests, tests):
        time.sleep(0.5)
        return super().measure_batch(requests, tests)


def write_spec(tmp_path: Path, name: str, models: str, metrics: str = "[weat]", tests=TESTS) -> Path:
    text = f"""
name: {name}
seed: 0
output_dir: {tmp_path / 'out'}
permutations: 300
n_bootstrap: 50
languages: [en]
tests: [{", ".join(tests)}]
metrics: {metrics}
models:
{models}
ray: {{batch_size: 1, actor_num_cpus: 0.5, stats_num_cpus: 1, max_restarts: 2, max_task_retries: 3}}
"""
    p = tmp_path / f"{name}.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def child_runs(spec):
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    return tr.task_runs()


def loads(spec) -> list[dict]:
    p = spec.output_dir / "loads.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


def test_killed_actor_is_restarted_and_every_result_arrives_once(tmp_path, local_ray):
    spec = load_spec(write_spec(tmp_path, "killtest", "  - {name: ft, build: {kind: fasttext, dim: 8, epoch: 1}}"))
    killed = []

    def killer():
        """SIGKILL the actor process shortly after it loaded its model, while most of its
        requests (0.5 s each) are still queued."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            first = loads(spec)
            if first:
                time.sleep(0.3)
                os.kill(first[0]["pid"], signal.SIGKILL)
                killed.append(first[0]["pid"])
                return
            time.sleep(0.05)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    out = run_sweep(spec, progress=False, server_cls=SlowServer)
    th.join(timeout=1)
    assert killed, "the actor was never killed"
    assert out.exit_code == 0 and out.planned == out.ran == len(TESTS) and out.failed == 0
    runs = child_runs(spec)
    keys = Counter(r.data.tags["audit.key"] for r in runs)
    assert len(runs) == len(TESTS) and set(keys.values()) == {1}  # every result, exactly once
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["audit.test"] for r in runs} == {f"en/{t}" for t in TESTS}
    # the actor was restarted (a second load in another process) and served the rest
    pids = [x["pid"] for x in loads(spec) if x["model"] == "ft"]
    assert len(pids) == 2 and pids[0] == killed[0] and pids[1] != pids[0]
    assert out.loads == 2
    # the numbers are those of the same task run in one process
    model_path = str(spec.output_dir / "models" / "ft" / "model.bin")
    df = out.results.set_index("test")
    for t in ("weat1", "weat8"):
        ref = runner.score(model_path, t, "weat", {"permutations": 300, "n_bootstrap": 50}, seed=0)
        assert df.loc[f"en/{t}", "value"] == pytest.approx(ref.value, abs=1e-12)
        assert df.loc[f"en/{t}", "p_value"] == pytest.approx(ref.fields["p_value"], abs=1e-12)

    # resume: nothing left to do, so no Ray work and no model load
    before = loads(spec)
    again = run_sweep(spec, progress=False)
    assert (again.ran, again.skipped_existing, again.loads, again.exit_code) == (0, len(TESTS), 0, 0)
    assert loads(spec) == before and len(child_runs(spec)) == len(TESTS)
    assert len(again.results) == len(TESTS)
    assert (spec.output_dir / "reports" / "tables" / "weat_en.tex").is_file()


def test_failures_are_recorded_and_the_sweep_goes_on(tmp_path, local_ray, capsys, monkeypatch):
    missing = tmp_path / "no-such-model.vec"
    models = f"""  - {{name: ft, build: {{kind: fasttext, dim: 8, epoch: 1}}}}
  - {{name: broken, ref: "{missing}"}}"""
    metrics = "[weat, {name: weat, params: {ddof: 7}, tests: [weat1]}]"
    spec = load_spec(write_spec(tmp_path, "failtest", models, metrics=metrics, tests=["weat1", "weat2"]))
    out = run_sweep(spec, progress=False)
    assert out.exit_code == 1
    df = out.results
    assert len(df) == 6  # 2 models x (2 weat tasks + 1 weat with ddof 7)
    failed = df[df["status"] == "failed"]
    assert set(failed["model"]) == {"ft", "broken"} and len(failed) == 4
    broken = failed[failed["model"] == "broken"]["error"].tolist()
    assert all(e.startswith(f"model '{missing}' could not be loaded: ModelError") and str(missing) in e for e in broken)
    (ddof_err,) = failed[failed["model"] == "ft"]["error"].tolist()
    assert "ddof" in ddof_err
    ok = df[df["status"] == "finished"]
    assert set(ok["model"]) == {"ft"} and len(ok) == 2 and ok["value"].notna().all()
    printed = capsys.readouterr().out
    summary = printed[printed.index("summary:"):]
    # each distinct failure once, with its count: the load failure is not repeated per task
    assert "4 failed task(s), 2 distinct failure(s):" in summary
    assert f"  broken: 3 tasks (en/weat1 weat, en/weat2 weat, en/weat1 weat): model '{missing}' could not be loaded" in summary
    assert summary.count("could not be loaded") == 1
    assert "  ft | en | en/weat1 | weat: ParameterError: ddof" in summary
    # the headline values, model x test, like the reports
    ft_value = ok.set_index("test").loc["en/weat2", "value"]
    assert "weat (en): headline value per model and test" in summary
    ft_weat1 = ok.set_index("test").loc["en/weat1", "value"]  # and the ddof=7 task of the same cell failed
    assert any(line.split()[:3] == ["ft", f"{ft_weat1:.3f}/fail", f"{ft_value:.3f}"] for line in summary.splitlines()), summary
    # a re-run retries only the failures, into new runs; nothing is overwritten
    n_runs = len(child_runs(spec))
    from jobs.tracker import Tracker

    searches = []
    real_search = Tracker._search
    monkeypatch.setattr(Tracker, "_search", lambda self, f: searches.append(f) or real_search(self, f))
    again = run_sweep(spec, progress=False)
    # the task runs: the stale RUNNING ones and the finished keys to resume by at the start; at
    # the end one search serves the report's rows, the adjusted p-values and the parent's totals
    # (2.3 ms of CPU per run in SQLite, measured on 561 runs: the end searched three times before)
    task_searches = [f for f in searches if "'task'" in f]
    assert task_searches == ["tags.`audit.role` = 'task' and attributes.status = 'RUNNING'",
                             "tags.`audit.role` = 'task' and attributes.status = 'FINISHED'",
                             "tags.`audit.role` = 'task'"], searches
    assert again.ran == 4 and again.skipped_existing == 2 and again.exit_code == 1
    runs = child_runs(spec)
    assert len(runs) == n_runs + 4
    assert Counter(r.info.status for r in runs) == {"FINISHED": 2, "FAILED": 8}
    assert all("p_holm" in r.data.metrics for r in runs if r.info.status == "FINISHED")


@pytest.mark.parametrize("alternative", ["greater", "two-sided", "less"])
def test_sharded_exact_test_equals_the_unsharded_one(local_ray, monkeypatch, alternative):
    """A large exact permutation test split over Ray tasks (shard=(i, m)) gives exactly the
    unsharded p-value; the other fields are unchanged."""
    import numpy as np

    import actors.stats as st
    from audit import stats
    from audit.runner import Measurement, analyse

    rng = np.random.default_rng(7)
    X, Y, A, B = (rng.normal(size=(n, 8)) for n in (11, 13, 6, 5))
    meas = Measurement(family="association", targets=[X, Y], attributes=[A, B])
    params = {"permutations": "exact", "n_bootstrap": 40, "alternative": alternative}
    assert not stats.shards_worthwhile(24, 11, "exact", 4)  # C(24, 11) = 2.5e6 partitions: below the threshold
    monkeypatch.setattr(stats, "SHARD_MIN_PARTITIONS", 1000)
    assert stats.shards_worthwhile(24, 11, "exact", 4)
    assert not stats.shards_worthwhile(24, 11, 500, 4)  # a sampled test is not split
    ref = analyse(meas, "weat", params, seed=3)
    map_fn = st.ray_map()  # Ray is up: four remote shard tasks
    assert map_fn is not None
    out = analyse(meas, "weat", params, seed=3, shards=4, map_fn=map_fn)
    assert out.fields["n_extreme"] == ref.fields["n_extreme"] and out.fields["p_value"] == ref.fields["p_value"]
    assert out.fields["p_method"] == "exact" and out.fields["n_partitions"] == ref.fields["n_partitions"] == 2496144
    assert out.value == ref.value and out.fields["ci"] == ref.fields["ci"]
    req = st.AnalyseRequest(index=0, test="t", metric="weat", params=params, seed=3, exact_shards=4)
    assert req.exact_shards == 4
    assert out.fields["exact_shards"] == 4
