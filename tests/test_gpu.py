"""The CUDA paths of the Hugging Face engine, on a real GPU: the defaults (CUDA, float32: the same
numbers and key as on the CPU), the numbers against the same model on the CPU for every operation
of the model interface (each through the family that uses it), ``device_map``, the token budget,
a real out-of-memory error, the model worker's release of GPU memory, the model workers as Ray
actors (the GPU Ray gave them, none where they reserved none) and the LM debiasing steps.

Every test here needs a CUDA device and is skipped without one (the ``gpu`` tier: CI's machines
have none). On a GPU machine: ``python -m pytest -q -s -m gpu tests/test_gpu.py``; with only the
core and Ray installed (no MLflow: the Ray test starts its own head and calls the actors
directly), add ``--noconftest -o addopts=`` (the module uses no fixture of ``tests/conftest.py``). ``BIASAUDIT_DATA`` must name the shared data (CrowS-Pairs, BBQ in
English, the HONEST templates). Each test prints what it measured (``-s`` shows it).

Tolerances. float32 on the GPU against float32 on the CPU: log-likelihood sums within
1e-3 + 1e-5 x |value| (the same operations, other kernels and summation orders). bfloat16 keeps
8 bits of mantissa, so its sums of a sentence's ~30 token log-probabilities move by tenths of a
nat: it is held to the ranking, a correlation of at least 0.98 with float32 over sentences and the
same direction for every pair whose float32 margin exceeds 1 nat.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from actors.model_actor import MeasureRequest, ModelAssignment, ModelServer
from audit import runner, tiny_models
from audit.backends.hf import load_hf_model
from audit.backends.hf_scoring import (DEFAULT_TOKENS_CUDA_MAX, DEFAULT_TOKENS_CUDA_MIN,
                                       DEFAULT_TOKENS_PER_GIB_CUDA, default_token_budget)
from audit.errors import ParameterError

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the gpu tier)")]

CROWS = ("en/crows_pairs", "crows_pairs", {"limit": 200})
BBQ = ("en/bbq", "bbq", {"limit": 8, "n_bootstrap": 0, "categories": ["Age", "Religion"]})


def report(line: str) -> None:
    print(f"\n[gpu] {line}", file=sys.stderr)


def table(model, task) -> "object":
    test, metric, params = task
    return runner.measure(model, runner.load_test(test), metric, params).table


def score_columns(t) -> list[str]:
    return [c for c in t.columns if c.endswith("_score") or (c.startswith("score") and c[5:].isdigit())]


def close_fp32(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a - b|, after asserting ``|a - b| <= 1e-3 + 1e-5 |b|`` everywhere."""
    diff = np.abs(a - b)
    assert np.all(diff <= 1e-3 + 1e-5 * np.abs(b)), f"max |diff| {diff.max():.2e} at {int(diff.argmax())}"
    return float(diff.max())


def same_ranking(low: np.ndarray, ref: np.ndarray, margins_low: np.ndarray, margins_ref: np.ndarray) -> tuple:
    """bfloat16 against float32: correlation over every score, and the sign of every margin over 1 nat."""
    r = float(np.corrcoef(low.ravel(), ref.ravel())[0, 1])
    clear = np.abs(margins_ref) > 1.0
    flipped = int(np.sum(np.sign(margins_low[clear]) != np.sign(margins_ref[clear])))
    assert r >= 0.98, f"correlation with float32 {r:.4f}"
    assert flipped == 0, f"{flipped} of {int(clear.sum())} clear margins changed direction"
    return r, int(clear.sum()), float(np.abs(low - ref).max())


@pytest.fixture(scope="module")
def medium_llama(tmp_path_factory):
    """A random Llama of ~155M parameters (hidden 1024, 8 layers, 32000 output rows) with the
    tiny tokenizer: big enough that its memory and its batches show on a GPU."""
    return tiny_models.build_random("llama", hidden=1024, layers=8, heads=16, kv_heads=4, ffn=2816, vocab=32000,
                                    positions=512, out=tmp_path_factory.mktemp("gpu") / "medium-llama")


