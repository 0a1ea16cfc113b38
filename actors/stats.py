"""The analyse step on CPU workers: measurements in, :class:`audit.result.Result` out.

:func:`analyse_batch` is a pure function of its inputs (the tests call it in-process);
:func:`stats_task` wraps it as a Ray task with explicit ``num_cpus``. Several small tasks travel
in one batch (one Ray task per measure request), which keeps scheduling overhead small when a
sweep has hundreds of quick tests.

Large exact permutation tests are split across workers when the spec sets ``ray.exact_shards =
m > 1``: the metric's registry entry decides whether its analysis can be split and when it pays
(:func:`audit.stats.sharded_exact_p_value`, identical to the unsharded exact test); this module
only supplies the parallel map (one Ray task per piece, :func:`ray_map`).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any

from actors.gc_tuning import tune_gc
from actors.model_actor import MeasureOutcome, format_error
from actors.shared import resolve
from audit.runner import LoadedModel, analyse, make_result


@dataclasses.dataclass
class AnalyseRequest:
    index: int
    test: str
    metric: str
    params: dict[str, Any]
    seed: int | None
    exact_shards: int = 1


@dataclasses.dataclass
class TaskOutcome:
    """A task's final outcome: a :class:`Result`, or the failure reason.

    status: ``finished`` or ``failed``.
    model:  the model's ``describe()`` (``None`` if it could not be loaded).
    """

    index: int
    status: str
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    model: dict[str, str] | None = None
    load_id: str | None = None
    measure_s: float = 0.0
    analyse_s: float = 0.0


def _loaded_stub(desc: dict[str, str]) -> LoadedModel:
    """A :class:`LoadedModel` without its handle: what :func:`make_result` needs."""
    handle = _Mitigation(desc["mitigation"]) if "mitigation" in desc else None  # a debiased LM variant
    return LoadedModel(ref=desc["model"], kind=desc["kind"], backend=desc["backend"],
                       revision=desc["revision"], handle=handle, load=desc.get("load", ""))


class _Mitigation:
    """The debiasing provenance of a variant's description (technique, parameters, pairs and
    corpus digests: :meth:`audit.lm_mitigation.models.ProjectedModel.load_info`), kept in its results."""

    def __init__(self, text: str):
        self.text = text

    def load_info(self) -> dict[str, str]:
        return {"mitigation": self.text}


def ray_map():
    """A parallel map over Ray tasks (``map_fn(fn, items) -> [fn(item), ...]``, one task of one
    CPU per item) when this process is inside Ray, else ``None`` (the caller maps in process)."""
    try:
        import ray
    except ImportError:  # pragma: no cover
        return None
    if not ray.is_initialized():
        return None

    def map_fn(fn, items):
        remote = ray.remote(num_cpus=1)(fn)
        return ray.get([remote.remote(x) for x in items])

    return map_fn


def analyse_one(req: AnalyseRequest, outcome: MeasureOutcome, tests: dict[str, Any]) -> TaskOutcome:
    """Analyse one measured task (or pass its measure failure through)."""
    if outcome.error is not None:
        return TaskOutcome(index=req.index, status="failed", error=outcome.error, traceback=outcome.traceback,
                           model=outcome.model, load_id=outcome.load_id, measure_s=outcome.seconds)
    t0 = time.perf_counter()
    try:
        out = analyse(outcome.measurement, req.metric, req.params, seed=req.seed, shards=req.exact_shards,
                      map_fn=ray_map() if req.exact_shards > 1 else None)
        res = make_result(_loaded_stub(outcome.model), tests[req.test], req.metric, req.params, req.seed,
                          outcome.measurement, out)
    except Exception as e:  # noqa: BLE001 - recorded as the task's failure
        return TaskOutcome(index=req.index, status="failed", error=format_error(e),
                           traceback="".join(traceback.format_exception(e)), model=outcome.model,
                           load_id=outcome.load_id, measure_s=outcome.seconds,
                           analyse_s=time.perf_counter() - t0)
    return TaskOutcome(index=req.index, status="finished", result=res, model=outcome.model,
                       load_id=outcome.load_id, measure_s=outcome.seconds, analyse_s=time.perf_counter() - t0)


def analyse_batch(requests: list[AnalyseRequest], outcomes: list[MeasureOutcome], tests: dict[str, Any]) -> list[TaskOutcome]:
    """Analyse a batch; ``outcomes`` are matched to ``requests`` by ``index``; ``tests`` by name, or
    a :class:`actors.shared.Shared` handle to them."""
    tune_gc()  # a statistics worker's collector thresholds (actors.gc_tuning)
    tests = resolve(tests)
    by_index = {o.index: o for o in outcomes}
    out = []
    for r in requests:
        o = by_index.get(r.index)
        if o is None:
            out.append(TaskOutcome(index=r.index, status="failed", error="internal error: no measurement returned"))
        else:
            out.append(analyse_one(r, o, tests))
    return out


def gpu_node_selector() -> dict[str, str] | None:
    """A Ray ``label_selector`` that keeps a task off every GPU node, or ``None`` when the cluster
    has no GPU node or only GPU nodes.

    Ray's own avoidance of GPU nodes for CPU-only work (``scheduler_avoid_gpu_nodes``) is only a
    preference, and locality-aware leasing overrides it: a statistics task whose input sits in the
    GPU node's object store was often run there (1 to 4 of 4 tasks, measured in
    ``tests/test_cluster_placement.py``), taking CPUs the model actors need. Every node carries its
    ``ray.io/node-id`` label, so excluding the GPU nodes' ids is a hard constraint that needs no
    cluster set-up.
    """
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpu = sorted(n["NodeID"] for n in nodes if n.get("Resources", {}).get("GPU", 0) > 0)
    if not gpu or len(gpu) == len(nodes):
        return None
    return {"ray.io/node-id": "!in(" + ",".join(gpu) + ")"}


def stats_task(num_cpus: float = 1.0, max_retries: int = 3):
    """The Ray task running :func:`analyse_batch` (created lazily: no Ray import at module load),
    kept off GPU nodes when the cluster also has CPU-only nodes (:func:`gpu_node_selector`)."""
    import ray

    fn = ray.remote(num_cpus=num_cpus, max_retries=max_retries)(analyse_batch)
    sel = gpu_node_selector()
    return fn.options(label_selector=sel) if sel else fn
