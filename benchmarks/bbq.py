"""Benchmark: BBQ option scoring on a whole data set, batched vs lm-evaluation-harness's per-request loop.

Run: ``.venv/bin/python benchmarks/bbq.py [--language es] [--items N] [--threads T] [--skip-batch-1]
[--device cpu|cuda] [--vs REV]`` (the whole EsBBQ set, 27,320 items x 3 options = 81,960 requests; about ten
minutes on 2 cores, most of it the harness at batch size 1). ``--device cuda``: the model (float32)
on the GPU for every method; the log-likelihoods are then held to 1e-4 + 1e-5 x |value|.

Model: the tiny Llama-style causal LM of ``audit/tiny_models.py`` (``llama``; tiny GPT-2 where that
builder is absent), its position limit raised to 1024 (rotary positions: no weights change) so that
no request is truncated on either side; ``--model large``: a seeded random Llama (hidden 512, 4
layers, 32000-row head, about 44M parameters) on the tiny tokenizer, where the compute dominates
(use ``--items`` to take a part of the data). Data: the language's registered ``bbq`` test (EsBBQ for
``es``), every item, the harness's prompt for that language and the continuation ``" " + answer``.

Three ways, same process, same requests:

* *harness, batch 1*: lm-evaluation-harness 0.4.13's ``HFLM.loglikelihood`` at its default batch
  size (1), the per-request loop (``tests/lm_eval_compat.py`` builds it around the loaded model);
* *harness, batch 32*: the same at ``batch_size=32``;
* *batched*: :func:`audit.backends.hf_scoring.continuation_loglik` (what ``HFModel.loglikelihood`` runs, the causal-LM
  primitive: one tokenisation per request, identical sequences run once, length-sorted batches,
  the LM head only at the positions that predict answer tokens).

The methods take turns on consecutive chunks of 1000 items (``--chunk``), each chunk scored whole
by each method, and the times are summed, so that all three see the same load of a shared machine.
The predicted answers (arg-max per item) are asserted identical and the log-likelihoods equal to
1e-4 + 1e-6 x |value| (``tests/lm_eval_compat.harness_tolerance``: the harness's sums are float32); requests/s and the ratios are printed (goal: batched >= 3x the harness at batch 32).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

CLOCK = time.perf_counter  # --clock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def build_large(tok):
    """A seeded random ``LlamaForCausalLM`` (:func:`audit.tiny_models.build_random`): hidden 512, 4
    layers, 8 heads (2 key/value heads), 32000-row vocabulary (the tiny tokenizer's ids are its first
    rows), 1024 positions."""
    from audit import tiny_models

    return tiny_models.build_random("llama", kv_heads=2, positions=1024)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--language", default="es", help="the registered bbq test's language (default es: EsBBQ)")
    ap.add_argument("--items", type=int, default=0, help="first N items per category and condition (0: all)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--batch-size", type=int, default=None, help="batched: sequences per forward pass")
    ap.add_argument("--model", choices=("tiny", "large"), default="tiny",
                    help="tiny (default): the tiny Llama of audit.tiny_models; large: a seeded random Llama with "
                         "hidden 512, 4 layers, a 32000-row head (compute-bound; use --items)")
    ap.add_argument("--skip-batch-1", action="store_true", help="leave out the harness at batch size 1")
    ap.add_argument("--chunk", type=int, default=1000, help="items per chunk of the interleaved timing (default 1000)")
    ap.add_argument("--vs", metavar="REV", help="also time continuation_loglik of audit/backends/hf_scoring.py "
                    "at this git revision (the baseline of a change), interleaved with the others")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: where the model runs, for every method")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall (default): elapsed time; cpu: this process's CPU time (time.process_time), "
                         "far less sensitive to other processes on a loaded machine (use with --threads 1)")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter

    import torch

    from audit import tiny_models
    from audit.datasets import load_test
    from audit.datasets.bbq import select_items
    from audit.backends.hf_scoring import continuation_loglik, max_sequence_length
    from audit.measure import bbq as mbbq

    try:
        from lm_eval_compat import harness_lm, harness_tolerance, loglikelihood
    except ImportError:
        print("tests/lm_eval_compat.py (the harness's HFLM without accelerate) is not in this checkout",
              file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    kind = "llama" if "llama" in tiny_models.KINDS else "gpt2"
    model, tok = tiny_models.load_tiny(kind)
    if kind == "llama":
        model.config.max_position_embeddings = 1024
        tok.model_max_length = 1024
    if args.model == "large":
        model = build_large(tok)
        kind = "large Llama (random weights)"
    device = torch.device(args.device)
    model.to(device)
    atol, rtol = harness_tolerance(device.type)  # the harness sums in float32
    test = load_test(f"{args.language}/bbq")
    items = select_items(test.table, None, args.items or None)
    prompts = mbbq.item_prompts(items, mbbq.default_prompt(args.language))
    reqs = mbbq.option_requests(prompts, items)
    limit = max_sequence_length(model, tok)
    longest = max(len(tok(p + c)["input_ids"]) for p, c in reqs[:: max(1, len(reqs) // 2000)])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {kind if args.model == 'large' else 'tiny ' + kind} ({n_params / 1e6:.2f}M parameters, vocabulary {len(tok)}, limit {limit} tokens); "
          f"torch threads={torch.get_num_threads()}; device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    print(f"data: {args.language}/bbq ({test.extra.get('format')}), {len(items)} items x 3 = {len(reqs)} requests; "
          f"longest sampled request {longest} tokens")

    methods = {"batched": lambda rq: continuation_loglik(model, tok, rq, batch_size=args.batch_size)[0]}
    if args.vs:
        from benchmarks._at_rev import module_at

        old = module_at(args.vs, "audit/backends/hf_scoring.py", who="bbq.py")
        methods[f"batched at {args.vs}"] = lambda rq: old.continuation_loglik(model, tok, rq, batch_size=args.batch_size)[0]
    for bs in ((32,) if args.skip_batch_1 else (32, 1)):
        lm = harness_lm(model, tok, batch_size=bs)
        methods[f"harness, batch {bs}"] = (lambda lm_: lambda rq: np.array([r[0] for r in loglikelihood(lm_, rq)]))(lm)
    for fn in methods.values():  # warm-up
        fn(reqs[:30])
    # the methods take turns on consecutive chunks of items, so that each sees the same load of a
    # shared machine; each chunk is scored whole by each method (its own sorting and batching)
    step = 3 * max(1, args.chunk)
    times = dict.fromkeys(methods, 0.0)
    lls = {name: [] for name in methods}
    for a in range(0, len(reqs), step):
        chunk = reqs[a: a + step]
        for name, fn in methods.items():
            t0 = CLOCK()
            lls[name].append(fn(chunk))
            times[name] += CLOCK() - t0
    ours = np.concatenate(lls["batched"])
    pred = ours.reshape(-1, 3).argmax(1)
    for name in methods:
        if name == "batched":
            continue
        ll = np.concatenate(lls[name])
        err = float(np.abs(ll - ours).max())
        same = int((ll.reshape(-1, 3).argmax(1) == pred).sum())
        print(f"{name}: max |ll - batched| = {err:.2e}; identical predictions {same}/{len(pred)}")
        assert np.all(np.abs(ll - ours) <= atol + rtol * np.abs(ours)) and same == len(pred), \
            "the harness and the batched scores disagree"
    t_ours = times["batched"]
    rows = list(times.items())
    print(f"{'method':<24}{'time (s)':>10}{'requests/s':>12}")
    for name, t in rows:
        print(f"{name:<24}{t:>10.2f}{len(reqs) / t:>12.0f}")
    t32 = dict(rows)["harness, batch 32"]
    r32 = t32 / t_ours
    print(f"speed-up: {r32:.1f}x vs the harness at batch 32 (goal >= 3x: {'met' if r32 >= 3 else 'NOT met'})"
          + (f", {dict(rows)['harness, batch 1'] / t_ours:.1f}x vs batch 1" if not args.skip_batch_1 else ""))
    if args.vs:
        t_old = dict(rows)[f"batched at {args.vs}"]
        print(f"this tree vs {args.vs}: {t_old / t_ours:.2f}x ({t32 / t_old:.1f}x the harness at batch 32 there)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
