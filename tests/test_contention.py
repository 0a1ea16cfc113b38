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


# --------------------------------------------------------------------------------------
# On a real Ray (2 CPUs, with its dashboard: the state API answers), another job beside the sweep
# --------------------------------------------------------------------------------------

_OTHER_JOB = r"""
import sys, time
import ray

ray.init(address=sys.argv[1], log_to_driver=False)
mode, hold = sys.argv[2], float(sys.argv[3])

@ray.remote
class Holder:
    def ping(self):
        return 1

# busy: running work holding both CPUs; reservation: what Ray's job manager starts for a submitted
# job whose driver reserves 1 CPU (entrypoint_num_cpus) and waits as the sweep does
opts = {"num_cpus": 2} if mode == "busy" else {"num_cpus": 1, "name": "_ray_internal_job_actor_audit-other"}
h = Holder.options(**opts).remote()
ray.get(h.ping.remote())
print("held", flush=True)
time.sleep(hold)
"""

_SWEEP = r"""
import json, subprocess, sys, threading, time
import ray
from jobs.pool import with_ray_options
from jobs.spec import load_spec
from jobs.sweep import run_sweep
from tests.ray_jobs import init_ray_with_dashboard

spec_path, timeout, mode, hold, other = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
import jobs.pool
jobs.pool.CONTENTION_GRACE_S = float(sys.argv[6])  # how long without progress before a look at the cluster
init_ray_with_dashboard(num_cpus=2, object_store_memory=80_000_000, log_to_driver=False)
job = subprocess.Popen([sys.executable, "-c", other, ray.get_runtime_context().gcs_address, mode, hold],
                       stdout=subprocess.PIPE, text=True)
assert job.stdout.readline().strip() == "held"
spec = with_ray_options(load_spec(spec_path), pending_timeout_s=timeout)


def release():  # the other job ends once the sweep has waited busy for longer than its timeout
    log = spec.output_dir / "run.log"
    while not (log.is_file() and "busy: waiting" in log.read_text(encoding="utf-8")):
        time.sleep(0.5)
    time.sleep(timeout + 5)
    job.terminate()


if mode == "busy":
    threading.Thread(target=release, daemon=True).start()
t0 = time.monotonic()
out = run_sweep(spec, progress=False)
elapsed = time.monotonic() - t0
job.terminate(); job.wait()
print("RESULT " + json.dumps({"exit": out.exit_code, "stuck": out.stuck, "failed": out.failed,
                              "finished": int((out.results["status"] == "finished").sum()),
                              "errors": sorted(set(out.results["error"].dropna())), "elapsed": elapsed}))
"""


def _sweep_beside_another_job(tmp_path, mode: str, *, timeout: float, hold: float, cpus: int,
                              grace: float = 30.0) -> tuple[dict, str]:
    """Run a sweep beside another job (``mode``: ``busy`` or ``reservation``) with
    ``ray.pending_timeout_s`` = ``timeout`` and the grace period = ``grace`` (set on ``jobs.pool``,
    which imports :data:`jobs.contention.CONTENTION_GRACE_S` by name and reads its own copy; the
    product's is 30 s; the looks at the cluster come every min(grace, timeout) / 2)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_sweep_service import write_spec, write_vec

    repo = Path(__file__).resolve().parent.parent
    vec = write_vec(tmp_path / "m.vec", 0)
    spec = write_spec(tmp_path, mode, f'  - {{name: a, ref: "{vec}"}}',
                      ray=f"actor_num_cpus: {cpus}, stats_num_cpus: 1, batch_size: 1")
    env = {**os.environ, "PYTHONPATH": str(repo), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    r = subprocess.run([sys.executable, "-c", _SWEEP, str(spec), str(timeout), mode, str(hold), _OTHER_JOB, str(grace)],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, (r.stdout[-3000:], r.stderr[-3000:])
    return json.loads(lines[0][7:]), r.stdout + r.stderr


@pytest.mark.e2e
def test_a_sweep_behind_another_jobs_work_keeps_waiting_past_the_timeout_and_finishes(tmp_path):
    """Another job's actor holds both CPUs until the sweep has said it is busy and waited 5 s
    longer than ``ray.pending_timeout_s`` (8 s here, with a grace period of 4 s: a look at the
    cluster every 2 s, four in each timeout); the sweep's worker (1 CPU) waits. Busy, not stuck:
    it says who holds what, keeps waiting past the timeout (before, its tasks failed as stuck
    after the timeout) and finishes once the other job ends."""
    timeout = 8
    res, out = _sweep_beside_another_job(tmp_path, "busy", timeout=timeout, hold=600, cpus=1, grace=4)
    said = [x for x in out.splitlines() if x.startswith(("busy:", "stuck:"))]
    assert res["exit"] == 0 and res["failed"] == 0 and res["finished"] == 2 and res["stuck"] is None, (res, said)
    assert "busy: waiting: needs 1 CPU, held by other jobs (" in out
    assert "holds 2 CPU); it runs when they free up" in out
    assert res["elapsed"] > timeout + 5, res  # it waited past the timeout for the other job


@pytest.mark.e2e
def test_a_sweep_that_can_never_start_fails_at_once_naming_the_resource(tmp_path):
    """Another submitted job's driver reserves 1 of the 2 CPUs and runs nothing (the watch's
    deadlock); the sweep's worker needs 2 CPUs: it can never start. With ``pending_timeout_s``
    600 its tasks fail at the second look at the cluster (the first says it), one line naming
    the resource and the holder, exit status 4. The grace period is 4 s here (looks 2 s apart;
    the product's 30 s: 15 s apart), so the sweep fails about 4 s after its last progress, not 600."""
    res, out = _sweep_beside_another_job(tmp_path, "reservation", timeout=600, hold=300, cpus=2, grace=4)
    assert res["exit"] == 4 and res["failed"] == 2 and res["finished"] == 0, (res, out[-3000:])
    assert res["elapsed"] < 60, res
    assert "stuck: waiting: needs 2 CPU" in out  # said at the first look, failed at the next
    (err,) = res["errors"]
    assert err == res["stuck"] and "\n" not in err
    assert err.startswith("stuck: needs 2 CPU, held by other jobs' drivers that run no work (audit-other holds 1 CPU)")