def test_cuda_is_the_default_in_float32_with_a_budget_from_the_device_memory():
    """The default device is CUDA and the default dtype float32, as on the CPU: the key holds a
    requested dtype and never the device, so the default numbers must not depend on it; a requested
    bfloat16 is recorded and keyed."""
    path = str(tiny_models.tiny_model_dir("llama"))
    m = runner.load_model(path)
    assert m.handle.device.type == "cuda" and m.handle.dtype == torch.float32
    assert next(m.handle.model.parameters()).device.type == "cuda"
    res = runner.score(m, "en/crows_pairs", "crows_pairs", {"limit": 20})
    assert res.provenance["device"].startswith("cuda") and res.provenance["dtype"] == "float32"
    cpu = runner.score(path, "en/crows_pairs", "crows_pairs", {"limit": 20}, model_options={"device": "cpu"})
    assert cpu.provenance["key"] == res.provenance["key"] and cpu.value == res.value
    low = runner.score(path, "en/crows_pairs", "crows_pairs", {"limit": 20}, model_options={"dtype": "bfloat16"})
    assert low.provenance["dtype"] == "bfloat16" and low.provenance["key"] != res.provenance["key"]
    gib = torch.cuda.get_device_properties(0).total_memory / 2 ** 30
    want = int(min(DEFAULT_TOKENS_CUDA_MAX, max(DEFAULT_TOKENS_CUDA_MIN, gib * DEFAULT_TOKENS_PER_GIB_CUDA)))
    assert default_token_budget(m.handle.device) == want
    report(f"{torch.cuda.get_device_name(0)}: {gib:.1f} GiB, token budget {want}, default dtype {m.handle.dtype}")


@pytest.mark.parametrize("kind,task", [("llama", CROWS), ("gpt2", CROWS), ("bert", CROWS), ("llama", BBQ),
                                       ("qwen2", BBQ)], ids=["llama-crows", "gpt2-crows", "bert-crows",
                                                             "llama-bbq", "qwen2-bbq"])
def test_scores_on_the_gpu_are_the_cpus(kind, task):
    path = str(tiny_models.tiny_model_dir(kind))
    cpu = table(runner.load_model(path, device="cpu"), task)
    gpu32 = table(runner.load_model(path, device="cuda", dtype="float32"), task)
    gpu16 = table(runner.load_model(path, device="cuda", dtype="bfloat16"), task)
    cols = score_columns(cpu)
    assert len(cols) >= 2 and len(cpu) > 10
    ref, s32, s16 = (t[cols].to_numpy(np.float64) for t in (cpu, gpu32, gpu16))
    err32 = close_fp32(s32, ref)
    # margins: more minus less (CrowS-Pairs); best minus second-best option (BBQ)
    def margins(s):
        if s.shape[1] == 2:
            return s[:, 0] - s[:, 1]
        top = np.sort(s, axis=1)
        return np.where(np.argmax(s, 1) == np.argmax(ref, 1), 1, -1) * (top[:, -1] - top[:, -2])
    r, n_clear, err16 = same_ranking(s16, ref, margins(s16), margins(ref))
    report(f"{kind} {task[1]} ({len(cpu)} items): float32 max |gpu - cpu| {err32:.1e}; bfloat16 max |diff| "
           f"{err16:.2f} nat, r={r:.4f}, {n_clear} clear margins kept")


def test_embeddings_on_the_gpu_are_the_cpus(tmp_path):
    from sentence_transformers import SentenceTransformer

    from audit.datasets import load_test
    from audit.measure.contextual import seat_sentences

    sents = list(seat_sentences(load_test("weat7"), "model")["sentence"])[:64]
    bert = str(tiny_models.tiny_model_dir("bert"))
    cpu = load_hf_model(bert, kind="encoder", device="cpu").embed(sents, method="mean")
    gpu = load_hf_model(bert, kind="encoder", device="cuda", dtype="float32").embed(sents, method="mean")
    np.testing.assert_allclose(gpu, cpu, atol=1e-4, rtol=0)
    st_path = str(tiny_models.build_tiny_st(tmp_path))
    st = runner.load_model("st:" + st_path, device="cuda")
    assert str(st.handle.device).startswith("cuda")
    got = st.handle.embed(sents, batch_size=16)
    want = SentenceTransformer(st_path, device="cpu").encode(sents, convert_to_numpy=True)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    report(f"SEAT embeddings ({len(sents)} sentences): hf max |gpu - cpu| {np.abs(gpu - cpu).max():.1e}; "
           f"sentence-transformers max |gpu - encode on cpu| {np.abs(got - want).max():.1e}")


HELDOUT = ["the man said that he would call his sister tomorrow .", "the weather was cold and the roads were icy .",
           "her mother told the man about his new job .", "the nurse said that she was tired after the night shift ."]


