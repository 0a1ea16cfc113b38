"""Benchmark: the garbage collector's thresholds in biasaudit's processes (actors/gc_tuning.py).

Run: ``.venv/bin/python benchmarks/gc_thresholds.py [--repeats R]`` (default 3; about a minute on
2 cores). Two workloads, each in fresh Python processes, with CPython's thresholds (700, 10, 10)
and with :func:`actors.gc_tuning.tune_gc`, interleaved, best of the repeats:

* *model worker start*: what a model worker does before its first request is served: import
  ``actors.model_actor``, construct ``ModelServer`` (which tunes), load the tiny Llama of
  :mod:`audit.tiny_models` (torch and transformers imported);
* *sweep driver*: ``audit run jobs/specs/smoke.yaml`` (52 tasks, its own Ray head), the driver
  process only (its model and statistics workers are Ray's processes).

Printed per workload and setting: the process's CPU seconds (``time.process_time``) and the
seconds spent in collections (``gc.callbacks``, the thread's CPU time), and the ratios default /
tuned. The baseline is the same code with ``tune_gc`` replaced by a no-op in the child process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs in the child: counts collections' CPU time, optionally disables tune_gc, runs a workload.
_CHILD = r'''
import gc, json, sys, time
spent = [0.0]; t0 = [0.0]
def cb(phase, info):
    if phase == "start":
        t0[0] = time.thread_time()
    else:
        spent[0] += time.thread_time() - t0[0]
gc.callbacks.append(cb)
import actors.gc_tuning as g
if sys.argv[1] == "default":
    g.tune_gc = lambda: None
    import actors.model_actor as ma, jobs.cli as jc, actors.stats as st
    ma.tune_gc = jc.tune_gc = st.tune_gc = lambda: None
work, out = sys.argv[2], sys.argv[3]
if work == "worker":
    from actors.model_actor import ModelServer
    ModelServer()
    from audit import tiny_models
    tiny_models.load_tiny("llama")
else:
    from jobs.cli import main
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", "jobs/specs/smoke.yaml", "--output-dir", sys.argv[4]])
    assert rc == 0, rc
json.dump({"cpu": time.process_time(), "gc": spent[0], "threshold": gc.get_threshold()}, open(out, "w"))
'''


def run_child(setting: str, work: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="biasaudit-gc-bench-") as d:
        out = Path(d) / "out.json"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run([sys.executable, "-c", _CHILD, setting, work, str(out), str(Path(d) / "sweep")],
                       cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per workload and setting, interleaved; the best counts")
    args = ap.parse_args(argv)
    print(f"{'workload':<22}{'setting':<10}{'threshold':<20}{'CPU s':>8}{'in gc s':>9}")
    for work, label in (("worker", "model worker start"), ("driver", "sweep driver (smoke)")):
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            for setting in ("default", "tuned"):
                r = run_child(setting, work)
                if setting not in best or r["cpu"] < best[setting]["cpu"]:
                    best[setting] = r
        for setting, r in best.items():
            print(f"{label:<22}{setting:<10}{str(tuple(r['threshold'])):<20}{r['cpu']:>8.2f}{r['gc']:>9.2f}")
        d, t = best["default"], best["tuned"]
        print(f"{label:<22}default / tuned: CPU {d['cpu'] / t['cpu']:.2f}x, time in gc "
              f"{d['gc'] / max(t['gc'], 1e-9):.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
