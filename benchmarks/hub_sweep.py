"""A sweep over many tiny Hub checkpoints: worker reuse and snapshot prefetch off, then on.

    .venv/bin/python benchmarks/hub_sweep.py --throttle 200000    # 24 checkpoints (~4 min here)
    .venv/bin/python benchmarks/hub_sweep.py --models 8 --quick   # a smaller trial
    .venv/bin/python benchmarks/hub_sweep.py --json out.json      # the figures as JSON too

What it does, in one run:

1. builds 24 distinct checkpoints (6 each of tiny BERT, RoBERTa, DistilBERT masked LMs and
   GPT-2; ``tests/hub_server.variant_files``: seeded noise on one tiny model's weights) and serves
   them from a loopback Hugging Face Hub (``tests/hub_server.LoopbackHub``) throttled to
   ``--throttle`` bytes per second (all connections together), so that downloading a checkpoint
   takes about as long as measuring it;
2. runs the same sweep (SEAT on WEAT 7 and 8 for the masked LMs, CrowS-Pairs on 16 pairs for
   all) twice on an embedded local Ray with 2 CPUs, each time with an empty Hugging Face cache and
   a new MLflow store:

   - *baseline*: ``ray.reuse_workers: false``, ``ray.prefetch: 0`` (one fresh worker process per
     model, each downloading its snapshot when it loads it: the behaviour before issue 12);
   - *tuned*: the defaults (``reuse_workers: true``, a bounded pool of workers; ``prefetch: 2``:
     the next snapshots download while the current models are measured);

3. checks that both legs give identical results (every value and p-value equal), and prints
   wall time, the ratio, model loads, worker processes, the peak resident memory of the sweep's
   processes (driver and Ray, sampled every 0.2 s) and the time split: download (the hub's
   transfer time, summed over requests), load (summed over loads, download included when not
   prefetched), measure and analyse (summed over tasks, from the child runs' metrics). The
   download time is the bytes the hub sent divided by the throttle: the throttle is the
   bottleneck, so that is how long the transfers took, whether or not they overlapped with
   measuring.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

KINDS = {"bert": "hf-mlm", "roberta": "hf-mlm", "distilbert": "hf-mlm", "gpt2": "hf-causal"}


def build_hub(n_models: int, throttle: float):
    from hub_server import LoopbackHub, variant_files
    from audit.tiny_models import tiny_model_dir

    hub = LoopbackHub(throttle_bps=throttle)
    models = []
    kinds = list(KINDS)
    for i in range(n_models):
        kind = kinds[i % len(kinds)]
        repo = f"bench/{kind}-{i // len(kinds)}"
        hub.add_repo(repo, variant_files(tiny_model_dir(kind), seed=1000 + i))
        models.append({"ref": repo, "name": repo.split("/")[1], "backend": KINDS[kind], "revision": "main"})
    return hub.start(), models


def spec_for(models: list[dict], out: Path, name: str, quick: bool):
    from jobs.spec import parse_spec

    data = {
        "name": name, "seed": 0, "output_dir": str(out), "permutations": 200, "n_bootstrap": 20 if quick else 100,
        "languages": ["en"], "tests": ["weat7", "weat8"],
        "metrics": [{"name": "seat", "tests": ["weat7", "weat8"]},
                    {"name": "crows_pairs", "params": {"limit": 8 if quick else 16}, "tests": ["crows_pairs"]}],
        "models": models,
        "ray": {"num_cpus": 2, "object_store_memory": 200_000_000, "actor_num_cpus": 0.5, "stats_num_cpus": 0.5,
                "batch_size": 4},
    }
    return parse_spec(data, source=f"{name}.yaml")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from ``/proc/<pid>/stat``'s parent field)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", encoding="ascii", errors="replace") as fh:
                    parent[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class PeakRSS:
    """Peak of the summed resident memory of this process and all its descendants (the
    embedded Ray's processes), sampled every ``every`` seconds."""

    def __init__(self, every: float = 0.2):
        self.every = every
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(_rss(p) for p in _descendants(os.getpid())))
            self._stop.wait(self.every)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def point_at(hub, home: Path) -> None:
    """This process and its children (the embedded Ray) use ``hub`` and an empty cache."""
    from huggingface_hub import constants

    cache = home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(cache),
           "HF_XET_CACHE": str(home / "xet"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "HF_HUB_DISABLE_XET": "1", "NO_PROXY": "127.0.0.1,localhost", "TOKENIZERS_PARALLELISM": "false"}
    os.environ.update(env)
    for k in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.pop(k, None)
    for k, v in {"ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(cache),
                 "HUGGINGFACE_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": False, "HF_HUB_DISABLE_XET": True,
                 "HUGGINGFACE_CO_URL_TEMPLATE": hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}"}.items():
        if hasattr(constants, k):
            setattr(constants, k, v)
    from huggingface_hub import hf_api

    hf_api.api.endpoint = hub.endpoint


