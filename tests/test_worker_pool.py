"""The state transitions of :class:`jobs.pool.WorkerPool` without Ray: the pool's scheduling is
plain Python over an edge of Ray calls (:class:`jobs.pool.RayEdge`), here a stand-in whose
references the test settles one by one (success, or an error where the test says so)."""

from __future__ import annotations

import collections
import logging
import types

from actors.stats import TaskOutcome
from jobs.plan import Task
from jobs.pool import ModelWork, Recording, WorkerPool

import pytest

pytestmark = pytest.mark.unit


class Ref:
    def __init__(self, kind: str, actor=None, model: str | None = None, indices=()):
        self.kind, self.actor, self.model, self.indices = kind, actor, model, list(indices)

    def __repr__(self):
        return f"Ref({self.kind}, {self.actor}, {self.model})"


class FakeEdge:
    """Records every call in ``events``; ``errors``: ``(kind, model or actor number)`` -> the
    exception that reference raises; ``states``: actor number -> its state, or ``(state, pid)``."""

    def __init__(self):
        self.events: list[tuple] = []
        self.actors = 0
        self.errors: dict[tuple, Exception] = {}
        self.states: dict[int, str] = {}
        self.cancelled: list[Ref] = []
        self.killed: list[int] = []
        self.snapshot = None  # (nodes, held, own, reserved) of jobs.contention.cluster_snapshot
        self.demand = None    # (num_cpus, num_gpus) -> pending requests (RayEdge.pending_groups)
        self.pending = None   # task id -> resources of this job's tasks waiting for a node

    def start(self, opts):
        self.actors += 1
        self.events.append(("start", self.actors))
        return self.actors

    def ready(self, actor):
        self.events.append(("ready?", actor))
        return Ref("ready", actor)

    def put(self, obj):
        return ("put", obj)

    def submit(self, actor, model_ref, batch):
        name = model_ref[1]
        self.events.append(("submit", actor, name, [i for i, _ in batch]))
        return Ref("measure", actor, name), Ref("stats", actor, name, [i for i, _ in batch])

    def kill(self, actor):
        self.killed.append(actor)
        self.events.append(("kill", actor))

    def get(self, ref: Ref):
        err = self.errors.get((ref.kind, ref.model)) or self.errors.get((ref.kind, ref.actor))
        if err is not None:
            raise err
        if ref.kind == "stats":
            return [TaskOutcome(index=i, status="finished", result=f"{ref.model}:{i}") for i in ref.indices]
        return None

    def cancel(self, ref):
        self.cancelled.append(ref)

    def task_id(self, ref):
        return str(id(ref))

    def actor_state(self, actor):
        """``(state, pid)``: ``states`` holds a state (its pid then 100 + the actor's number, as if
        its one process had been placed) or a ``(state, pid)`` pair."""
        st = self.states.get(actor, "ALIVE")
        return st if isinstance(st, tuple) else (st, 100 + actor)

    def pending_tasks(self):
        return self.pending

    def pending_groups(self):
        return self.demand

    def contention(self):
        return self.snapshot

    def cluster_state(self):
        return "the cluster has {'CPU': 2} in all, nothing free now"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def models(*names, group=(1.0, 0.0), n=3, batch=2, fresh=()):
    """ModelWork for ``names``, ``n`` tasks each (consecutive indices), ``batch`` per request."""
    out, k = [], 0
    for name in names:
        items = [(k + j, f"task{k + j}") for j in range(n)]
        k += n
        out.append(ModelWork(name, name, [items[j:j + batch] for j in range(0, n, batch)], {"num_cpus": group[0]},
                             group, name in fresh, n))
    return out