@pytest.mark.parametrize("kind,test,metric,params", [
    ("bert", "weat7", "lpbs", {}),
    ("llama", "weat7", "lpbs", {}),
    ("llama", "heldout", "perplexity", {}),
    ("bert", "heldout", "perplexity", {}),
    ("llama", "weat7", "seat", {}),
    ("llama", "en/bbq", "bbq_generate", {"limit": 8, "categories": ["Age", "Religion"], "max_new_tokens": 16}),
], ids=["bert-lpbs", "llama-lpbs", "llama-perplexity", "bert-pseudo-perplexity", "llama-seat", "llama-bbq-generate"])
def test_the_other_operations_on_the_gpu_are_the_cpus(kind, test, metric, params, tmp_path):
    """The model interface's remaining operations, each through the family that uses it, float32 on
    the GPU against the CPU: masked-LM span scores (LPBS, masked), continuation log-likelihoods (LPBS,
    causal), rolling log-likelihoods and pseudo-log-likelihoods (perplexity), decoder embeddings
    (SEAT) and greedy generation until a stop (generative BBQ). Scores and embeddings are held to the
    float32 tolerance; generated text to equality on at least 95 % of the items (greedy decoding can
    take the other side of a near tie on other kernels)."""
    if test == "heldout":
        (tmp_path / "heldout.txt").write_text("\n".join(HELDOUT) + "\n", encoding="utf-8")
        test = tmp_path / "heldout.yaml"
        test.write_text("name: heldout\nlanguage: en\nformat: text\ndata: ./heldout.txt\n", encoding="utf-8")
    path = str(tiny_models.tiny_model_dir(kind))
    loaded = runner.load_test(str(test))
    cpu, gpu = (runner.measure(runner.load_model(path, device=d, dtype="float32"), loaded, metric, params)
                for d in ("cpu", "cuda"))
    errs, agree = [], {}
    for a, b in zip(cpu.targets + cpu.attributes, gpu.targets + gpu.attributes):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
        errs.append(float(np.abs(b - a).max()))
    if cpu.table is not None:
        assert len(cpu.table) == len(gpu.table) > 0 and list(cpu.table.columns) == list(gpu.table.columns)
        for c in cpu.table.columns:
            if pd.api.types.is_float_dtype(cpu.table[c]):
                errs.append(close_fp32(gpu.table[c].to_numpy(np.float64), cpu.table[c].to_numpy(np.float64)))
            else:
                agree[c] = float(np.mean([x == y for x, y in zip(cpu.table[c], gpu.table[c])]))
        assert all(v >= 0.95 for v in agree.values()), agree  # share of rows equal, per column
    assert errs or agree
    report(f"{kind} {metric}: float32 max |gpu - cpu| {max(errs, default=0.0):.1e}"
           + (f"; other columns equal on at least {min(agree.values()):.1%} of rows" if agree else ""))


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_honest_generation_on_the_gpu_is_the_cpus(kind):
    """Causal LMs: the first words of greedy continuations; masked LMs: the top-k fills."""
    path = str(tiny_models.tiny_model_dir(kind))
    test = runner.load_test("en/honest")
    cpu = runner.measure(runner.load_model(path, device="cpu"), test, "honest", {}).table
    gpu = runner.measure(runner.load_model(path, device="cuda", dtype="float32"), test, "honest", {}).table
    gpu16 = runner.measure(runner.load_model(path, device="cuda", dtype="bfloat16"), test, "honest", {}).table
    assert len(cpu) == len(gpu) == len(gpu16) > 100
    first = np.array([a[0] == b[0] for a, b in zip(cpu["completions"], gpu["completions"])])
    assert first.mean() >= 0.95, f"first completions equal on {first.mean():.1%} of prompts"
    lp_cpu = np.array([lp[0] for lp in cpu["logprobs"]])[first]
    lp_gpu = np.array([lp[0] for lp in gpu["logprobs"]])[first]
    np.testing.assert_allclose(lp_gpu, lp_cpu, atol=1e-3, rtol=0)
    k = len(cpu["completions"].iloc[0])
    assert all(len(c) == k for c in gpu16["completions"])
    same16 = np.mean([a[0] == b[0] for a, b in zip(cpu["completions"], gpu16["completions"])])
    report(f"HONEST {kind} ({len(cpu)} prompts, top {k}): float32 first completion equal on {first.mean():.1%}, "
           f"max |logprob diff| {np.abs(lp_gpu - lp_cpu).max():.1e}; bfloat16 equal on {same16:.1%}")


