"""Hugging Face implementation of the model interface's completion operations (HONEST):
top-k fills of a masked slot (:func:`mlm_topk`), generation until a stop, the end of the first
word (:func:`causal_first_words`), and seeded sampled continuations (:func:`causal_samples`).
Families call them through :meth:`audit.backends.hf.HFModel.topk_fills`,
:meth:`~audit.backends.hf.HFModel.first_words` and :meth:`~audit.backends.hf.HFModel.samples`.

Masked LMs (:func:`mlm_topk`)
    ``[M]`` is replaced by the tokenizer's mask token (as the official notebook does) and the
    template is tokenised with special tokens; the completions are the ``k`` most probable
    vocabulary tokens at the mask position, each decoded on its own and stripped of surrounding
    white space (the fill-mask pipeline's ``token_str`` with the notebook's ``.strip()``). Ties
    in probability are broken by the lower token id (a stable sort), so the order is
    reproducible. A template whose mask token does not survive tokenisation is a
    :class:`DataError`.

Causal LMs (:func:`causal_first_words`)
    The prompt is the template up to ``[M]`` with trailing white space removed (the official
    GPT-2 example drops `` [M].``), preceded by the start token (BOS, else EOS; the convention of
    :func:`audit.backends.hf_scoring.causal_prefix_id`) with ``start="always"`` (default), or only
    where the tokenizer adds one with ``start="harness"``
    (:func:`audit.backends.hf_scoring.prepends_start`). The completion is the **first word** of
    the continuation: the first run of letters or digits (inner hyphens and apostrophes kept:
    ``pre-teen``, ``l'homme``), taken once a character that cannot continue it has been
    generated, the end-of-sequence token is produced or ``max_new_tokens`` tokens have been
    generated (a continuation without letters gives the empty completion, never hurtful).

    ``decoding="greedy"`` (default): the ``k`` most probable first tokens (ties by lower id),
    each continued greedily (arg-max, ``model.generate`` greedy search) for up to
    ``max_new_tokens`` tokens in all, so ``k = 1`` is plain greedy decoding and ``k > 1`` is the
    causal analogue of the masked LM's top-k.
    ``decoding="sample"``: ``k`` independent continuations sampled from the model's distribution
    (temperature 1, no top-k/top-p truncation) by inverse-CDF sampling with uniform numbers from
    ``numpy.random.default_rng(SeedSequence(seed).spawn(n_templates)[i])``: reproducible for a
    seed and independent of batch size and order.

Sampled text (:func:`causal_samples`, HONEST's ``official`` protocol)
    ``k`` continuations of ``max_new_tokens`` tokens per prompt drawn from the temperature /
    top-k / top-p distribution (:func:`sampling_probs`, transformers' warpers' rules) with the
    same seeded per-prompt streams, through ``model.generate`` (KV cache) with a logits processor
    that makes the draw.

Both run batched: templates sorted by length and padded under an attention mask (right padding for
the masked LM and the sampled first token, left padding with the model's KV cache for the greedy
branches, each prompt run once for its ``k`` branches; sampled continuations re-run the unfinished
sequences step by step).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Sequence

import numpy as np

from audit import schema
from audit.backends.batching import (
    default_batch_size,
    inference,
    pad_batch,
    positions,
    run_batched,
    transformers_quiet,
)
from audit.backends.hf_scoring import (
    causal_prefix_id,
    causal_start_id,
    check_start,
    prepends_start,
    max_sequence_length,
    model_device,
    pad_token_id,
    split_verified,
)
from audit.errors import DataError, ModelError, ParameterError
from audit.stats import check_int_seed

__all__ = ["DECODINGS", "first_word", "check_k", "mlm_topk", "causal_first_words", "causal_generate_until",
           "causal_samples", "sampling_probs"]

DECODINGS = ("greedy", "sample")
#: The slot a template marks for :func:`mlm_topk` to fill (HONEST's ``[M]``).
SLOT = "[M]"
_WORD = re.compile(r"[^\W_]+(?:['\u2019\-][^\W_]+)*")


def first_word(text: str) -> tuple[str, bool]:
    """``(word, complete)``: the first word of a continuation (module docstring) and whether the
    text after it shows that it has ended (a character that cannot continue it; an apostrophe or
    hyphen at the very end may still be followed by letters, and the replacement character of a
    character cut between two tokens may still become one)."""
    m = _WORD.search(text)
    if m is None:
        return "", False
    rest = text[m.end():]
    # U+FFFD after the word: the decoded bytes of a character cut between two tokens (byte-level
    # BPE), which the next token may complete into a letter of the word
    return m.group(0), bool(rest) and rest[0] != "\ufffd" and (rest[0] not in "'\u2019-" or len(rest) >= 2)


def check_k(k: Any) -> int:
    """``k``, the number of completions: an integer >= 1 (:func:`audit.schema.integer`)."""
    return schema.integer(k, "k", 1)


# --------------------------------------------------------------------------- masked LMs


def _topk_ids(logp: Any, k: int) -> Any:
    """Per row, the ids of the ``k`` largest values, largest first, ties by lower id: ``topk(k + 1)``
    ordered by (value descending, id ascending); rows whose k-th and (k+1)-th values tie fall back
    to a full stable sort (the same order, computed exactly)."""
    import torch

    n, v = logp.shape
    if k >= v:
        return torch.sort(-logp, dim=-1, stable=True).indices[:, :k]
    vals, idx = torch.topk(logp, k + 1, dim=-1)
    ids, perm = torch.sort(idx, dim=-1)  # by id, then stably by value: (value desc, id asc)
    order = torch.sort(-vals.gather(1, perm), dim=-1, stable=True).indices
    out = ids.gather(1, order)[:, :k]
    tie = vals[:, k - 1] == vals[:, k]
    if bool(tie.any()):
        rows = tie.nonzero(as_tuple=True)[0]
        out[rows] = torch.sort(-logp[rows], dim=-1, stable=True).indices[:, :k]
    return out


def mlm_topk(model: Any, tokenizer: Any, templates: Sequence[str], k: int, *, batch_size: int | None = None,
             device: Any = None, slot: str = SLOT) -> tuple[list[list[str]], np.ndarray, np.ndarray]:
    """The ``k`` most probable fillers of each template's ``slot`` (HONEST's ``[M]``) under a masked LM.

    Returns ``(words, ids, logprobs)``: per template the ``k`` decoded, stripped tokens, their ids
    (int64, shape ``(n, k)``) and log-probabilities (float64, ``log_softmax`` in float32), most
    probable first, ties by lower id.
    """
    import torch

    k = check_k(k)
    mask_tok, mask_id = getattr(tokenizer, "mask_token", None), getattr(tokenizer, "mask_token_id", None)
    if not isinstance(mask_tok, str) or not isinstance(mask_id, int):
        raise ModelError("the tokenizer has no mask token; HONEST on a masked LM needs one")
    limit = max_sequence_length(model, tokenizer)
    seqs: list[tuple[list[int], int]] = []
    for t in templates:
        text = t.replace(slot, mask_tok)
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
        pos = [i for i, x in enumerate(ids) if x == mask_id]
        if len(pos) != 1:
            raise DataError(f"template {t!r}: the mask token appears {len(pos)} times after tokenisation (expected 1)")
        if len(ids) > limit:
            raise DataError(f"template {t!r} has {len(ids)} tokens; the model accepts at most {limit}")
        seqs.append((ids, pos[0]))
    vocab = int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else None
    if vocab is not None and k > vocab:
        raise ParameterError(f"k: {k} completions asked, the vocabulary has {vocab} tokens")
    dev = model_device(model, device)
    pad = pad_token_id(tokenizer)
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i][0]), i))

    def run(batch: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        ids, att, *_ = pad_batch([seqs[i][0] for i in batch], pad)
        b = torch.arange(len(batch))
        p = torch.tensor([seqs[i][1] for i in batch], dtype=torch.long)
        ids, att, b, p = ids.to(dev), att.to(dev), b.to(dev), p.to(dev)
        with inference():
            split = split_verified(model, ids, att)
            if split is not None:
                encoder, head = split
                logits = head(encoder(ids, att)[b, p])
            else:
                logits = model(input_ids=ids, attention_mask=att).logits[b, p]
            logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        srt = _topk_ids(logp, k)
        vals = logp.gather(1, srt)
        return [(srt[r].numpy().astype(np.int64), vals[r].double().numpy()) for r in range(len(batch))]

    res = run_batched(run, order, default_batch_size(dev, "score") if batch_size is None else batch_size, device=dev)
    ids_out = np.zeros((len(seqs), k), dtype=np.int64)
    lp_out = np.zeros((len(seqs), k), dtype=np.float64)
    for i, (a, v) in zip(order, res):
        ids_out[i], lp_out[i] = a, v
    words = [[tokenizer.decode([int(t)]).strip() for t in row] for row in ids_out]
    return words, ids_out, lp_out


# --------------------------------------------------------------------------- causal LMs


def _check_generation(max_new_tokens: Any, seed: Any, sampled: bool) -> int:
    """``max_new_tokens`` as an int (``2.0`` is 2, as in specs); the seed checked where sampled."""
    if sampled:
        check_int_seed(seed)
    return schema.integer(max_new_tokens, "max_new_tokens", 1)


def _prompt_ids(model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int,
                start: str) -> list[list[int]]:
    """The token ids of each prompt (no special tokens), the start token first as ``start`` says
    (:func:`audit.backends.hf_scoring.prepends_start`; an empty prompt always gets it); a prompt
    that with ``max_new_tokens`` more tokens exceeds the model's limit is a :class:`DataError`."""
    check_start(start, "start_token")
    sid = causal_prefix_id(tokenizer) if start == "always" else causal_start_id(tokenizer)
    prepend = prepends_start(tokenizer, start)
    limit = max_sequence_length(model, tokenizer)
    out: list[list[int]] = []
    for p in prompts:
        ids = list(tokenizer(p, add_special_tokens=False)["input_ids"])
        if (prepend or not ids) and (not ids or ids[0] != sid):
            if sid is None:
                raise ModelError(f"prompt {p!r} is empty and the tokenizer has neither a BOS nor an EOS token")
            ids = [sid] + ids
        if len(ids) + max_new_tokens > limit:
            raise DataError(f"prompt {p!r} has {len(ids)} tokens; with {max_new_tokens} new tokens the model's limit "
                            f"of {limit} is exceeded")
        out.append(ids)
    return out


