"""Benchmark: batched CrowS-Pairs masked-LM scoring vs the original one-pass-per-mask loop.

Run: ``.venv/bin/python benchmarks/crows_pairs.py [--pairs N] [--batch-size B] [--hidden H]
[--layers L] [--threads T] [--device cpu|cuda] [--dtype float32|bfloat16] [--tokenizer DIR]
[--loop-pairs N]`` (defaults: 40 pairs, torch's default threads, CPU, float32; about two minutes on
2 cores). ``--pairs 0``: all 1508 pairs. ``--loop-pairs N``: the loop scores only the first N pairs
(compared on those; its time for all pairs is projected from them), for sizes where the loop would
take many minutes. ``--tokenizer``: a tokenizer folder instead of the tiny one, e.g. the BERT
uncased WordPiece vocabulary shipped with all-MiniLM-L6-v2, so that sentences split into as many
tokens as with BERT-base. ``--dtype bfloat16``: the scores are then compared with the float32
loop's only in the printout (bfloat16 sums move by tenths of a nat); float32 is asserted to 1e-4.

Model: a BERT-style masked LM built here (seeded random weights; hidden 256, 4 layers, 4 heads,
intermediate 1024 by default) with the tiny test tokenizer of ``audit/tiny_models.py`` -- speed
does not depend on training. Its output vocabulary has 30522 rows by default (``--vocab``), the
size of BERT's, so that the MLM head costs what it costs in real models (the tiny tokenizer only
produces its first 700 ids; the other rows are like BERT's ``[unused]`` tokens). ``--vocab 0``
uses the tokenizer's 700 (a head so small that only batching matters). Data: the first N real CrowS-Pairs pairs from
``../shared/data/crows-pairs/crows_pairs_anonymized.csv``.

Both implementations run in the same process on the same model and pairs:

* *loop*: nyu-mll/crows-pairs ``mask_unigram`` -- for every unmodified non-special token of each
  sentence, one full forward pass (batch of 1) of the whole ``BertForMaskedLM`` and a
  ``log_softmax`` over the vocabulary at the masked position;
* *batched*: :func:`audit.backends.hf_scoring.crows_pairs_pll` -- all masked copies in length-sorted
  batches, MLM head only at the masked positions.

The scores are asserted equal within 1e-4 per sentence; pairs/s, the ratio and a projection to
the 1508 pairs of the full data set are printed.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from audit.datasets.external import data_root  # noqa: E402

DATA = data_root() / "crows-pairs" / "crows_pairs_anonymized.csv"  # $BIASAUDIT_DATA, else ../shared/data
FULL = 1508


def build_model(hidden: int, layers: int, vocab_size: int, pad_id: int):
    """Seeded random ``BertForMaskedLM`` (heads of 64 dims, intermediate 4 x hidden)."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                     max_position_embeddings=512, pad_token_id=pad_id)
    model = BertForMaskedLM(cfg)
    model.eval()
    return model


def loop_scores(model, tok, pairs) -> np.ndarray:
    """The original: one full forward pass per masked token (batch of 1)."""
    import torch

    from audit.backends.hf_scoring import crows_pairs_template

    out = np.zeros((len(pairs), 2))
    with torch.inference_mode():
        for i, (s1, s2) in enumerate(pairs):
            e1 = tok(s1, return_special_tokens_mask=True)
            e2 = tok(s2, return_special_tokens_mask=True)
            ids1 = torch.tensor([e1["input_ids"]], device=model.device)
            ids2 = torch.tensor([e2["input_ids"]], device=model.device)
            t1, t2 = crows_pairs_template(e1["input_ids"], e2["input_ids"])
            for a, b in zip(t1, t2):
                if e1["special_tokens_mask"][a] or e2["special_tokens_mask"][b]:
                    continue
                for side, ids, p in ((0, ids1, a), (1, ids2, b)):
                    m = ids.clone()
                    m[0, p] = tok.mask_token_id
                    logits = model(input_ids=m).logits[0, p]
                    out[i, side] += torch.log_softmax(logits, -1)[ids[0, p]].item()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40, help="CrowS-Pairs pairs to score (default 40)")
    ap.add_argument("--batch-size", type=int, default=None, help="batched: sequences per forward pass")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=30522,
                    help="output vocabulary size (default 30522 as BERT; 0: the tokenizer's)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: the tiny BERT's)")
    ap.add_argument("--loop-pairs", type=int, default=0, help="pairs the loop scores (default 0: all)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads for both methods (default 0: torch's default; use 1 on "
                         "a loaded shared CPU, where more threads spin-wait and distort both timings)")
    args = ap.parse_args(argv)

    import torch

    from audit import tiny_models
    from audit.backends.hf_scoring import crows_pairs_pll
    from audit.datasets.crows_pairs import load_crows_pairs

    if args.threads:
        torch.set_num_threads(args.threads)
    if not DATA.is_file():
        print(f"CrowS-Pairs data not found at {DATA}", file=sys.stderr)
        return 2
    df = load_crows_pairs(DATA, limit=args.pairs or None)
    pairs = [(r.sent_more, r.sent_less) if r.stereo_antistereo == "stereo" else (r.sent_less, r.sent_more)
             for r in df.itertuples()]
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        _, tok = tiny_models.load_tiny("bert")
    vocab = max(args.vocab, len(tok)) if args.vocab else len(tok)
    device = torch.device(args.device)
    model = build_model(args.hidden, args.layers, vocab, tok.pad_token_id).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: BERT MLM hidden={args.hidden} layers={args.layers} vocab={vocab} "
          f"params={n_params / 1e6:.1f}M; torch threads={torch.get_num_threads()}; pairs={len(pairs)}; "
          f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f"; batched in {args.dtype}")

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    low = model if args.dtype == "float32" else copy.deepcopy(model).to(getattr(torch, args.dtype))
    crows_pairs_pll(low, tok, pairs[:2], batch_size=args.batch_size)  # warm-up (+ head check)
    sync()
    t0 = time.perf_counter()
    fast = crows_pairs_pll(low, tok, pairs, batch_size=args.batch_size)
    sync()
    t_fast = time.perf_counter() - t0
    n_loop = min(args.loop_pairs or len(pairs), len(pairs))
    t0 = time.perf_counter()
    slow = loop_scores(model, tok, pairs[:n_loop])
    sync()
    t_slow = (time.perf_counter() - t0) * len(pairs) / n_loop

    err = float(np.abs(fast[:n_loop, :2] - slow).max())
    n_masked = int(fast[:, 2].sum() * 2)
    if args.dtype == "float32":
        assert err <= 1e-4, f"batched and loop scores differ by {err}"
    rate_fast, rate_slow = len(pairs) / t_fast, len(pairs) / t_slow
    print(f"masked copies scored: {n_masked}; max |batched - loop| over the loop's {n_loop} pairs = {err:.2e} "
          + ("(<= 1e-4: OK)" if args.dtype == "float32" else f"({args.dtype} against the float32 loop)")
          + ("" if n_loop == len(pairs) else f"; the loop's time for {len(pairs)} pairs projected from {n_loop}"))
    print(f"{'method':<10}{'time (s)':>10}{'pairs/s':>10}{'1508 pairs (projected)':>26}")
    print(f"{'loop':<10}{t_slow:>10.2f}{rate_slow:>10.1f}{FULL / rate_slow:>24.1f} s")
    print(f"{'batched':<10}{t_fast:>10.2f}{rate_fast:>10.1f}{FULL / rate_fast:>24.1f} s")
    ratio = t_slow / t_fast
    print(f"speed-up: {ratio:.1f}x (goal >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