def test_device_map_auto_gives_the_one_device_numbers():
    """With accelerate (not a dependency of biasaudit): the one-device numbers; without it: the
    documented one-line refusal."""
    import importlib.util

    from audit.errors import ModelError

    path = str(tiny_models.tiny_model_dir("llama"))
    if importlib.util.find_spec("accelerate") is None:
        with pytest.raises(ModelError, match="needs the accelerate package"):
            runner.load_model(path, device_map="auto")
        return
    one = runner.load_model(path, device="cuda", dtype="float32")
    mapped = runner.load_model(path, device_map="auto", dtype="float32")
    assert mapped.handle.device_map == "auto" and mapped.handle.load_info()["device_map"] == "auto"
    assert {p.device.type for p in mapped.handle.model.parameters()} == {"cuda"}
    a, b = table(one, CROWS), table(mapped, CROWS)
    cols = score_columns(a)
    err = close_fp32(b[cols].to_numpy(np.float64), a[cols].to_numpy(np.float64))
    with pytest.raises(ParameterError, match="not both"):
        runner.load_model(path, device="cuda", device_map="auto")
    report(f"device_map='auto': max |diff| against device='cuda' {err:.1e}")


def test_the_worker_gives_the_gpu_memory_back(medium_llama):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    test = runner.load_test("en/crows_pairs")
    server = ModelServer()
    req = [MeasureRequest(index=0, test="t", metric="crows_pairs", params={"limit": 100})]
    levels = []
    for i in range(3):  # two names: each cycle releases the other model and loads again
        a = ModelAssignment(name=f"m{i % 2}", ref=str(medium_llama), local_ref=str(medium_llama),
                            options={"dtype": "bfloat16"})
        (o,) = server.serve(a, req, {"t": test})
        assert o.error is None, o.error
        model = server.model.handle.model
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        assert next(model.parameters()).dtype == torch.bfloat16
        del model
        loaded = torch.cuda.memory_allocated()
        peak_reserved = torch.cuda.memory_reserved()
        server.release()
        levels.append((loaded - base, torch.cuda.memory_allocated() - base,
                       torch.cuda.memory_reserved() - base_reserved, peak_reserved - base_reserved))
        assert loaded - base >= 0.95 * weights, levels
    for held, after, reserved_after, _ in levels:
        assert after <= 2 ** 20, levels  # every tensor of the model is gone
        assert reserved_after <= 2 ** 20, levels  # and the allocator's cache is given back to the driver
    mib = [tuple(round(x / 2 ** 20, 1) for x in lv) for lv in levels]
    report(f"release, 3 cycles (MiB: held, allocated after, reserved after, reserved while loaded): {mib}; "
           f"weights {weights / 2 ** 20:.0f} MiB")


class CudaProbe(ModelServer):
    """The sweep's model server, telling what CUDA its process sees."""

    def cuda_state(self) -> dict:
        import os

        import ray

        on = torch.cuda.is_available()
        return {"gpus": [str(g) for g in ray.get_gpu_ids()], "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "hidden": self.gpus_hidden, "cuda": on,
                "device": str(self.model.handle.device) if self.model is not None else None,
                "allocated": torch.cuda.memory_allocated() if on else 0,
                "reserved": torch.cuda.memory_reserved() if on else 0}