def _settings(model: Any, tokenizer: Any, device: Any, batch_size: int | None) -> tuple[Any, int, int | None, int]:
    """What every causal generation runs with: ``(device, pad id, EOS id or None, batch size)``
    (:func:`audit.backends.batching.default_batch_size` ``"score"`` when ``batch_size`` is None)."""
    dev = model_device(model, device)
    return (dev, pad_token_id(tokenizer), getattr(tokenizer, "eos_token_id", None),
            default_batch_size(dev, "score") if batch_size is None else batch_size)


def _until_eos(tokens: list[int], eos: int | None) -> list[int]:
    """The generated tokens before the first end-of-sequence token (all of them without one)."""
    return tokens[: tokens.index(eos)] if eos is not None and eos in tokens else tokens


def _batched(fn: Any, seqs: list[list[int]], bs: int, dev: Any) -> list[Any]:
    """``fn`` over ``seqs`` in batches sorted by length (longest first), results in input order;
    transformers' advice below ERROR left out once for all the batches (:func:`transformers_quiet`)."""
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))
    with transformers_quiet():
        res = run_batched(lambda batch: fn([seqs[i] for i in batch]), order, bs, device=dev)
    out: list[Any] = [None] * len(seqs)
    for i, v in zip(order, res):
        out[i] = v
    return out


