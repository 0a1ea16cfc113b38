"""Stuck or busy: why work of a sweep waits for cluster resources.

Work that cannot be scheduled waits either because **other jobs hold** what it needs (*busy*: it
runs when they free up, so the sweep keeps waiting and says who holds what) or because **no node
of the cluster has** what it needs (*stuck*: it never runs, so the sweep fails at once instead of
after ``ray.pending_timeout_s``). :func:`classify_wait` decides from plain numbers (no Ray);
:func:`cluster_snapshot` reads those numbers from Ray's public state API
(:mod:`ray.util.state`: nodes, live actors, running tasks, running jobs). Drivers of other
jobs that hold their entrypoint resources and run no work wait as this one does: on one node,
when their reservations leave too little, that is a deadlock (*stuck*), not *busy*.

Conventions: a resource shape is a mapping ``{"CPU": 2.0, "GPU": 0.0, ...}``; a shape *fits* a
node when every positive amount is at most the node's total of that resource (Ray schedules a
task or actor on one node, so fitting the sum of several nodes is not enough). Holdings are per
job (Ray's hex job id, or the submission id where the job was submitted with one): the
resources of its live actors, its running tasks and its driver's entrypoint
(``entrypoint_num_cpus``/``_gpus`` of ``ray job submit``).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

Shape = Mapping[str, float]

#: Seconds without progress after which the sweep's driver asks whether waiting work is stuck or
#: busy (at most ``ray.pending_timeout_s``; it asks again every half of this while work waits):
#: stuck work fails then, not after the full timeout.
CONTENTION_GRACE_S = 30.0

#: Name prefix of the actor Ray's job manager starts per submitted job (``JobSupervisor``): it
#: holds the job's ``entrypoint_num_cpus``/``_gpus`` while the entrypoint runs; the rest of the
#: name is the submission id.
SUPERVISOR_PREFIX = "_ray_internal_job_actor_"

#: The decisions of :func:`classify_wait`.
KINDS = ("stuck", "busy", "wait")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """kind: ``stuck`` (no node has the demand: fail now), ``busy`` (other jobs hold it: keep
    waiting), ``wait`` (nothing to blame: this sweep's own work holds it, or Ray has not placed
    it yet; the usual ``pending_timeout_s`` applies). reason: one line for the log."""

    kind: str
    reason: str


def fmt(shape: Shape) -> str:
    """``{'CPU': 2.0}`` as ``2 CPU``, resources in name order, zero amounts left out."""
    parts = [f"{v:g} {k}" for k, v in sorted(shape.items()) if v > 0]
    return ", ".join(parts) if parts else "nothing"


def fits(demand: Shape, total: Shape) -> bool:
    """Whether every positive amount of ``demand`` is at most ``total``'s amount."""
    return all(total.get(k, 0.0) + 1e-9 >= v for k, v in demand.items() if v > 0)


def classify_wait(demand: Shape, nodes: Sequence[Shape], held: Mapping[str, Shape], own: str | None = None,
                  *, reserved: Mapping[str, Shape] | None = None, limit: int = 3) -> Verdict:
    """Why ``demand`` (one task's or actor's shape) waits.

    nodes:    the total resources of each alive node, less what never frees up while this sweep
              runs on that node (its own driver's entrypoint resources);
    held:     resources held now by running work (live actors, running tasks), per job;
    own:      this sweep's job in ``held`` (its own work frees what it holds as it goes);
    reserved: the entrypoint resources of the other running jobs' drivers (free only when
              those jobs end).

    Reference: Ray schedules each task or actor on a single node whose available resources
    cover its request (Ray docs, "Resources": logical resources, admission control only).

    ``stuck`` when no node fits ``demand``, or (one node) when it does not fit once the other
    drivers' reservations are taken off and no other job runs work (those drivers wait as this
    one does: none of them can ever start, a deadlock); else ``busy`` when other jobs' running
    work holds some of a resource ``demand`` asks for (they free it as they finish; named, the
    largest holders first, at most ``limit``); else ``wait``.
    """
    if not any(fits(demand, n) for n in nodes):
        biggest = max(nodes, key=lambda n: tuple(n.get(k, 0.0) for k in sorted(demand)), default={})
        where = f"its largest node has {fmt({k: biggest.get(k, 0.0) for k in demand})}" if nodes else "no alive node"
        return Verdict("stuck", f"needs {fmt(demand)} on one node and the cluster will never have it ({where})")
    wanted = [k for k, v in demand.items() if v > 0]

    def named(by: Mapping[str, Shape]) -> str:
        order = sorted(by, key=lambda j: (-sum(by[j].get(k, 0.0) for k in wanted), j))
        text = "; ".join(f"{j} holds {fmt({k: by[j].get(k, 0.0) for k in wanted})}" for j in order[:limit])
        return text + (f"; {len(order) - limit} more job(s)" if len(order) > limit else "")

    others = {j: r for j, r in held.items() if j != own and any(r.get(k, 0.0) > 0 for k in wanted)}
    if others:
        return Verdict("busy", f"needs {fmt(demand)}, held by other jobs ({named(others)}); "
                               "it runs when they free up")
    drivers = {j: r for j, r in (reserved or {}).items() if j != own and any(r.get(k, 0.0) > 0 for k in wanted)}
    if drivers and len(nodes) == 1:
        left = {k: v - sum(r.get(k, 0.0) for r in drivers.values()) for k, v in nodes[0].items()}
        if not fits(demand, left):
            return Verdict("stuck", f"needs {fmt(demand)}, held by other jobs' drivers that run no work "
                                    f"({named(drivers)}): they wait for resources as this sweep does and none "
                                    "can start; limit concurrent sweeps (ray.max_jobs) or their entrypoint_num_cpus")
    return Verdict("wait", f"needs {fmt(demand)}; no other job holds it")


