"""Benchmark: the cost of debiasing a language model (fit / train) and of auditing the debiased
model beside the original (issue 21; docs/mitigation.md, "Debiasing language models in a sweep").

Run from the repository root::

    .venv/bin/python benchmarks/lm_debias.py [--models bert,gpt2,minilm,large-bert,large-gpt2]
        [--corpus FILE|tests] [--n-classifiers 80] [--train-steps 20] [--threads 1] [--techniques inlp,...]

Models: the tiny BERT and GPT-2 of ``audit/tiny_models.py`` (hidden 32, 2 layers); with
``minilm``, all-MiniLM-L6-v2 (22.7M parameters, the largest checkpoint available offline here; an
encoder, so only INLP and SentenceDebias apply); ``large-bert`` / ``large-gpt2``: the issue's
44M-parameter size, which no offline checkpoint has, as seeded random ``BertForMaskedLM`` /
``GPT2LMHeadModel`` built from a config (hidden 512, 8 layers, 8 heads, feed-forward 2304, 512
positions, a 32000-row vocabulary as benchmarks/causal.py's ``large``: 44.3M / 44.0M parameters, the
LM head tied to the input embeddings) with the tiny model's tokenizer (its ids are the first rows),
saved to a temporary folder so they load, train and audit like any checkpoint. Random weights cost
what trained ones cost; the bias numbers mean nothing. Corpus: ``jobs/specs/lm-debias-text/corpus-en.txt``
(82 sentences) by default, ``tests`` for the text built from the English shipped tests (first
``--max-lines`` lines). Pairs: the English gender pairs derived from the shipped tests.

Per model and applicable technique:

* ``fit``: INLP = forward passes over the training sentences (``mean_last_hidden``) + the
  ``n_classifiers`` linear SVMs (``inlp_projection``), printed separately; SentenceDebias =
  forward passes over both sides of the counterfactual pairs + one PCA; Self-Debias: nothing;
  CDA / Dropout: ``--train-steps`` steps of further pre-training (batch 8); ``step s``: the whole
  ``INLP.fit`` / ``SentenceDebias.fit`` of the sweep's step, timed apart, to check that it costs
  no more than those forward passes plus the projection fit (the issue's requirement);
* ``audit``: wall time of the metrics the technique changes (SEAT for the projections; LPBS and
  (pseudo-)perplexity for Self-Debias; all three for CDA / Dropout) on the debiased model, and
  ``ratio`` = that time / the same metrics on the original (model already loaded, one process).

Times are wall clock, best of ``--repeats`` (default 1); the load average is printed because the
2-core development machine is shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from audit import runner, tiny_models  # noqa: E402
from audit.datasets import corpus_from_tests  # noqa: E402
from audit.lm_mitigation import TECHNIQUES  # noqa: E402
from audit.lm_mitigation.inlp import (  # noqa: E402
    gender_sentences,
    inlp_projection,
    labels_for,
    mean_last_hidden,
    split_dataset,
)
from audit.lm_mitigation.models import ProjectedModel, SelfDebiasedModel  # noqa: E402
from audit.lm_mitigation.pairs import derive_pairs  # noqa: E402
from audit.lm_mitigation.sentence_debias import bias_direction, counterfactual_pairs, mean_pooled  # noqa: E402
from audit.lm_mitigation.steps import INLP, SelfDebias, SentenceDebias  # noqa: E402
from jobs.lm_builders import build_lm_debiased  # noqa: E402

HELD_OUT = ROOT / "jobs" / "specs" / "lm-debias-text" / "en.yaml"
TEST = "en/gender_career"


#: The 44M-parameter configurations (``--models large-bert,large-gpt2``; module docstring).
LARGE = {"hidden": 512, "layers": 8, "heads": 8, "ffn": 2304, "positions": 512, "vocab": 32000}


def build_large(kind: str, out: Path) -> str:
    """A seeded random BERT (``kind="bert"``) or GPT-2 (``"gpt2"``) of :data:`LARGE`'s size with the
    tiny model's tokenizer (:func:`audit.tiny_models.build_random`), saved to ``out``; returns its path."""
    return str(tiny_models.build_random(kind, hidden=LARGE["hidden"], layers=LARGE["layers"], heads=LARGE["heads"],
                                        ffn=LARGE["ffn"], vocab=LARGE["vocab"], positions=LARGE["positions"], out=out))


def _best(fn, repeats):
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _audit(model, metrics):
    for m in metrics:
        test = str(HELD_OUT) if m == "perplexity" else TEST
        params = {"permutations": 200} if m == "seat" else {}
        runner.score(model, test, m, params)


