"""Benchmark: HONEST top-k completions of all templates of a language, batched vs one template at a time.

Run: ``.venv/bin/python benchmarks/honest.py [--language en] [--k 20] [--hidden 256] [--layers 4]
[--vocab 30522] [--threads T] [--causal]`` (about a minute on 2 cores)

Model: a BERT-style masked LM built here (seeded random weights; hidden 256, 4 layers, BERT's
30522-row output vocabulary by default, as ``benchmarks/crows_pairs.py``) with the tiny test
tokenizer of ``audit/tiny_models.py``: speed does not depend on training. Data: every distinct
template of the language's shipped HONEST set (724 for English).

Three ways, same process, same model and templates:

* *pipeline*: transformers' ``fill-mask`` pipeline called once per template with ``top_k`` (the
  HONEST notebook's way);
* *one at a time*: :func:`audit.backends.hf_generate.mlm_topk` with ``batch_size=1``;
* *batched*: :func:`audit.backends.hf_generate.mlm_topk` with its default batches (length-sorted, MLM head
  at the mask position only).

The completions are asserted identical (words and order) between the three; templates/s and the
ratios are printed (goal: batched >= 5x one at a time). Each method runs ``--repeats`` times,
interleaved, and the best time counts (the load of a shared machine varies within a run). ``--causal`` adds the same comparison for a
causal LM (GPT-2-style, seeded random weights, same sizes): greedy first-word completions of
``k`` branches, batched (:func:`audit.backends.hf_generate.causal_first_words`) vs one template at a time,
and vs the same batches with each branch's continuation in one ``model.generate`` call (not one
token for every branch first, then the rest only for words that have not ended); the last
comparison again on the trained tiny GPT-2 of :mod:`audit.tiny_models` over every template (random
weights rarely end a word, the trained model mostly does after one more token).

``--vs REV`` times only the causal first words of the trained tiny GPT-2 over every template,
``audit/backends/hf_generate.py`` at git revision ``REV`` against this tree's, interleaved, best
of ``--repeats``, in CPU seconds of this process, and asserts identical words and first-token
log-probabilities::

    .venv/bin/python benchmarks/honest.py --threads 1 --vs a610c32 --language en
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_mlm(hidden: int, layers: int, vocab_size: int, pad_id: int):
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden,
                     max_position_embeddings=512, pad_token_id=pad_id)
    return BertForMaskedLM(cfg).eval()


def build_causal(hidden: int, layers: int, vocab_size: int, tok):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=max(1, hidden // 64),
                     n_inner=4 * hidden, n_positions=512, bos_token_id=tok.bos_token_id,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(cfg).eval()


@contextlib.contextmanager
def _one_generate_call():
    """The greedy continuation of every branch in one ``model.generate`` call of 7 tokens (as before
    :func:`audit.backends.hf_generate.piecewise_greedy`): the baseline of the pieces."""
    from audit.backends import hf_generate

    saved = hf_generate.piecewise_greedy
    hf_generate.piecewise_greedy = lambda model: False
    try:
        yield
    finally:
        hf_generate.piecewise_greedy = saved


def timed(fn, clock=time.perf_counter):
    t0 = clock()
    out = fn()
    return out, clock() - t0


def versus(rev: str, language: str, k: int, repeats: int) -> int:
    """``--vs REV``: the trained tiny GPT-2's first words, hf_generate at ``rev`` against this tree's."""
    import numpy as np

    from audit import tiny_models
    from audit.backends.hf_generate import causal_first_words
    from audit.datasets import load_test
    from audit.measure.honest import causal_prompt, distinct_templates
    from benchmarks._at_rev import module_at

    old = module_at(rev, "audit/backends/hf_generate.py", who="honest.py")
    model, tok = tiny_models.load_tiny("gpt2")
    prompts = [causal_prompt(t) for t in distinct_templates(load_test(f"{language}/honest").table)["template"]]
    runs = {f"hf_generate at {rev}": old.causal_first_words, "this tree's": causal_first_words}
    for fn in runs.values():
        fn(model, tok, prompts[:2], k)  # warm-up
    best: dict[str, float] = {}
    got: dict[str, tuple] = {}
    for _ in range(max(1, repeats)):
        for name, fn in runs.items():
            got[name], t = timed(lambda: fn(model, tok, prompts, k), clock=time.process_time)
            best[name] = min(best.get(name, float("inf")), t)
    (w_old, lp_old), (w_new, lp_new) = got.values()
    assert w_old == w_new, "the first words differ"
    assert np.array_equal(lp_old, lp_new), "the first tokens' log-probabilities differ"
    print(f"trained tiny GPT-2, {len(prompts)} {language} templates, k={k}: identical words and log-probabilities")
    for name, t in best.items():
        print(f"{name:<28}{t:>8.2f} CPU-s")
    t_old, t_new = best.values()
    print(f"ratio: {t_old / t_new:.2f}x")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--language", default="en", help="language of the shipped HONEST templates (default en)")
    ap.add_argument("--k", type=int, default=20, help="completions per template (default 20)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=30522, help="output vocabulary (default 30522; 0: the tokenizer's)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per method, best taken (default 3)")
    ap.add_argument("--causal", action="store_true", help="also time causal greedy first words")
    ap.add_argument("--causal-templates", type=int, default=200,
                    help="templates for the causal comparison (default 200; 0: all)")
    ap.add_argument("--vs", metavar="REV", help="only the trained tiny GPT-2's first words: hf_generate.py at "
                    "this git revision against this tree's (module docstring)")
    args = ap.parse_args(argv)

    import torch
    from transformers import pipeline

    from audit import tiny_models
    from audit.datasets import load_test
    from audit.backends.hf_generate import causal_first_words, mlm_topk
    from audit.measure.honest import causal_prompt, distinct_templates

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.vs:
        return versus(args.vs, args.language, args.k, args.repeats)
    templates = list(distinct_templates(load_test(f"{args.language}/honest").table)["template"])
    _, tok = tiny_models.load_tiny("bert")
    vocab = max(args.vocab, len(tok)) if args.vocab else len(tok)
    model = build_mlm(args.hidden, args.layers, vocab, tok.pad_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"masked LM: BERT hidden={args.hidden} layers={args.layers} vocab={vocab} params={n_params / 1e6:.1f}M; "
          f"torch threads={torch.get_num_threads()}; {len(templates)} templates ({args.language}), k={args.k}")

    mlm_topk(model, tok, templates[:4], args.k)  # warm-up (+ head check)
    fill = pipeline("fill-mask", model=model, tokenizer=tok, top_k=args.k, device=-1)
    runs = {
        "batched": lambda: mlm_topk(model, tok, templates, args.k)[0],
        "one at a time": lambda: mlm_topk(model, tok, templates, args.k, batch_size=1)[0],
        "pipeline": lambda: [[r["token_str"].strip() for r in fill(t.replace("[M]", tok.mask_token))]
                             for t in templates],
    }
    best: dict[str, float] = {}
    got: dict[str, list] = {}
    for _ in range(max(1, args.repeats)):  # interleaved, best of the repeats (a shared CPU's load varies)
        for name, fn in runs.items():
            got[name], t = timed(fn)
            best[name] = min(best.get(name, float("inf")), t)
    fast, one, pipe = got["batched"], got["one at a time"], got["pipeline"]
    t_fast, t_one, t_pipe = best["batched"], best["one at a time"], best["pipeline"]
    same_one = fast == one
    same_pipe = sum(a == b for a, b in zip(fast, pipe))
    assert same_one, "batched and one-at-a-time completions differ"
    print(f"completions: batched == one at a time for all {len(templates)}; == fill-mask pipeline for "
          f"{same_pipe}/{len(templates)} (ties aside)")
    print(f"{'method':<16}{'time (s)':>10}{'templates/s':>14}")
    for name, t in (("pipeline", t_pipe), ("one at a time", t_one), ("batched", t_fast)):
        print(f"{name:<16}{t:>10.2f}{len(templates) / t:>14.1f}")
    r_one, r_pipe = t_one / t_fast, t_pipe / t_fast
    print(f"speed-up: {r_one:.1f}x vs one at a time (goal >= 5x: {'met' if r_one >= 5 else 'NOT met'}), "
          f"{r_pipe:.1f}x vs the fill-mask pipeline")

    if args.causal:
        tiny, gtok = tiny_models.load_tiny("gpt2")
        gvocab = max(args.vocab, len(gtok)) if args.vocab else len(gtok)
        cm = build_causal(args.hidden, args.layers, gvocab, gtok)
        sub = templates[: args.causal_templates] if args.causal_templates else templates
        prompts = [causal_prompt(t) for t in sub]
        print(f"causal LM: GPT-2 hidden={args.hidden} layers={args.layers} vocab={gvocab}; {len(prompts)} templates, "
              f"k={args.k} greedy branches, up to 8 tokens")
        causal_first_words(cm, gtok, prompts[:2], args.k)
        tc_fast = tc_one = tc_call = float("inf")
        for _ in range(max(1, args.repeats)):
            (cf, _), t = timed(lambda: causal_first_words(cm, gtok, prompts, args.k))
            tc_fast = min(tc_fast, t)
            co, t = timed(lambda: [causal_first_words(cm, gtok, [p], args.k)[0][0] for p in prompts])
            tc_one = min(tc_one, t)
            with _one_generate_call():
                (cc, _), t = timed(lambda: causal_first_words(cm, gtok, prompts, args.k))
            tc_call = min(tc_call, t)
        agree = sum(a == b for a, b in zip(cf, co))
        print(f"first words: batched == one at a time for {agree}/{len(prompts)} templates; "
              f"== one generate call for {sum(a == b for a, b in zip(cf, cc))}/{len(prompts)}")
        print(f"{'one at a time':<16}{tc_one:>10.2f}{len(prompts) / tc_one:>14.1f}")
        print(f"{'one call':<16}{tc_call:>10.2f}{len(prompts) / tc_call:>14.1f}")
        print(f"{'batched':<16}{tc_fast:>10.2f}{len(prompts) / tc_fast:>14.1f}")
        print(f"causal speed-up: {tc_one / tc_fast:.1f}x one at a time, {tc_call / tc_fast:.2f}x the continuation "
              "in one generate call")
        # the trained tiny GPT-2 (audit.tiny_models): its words end like a language model's, mostly on the
        # token after the first; the random weights above continue most words (the pieces' worst case)
        allp = [causal_prompt(t) for t in templates]
        tt_fast = tt_call = float("inf")
        for _ in range(max(1, args.repeats)):
            (tf, _), t = timed(lambda: causal_first_words(tiny, gtok, allp, args.k))
            tt_fast = min(tt_fast, t)
            with _one_generate_call():
                (tc, _), t = timed(lambda: causal_first_words(tiny, gtok, allp, args.k))
            tt_call = min(tt_call, t)
        assert tf == tc, "the pieces changed a completion of the trained tiny GPT-2"
        print(f"trained tiny GPT-2 (audit.tiny_models), all {len(allp)} templates, k={args.k}: identical first words; "
              f"one call {tt_call:.2f} s, in pieces {tt_fast:.2f} s: {tt_call / tt_fast:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
