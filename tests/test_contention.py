"""Stuck versus busy (jobs/contention.py): the decision from plain numbers, no Ray."""

from __future__ import annotations

import pytest

from jobs.contention import Verdict, classify_wait, fits, fmt, worst

NODE = {"CPU": 2.0, "GPU": 0.0, "memory": 1e9}


@pytest.mark.unit
def test_work_that_no_node_can_hold_is_stuck_at_once():
    v = classify_wait({"CPU": 3.0}, [NODE, NODE], {"audit-other": {"CPU": 2.0}})
    assert v == Verdict("stuck", "needs 3 CPU on one node and the cluster will never have it "
                                 "(its largest node has 2 CPU)")
    # 2 + 2 CPUs in the cluster, but one task runs on one node
    assert classify_wait({"CPU": 1.0, "GPU": 1.0}, [NODE], {}).kind == "stuck"
    assert classify_wait({"CPU": 1.0}, [], {}).reason.endswith("(no alive node)")


@pytest.mark.unit
def test_work_whose_resources_other_jobs_hold_is_busy_and_names_them():
    held = {"audit-a": {"CPU": 1.0}, "audit-b": {"CPU": 2.0, "GPU": 1.0}, "mine": {"CPU": 1.0},
            "idle": {"memory": 5.0}, "audit-c": {"CPU": 0.5}, "audit-d": {"CPU": 0.5}}
    v = classify_wait({"CPU": 2.0}, [NODE, {"CPU": 4.0}], held, own="mine")
    assert v.kind == "busy"
    assert v.reason == ("needs 2 CPU, held by other jobs (audit-b holds 2 CPU; audit-a holds 1 CPU; "
                        "audit-c holds 0.5 CPU; 1 more job(s)); it runs when they free up")


@pytest.mark.unit
def test_work_held_up_only_by_its_own_sweep_waits():
    v = classify_wait({"CPU": 1.0}, [NODE], {"mine": {"CPU": 2.0}, "gpu-job": {"GPU": 1.0}}, own="mine")
    assert v == Verdict("wait", "needs 1 CPU; no other job holds it")


@pytest.mark.unit
def test_worst_and_helpers():
    s, b, w = Verdict("stuck", "s"), Verdict("busy", "b"), Verdict("wait", "w")
    assert worst([w, b, s]) is s and worst([w, b]) is b and worst([w]) is w and worst([]) is None
    assert fits({"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0}) and not fits({"CPU": 2.5}, {"CPU": 2.0})
    assert fmt({"GPU": 0.0, "CPU": 1.5, "A": 1.0}) == "1 A, 1.5 CPU" and fmt({}) == "nothing"


@pytest.mark.unit
def test_drivers_that_hold_their_entrypoint_and_run_nothing_are_a_deadlock_not_busy():
    """The watch's case: two sweep drivers with ``entrypoint_num_cpus: 1`` on a 2-CPU node; each
    one's model worker needs 1 CPU. Seen from one driver the node has 2 - 1 (its own entrypoint)
    = 1 CPU, the other driver reserves that CPU and runs no work: neither ever starts, so it is
    stuck now, not busy for ``pending_timeout_s``. When the other job runs a worker, it is busy."""
    v = classify_wait({"CPU": 1.0}, [{"CPU": 1.0}], {}, own="audit-a", reserved={"audit-b": {"CPU": 1.0}})
    assert v.kind == "stuck" and v.reason.startswith(
        "needs 1 CPU, held by other jobs' drivers that run no work (audit-b holds 1 CPU)")
    busy = classify_wait({"CPU": 1.0}, [{"CPU": 1.0}], {"audit-b": {"CPU": 1.0}}, own="audit-a",
                         reserved={"audit-b": {"CPU": 1.0}})
    assert busy.kind == "busy"
    # room left after the other drivers' reservations (a 4-CPU node): wait, the usual timeout
    assert classify_wait({"CPU": 1.0}, [{"CPU": 3.0}], {}, own="a", reserved={"b": {"CPU": 1.0}}).kind == "wait"
