"""Further pre-training for CDA and Dropout debiasing (a small, seeded training loop).

References: Webster et al. (2020), arXiv:2010.06032 (Dropout: increased dropout during further
pre-training; CDA: further pre-training on two-sided counterfactual data); bias-bench
(McGill-NLP/bias-bench at 291426a, ``experiments/run_mlm.py`` / ``run_clm.py``, 2000 steps, batch
32 x 16 accumulation, sequences of 512 tokens of Wikipedia; MLM masking probability 0.15).

Dropout settings (bias-bench's ``--dropout_debias``): BERT and RoBERTa ``hidden_dropout_prob =
0.20``, ``attention_probs_dropout_prob = 0.15``; other masked LMs (ALBERT, DistilBERT's ``dropout``
/ ``attention_dropout``) 0.05 / 0.05; GPT-2 ``resid_pdrop = embd_pdrop = attn_pdrop = 0.15``.
Causal families bias-bench does not cover (Llama, Qwen2, Mistral) have only ``attention_dropout``:
it is set to 0.15 (an extension, stated in the returned changes).

The loop (:func:`further_pretrain`): the corpus lines are shuffled once per pass with the seed,
cut into batches of ``batch_size`` lines, each line truncated to ``max_length`` tokens and the
batch padded (transformers' ``DataCollatorForLanguageModeling``: 15 % masking for masked LMs,
next-token labels for causal LMs); AdamW (``lr``, no schedule); ``steps`` optimiser steps; all
random draws (shuffle, masking, dropout) from the seed, the caller's global RNG state untouched.
Documented difference: bias-bench concatenates the corpus and trains on 512-token chunks; here
each line is one sequence (the corpus is one sentence per line).
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from audit.errors import ParameterError
from audit.schema import Int, Num, Section, arguments

__all__ = ["DROPOUT", "TrainParams", "set_dropout", "further_pretrain"]


class TrainParams(Section):
    """The parameters of further pre-training (:func:`further_pretrain`; the ``params`` of the
    ``cda`` and ``dropout`` steps of a sweep spec), declared once: optimiser steps, sentences per
    batch, AdamW learning rate, tokens per sentence, seed of the batch order and masking."""

    steps: Int(1) = 100
    batch_size: Int(1) = 8
    lr: Num(0.0, strict=True) = 5e-5
    max_length: Int(1) = 128
    seed: Int(0) = 0

#: model_type -> config attribute -> bias-bench's debiasing dropout.
DROPOUT: dict[str, dict[str, float]] = {
    "bert": {"hidden_dropout_prob": 0.20, "attention_probs_dropout_prob": 0.15},
    "roberta": {"hidden_dropout_prob": 0.20, "attention_probs_dropout_prob": 0.15},
    "albert": {"hidden_dropout_prob": 0.05, "attention_probs_dropout_prob": 0.05},
    "distilbert": {"dropout": 0.05, "attention_dropout": 0.05},
    "gpt2": {"resid_pdrop": 0.15, "embd_pdrop": 0.15, "attn_pdrop": 0.15},
}
_CAUSAL_EXTENSION = {"attention_dropout": 0.15}


def set_dropout(config: Any) -> dict[str, float]:
    """Set the debiasing dropout on a model ``config`` (module docstring); returns the changes.
    A config with none of the known dropout attributes is refused (:class:`ParameterError`)."""
    values = DROPOUT.get(getattr(config, "model_type", ""))
    if values is None:
        values = {k: v for k, v in _CAUSAL_EXTENSION.items() if hasattr(config, k)}
    if not values:
        raise ParameterError(f"dropout debiasing: no known dropout setting for model type "
                             f"{getattr(config, 'model_type', '?')!r}")
    for k, v in values.items():
        setattr(config, k, v)
    return dict(values)


def further_pretrain(model: Any, tokenizer: Any, sentences: Sequence[str], *, kind: str, steps: int = 100,
                     batch_size: int = 8, lr: float = 5e-5, max_length: int = 128, mlm_probability: float = 0.15,
                     seed: int = 0) -> list[float]:
    """Train ``model`` in place on ``sentences`` (module docstring); returns the loss of each step.
    The model is left in eval mode."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    if kind not in ("mlm", "causal"):
        raise ParameterError(f"further pre-training needs a masked or causal LM, got kind={kind!r}")
    p = arguments(TrainParams, {"steps": steps, "batch_size": batch_size, "lr": lr, "max_length": max_length,
                                "seed": seed}, "further pre-training")
    steps, batch_size, lr, max_length, seed = p["steps"], p["batch_size"], p["lr"], p["max_length"], p["seed"]
    lines = [s for s in sentences if s.strip()]
    if not lines:
        raise ParameterError("further pre-training: the corpus has no non-empty line")
    if kind == "causal" and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    collate = DataCollatorForLanguageModeling(tokenizer, mlm=kind == "mlm", mlm_probability=mlm_probability)
    rng = random.Random(seed)
    losses: list[float] = []
    devices = [model.device] if getattr(model, "device", None) is not None and model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        model.train()
        order: list[str] = []
        try:
            while len(losses) < steps:
                if len(order) < batch_size:
                    more = lines[:]
                    rng.shuffle(more)
                    order += more
                batch, order = order[:batch_size], order[batch_size:]
                enc = [tokenizer(s, truncation=True, max_length=max_length) for s in batch]
                feats = collate([{k: v for k, v in e.items() if k in ("input_ids", "attention_mask")}
                                 for e in enc])
                feats = {k: v.to(model.device) for k, v in feats.items()}
                loss = model(**feats).loss
                if not torch.isfinite(loss):
                    raise ParameterError(f"further pre-training: non-finite loss at step {len(losses)} (lower lr)")
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
        finally:
            model.eval()
    return losses