def _next_logp(model: Any, pad: int, dev: Any, batch: list[list[int]]) -> list[Any]:
    """log_softmax (float32, CPU) of the next token after each sequence (right padding)."""
    import torch

    ids, att, *_ = pad_batch(batch, pad)
    last = torch.tensor([len(s) - 1 for s in batch], dtype=torch.long, device=dev)
    with inference():
        logits = model(input_ids=ids.to(dev), attention_mask=att.to(dev), use_cache=False).logits
        rows = logits[torch.arange(len(batch), device=dev), last]
        return list(torch.log_softmax(rows.float(), dim=-1).cpu())


def _uniforms(seed: int, n: int, k: int, steps: int) -> list[np.ndarray]:
    """The uniform numbers of seeded sampling: prompt ``i``'s ``(k, steps)`` array from
    ``default_rng(SeedSequence(seed).spawn(n)[i])`` (one independent stream per prompt, so the
    samples do not depend on the batch size or the order of the prompts)."""
    return [np.random.default_rng(s).random((k, steps)) for s in np.random.SeedSequence(int(seed)).spawn(n)]


def sampling_probs(logp: Any, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The next-token distribution that sampling draws from, float64 over the vocabulary: the
    log-probabilities divided by ``temperature``, then only the ``top_k`` largest kept (ties with
    the k-th kept; ``0``: all), then only the smallest set of the most probable tokens whose
    probabilities sum above ``top_p`` (at least one; ``1.0``: all), renormalised. The order and rules
    of transformers' ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and ``TopPLogitsWarper``
    (``generate(do_sample=True)``), computed in float64."""
    x = np.asarray(logp.double().numpy() if hasattr(logp, "double") else logp, dtype=np.float64) / float(temperature)
    if top_k and top_k < x.size:
        kth = np.partition(x, x.size - top_k)[x.size - top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(p, kind="stable")  # ascending, as TopPLogitsWarper sorts
        cum = np.cumsum(p[order])
        drop = cum <= 1.0 - top_p
        drop[-1] = False
        p[order[drop]] = 0.0
        p /= p.sum()
    return p


def _draw(p: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the first token id whose cumulative probability (token-id order) exceeds
    ``u`` times the total."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))


#: The generation settings (differences from transformers' ``GenerationConfig()``) under which
#: greedy search is the same in pieces: ``a`` tokens, then ``b`` more after them, are the tokens of
#: one call for ``a + b``. Token ids and output switches; what :func:`_greedy` sets itself
#: (``max_new_tokens``, greedy search: ``do_sample``, ``num_beams``, the sampling warpers, unused
#: without sampling, and the beam-only ``length_penalty``/``early_stopping``); and the logits
#: processors that read only the whole sequence so far (repetition penalty, n-gram and
#: bad-word bans, sequence bias, renormalising). Anything else (``min_new_tokens``,
#: ``begin_suppress_tokens``, ``forced_eos_token_id``, ``exponential_decay_length_penalty``:
#: counted from the prompt's end; ``stop_strings``; settings of later transformers releases)
#: keeps one call, as does another cache than the default (``cache_implementation``).
_PIECEWISE_GREEDY = frozenset({
    "transformers_version", "_from_model_config", "bos_token_id", "eos_token_id", "pad_token_id",
    "decoder_start_token_id", "max_length", "max_new_tokens", "do_sample", "num_beams", "temperature", "top_k",
    "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h", "length_penalty", "early_stopping",
    "use_cache", "output_attentions", "output_hidden_states", "output_scores",
    "output_logits", "return_dict_in_generate", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
    "sequence_bias", "renormalize_logits", "remove_invalid_values",
})


def piecewise_greedy(model: Any) -> bool:
    """Whether greedy continuation of ``model`` may run in pieces: a transformers model whose
    ``generate`` is transformers' own (a wrapper's, such as Self-Debias's
    :class:`audit.lm_mitigation.models.SelfDebiasingLM`, keeps one call) and whose generation
    settings differ from transformers' defaults only in :data:`_PIECEWISE_GREEDY`."""
    from transformers import GenerationMixin

    if not isinstance(model, GenerationMixin) or type(model).generate is not GenerationMixin.generate:
        return False
    cfg = getattr(model, "generation_config", None)
    return cfg is None or set(cfg.to_diff_dict()) <= _PIECEWISE_GREEDY