def make_pool(ms, *, size=1, reuse=True, timeout=10.0, max_restarts=1):
    edge, clock = FakeEdge(), Clock()
    queues = collections.defaultdict(collections.deque)
    for m in ms:
        queues[m.group].append(m)
    records: dict[int, TaskOutcome] = {}
    said: list[str] = []

    def record(outcomes):
        for o in outcomes:
            assert o.index not in records, f"task {o.index} recorded twice"
            records[o.index] = o

    prefetch = types.SimpleNamespace(order=[], started=lambda name: prefetch.order.append(name),
                                     tick=lambda: None, close=lambda: None)
    ctx = types.SimpleNamespace(actors={}, remaining={})
    wp = WorkerPool(queues, {g: size for g in queues}, edge, reuse=reuse, timeout=timeout, max_restarts=max_restarts,
                    record=record, recorded=records, ctx=ctx, prefetcher=prefetch, say=said.append, clock=clock)
    return wp, edge, clock, records, said, prefetch


def settle(wp, *, only=None, rounds=100):
    """fill, then settle every outstanding reference (of kinds ``only``), until nothing is left;
    then close the pool, as :meth:`WorkerPool.run` does (unless ``only``)."""
    for _ in range(rounds):
        wp.fill()
        refs = [r for r in wp.refs() if only is None or r.kind in only]
        if not wp.busy() or not refs:
            if only is None:
                wp.close()
            return
        for r in refs:
            wp.on_done(r, wp.clock())
    raise AssertionError("the pool did not settle")


def test_one_worker_serves_the_models_in_order_one_at_a_time():
    wp, edge, _, records, _, prefetch = make_pool(models("a", "b", "c"))
    settle(wp)
    assert edge.actors == wp.workers_started == 1
    kinds = [(e[0], e[2] if e[0] == "submit" else None) for e in edge.events]
    # every model's requests go out only after the worker answered again (the previous model done)
    assert kinds == [("start", None), ("ready?", None), ("submit", "a"), ("submit", "a"), ("ready?", None),
                     ("submit", "b"), ("submit", "b"), ("ready?", None), ("submit", "c"), ("submit", "c"),
                     ("ready?", None), ("kill", None)]
    assert [e[3] for e in edge.events if e[0] == "submit"] == [[0, 1], [2], [3, 4], [5], [6, 7], [8]]
    assert sorted(records) == list(range(9)) and all(o.status == "finished" for o in records.values())
    assert records[4].result == "b:4" and prefetch.order == ["a", "b", "c"]
    assert not wp.busy() and wp.workers == [] and wp.ctx.actors == {}


def test_without_reuse_and_for_fresh_models_each_model_ends_its_worker():
    wp, edge, *_ = make_pool(models("a", "b", "c"), reuse=False)
    settle(wp)
    assert edge.actors == 3 and edge.killed == [1, 2, 3]
    wp, edge, *_ = make_pool(models("a", "b", "c", fresh=("b",)), reuse=True)
    settle(wp)
    # a and b share worker 1; b (trust_remote_code) ends it; c gets a fresh worker 2
    assert [(e[1], e[2]) for e in edge.events if e[0] == "submit"][::2] == [(1, "a"), (1, "b"), (2, "c")]
    assert edge.killed == [1, 2]


def test_the_pool_is_bounded_and_no_worker_waits_without_a_model():
    wp, edge, *_ = make_pool(models("a", "b", "c", "d", "e"), size=2)
    wp.fill()
    assert edge.actors == 2
    wp, edge, *_ = make_pool(models("a"), size=4)
    wp.fill()
    assert edge.actors == 1  # never more idle workers than models waiting


def test_a_failed_statistics_task_is_recorded_and_the_others_go_on():
    wp, edge, _, records, *_ = make_pool(models("a", "b"))
    edge.errors[("stats", "a")] = RuntimeError("boom")
    settle(wp)
    assert sorted(records) == list(range(6))
    assert [records[i].status for i in range(6)] == ["failed"] * 3 + ["finished"] * 3
    assert records[0].error == "system error: RuntimeError: boom"


def test_a_worker_that_cannot_start_fails_its_models_after_max_restarts():
    wp, edge, _, records, *_ = make_pool(models("a", "b"), max_restarts=2)
    edge.errors[("ready", 1)] = edge.errors[("ready", 2)] = edge.errors[("ready", 3)] = OSError("no node")
    settle(wp)
    assert edge.actors == 3  # failures counted per group: the third one gives up
    assert sorted(records) == list(range(6))
    assert {o.error for o in records.values()} == {"system error: a model worker could not start: OSError: no node"}
    assert not wp.busy()


