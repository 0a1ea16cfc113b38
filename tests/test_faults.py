"""Fault tests on a real local Ray and a real MLflow store: nothing computed is lost, nothing
is written twice (``docs/failures.md`` has the measured results).

- the driver SIGKILLed mid-sweep: re-running the spec uploads what the write-ahead log kept,
  marks half-written runs KILLED and runs only the missing tasks;
- the MLflow server killed mid-sweep (and down when a sweep starts): results stay in the
  write-ahead log and ``reports/results.parquet``; ``audit sync`` uploads them once it is back;
- out-of-memory on a batch (an injected ``torch.cuda.OutOfMemoryError``): halved and retried;
  a model that cannot load fails its own tasks, the rest go on;
- a worker node of a multi-node ``ray.cluster_utils.Cluster`` removed while it hosts the model
  actor: its work is rescheduled, every result arrives once.

(A model actor SIGKILLed mid-sweep is ``tests/test_sweep.py::test_killed_actor_is_restarted_and_every_result_arrives_once``.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

import ray

from actors.model_actor import ModelServer  # noqa: E402
from audit import runner  # noqa: E402
from audit.backends import hf  # noqa: E402
from jobs import cli  # noqa: E402
from jobs.cluster import free_port, ray_env  # noqa: E402
from jobs.plan import attach_keys, expand  # noqa: E402
from jobs.spec import load_spec  # noqa: E402
from jobs.sweep import run_sweep  # noqa: E402
from jobs.tracker import Tracker  # noqa: E402
from jobs.wal import WriteAheadLog, wal_path  # noqa: E402
from pg_server import mlflow_server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
from audit.tiny_models import tiny_model_dir  # noqa: E402

FT = "  - {name: ft, build: {kind: fasttext, dim: 8, epoch: 1}}"


def write_spec(tmp_path: Path, name: str, models: str, *, tests, metrics: str = "[weat]", out: Path | None = None,
               extra: str = "", ray_opts: str = "batch_size: 1") -> Path:
    text = f"""
