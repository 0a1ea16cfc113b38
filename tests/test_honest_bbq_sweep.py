"""HONEST and BBQ in a sweep: planned per model kind from the registry, MLflow child runs with the
headline numbers and the per-item table, and a task whose parameters do not fit its test (an
unknown BBQ category) fails with that one-line reason while the others finish."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.datasets.external import data_root  # noqa: E402
from jobs.plan import expand  # noqa: E402
from jobs.spec import load_spec  # noqa: E402
from jobs.sweep import run_sweep  # noqa: E402

DATA = data_root()
pytestmark = [pytest.mark.ray, pytest.mark.skipif(not (DATA / "bbq" / "en").is_dir() or not (DATA / "hurtlex").is_dir(),
                                reason="BBQ or HurtLex data absent")]

SPEC = """
name: honest-bbq
seed: 0
output_dir: {out}
tests: [en/honest, en/bbq, de/bbq, en/weat1]
metrics:
  - {{name: honest, params: {{k: [1, 5]}}}}
  - {{name: bbq, params: {{categories: [Age], limit: 2, truncation: left, n_bootstrap: 50}}}}
  - weat
models:
  - {{name: tiny-bert, build: {{kind: bert}}}}
  - {{name: glove, ref: glove-6b-50d}}
ray:
  num_cpus: 2
  object_store_memory: 200000000
  actor_num_cpus: 0.5
"""


def test_sweep_records_and_isolates_failures(tmp_path, local_ray):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(out=tmp_path / "out"), encoding="utf-8")
    spec = load_spec(path)
    plan = expand(spec)
    planned = {(t.model, t.test, t.metric) for t in plan.tasks}
    assert planned == {("tiny-bert", "en/honest", "honest"), ("tiny-bert", "en/bbq", "bbq"),
                       ("tiny-bert", "de/bbq", "bbq"), ("tiny-bert", "en/weat1", "weat"),
                       ("glove", "en/weat1", "weat")}
    reasons = {(s.model, s.metric): s.reason for s in plan.skipped}
    assert "honest cannot run on static word vectors" in reasons[("glove", "honest")]
    assert "bbq cannot run on static word vectors" in reasons[("glove", "bbq")]

    out = run_sweep(spec, progress=False)
    df = out.results.set_index(["model", "test", "metric"])
    assert out.exit_code == 1 and out.failed == 1 and out.ran == 5
    bad = df.loc[("tiny-bert", "de/bbq", "bbq")]
    assert bad.status == "failed"
    assert "categories: unknown category 'Age'; this test has: Gender_identity" in bad.error
    assert "\n" not in bad.error.strip()
    for key in [("tiny-bert", "en/honest", "honest"), ("tiny-bert", "en/bbq", "bbq"), ("glove", "en/weat1", "weat")]:
        assert df.loc[key].status == "finished"

    import mlflow

    # a client of its own: mlflow.set_tracking_uri would set MLFLOW_TRACKING_URI for every later test
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = {(r.data.tags.get("audit.test"), r.data.tags.get("audit.metric"), r.data.tags.get("audit.model")): r
            for r in client.search_runs(exps)}
    bbq_run = runs[("en/bbq", "bbq", "tiny-bert")]
    m = bbq_run.data.metrics
    assert {"value", "acc", "acc_amb", "acc_disamb", "s_dis", "s_amb", "ci_low", "ci_high", "n_items"} <= set(m)
    assert m["value"] == m["s_amb"] and m["n_items"] == 4
    arts = {a.path for a in client.list_artifacts(bbq_run.info.run_id)}
    assert "items.json" in arts
    items = json.loads(Path(client.download_artifacts(bbq_run.info.run_id, "items.json", str(tmp_path))).read_text())
    assert {"score0", "prediction", "predicted_biased"} <= set(items["columns"])
    honest_run = runs[("en/honest", "honest", "tiny-bert")]
    assert {"honest_k1", "honest_k5", "n_templates"} <= set(honest_run.data.metrics)
    assert honest_run.data.metrics["value"] == honest_run.data.metrics["honest_k5"]