def test_a_worker_that_dies_for_good_after_a_model_is_replaced():
    wp, edge, _, records, *_ = make_pool(models("a", "b"))
    wp.fill()
    for r in wp.refs():
        wp.on_done(r, 0.0)  # ready
    wp.fill()
    for r in wp.refs():
        wp.on_done(r, 0.0)  # a measured and analysed; worker 1 probed again
    edge.errors[("ready", 1)] = RuntimeError("died")
    settle(wp)
    assert edge.actors == 2 and wp.creation_failures == collections.Counter()
    assert all(o.status == "finished" for o in records.values()) and len(records) == 6
    assert [(e[1], e[2]) for e in edge.events if e[0] == "submit"][::2] == [(1, "a"), (2, "b")]


def test_a_worker_that_never_starts_is_stuck_after_the_timeout():
    wp, edge, clock, records, said, _ = make_pool(models("a", "b"), timeout=10.0)
    wp.fill()
    clock.t = 10.0
    wp.watchdog(clock.t)  # not longer than the timeout yet
    assert records == {} and wp.stuck is None
    clock.t = 10.5
    wp.watchdog(clock.t)
    reason = ("stuck: waited more than 10 s (ray.pending_timeout_s) for resources: 2 model(s) (a, b) wait for a "
              "model worker that needs {'CPU': 1} and could not start; the cluster has {'CPU': 2} in all, nothing "
              "free now")
    assert wp.stuck == reason and said == [reason]
    assert sorted(records) == list(range(6)) and {o.error for o in records.values()} == {reason}
    assert edge.killed == [1] and not wp.busy()


def test_a_busy_worker_waiting_to_restart_is_stuck_and_its_work_failed():
    wp, edge, clock, records, said, _ = make_pool(models("a", "b"), timeout=10.0)
    settle(wp, only=("ready",))  # worker 1 ready and serving a (its requests unanswered)
    edge.states[1] = "RESTARTING"
    clock.t = 5.0
    wp.watchdog(clock.t)  # first seen waiting at 5
    clock.t = 15.5
    wp.watchdog(clock.t)  # no progress for 15.5 s but waiting only 10.5 s: past the timeout
    assert wp.stuck.startswith("stuck: waited more than 10 s (ray.pending_timeout_s) for resources: the worker of "
                               "model 'a' needs {'CPU': 1} to restart (restarting); ")
    assert sorted(records) == [0, 1, 2] and all(o.status == "failed" for o in records.values())
    assert len(edge.cancelled) == 2 and edge.killed == [1] and wp.measure_refs == {}
    settle(wp)  # b goes on with a new worker
    assert sorted(records) == list(range(6)) and records[3].status == "finished"


def test_busy_is_told_from_stuck_before_the_timeout_and_said_once():
    wp, edge, clock, records, said, _ = make_pool(models("a", "b"), timeout=20.0)
    wp.fill()
    # another job's actor holds both CPUs of the one 2-CPU node: busy, it runs when they free up
    edge.snapshot = ([{"CPU": 2.0}], {"other-job": {"CPU": 2.0}}, "mine", {})
    clock.t = 5.0
    wp.watchdog(clock.t)  # not yet half the grace period (10 s, half the timeout) without progress
    assert said == []
    clock.t = 16.0
    wp.watchdog(clock.t)
    assert said == ["busy: waiting: needs 1 CPU, held by other jobs (other-job holds 2 CPU); it runs when they "
                    "free up"]
    for t in (35.0, 50.0, 65.0):  # long past the 20 s timeout: busy work keeps waiting, said once
        clock.t = t
        wp.watchdog(clock.t)
    assert len(said) == 1 and wp.stuck is None and records == {}
    # the other job ends, and a node that can never hold the worker is all that is left: stuck,
    # said; its work fails at the next look that finds the same (not 20 s later), the resource named
    edge.snapshot = ([{"CPU": 0.5}], {}, "mine", {})
    clock.t = 81.0
    wp.watchdog(clock.t)
    assert said[-1] == ("stuck: waiting: needs 1 CPU on one node and the cluster will never have it (its largest "
                        "node has 0.5 CPU)") and wp.stuck is None and records == {}
    clock.t = 91.0
    wp.watchdog(clock.t)
    reason = ("stuck: needs 1 CPU on one node and the cluster will never have it (its largest node has 0.5 CPU); "
              "the cluster has {'CPU': 2} in all, nothing free now")
    assert said[-1] == reason and wp.stuck == reason
    assert sorted(records) == list(range(6)) and {o.error for o in records.values()} == {reason}
    assert edge.killed == [1] and not wp.busy()