name: {name}
seed: 0
output_dir: {out or tmp_path / 'out'}
permutations: 200
n_bootstrap: 20
languages: [en]
tests: [{", ".join(tests)}]
metrics: {metrics}
models:
{models}
ray: {{num_cpus: 2, actor_num_cpus: 0.5, stats_num_cpus: 0.5, max_restarts: 2, max_task_retries: 3, {ray_opts}}}
{extra}"""
    p = tmp_path / f"{name}.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def planned_keys(spec) -> set[str]:
    return {t.key for t in attach_keys(expand(spec)).tasks}


def assert_exactly_once(tr: Tracker, keys: set[str], others: frozenset = frozenset({"KILLED"})) -> list:
    """Every key has exactly one FINISHED child run, complete (value + result.json); any other
    run is KILLED (half-written by a dead driver) or in ``others``, never RUNNING."""
    runs = tr.task_runs()
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert Counter(r.data.tags["audit.key"] for r in finished) == Counter({k: 1 for k in keys})
    assert {r.info.status for r in runs} <= {"FINISHED"} | others, Counter(r.info.status for r in runs)
    for r in finished:
        assert "value" in r.data.metrics and r.data.tags["audit.status"] == "finished"
    return finished


# --------------------------------------------------------------------------------------
# The write-ahead log itself
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_write_ahead_log_survives_a_line_cut_short(tmp_path):
    """A driver killed while appending leaves a partial last line: it is ignored, the next
    append starts on a fresh line, and pending/synced bookkeeping is by record id."""
    wal = WriteAheadLog(tmp_path / "wal.jsonl")
    recs = [{"id": f"r{i}", "key": f"k{i}", "plan_key": f"k{i}", "status": s, "time_ms": i}
            for i, s in enumerate(["finished", "failed", "finished"])]
    wal.append(recs[0])
    wal.mark_synced("r0", run_id="run0", uri="http://user:secret@host:5000")
    wal.append(recs[1])
    with open(wal.path, "ab") as fh:
        fh.write(b'{"op": "task", "record": {"id": "r-torn", "key": "kx", "sta')  # killed here
    wal.append(recs[2])
    assert [r["id"] for r in wal.records()] == ["r0", "r1", "r2"]
    assert [r["id"] for r in wal.pending()] == ["r1", "r2"]
    assert wal.finished_keys() == {"k0", "k2"} and wal.finished_keys(pending_only=True) == {"k2"}
    assert b"secret" not in wal.path.read_bytes()  # the synced line stores the URI redacted


# --------------------------------------------------------------------------------------
# The driver killed mid-sweep
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_driver_killed_mid_sweep_then_rerun_completes_only_the_missing_tasks(tmp_path):
    tests = [f"weat{i}" for i in range(1, 11)]
    spec_path = write_spec(tmp_path, "driverkill", FT, tests=tests, metrics="[weat, same, rnd, mac]",
                           ray_opts="batch_size: 2")
    spec = load_spec(spec_path)
    wal = WriteAheadLog(wal_path(spec.output_dir))
    env = ray_env({"TOKENIZERS_PARALLELISM": "false"})
    log = open(tmp_path / "driver.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "jobs.sweep", str(spec_path), "--no-progress"], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and len(wal.records()) < 4:
            time.sleep(0.02)
        assert proc.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)  # the driver only; its Ray processes are cleaned up below
        proc.wait(timeout=30)
    finally:
        time.sleep(1)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the dead driver's local Ray left behind
        except ProcessLookupError:
            pass
        log.close()
    keys = planned_keys(spec)
    assert len(keys) == 40
    done_before = wal.finished_keys()
    pending_before = wal.pending()
    assert 4 <= len(done_before) < len(keys), "the kill did not land mid-sweep"

    # a half-written run, as a driver killed inside log_record leaves it: RUNNING, no metrics
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    (parent,) = tr.sweep_runs()
    dead_driver = parent.data.tags["audit.driver"]
    assert dead_driver.rsplit(":", 2)[1] == str(proc.pid)
    missing_key = sorted(keys - done_before)[0]
    half = tr.client.create_run(tr.experiment_id, run_name="half-written", tags={
        "audit.role": "task", "audit.key": missing_key, "audit.plan_key": missing_key, "audit.status": "finished",
        "audit.driver": dead_driver, "mlflow.parentRunId": parent.info.run_id}).info.run_id
    tr.client.log_param(half, "model", "ft")
    assert tr.client.get_run(half).info.status == "RUNNING"

    out = run_sweep(spec, progress=False)
    assert out.exit_code == 0 and out.planned == len(keys) and out.failed == 0 and out.pending == 0
    # only the missing tasks ran; what the dead driver computed was uploaded, not recomputed
    assert out.ran == len(keys) - len(done_before) and out.skipped_existing == len(done_before)
    assert out.synced <= len(pending_before) and out.loads == 1
    assert out.reaped >= 1 and tr.client.get_run(half).info.status == "KILLED"
    assert tr.client.get_run(half).data.tags["audit.status"] == "killed"
    assert_exactly_once(tr, keys)
    assert not wal.pending() and len(wal.records()) == len(keys)  # every record synced, none written twice
    assert (tr.client.get_run(parent.info.run_id).info.status == "FINISHED")
    assert len(out.results) == len(keys) and (out.results["status"] == "finished").all()
    print(f"\ndriver kill: {len(done_before)} of {len(keys)} finished before the kill, {len(pending_before)} of them "
          f"not yet in MLflow; re-run: {out.synced} uploaded, {out.reaped} half-written run(s) KILLED, "
          f"{out.ran} run, {out.seconds:.1f} s", file=sys.stderr)


# --------------------------------------------------------------------------------------
# The MLflow server unreachable
# --------------------------------------------------------------------------------------


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite store, proxied artifacts), startable
    again on the same port and store after a kill."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.start_seconds: list[float] = []

    def start(self, timeout: float = 120) -> None:
        t0 = time.monotonic()
        self.log = open(self.root / f"server{len(self.start_seconds)}.log", "wb")
        self.proc = mlflow_server(["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                                   "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
                                   "--artifacts-destination", str(self.root / "artifacts")], self.log)
        while time.monotonic() - t0 < timeout:
            assert self.proc.poll() is None, (self.root / "server0.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    self.start_seconds.append(time.monotonic() - t0)
                    return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError("mlflow server did not answer")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.log.close()


@pytest.mark.ray
def test_mlflow_server_down_results_kept_then_synced_once(tmp_path, fresh_ray, capsys):
    (tmp_path / "srv").mkdir()
    server = MlflowServer(tmp_path / "srv")
    out_dir = tmp_path / "out"
    first = ["weat1", "weat2", "weat6", "weat7"]
    common = dict(out=out_dir, extra="tracking: {experiment: faults}")
    spec = load_spec(write_spec(tmp_path, "srv1", FT, tests=first, **common), tracking_uri=server.uri)
    wal = WriteAheadLog(wal_path(out_dir))
    try:
        server.start()
        seen = []

        def kill_after_two(task, outcome, ctx):
            seen.append(task.key)
            if len(seen) == 2:
                server.kill()  # mid-sweep: two results logged, the rest meets a dead server

        t0 = time.monotonic()
        out = run_sweep(spec, progress=False, on_outcome=kill_after_two)
        first_seconds = time.monotonic() - t0
        assert out.exit_code == 3 and out.failed == 0 and out.ran == 4 and out.pending == 2
        err = capsys.readouterr()
        assert f"warning: MLflow tracking store {server.uri} unreachable (MlflowException: [Errno 111] " in err.err
        assert "2 result(s) are not in the tracking store" in err.out and "audit sync" in err.out
        # every result is in the local Parquet output, with its numbers, and in the WAL
        import pandas as pd

        df = pd.read_parquet(out_dir / "reports" / "results.parquet")
        assert len(df) == 4 and (df["status"] == "finished").all() and df["value"].notna().all()
        assert len(wal.records()) == 4 and len(wal.pending()) == 2
        assert {r["key"] for r in wal.pending()} == set(seen[2:])

        # a second sweep (two more tests) while the server is down: it runs offline, the four
        # results already in the WAL are not recomputed
        spec2_path = write_spec(tmp_path, "srv2", FT, tests=first + ["weat8", "weat9"], **common)
        spec2 = load_spec(spec2_path, tracking_uri=server.uri)
        out2 = run_sweep(spec2, progress=False)
        assert (out2.exit_code, out2.ran, out2.skipped_existing, out2.pending) == (3, 2, 4, 4)
        assert len(pd.read_parquet(out_dir / "reports" / "results.parquet")) == 6
        capsys.readouterr()

        # `audit sync` while the server is still down: nothing uploaded, exit 3, one line
        argv = ["sync", str(spec2_path), "--tracking-uri", server.uri]
        t0 = time.monotonic()
        assert cli.main(argv) == 3
        down_sync_seconds = time.monotonic() - t0
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("audit:")]
        assert line == (f"audit: error: MLflow tracking store {server.uri} unreachable (MlflowException: "
                        "[Errno 111] Connection refused); nothing uploaded, the records stay pending")

        # the server is back (same store): sync uploads the four pending results, once
        server.start()
        searches = []
        search = Tracker._search
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Tracker, "_search", lambda self, f: searches.append(f) or search(self, f))
            assert cli.main(argv) == 0
        # the task runs searched once for both tables of the upload (jobs.wal.sync_records), besides
        # the search for half-written runs
        assert [f for f in searches if "'task'" in f] == [
            "tags.`audit.role` = 'task' and attributes.status = 'RUNNING'", "tags.`audit.role` = 'task'"], searches
        printed = capsys.readouterr().out
        assert "4 pending record(s)" in printed and "4 uploaded" in printed and "0 still pending" in printed
        tr = Tracker(server.uri, "faults")
        keys = planned_keys(spec2)
        finished = assert_exactly_once(tr, keys)
        assert len(finished) == 6 and not wal.pending()
        # the uploaded numbers are the ones computed offline (Parquet) and the ones in the WAL
        by_key = {r.data.tags["audit.key"]: r for r in finished}
        df = pd.read_parquet(out_dir / "reports" / "results.parquet").set_index("key")
        for k, r in by_key.items():
            assert r.data.metrics["value"] == df.loc[k, "value"]
            assert r.data.metrics["p_value"] == df.loc[k, "p_value"]
            assert "result.json" in {f.path for f in tr.client.list_artifacts(r.info.run_id)}
        parents = {p.data.tags["audit.sweep"]: p for p in tr.sweep_runs()}
        assert set(parents) == {"srv1", "srv2"} and {p.info.status for p in parents.values()} == {"FINISHED"}
        assert {r.data.tags["mlflow.parentRunId"] for r in finished} == {p.info.run_id for p in parents.values()}

        # idempotent: a second sync and a re-run add nothing
        assert cli.main(argv) == 0 and "0 pending record(s)" in capsys.readouterr().out
        out3 = run_sweep(spec2, progress=False)
        assert (out3.exit_code, out3.ran, out3.pending) == (0, 0, 0)
        assert len(tr.task_runs()) == 6
        (tmp_path / "timings.json").write_text(json.dumps({
            "server_start_s": server.start_seconds, "first_sweep_s": first_seconds,
            "sync_while_down_s": down_sync_seconds}))
        print("timings", server.start_seconds, first_seconds, down_sync_seconds, file=sys.stderr)
    finally:
        server.kill()


# --------------------------------------------------------------------------------------
# Out of memory on a batch; a model that cannot load
# --------------------------------------------------------------------------------------

MAX_BATCH = 4


class OOMServer(ModelServer):
    """A model server whose model raises ``torch.cuda.OutOfMemoryError`` on any forward pass
    over more than ``MAX_BATCH`` sequences (what a GPU does when a batch does not fit), and
    writes each attempted batch size to ``batches.jsonl`` next to the load log."""

    def ensure_loaded(self):
        model = super().ensure_loaded()
        net = getattr(model.handle.model, "base_model", model.handle.model)  # what embeddings run
        if not getattr(net, "_oom_injected", False):
            import torch

            inner = net.forward
            log = Path(self.load_log).parent / "batches.jsonl"

            def forward(*args, **kwargs):
                ids = kwargs.get("input_ids", args[0] if args else None)
                n = int(ids.shape[0])
                with open(log, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"n": n, "oom": n > MAX_BATCH}) + "\n")
                if n > MAX_BATCH:
                    raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected: batch of {n})")
                return inner(*args, **kwargs)

            net.forward = forward
            net._oom_injected = True
        return model


@pytest.mark.ray
def test_oom_batch_is_halved_and_an_unloadable_model_fails_alone(tmp_path, fresh_ray):
    bert = tiny_model_dir("bert")
    broken = tmp_path / "no-weights"
    shutil.copytree(bert, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    models = f"""  - {{name: bert, ref: "{bert}", backend: hf-mlm}}
  - {{name: broken, ref: "{broken}", backend: hf-mlm}}"""
    spec = load_spec(write_spec(tmp_path, "oom", models, tests=["weat7", "weat8"], metrics="[seat]"))
    out = run_sweep(spec, progress=False, server_cls=OOMServer)
    assert out.exit_code == 1 and out.planned == 4 and out.failed == 2
    df = out.results.set_index(["model", "test"])
    for t in ("weat7", "weat8"):
        err = df.loc[("broken", f"en/{t}"), "error"]
        assert df.loc[("broken", f"en/{t}"), "status"] == "failed"
        # a failed load records the revision the planner resolved (here the folder's digest), not ''
        assert df.loc[("broken", f"en/{t}"), "revision"] == hf.dir_digest(broken)
        assert err.startswith(f"model '{broken}' could not be loaded: ModelError:") and "no weights" in err
        # the healthy model's numbers are those of the same task without any OOM
        assert df.loc[("bert", f"en/{t}"), "status"] == "finished"
        ref = runner.score(str(bert), t, "seat", {"permutations": 200, "n_bootstrap": 20}, seed=0,
                           model_options={"backend": "hf-mlm"})
        assert df.loc[("bert", f"en/{t}"), "value"] == pytest.approx(ref.value, abs=1e-5)
        assert df.loc[("bert", f"en/{t}"), "p_value"] == pytest.approx(ref.fields["p_value"], abs=1e-9)
    sizes = [json.loads(x) for x in (spec.output_dir / "batches.jsonl").read_text().splitlines()]
    seq = [s["n"] for s in sizes]
    # each batched call starts at 32 (the automatic CPU size); 32 -> 16 -> 8 -> 4: each OOM
    # halves the batch and retries it; the following batches keep the size that fitted
    starts = [i for i, n in enumerate(seq) if n == 32]
    assert starts and starts[0] == 0, seq
    for a, b in zip(starts, starts[1:] + [len(seq)]):
        assert seq[a:a + 4] == [32, 16, 8, 4] and max(seq[a + 3:b]) <= MAX_BATCH, seq
    assert [s["oom"] for s in sizes].count(True) == 3 * len(starts)
    print(f"\nOOM: {len(starts)} batched calls, {len(seq)} forward passes, sizes {seq[:8]}...", file=sys.stderr)
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    assert_exactly_once(tr, {k for k in out.results[out.results["model"] == "bert"]["key"]}, others=frozenset({"FAILED"}))
    assert sorted(r.data.tags["audit.model"] for r in tr.task_runs() if r.info.status == "FAILED") == ["broken"] * 2


# --------------------------------------------------------------------------------------
# A node lost
# --------------------------------------------------------------------------------------


class NodeReportingServer(ModelServer):
    """Writes the Ray node id of each load to ``nodes.jsonl``; 0.4 s per request so that the
    node removal lands while requests are pending."""

    def ensure_loaded(self):
        fresh = self.model is None
        model = super().ensure_loaded()
        if fresh:
            node = ray.get_runtime_context().get_node_id()
            with open(Path(self.load_log).parent / "nodes.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"node": node, "pid": os.getpid()}) + "\n")
        return model

    def measure_batch(self, requests, tests):
        time.sleep(0.4)
        return super().measure_batch(requests, tests)


@pytest.mark.ray
def test_node_lost_its_work_is_rescheduled_and_every_result_arrives_once(tmp_path):
    from ray.cluster_utils import Cluster

    tests = ["weat1", "weat2", "weat6", "weat7", "weat8", "weat9"]
    spec = load_spec(write_spec(tmp_path, "nodelost", FT, tests=tests, metrics="[weat, same]"))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80_000_000, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=2, object_store_memory=80_000_000) for _ in range(2)]
    removed = []
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        cluster.wait_for_nodes()
        nodes_log = spec.output_dir / "nodes.jsonl"

        def remove_actor_node():
            """Remove the model actor's node (its raylet, workers and object store) shortly after
            the model is loaded there, while most of its requests (0.4 s each) are queued."""
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if nodes_log.is_file() and nodes_log.read_text().strip():
                    first = json.loads(nodes_log.read_text().splitlines()[0])
                    time.sleep(0.5)
                    (node,) = [w for w in workers if w.node_id == first["node"]]
                    cluster.remove_node(node)
                    removed.append(first["node"])
                    return
                time.sleep(0.05)

        th = threading.Thread(target=remove_actor_node, daemon=True)
        th.start()
        out = run_sweep(spec, progress=False, server_cls=NodeReportingServer)
        th.join(timeout=5)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert removed, "no node was removed"
    assert out.exit_code == 0 and out.planned == out.ran == 12 and out.failed == 0
    loads = [json.loads(x) for x in nodes_log.read_text().splitlines()]
    # the actor was restarted on the surviving node and reloaded its model there
    assert len(loads) == 2 and loads[0]["node"] == removed[0] and loads[1]["node"] != removed[0]
    assert_exactly_once(Tracker(spec.resolved_tracking_uri, spec.resolved_experiment), planned_keys(spec))
    model = str(spec.output_dir / "models" / "ft" / "model.bin")
    df = out.results.set_index(["test", "metric"])
    ref = runner.score(model, "weat9", "weat", {"permutations": 200, "n_bootstrap": 20}, seed=0)
    assert df.loc[("en/weat9", "weat"), "value"] == pytest.approx(ref.value, abs=1e-12)
    assert df.loc[("en/weat9", "weat"), "p_value"] == ref.fields["p_value"]
