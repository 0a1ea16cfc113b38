"""Self-Debias: decoding-time rescaling of next-token probabilities with self-diagnosis prompts.

Reference: Schick, Udupa & Schütze (2021), "Self-Diagnosis and Self-Debiasing", TACL 9:1408-1424
(code timoschick/self-debiasing); implementation as bias-bench (McGill-NLP/bias-bench at 291426a,
``bias_bench/debias/self_debias/generation.py`` ``SelfDebiasingLogitsProcessor``,
``modeling.py`` ``GPT2Wrapper.compute_loss_self_debiasing`` and
``MaskedLMWrapper.get_token_logits_self_debiasing``; prompts from
``bias_bench/benchmark/crows/crows.py`` ``DEBIASING_PREFIXES``).

Formula (paper eq. 4-5, bias-bench's processor): with ``p`` the model's next-token distribution on
the input and ``p_i`` its distribution on the input preceded by self-diagnosis prompt ``i``,
``delta(w) = max(0, max_i p_i(w) - p(w))``, ``alpha(w) = max(exp(-lambda delta(w)), epsilon)``,
``p~(w) = alpha(w) p(w) / sum_v alpha(v) p(v)``; returned as ``log p~`` (natural log, float32 as
the model computes it). Defaults ``lambda = 50`` (``decay_constant``), ``epsilon = 0.01``.

Causal LMs (:func:`causal_logprobs`): position ``t`` holds ``log p~(. | ids[:t+1])``; the biased
distributions come from ``prompt + ids`` (the prompt tokenised alone, without special tokens).
bias-bench runs all inputs in one left-padded batch with explicit position ids; here each input
is run unpadded, which gives the same numbers up to float32 rounding (tested to 1e-5).
Masked LMs (:func:`masked_logprobs`): the distribution at the single ``[MASK]`` of ``ids`` (which
start with the CLS token); the biased inputs are ``tokenise(CLS + " " + prompt)`` (no special
tokens added) followed by ``ids[1:]``, as bias-bench; BERT-style position ids restart at 0 after
the prompt in bias-bench only for padded rows, so unpadded runs agree.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from audit.errors import ParameterError

__all__ = ["DEBIASING_PREFIXES", "rescale", "causal_logprobs", "masked_logprobs"]

#: bias-bench's self-diagnosis prompts for CrowS-Pairs, by bias type (English).
DEBIASING_PREFIXES = {
    "race-color": "The following text discriminates against people because of their race/color: ",
    "gender": "The following text discriminates against people because of their gender: ",
    "socioeconomic": "The following text discriminates against people because of their socioeconomic "
                     "status/occupation: ",
    "sexual-orientation": "The following text discriminates against people because of their sexual orientiation: ",
    "religion": "The following text discriminates against people because of their religion: ",
    "age": "The following text discriminates against people because of their age: ",
    "nationality": "The following text discriminates against people because of their nationality: ",
    "disability": "The following text discriminates against people because of their disability: ",
    "physical-appearance": "The following text discriminates against people because of their physical appearance: ",
}


def _check(decay_constant: float, epsilon: float) -> None:
    if not (isinstance(decay_constant, (int, float)) and np.isfinite(decay_constant) and decay_constant >= 0):
        raise ParameterError(f"decay_constant must be a finite number >= 0, got {decay_constant!r}")
    if not (isinstance(epsilon, (int, float)) and 0 < epsilon <= 1):
        raise ParameterError(f"epsilon must be in (0, 1], got {epsilon!r}")


def rescale(logits: Any, biased_logits: Sequence[Any], *, decay_constant: float = 50, epsilon: float = 0.01):
    """``log p~`` from the regular logits (``(..., V)`` torch tensor) and the logits under each
    prompt (same shape); see the module docstring."""
    import torch

    _check(decay_constant, epsilon)
    if not biased_logits:
        raise ParameterError("Self-Debias needs at least one self-diagnosis prompt")
    p = logits.softmax(dim=-1)
    pb = biased_logits[0].softmax(dim=-1)
    for b in biased_logits[1:]:
        pb = torch.max(pb, b.softmax(dim=-1))
    delta = torch.clamp(pb - p, min=0.0)
    alpha = torch.clamp(torch.exp(-delta * decay_constant), min=epsilon)
    q = p * alpha
    return torch.log(q / q.sum(dim=-1, keepdim=True))


def causal_logprobs(model: Any, tokenizer: Any, input_ids: Sequence[int], prefixes: Sequence[str], *,
                    decay_constant: float = 50, epsilon: float = 0.01):
    """Self-debiased next-token log-probabilities ``(len(ids), V)`` of a causal LM (module docstring)."""
    import torch

    ids = torch.as_tensor(list(input_ids), dtype=torch.long).unsqueeze(0)
    n = ids.shape[1]
    with torch.no_grad():
        regular = model(input_ids=ids)["logits"][0]
        biased = []
        for pr in prefixes:
            pid = torch.as_tensor(tokenizer(pr, add_special_tokens=False)["input_ids"], dtype=torch.long)
            full = torch.cat([pid, ids[0]]).unsqueeze(0)
            biased.append(model(input_ids=full)["logits"][0, -n:])
        return rescale(regular, biased, decay_constant=decay_constant, epsilon=epsilon)


def masked_logprobs(model: Any, tokenizer: Any, input_ids: Sequence[int], prefixes: Sequence[str], *,
                    decay_constant: float = 50, epsilon: float = 0.01):
    """Self-debiased log-probabilities ``(V,)`` at the single mask of ``input_ids`` (module docstring)."""
    import torch

    ids = torch.as_tensor(list(input_ids), dtype=torch.long)
    pos = (ids == tokenizer.mask_token_id).nonzero().flatten()
    if len(pos) != 1:
        raise ParameterError(f"Self-Debias (masked LM): the input must contain exactly one mask token, got {len(pos)}")
    with torch.no_grad():
        regular = model(input_ids=ids.unsqueeze(0))["logits"][0, int(pos)]
        biased = []
        for pr in prefixes:
            pid = torch.as_tensor(tokenizer(f"{tokenizer.cls_token} {pr}", add_special_tokens=False)["input_ids"],
                                  dtype=torch.long)
            full = torch.cat([pid, ids[1:]]).unsqueeze(0)
            biased.append(model(input_ids=full)["logits"][0, len(pid) + int(pos) - 1])
        return rescale(regular, biased, decay_constant=decay_constant, epsilon=epsilon)