def worst(verdicts: Sequence[Verdict]) -> Verdict | None:
    """The verdict that decides for a sweep with several waiting shapes: any ``stuck`` first
    (that work never runs), then ``busy``, then ``wait``; ``None`` for none."""
    for kind in KINDS:
        for v in verdicts:
            if v.kind == kind:
                return v
    return None


def _add(into: dict[str, dict[str, float]], job: str, res: Mapping[str, float] | None) -> None:
    acc = into.setdefault(job, {})
    for k, v in (res or {}).items():
        if v:
            acc[k] = acc.get(k, 0.0) + float(v)


def cluster_snapshot(own_job: str | None = None) -> tuple[list[dict[str, float]], dict[str, dict[str, float]],
                                                        str | None, dict[str, dict[str, float]]] | None:
    """``(nodes, held, own, reserved)`` for :func:`classify_wait` from :mod:`ray.util.state`:
    alive nodes' totals; running work (live actors, running tasks) per job, named by submission
    id where there is one; ``own``, this driver's name there (``own_job``: its hex job id,
    ``ray.get_runtime_context().get_job_id()``); the other running jobs' entrypoint resources
    (what their job supervisor actors hold, :data:`SUPERVISOR_PREFIX`).
    ``None`` where the state API does not answer (no dashboard). On a one-node cluster the
    entrypoint resources of ``own_job`` are taken off the node's totals (they never free up
    while the sweep runs)."""
    try:
        import ray
        from ray.util import state as S

        # the cluster this driver is connected to: without an address the state API refuses to
        # choose on a machine that runs several Ray instances ("Found multiple active Ray instances")
        at = {"address": ray.get_runtime_context().gcs_address} if ray.is_initialized() else {}
        alive = S.list_nodes(filters=[("state", "=", "ALIVE")], raise_on_missing_output=False, timeout=5, **at)
        nodes = [dict(n.resources_total or {}) for n in alive]
        jobs = S.list_jobs(raise_on_missing_output=False, timeout=5, **at)
        actors = S.list_actors(filters=[("state", "=", "ALIVE")], limit=10_000, detail=True,
                                raise_on_missing_output=False, timeout=5, **at)
        tasks = S.list_tasks(filters=[("state", "=", "RUNNING")], limit=10_000, detail=True,
                              raise_on_missing_output=False, timeout=5, **at)
    except Exception:  # noqa: BLE001 - no dashboard, older Ray, a timeout: the caller keeps its timeout
        return None
    if not nodes:  # a partial answer: no verdict rather than "no alive node"
        return None
    names: dict[str, str] = {}
    held: dict[str, dict[str, float]] = {}
    entry: dict[str, dict[str, float]] = {}
    for j in jobs:
        jid = getattr(j, "job_id", None)
        if jid:
            names[jid] = getattr(j, "submission_id", None) or jid
    for a in (*actors, *tasks):
        if getattr(a, "type", None) == "ACTOR_CREATION_TASK":
            continue  # counted as its actor
        name = getattr(a, "name", None) or ""
        if name.startswith(SUPERVISOR_PREFIX):  # holds a submitted job's entrypoint resources
            _add(entry, name[len(SUPERVISOR_PREFIX):], getattr(a, "required_resources", None))
            continue
        _add(held, names.get(a.job_id, a.job_id), getattr(a, "required_resources", None))
    own = names.get(own_job, own_job) if own_job else None
    mine = entry.get(own or "", {})
    if mine and len(nodes) == 1:  # the driver's node is the only one: its entrypoint never frees up there
        nodes = [{k: max(0.0, v - mine.get(k, 0.0)) for k, v in nodes[0].items()}]
    return nodes, {j: r for j, r in held.items() if r}, own, {j: r for j, r in entry.items() if r and j != own}


__all__ = ["CONTENTION_GRACE_S", "KINDS", "Verdict", "classify_wait", "cluster_snapshot", "fits", "fmt", "worst"]