def test_busy_work_fails_after_the_timeout_once_the_other_jobs_let_go_and_nothing_moves():
    wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=20.0)
    wp.fill()
    edge.snapshot = ([{"CPU": 2.0}], {"other-job": {"CPU": 2.0}}, "mine", {})
    clock.t = 16.0
    wp.watchdog(clock.t)
    edge.snapshot = ([{"CPU": 2.0}], {}, "mine", {})  # nobody else holds it now: the usual timeout
    for t in (31.0, 35.5):
        clock.t = t
        wp.watchdog(clock.t)
    assert records == {} and wp.stuck is None  # 20 s after the last busy look (16 s), not before
    clock.t = 36.5
    wp.watchdog(clock.t)
    assert wp.stuck.startswith("stuck: waited more than 20 s (ray.pending_timeout_s)") and sorted(records) == [0, 1, 2]


def test_a_worker_given_its_resources_and_still_starting_is_not_stuck_for_resources(monkeypatch):
    """CI's case: the other job lets go, Ray gives the worker its CPU and a process (a pid), whose
    imports take longer than the rest of the timeout on a loaded machine. Starting is not waiting
    for resources: from when it is first seen starting it gets the timeout, or at least
    ``START_GRACE_S`` (120 s; 10 s here), and only then fails, saying so; without a pid (not
    placed) the timeout holds as before."""
    import jobs.pool

    monkeypatch.setattr(jobs.pool, "START_GRACE_S", 10.0)  # less than the timeout: the timeout holds
    wp, edge, clock, records, said, _ = make_pool(models("a", "b"), timeout=20.0)
    wp.fill()
    edge.snapshot = ([{"CPU": 2.0}], {"other-job": {"CPU": 2.0}}, "mine", {})
    edge.states[1] = ("PENDING_CREATION", 0)  # waits for resources: no process yet
    clock.t = 16.0
    wp.watchdog(clock.t)  # busy look at 16 s
    edge.snapshot = ([{"CPU": 2.0}], {}, "mine", {})
    edge.states[1] = ("PENDING_CREATION", 4242)  # placed: its process imports
    for t in (31.0, 36.5, 51.0):  # 20 s after the last busy look, and on
        clock.t = t
        wp.watchdog(clock.t)
        assert records == {} and wp.stuck is None, t
    # first seen starting by the look at 31 s (it no longer counts the group as waiting)
    assert wp.workers[0].starting_seen == 31.0 and len(said) == 1 and said[0].startswith("busy: waiting")
    clock.t = 51.5  # more than 20 s seen starting and not answering
    wp.watchdog(clock.t)
    assert wp.stuck.startswith("stuck: waited more than 20 s (ray.pending_timeout_s, at least 10 s for a start) for "
                               "a model worker to start: 2 model(s) (a, b) wait for a model worker that was given "
                               "{'CPU': 1} and has not answered; the cluster has")
    assert sorted(records) == list(range(6)) and edge.killed == [1]
    # the same without a process: stuck for resources at the timeout after the last busy look
    wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=20.0)
    wp.fill()
    edge.states[1] = ("PENDING_CREATION", 0)
    clock.t = 20.5
    wp.watchdog(clock.t)
    assert wp.stuck.startswith("stuck: waited more than 20 s (ray.pending_timeout_s) for resources: 1 model(s) (a)")


