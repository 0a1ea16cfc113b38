"""Run a sweep's tasks on Ray: a bounded pool of model workers, statistics tasks, a watchdog for
work that waits for resources, progress reports and snapshot prefetch.

**Workers.** Models are served by a pool of long-lived :class:`actors.model_actor.ModelServer`
actors. Each worker serves one model at a time: the driver sends it all of a model's measure
requests (``batch_size`` tasks each, every request naming its model), and when the last one is
answered gives it the next model; the worker releases the first model's memory completely
before loading the next (:meth:`ModelServer.release`). The pool is bounded
(:func:`pool_size`): ``ray.max_workers`` if set, else as many workers as the cluster's CPUs
(and GPUs, for GPU workers) hold while one statistics task can still run. With
``ray.reuse_workers: false`` every model gets a fresh worker process that ends with it (the
behaviour before worker reuse; all models' workers are then created at once unless
``ray.max_workers`` bounds them). A model with ``trust_remote_code`` always ends its worker
(its code may have changed the process). A worker that dies is restarted by Ray
(``ray.max_restarts``) and its pending requests re-sent (``ray.max_task_retries``); since each
request names its model, the restarted worker reloads the right one. A worker that has nothing
left to do is ended at once, so that its CPUs go to the statistics tasks.

*Default: reuse on.* A fresh worker process imports torch and transformers again (5-7 s on the
development machine) for every model; a bounded pool pays that once per worker, and the
release is measured (``tests/test_sweep_pool.py``: the resident memory after each release stays
within a documented bound of the level after the first one).

**Analyse.** Each measure request has its statistics task (``ray.stats_num_cpus``), which
starts when the measurement is ready.

**Feasibility** (:func:`check_feasible`, before any worker starts): every shape of work the
sweep asks for (a model worker: ``actor_num_cpus`` CPUs and, for Hugging Face models on a GPU
cluster, ``actor_num_gpus`` GPUs; a statistics task: ``stats_num_cpus``; an exact-test shard:
1 CPU when ``exact_shards > 1``) must fit on one node, after the resources this job's own driver
holds (``entrypoint_num_cpus``/``entrypoint_num_gpus`` of ``ray job submit``, read from the
job's record in Ray, or ``$BIASAUDIT_ENTRYPOINT_NUM_CPUS``/``_GPUS``) on the driver's node. An
impossible spec is refused with one line naming the resources (:class:`SchedulingError`).

**Watchdog.** Work that has waited longer than ``ray.pending_timeout_s`` for resources fails,
its tasks recorded as failed with the pending demand named (``stuck: waited more than 600 s
for resources: ...``): a model worker that could not start (or restart) on any node, and, where
Ray's state API answers (a cluster with a dashboard: ``ray job submit``), a statistics task
still waiting for a node. The sweep then ends with exit status 4 (:mod:`jobs.sweep`).

**Progress** (:mod:`jobs.progress`) and **prefetch** (:mod:`jobs.prefetch`) run from the same
wait loop.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from actors.model_actor import MeasureRequest, ModelAssignment, actor_options, format_error, model_actor_class
from actors.stats import AnalyseRequest, TaskOutcome, stats_task
from audit.errors import AuditError
from jobs.contention import CONTENTION_GRACE_S, classify_wait, cluster_snapshot
from jobs.contention import worst as worst_verdict
from jobs.prefetch import Prefetcher, hub_snapshot
from jobs.progress import Progress
from jobs.spec import RaySpec
from jobs.tracker import task_record

log = logging.getLogger("jobs.pool")

#: Settings of the ``ray:`` section this module reads, with their defaults (those of
#: :class:`jobs.spec.RaySpec`, where they are documented; read with :func:`ray_option`).
RAY_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(RaySpec)
    if f.name in ("pending_timeout_s", "reuse_workers", "max_workers", "prefetch", "prefetch_disk_mb")
}

#: Actor states in which a worker waits for a node (Ray's GCS actor table).
_WAITING_STATES = ("PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")


def ray_option(spec, name: str) -> Any:
    """``spec.ray.<name>``, or its default in :data:`RAY_DEFAULTS`."""
    v = getattr(spec.ray, name, None)
    return RAY_DEFAULTS[name] if v is None else v


def with_ray_options(spec, **options):
    """``spec`` with settings of :data:`RAY_DEFAULTS` changed (``pending_timeout_s=5``), also
    where the spec's ``RaySpec`` does not declare them yet (a frozen subclass then carries
    them). For tests, benchmarks and callers that build specs in code."""
    unknown = set(options) - set(RAY_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown ray option(s): {', '.join(sorted(unknown))}")
    r = spec.ray
    if set(options) <= {f.name for f in dataclasses.fields(r)}:
        return dataclasses.replace(spec, ray=dataclasses.replace(r, **options))
    base = next(c for c in type(r).__mro__ if not getattr(c, "_ray_options_extension", False))
    base_names = {f.name for f in dataclasses.fields(base)}
    extra = [(k, Any, dataclasses.field(default=v)) for k, v in RAY_DEFAULTS.items() if k not in base_names]
    cls = dataclasses.make_dataclass(base.__name__, extra, bases=(base,), frozen=True,
                                     namespace={"_ray_options_extension": True})
    values = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    return dataclasses.replace(spec, ray=cls(**{**values, **options}))


class SchedulingError(AuditError):
    """The cluster cannot run what the spec asks for (one line naming the resources)."""


# --------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------


def shape(res: dict[str, float]) -> str:
    """``{'CPU': 2.0, 'GPU': 1.0}`` without zero entries (``{}`` for nothing)."""
    return "{" + ", ".join(f"'{k}': {float(v):g}" for k, v in sorted(res.items()) if v) + "}"


def fits(need: dict[str, float], have: dict[str, float]) -> bool:
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items() if v)


def in_ray_job() -> dict[str, Any] | None:
    """The job configuration Ray gives the entrypoint of ``ray job submit`` (``runtime_env``,
    ``metadata`` with ``job_submission_id``), or ``None`` outside a submitted job."""
    raw = os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    if not raw:
        return None
    try:
        d = json.loads(raw)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def entrypoint_reservation() -> dict[str, float]:
    """What this job's driver itself holds on its node: ``entrypoint_num_cpus`` /
    ``entrypoint_num_gpus`` of ``ray job submit`` (``{}`` outside a job). From
    ``$BIASAUDIT_ENTRYPOINT_NUM_CPUS``/``_GPUS`` when set, else from the job's record in Ray's
    GCS (the job supervisor holds those resources while the entrypoint runs)."""
    env = {k: os.environ.get(f"BIASAUDIT_ENTRYPOINT_NUM_{k}S") for k in ("CPU", "GPU")}
    if any(v for v in env.values()):
        return {k: float(v) for k, v in env.items() if v}
    job = in_ray_job()
    if job is None:
        return {}
    sid = (job.get("metadata") or {}).get("job_submission_id")
    if not sid:
        return {}
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        raw = _internal_kv_get(f"_ray_internal_job_info_{sid}", namespace=ray_constants.KV_NAMESPACE_JOB)
        info = json.loads(raw) if raw else {}
    except Exception as e:  # noqa: BLE001 - unknown: assume the driver holds nothing
        log.info("cannot read the job's entrypoint resources: %s", e)
        return {}
    out = {}
    for key, res in (("entrypoint_num_cpus", "CPU"), ("entrypoint_num_gpus", "GPU")):
        try:
            v = float(info.get(key) or 0)
        except (TypeError, ValueError):
            v = 0.0
        if v:
            out[res] = v
    return out


@dataclasses.dataclass
class NodeOffer:
    """An alive node: its id, address and total resources (CPU, GPU)."""

    node_id: str
    address: str
    total: dict[str, float]


def cluster_nodes() -> list[NodeOffer]:
    import ray

    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {}) or {}
        out.append(NodeOffer(n["NodeID"], n.get("NodeManagerAddress", "?"),
                             {k: float(res.get(k, 0.0)) for k in ("CPU", "GPU")}))
    return out


def check_feasible(demands: list[tuple[str, dict[str, float]]], nodes: list[NodeOffer], *,
                   reserved: dict[str, float], driver_node: str | None) -> None:
    """Raise :class:`SchedulingError` unless each ``(what, shape)`` of ``demands`` fits on one
    node (the driver's node offers its total minus ``reserved``)."""
    def offer(n: NodeOffer) -> dict[str, float]:
        if n.node_id == driver_node and reserved:
            return {k: v - reserved.get(k, 0.0) for k, v in n.total.items()}
        return dict(n.total)

    for what, need in demands:
        if any(fits(need, offer(n)) for n in nodes):
            continue
        parts = []
        for n in nodes:
            held = f", {shape(reserved)} of which this job's driver holds (ray job submit --entrypoint-num-cpus/gpus)" \
                if n.node_id == driver_node and reserved else ""
            parts.append(f"node {n.address} has {shape(n.total)}{held}")
        raise SchedulingError(f"cannot schedule: {what} needs {shape(need)} on one node, but no node offers it "
                              f"({'; '.join(parts) or 'no alive node'}); lower the request or add resources")


def pool_size(n_models: int, worker: dict[str, float], *, reuse: bool, max_workers: int | None,
              cluster: dict[str, float], stats_cpus: float) -> int:
    """How many workers of one shape to run at once (at least 1, at most ``n_models``).

    ``max_workers`` when set; else, with reuse, as many as the cluster's CPUs hold while one
    statistics task can still run (and, for GPU workers, as many as its GPUs hold); without
    reuse, one per model (Ray starts those that fit, the others wait).
    """
    if n_models <= 0:
        return 0
    if max_workers:
        return max(1, min(n_models, int(max_workers)))
    if not reuse:
        return n_models
    n = n_models
    cpu = worker.get("CPU", 0.0)
    if cpu > 0:
        n = min(n, math.floor((cluster.get("CPU", 0.0) - stats_cpus) / cpu + 1e-9))
    gpu = worker.get("GPU", 0.0)
    if gpu > 0:
        n = min(n, math.floor(cluster.get("GPU", 0.0) / gpu + 1e-9))
    return max(1, n)


def pending_demand() -> str:
    """The cluster's pending resource requests (``{'CPU': 2.0} x1, ...``), as Ray's autoscaler
    reports them; ``""`` where Ray cannot say."""
    try:
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status

        st = get_cluster_status(ray.get_runtime_context().gcs_address)
        out = collections.Counter()
        for d in st.resource_demands.ray_task_actor_demand:
            for b in d.bundles_by_count:
                out[shape(b.bundle)] += b.count
        return ", ".join(f"{k} x{v}" for k, v in out.items())
    except Exception:  # noqa: BLE001 - an older or newer Ray: leave it out
        return ""


def cluster_state() -> str:
    """``the cluster has {...} in all, {...} free now; pending demand ...``"""
    import ray

    total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    free = {k: ray.available_resources().get(k, 0.0) for k in total}
    pend = pending_demand()
    return (f"the cluster has {shape(total)} in all, {shape(free) if any(free.values()) else 'nothing'} free now"
            + (f"; pending demand {pend}" if pend else ""))


def actor_state(actor) -> str | None:
    """A live actor's state in Ray's GCS (``ALIVE``, ``PENDING_CREATION``, ``RESTARTING``,
    ``DEAD``), or ``None`` when it cannot be read."""
    try:
        from ray._private.state import state

        info = state.actor_table(actor._actor_id.hex())  # noqa: SLF001
        return str(info.get("State")) if info else None
    except Exception:  # noqa: BLE001
        return None


class _StateAPI:
    """Ray's state API (``ray.util.state``), where a dashboard answers; off after a failure."""

    def __init__(self):
        import ray

        self.ok = True
        self.address = ray.get_runtime_context().gcs_address
        self.job_id = ray.get_runtime_context().get_job_id()

    def pending_tasks(self) -> dict[str, dict[str, float]] | None:
        """task id -> required resources of this job's tasks waiting for a node."""
        if not self.ok:
            return None
        try:
            from ray.util.state import list_tasks

            ts = list_tasks(address=self.address, filters=[("job_id", "=", self.job_id),
                                                           ("state", "=", "PENDING_NODE_ASSIGNMENT")],
                            limit=10000, timeout=5, raise_on_missing_output=False)
        except Exception as e:  # noqa: BLE001 - no dashboard (embedded local Ray): not available
            log.info("Ray's state API is not available (%s); statistics tasks are not watched", type(e).__name__)
            self.ok = False
            return None
        return {t.task_id: dict(t.required_resources or {}) for t in ts}


# --------------------------------------------------------------------------------------
# The pool
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Model:
    name: str
    assignment: ModelAssignment
    batches: list
    opts: dict
    group: tuple
    fresh: bool
    n_tasks: int
    ref: Any = None


@dataclasses.dataclass
class _Worker:
    actor: Any
    group: tuple
    opts: dict
    since: float                    # when it started waiting to be (re)ready
    ready: bool = False
    model: _Model | None = None
    pending: int = 0                # measure requests not answered yet
    served: int = 0
    retire: bool = False
    waiting_seen: float | None = None   # first time seen waiting for a node while busy
    waiting_state: str | None = None
    ident: int = 0


@dataclasses.dataclass
class PoolResult:
    """What :func:`run_tasks` returns: task index -> record, load ids seen, the stuck reason
    (``None`` unless work waited longer than ``ray.pending_timeout_s``), worker processes
    started, and the prefetcher's statistics."""

    records: dict[int, dict]
    load_ids: set[str]
    stuck: str | None = None
    workers_started: int = 0
    prefetch: Any = None


def run_tasks(plan, todo, recorder, ctx, *, load_log: Path, say: Callable[[str], None], progress: Progress,
              on_outcome: Callable | None = None, server_cls: type | None = None, words_for: Callable,
              clock: Callable[[], float] = time.monotonic, tick_s: float = 1.0) -> PoolResult:
    """Run ``todo`` (tasks of ``plan``) on the Ray this process is connected to; record every
    outcome through ``recorder`` as it arrives. See the module docstring."""
    import ray

    spec = plan.spec
    sweep_id = spec.sweep_id()
    reuse = bool(ray_option(spec, "reuse_workers"))
    timeout = float(ray_option(spec, "pending_timeout_s"))
    check_every = max(0.5, min(10.0, timeout / 4))
    records: dict[int, dict] = {}
    load_ids: set[str] = set()
    res = PoolResult(records=records, load_ids=load_ids)

    cluster = {k: float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    Actor = model_actor_class(server_cls)
    analyse = stats_task(num_cpus=spec.ray.stats_num_cpus)
    by_model: dict[str, list[tuple[int, Any]]] = collections.defaultdict(list)
    for i, t in enumerate(todo):
        by_model[t.model].append((i, t))
    needed = {t.test for t in todo}
    tests_ref = ray.put({k: v for k, v in plan.tests.items() if k in needed})

    # ---- the models, grouped by the resources their worker reserves
    models: list[_Model] = []
    for m in spec.models:
        if m.name not in by_model:
            continue
        info = plan.models[m.name]
        items = by_model[m.name]
        words = words_for(plan, [t for _, t in items]) if info.kind == "static" else None
        opts = actor_options(kind=info.kind, num_cpus=spec.ray.actor_num_cpus, num_gpus=spec.ray.actor_num_gpus,
                             cluster_gpus=cluster.get("GPU", 0.0), max_restarts=spec.ray.max_restarts,
                             max_task_retries=spec.ray.max_task_retries)
        a = ModelAssignment(name=m.name, ref=m.ref, local_ref=info.local_ref, options=dict(m.options),
                            words=tuple(words) if words else None)
        batches = [items[j:j + spec.ray.batch_size] for j in range(0, len(items), spec.ray.batch_size)]
        models.append(_Model(m.name, a, batches, opts, (opts["num_cpus"], opts["num_gpus"]),
                             bool(m.options.get("trust_remote_code")), len(items)))

    # ---- feasibility, before anything starts
    reserved = entrypoint_reservation()
    demands = []
    for g in dict.fromkeys(m.group for m in models):
        demands.append((f"a model worker (ray.actor_num_cpus={g[0]:g}{f', GPUs {g[1]:g}' if g[1] else ''})",
                        {"CPU": g[0], "GPU": g[1]}))
    demands.append((f"a statistics task (ray.stats_num_cpus={spec.ray.stats_num_cpus:g})", {"CPU": spec.ray.stats_num_cpus}))
    if spec.ray.exact_shards > 1:
        demands.append(("an exact-test shard (ray.exact_shards > 1)", {"CPU": 1.0}))
    nodes = cluster_nodes()
    driver_node = ray.get_runtime_context().get_node_id()
    check_feasible(demands, nodes, reserved=reserved, driver_node=driver_node)
    if reserved:
        say(f"this job's driver holds {shape(reserved)} of node {next((n.address for n in nodes if n.node_id == driver_node), '?')}")
    usable = {k: v - reserved.get(k, 0.0) for k, v in cluster.items()}

    sizes: dict[tuple, int] = {}
    queues: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
    for m in models:
        queues[m.group].append(m)
    for g, q in queues.items():
        sizes[g] = pool_size(len(q), {"CPU": g[0], "GPU": g[1]}, reuse=reuse,
                             max_workers=ray_option(spec, "max_workers"), cluster=usable,
                             stats_cpus=spec.ray.stats_num_cpus)
        log.info("worker pool for %s: %d worker(s) for %d model(s) (reuse %s)", shape({"CPU": g[0], "GPU": g[1]}),
                 sizes[g], len(q), "on" if reuse else "off")

    # ---- prefetch of Hub snapshots in the order the pool loads them
    snaps = {}
    for m in models:
        info = plan.models[m.name]
        s = hub_snapshot(m.name, info.local_ref, info.kind, info.revision, dict(m.assignment.options))
        if s is not None:
            snaps[m.name] = s
    prefetcher = Prefetcher([m.name for g in queues for m in queues[g]], snaps, ahead=int(ray_option(spec, "prefetch")),
                            disk_bytes=int(float(ray_option(spec, "prefetch_disk_mb")) * 2**20))
    res.prefetch = prefetcher.stats

    workers: list[_Worker] = []
    ready_refs: dict[Any, _Worker] = {}
    measure_refs: dict[Any, _Worker] = {}
    stats_of: dict[Any, Any] = {}         # measure ref -> its statistics task
    stats_refs: dict[Any, tuple[str, list[int]]] = {}
    stats_since: dict[Any, float] = {}
    creation_failures: collections.Counter = collections.Counter()
    state_api = None
    last_check = clock()
    last_progress = [clock()]            # the last worker start, measurement or result
    contention_seen = [clock()]          # the last stuck-or-busy check (jobs.contention)
    early: list[str | None] = [None]     # why the sweep is stuck before pending_timeout_s
    said: list[Any] = [None, 0.0, None]  # the last busy line, when it was said, the last verdict
    counter = {"done": 0, "failed": 0}
    next_ident = [0]

    def spawn(g: tuple, opts: dict) -> None:
        actor = Actor.options(**opts).remote(load_log=str(load_log))
        next_ident[0] += 1
        w = _Worker(actor=actor, group=g, opts=opts, since=clock(), ident=next_ident[0])
        workers.append(w)
        ready_refs[actor.__ray_ready__.remote()] = w
        res.workers_started += 1
        log.info("worker %d started for %s", w.ident, shape({"CPU": g[0], "GPU": g[1]}))

    def end_worker(w: _Worker) -> None:
        if w in workers:
            workers.remove(w)
        for r in [r for r, x in ready_refs.items() if x is w]:
            ready_refs.pop(r)
        try:
            ray.kill(w.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    def assign(w: _Worker, m: _Model) -> None:
        if m.ref is None:
            m.ref = ray.put(m.assignment)
        w.model, w.served = m, w.served + 1
        w.retire = w.retire or m.fresh or not reuse
        ctx.actors[m.name] = w.actor
        ctx.remaining[m.name] = m.n_tasks
        prefetcher.started(m.name)
        log.info("worker %d: %s (%s)", w.ident, m.name, json.dumps(w.opts))
        for batch in m.batches:
            reqs = [MeasureRequest(index=i, test=t.test, metric=t.metric, params=t.params) for i, t in batch]
            mref = w.actor.serve.remote(m.ref, reqs, tests_ref)
            areqs = [AnalyseRequest(index=i, test=t.test, metric=t.metric, params=t.params, seed=t.seed,
                                    exact_shards=spec.ray.exact_shards) for i, t in batch]
            sref = analyse.remote(areqs, mref, tests_ref)
            measure_refs[mref] = w
            stats_of[mref] = sref
            stats_refs[sref] = (m.name, [i for i, _ in batch])
            w.pending += 1

    def record(outcomes: list[TaskOutcome]) -> None:
        for o in outcomes:
            task = todo[o.index]
            info = plan.models[task.model]
            rec = task_record(task, sweep=spec.name, sweep_id=sweep_id, model_spec=info.spec, kind=info.kind,
                              plan_key=task.key, outcome=o, revision=info.revision)
            recorder.record(rec)
            records[o.index] = rec
            if o.load_id:
                load_ids.add(f"{task.model}@{o.load_id}")
            if o.status != "finished":
                log.warning("failed: %s: %s", task.label, o.error)
            ctx.remaining[task.model] = ctx.remaining.get(task.model, 1) - 1
            counter["done"] += 1
            counter["failed"] += o.status != "finished"
            progress.update(done=counter["done"], failed=counter["failed"], loads=len(load_ids))
            if on_outcome is not None:
                on_outcome(task, o, ctx)

    def fail(indices: list[int], reason: str) -> None:
        record([TaskOutcome(index=i, status="failed", error=reason) for i in indices if i not in records])

    def stuck(reason: str) -> str:
        head = early[0] or f"waited more than {timeout:g} s (ray.pending_timeout_s) for resources"
        msg = f"stuck: {head}: {reason}; {cluster_state()}"
        if res.stuck is None:
            res.stuck = msg
            say(msg)
        return msg

    def drop_model_work(w: _Worker, reason: str) -> None:
        """Fail the unanswered tasks of ``w``'s model and end ``w``."""
        m = w.model
        for r in [r for r, x in measure_refs.items() if x is w]:
            measure_refs.pop(r)
            stats_of.pop(r, None)
        idx = []
        for r, (name, indices) in list(stats_refs.items()):
            if m is not None and name == m.name:
                stats_refs.pop(r)
                stats_since.pop(r, None)
                idx += indices
                ray.cancel(r, force=False)
        fail(idx, reason)
        if m is not None:
            ctx.actors.pop(m.name, None)
        end_worker(w)

    def watchdog(now: float) -> None:
        """Fail work that waits for resources while the whole sweep has made no progress (no
        worker started, no measurement, no result) for ``timeout`` seconds: a long queue that
        moves is not stuck."""
        nonlocal state_api
        busy = [w for w in workers if w.model is not None and w.pending > 0]
        for w in busy:  # when did a busy worker start waiting for a node (to restart on)?
            st = actor_state(w.actor)
            w.waiting_state = st if st in _WAITING_STATES else None
            w.waiting_seen = (w.waiting_seen or now) if w.waiting_state else None
        limit, grace = timeout, min(timeout, CONTENTION_GRACE_S)
        waiting = [{"CPU": g[0], "GPU": g[1]} for g, q in queues.items()
                   if q and not any(w.ready or w.model is not None for w in workers if w.group == g)]
        if waiting and now - last_progress[0] > grace / 2 and now - contention_seen[0] >= grace / 2:
            contention_seen[0] = now
            snap = cluster_snapshot(ray.get_runtime_context().get_job_id())
            verdict = worst_verdict([classify_wait(d, snap[0], snap[1], snap[2], reserved=snap[3]) for d in waiting]
                                    ) if snap is not None else said[2]  # no answer: the last verdict holds
            said[2] = verdict
            if verdict is not None and verdict.kind == "stuck":
                limit, early[0] = grace, verdict.reason  # fail now, not after pending_timeout_s
            elif verdict is not None and verdict.kind == "busy":
                if said[0] != verdict.reason or now - said[1] >= 300:  # once per change, then every 5 min
                    said[0], said[1] = verdict.reason, now
                    say(f"busy: waiting: {verdict.reason}")
                last_progress[0] = contention_seen[0] = clock()  # other jobs hold the resources: keep waiting
                return
        if now - last_progress[0] <= limit:
            return
        # (a) a group has work but none of its workers could start
        for g, q in queues.items():
            if not q:
                continue
            ws = [w for w in workers if w.group == g]
            if not ws or any(w.ready or w.model is not None for w in ws):
                continue
            oldest = min(w.since for w in ws)
            if now - oldest > limit:
                what = (f"{len(q)} model(s) ({', '.join(m.name for m in list(q)[:3])}{', ...' if len(q) > 3 else ''}) "
                        f"wait for a model worker that needs {shape({'CPU': g[0], 'GPU': g[1]})} and could not start")
                reason = stuck(what)
                for w in ws:
                    end_worker(w)
                while q:
                    m = q.popleft()
                    prefetcher.started(m.name)
                    fail([i for b in m.batches for i, _ in b], reason)
        # (b) a busy worker waiting for a node to restart on
        for w in busy:
            if w.waiting_seen is not None and now - w.waiting_seen > timeout and w in workers:
                reason = stuck(f"the worker of model {w.model.name!r} needs {shape({'CPU': w.group[0], 'GPU': w.group[1]})} "
                               f"to restart ({w.waiting_state.lower()})")
                drop_model_work(w, reason)
        # (c) statistics tasks waiting for a node (where Ray's state API answers)
        ready_stats = [r for r in stats_refs if r in stats_since]
        if ready_stats:
            if state_api is None:
                state_api = _StateAPI()
            pending = state_api.pending_tasks()
            if pending is not None:
                for r in ready_stats:
                    tid = r.task_id().hex()
                    if tid not in pending:
                        stats_since[r] = now  # running or not yet ready: restart the clock
                    elif now - stats_since[r] > timeout:
                        name, indices = stats_refs.pop(r)
                        stats_since.pop(r, None)
                        ray.cancel(r, force=False)
                        fail(indices, stuck(f"a statistics task of model {name!r} needs {shape(pending[tid])}"))

    try:
        while True:
            # keep the pool filled, hand models to ready idle workers, end idle workers
            for g, q in queues.items():
                ws = [w for w in workers if w.group == g]
                idle = [w for w in ws if w.model is None]
                while q and len(ws) < sizes[g] and len(idle) < len(q):
                    spawn(g, q[0].opts)
                    ws = [w for w in workers if w.group == g]
                    idle = [w for w in ws if w.model is None]
                for w in idle:
                    if w.ready and q:
                        assign(w, q.popleft())
                    elif w.ready and not q:
                        end_worker(w)  # nothing left for it: its CPUs go to the statistics tasks
            if not (stats_refs or measure_refs or any(queues.values())):
                break
            prefetcher.tick()
            refs = list(ready_refs) + list(measure_refs) + list(stats_refs)
            done, _ = ray.wait(refs, num_returns=1, timeout=tick_s) if refs else ([], [])
            if not refs:
                time.sleep(tick_s)
            if done:
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            now = clock()
            if done:
                last_progress[0] = now
            for ref in done:
                if ref in ready_refs:
                    w = ready_refs.pop(ref)
                    try:
                        ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - the worker could not start, or died for good
                        end_worker(w)
                        if w.served:  # it served models, then died for good: a fresh worker takes the next
                            log.warning("worker %d died for good: %s", w.ident, format_error(e))
                            continue
                        creation_failures[w.group] += 1
                        log.warning("a model worker could not start: %s", format_error(e))
                        if creation_failures[w.group] > max(1, spec.ray.max_restarts):
                            q = queues[w.group]
                            while q:
                                m = q.popleft()
                                prefetcher.started(m.name)
                                fail([i for b in m.batches for i, _ in b],
                                     f"system error: a model worker could not start: {format_error(getattr(e, 'cause', None) or e)}")
                        continue
                    w.ready = True
                elif ref in measure_refs:
                    w = measure_refs.pop(ref)
                    w.pending -= 1
                    sref = stats_of.pop(ref, None)
                    if sref in stats_refs:  # its statistics task may start now
                        stats_since[sref] = now
                    if w.pending == 0:  # the model's work is done on this worker
                        m = w.model
                        ctx.actors.pop(m.name, None)
                        w.model = None
                        if w.retire:
                            end_worker(w)
                            log.info("worker %d ended after %s", w.ident, m.name)
                        else:  # reuse: once it answers again (alive, or restarted), it takes the next model
                            w.ready = False
                            w.since = now
                            ready_refs[w.actor.__ray_ready__.remote()] = w
                elif ref in stats_refs:
                    name, indices = stats_refs.pop(ref)
                    stats_since.pop(ref, None)
                    try:
                        outcomes = ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - the worker died for good, or a task crashed
                        err = format_error(getattr(e, "cause", None) or e)
                        outcomes = [TaskOutcome(index=i, status="failed", error=f"system error: {err}") for i in indices]
                    record(outcomes)
            if now - last_check >= check_every:
                last_check = now
                watchdog(now)
            progress.tick(now)
    finally:
        prefetcher.close()
        for w in list(workers):
            end_worker(w)
        ctx.actors.clear()
    return res


__all__ = ["run_tasks", "PoolResult", "SchedulingError", "RAY_DEFAULTS", "ray_option", "pool_size", "check_feasible",
           "entrypoint_reservation", "in_ray_job", "shape", "fits", "NodeOffer", "cluster_nodes"]