def run_leg(label: str, hub, models, root: Path, *, reuse: bool, prefetch: int, quick: bool) -> dict:
    from jobs.pool import with_ray_options
    from jobs.sweep import run_sweep
    from jobs.wal import WriteAheadLog, wal_path

    point_at(hub, root / f"hf-{label}")
    spec = with_ray_options(spec_for(models, root / f"out-{label}", f"hub-{label}", quick),
                            reuse_workers=reuse, prefetch=prefetch)
    n_req = len(hub.requests)
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        out = run_sweep(spec, progress=False, progress_interval=30.0)
    wall = time.perf_counter() - t0
    loads = [json.loads(x) for x in (spec.output_dir / "loads.jsonl").read_text().splitlines()]
    recs = WriteAheadLog(wal_path(spec.output_dir)).records()
    reqs = hub.requests[n_req:]
    sent = sum(r.sent for r in reqs)
    return {
        "label": label, "reuse_workers": reuse, "prefetch": prefetch, "exit_code": out.exit_code,
        "tasks": out.ran, "failed": out.failed, "wall_s": wall, "model_loads": len(loads),
        "worker_processes": out.workers, "distinct_pids": len({x["pid"] for x in loads}),
        "peak_rss_mib": mem.peak / 2**20, "hub_requests": len(reqs), "hub_bytes": sent, "download_s": sent / hub.throttle_bps if hub.throttle_bps else 0.0,
        "load_s": sum(x["seconds"] for x in loads),
        "measure_s": sum(r["metrics"].get("measure_seconds", 0.0) for r in recs),
        "analyse_s": sum(r["metrics"].get("analyse_seconds", 0.0) for r in recs),
        "results": {f"{r['model']}|{r['test']}|{r['metric']}": (r["value"], r["p_value"], r["status"])
                    for r in out.results.to_dict("records")},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=24)
    p.add_argument("--throttle", type=float, default=200_000, help="hub bytes per second (default 200 kB/s)")
    p.add_argument("--quick", action="store_true", help="fewer bootstrap resamples and CrowS-Pairs pairs")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--keep", default=None, help="work in this folder and keep it (default: a temporary one)")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the embedded Ray of this benchmark, loopback only
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("BIASAUDIT_DATA", str(REPO.parent / "shared" / "data"))
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="hub-sweep-"))
    root.mkdir(parents=True, exist_ok=True)
    hub, models = build_hub(a.models, a.throttle)
    try:
        base = run_leg("baseline", hub, models, root, reuse=False, prefetch=0, quick=a.quick)
        tuned = run_leg("tuned", hub, models, root, reuse=True, prefetch=2, quick=a.quick)
    finally:
        hub.stop()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    same = base["results"] == tuned["results"]
    print(f"\n{a.models} checkpoints, {base['tasks']} tasks, hub throttled to {a.throttle / 1000:.0f} kB/s, 2 CPUs")
    cols = ["wall_s", "model_loads", "worker_processes", "peak_rss_mib", "download_s", "load_s", "measure_s",
            "analyse_s", "hub_bytes", "failed"]
    print(f"{'':12}" + "".join(f"{c:>17}" for c in cols))
    for leg in (base, tuned):
        print(f"{leg['label']:12}" + "".join(f"{leg[c]:>17.1f}" if isinstance(leg[c], float) else f"{leg[c]:>17}"
                                         for c in cols))
    ratio = base["wall_s"] / tuned["wall_s"]
    print(f"speed-up (baseline / tuned wall time): {ratio:.2f}x; identical results: {same}")
    if a.json:
        Path(a.json).write_text(json.dumps({"baseline": {k: v for k, v in base.items() if k != "results"},
                                            "tuned": {k: v for k, v in tuned.items() if k != "results"},
                                            "ratio": ratio, "identical": same, "models": a.models,
                                            "throttle_bps": a.throttle}, indent=1))
    return 0 if same and base["exit_code"] == tuned["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