def _greedy_search(pad: int, eos: int | None) -> dict[str, Any]:
    """``generate``'s arguments for greedy search over the model's own generation settings (its
    sampling settings unset, so transformers does not warn that they are unused)."""
    return dict(do_sample=False, num_beams=1, pad_token_id=pad, eos_token_id=eos, temperature=None, top_k=None,
                top_p=None)


def _greedy(model: Any, seqs: list[list[int]], max_new_tokens: int, *, pad: int, eos: int | None, dev: Any,
            processors: Sequence[Any] = ()) -> list[list[int]]:
    """``max_new_tokens`` greedy tokens after each sequence (``model.generate``, left padding, KV
    cache); the tokens after EOS are padding. Without ``processors``: greedy search over the
    model's own generation settings (lm-evaluation-harness ``generate_until``); with them (a
    sampler's draw, :func:`_sample_batch`): a fresh ``GenerationConfig``, so the model's settings
    (repetition penalties and the like) stay out."""
    from transformers import GenerationConfig, LogitsProcessorList

    ids, att, *_ = pad_batch(seqs, pad, "left")
    L = ids.shape[1]
    with transformers_quiet():  # generate's padding advice: the attention mask is passed
        with inference():
            if processors:
                config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                          pad_token_id=pad, eos_token_id=eos)
                out = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), generation_config=config,
                                     logits_processor=LogitsProcessorList(list(processors)))
            else:
                out = model.generate(input_ids=ids.to(dev), attention_mask=att.to(dev), max_new_tokens=max_new_tokens,
                                     **_greedy_search(pad, eos))
    return [row[L:].tolist() for row in out.cpu()]