def test_a_sweeps_model_workers_use_the_gpus_ray_gave_them():
    """The model worker as a sweep runs it: a Ray actor of :mod:`actors.model_actor` with the options
    of :func:`actors.model_actor.actor_options`. ``actor_num_gpus: auto`` reserves the GPU for a
    Hugging Face model, whose worker loads there and gives the CPU's numbers, then all of the memory
    back when it is released for the next model. A worker reserving no GPU (``actor_num_gpus: 0``)
    sees none (Ray alone would leave it every GPU of the node): it loads on the CPU, and a model that
    names ``device: cuda`` fails there with one line."""
    import ray

    from actors.model_actor import actor_options, model_actor_class

    if ray.is_initialized():  # a Ray left connected by an earlier module (with tests/conftest.py)
        ray.shutdown()
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False,
             object_store_memory=300_000_000)
    try:
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # CudaProbe travels by value
        gpus = ray.cluster_resources().get("GPU", 0.0)
        kw = dict(num_cpus=1, cluster_gpus=gpus, max_restarts=0, max_task_retries=0)
        assert actor_options(kind="causal", num_gpus="auto", **kw)["num_gpus"] == 1.0
        actor = model_actor_class(CudaProbe)
        on_gpu = actor.options(**actor_options(kind="causal", num_gpus="auto", **kw)).remote()
        off_gpu = actor.options(**actor_options(kind="causal", num_gpus=0, **kw)).remote()
        test = runner.load_test(CROWS[0])
        req = [MeasureRequest(index=0, test="t", metric=CROWS[1], params=CROWS[2])]
        llama = str(tiny_models.tiny_model_dir("llama"))

        def assign(name: str, **options) -> ModelAssignment:
            return ModelAssignment(name=name, ref=llama, local_ref=llama, options=options)

        (a,), (b,) = ray.get([on_gpu.serve.remote(assign("llama"), req, {"t": test}),
                              off_gpu.serve.remote(assign("llama"), req, {"t": test})])
        assert a.error is None and b.error is None, (a.error, b.error)
        sa, sb = ray.get([on_gpu.cuda_state.remote(), off_gpu.cuda_state.remote()])
        assert len(sa["gpus"]) == 1 and sa["cuda"] and sa["device"].startswith("cuda") and not sa["hidden"], sa
        assert sa["allocated"] > 0, sa
        assert sb["gpus"] == [] and sb["hidden"] and sb["visible"] == "" and not sb["cuda"], sb
        assert sb["device"] == "cpu", sb
        ref = table(runner.load_model(llama, device="cpu"), CROWS)
        cols = score_columns(ref)
        err_gpu = close_fp32(a.measurement.table[cols].to_numpy(np.float64), ref[cols].to_numpy(np.float64))
        err_cpu = close_fp32(b.measurement.table[cols].to_numpy(np.float64), ref[cols].to_numpy(np.float64))

        ray.get(on_gpu.release.remote())
        after = ray.get(on_gpu.cuda_state.remote())
        assert after["allocated"] <= 2 ** 20 and after["reserved"] <= 2 ** 20, (sa, after)

        (c,) = ray.get(off_gpu.serve.remote(assign("llama-on-cuda", device="cuda"), req, {"t": test}))
        assert c.error is not None and "\n" not in c.error and "CUDA_VISIBLE_DEVICES is empty" in c.error, c.error
        report(f"Ray actors: GPU worker on {sa['device']} (Ray's GPU {sa['gpus']}, CUDA_VISIBLE_DEVICES="
               f"{sa['visible']!r}), max |gpu - cpu| {err_gpu:.1e}; {sa['allocated'] / 2 ** 20:.1f} MiB held, "
               f"{after['allocated'] / 2 ** 20:.2f} allocated and {after['reserved'] / 2 ** 20:.2f} reserved after "
               f"release; no-GPU worker on {sb['device']} (CUDA hidden: {sb['hidden']}), max |diff| {err_cpu:.1e}; "
               f"device: cuda there: {c.error}")
    finally:
        ray.shutdown()


def test_a_real_out_of_memory_halves_the_batch_and_keeps_the_numbers(medium_llama):
    m = runner.load_model(str(medium_llama), device="cuda", dtype="float32")
    task = ("en/crows_pairs", "crows_pairs", {"limit": 300})
    ref = table(m, (task[0], task[1], {**task[2], "batch_size": 16}))
    cols = score_columns(ref)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    ooms = torch.cuda.memory_stats().get("num_ooms", 0)
    headroom = 512 * 2 ** 20
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated() + headroom) / total, 0)
    try:
        got = table(m, task)  # the default budget's first batch cannot fit in 512 MiB
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    new_ooms = torch.cuda.memory_stats().get("num_ooms", 0) - ooms
    assert new_ooms >= 1
    err = close_fp32(got[cols].to_numpy(np.float64), ref[cols].to_numpy(np.float64))
    report(f"out of memory with 512 MiB of headroom: {new_ooms} OOM(s) caught, batches halved; "
           f"{len(got)} pairs, max |diff| against batches of 16: {err:.1e}")


def test_result_provenance_records_where_the_numbers_came_from():
    path = str(tiny_models.tiny_model_dir("gpt2"))
    res = runner.score(path, "en/crows_pairs", "crows_pairs", {"limit": 10}, model_options={"dtype": "float16"})
    assert res.provenance["dtype"] == "float16" and res.provenance["device"].startswith("cuda")
    d = dataclasses.asdict(res) if dataclasses.is_dataclass(res) else res.to_dict()
    assert np.isfinite(d["value"])