@pytest.mark.parametrize("demand, starting", [({}, True), ({(1.0, 0.0): 1}, False), ({(2.0, 0.0): 3}, True),
                                             (None, False)])
def test_without_the_state_api_the_pending_demand_tells_a_start_from_a_wait(monkeypatch, demand, starting):
    """The embedded Ray of ``audit run`` has no dashboard: no actor states. When no pending request
    of the cluster asks for the group's 1 CPU, none of its workers waits for resources: they are
    starting (the timeout, at least ``START_GRACE_S``, from then); a pending request of that shape
    (theirs, or another job's), or no answer from Ray: the timeout for resources, as before."""
    import collections as c

    import jobs.pool

    monkeypatch.setattr(jobs.pool, "START_GRACE_S", 30.0)
    wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=10.0)
    edge.actor_state = lambda actor: None
    edge.demand = None if demand is None else c.Counter(demand)
    wp.fill()
    clock.t = 10.5
    wp.watchdog(clock.t)
    if not starting:
        assert wp.stuck.startswith("stuck: waited more than 10 s (ray.pending_timeout_s) for resources: 1 model(s)")
        return
    assert wp.stuck is None and records == {} and wp.workers[0].starting_seen == 10.5
    clock.t = 40.5
    wp.watchdog(clock.t)
    assert wp.stuck is None and records == {}
    clock.t = 41.0
    wp.watchdog(clock.t)
    assert wp.stuck.startswith("stuck: waited more than 30 s (ray.pending_timeout_s, at least 30 s for a start) for a "
                               "model worker to start: 1 model(s) (a) wait for a model worker that was given "
                               "{'CPU': 1} and has not answered; ") and sorted(records) == [0, 1, 2]


def test_a_worker_whose_process_boots_before_ray_shows_its_pid_is_starting():
    """Ray gives a worker its CPU, then boots its process (Python, Ray's worker) and only then
    shows its pid: for those seconds the state API says PENDING_CREATION with pid 0. No pending
    request asks for its CPU: it is starting (found in a loop of the end-to-end test on a loaded
    machine). A pending request of its shape: it waits, and fails at the timeout."""
    import collections as c

    for demand, stuck_at in ((c.Counter(), None), (c.Counter({(1.0, 0.0): 1}), 10.5)):
        wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=10.0)
        edge.states[1], edge.demand = ("PENDING_CREATION", 0), demand
        wp.fill()
        clock.t = 10.5
        wp.watchdog(clock.t)
        if stuck_at is None:
            assert wp.stuck is None and records == {} and wp.workers[0].starting_seen == 10.5
            clock.t = 131.0  # START_GRACE_S (120 s) after it was first seen starting
            wp.watchdog(clock.t)
            assert wp.stuck.startswith("stuck: waited more than 120 s (ray.pending_timeout_s, at least 120 s for a "
                                       "start) for a model worker to start: 1 model(s) (a) wait")
        else:
            assert wp.stuck.startswith("stuck: waited more than 10 s (ray.pending_timeout_s) for resources: ")


def test_the_look_at_the_cluster_leaves_a_starting_worker_alone():
    """A look whose snapshot would say stuck (other drivers' reservations) says nothing about a
    group whose worker Ray has already placed: it is starting, not waiting."""
    wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=20.0)
    wp.fill()
    edge.snapshot = ([{"CPU": 1.0}], {}, "mine", {"other": {"CPU": 1.0}})
    edge.states[1] = ("PENDING_CREATION", 4242)
    for t in (11.0, 22.0):
        clock.t = t
        wp.tell_contention(clock.t)
    assert said == [] and records == {}
    edge.states[1] = ("PENDING_CREATION", 0)  # not placed: the deadlock is said, then failed
    for t in (33.0, 44.0):
        clock.t = t
        wp.tell_contention(clock.t)
    assert said[0].startswith("stuck: waiting: needs 1 CPU, held by other jobs' drivers") and sorted(records) == [0, 1, 2]