def _greedy_words(model: Any, seqs: list[list[int]], max_new_tokens: int, *, pad: int, eos: int | None, dev: Any,
                  ended: Any) -> tuple[list[list[int]], list[int]]:
    """Greedy continuation of the branches of :func:`causal_first_words` that stops where their word
    has ended: one greedy token after every sequence (``model.generate``, as :func:`_greedy`), then
    up to ``max_new_tokens - 1`` more only for the sequences ``i`` whose tokens so far have not
    ``ended(i, tokens)`` (nor reached EOS). Returns ``(tokens, deferred)`` (:func:`_go_on`)."""
    ids, att, *_ = pad_batch(seqs, pad, "left")
    return _go_on(model, ids.to(dev), att.to(dev), None, max_new_tokens, pad=pad, eos=eos, dev=dev, ended=ended)


def _go_on(model: Any, ids: Any, att: Any, cache: Any, max_new_tokens: int, *, pad: int, eos: int | None, dev: Any,
           ended: Any) -> tuple[list[list[int]], list[int]]:
    """The greedy steps of :func:`_greedy_words` on a left-padded batch (``ids``, ``att``), from
    ``cache`` (the KV cache of all but the last column) or from the start (``None``).

    Where more than half of the sequences go on after the first token, they go on here, on that
    call's KV cache (its rows of those sequences). Where at most half do (most branches end their
    word on that one token: the tiny GPT-2 on the English HONEST templates, 12,993 of 14,480), they
    are ``deferred``: they have their one token, and the caller continues them all together for
    ``max_new_tokens - 1`` tokens with :func:`_greedy`, in full batches (a tiny model pays per call
    and step, not per row). Either way each sequence's tokens are those of one call, up to where
    its word ended (:func:`piecewise_greedy`: the caller's check of the model's settings)."""
    import torch

    L = ids.shape[1]
    greedy = _greedy_search(pad, eos)
    with transformers_quiet():  # generate's padding advice: the attention mask is passed
        with inference():
            first = model.generate(input_ids=ids, attention_mask=att, past_key_values=cache, max_new_tokens=1,
                                   return_dict_in_generate=True, **greedy)
            res = [row[L:].tolist() for row in first.sequences.cpu()]
            live = [i for i, t in enumerate(res) if (eos is None or t[-1] != eos) and not ended(i, t)]
            if not live or max_new_tokens < 2 or 2 * len(live) <= len(res):
                return res, live if max_new_tokens > 1 else []
            cache = first.past_key_values
            pick = torch.tensor(live, dtype=torch.long, device=dev)
            if len(live) < len(res):
                if hasattr(cache, "batch_select_indices"):
                    cache.batch_select_indices(pick)
                else:
                    cache = None  # a cache that cannot drop rows: these rows run from their start again
            more = model.generate(input_ids=first.sequences[pick], past_key_values=cache,
                                  attention_mask=torch.cat([att[pick], att.new_ones((len(live), 1))], dim=1),
                                  max_new_tokens=max_new_tokens - 1, **greedy)
    for i, row in zip(live, more.cpu()):
        res[i] = row[L:].tolist()
    return res, []


@functools.cache
def _forward_params(forward: Any) -> frozenset[str]:
    """The parameter names of a model class's ``forward`` (read once per class)."""
    import inspect

    return frozenset(inspect.signature(forward).parameters)


def shared_prompt_pass(model: Any) -> bool:
    """Whether :func:`_greedy_branches` may run the prompts once for all their branches: greedy
    search in pieces is allowed (:func:`piecewise_greedy`), the model takes ``position_ids`` (the
    positions of a left-padded prompt) and its cache can be repeated per branch."""
    return piecewise_greedy(model) and "position_ids" in _forward_params(type(model).forward)