def _metrics(technique, kind):
    fams = TECHNIQUES[technique].families
    by_family = {"sentences": "seat", "lpbs": "lpbs", "perplexity": "perplexity"}
    return [m for f, m in by_family.items() if f in fams and not (m != "seat" and kind == "encoder")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert,gpt2")
    ap.add_argument("--corpus", default=str(ROOT / "jobs" / "specs" / "lm-debias-text" / "corpus-en.txt"))
    ap.add_argument("--max-lines", type=int, default=2000)
    ap.add_argument("--n-classifiers", type=int, default=80)
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--techniques", default=",".join(TECHNIQUES), help="comma-separated subset of the techniques")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    lines = (corpus_from_tests(["en"], seed=0)["en"][: a.max_lines] if a.corpus == "tests"
             else [s for s in Path(a.corpus).read_text(encoding="utf-8").splitlines() if s.strip()])
    pairs = derive_pairs("en")
    print(f"load average {os.getloadavg()[0]:.1f}; corpus {len(lines)} sentences; pairs en/gender ({len(pairs.pairs)})")
    print(f"{'model':10} {'technique':16} {'fit s':>8} {'(forward':>9} {'+ fit)':>7} {'step s':>7} {'audit s':>8} "
          f"{'orig s':>7} "
          f"{'ratio':>6}")
    scratch = tempfile.TemporaryDirectory()
    for name in a.models.split(","):
        if name.startswith("large-"):
            t0 = time.perf_counter()
            path = build_large(name.split("-", 1)[1], Path(scratch.name) / name)
            print(f"# {name}: built in {time.perf_counter() - t0:.1f} s")
        else:
            path = runner.resolve_packaged("minilm") if name == "minilm" else str(tiny_models.tiny_model_dir(name))
        loaded = runner.load_model(path)
        h, kind = loaded.handle, loaded.kind
        n_params = sum(p.numel() for p in h.model.parameters())
        print(f"# {name}: {kind}, {n_params / 1e6:.2f}M parameters; load average {os.getloadavg()[0]:.1f}")
        for tech in TECHNIQUES:
            if kind not in TECHNIQUES[tech].kinds or tech not in a.techniques.split(","):
                continue
            metrics = _metrics(tech, kind)
            fwd = fit_only = t_step = None
            if tech == "inlp":
                def forward():
                    data = gender_sentences(lines, pairs.pairs, n_sentences=10000, seed=0)
                    import numpy as np

                    X = np.concatenate([mean_last_hidden(h.model, h.tokenizer, data[k])
                                        for k in ("male", "female", "neutral")])
                    return X, labels_for([len(data[k]) for k in ("male", "female", "neutral")], gender=True)
                fwd, (X, y) = _best(forward, a.repeats)
                Xtr, Xdev, _, ytr, ydev, _ = split_dataset(X, y, seed=0)
                fit_only, _ = _best(lambda: inlp_projection(Xtr, ytr, Xdev, ydev, n_classifiers=a.n_classifiers),
                                    a.repeats)
                t0 = time.perf_counter()
                step = INLP(n_classifiers=a.n_classifiers).fit(h.model, h.tokenizer, lines, pairs)
                t_step = time.perf_counter() - t0
                variant = runner.LoadedModel(ref=name, kind=kind, backend=loaded.backend, revision="x",
                                             handle=ProjectedModel(h, step))
            elif tech == "sentence_debias":
                ex = counterfactual_pairs(lines, pairs)
                fwd, (s0, s1) = _best(lambda: (mean_pooled(h.model, h.tokenizer, [e[1] for e in ex]),
                                               mean_pooled(h.model, h.tokenizer, [e[0] for e in ex])), a.repeats)
                fit_only, _ = _best(lambda: bias_direction(s0, s1, n_components=1), a.repeats)
                t0 = time.perf_counter()
                step = SentenceDebias().fit(h.model, h.tokenizer, lines, pairs)
                t_step = time.perf_counter() - t0
                variant = runner.LoadedModel(ref=name, kind=kind, backend=loaded.backend, revision="x",
                                             handle=ProjectedModel(h, step))
            elif tech == "self_debias":
                step = SelfDebias()
                step.provenance_ = {"technique": tech}
                fit_only = fwd = 0.0
                variant = runner.LoadedModel(ref=name, kind=kind, backend=loaded.backend, revision="x",
                                             handle=SelfDebiasedModel(h, step))
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    corpus = Path(tmp) / "corpus.txt"
                    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
                    t0 = time.perf_counter()
                    out = build_lm_debiased(tmp, f"{name}+{tech}", path, kind=kind, technique=tech, corpus=corpus,
                                            params={"steps": a.train_steps, "batch_size": 8})
                    fit_only = time.perf_counter() - t0
                    variant = runner.load_model(str(out))
                    t_audit, _ = _best(lambda: _audit(variant, metrics), a.repeats)
            if tech not in ("cda", "dropout"):
                t_audit, _ = _best(lambda: _audit(variant, metrics), a.repeats)
            t_orig, _ = _best(lambda: _audit(loaded, metrics), a.repeats)
            total = (fwd or 0.0) + fit_only
            split = f"{fwd:9.2f} {fit_only:7.2f} {t_step:7.2f}" if fwd else f"{'':9} {'':7} {'':7}"
            print(f"{name:10} {tech:16} {total:8.2f} {split} {t_audit:8.2f} {t_orig:7.2f} {t_audit / t_orig:6.2f}"
                  f"   ({', '.join(metrics)})", flush=True)
    scratch.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