def test_one_check_reads_each_workers_state_once(monkeypatch):
    """A watchdog check that also looks at the cluster asks Ray's state API for each worker's
    state once: the look and rule (a) share what it said (before, the unstarted worker's state
    was read by both). The next check, at a later time, reads it again."""
    wp, edge, clock, records, said, _ = make_pool(models("a", "b", group=(1.0, 0.0)), size=2, timeout=20.0)
    wp.fill()
    edge.snapshot = ([{"CPU": 2.0}], {}, "mine", {})
    edge.states[1] = edge.states[2] = ("PENDING_CREATION", 0)
    edge.demand = {(1.0, 0.0): 2}
    reads: list[int] = []
    read = edge.actor_state
    monkeypatch.setattr(edge, "actor_state", lambda actor: reads.append(actor) or read(actor))
    for t in (11.0, 21.0):
        clock.t = t
        reads.clear()
        wp.watchdog(clock.t)
        assert sorted(reads) == [1, 2], (t, reads)
    assert wp.stuck.startswith("stuck: waited more than 20 s (ray.pending_timeout_s) for resources")


def test_a_restart_placed_on_a_node_is_starting_and_one_not_placed_waits():
    """A busy worker dies: while its restart waits for resources Ray shows the dead process's pid,
    and the new one's once placed. Waiting fails at the timeout (10 s); placed, it gets
    ``START_GRACE_S`` (120 s, longer than the timeout) from when it is first seen starting."""
    wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=10.0)
    assert wp.start_timeout == 120.0
    settle(wp, only=("ready",))
    clock.t = 1.0
    wp.watchdog(clock.t)  # seen alive, pid 101
    edge.states[1] = ("RESTARTING", 101)  # its restart waits for a node
    clock.t = 5.0
    wp.watchdog(clock.t)
    edge.states[1] = ("RESTARTING", 202)  # placed: a new process
    for t in (12.0, 16.0, 132.0):  # 11 s after it was first seen waiting, and on: starting since 12 s
        clock.t = t
        wp.watchdog(clock.t)
    assert records == {} and wp.stuck is None and wp.workers[0].starting_seen == 12.0
    clock.t = 132.5
    wp.watchdog(clock.t)
    assert wp.stuck.startswith("stuck: waited more than 120 s (ray.pending_timeout_s, at least 120 s for a start) "
                               "for a model worker to start: the worker of model 'a' was given {'CPU': 1} to "
                               "restart and has not answered; ")
    assert sorted(records) == [0, 1, 2] and all(o.status == "failed" for o in records.values())


def test_the_run_loop_looks_at_the_cluster_every_half_grace_period_not_every_watchdog_check(monkeypatch):
    """:meth:`WorkerPool.run` with ``pending_timeout_s`` 600 (its watchdog checks every 10 s) and a
    grace period of 4 s: the looks come 2 s apart, so work that can never start fails about 4 s
    after the last progress, not at the watchdog's second check (20 s); one tick is 1 s here."""
    import jobs.pool

    monkeypatch.setattr(jobs.pool, "CONTENTION_GRACE_S", 4.0)
    wp, edge, clock, records, said, _ = make_pool(models("a"), timeout=600.0)
    edge.snapshot = ([{"CPU": 0.5}], {}, "mine", {})  # no node can ever hold the 1-CPU worker

    def wait(refs, timeout):
        clock.t += 1.0
        return []

    edge.wait = wait
    looked = []
    contention = edge.contention
    edge.contention = lambda: looked.append(clock.t) or contention()
    wp.run(tick_s=1.0, progress=types.SimpleNamespace(tick=lambda now: None))
    assert looked == [2.0, 4.0] and wp.stuck.startswith("stuck: needs 1 CPU on one node") and sorted(records) == [0, 1, 2]
    assert said[0].startswith("stuck: waiting: needs 1 CPU on one node")


