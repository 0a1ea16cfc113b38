"""Benchmark: the smoke sweep through Ray against the same tasks run sequentially in one process.

Run from the repository root::

    .venv/bin/python benchmarks/sweep.py [--spec jobs/specs/smoke.yaml] [--output-dir DIR]
    .venv/bin/python benchmarks/sweep.py --spec jobs/specs/default.yaml --tests 'weat*' --metrics weat,same

Both legs run the tasks that ``--spec`` plans (the tiny models are built once beforehand and
the build is not timed):

* *sequential*: a naive loop in this process, :func:`audit.runner.score` per task, which loads
  the task's model every time (as a loop over ``audit score`` calls would); no tracking;
* *ray*: :func:`jobs.sweep.run_sweep` into a fresh output directory -- embedded local Ray, one
  actor per model (each model loaded once), statistics as CPU tasks, every result written to
  MLflow, reports at the end. Its time is printed with and without Ray's start-up.

Model loads are counted in both legs (a wrapper around :func:`audit.runner.load_model` for the
loop; the actors' load log for Ray). The results of both legs are compared task by task (same
seeds: identical numbers) and the largest difference is printed. ``ratio`` = sequential time /
Ray time. ``--tests``/``--metrics`` cut a spec down (e.g. the default spec's real models, whose
loads cost seconds, on the ten WEAT tests).

The 2-core machine is shared: the load average is printed next to the times.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "jobs" / "specs" / "smoke.yaml"))
    ap.add_argument("--output-dir", default=None, help="where built models and the Ray leg's store go (default: a temp dir)")
    ap.add_argument("--tests", default=None, help="comma-separated test names/globs replacing the spec's")
    ap.add_argument("--metrics", default=None, help="comma-separated metric names replacing the spec's")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("BIASAUDIT_DATA", str(ROOT.parent / "shared" / "data"))

    import numpy as np

    from audit import runner
    from jobs.builders import build_models
    from jobs.plan import expand
    from jobs.spec import load_spec
    from jobs.sweep import run_sweep

    out = Path(args.output_dir or tempfile.mkdtemp(prefix="biasaudit-bench-"))
    spec = load_spec(args.spec, output_dir=out / "ray")
    if args.tests:
        spec = dataclasses.replace(spec, tests=tuple(args.tests.split(",")),
                                   metrics=tuple(dataclasses.replace(m, tests=None) for m in spec.metrics))
    if args.metrics:
        keep = set(args.metrics.split(","))
        spec = dataclasses.replace(spec, metrics=tuple(m for m in spec.metrics if m.name in keep))
    build_models(spec, expand(spec))  # not timed: both legs use the same built files
    plan = expand(spec)
    print(f"spec {spec.name}: {len(plan.tasks)} tasks over {len(plan.models)} models; load average {os.getloadavg()[0]:.2f}")

    # ---- sequential leg: runner.score per task, reloading the model each time
    loads = {"n": 0}
    real_load = runner.load_model

    def counting_load(*a, **k):
        loads["n"] += 1
        return real_load(*a, **k)

    runner.load_model = counting_load
    seq: dict[tuple, float] = {}
    t0 = time.perf_counter()
    try:
        for t in plan.tasks:
            info = plan.models[t.model]
            res = runner.score(info.local_ref, plan.tests[t.test], t.metric, dict(t.params), seed=t.seed,
                               model_options=dict(info.spec.options))
            seq[(t.model, t.test_name, res.metric)] = res.value
    finally:
        runner.load_model = real_load
    t_seq = time.perf_counter() - t0
    print(f"sequential: {t_seq:7.1f} s, {len(plan.tasks)} tasks, {loads['n']} model loads; "
          f"load average {os.getloadavg()[0]:.2f}")

    # ---- Ray leg: the sweep itself (fresh store), with and without Ray's start-up
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=spec.ray.num_cpus, object_store_memory=spec.ray.object_store_memory,
             include_dashboard=False, log_to_driver=False)
    t_init = time.perf_counter() - t0
    try:
        t1 = time.perf_counter()
        outcome = run_sweep(dataclasses.replace(spec), progress=False)
        t_sweep = time.perf_counter() - t1
    finally:
        ray.shutdown()
    t_ray = t_init + t_sweep
    print(f"ray:        {t_ray:7.1f} s ({t_init:.1f} s Ray start-up + {t_sweep:.1f} s sweep incl. MLflow and "
          f"reports), {outcome.ran} tasks, {outcome.loads} model loads, {outcome.failed} failed; "
          f"load average {os.getloadavg()[0]:.2f}")

    df = outcome.results
    diffs = []
    for _, r in df.iterrows():
        k = (r["model"], r["test"], r["metric"])
        if k in seq and np.isfinite(r["value"]):
            diffs.append(abs(seq[k] - r["value"]))
    print(f"results compared: {len(diffs)} of {len(plan.tasks)}, max |diff| = {max(diffs) if diffs else float('nan'):.3g}")
    print(f"ratio sequential / ray: {t_seq / t_ray:.2f} (end to end), {t_seq / t_sweep:.2f} (Ray already running); "
          f"model loads {loads['n']} vs {outcome.loads}")
    return 0 if len(diffs) == len(plan.tasks) and max(diffs) < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
