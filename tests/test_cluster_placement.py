"""Placement on a heterogeneous cluster: model actors on the GPU node, statistics on CPU nodes.

A ``ray.cluster_utils.Cluster`` with a head node (1 CPU), a CPU worker node (2 CPUs) and a worker
node with 2 CPUs that advertises one GPU (a fake resource: there is no device; Ray only sets
``CUDA_VISIBLE_DEVICES``) runs a real sweep (:func:`jobs.sweep.run_sweep`) of a tiny BERT and a tiny word2vec model. The sweep's own
placement logic decides: :func:`actors.model_actor.actor_options` (``actor_num_gpus: auto``
gives a Hugging Face model one GPU when the cluster has any, a static model none) and
:func:`actors.stats.stats_task` (kept off GPU nodes). Each model actor and each statistics task writes its
node id (``ray.get_runtime_context().get_node_id()``) to a file; the test reads them back.

The GPU actor's placement is a hard constraint (only that node has a GPU). Keeping CPU-only work
off GPU nodes is only Ray's *preference* (``scheduler_avoid_gpu_nodes``), and locality-aware
leasing overrides it: a statistics task whose input (the measurement) sits in the GPU node's
object store is often run there, on the CPUs the model actor leaves free (measured here: 1 to 4
of the 4 statistics tasks, run to run). A hard constraint does keep them off:
``label_selector={"ray.io/node-id": "!in(<GPU node ids>)"}`` (every node carries its
``ray.io/node-id`` label), which :func:`actors.stats.gpu_node_selector` adds to every statistics
task of :func:`actors.stats.stats_task` when the cluster has GPU and CPU-only nodes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import ray

import actors.stats  # noqa: E402
from actors.model_actor import ModelServer, actor_options  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

from audit import tiny_models  # noqa: E402

class NodeRecordingServer(ModelServer):
    """The sweep's model server, noting where it runs before each request."""

    placement_log = ""

    def measure_batch(self, requests, tests):
        rec = {"what": "actor", "model": self.name, "node": ray.get_runtime_context().get_node_id(),
               "tasks": [r.index for r in requests], "gpus": [str(g) for g in ray.get_gpu_ids()],
               "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "hidden": self.gpus_hidden}
        with open(self.placement_log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        return super().measure_batch(requests, tests)


def recording_analyse(log_path: str):
    def analyse_batch(requests, outcomes, tests):
        rec = {"what": "stats", "node": ray.get_runtime_context().get_node_id(), "tasks": [r.index for r in requests],
               "gpus": [str(g) for g in ray.get_gpu_ids()]}
        with open(log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        import actors.stats as real  # in the worker process: the module as shipped

        return real.analyse_batch(requests, outcomes, tests)

    return analyse_batch


@pytest.mark.unit
def test_actor_options_ask_for_a_gpu_only_for_hf_models_on_gpu_clusters():
    kw = dict(num_cpus=0.5, max_restarts=1, max_task_retries=1)
    assert actor_options(kind="mlm", num_gpus="auto", cluster_gpus=1.0, **kw)["num_gpus"] == 1.0
    assert actor_options(kind="causal", num_gpus=0.25, cluster_gpus=4.0, **kw)["num_gpus"] == 0.25
    assert actor_options(kind="static", num_gpus="auto", cluster_gpus=1.0, **kw)["num_gpus"] == 0.0
    assert actor_options(kind="mlm", num_gpus="auto", cluster_gpus=0.0, **kw)["num_gpus"] == 0.0
    assert actor_options(kind="mlm", num_gpus="auto", cluster_gpus=1.0, **kw)["num_cpus"] == 0.5


def write_vectors(path: Path) -> Path:
    from audit.runner import load_test

    words = sorted({w for name in ("weat1", "weat2") for s in (*load_test(name).targets,
                                                              *load_test(name).attributes) for w in s.words})
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{len(words)} 8\n" + "".join(w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=8)) + "\n"
                                                   for w in words), encoding="utf-8")
    return path


@pytest.mark.ray
def test_model_actors_on_the_gpu_node_statistics_on_cpu_nodes(tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    from jobs.sweep import run_sweep

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bert = tiny_models.tiny_model_dir("bert")  # cached in $TMPDIR across sessions
    vec = write_vectors(tmp_path / "vectors.vec")
    log = tmp_path / "placement.jsonl"
    NodeRecordingServer.placement_log = str(log)
    monkeypatch.setattr(actors.stats, "analyse_batch", recording_analyse(str(log)))
    spec = parse_spec({
        "name": "placement", "seed": 0, "output_dir": str(tmp_path / "out"), "permutations": 100, "n_bootstrap": 0,
        "languages": ["en"], "tests": ["weat1", "weat2"], "metrics": ["weat"],
        "models": [{"ref": str(bert), "name": "tiny-bert"}, {"ref": str(vec), "name": "tiny-vec"}],
        "ray": {"actor_num_cpus": 0.5, "stats_num_cpus": 0.5, "actor_num_gpus": "auto", "batch_size": 1,
                "max_restarts": 0, "max_task_retries": 0},
    }, source="placement")

    if ray.is_initialized():  # a Ray left connected by an earlier module
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 100_000_000, "include_dashboard": False})
    try:
        cpu_node = cluster.add_node(num_cpus=2, object_store_memory=100_000_000)
        gpu_node = cluster.add_node(num_cpus=2, num_gpus=1, object_store_memory=100_000_000)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the recorders travel by value
        head_id, cpu_id, gpu_id = cluster.head_node.node_id, cpu_node.node_id, gpu_node.node_id
        assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == {head_id, cpu_id, gpu_id}
        assert ray.cluster_resources()["GPU"] == 1.0

        out = run_sweep(spec, progress=False, server_cls=NodeRecordingServer)
        assert out.exit_code == 0 and out.ran == 4 and out.failed == 0, out.results
    finally:
        ray.shutdown()
        cluster.shutdown()

    recs = [json.loads(x) for x in log.read_text().splitlines()]
    actors_at = {(r["model"], r["node"], tuple(r["gpus"])) for r in recs if r["what"] == "actor"}
    # what CUDA each worker sees: Ray's GPU for the Hugging Face model's; none for the static model's,
    # which Ray (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO off) would have left seeing every GPU of its node
    seen = {(r["model"], r["visible"], r["hidden"]) for r in recs if r["what"] == "actor"}
    assert seen == {("tiny-bert", "0", False), ("tiny-vec", "", True)}, seen
    stats = [r for r in recs if r["what"] == "stats"]
    # the Hugging Face model's actor holds the GPU; the static model's actor holds none
    [(bert_node, bert_gpus)] = [(n, g) for m, n, g in actors_at if m == "tiny-bert"]
    [(_, vec_gpus)] = [(n, g) for m, n, g in actors_at if m == "tiny-vec"]
    assert bert_node == gpu_id and bert_gpus == ("0",)
    assert vec_gpus == ()  # no GPU for a static model (where it runs is Ray's preference)
    # every statistics task ran on a CPU node, without a GPU
    assert sorted(i for r in stats for i in r["tasks"]) == [0, 1, 2, 3]
    assert {r["node"] for r in stats} <= {head_id, cpu_id} and all(r["gpus"] == [] for r in stats)