def test_progress_restarts_the_stuck_clock():
    wp, edge, clock, records, _, _ = make_pool(models("a", "b"), timeout=10.0)
    wp.fill()
    clock.t = 9.0
    wp.last_progress = 9.0  # e.g. another group's result arrived
    clock.t = 15.0
    wp.watchdog(clock.t)
    assert records == {} and wp.stuck is None


def test_a_signal_whose_raise_was_lost_ends_the_loop_at_its_next_tick():
    """A raise lost in a finalizer (``audit.signals``): the loop raises it again, before any more
    work goes out, and closes the pool."""
    from audit import signals

    wp, edge, clock, records, _, _ = make_pool(models("a", "b"))
    edge.wait = lambda refs, timeout: refs[:1]
    ticks = []

    def tick(now):
        ticks.append(now)
        if len(ticks) == 2:
            try:
                signals.interrupt(15)
            except signals.Interrupted:
                pass  # lost, as in a finalizer

    try:
        with pytest.raises(signals.Interrupted) as e:
            wp.run(tick_s=0.0, progress=types.SimpleNamespace(tick=tick))
    finally:
        signals.clear()
    assert e.value.signum == 15 and len(ticks) == 2
    assert not wp.workers and edge.killed == [1] and len(records) < 6


# --------------------------------------------------------------------------------------
# Driver memory: nothing per task kept for ever (long sweeps grew ~1 MiB per checkpoint)
# --------------------------------------------------------------------------------------


class NoResultEdge(FakeEdge):
    """Statistics outcomes as a measurement that failed (no result object): a record of tags,
    params and metrics, as every failed task has."""

    def get(self, ref):
        if ref.kind == "stats":
            return [TaskOutcome(index=i, status="failed", error="AuditError: too few words") for i in ref.indices]
        return None


def _recording_run(n_models: int, per_model: int, *, keyed: bool) -> tuple[int, Recording]:
    """Run ``n_models * per_model`` tiny tasks through a WorkerPool and a :class:`Recording`;
    returns the bytes still allocated once the pool is closed (tracemalloc) and the recording."""
    import tracemalloc

    n = n_models * per_model
    todo = [Task(model=f"m{i // per_model}", language="en", test="weat1", metric="weat", params={"alpha": 0.05},
                 key=f"k{i}" if keyed else None) for i in range(n)]
    info = types.SimpleNamespace(spec=types.SimpleNamespace(ref="m.vec", options={}), kind="static", revision=None)
    plan = types.SimpleNamespace(spec=types.SimpleNamespace(name="mem", sweep_id=lambda: "sid"),
                                 models={f"m{j}": info for j in range(n_models)})
    written = []
    recorder = types.SimpleNamespace(record=lambda rec: written.append(len(rec)))
    progress = types.SimpleNamespace(update=lambda **kw: None, tick=lambda now: None)
    ctx = types.SimpleNamespace(actors={}, remaining={})
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rec = Recording(plan, todo, recorder, ctx, progress=progress)
    queues = collections.defaultdict(collections.deque)
    for j in range(n_models):
        items = [(i, todo[i]) for i in range(j * per_model, (j + 1) * per_model)]
        queues[(1.0, 0.0)].append(ModelWork(f"m{j}", f"m{j}", [items], {"num_cpus": 1.0}, (1.0, 0.0), False,
                                            per_model))
    prefetch = types.SimpleNamespace(started=lambda name: None, tick=lambda: None, close=lambda: None)
    wp = WorkerPool(queues, {(1.0, 0.0): 2}, NoResultEdge(), reuse=True, timeout=10.0, max_restarts=1, record=rec,
                    recorded=rec.recorded, ctx=ctx, prefetcher=prefetch, say=lambda s: None, clock=Clock())
    settle(wp, rounds=10 * n_models)
    del wp, queues, prefetch
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(written) == n and len(rec.recorded) == n
    return kept, rec