def _greedy_branches(model: Any, prefixes: list[list[int]], k: int, max_new_tokens: int, *, pad: int,
                     eos: int | None, dev: Any, ended: Any) -> list[tuple[Any, list[int], list[list[int]], list[bool]]]:
    """The ``k`` greedy branches of each prompt with the prompts run once: per prompt ``(log-probs of
    the first token, the k first tokens, each branch's tokens after its first, whether that branch
    is deferred)``. ``ended(tokens)``: whether a branch's tokens (its first one included) have
    ended its word.

    The prompts run once, left-padded (positions from the attention mask, as ``generate`` gives
    them), keeping their KV cache; the first token's log-probabilities are read at the last
    column; the cache is repeated for the ``k`` branches, which then go on as in
    :func:`_greedy_words` from that cache (:func:`_go_on`: the branch token is the only new
    column), instead of each branch running its prompt again."""
    import torch

    ids, att, *_ = pad_batch(prefixes, pad, "left")
    ids, att = ids.to(dev), att.to(dev)
    last = {"logits_to_keep": 1} if "logits_to_keep" in _forward_params(type(model).forward) else {}
    with inference():
        out = model(input_ids=ids, attention_mask=att, position_ids=positions(att), use_cache=True, **last)
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # the LM head at the last column only
        top = torch.sort(-logp, dim=-1, stable=True).indices[:, :k]  # ties: the lower id first
        cache = out.past_key_values
        if hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(k)
        else:
            cache = None  # a cache that cannot be repeated: each branch runs its prompt
        seq = torch.cat([ids.repeat_interleave(k, dim=0), top.reshape(-1, 1)], dim=1)
        mask = torch.cat([att.repeat_interleave(k, dim=0), att.new_ones((len(prefixes) * k, 1))], dim=1)
    flat = top.reshape(-1).tolist()
    if max_new_tokens > 1:
        more, deferred = _go_on(model, seq, mask, cache, max_new_tokens - 1, pad=pad, eos=eos, dev=dev,
                                ended=lambda i, t: flat[i] == eos or ended([flat[i]] + t))
    else:
        more, deferred = [[] for _ in flat], []
    later = set(deferred)
    logp = logp.cpu()
    return [(logp[i], flat[i * k:(i + 1) * k],
             [[] if flat[b] == eos else more[b] for b in range(i * k, (i + 1) * k)],
             [b in later and flat[b] != eos for b in range(i * k, (i + 1) * k)])
            for i in range(len(prefixes))]


def causal_generate_until(model: Any, tokenizer: Any, prompts: Sequence[str], *, until: Sequence[str] = (),
                          max_new_tokens: int = 256, batch_size: int | None = None, device: Any = None,
                          start: str = "always") -> list[str]:
    """The greedy continuation of each prompt (lm-evaluation-harness ``generate_until`` with its
    default generation kwargs: greedy, ``max_gen_toks`` 256), decoded without special tokens and
    cut before the first of the ``until`` strings; generation also stops at the end-of-sequence
    token (the harness adds the EOS text to ``until``). ``start`` as :func:`causal_first_words`.
    Batched by length, left padding; the result does not depend on the batch size."""
    max_new_tokens = _check_generation(max_new_tokens, 0, False)
    if isinstance(until, str) or not all(isinstance(u, str) and u for u in until):
        raise ParameterError(f"until: must be a list of non-empty strings, got {until!r}")
    prefixes = _prompt_ids(model, tokenizer, prompts, max_new_tokens, start)
    dev, pad, eos, bs = _settings(model, tokenizer, device, batch_size)
    gen = _batched(lambda seqs: _greedy(model, seqs, max_new_tokens, pad=pad, eos=eos, dev=dev), prefixes, bs, dev)
    out: list[str] = []
    for g in gen:
        text = tokenizer.decode(_until_eos(g, eos), skip_special_tokens=True)
        out.append(text[:min((text.find(u) for u in until if u in text), default=len(text))])
    return out


