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
for resources: ...``): a model worker that could not start on any node, and, where Ray's public
state API answers (``ray.util.state``: a cluster with a dashboard, as under ``ray job submit``),
a busy worker waiting for a node to restart on and a statistics task still waiting for a node
(not one queued behind this sweep's own running statistics tasks: their queue moves).
A worker that Ray has given its resources and a process is *starting*, not waiting (told by
its pid where the state API answers, else by Ray's pending demand; :meth:`WorkerPool.starting`):
it gets the timeout, at least :data:`START_GRACE_S`, to answer.
The sweep then ends with exit status 4 (:mod:`jobs.sweep`). Before that, where the state API
answers, waiting model workers are told apart (:meth:`WorkerPool.tell_contention`): *stuck*
(no node will ever hold them) fails their work at the second look that finds it (seconds, not
the timeout) with the resource named; *busy* (other jobs hold what they need) keeps waiting
past the timeout, said in one line.

**Structure.** :class:`WorkerPool` is the scheduling as plain Python (its state moves in
``fill``, ``on_done`` and ``watchdog``; ``tests/test_worker_pool.py`` drives it without Ray);
every Ray call it makes goes through :class:`RayEdge` (public Ray APIs only), the pattern of
:class:`ray.util.ActorPool` (futures mapped to actors) with plain classes made Ray calls at the
edge. :func:`run_tasks` builds the models' work, checks feasibility, sizes the pools and runs it.

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
from actors.shared import Shared
from actors.stats import AnalyseRequest, TaskOutcome, stats_task
from audit.errors import AuditError
from audit.schema import validate
from audit.signals import raise_pending
from jobs.contention import CONTENTION_GRACE_S, classify_wait, cluster_snapshot, fits, worst
from jobs.prefetch import Prefetcher, hub_snapshot
from jobs.progress import Progress
from jobs.spec import RaySpec
from jobs.tracker import task_record

log = logging.getLogger("jobs.pool")

#: Settings of the ``ray:`` section this module reads (declared, with their defaults and
#: documentation, once: :class:`jobs.spec.RaySpec`).
POOL_OPTIONS = ("pending_timeout_s", "reuse_workers", "max_workers", "prefetch", "prefetch_disk_mb")
RAY_DEFAULTS: dict[str, Any] = {k: RaySpec.model_fields[k].default for k in POOL_OPTIONS}

#: Actor states in which a worker waits for a node (Ray's GCS actor table).
_WAITING_STATES = ("PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY")

#: The least time a model worker that Ray has given its resources and a process gets to answer
#: (its imports: torch and transformers take seconds, tens of seconds on a loaded machine) before
#: it fails as not starting; ``ray.pending_timeout_s`` where that is longer. A short timeout for
#: resources (5 s) must not fail a start.
START_GRACE_S = 120.0


def ray_option(spec, name: str) -> Any:
    """``spec.ray.<name>`` (:class:`jobs.spec.RaySpec`, whose defaults fill what a spec leaves out)."""
    return getattr(spec.ray, name)


def with_ray_options(spec, **options):
    """``spec`` with settings of :data:`POOL_OPTIONS` changed (``pending_timeout_s=5``), validated
    as the spec's ``ray:`` section is. For tests, benchmarks and callers that build specs in code."""
    unknown = set(options) - set(POOL_OPTIONS)
    if unknown:
        raise TypeError(f"unknown ray option(s): {', '.join(sorted(unknown))}")
    ray = validate(RaySpec, {**spec.ray.model_dump(exclude_unset=True), **options}, "with_ray_options", "ray")
    return dataclasses.replace(spec, ray=ray)


class SchedulingError(AuditError):
    """The cluster cannot run what the spec asks for (one line naming the resources)."""


# --------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------


def shape(res: dict[str, float]) -> str:
    """``{'CPU': 2.0, 'GPU': 1.0}`` without zero entries (``{}`` for nothing)."""
    return "{" + ", ".join(f"'{k}': {float(v):g}" for k, v in sorted(res.items()) if v) + "}"


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
    ``$BIASAUDIT_ENTRYPOINT_NUM_CPUS``/``_GPUS`` when set, else from the resources of the job's
    supervisor actor (Ray's job manager creates it, named ``_ray_internal_job_actor_<submission
    id>``, with exactly those resources, and it holds them while the entrypoint runs), read
    through Ray's public state API."""
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
        import ray
        from ray.util.state import list_actors

        found = list_actors(address=ray.get_runtime_context().gcs_address,
                            filters=[("name", "=", f"_ray_internal_job_actor_{sid}")], detail=True, timeout=5,
                            raise_on_missing_output=False)
        held = dict(found[0].required_resources or {}) if found else {}
    except Exception as e:  # noqa: BLE001 - unknown: assume the driver holds nothing
        log.info("cannot read the job's entrypoint resources: %s", e)
        return {}
    out = {}
    for res in ("CPU", "GPU"):
        try:
            v = float(held.get(res) or 0)
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


def pending_bundles() -> list[tuple[dict[str, float], int]] | None:
    """The cluster's pending task and actor resource requests as Ray's autoscaler reports them
    (from the GCS: also on an embedded Ray without a dashboard), ``(bundle, count)`` pairs; ``None``
    where Ray cannot say. Reported by the raylets about once a second: a request made in the
    last second may be missing."""
    try:
        import ray
        from ray.autoscaler.v2.sdk import get_cluster_status

        st = get_cluster_status(ray.get_runtime_context().gcs_address)
        return [(dict(b.bundle), int(b.count)) for d in st.resource_demands.ray_task_actor_demand
                for b in d.bundles_by_count]
    except Exception:  # noqa: BLE001 - an older or newer Ray: leave it out
        return None


def pending_demand() -> str:
    """The cluster's pending resource requests (``{'CPU': 2.0} x1, ...``) of :func:`pending_bundles`;
    ``""`` where Ray cannot say."""
    out = collections.Counter()
    for b, n in pending_bundles() or ():
        out[shape(b)] += n
    return ", ".join(f"{k} x{v}" for k, v in out.items())


def cluster_state() -> str:
    """``the cluster has {...} in all, {...} free now; pending demand ...``"""
    import ray

    total = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    free = {k: ray.available_resources().get(k, 0.0) for k in total}
    pend = pending_demand()
    return (f"the cluster has {shape(total)} in all, {shape(free) if any(free.values()) else 'nothing'} free now"
            + (f"; pending demand {pend}" if pend else ""))


class _StateAPI:
    """Ray's public state API (``ray.util.state``), where a dashboard answers (a cluster started
    with ``ray start`` or reached by ``ray job submit``); off after its first failure (an embedded
    local Ray without a dashboard), after which the watchdog does without what it tells."""

    def __init__(self):
        import ray

        self.ok = True
        self.address = ray.get_runtime_context().gcs_address
        self.job_id = ray.get_runtime_context().get_job_id()

    def _off(self, e: Exception, what: str) -> None:
        log.info("Ray's state API is not available (%s); %s", type(e).__name__, what)
        self.ok = False

    def pending_tasks(self) -> dict[str, dict[str, float]] | None:
        """task id -> required resources of this job's tasks waiting for a node (``detail=True``:
        without it Ray 2.60 leaves ``required_resources`` out, and a stuck line said ``needs {}``)."""
        if not self.ok:
            return None
        try:
            from ray.util.state import list_tasks

            ts = list_tasks(address=self.address, filters=[("job_id", "=", self.job_id),
                                                           ("state", "=", "PENDING_NODE_ASSIGNMENT")],
                            limit=10000, timeout=5, raise_on_missing_output=False, detail=True)
        except Exception as e:  # noqa: BLE001 - no dashboard (embedded local Ray): not available
            self._off(e, "statistics tasks and restarting workers are not watched")
            return None
        return {t.task_id: dict(t.required_resources or {}) for t in ts}

    def actor_state(self, actor_id: str) -> tuple[str, int] | None:
        """An actor's state (``ALIVE``, ``PENDING_CREATION``, ``RESTARTING``, ``DEAD``) and the
        process id Ray has for it, or ``None`` when it cannot be read. The pid is 0 until Ray has
        given a first start its resources and a process; while a restart waits for resources it is
        the dead process's, and the new one's once it is placed (Ray 2.60, measured)."""
        if not self.ok:
            return None
        try:
            from ray.util.state import get_actor

            a = get_actor(actor_id, address=self.address, timeout=5)
        except Exception as e:  # noqa: BLE001 - no dashboard (embedded local Ray): not available
            self._off(e, "statistics tasks and restarting workers are not watched")
            return None
        return (str(a.state), int(getattr(a, "pid", 0) or 0)) if a is not None else None


# --------------------------------------------------------------------------------------
# The pool: the scheduling as plain Python (WorkerPool) over a thin edge of Ray calls (RayEdge)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelWork:
    """One model's work: what its worker loads (``assignment``, put in the object store once as
    ``ref``), its tasks as ``(index, task)`` pairs in request-sized ``batches``, its worker's Ray
    options and resource ``group`` ``(num_cpus, num_gpus)``, and ``fresh`` (a worker that served
    it must end: ``trust_remote_code``)."""

    name: str
    assignment: Any
    batches: list
    opts: dict
    group: tuple
    fresh: bool
    n_tasks: int
    ref: Any = None

    def indices(self) -> list[int]:
        return [i for b in self.batches for i, _ in b]


@dataclasses.dataclass
class Worker:
    """A model worker as the pool sees it. ``ready``: it answered since it started or last
    finished a model; ``model``: the one it serves; ``pending``: its unanswered measure requests;
    ``waiting_seen``/``waiting_state``: since when (and in which state) a busy worker waits for a
    node to restart on; ``starting_seen``: since when it is seen placed (given its resources and a
    process) but not answering yet; ``pid_alive``: its process id when last seen alive (0: never),
    which tells a restart that waits for resources from one that is placed
    (:meth:`WorkerPool.observe`)."""

    actor: Any
    group: tuple
    opts: dict
    since: float                    # when it started waiting to be (re)ready
    ready: bool = False
    model: ModelWork | None = None
    pending: int = 0
    served: int = 0
    retire: bool = False
    waiting_seen: float | None = None
    waiting_state: str | None = None
    starting_seen: float | None = None
    pid_alive: int = 0
    ident: int = 0


class RayEdge:
    """Every Ray call :class:`WorkerPool` makes, on public Ray APIs only (a test gives the pool
    a plain-Python stand-in). ``actor_cls``: the model worker's actor class; ``analyse``: the
    statistics task; ``tests_ref``: the tests, in the object store once (a :class:`actors.shared.Shared`
    handle: each worker process deserialises them once, not once per call)."""

    def __init__(self, actor_cls, analyse, *, load_log: Path, tests_ref, exact_shards: int):
        self.actor_cls, self.analyse, self.load_log = actor_cls, analyse, str(load_log)
        self.tests_ref, self.exact_shards = tests_ref, exact_shards
        self._state: _StateAPI | None = None

    @property
    def state(self) -> _StateAPI:
        if self._state is None:
            self._state = _StateAPI()
        return self._state

    def start(self, opts: dict):
        return self.actor_cls.options(**opts).remote(load_log=self.load_log)

    def ready(self, actor):
        """A reference that resolves once ``actor`` answers (after a start or a restart)."""
        return actor.__ray_ready__.remote()

    def put(self, obj):
        import ray

        return ray.put(obj)

    def submit(self, actor, model_ref, batch: list) -> tuple[Any, Any]:
        """Send one measure request (``batch``: ``(index, task)`` pairs) to ``actor`` and chain
        its statistics task on the measurement; returns ``(measure ref, statistics ref)``."""
        reqs = [MeasureRequest(index=i, test=t.test, metric=t.metric, params=t.params) for i, t in batch]
        mref = actor.serve.remote(model_ref, reqs, self.tests_ref)
        areqs = [AnalyseRequest(index=i, test=t.test, metric=t.metric, params=t.params, seed=t.seed,
                                exact_shards=self.exact_shards) for i, t in batch]
        return mref, self.analyse.remote(areqs, mref, self.tests_ref)

    def kill(self, actor) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    def wait(self, refs: list, timeout: float) -> list:
        """Those of ``refs`` ready within ``timeout`` seconds (all that are ready once one is)."""
        import ray

        if not refs:
            time.sleep(timeout)
            return []
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if done:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return done

    def get(self, ref):
        import ray

        return ray.get(ref)

    def cancel(self, ref) -> None:
        import ray

        ray.cancel(ref, force=False)

    def task_id(self, ref) -> str:
        return ref.task_id().hex()

    def actor_state(self, actor) -> tuple[str, int] | None:
        """``(state, pid)`` of :meth:`_StateAPI.actor_state`, ``None`` where it cannot be read."""
        return self.state.actor_state(actor._actor_id.hex())  # noqa: SLF001 - the handle's id

    def pending_tasks(self) -> dict[str, dict[str, float]] | None:
        return self.state.pending_tasks()

    def cluster_state(self) -> str:
        return cluster_state()

    def pending_groups(self) -> collections.Counter | None:
        """``(num_cpus, num_gpus)`` -> how many pending requests of the cluster ask for that much
        CPU and GPU (:func:`pending_bundles`, other resources aside); ``None`` where Ray cannot say."""
        bundles = pending_bundles()
        if bundles is None:
            return None
        out = collections.Counter()
        for b, n in bundles:
            out[(float(b.get("CPU", 0.0)), float(b.get("GPU", 0.0)))] += n
        return out

    def contention(self):
        """``(nodes, held, own, reserved)`` of :func:`jobs.contention.cluster_snapshot` for this
        driver's job, ``None`` where Ray's state API does not answer."""
        import ray

        return cluster_snapshot(ray.get_runtime_context().get_job_id())


class WorkerPool:
    """Bounded long-lived model workers, one model at a time each, over ``edge`` (a
    :class:`RayEdge`); see the module docstring. ``queues``: resource group -> the models that
    group's workers load, in order; ``sizes``: group -> its bound (:func:`pool_size`).
    ``record(outcomes)`` records :class:`actors.stats.TaskOutcome` s; ``recorded``: the indices
    recorded so far (never recorded twice). ``ctx``: ``actors`` (model -> its worker, while it is
    served) and ``remaining`` (model -> tasks not recorded yet) for outcome callbacks.

    The state moves only in :meth:`fill` (start workers, hand models to ready idle workers, end
    idle workers with nothing left), :meth:`on_done` (a worker ready, a measurement answered, a
    statistics result) and :meth:`watchdog`; :meth:`run` is the wait loop around them."""

    def __init__(self, queues: dict[tuple, collections.deque], sizes: dict[tuple, int], edge, *, reuse: bool,
                 timeout: float, max_restarts: int, record: Callable[[list], None], recorded, ctx, prefetcher,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.queues, self.sizes, self.edge = queues, sizes, edge
        self.reuse, self.timeout, self.max_restarts = reuse, timeout, max_restarts
        self.start_timeout = max(timeout, START_GRACE_S)  # for a placed worker to answer (observe)
        self.record, self.recorded, self.ctx, self.prefetcher = record, recorded, ctx, prefetcher
        self.say, self.clock = say, clock
        self.workers: list[Worker] = []
        self.ready_refs: dict[Any, Worker] = {}
        self.measure_refs: dict[Any, Worker] = {}
        self.stats_of: dict[Any, Any] = {}          # measure ref -> its statistics task
        self.stats_refs: dict[Any, tuple[str, list[int]]] = {}
        self.stats_since: dict[Any, float] = {}     # statistics task -> since when it may start
        self.creation_failures: collections.Counter = collections.Counter()
        self.last_progress = clock()                # the last worker start, measurement or result
        self.stuck: str | None = None
        self.workers_started = 0
        self.contention_at = -float("inf")           # the last stuck-or-busy look (jobs.contention)
        self.contention_said: str | None = None      # the last reason said
        self.busy_at = -float("inf")                 # the last look that found other jobs holding the demand
        self.observed_at = -float("inf")             # the check whose answers observe keeps
        self.observed: dict[int, str | None] = {}   # worker ident -> observe's answer at observed_at

    # ---- workers
    def spawn(self, g: tuple, opts: dict) -> Worker:
        actor = self.edge.start(opts)
        self.workers_started += 1
        w = Worker(actor=actor, group=g, opts=opts, since=self.clock(), ident=self.workers_started)
        self.workers.append(w)
        self.ready_refs[self.edge.ready(actor)] = w
        log.info("worker %d started for %s", w.ident, shape({"CPU": g[0], "GPU": g[1]}))
        return w

    def end_worker(self, w: Worker) -> None:
        if w in self.workers:
            self.workers.remove(w)
        for r in [r for r, x in self.ready_refs.items() if x is w]:
            self.ready_refs.pop(r)
        self.edge.kill(w.actor)

    def assign(self, w: Worker, m: ModelWork) -> None:
        """Send all of ``m``'s requests to ``w`` (each with its statistics task)."""
        if m.ref is None:
            m.ref = self.edge.put(m.assignment)
        w.model, w.served = m, w.served + 1
        w.retire = w.retire or m.fresh or not self.reuse
        self.ctx.actors[m.name] = w.actor
        self.ctx.remaining[m.name] = m.n_tasks
        self.prefetcher.started(m.name)
        log.info("worker %d: %s (%s)", w.ident, m.name, json.dumps(w.opts))
        for batch in m.batches:
            mref, sref = self.edge.submit(w.actor, m.ref, batch)
            self.measure_refs[mref] = w
            self.stats_of[mref] = sref
            self.stats_refs[sref] = (m.name, [i for i, _ in batch])
            w.pending += 1

    def fill(self) -> None:
        """Keep each group's pool filled (never more workers than its bound, nor more idle ones
        than models waiting), hand models to ready idle workers, end idle workers that have
        nothing left (their CPUs go to the statistics tasks)."""
        for g, q in self.queues.items():
            ws = [w for w in self.workers if w.group == g]
            idle = [w for w in ws if w.model is None]
            while q and len(ws) < self.sizes[g] and len(idle) < len(q):
                self.spawn(g, q[0].opts)
                ws = [w for w in self.workers if w.group == g]
                idle = [w for w in ws if w.model is None]
            for w in idle:
                if w.ready and q:
                    self.assign(w, q.popleft())
                elif w.ready and not q:
                    self.end_worker(w)

    def busy(self) -> bool:
        return bool(self.stats_refs or self.measure_refs or any(self.queues.values()))

    def refs(self) -> list:
        return list(self.ready_refs) + list(self.measure_refs) + list(self.stats_refs)

    # ---- failures
    def fail(self, indices: list[int], reason: str) -> None:
        self.record([TaskOutcome(index=i, status="failed", error=reason) for i in indices if i not in self.recorded])

    def fail_queue(self, g: tuple, reason: str) -> None:
        """Fail every model still queued for group ``g``."""
        q = self.queues[g]
        while q:
            m = q.popleft()
            self.prefetcher.started(m.name)
            self.fail(m.indices(), reason)

    def mark_stuck(self, reason: str, *, starting: bool = False) -> str:
        """Say (once) and return the line a stuck task fails with: waiting for resources longer than
        ``ray.pending_timeout_s``, or (``starting``) placed and not answering longer than that or
        :data:`START_GRACE_S`, whichever is longer."""
        waited = (f"{self.start_timeout:g} s (ray.pending_timeout_s, at least {START_GRACE_S:g} s for a start) "
                  "for a model worker to start") if starting else f"{self.timeout:g} s (ray.pending_timeout_s) for resources"
        msg = f"stuck: waited more than {waited}: {reason}; {self.edge.cluster_state()}"
        if self.stuck is None:
            self.stuck = msg
            self.say(msg)
        return msg

    def drop_model_work(self, w: Worker, reason: str) -> None:
        """Fail the unanswered tasks of ``w``'s model and end ``w``."""
        m = w.model
        for r in [r for r, x in self.measure_refs.items() if x is w]:
            self.measure_refs.pop(r)
            self.stats_of.pop(r, None)
        idx = []
        for r, (name, indices) in list(self.stats_refs.items()):
            if m is not None and name == m.name:
                self.stats_refs.pop(r)
                self.stats_since.pop(r, None)
                idx += indices
                self.edge.cancel(r)
        self.fail(idx, reason)
        if m is not None:
            self.ctx.actors.pop(m.name, None)
        self.end_worker(w)

    # ---- events
    def on_done(self, ref, now: float) -> None:
        """``ref`` (a worker's readiness, a measurement or a statistics result) is ready."""
        if ref in self.ready_refs:
            self._on_ready(self.ready_refs.pop(ref), ref)
        elif ref in self.measure_refs:
            self._on_measured(self.measure_refs.pop(ref), ref, now)
        elif ref in self.stats_refs:
            name, indices = self.stats_refs.pop(ref)
            self.stats_since.pop(ref, None)
            try:
                outcomes = self.edge.get(ref)
            except Exception as e:  # noqa: BLE001 - the worker died for good, or a task crashed
                err = format_error(e)
                outcomes = [TaskOutcome(index=i, status="failed", error=f"system error: {err}") for i in indices]
            self.record(outcomes)

    def _on_ready(self, w: Worker, ref) -> None:
        try:
            self.edge.get(ref)
        except Exception as e:  # noqa: BLE001 - the worker could not start, or died for good
            self.end_worker(w)
            if w.served:  # it served models, then died for good: a fresh worker takes the next
                log.warning("worker %d died for good: %s", w.ident, format_error(e))
                return
            self.creation_failures[w.group] += 1
            log.warning("a model worker could not start: %s", format_error(e))
            if self.creation_failures[w.group] > max(1, self.max_restarts):
                self.fail_queue(w.group, "system error: a model worker could not start: "
                                         f"{format_error(e)}")
            return
        w.ready = True

    def _on_measured(self, w: Worker, ref, now: float) -> None:
        w.pending -= 1
        sref = self.stats_of.pop(ref, None)
        if sref in self.stats_refs:  # its statistics task may start now
            self.stats_since[sref] = now
        if w.pending:
            return
        m, w.model = w.model, None  # the model's work is done on this worker
        m.ref, m.batches = None, []  # nothing refers to them any more: the driver does not keep them
        self.ctx.actors.pop(m.name, None)
        if w.retire:
            self.end_worker(w)
            log.info("worker %d ended after %s", w.ident, m.name)
        else:  # reuse: once it answers again (alive, or restarted), it takes the next model
            w.ready, w.since = False, now
            self.ready_refs[self.edge.ready(w.actor)] = w

    def watchdog(self, now: float) -> None:
        """Fail work that waits for resources while the whole sweep has made no progress (no
        worker started, no measurement, no result) for ``timeout`` seconds: a long queue that
        moves is not stuck."""
        busy = [w for w in self.workers if w.model is not None and w.pending > 0]
        restarting = {}  # busy workers Ray's state API shows restarting -> "waiting" for a node, or "starting" on one
        for w in busy:
            p = self.observe(w, now)
            if p in ("waiting", "starting"):
                restarting[w.ident] = "starting" if self.starting(w.group, [w], now) else "waiting"
            else:
                w.starting_seen = None
        self.tell_contention(now)
        if now - max(self.last_progress, self.busy_at) <= self.timeout:  # busy: other jobs free it up
            return
        # (a) a group has work but none of its workers could start
        for g, ws in self.unstarted().items():
            q = self.queues[g]
            names = ", ".join(m.name for m in list(q)[:3]) + (", ..." if len(q) > 3 else "")
            need = shape({"CPU": g[0], "GPU": g[1]})
            starting = self.starting(g, ws, now)
            if starting:  # given its resources, its process is starting (a loaded machine): no wait for resources
                if now - min(w.starting_seen for w in starting) <= self.start_timeout:
                    continue
                reason = self.mark_stuck(f"{len(q)} model(s) ({names}) wait for a model worker that was given "
                                         f"{need} and has not answered", starting=True)
            elif now - min(w.since for w in ws) > self.timeout:
                reason = self.mark_stuck(f"{len(q)} model(s) ({names}) wait for a model worker that needs "
                                         f"{need} and could not start")
            else:
                continue
            for w in ws:
                self.end_worker(w)
            self.fail_queue(g, reason)
        # (b) a busy worker waiting for a node to restart on, or placed and not answering
        for w in busy:
            if w not in self.workers:
                continue
            need = shape({"CPU": w.group[0], "GPU": w.group[1]})
            if restarting.get(w.ident) == "waiting" and now - w.waiting_seen > self.timeout:
                reason = self.mark_stuck(f"the worker of model {w.model.name!r} needs {need} "
                                         f"to restart ({w.waiting_state.lower()})")
                self.drop_model_work(w, reason)
            elif restarting.get(w.ident) == "starting" and now - w.starting_seen > self.start_timeout:
                reason = self.mark_stuck(f"the worker of model {w.model.name!r} was given {need} to restart "
                                         f"and has not answered", starting=True)
                self.drop_model_work(w, reason)
        # (c) statistics tasks waiting for a node (where Ray's state API answers)
        ready_stats = [r for r in self.stats_refs if r in self.stats_since]
        pending = self.edge.pending_tasks() if ready_stats else None
        if pending is None:
            return
        # one of this sweep's statistics tasks runs: the others queue behind it for its CPUs (a
        # long exact test), not for resources the cluster lacks; before, a task waiting behind a
        # running one for longer than the timeout failed as stuck
        running = any(self.edge.task_id(r) not in pending for r in ready_stats)
        for r in ready_stats:
            tid = self.edge.task_id(r)
            if tid not in pending or running:
                self.stats_since[r] = now  # running, not yet ready, or queued behind its own: restart the clock
            elif now - self.stats_since[r] > self.timeout:
                name, indices = self.stats_refs.pop(r)
                self.stats_since.pop(r, None)
                self.edge.cancel(r)
                self.fail(indices, self.mark_stuck(f"a statistics task of model {name!r} needs {shape(pending[tid])}"))

    def unstarted(self) -> dict[tuple, list["Worker"]]:
        """group -> its workers, for each group with models queued and workers none of which is
        ready or serving a model (they wait for resources, or their processes are starting)."""
        out = {}
        for g, q in self.queues.items():
            ws = [w for w in self.workers if w.group == g]
            if q and ws and not any(w.ready or w.model is not None for w in ws):
                out[g] = ws
        return out

    def observe(self, w: "Worker", now: float) -> str | None:
        """``"waiting"`` (in a waiting state, :data:`_WAITING_STATES`, with no process of its own
        yet), ``"starting"`` (in a waiting state with a process: its pid is neither 0 nor the one
        it had when last seen alive), ``"other"`` (alive, or dead) or ``None`` (Ray's state API does
        not answer: nothing is changed), from ``w``'s state and process id
        (:meth:`RayEdge.actor_state`). A restart first seen waiting takes the pid shown then as
        the dead process's. Records since when it waits (``waiting_seen``, ``waiting_state``).
        Asked again at the same ``now`` (one check: the busy workers, the look at the cluster and
        rule (a) of :meth:`watchdog`), it answers what it read then, without reading again."""
        if self.observed_at != now:
            self.observed_at, self.observed = now, {}
        if w.ident not in self.observed:
            self.observed[w.ident] = self._observe(w, now)
        return self.observed[w.ident]

    def _observe(self, w: "Worker", now: float) -> str | None:
        got = self.edge.actor_state(w.actor)
        if got is None:
            return None
        st, pid = got
        if st == "ALIVE":
            w.pid_alive = pid
        elif st in _WAITING_STATES and w.served and not w.pid_alive:
            w.pid_alive = pid  # a restart first seen waiting: the pid shown is taken as the dead one's
        phase = ("starting" if pid not in (0, w.pid_alive) else "waiting") if st in _WAITING_STATES else "other"
        w.waiting_state = st if phase == "waiting" else None
        w.waiting_seen = (w.waiting_seen or now) if phase == "waiting" else None
        return phase

    def starting(self, g: tuple, ws: list["Worker"], now: float) -> list["Worker"]:
        """Those of ``ws`` (workers of group ``g`` that have not answered since they started or
        restarted) that Ray has given their resources, whose processes start (imports take
        seconds, tens of seconds on a loaded machine): not waiting for resources. Told by Ray's
        state API, a process id (:meth:`observe`); else, when no pending request of the cluster
        asks for ``g``'s CPU and GPU (:meth:`RayEdge.pending_groups`, Ray's autoscaler demand,
        read from the GCS: also on the embedded Ray of ``audit run``), every one of them not seen
        alive: a process that boots has its resources before Ray shows its pid. A pending request
        of that shape (theirs, or another job's) or no answer keeps them waiting (the timeout for
        resources applies, as before). Sets since when each is seen starting (``starting_seen``)."""
        phases = {w.ident: self.observe(w, now) for w in ws}
        out = [w for w in ws if phases[w.ident] == "starting"]
        rest = [w for w in ws if phases[w.ident] in ("waiting", None)]
        if not out and rest:
            pending = self.edge.pending_groups()
            if pending is not None and pending.get((float(g[0]), float(g[1])), 0) == 0:
                out = rest
        for w in ws:
            w.starting_seen = (w.starting_seen or now) if w in out else None
            if w in out:
                w.waiting_state = w.waiting_seen = None
        return out

    def tell_contention(self, now: float) -> None:
        """Tell busy from stuck long before ``timeout``: once the sweep has made no progress for
        half of :data:`jobs.contention.CONTENTION_GRACE_S` (at most half the timeout) while a
        group has models but none of its workers could start, ask Ray's state API why
        (:func:`jobs.contention.classify_wait`, worst shape first):

        * ``stuck`` (no node will ever hold the worker, or other drivers' reservations deadlock
          it): said (``stuck: waiting: <reason>``); when the next look, half a grace period
          later, finds the same, its models' tasks fail with one line naming the resource
          (``stuck: <reason>; <cluster state>``), not after ``timeout``;
        * ``busy`` (other jobs' running work holds it): said in one line, once per change of
          reason, and the work keeps waiting: the ``timeout`` clock restarts at each busy look
          (it runs when they free up);
        * ``wait`` (nothing to blame): the usual ``timeout`` (``ray.pending_timeout_s``) applies.

        Nothing is said or decided where the state API does not answer (no dashboard)."""
        if now - self.last_progress < min(CONTENTION_GRACE_S, self.timeout) / 2:
            return
        if now - self.contention_at < min(CONTENTION_GRACE_S, self.timeout) / 2:
            return  # looks closer together than the timeout: a busy look always comes before it
        self.contention_at = now
        waiting = [g for g, ws in self.unstarted().items() if not self.starting(g, ws, now)]
        if not waiting:
            return
        try:
            snap = self.edge.contention()
        except Exception:  # noqa: BLE001 - a look at the cluster never ends a sweep
            snap = None
        if snap is None:
            return
        nodes, held, own, reserved = snap
        verdicts = {g: classify_wait({"CPU": g[0], "GPU": g[1]}, nodes, held, own, reserved=reserved) for g in waiting}
        v = worst(list(verdicts.values()))
        if v is None or v.kind == "wait":
            return
        if v.kind == "busy":
            self.busy_at = now
            if v.reason != self.contention_said:
                self.contention_said = v.reason
                self.say(f"busy: waiting: {v.reason}")
            return
        if v.reason != self.contention_said:  # said now, failed at the next look if it holds: one look
            self.contention_said = v.reason    # is not trusted with failing work (a partial answer)
            self.say(f"stuck: waiting: {v.reason}")
            return
        msg = f"stuck: {v.reason}; {self.edge.cluster_state()}"
        if self.stuck is None:
            self.stuck = msg
            self.say(msg)
        for g, verdict in verdicts.items():
            if verdict.kind == "stuck":
                for w in [w for w in self.workers if w.group == g]:
                    self.end_worker(w)
                self.fail_queue(g, msg)

    # ---- the loop
    def run(self, *, tick_s: float, progress: Progress) -> None:
        """Until every task is recorded: fill, wait for what is ready, handle it, watch. Each tick
        first raises a signal whose first raise a finalizer lost (:func:`audit.signals.raise_pending`)."""
        check_every = max(0.5, min(10.0, self.timeout / 4))
        last_check = self.clock()
        try:
            while True:
                raise_pending()
                self.fill()
                if not self.busy():
                    break
                self.prefetcher.tick()
                done = self.edge.wait(self.refs(), tick_s)
                now = self.clock()
                if done:
                    self.last_progress = now
                for ref in done:
                    self.on_done(ref, now)
                # its own cadence (half a grace period): on the watchdog's alone, looks meant 15 s
                # apart came 20 s apart (every second check of 10 s), and 2 s apart came 10 s apart
                self.tell_contention(now)
                if now - last_check >= check_every:
                    last_check = now
                    self.watchdog(now)
                progress.tick(now)
        finally:
            self.close()

    def close(self) -> None:
        self.prefetcher.close()
        for w in list(self.workers):
            self.end_worker(w)
        self.ctx.actors.clear()


class Seen:
    """Which of ``n`` task indices are recorded: one byte each (a sweep's driver keeps no
    per-task object for ever)."""

    def __init__(self, n: int):
        self._b = bytearray(n)

    def add(self, i: int) -> None:
        self._b[i] = 1

    def __contains__(self, i: int) -> bool:
        return bool(self._b[i])

    def __len__(self) -> int:
        return self._b.count(1)


class Recording:
    """Records :class:`actors.stats.TaskOutcome` s of ``todo`` (tasks of ``plan``): each as its
    :func:`jobs.tracker.task_record` through ``recorder`` (write-ahead log, then MLflow), then
    progress and ``on_outcome(task, outcome, ctx)``.

    What the driver keeps per task is bounded: a byte in :attr:`recorded`, and in ``records``
    (index -> record) only the records of tasks without a key, which the sweep's report cannot
    read back from the write-ahead log or the tracking store (:func:`jobs.sweep.run_sweep`);
    before, every record (with its result's JSON) stayed in the driver until the sweep ended."""

    def __init__(self, plan, todo, recorder, ctx, *, progress: Progress, on_outcome: Callable | None = None,
                 records: dict[int, dict] | None = None, load_ids: set[str] | None = None):
        self.plan, self.todo, self.recorder, self.ctx = plan, todo, recorder, ctx
        self.progress, self.on_outcome = progress, on_outcome
        self.spec = plan.spec
        self.sweep_id = self.spec.sweep_id()
        self.records = {} if records is None else records
        self.load_ids = set() if load_ids is None else load_ids
        self.recorded = Seen(len(todo))
        self.done = self.failed = 0

    def __call__(self, outcomes: list[TaskOutcome]) -> None:
        for o in outcomes:
            task = self.todo[o.index]
            info = self.plan.models[task.model]
            rec = task_record(task, sweep=self.spec.name, sweep_id=self.sweep_id, model_spec=info.spec,
                              kind=info.kind, plan_key=task.key, outcome=o, revision=info.revision)
            self.recorder.record(rec)
            self.recorded.add(o.index)
            if not task.key:
                self.records[o.index] = rec
            if o.load_id:
                self.load_ids.add(f"{task.model}@{o.load_id}")
            if o.status != "finished":
                log.warning("failed: %s: %s", task.label, o.error)
            self.ctx.remaining[task.model] = self.ctx.remaining.get(task.model, 1) - 1
            self.done += 1
            self.failed += o.status != "finished"
            self.progress.update(done=self.done, failed=self.failed, loads=len(self.load_ids))
            if self.on_outcome is not None:
                self.on_outcome(task, o, self.ctx)


@dataclasses.dataclass
class PoolResult:
    """What :func:`run_tasks` returns: task index -> record of the tasks without a key
    (:class:`Recording`), load ids seen, the stuck reason
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
    reuse = bool(ray_option(spec, "reuse_workers"))
    records: dict[int, dict] = {}
    load_ids: set[str] = set()
    res = PoolResult(records=records, load_ids=load_ids)

    cluster = {k: float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    by_model: dict[str, list[tuple[int, Any]]] = collections.defaultdict(list)
    for i, t in enumerate(todo):
        by_model[t.model].append((i, t))
    needed = {t.test for t in todo}
    edge = RayEdge(model_actor_class(server_cls), stats_task(num_cpus=spec.ray.stats_num_cpus), load_log=load_log,
                   tests_ref=Shared(ray.put({k: v for k, v in plan.tests.items() if k in needed})),
                   exact_shards=spec.ray.exact_shards)

    # ---- the models, grouped by the resources their worker reserves
    models: list[ModelWork] = []
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
        models.append(ModelWork(m.name, a, batches, opts, (opts["num_cpus"], opts["num_gpus"]),
                                bool(m.options.get("trust_remote_code")), len(items)))

    # ---- feasibility, before anything starts
    reserved = entrypoint_reservation()
    demands = []
    for g in dict.fromkeys(m.group for m in models):
        demands.append((f"a model worker (ray.actor_num_cpus={g[0]:g}{f', GPUs {g[1]:g}' if g[1] else ''})",
                        {"CPU": g[0], "GPU": g[1]}))
    demands.append((f"a statistics task (ray.stats_num_cpus={spec.ray.stats_num_cpus:g})",
                    {"CPU": spec.ray.stats_num_cpus}))
    if spec.ray.exact_shards > 1:
        demands.append(("an exact-test shard (ray.exact_shards > 1)", {"CPU": 1.0}))
    nodes = cluster_nodes()
    driver_node = ray.get_runtime_context().get_node_id()
    check_feasible(demands, nodes, reserved=reserved, driver_node=driver_node)
    if reserved:
        node = next((n.address for n in nodes if n.node_id == driver_node), "?")
        say(f"this job's driver holds {shape(reserved)} of node {node}")
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
    record = Recording(plan, todo, recorder, ctx, progress=progress, on_outcome=on_outcome, records=records,
                       load_ids=load_ids)
    wp = WorkerPool(queues, sizes, edge, reuse=reuse, timeout=float(ray_option(spec, "pending_timeout_s")),
                    max_restarts=spec.ray.max_restarts, record=record, recorded=record.recorded, ctx=ctx,
                    prefetcher=prefetcher, say=say, clock=clock)
    try:
        wp.run(tick_s=tick_s, progress=progress)
    finally:
        res.stuck, res.workers_started = wp.stuck, wp.workers_started
    return res


__all__ = ["run_tasks", "PoolResult", "WorkerPool", "Recording", "Seen", "RayEdge", "ModelWork", "Worker",
           "SchedulingError",
           "POOL_OPTIONS", "RAY_DEFAULTS", "ray_option", "pool_size", "check_feasible", "entrypoint_reservation",
           "in_ray_job", "shape",
           "fits", "NodeOffer", "cluster_nodes"]