def test_the_driver_keeps_no_record_of_keyed_tasks(caplog):
    caplog.set_level(logging.ERROR, logger="jobs.pool")  # pytest keeps every captured log record
    kept_keyed, rec = _recording_run(100, 20, keyed=True)
    assert rec.records == {}  # read back from the write-ahead log / tracking store by the report
    kept_keyless, rec2 = _recording_run(100, 20, keyed=False)
    assert sorted(rec2.records) == list(range(2000))  # the report needs these: nothing else holds them
    # before: every record stayed (what the keyless run keeps, some KB per task); now a byte or so
    assert kept_keyless / 2000 > 1000 and kept_keyed / 2000 < 100, (kept_keyed, kept_keyless)


def test_a_workers_error_from_ray_is_recorded_in_one_line():
    """Ray's errors carry the worker's traceback: a model worker whose constructor raised fails its
    models with ``ActorDiedError: The actor died because of an error raised in its creation task,
    ray::...`` followed by the frames and the exception, in colour. The recorded reason is one
    line: the frames and colour codes dropped, the exception raised kept; a task's
    ``RayTaskError`` gives the exception itself. Before, the recorded error held the traceback."""
    import traceback

    from ray.exceptions import ActorDiedError, RayTaskError

    from actors.model_actor import format_error
    from audit.errors import one_line

    try:
        float("--object-store-name")
    except ValueError as v:
        rte = RayTaskError("SlowServer.__init__", traceback.format_exc(), v, proctitle="ray::SlowServer.__init__",
                           pid=7, ip="192.0.2.2", actor_repr="<SlowServer>")
    assert "\n" in str(ActorDiedError(rte)) and "\x1b[36m" in str(ActorDiedError(rte))  # as Ray gives it
    assert format_error(rte) == "ValueError: could not convert string to float: '--object-store-name'"
    assert format_error(ActorDiedError(rte)) == (
        "ActorDiedError: The actor died because of an error raised in its creation task, ray::SlowServer.__init__() "
        "(pid=7, ip=192.0.2.2, actor_id=None, repr=<SlowServer>) ValueError: could not convert string to float: "
        "'--object-store-name'")
    # a plain message of several lines: whitespace collapsed, nothing dropped
    assert one_line("mapping values are not allowed here\n  in \"<unicode string>\", line 3, column 5:\n    a: b: c") == (
        'mapping values are not allowed here in "<unicode string>", line 3, column 5: a: b: c')
    tb = 'boom\nTraceback (most recent call last):\n  File "x.py", line 1, in <module>\n    f()\n    ~^^\nKeyError: \'k\'\n'
    assert one_line(tb) == "boom KeyError: 'k'"


def test_a_statistics_task_queued_behind_the_sweeps_own_running_one_is_not_stuck():
    """Two statistics tasks, 1 CPU free for them: one runs (a long exact test), the other waits
    for its CPU, longer than the timeout. Its queue moves when the running one ends: not stuck.
    When none of the sweep's statistics tasks runs (other work holds the CPUs), the waiting one
    fails after the timeout, naming what it needs."""
    wp, edge, clock, records, said, _ = make_pool(models("a", n=4, batch=2), timeout=10.0)
    settle(wp, only=("ready", "measure"))  # both measurements answered at 0 s: both tasks may start
    first, second = list(wp.stats_refs)
    edge.pending = {edge.task_id(second): {"CPU": 1.0}}  # the first runs, the second waits
    for t in (5.0, 11.0, 30.0):
        clock.t = t
        wp.watchdog(clock.t)
    assert records == {} and wp.stuck is None
    wp.on_done(first, 30.0)  # the first ends; nothing of the sweep runs now, the second still waits
    wp.last_progress = 30.0
    edge.pending = {edge.task_id(second): {"CPU": 1.0}}
    clock.t = 40.5
    wp.watchdog(clock.t)
    assert wp.stuck.startswith("stuck: waited more than 10 s (ray.pending_timeout_s) for resources: a statistics "
                               "task of model 'a' needs {'CPU': 1}; ")
    assert sorted(records) == [0, 1, 2, 3] and [records[i].status for i in (0, 1)] == ["finished"] * 2
    assert {records[i].status for i in (2, 3)} == {"failed"}