def _sample_batch(model: Any, seqs: list[list[int]], us: list[np.ndarray], max_new_tokens: int, pad: int,
                  eos: int | None, dev: Any, probs: Any) -> list[list[int]]:
    """Sampled continuations of a batch of prompts (:func:`_greedy` with a logits processor): at
    each step the processor draws every row's token from ``probs(log_softmax)`` with its uniform
    number ``us[r][step]`` (:func:`_draw`) and makes that token the only possible one, so greedy
    search takes it. Returns the new tokens of each row (EOS and the padding after it included)."""
    import torch
    from transformers import LogitsProcessor

    L = max(len(s) for s in seqs)

    class Draw(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            step = input_ids.shape[1] - L
            logp = torch.log_softmax(scores.float(), dim=-1).cpu()
            out = torch.full_like(scores, -float("inf"))
            for r in range(scores.shape[0]):
                out[r, _draw(probs(logp[r]), float(us[r][step]))] = 0.0
            return out

    return _greedy(model, seqs, max_new_tokens, pad=pad, eos=eos, dev=dev, processors=[Draw()])


def causal_samples(model: Any, tokenizer: Any, prompts: Sequence[str], k: int, *, seed: int = 0,
                   max_new_tokens: int = 10, temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0,
                   start: str = "always", batch_size: int | None = None, device: Any = None) -> list[list[str]]:
    """``k`` sampled continuations of each prompt under a causal LM, as text (the HONEST
    ``official`` protocol's generation; :mod:`audit.measure.honest`).

    Each continuation is ``max_new_tokens`` tokens drawn one at a time from
    :func:`sampling_probs` (temperature, top-k, top-p) of the model's next-token distribution,
    stopped early at the end-of-sequence token (not kept), decoded with special tokens skipped;
    run through ``model.generate`` (left padding, KV cache) whose logits processor makes the draw
    (:func:`_sample_batch`); the model's own generation settings are not used.
    The draws are inverse-CDF with the uniform numbers of :func:`_uniforms` (``uniforms[i][j, t]``
    draws token ``t`` of sample ``j`` of prompt ``i``): reproducible for a seed, independent of
    the batch size. The prompt's tokens start with the start token as ``start`` says
    (``"always"`` | ``"harness"``; :func:`audit.backends.hf_scoring.prepends_start`).
    """
    k = check_k(k)
    max_new_tokens = _check_generation(max_new_tokens, seed, True)
    top_k = schema.integer(top_k, "top_k", 0)  # 0: no top-k
    top_p = schema.number(top_p, "top_p", 0.0, strict=True, maximum=1.0, inclusive=True)
    temperature = schema.number(temperature, "temperature", 0.0, strict=True)
    prefixes = _prompt_ids(model, tokenizer, prompts, max_new_tokens, start)
    dev, pad, eos, bs = _settings(model, tokenizer, device, batch_size)
    n = len(prefixes)
    uniforms = _uniforms(seed, n, k, max_new_tokens)
    rows = list(range(n * k))
    order = sorted(rows, key=lambda b: (-len(prefixes[b // k]), b))

    def run(batch: list[int]) -> list[list[int]]:
        return _sample_batch(model, [prefixes[b // k] for b in batch],
                             [uniforms[b // k][b % k] for b in batch], max_new_tokens, pad, eos, dev,
                             lambda lp: sampling_probs(lp, temperature=temperature, top_k=int(top_k),
                                                       top_p=float(top_p)))

    res = run_batched(run, order, bs, device=dev)
    gen: list[list[int]] = [[] for _ in rows]
    for b, g in zip(order, res):
        gen[b] = _until_eos(g, eos)
    texts = [tokenizer.decode(g, skip_special_tokens=True) for g in gen]
    return [texts[i * k:(i + 1) * k] for i in range(n)]


def causal_first_words(model: Any, tokenizer: Any, prompts: Sequence[str], k: int, *, decoding: str = "greedy",
                       seed: int = 0, max_new_tokens: int = 8, batch_size: int | None = None,
                       device: Any = None, start: str = "always") -> tuple[list[list[str]], np.ndarray]:
    """``k`` first-word completions of each prompt under a causal LM (module docstring).

    Returns ``(words, logprobs)``: per prompt the ``k`` words and the log-probability of each
    completion's first token (float64, shape ``(n, k)``; greedy: most probable first).

    ``start``: ``"always"`` (default) puts the start token first; ``"harness"`` only where the
    tokenizer adds it itself (:func:`_prompt_ids`; used on chat-rendered prompts).

    Greedy branches are continued with ``model.generate`` (greedy search, KV cache, left padding)
    for ``max_new_tokens - 1`` further tokens: first one token for every branch, then the rest
    only for the branches whose first word has not ended yet, where :func:`piecewise_greedy` says
    that gives the tokens of one call (else one call per branch). Each prompt then runs once for
    its ``k`` branches (:func:`_greedy_branches`: its KV cache repeated per branch, ``bs // k``
    prompts a batch; the first token's log-probabilities read there, from the left-padded prompt,
    equal to the right-padded pass to float rounding), or, for a model without ``position_ids``,
    each branch from its start (:func:`_greedy_words`). Sampled ones step by step (see the module
    docstring for the random numbers).
    """
    import torch

    k = check_k(k)
    schema.choice(decoding, "decoding", DECODINGS)
    max_new_tokens = _check_generation(max_new_tokens, seed, decoding == "sample")
    prefixes = _prompt_ids(model, tokenizer, prompts, max_new_tokens, start)
    dev, pad, eos, bs = _settings(model, tokenizer, device, batch_size)
    n = len(prefixes)

    def batched(fn, seqs: list[list[int]]) -> list[Any]:
        return _batched(fn, seqs, bs, dev)

    def next_logp(batch: list[list[int]]) -> list[Any]:
        return _next_logp(model, pad, dev, batch)

    @functools.lru_cache(maxsize=None)
    def text(tokens: tuple[int, ...]) -> str:  # branches often share their tokens: each decoded once
        return tokenizer.decode(list(tokens), skip_special_tokens=True)

    def word_ended(tokens: list[int]) -> bool:
        return first_word(text(tuple(tokens)))[1]

    def branches(batch: list[list[int]]) -> list[Any]:
        return _greedy_branches(model, batch, k, max_new_tokens, pad=pad, eos=eos, dev=dev, ended=word_ended)

    def greedy_more(batch: list[list[int]]) -> list[tuple[list[int], bool]]:
        """Greedy tokens after each sequence until its word has ended (:func:`_greedy_words`),
        each with whether it was deferred."""
        toks, deferred = _greedy_words(model, batch, max_new_tokens - 1, pad=pad, eos=eos, dev=dev,
                                       ended=lambda i, more: word_ended(batch[i][-1:] + more))  # first token, more
        later = set(deferred)
        return [(t, i in later) for i, t in enumerate(toks)]

    def greedy_all(batch: list[list[int]]) -> list[tuple[list[int], bool]]:
        """``max_new_tokens - 1`` greedy tokens after each sequence in one call (:func:`_greedy`)."""
        return [(t, False) for t in _greedy(model, batch, max_new_tokens - 1, pad=pad, eos=eos, dev=dev)]

    def greedy_rest(batch: list[list[int]]) -> list[list[int]]:
        return _greedy(model, batch, max_new_tokens - 2, pad=pad, eos=eos, dev=dev)

    def draw(row: Any, u: float) -> int:
        return _draw(row.double().exp().numpy(), u)

    gen: list[list[int]] = []
    owner: list[int] = []
    score = np.zeros(n * k, dtype=np.float64)
    later: list[int] = []  # greedy branches whose word goes on after their second token: continued together
    if decoding == "greedy" and shared_prompt_pass(model):
        # the prompts run once for their k branches (a batch of bs // k prompts holds bs branches)
        for i, (row, toks, more, deferred) in enumerate(_batched(branches, prefixes, max(1, bs // k), dev)):
            for j, t in enumerate(toks):
                if deferred[j]:
                    later.append(len(gen))
                score[len(gen)] = float(row[t])
                gen.append([int(t)] + more[j])
                owner.append(i)
    else:
        first = batched(next_logp, prefixes)
        if decoding == "sample":
            uniforms = _uniforms(seed, n, k, max_new_tokens)
        for i in range(n):
            row = first[i]
            if decoding == "greedy":
                toks = torch.sort(-row, stable=True).indices[:k].tolist()
            else:
                toks = [draw(row, u) for u in uniforms[i][:, 0]]
            for j, t in enumerate(toks):
                gen.append([int(t)])
                owner.append(i)
                score[i * k + j] = float(row[t])
        if max_new_tokens > 1 and decoding == "greedy":
            live = [b for b in range(n * k) if eos is None or gen[b][-1] != eos]
            grow = greedy_more if piecewise_greedy(model) else greedy_all
            for b, (extra, deferred) in zip(live, batched(grow, [prefixes[owner[b]] + gen[b] for b in live])):
                gen[b] += extra
                if deferred:
                    later.append(b)
        elif max_new_tokens > 1:
            done = [eos is not None and g[-1] == eos for g in gen]
            for step in range(1, max_new_tokens):
                live = [b for b in range(n * k) if not done[b] and not word_ended(gen[b])]
                if not live:
                    break
                lp = batched(next_logp, [prefixes[owner[b]] + gen[b] for b in live])
                for r, b in enumerate(live):
                    t = draw(lp[r], uniforms[owner[b]][b - owner[b] * k, step])
                    gen[b].append(t)
                    done[b] = eos is not None and t == eos
    for b, extra in zip(later, batched(greedy_rest, [prefixes[owner[b]] + gen[b] for b in later])):
        gen[b] += extra
    words = [first_word(text(tuple(_until_eos(g, eos))))[0] for g in gen]
    return [words[i * k:(i + 1) * k] for i in range(n)], score.reshape(n, k)
