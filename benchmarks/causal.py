"""Benchmark: causal-LM scoring and decoder embeddings against lm-evaluation-harness and a loop.

Run: ``.venv/bin/python benchmarks/causal.py [--pairs N] [--lpbs N] [--sentences N] [--threads T]
[--model tiny|large] [--repeats R] [--device cpu|cuda]`` (defaults: every pair of the revised
English CrowS-Pairs, 2000 LPBS requests, 1000 SEAT sentences, torch's default threads, best of 3
interleaved runs, CPU; about a minute on 2 cores with the tiny model). ``--device cuda`` puts the
model (float32) on the GPU for both tools; the harness then runs on that device too (its ``HFLM``
takes a loaded model's device), and ``biasaudit, token budget`` uses the CUDA budget.

Part 1, log-likelihoods. Requests: CrowS-Pairs (both sentences of every pair of the revised
English set ``../shared/data/crows-pairs-multilingual/crows_pairs_en_revised.tsv``, empty
context: the harness's ``crows_pairs_english`` requests) and causal LPBS (the target and prior
requests of the English shipped tests' LPBS sentences, :func:`audit.measure.lpbs.causal_requests`:
a context and a one-word continuation). Both tools score the same requests on the same model in
this process:

* *harness*: lm-evaluation-harness 0.4.13 ``HFLM.loglikelihood`` (its ``Collator`` length
  sorting, per-request slicing, full-vocabulary ``log_softmax`` over every position of the
  batch, greedy check) at batch size 1 (its default) and 32; ``accelerate`` stubbed out if
  missing (``tests/lm_eval_compat.py``: unused on this single-process path);
* *biasaudit*: :func:`audit.backends.hf_scoring.continuation_loglik` with ``start="harness"``
  (identical tokenisation; for a Llama tokenizer also the default) at batch size 32 and at its
  default (a token budget: 4096 tokens a batch on CPU,
  :func:`audit.backends.hf_scoring.default_token_budget`).

The log-likelihoods are asserted equal within 1e-4 + 1e-6 x |log-likelihood| per request
(``tests/lm_eval_compat.harness_tolerance``: the harness's sums are float32), on CUDA within 1e-4 + 1e-5 x
|log-likelihood| (float32 sums over batches of other shapes there differ in the last bits).

Part 2, decoder embeddings for SEAT: every SEAT sentence of the English shipped tests (filled
templates, :func:`audit.measure.contextual.seat_sentences`), position-weighted mean pooling (the
causal default), :func:`audit.measure.contextual.embed_sentences` against a loop that tokenises
and runs one sentence at a time and pools the unpadded states; asserted equal within 1e-5.

Models (``--model``): ``tiny`` (default) is the tiny Llama of :mod:`audit.tiny_models` (hidden 32,
2 layers, vocabulary 900: the issue's "same tiny Llama"); ``large`` is a seeded random
``LlamaForCausalLM`` with hidden 512, 4 layers, 8 heads (2 key/value heads) and a 32000-row output
vocabulary (the tiny tokenizer's ids are its first 900 rows), so that the LM head costs what it
costs in real models. Threads: torch's default; on a loaded shared machine use ``--threads 1``
(OpenMP threads spin-wait and distort batch-1 timings most).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

CLOCK = time.perf_counter  # --clock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def build_large(vocab: int):
    """The ``large`` model: :func:`audit.tiny_models.build_random` (hidden 512, 4 layers, 8 heads,
    2 key/value heads, ``vocab`` output rows, 512 positions)."""
    from audit import tiny_models

    return tiny_models.build_random("llama", kv_heads=2, vocab=vocab)


def crows_requests(n: int | None) -> list[tuple[str, str]]:
    from audit.datasets import load_test

    df = load_test("en/crows_pairs_revised").table
    if n:
        df = df.head(n)
    return [("", s) for m, l in zip(df["sent_more"], df["sent_less"]) for s in (m, l)]


def lpbs_requests(n: int) -> list[tuple[str, str]]:
    from audit.catalog import list_tests
    from audit.datasets import load_test
    from audit.measure.lpbs import causal_requests, lpbs_design, lpbs_sentences

    out: list[tuple[str, str]] = []
    for name, metrics in zip(list_tests("en").name, list_tests("en").metrics):
        if "lpbs" not in str(metrics):
            continue
        rows = lpbs_sentences(lpbs_design(load_test(name)))
        for s, ts, as_ in zip(rows["sentence"], rows["target_span"], rows["attribute_span"]):
            _, req, prior = causal_requests(s, tuple(ts), tuple(as_))
            out += [req, prior]
    return out[:n]


def seat_sentences_en(n: int) -> list[str]:
    from audit.catalog import list_tests
    from audit.datasets import load_test
    from audit.measure.contextual import seat_sentences

    out: list[str] = []
    for name, metrics in zip(list_tests("en").name, list_tests("en").metrics):
        if "seat" in str(metrics):
            out += list(seat_sentences(load_test(name), "weighted_mean")["sentence"])
    return out[:n]


def timed(fn):
    t0 = CLOCK()
    res = fn()
    return CLOCK() - t0, res


def loop_embeddings(hm, sentences):
    """One sentence at a time: [BOS] + tokens, one forward pass, SGPT weights on the unpadded states."""
    import torch

    tok = hm.tokenizer
    out = []
    with torch.inference_mode():
        for s in sentences:
            ids = tok(s)["input_ids"]
            if ids[0] != tok.bos_token_id:
                ids = [tok.bos_token_id] + ids
            hs = hm.model.base_model(input_ids=torch.tensor([ids], device=hm.device),
                                     output_hidden_states=True).hidden_states[-1][0, 1:]
            w = torch.arange(1, hs.shape[0] + 1, dtype=torch.float32, device=hs.device)
            out.append(((w[:, None] * hs.float()).sum(0) / w.sum()).cpu().numpy())
    return np.stack(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=0, help="CrowS-Pairs pairs (default 0: all 1677)")
    ap.add_argument("--lpbs", type=int, default=2000, help="LPBS requests (default 2000)")
    ap.add_argument("--sentences", type=int, default=1000, help="SEAT sentences (default 1000)")
    ap.add_argument("--model", choices=("tiny", "large"), default="tiny")
    ap.add_argument("--vocab", type=int, default=32000, help="output rows of the large model")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--skip-batch1", action="store_true", help="do not time the harness at batch size 1")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per tool, interleaved; the best counts")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the model runs, for both tools")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall (default): elapsed time; cpu: this process's CPU time (time.process_time), "
                         "far less sensitive to other processes on a loaded machine (use with --threads 1)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    import torch

    from lm_eval_compat import harness_lm, harness_tolerance, loglikelihood

    from audit import tiny_models
    from audit.backends.hf import HFModel
    from audit.measure.contextual import embed_sentences
    from audit.backends.hf_scoring import continuation_loglik

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model == "tiny":
        model, tok = tiny_models.load_tiny("llama")
    else:
        model, tok = build_large(args.vocab)
    device = torch.device(args.device)
    model.to(device)
    atol, rtol = harness_tolerance(device.type)  # the harness sums in float32
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {type(model).__name__} ({args.model}) hidden={model.config.hidden_size} "
          f"layers={model.config.num_hidden_layers} vocab={model.config.vocab_size} params={n_params / 1e6:.2f}M; "
          f"torch threads={torch.get_num_threads()}; load average {os.getloadavg()[0]:.1f}; device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))

    reqs = {"crows_pairs": crows_requests(args.pairs or None), "lpbs": lpbs_requests(args.lpbs)}
    print(f"{'requests':<12}{'n':>6}  {'tool':<26}{'time (s)':>9}{'req/s':>9}{'vs harness b=32':>17}")
    ratios = {}
    for what, rq in reqs.items():
        continuation_loglik(model, tok, rq[:4], start="harness")  # warm-up, head split check
        tools = {}
        if not args.skip_batch1:
            h1 = harness_lm(model, tok, batch_size=1)
            tools["lm-eval HFLM, batch 1"] = lambda h1=h1: np.array([r[0] for r in loglikelihood(h1, rq)])
        h32 = harness_lm(model, tok, batch_size=32)
        tools["lm-eval HFLM, batch 32"] = lambda: np.array([r[0] for r in loglikelihood(h32, rq)])
        tools["biasaudit, batch 32"] = lambda: continuation_loglik(model, tok, rq, batch_size=32, start="harness")[0]
        tools["biasaudit, token budget"] = lambda: continuation_loglik(model, tok, rq, start="harness")[0]
        best: dict[str, float] = {}
        out: dict[str, np.ndarray] = {}
        for _ in range(args.repeats):  # interleaved, best of the repeats: a shared CPU's noise hits all alike
            for name, fn in tools.items():
                t, out[name] = timed(fn)
                best[name] = min(best.get(name, t), t)
        ref = out["lm-eval HFLM, batch 32"]
        h32_t = best["lm-eval HFLM, batch 32"]
        for name, t in best.items():
            err = float(np.abs(out[name] - ref).max())
            assert np.all(np.abs(out[name] - ref) <= atol + rtol * np.abs(ref)), \
                f"{what}: {name} differs from the harness by {err}"
            print(f"{what:<12}{len(rq):>6}  {name:<26}{t:>9.2f}{len(rq) / t:>9.0f}{h32_t / t:>16.1f}x")
        err = max(float(np.abs(out[n] - ref).max()) for n in best if n.startswith("biasaudit"))
        print(f"{'':<12}{'':>6}  max |biasaudit - harness| = {err:.1e} "
              f"(<= {atol:g} + {rtol:g} x |ll|: OK)")
        ratios[what] = (h32_t / best["biasaudit, batch 32"], h32_t / best["biasaudit, token budget"])
    for what, (r32, rd) in ratios.items():
        print(f"{what}: biasaudit vs lm-eval at batch 32: {r32:.1f}x at batch 32, {rd:.1f}x at its default "
              f"(goal >= 3x: {'met' if max(r32, rd) >= 3 else 'NOT met'})")

    sents = seat_sentences_en(args.sentences)
    hm = HFModel(ref="bench", name_or_path="bench", revision="x", kind="causal", model=model, tokenizer=tok,
                 device=device, dtype=torch.float32, backend="hf-causal")
    embed_sentences(hm, sents[:4], method="weighted_mean")
    t_b = t_l = float("inf")
    for _ in range(args.repeats):
        tb, emb = timed(lambda: embed_sentences(hm, sents, method="weighted_mean", batch_size=None))
        tl, ref = timed(lambda: loop_embeddings(hm, sents))
        t_b, t_l = min(t_b, tb), min(t_l, tl)
    err = float(np.abs(emb - ref).max())
    assert err <= 1e-5 * max(1.0, float(np.abs(ref).max())), f"embeddings differ by {err}"
    print(f"SEAT embeddings ({len(sents)} sentences, weighted_mean): batch-1 loop {t_l:.2f} s "
          f"({len(sents) / t_l:.0f}/s), batched {t_b:.2f} s ({len(sents) / t_b:.0f}/s): {t_l / t_b:.1f}x "
          f"(goal >= 5x: {'met' if t_l / t_b >= 5 else 'NOT met'}); max |diff| = {err:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