def test_lm_debiasing_trains_fits_and_scores_on_the_gpu(tmp_path):
    """Every LM debiasing path on a GPU model: CDA trains there by default (and on the CPU when
    asked); INLP's and SentenceDebias's features come from the GPU model, in float32 whatever its
    dtype, and give the CPU's projection and direction; Self-Debias (its reference log-probabilities
    and a debiased model's CrowS-Pairs scores) gives the CPU's numbers."""
    import json

    from audit.datasets.corpus import corpus_from_tests
    from audit.lm_mitigation.models import SelfDebiasedModel
    from audit.lm_mitigation.pairs import derive_pairs
    from audit.lm_mitigation.steps import INLP, SelfDebias, SentenceDebias
    from audit.runner import LoadedModel
    from jobs.lm_builders import build_lm_debiased

    lines = corpus_from_tests(["en"], seed=0, sentences_per_word=2)["en"][:400]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bert = tiny_models.tiny_model_dir("bert")
    kw = dict(kind="mlm", technique="cda", corpus=corpus, params={"steps": 3, "batch_size": 4})
    on_gpu = json.loads((build_lm_debiased(tmp_path / "g", "cda", bert, **kw) / "mitigation.json").read_text())
    on_cpu = json.loads((build_lm_debiased(tmp_path / "c", "cda", bert, device="cpu", **kw) / "mitigation.json"
                         ).read_text())
    assert on_gpu["device"].startswith("cuda") and on_cpu["device"] == "cpu"
    assert len(on_gpu["losses"]) == 3 and all(np.isfinite(on_gpu["losses"]))
    assert runner.score(str(tmp_path / "g" / "models" / "cda"), "en/crows_pairs", "crows_pairs",
                        {"limit": 20}).provenance["device"].startswith("cuda")

    pairs = derive_pairs("en", "gender")
    tok = load_hf_model(bert, kind="mlm", device="cpu").tokenizer
    models = {(d, t): load_hf_model(bert, kind="mlm", device=d, dtype=t).model
              for d, t in (("cpu", "float32"), ("cuda", "float32"), ("cuda", "bfloat16"))}

    def cos(u, v):
        return float(np.abs(np.sum(u * v)) / (np.linalg.norm(u) * np.linalg.norm(v)))

    sd = {k: SentenceDebias().fit(m, tok, lines, pairs).directions_ for k, m in models.items()}
    cos32, cos16 = cos(sd["cpu", "float32"], sd["cuda", "float32"]), cos(sd["cpu", "float32"], sd["cuda", "bfloat16"])
    assert cos32 >= 0.9999 and cos16 >= 0.99, (cos32, cos16)  # the same first direction (up to its sign)
    inlp = {k: INLP(n_classifiers=4, n_sentences=200).fit(m, tok, lines, pairs).projection_ for k, m in models.items()}
    d_inlp = float(np.abs(inlp["cuda", "float32"] - inlp["cpu", "float32"]).max())
    assert d_inlp <= 1e-3, d_inlp
    assert inlp["cuda", "bfloat16"].shape == inlp["cpu", "float32"].shape

    llama = str(tiny_models.tiny_model_dir("llama"))
    step = SelfDebias(decay_constant=50.0)
    step.provenance_ = {"technique": "self_debias", "params": step.get_params()}  # as a loaded variant has
    handles = {d: load_hf_model(llama, kind="causal", device=d, dtype="float32") for d in ("cpu", "cuda")}
    ids = handles["cpu"].tokenizer("the nurse said that she was tired")["input_ids"]
    ref_lp = {d: step.logprobs(h.model, h.tokenizer, ids, kind="causal").numpy() for d, h in handles.items()}
    np.testing.assert_allclose(ref_lp["cuda"], ref_lp["cpu"], atol=1e-4, rtol=0)
    a, b = (table(LoadedModel(ref="sd", kind="causal", backend="hf", revision="r",
                              handle=SelfDebiasedModel(handles[d], step)),
                  ("en/crows_pairs", "crows_pairs", {"limit": 60})) for d in ("cpu", "cuda"))
    cols = score_columns(a)
    err = close_fp32(b[cols].to_numpy(np.float64), a[cols].to_numpy(np.float64))
    report(f"LM debiasing: CDA trained on {on_gpu['device']} (losses {[round(x, 2) for x in on_gpu['losses']]}); "
           f"SentenceDebias |cos| with the CPU's direction: float32 {cos32:.6f}, bfloat16 {cos16:.4f}; INLP "
           f"projection max |gpu - cpu| {d_inlp:.1e}; Self-Debias max |gpu - cpu|: reference log-probs "
           f"{np.abs(ref_lp['cuda'] - ref_lp['cpu']).max():.1e}, CrowS-Pairs {err:.1e}")
