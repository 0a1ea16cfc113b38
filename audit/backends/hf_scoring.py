"""Language-model scoring: masked-LM (pseudo-)log-likelihoods and causal-LM log-likelihoods.

Five entry points, all batched, all under :func:`torch.inference_mode`:

* :func:`masked_token_logprobs` -- the primitive: for each *query* (a token-id sequence in which
  some positions hold the mask token, and the token ids expected there) the log-probabilities
  ``log softmax(logits[position])[target]`` of a masked LM. Queries are de-duplicated, sorted by
  length and padded per batch; the encoder runs on the whole batch but the LM head (transform +
  decoder over the vocabulary, n_positions x hidden x vocab multiply-adds per sequence when run
  everywhere) runs only on the hidden states of the queried positions (BERT ``model.cls``,
  RoBERTa/XLM-R/CamemBERT/GPT-2 ``model.lm_head``, ALBERT ``model.predictions``, DistilBERT's
  ``vocab_*`` layers, ELECTRA's generator head; other models run the full forward pass). The
  split is verified once per model against the full forward pass (and abandoned if the logits
  differ), and vocabulary logits are materialised a few hundred rows at a time (:data:`HEAD_CHUNK_ROWS`).
* :func:`crows_pairs_pll` -- the CrowS-Pairs masked-LM score of Nangia et al. (2020), exactly as
  ``metric.py`` of nyu-mll/crows-pairs (``mask_unigram``): tokenise both sentences of a pair
  with special tokens; the unmodified tokens are the ``'equal'`` opcodes of
  ``difflib.SequenceMatcher(None, ids1, ids2)`` over the token ids (default ``autojunk``, as the
  original); mask each unmodified token, one at a time, except special tokens; a sentence's score
  is the sum over those positions of ``log P(original token | sentence with that token masked)``.
  (The original skips the first and last template positions, which are ``[CLS]``/``[SEP]``
  (``<s>``/``</s>``) for BERT, RoBERTa and ALBERT; here special tokens are skipped wherever they
  are, which is the same for those models.) The original lowercases the text for uncased
  models; the tokenizers of uncased models lowercase by themselves, so nothing is done here.
* :func:`masked_pll` -- the pseudo-log-likelihood of single sentences (Salazar et al. 2020): every
  non-special token masked in turn.
* :func:`continuation_loglik` -- the causal-LM primitive: ``log P(continuation | prefix)`` of
  ``(prefix, continuation)`` requests, summed over the continuation's tokens, with the number of
  tokens scored (stable public API, shared by CrowS-Pairs, causal LPBS and BBQ answer options).
  Every sequence starts with the start token (BOS, else EOS) exactly once; padding on either
  side with explicit position ids; the LM head only on the scored positions.
* :func:`causal_loglik` -- the log-likelihood of each sentence under a causal LM given only the
  start token, as lm-evaluation-harness scores a request with an empty context: context
  ``[bos_token_id]`` (EOS when the tokenizer has no BOS), continuation
  ``tokenizer(sentence, add_special_tokens=False)`` (if the text itself starts with the start
  token, that token becomes the context), ``ll = sum_t log P(x_t | prefix, x_<t)``.

Two text-level masked-LM helpers build on the primitive: :func:`span_pll` (the pseudo-log-likelihood
of a continuation's tokens given its context, each masked in turn: BBQ options on a masked LM) and
:func:`masked_span_logprobs` (the tokens of a span masked together, other spans masked too: LPBS).
These are the Hugging Face implementation of the model interface's scoring operations
(:class:`audit.backends.base.LanguageModel`, called through :class:`audit.backends.hf.HFModel`).

Scores are float64 sums of float32 log-probabilities (float32 ``log_softmax`` even when the model
runs in half precision). A sequence longer than the model accepts raises :class:`DataError`
naming the sentence; a model of the wrong kind raises :class:`ModelError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import os
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from audit import schema
from audit.backends.batching import PADDING_SIDES, default_batch_size, inference, pad_batch, positions, run_batched
from audit.errors import DataError, ModelError, ParameterError

__all__ = [
    "MaskedQuery",
    "masked_token_logprobs",
    "crows_pairs_template",
    "crows_pairs_pll",
    "masked_pll",
    "causal_loglik",
    "continuation_loglik",
    "encode_continuation",
    "encode_requests",
    "causal_token_logprobs",
    "causal_prefix_id",
    "causal_start_id",
    "check_start",
    "prepends_start",
    "tokenizer_adds_start",
    "token_spans",
    "require_kind",
    "max_sequence_length",
    "span_pll",
    "masked_span_logprobs",
    "default_token_budget",
]


@dataclasses.dataclass(frozen=True)
class MaskedQuery:
    """One masked-LM request.

    input_ids: the full token-id sequence, special tokens included, with the mask token already
               placed at the masked positions.
    positions: positions whose prediction is scored (usually the masked ones).
    targets:   the token id scored at each position (the original token).
    """

    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    targets: tuple[int, ...]


# --------------------------------------------------------------------------- helpers


def require_kind(hf_model: Any, kind: str, what: str) -> None:
    """Raise :class:`ModelError` unless ``hf_model.kind == kind`` (``what`` names the metric)."""
    got = getattr(hf_model, "kind", None)
    if got != kind:
        ref = getattr(hf_model, "ref", repr(hf_model))
        need = {"mlm": "a masked LM (kind='mlm')", "causal": "a causal LM (kind='causal')"}.get(kind, kind)
        raise ModelError(f"model {ref!r} is loaded as kind={got!r}; {what} needs {need}")


def model_device(model: Any, device: Any = None) -> Any:
    import torch

    if device is not None:
        return torch.device(device)
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover - parameterless model
        return torch.device("cpu")


def max_sequence_length(model: Any, tokenizer: Any) -> int:
    """The longest token sequence the model accepts (special tokens included).

    The tokenizer's ``model_max_length`` when it is a real limit, else the config's position
    count (minus RoBERTa's ``padding_idx + 1`` position offset for RoBERTa-like models).
    """
    cfg = getattr(model, "config", None)
    limit = None
    for attr in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            limit = v
            break
    if limit is not None and getattr(cfg, "model_type", "") in {"roberta", "xlm-roberta", "camembert",
                                                                  "longformer", "xlm-roberta-xl"}:
        pad = getattr(cfg, "pad_token_id", 1)
        limit -= (pad if isinstance(pad, int) else 1) + 1
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < 1_000_000:
        limit = tok_max if limit is None else min(limit, tok_max)
    return int(limit) if limit is not None else 1 << 30


def _check_length(ids: Sequence[int], limit: int, text: str) -> None:
    if len(ids) > limit:
        short = text if len(text) <= 80 else text[:77] + "..."
        raise DataError(f"sentence {short!r} has {len(ids)} tokens; the model accepts at most {limit}")


def token_spans(tokenizer: Any, text: str, char_spans: Sequence[tuple[int, int]], *,
                add_special_tokens: bool = True) -> tuple[list[int], list[list[int]]]:
    """Tokenise ``text`` and map character spans to token positions.

    Returns ``(input_ids, positions)`` where ``positions[k]`` lists the token positions whose
    character offsets overlap ``char_spans[k]`` (zero-width tokens, i.e. special tokens, never
    do). Needs a fast tokenizer (offset mapping). A span covering no token raises
    :class:`DataError` naming the text and the span.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError("a fast tokenizer (character offsets) is required")
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = enc["offset_mapping"]
    out = []
    for s, e in char_spans:
        pos = [i for i, (a, b) in enumerate(offsets) if b > a and a < e and b > s]
        if not pos:
            raise DataError(f"{text[s:e]!r} (characters {s}-{e}) of {text!r} maps to no token")
        out.append(pos)
    return ids, out


# --------------------------------------------------------------------------- MLM head split

def _split_head(model: Any) -> tuple[Callable, Callable] | None:
    """``(encoder(input_ids, attention_mask) -> hidden (B, L, H), head(rows (n, H)) -> logits
    (n, V))`` from the base model (``model.<base_model_prefix>``) and a known head attribute, or
    ``None``. Unverified: see :func:`split_verified`."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if prefix else None
    if base is None:
        return None

    def encoder(input_ids, attention_mask, **kw):
        return base(input_ids=input_ids, attention_mask=attention_mask, **kw)[0]

    for name in ("cls", "lm_head", "predictions"):
        head = getattr(model, name, None)
        if head is not None and callable(head):
            return encoder, head
    if all(hasattr(model, a) for a in ("vocab_transform", "vocab_layer_norm", "vocab_projector")):
        act = getattr(model, "activation", None)

        def distil_head(h):
            h = model.vocab_transform(h)
            h = act(h) if act is not None else h
            return model.vocab_projector(model.vocab_layer_norm(h))

        return encoder, distil_head
    if hasattr(model, "generator_predictions") and hasattr(model, "generator_lm_head"):
        return encoder, lambda h: model.generator_lm_head(model.generator_predictions(h))
    return None


_SPLIT_OK: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


#: Rows of vocabulary logits materialised at a time (bounds memory: 256 x 50k floats = 51 MB). Small
#: enough that a chunk's logits stay in the CPU cache between the head's product and the
#: ``log_softmax`` that reads them: on CPU (one thread) 256 rows took 0.15 s where 2048 took 0.22 s
#: for 99k rows of a 900-word head, 2.6 vs 2.9 s for 6000 rows of a 32000-word head (64 or fewer
#: rows lose: the product gets too thin).
HEAD_CHUNK_ROWS = 256
#: After the first chunk, as many rows as keep a chunk's logits within this many floats (2 MiB),
#: never fewer than :data:`HEAD_CHUNK_ROWS`: 582 rows for a 900-word head (BBQ on the tiny Llama,
#: whose batches score a few hundred rows: 2.90 vs 3.07 s CPU with 256-row chunks), 256 for 32000.
HEAD_CHUNK_ELEMENTS = 2 ** 19


def _gather_chunked(rows_logits: Callable[[Any], Any], n_rows: int, targets: Any) -> Any:
    """``log_softmax(rows_logits(chunk).float())[i, targets[i]]`` over chunks of rows (float32).

    One fused ``log_softmax`` per chunk and a gather: on CPU 2.5x faster than ``logit[i, t_i] -
    logsumexp(logit[i])`` (which makes several passes over the rows; 17 vs 7 ms for 1000 x 900
    rows), and the harness's own formula; the output is one chunk at a time (``HEAD_CHUNK_ROWS``
    rows, then up to ``HEAD_CHUNK_ELEMENTS`` logits)."""
    import torch

    out = []
    a, rows = 0, HEAD_CHUNK_ROWS
    while a < n_rows:
        sl = slice(a, min(n_rows, a + rows))
        logits = rows_logits(sl).float()
        t = targets[sl, None].to(logits.device)  # the head may sit on another device (device_map)
        out.append(torch.log_softmax(logits, dim=-1).gather(1, t)[:, 0])
        a, rows = sl.stop, max(HEAD_CHUNK_ROWS, HEAD_CHUNK_ELEMENTS // max(1, logits.shape[-1]))
    return torch.cat([o.cpu() for o in out]) if out else torch.zeros(0)


def _close(got: Any, ref: Any, model: Any, tol: float) -> bool:
    """Whether ``got`` equals ``ref`` (tensors) within ``tol`` x ``(1 + max |ref|)``, absolute; 5e-2
    instead of ``tol`` for a model in half precision. The once-per-model checks of the shortcuts."""
    import torch

    if next(model.parameters()).dtype != torch.float32:
        tol = 5e-2
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    got = got.to(ref.device)
    return got.shape == ref.shape and np.isfinite(scale) and bool(
        torch.allclose(got, ref, atol=tol * (1.0 + scale), rtol=0.0))


def _remember(table: "weakref.WeakKeyDictionary[Any, bool]", model: Any, ok: bool) -> bool:
    """``table[model] = ok`` (a model that cannot be weak-referenced is checked again next time)."""
    try:
        table[model] = ok
    except TypeError:  # pragma: no cover - model not weak-referenceable
        pass
    return ok


def split_verified(model: Any, input_ids: Any, attention_mask: Any, **kw: Any) -> tuple[Callable, Callable] | None:
    """The encoder/head split of ``model`` if it reproduces the full forward pass (checked once
    per model on the first batch: logits of up to 8 positions within 1e-3 relative in float32,
    5e-2 in half precision), else ``None``."""
    import torch

    if model in _SPLIT_OK:
        return _split_head(model) if _SPLIT_OK[model] else None
    split = _split_head(model)
    ok = False
    if split is not None:
        encoder, head = split
        n = min(8, input_ids.shape[1])
        b = torch.zeros(n, dtype=torch.long, device=input_ids.device)
        p = torch.arange(n, device=input_ids.device)
        one = {k: (v[:1] if hasattr(v, "shape") else v) for k, v in kw.items()}
        att1 = None if attention_mask is None else attention_mask[:1]
        hid = encoder(input_ids[:1], att1, **one)
        got = head(hid[b.to(hid.device), p.to(hid.device)]).float()
        logits = model(input_ids=input_ids[:1], attention_mask=att1, **one).logits
        ok = _close(got, logits[b.to(logits.device), p.to(logits.device)].float(), model, 1e-3)
    return split if _remember(_SPLIT_OK, model, ok) else None


#: Per causal model: whether right-padded rows give the same scores without the attention mask
#: and position ids (:func:`right_padding_unmasked`).
_UNMASKED_OK: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def right_padding_unmasked(model: Any, input_ids: Any, attention_mask: Any, position_ids: Any = None) -> bool:
    """Whether a right-padded batch of the causal ``model`` may run without its attention mask and
    position ids, with the same numbers on its tokens.

    Causal attention alone keeps every token from the padding after its row's last token, and the
    default positions 0, 1, ... are the tokens' own, so only the padding's states change; without a
    padding mask transformers skips building the 4D mask and calls the causal kernel
    (``scaled_dot_product_attention(is_causal=True)``). On this CPU, one thread, the tiny Llama's
    base model over 128 rows: 150-190 tokens 0.098 → 0.069 s, 20-40 tokens 0.011 → 0.010 s, the
    tokens' states equal to the bit. (Position ids must go too: from position ids that restart,
    transformers infers packed sequences and builds the mask again.)

    A batch without padding needs no check (a model that failed it keeps its mask there too).
    Otherwise checked once per model, on the four rows
    with the most padding of its first padded batch: the logits at their tokens within 1e-4
    (float32; 5e-2 half precision) of ``(1 + max |logit|)``, else the mask stays (a model whose
    attention is not causal, or that reads the mask for more than attention; also one that cannot
    run without it)."""
    import torch

    if model in _UNMASKED_OK:
        return _UNMASKED_OK[model]
    real = attention_mask.bool()
    if bool(real.all()):
        return True
    ids, att, real = input_ids[-4:], attention_mask[-4:], real[-4:]
    pos = {} if position_ids is None else {"position_ids": position_ids[-4:]}
    kw = {"use_cache": False} if _accepts(model.forward, "use_cache") else {}
    try:
        with inference():
            ref = model(input_ids=ids, attention_mask=att, **pos, **kw).logits[real].float()
            got = model(input_ids=ids, **kw).logits[real].float()
    except torch.cuda.OutOfMemoryError:
        raise  # the callers halve their batches
    except (TypeError, ValueError, AttributeError, NotImplementedError, RuntimeError):
        return _remember(_UNMASKED_OK, model, False)
    return _remember(_UNMASKED_OK, model, _close(got, ref, model, 1e-4))


def _target_logprobs(model: Any, input_ids: Any, attention_mask: Any, b_idx: Any, p_idx: Any,
                     targets: Any, **kw: Any) -> Any:
    """``log softmax(logits[b, p])[t]`` for each (b, p, t): the head runs only on those rows
    (when the split is verified), in chunks of :data:`HEAD_CHUNK_ROWS`; float32 softmax.
    ``kw`` (``position_ids``, ``use_cache``) go to the forward pass."""
    split = split_verified(model, input_ids, attention_mask, **kw)
    if split is not None:
        encoder, head = split
        hidden = encoder(input_ids, attention_mask, **kw)
        hidden = hidden[b_idx.to(hidden.device), p_idx.to(hidden.device)]
        return _gather_chunked(lambda sl: head(hidden[sl]), len(b_idx), targets)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, **kw).logits
    b_idx, p_idx = b_idx.to(logits.device), p_idx.to(logits.device)
    return _gather_chunked(lambda sl: logits[b_idx[sl], p_idx[sl]], len(b_idx), targets)


#: Default token budget of a causal scoring batch (:func:`causal_token_logprobs` with
#: ``batch_size=None``): sequences sorted longest first fill a batch while ``sequences x longest
#: <= budget``, so short sentences come hundreds at a time and long prompts a few, and every
#: batch's activations stay about the same size. CPU: 4096 tokens (benchmarks/causal.py, tiny
#: Llama, CPU time: 4096 and 8192 beat 128 sequences by ~8 % and 16384 by ~5 %; fewer, larger
#: batches leave the cache). CUDA: :data:`DEFAULT_TOKENS_PER_GIB_CUDA` tokens per GiB of the
#: device's memory, at least :data:`DEFAULT_TOKENS_CUDA_MIN` (512 sequences of 32 tokens), at
#: most :data:`DEFAULT_TOKENS_CUDA_MAX`; halved on out-of-memory (a real one on an H100: tests/test_gpu.py).
DEFAULT_TOKENS_CPU = 4096
DEFAULT_TOKENS_PER_GIB_CUDA = 1024
DEFAULT_TOKENS_CUDA_MIN = 16384
DEFAULT_TOKENS_CUDA_MAX = 262144


def default_token_budget(device: Any) -> int:
    """Tokens (sequences x longest, padding included) per causal scoring batch when
    ``batch_size=None``: :data:`DEFAULT_TOKENS_CPU` on CPU; on CUDA 1024 per GiB of the device's
    total memory, clamped to [16384, 262144] (an 80 GiB device: 81920); halved on out-of-memory."""
    dev_type = getattr(device, "type", str(device).split(":")[0])
    if dev_type != "cuda":
        return DEFAULT_TOKENS_CPU
    import torch

    try:
        gib = torch.cuda.get_device_properties(device).total_memory / 2 ** 30
    except (RuntimeError, AssertionError, ValueError):  # pragma: no cover - no usable CUDA device
        return DEFAULT_TOKENS_CUDA_MIN
    return int(min(DEFAULT_TOKENS_CUDA_MAX, max(DEFAULT_TOKENS_CUDA_MIN, gib * DEFAULT_TOKENS_PER_GIB_CUDA)))


def pad_token_id(tokenizer: Any) -> int:
    for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return 0


# --------------------------------------------------------------------------- primitive


def masked_token_logprobs(model: Any, tokenizer: Any, queries: Sequence[MaskedQuery], *,
                          batch_size: int | None = None, device: Any = None) -> list[np.ndarray]:
    """Masked-LM log-probabilities of the target tokens of each query.

    Parameters
    ----------
    model : transformers masked-LM (``*ForMaskedLM``), in eval mode.
    tokenizer : its tokenizer (pad token id used for padding; padding is masked out).
    queries : sequence of :class:`MaskedQuery`.
    batch_size : int, optional
        Sequences per forward pass (default :func:`~audit.backends.batching.default_batch_size`
        ``"score"``: 128 on CPU, 512 on
        CUDA; halved on CUDA out-of-memory, see :func:`audit.backends.hf.run_batched`).
    device : torch device, optional
        Default: the model's device.

    Returns
    -------
    list of float64 arrays, ``out[q][k] = log softmax(logits(queries[q].input_ids)[pos_k])[target_k]``.

    Notes
    -----
    Identical ``input_ids`` are run once. Batches hold sequences of similar length (sorted by
    length, longest first, right-padded, attention-masked), which does not change the result
    beyond float rounding.
    """
    import torch

    if not queries:
        return []
    dev = model_device(model, device)
    pad = pad_token_id(tokenizer)
    for q in queries:
        if len(q.positions) != len(q.targets):
            raise ParameterError("MaskedQuery: positions and targets differ in length")
        if any(p < 0 or p >= len(q.input_ids) for p in q.positions):
            raise ParameterError(f"MaskedQuery: position out of range for a sequence of {len(q.input_ids)} tokens")
    # unique sequences, each with the (position, target) pairs asked of it
    seq_index: dict[tuple[int, ...], int] = {}
    wanted: list[dict[tuple[int, int], None]] = []
    for q in queries:
        k = seq_index.setdefault(q.input_ids, len(seq_index))
        if k == len(wanted):
            wanted.append({})
        for p, t in zip(q.positions, q.targets):
            wanted[k].setdefault((int(p), int(t)), None)
    seqs = list(seq_index)
    order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i))

    def run(batch: list[int]) -> list[dict[tuple[int, int], float]]:
        ids, att, *_ = pad_batch([seqs[i] for i in batch], pad)
        asked = [(r, p, t) for r, i in enumerate(batch) for p, t in wanted[i]]  # (batch row, position, target)
        ids, att = ids.to(dev), att.to(dev)
        b, p, t = (torch.tensor(col, dtype=torch.long, device=dev) for col in zip(*asked))
        with inference():
            vals = _target_logprobs(model, ids, att, b, p, t).cpu().numpy()
        res: list[dict[tuple[int, int], float]] = [dict() for _ in batch]
        for (r, pos, tgt), v in zip(asked, vals):
            res[r][(pos, tgt)] = float(v)
        return res

    results = run_batched(run, order, default_batch_size(dev, "score") if batch_size is None else batch_size,
                          device=dev)
    by_seq: list[dict[tuple[int, int], float]] = [dict() for _ in seqs]
    for i, res in zip(order, results):
        by_seq[i] = res
    out = []
    for q in queries:
        d = by_seq[seq_index[q.input_ids]]
        out.append(np.array([d[(p, int(t))] for p, t in zip(q.positions, q.targets)], dtype=np.float64))
    return out


# --------------------------------------------------------------------------- CrowS-Pairs / PLL


def crows_pairs_template(ids1: Sequence[int], ids2: Sequence[int]) -> tuple[list[int], list[int]]:
    """Positions of the unmodified tokens of two token-id sequences (CrowS-Pairs ``get_span``).

    The ``'equal'`` opcodes of ``difflib.SequenceMatcher(None, ids1, ids2)`` (on the ids as
    strings, default ``autojunk`` -- as the original), in order; ``len(t1) == len(t2)``.
    """
    a = [str(x) for x in ids1]
    b = [str(x) for x in ids2]
    t1: list[int] = []
    t2: list[int] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b).get_opcodes():
        if op == "equal":
            t1.extend(range(i1, i2))
            t2.extend(range(j1, j2))
    return t1, t2


def _encode(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    enc = tokenizer(text, add_special_tokens=True, return_special_tokens_mask=True)
    return list(enc["input_ids"]), list(enc["special_tokens_mask"])


def _mask_id(tokenizer: Any) -> int:
    mid = getattr(tokenizer, "mask_token_id", None)
    if not isinstance(mid, int):
        raise ModelError("the tokenizer has no mask token; masked-LM scoring needs one")
    return mid


def _single_mask_queries(ids: list[int], positions: Sequence[int], mask_id: int) -> list[MaskedQuery]:
    out = []
    for p in positions:
        m = list(ids)
        m[p] = mask_id
        out.append(MaskedQuery(tuple(m), (p,), (ids[p],)))
    return out


def crows_pairs_pll(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], *,
                    batch_size: int | None = None, device: Any = None) -> np.ndarray:
    """CrowS-Pairs masked-LM scores of sentence pairs (Nangia et al. 2020, ``mask_unigram``).

    Parameters
    ----------
    pairs : sequence of ``(sent1, sent2)``
        In the original's order: ``(sent_more, sent_less)`` for ``stereo`` rows and
        ``(sent_less, sent_more)`` for ``antistereo`` rows (``difflib`` alignment is not
        symmetric in rare cases, so the order matters for exact agreement).

    Returns
    -------
    ndarray of shape (n, 3), float64: ``[score(sent1), score(sent2), n_masked]`` where
    ``n_masked`` is the number of unmodified non-special tokens masked in each sentence.
    Scores are unrounded; the metric rounds them (3 decimals, as the original).
    """
    mask_id = _mask_id(tokenizer)
    limit = max_sequence_length(model, tokenizer)
    queries: list[MaskedQuery] = []
    owners: list[tuple[int, int]] = []
    n_masked = np.zeros(len(pairs), dtype=np.float64)
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ParameterError(f"pairs[{i}] must be a (sent1, sent2) pair, got {pair!r}")
        (ids1, sp1), (ids2, sp2) = (_encode(tokenizer, s) for s in pair)
        _check_length(ids1, limit, pair[0])
        _check_length(ids2, limit, pair[1])
        t1, t2 = crows_pairs_template(ids1, ids2)
        keep = [(a, b) for a, b in zip(t1, t2) if not sp1[a] and not sp2[b]]
        n_masked[i] = len(keep)
        for side, ids, pos in ((0, ids1, [a for a, _ in keep]), (1, ids2, [b for _, b in keep])):
            qs = _single_mask_queries(ids, pos, mask_id)
            queries += qs
            owners += [(i, side)] * len(qs)
    lp = masked_token_logprobs(model, tokenizer, queries, batch_size=batch_size, device=device)
    out = np.zeros((len(pairs), 3), dtype=np.float64)
    out[:, 2] = n_masked
    for (i, side), v in zip(owners, lp):
        out[i, side] += float(v[0])  # Python float sum in token order, as the original
    return out


def masked_pll(model: Any, tokenizer: Any, sentences: Sequence[str], *,
               batch_size: int | None = None, device: Any = None) -> np.ndarray:
    """Pseudo-log-likelihood of each sentence (Salazar et al. 2020): every non-special token
    masked in turn, ``PLL(s) = sum_t log P(s_t | s with s_t masked)``. float64 array."""
    mask_id = _mask_id(tokenizer)
    limit = max_sequence_length(model, tokenizer)
    queries: list[MaskedQuery] = []
    owners: list[int] = []
    for i, s in enumerate(sentences):
        ids, sp = _encode(tokenizer, s)
        _check_length(ids, limit, s)
        qs = _single_mask_queries(ids, [p for p in range(len(ids)) if not sp[p]], mask_id)
        queries += qs
        owners += [i] * len(qs)
    lp = masked_token_logprobs(model, tokenizer, queries, batch_size=batch_size, device=device)
    out = np.zeros(len(sentences), dtype=np.float64)
    for i, v in zip(owners, lp):
        out[i] += float(v[0])
    return out


# --------------------------------------------------------------------------- causal LM

#: How a causal sequence starts (parameter ``start`` of :func:`continuation_loglik`).
START_MODES = ("always", "harness")
#: Padding sides of :func:`continuation_loglik` (:data:`audit.backends.batching.PADDING_SIDES`;
#: both give the same numbers: positions are computed from the attention mask).


def causal_start_id(tokenizer: Any) -> int | None:
    """The token a causal sequence starts with: BOS, else EOS (lm-evaluation-harness's
    ``prefix_token_id``), else ``None``."""
    for attr in ("bos_token_id", "eos_token_id"):
        v = getattr(tokenizer, attr, None)
        if isinstance(v, int):
            return v
    return None


def causal_prefix_id(tokenizer: Any) -> int:
    """:func:`causal_start_id`, or :class:`ModelError` when the tokenizer has neither BOS nor EOS."""
    v = causal_start_id(tokenizer)
    if v is None:
        raise ModelError("the tokenizer has neither a BOS nor an EOS token; causal log-likelihood "
                         "needs one as the prefix of each sentence")
    return v


def tokenizer_adds_start(tokenizer: Any) -> bool:
    """Whether ``tokenizer(text)`` (``add_special_tokens=True``) puts the start token first by
    itself (Llama, Mistral, Gemma tokenizers: yes; GPT-2, Qwen2: no)."""
    sid = causal_start_id(tokenizer)
    if sid is None:
        return False
    with_sp = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    without = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    return bool(with_sp) and with_sp[0] == sid and (not without or without[0] != sid)


def check_start(start: Any, what: str = "start") -> str:
    """``start`` if it is one of :data:`START_MODES`, else :class:`ParameterError` naming ``what``."""
    return schema.choice(start, what, START_MODES)


def prepends_start(tokenizer: Any, start: str = "always") -> bool:
    """Whether a non-empty context gets the start token (BOS, else EOS) put first: always with
    ``start="always"``; with ``"harness"`` only where the tokenizer adds it by itself
    (:func:`tokenizer_adds_start`; lm-evaluation-harness ``HFLM``). An empty context always gets
    it under both rules (there is nothing else to predict the first token from)."""
    check_start(start)
    return causal_start_id(tokenizer) is not None and (start == "always" or tokenizer_adds_start(tokenizer))


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _straddle_split(tokenizer: Any, prefix: str, continuation: str) -> tuple[list[int], int]:
    """When the tokens of ``prefix + continuation`` do not start with the prefix's own tokens (a
    token straddles the boundary): every token that ends inside the prefix is context, the
    straddling token goes to the continuation."""
    enc = tokenizer(prefix + continuation, add_special_tokens=False, return_offsets_mapping=True)
    n = 0
    for a, b in enc["offset_mapping"]:
        if b > len(prefix):
            break
        n += 1
    return list(enc["input_ids"]), n


#: Texts per thread below which :func:`_token_ids` makes one call (starting threads costs more).
TOKENIZE_MIN_PER_THREAD = 256

#: ``TOKENIZERS_PARALLELISM`` values with which the Rust tokenizer runs no threads of its own
#: (its own rule: ``tokenizers``' ``get_parallelism``).
_RUST_SERIAL = frozenset({"", "off", "false", "f", "no", "n", "0"})


def tokenize_threads(n_texts: int) -> int:
    """How many Python threads :func:`_token_ids` splits ``n_texts`` texts over.

    The Rust tokenizer releases the GIL in ``encode_batch``, and runs its own thread pool unless
    ``TOKENIZERS_PARALLELISM`` turns that off, as a sweep does for its processes
    (``jobs/sweep.py``: the pool must not exist when a process forks). Then the texts are split
    over as many threads as this process computes on (``torch.get_num_threads()``: a Ray worker's
    ``OMP_NUM_THREADS``, the CPUs it reserved), each tokenising its share serially, so that no
    Rust pool is started; at least :data:`TOKENIZE_MIN_PER_THREAD` texts each. Otherwise 1 (the
    Rust pool, or one CPU). On the H200 machine's 16 cores, 4,800 BBQ texts took 0.437 s on one
    thread and 0.098 s on the Rust pool, where the model scored them in 0.303 s (benchmarks/README.md).
    """
    env = os.environ.get("TOKENIZERS_PARALLELISM")
    if env is None or env.lower() not in _RUST_SERIAL:
        return 1
    import torch

    return max(1, min(torch.get_num_threads(), n_texts // TOKENIZE_MIN_PER_THREAD))


def _token_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """``tokenizer(texts, add_special_tokens=False)["input_ids"]``, through the Rust tokenizer's
    ``encode_batch`` directly when it has no truncation or padding configured (the same ids,
    without building a Python dict per text: ~10x faster on short texts; ``encode_batch_fast``,
    which skips the character offsets, where the tokenizers library has it: another ~15 %),
    split over :func:`tokenize_threads` threads (consecutive shares, joined in order)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and getattr(backend, "truncation", 1) is None and getattr(backend, "padding", 1) is None:
        encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

        def ids(part: list[str]) -> list[list[int]]:
            return [e.ids for e in encode(part, add_special_tokens=False)]

        n = tokenize_threads(len(texts))
        if n == 1:
            return ids(texts)
        from concurrent.futures import ThreadPoolExecutor

        step = -(-len(texts) // n)
        with ThreadPoolExecutor(n, thread_name_prefix="tokenize") as pool:
            parts = list(pool.map(ids, [texts[a: a + step] for a in range(0, len(texts), step)]))
        return [x for part in parts for x in part]
    return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def encode_requests(tokenizer: Any, requests: Sequence[tuple[str, str]], *,
                    start: str = "always") -> list[tuple[list[int], int]]:
    """The token sequences of ``(prefix, continuation)`` requests and their context lengths.

    Returns ``[(ids, n_context), ...]``: ``ids[:n_context]`` is the context (not scored),
    ``ids[n_context:]`` the continuation tokens scored by :func:`continuation_loglik`.

    Conventions (see :func:`continuation_loglik`): trailing whitespace of ``prefix`` moves to
    the continuation; ``prefix + continuation`` and ``prefix`` are tokenised without special
    tokens (all texts of all requests in one batched tokenizer call) and the continuation is
    what follows the prefix's tokens (lm-evaluation-harness's rule; a token straddling the
    boundary goes to the continuation); the start token (BOS, else EOS) is put first exactly
    once -- not again when the text already starts with it. ``start="harness"`` puts it first
    only when the prefix is empty or the tokenizer adds it by itself
    (lm-evaluation-harness ``HFLM.loglikelihood``).
    """
    check_start(start)
    norm: list[tuple[str, str]] = []
    for i, req in enumerate(requests):
        if not isinstance(req, (tuple, list)) or len(req) != 2:
            raise ParameterError(f"requests[{i}] must be a (prefix, continuation) pair, got {req!r}")
        prefix, cont = req
        if not isinstance(prefix, str) or not isinstance(cont, str):
            raise DataError(f"request {i} ({prefix!r}, {cont!r}): prefix and continuation must be strings")
        n_sp = len(prefix) - len(prefix.rstrip())
        if n_sp:
            prefix, cont = prefix[:-n_sp], prefix[-n_sp:] + cont
        norm.append((prefix, cont))
    texts = list(dict.fromkeys(t for p, c in norm for t in ((p + c, p) if p else (c,))))
    table = dict(zip(texts, _token_ids(tokenizer, texts))) if texts else {}
    sid = causal_start_id(tokenizer)
    prepend = prepends_start(tokenizer, start)
    out: list[tuple[list[int], int]] = []
    for prefix, cont in norm:
        if prefix == "":
            ids = list(table[cont])
            if ids and sid is not None and ids[0] == sid:
                out.append((ids, 1))  # the text starts with the start token itself: it is the context
                continue
            if sid is None:
                raise ModelError("the tokenizer has neither a BOS nor an EOS token, so the first token of "
                                 f"{_short(cont)!r} would have no context to be scored from; give a prefix")
            out.append(([sid] + ids, 1))
            continue
        whole, ctx = list(table[prefix + cont]), table[prefix]
        if whole[: len(ctx)] == list(ctx):
            n_ctx = len(ctx)
        else:
            whole, n_ctx = _straddle_split(tokenizer, prefix, cont)
        if prepend and (not whole or whole[0] != sid):
            whole, n_ctx = [sid] + whole, n_ctx + 1
        out.append((whole, n_ctx))
    return out


def encode_continuation(tokenizer: Any, prefix: str, continuation: str, *,
                        start: str = "always") -> tuple[list[int], int]:
    """:func:`encode_requests` of one request: ``(ids, n_context)``."""
    return encode_requests(tokenizer, [(prefix, continuation)], start=start)[0]


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return False


def causal_token_logprobs(model: Any, sequences: Sequence[tuple[Sequence[int], int]], *,
                          batch_size: int | None = None, device: Any = None, pad_id: int = 0,
                          padding_side: str = "right", share_prefixes: bool | None = None) -> list[np.ndarray]:
    """Per-token log-probabilities of causal sequences (the primitive of the causal scorers).

    ``sequences[i] = (ids, n_context)``; returns float64 arrays, ``out[i][k] = log softmax(
    logits(ids)[n_context + k - 1])[ids[n_context + k]]`` for every token after the context.

    Identical sequences are run once. Batches hold sequences of similar length (sorted by length,
    longest first): ``batch_size`` sequences each, or with ``batch_size=None`` as many as fit a
    token budget (:func:`default_token_budget`; sequences x longest, padding included), padded
    on ``padding_side`` with ``pad_id`` under an attention mask, with ``position_ids =
    cumsum(mask) - 1`` passed explicitly (so left padding does not shift the positions of rotary
    or learned position embeddings; models whose forward takes no ``position_ids``, e.g. ALiBi
    models, derive them from the mask). Right-padded batches run without the mask and the
    position ids where :func:`right_padding_unmasked` found that the same for this model. The LM
    head runs only on the positions that predict a scored token (see :func:`_target_logprobs`).

    Shared contexts (``share_prefixes``): sequences with the same context of two or more tokens
    (LPBS: one target prefix for every attribute; BBQ: one passage for every answer option) can
    run that context once and only their continuations after it, on its key/value cache
    (:func:`_shared_prefix_logprobs`). ``None`` (default): when that saves at least
    :data:`SHARE_MIN_SAVING` of the tokens; ``True``: whenever a context is shared; ``False``:
    never. The numbers are the same either way up to float rounding.
    """
    import torch

    schema.choice(padding_side, "padding_side", PADDING_SIDES)
    if not sequences:
        return []
    keys = [(tuple(ids), int(n_ctx)) for ids, n_ctx in sequences]
    index: dict[tuple[tuple[int, ...], int], int] = {}
    for k in keys:
        index.setdefault(k, len(index))
    uniq = list(index)
    order = sorted(range(len(uniq)), key=lambda i: (-len(uniq[i][0]), i))
    dev = model_device(model, device)
    fwd = {"use_cache": False} if _accepts(model.forward, "use_cache") else {}
    with_pos = _accepts(model.forward, "position_ids")

    def run(batch: list[int]) -> list[np.ndarray]:
        # the padded batch built with numpy masks (no per-sequence tensor: a third of this
        # function's time on short CrowS-Pairs sentences went to building it row by row)
        ids, att, real, off, _ = pad_batch([uniq[i][0] for i in batch], pad_id, padding_side)
        n_ctx = np.fromiter((uniq[i][1] for i in batch), dtype=np.int64, count=len(batch))
        col = np.arange(real.shape[1])[None, :]
        scored = real & (col >= (off + n_ctx)[:, None])
        b_np, t_np = np.nonzero(scored)  # row-major: sequence by sequence, t ascending
        counts = scored.sum(1).tolist()
        b, t = torch.from_numpy(b_np), torch.from_numpy(t_np)
        kw = dict(fwd)
        ids, att, b, t = ids.to(dev), att.to(dev), b.to(dev), t.to(dev)
        pos = positions(att) if with_pos else None
        if padding_side == "right" and right_padding_unmasked(model, ids, att, pos):
            att, pos = None, None  # causal attention alone hides the padding after each row
        if pos is not None:
            kw["position_ids"] = pos
        with inference():
            vals = _target_logprobs(model, ids, att, b, t - 1, ids[b, t], **kw).double().cpu().numpy()
        out, k = [], 0
        for c in counts:
            out.append(vals[k: k + c])
            k += c
        return out

    size = default_batch_size(dev, "score") if batch_size is None else batch_size
    by_uniq: list[np.ndarray] = [np.zeros(0)] * len(uniq)
    groups = _prefix_groups(uniq) if share_prefixes is not False else {}
    if groups and share_prefixes is None:
        saved = sum((len(g) - 1) * len(ctx) for ctx, g in groups.items())
        if saved < SHARE_MIN_SAVING * sum(len(s) for s, _ in uniq):
            groups = {}
    if groups:
        # contexts and continuations by count (128 on CPU): filling the token budget here was slower
        # (BBQ, 2000 items: 3.78 vs 3.53 s CPU; more, smaller cache copies)
        shared = _shared_prefix_logprobs(model, uniq, groups, size, dev, int(pad_id))
        if shared is not None:
            for i, v in shared.items():
                by_uniq[i] = v
            order = [i for i in order if i not in shared]
    if batch_size is None:  # a token budget: short sequences many at a time, long ones few
        res = run_batched(run, order, default_token_budget(dev), device=dev, lengths=[len(uniq[i][0]) for i in order])
    else:
        res = run_batched(run, order, size, device=dev)
    for i, v in zip(order, res):
        by_uniq[i] = v
    return [by_uniq[index[k]] for k in keys]


#: Prefix sharing is used (``share_prefixes=None``) when it saves at least this fraction of the
#: tokens a plain pass would run. The two sentences of a CrowS-Pairs pair share 17 % of their tokens
#: (the revised English set on the tiny Llama's tokenizer: a common start of 21 % of the longer
#: sentence, median); run as the common start scored once plus both sentences' rest on its cache, on
#: this path, the pairs took 0.61-0.76 CPU-s against 0.51-0.57 for the plain pass
#: (``causal_token_logprobs``, 3354 sentences, one thread, 2026-11-27): the cache copies cost more
#: than the tokens saved, so pairs are not grouped.
SHARE_MIN_SAVING = 0.25

_SHARE_OK: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def _prefix_groups(uniq: list[tuple[tuple[int, ...], int]]) -> dict[tuple[int, ...], list[int]]:
    """Context token tuple -> the sequences that continue it, for contexts of two or more tokens
    shared by two or more sequences (the only ones worth computing once)."""
    by_ctx: dict[tuple[int, ...], list[int]] = {}
    for i, (s, n_ctx) in enumerate(uniq):
        if n_ctx >= 2:
            by_ctx.setdefault(s[:n_ctx], []).append(i)
    return {c: g for c, g in by_ctx.items() if len(g) >= 2}


def _full_attention_only(model: Any) -> bool:
    """Whether every attention layer of ``model`` sees the whole cache: no sliding window, chunked
    attention or other layer type in its config. Windows are counted in cache positions, so a
    context padded on the right would move its own tokens away from its continuation's."""
    cfg = getattr(model, "config", None)
    if getattr(cfg, "sliding_window", None) is not None or getattr(cfg, "attention_chunk_size", None):
        return False
    types = getattr(cfg, "layer_types", None)
    return not types or all(t == "full_attention" for t in types)


def _shared_prefix_logprobs(model: Any, uniq: list[tuple[tuple[int, ...], int]],
                            groups: dict[tuple[int, ...], list[int]], batch_size: int, dev: Any,
                            pad_id: int) -> dict[int, np.ndarray] | None:
    """Per-token log-probabilities of the sequences in ``groups``, each context run once.

    Contexts (batched) run through the base model with a key/value cache; the head on each
    context's last state scores the first continuation token. The continuations (minus their last
    token) then run on copies of the cache expanded to one row per continuation
    (``Cache.reorder_cache``), attention mask = context mask + continuation mask, positions
    continuing the context's; the head scores the following tokens. Contexts are padded on the
    right (the padding then sits between a context and its continuation, masked) and run without
    the mask where :func:`right_padding_unmasked` allows, so the longest pass takes the causal
    attention kernel (EsBBQ's first 2000 items on the tiny Llama, ``benchmarks/bbq.py --vs``:
    1.14-1.19x; the contexts' attention 1.10 → 0.78 CPU-s); on the left, under the mask, for a model
    with windowed attention layers (:func:`_full_attention_only`). The same
    numbers as one pass per sequence, up to float rounding: checked once per model against the
    plain pass on two sequences, one of the first batch's longest context and one of its shortest
    (2e-4 absolute in float32, 5e-2 in half precision) -- a model
    that disagrees or cannot (no cache, no position ids, no verified head split) returns
    ``None`` and everything runs the plain way.
    """
    import copy

    import torch

    if _SHARE_OK.get(model) is False:
        return None
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if prefix else None
    if base is None or not _accepts(base.forward, "past_key_values") or not _accepts(base.forward, "position_ids"):
        return None
    ctxs = sorted(groups, key=lambda c: (-len(c), c))
    side = "right" if _full_attention_only(model) else "left"
    out: dict[int, np.ndarray] = {}
    head = None
    cfg = getattr(model, "config", None)
    n_positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    try:
        for a in range(0, len(ctxs), batch_size):
            cb = ctxs[a: a + batch_size]
            ids, att, _, _, lens = pad_batch(cb, pad_id, side)
            ids, att = ids.to(dev), att.to(dev)
            pos = positions(att)
            ends = torch.from_numpy(lens).to(dev)  # each context's length: its continuation's first position
            with inference():
                if head is None:
                    split = split_verified(model, ids, att, position_ids=pos, use_cache=False)
                    if split is None:
                        return None
                    head = split[1]
                if side == "right" and right_padding_unmasked(model, ids, att, pos):
                    o = base(input_ids=ids, use_cache=True)
                else:
                    o = base(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True)
                col = ends - 1 if side == "right" else torch.full_like(ends, ids.shape[1] - 1)
                last = o.last_hidden_state[torch.arange(len(cb), device=dev), col]
                cache = o.past_key_values
                members = [(r, i) for r, c in enumerate(cb) for i in groups[c]]
                # first continuation token: from the context's last state
                rows = torch.tensor([r for r, _ in members], device=dev)
                firsts = torch.tensor([uniq[i][0][uniq[i][1]] for _, i in members], device=dev)
                rows = rows.to(last.device)
                first_lp = _gather_chunked(lambda sl: head(last[rows[sl]]), len(members), firsts)
                first_lp = first_lp.double().cpu().numpy()
                rest: dict[int, np.ndarray] = {}
                longer = sorted([m for m in members if len(uniq[m[1]][0]) - uniq[m[1]][1] > 1],
                                key=lambda m: -(len(uniq[m[1]][0]) - uniq[m[1]][1]))
                for b0 in range(0, len(longer), batch_size):
                    mb = longer[b0: b0 + batch_size]
                    conts = [uniq[i][0][uniq[i][1]:] for _, i in mb]
                    q_ids, q_att, *_ = pad_batch([q[:-1] for q in conts], pad_id)
                    Lq = q_ids.shape[1]
                    sel = torch.tensor([r for r, _ in mb], device=dev)
                    c2 = copy.deepcopy(cache)
                    c2.reorder_cache(sel)
                    q_ids, q_att = q_ids.to(dev), q_att.to(dev)
                    full_att = torch.cat([att[sel], q_att], dim=1)
                    q_pos = ends[sel][:, None] + torch.arange(Lq, device=dev)[None, :]
                    if n_positions:  # padding after a short continuation may pass the model's last
                        q_pos = q_pos.clamp(max=n_positions - 1)  # position (learned positions): masked anyway
                    h = base(input_ids=q_ids, attention_mask=full_att, position_ids=q_pos, past_key_values=c2,
                             use_cache=True).last_hidden_state
                    bi = [r for r, q in enumerate(conts) for _ in range(len(q) - 1)]
                    ti = [k for q in conts for k in range(len(q) - 1)]
                    tg = torch.tensor([q[k + 1] for q in conts for k in range(len(q) - 1)], device=dev)
                    hb = h[torch.tensor(bi, device=h.device), torch.tensor(ti, device=h.device)]
                    vals = _gather_chunked(lambda sl: head(hb[sl]), len(bi), tg).double().cpu().numpy()
                    k = 0
                    for (_, i), q in zip(mb, conts):
                        rest[i] = vals[k: k + len(q) - 1]
                        k += len(q) - 1
                for (_, i), f in zip(members, first_lp):
                    out[i] = np.concatenate([[f], rest.get(i, np.zeros(0))])
    except torch.cuda.OutOfMemoryError:  # the plain path halves its batches on OOM: leave it to that
        torch.cuda.empty_cache()
        return None
    except (TypeError, ValueError, AttributeError, NotImplementedError, RuntimeError):
        _remember(_SHARE_OK, model, False)  # this model cannot run on a cache as done here: plain passes only
        return None
    if model not in _SHARE_OK:
        ok = True
        # a continuation of the first batch's longest context and one of its shortest (the row
        # with the most padding, where the padding could matter)
        for i0 in sorted({groups[ctxs[0]][0], groups[ctxs[:batch_size][-1]][-1]}):
            s, n_ctx = uniq[i0]
            with inference():
                ids = torch.tensor([s], device=dev)
                lp = torch.log_softmax(model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].float(), -1)
                ref = np.array([float(lp[t - 1, s[t]]) for t in range(n_ctx, len(s))])
            ok = ok and _close(torch.from_numpy(out[i0]), torch.from_numpy(ref), model, 2e-4)
        if not _remember(_SHARE_OK, model, ok):
            return None
    return out


def continuation_loglik(model: Any, tokenizer: Any, requests: Sequence[tuple[str, str]],
                        batch_size: int | None = None, device: Any = None, *,
                        padding_side: str = "right", start: str = "always",
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Log-probability of each continuation given its prefix under a causal LM (public, stable).

    ``ll_i = log P(continuation_i | prefix_i) = sum_{t in C_i} log P(x_t | x_<t)`` where ``x``
    is the request's token sequence (:func:`encode_continuation`) and ``C_i`` the positions of
    the continuation's tokens: every continuation token is scored, each given everything before
    it (chain rule, so a multi-token continuation gets its joint probability).

    Parameters
    ----------
    model : a transformers causal LM (``*ForCausalLM``/``*LMHeadModel``), in eval mode.
    tokenizer : its fast tokenizer. A pad token is not needed (padding is built here).
    requests : sequence of ``(prefix, continuation)`` strings. ``prefix`` may be empty: the
        continuation is then scored from the start token alone (lm-evaluation-harness's
        ``loglikelihood("", s)``, how CrowS-Pairs scores a sentence).
    batch_size : sequences per forward pass; default (``None``) a token budget instead
        (:func:`default_token_budget`: 4096 tokens a batch on CPU, scaled to the memory on CUDA),
        halved on CUDA out-of-memory.
    device : torch device (default: the model's).
    padding_side : ``"right"`` (default) or ``"left"``; the numbers are the same (float
        rounding aside): positions come from the attention mask, not from the padded layout.
    start : ``"always"`` (default): every sequence starts with the start token (BOS, else EOS),
        exactly once, whether or not the tokenizer adds it, so the first token of a text is
        always predicted from the start token as in pre-training. ``"harness"``: as
        lm-evaluation-harness ``HFLM.loglikelihood``: the start token only for an empty prefix
        or when the tokenizer adds it itself (identical to ``"always"`` for Llama/Mistral/Gemma
        tokenizers and for empty prefixes; GPT-2 and Qwen2 contexts then start without it).

    Returns
    -------
    ``(ll, n_tokens)``: float64 sums of the continuation tokens' log-probabilities and int64
    numbers of scored tokens, in request order.

    Conventions
    -----------
    * Trailing whitespace of a prefix moves to the continuation (``("He is ", "kind")`` is
      scored as ``("He is", " kind")``), as lm-evaluation-harness does, so byte-level BPE
      tokenizers see the word with its leading space.
    * The whole text ``prefix + continuation`` is tokenised once without special tokens; the
      continuation is the tokens after the prefix's own tokens (a token straddling the boundary
      belongs to the continuation).
    * Never a doubled start token: a text that already begins with it (typed by the caller) uses
      that one. No chat template is ever applied: the text is scored as given.
    * A tokenizer with neither BOS nor EOS: an empty prefix is refused (:class:`ModelError`);
      with a prefix, its first token is the context of the rest.
    * A sequence longer than the model accepts (:func:`max_sequence_length`) is refused with
      :class:`DataError` naming the request; nothing is truncated. An empty continuation is a
      :class:`DataError` too.
    * float32 ``log_softmax`` even for half-precision models; sums in float64. A non-finite result
      (a half-precision overflow) is a :class:`ModelError` naming the request, never a NaN.
    * Identical token sequences are run once; batches are sorted by length; the LM head runs only
      on the positions that predict continuation tokens.
    """
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise ParameterError(f"requests: expected a list of (prefix, continuation) pairs, got {type(requests).__name__}")
    limit = max_sequence_length(model, tokenizer)
    seqs = encode_requests(tokenizer, requests, start=start)
    for i, ((ids, n_ctx), (prefix, cont)) in enumerate(zip(seqs, requests)):
        if len(ids) <= n_ctx or len(ids) > limit:
            what = f"request {i} ({_short(str(prefix) + str(cont))!r})"
            if len(ids) <= n_ctx:
                raise DataError(f"{what}: the continuation {cont!r} has no tokens to score")
            raise DataError(f"{what} has {len(ids)} tokens; the model accepts at most {limit}")
    lp = causal_token_logprobs(model, seqs, batch_size=batch_size, device=device, pad_id=pad_token_id(tokenizer),
                               padding_side=padding_side)
    ll = np.array([float(v.sum()) for v in lp], dtype=np.float64)
    n = np.array([len(v) for v in lp], dtype=np.int64)
    bad = np.flatnonzero(~np.isfinite(ll))
    if len(bad):
        i = int(bad[0])
        dtype = getattr(next(iter(model.parameters()), None), "dtype", "?")
        raise ModelError(f"the model gave a non-finite log-probability ({ll[i]}) for request {i} "
                         f"({_short(str(requests[i][0]) + str(requests[i][1]))!r}) and {len(bad) - 1} more; "
                         f"dtype {str(dtype).replace('torch.', '')}: try float32")
    return ll, n


def causal_loglik(model: Any, tokenizer: Any, sentences: Sequence[str], *,
                  batch_size: int | None = None, device: Any = None, padding_side: str = "right",
                  return_counts: bool = False, start: str = "always") -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Log-likelihood of each sentence under a causal LM, given the start token.

    ``ll(s) = sum_{t=1..n} log P(x_t | start, x_1..x_{t-1})`` with ``x = tokenizer(s,
    add_special_tokens=False)`` and ``start`` = BOS (EOS if no BOS): lm-evaluation-harness's
    ``loglikelihood("", s)`` (:func:`continuation_loglik` with an empty prefix). Every token of
    the sentence is scored; if the text already starts with the start token, that token is the
    context and is not scored (the harness does the same).

    ``start`` (``"always"`` | ``"harness"``) is accepted for the families' uniform start-token
    option; both rules put the start token before an empty context, so the numbers are the same.

    Returns float64 ``ll`` (and the number of scored tokens with ``return_counts=True``).
    """
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise ParameterError(f"sentences: expected a list of strings, got {type(sentences).__name__}")
    for i, s in enumerate(sentences):
        if not isinstance(s, str) or not s.strip():
            raise DataError(f"sentence {i} {s!r}: expected a non-empty string")
    try:
        ll, n = continuation_loglik(model, tokenizer, [("", s) for s in sentences], batch_size=batch_size,
                                    device=device, padding_side=padding_side, start=start)
    except DataError as e:  # name the sentence, not the request
        raise DataError(str(e).replace("request ", "sentence ", 1)) from None
    return (ll, n) if return_counts else ll


# --------------------------------------------------------------------------- masked LM, text level


def span_pll(model: Any, tokenizer: Any, requests: Sequence[tuple[str, str]], *,
             batch_size: int | None = None, device: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Pseudo-log-likelihood of each continuation given its prefix under a masked LM: the text
    ``prefix + continuation`` is tokenised once (special tokens added); every token overlapping the
    continuation's characters (its leading white space excluded) is masked in turn and
    ``log P(token | everything else)`` summed (Salazar et al. 2020, restricted to the continuation).
    Returns ``(scores float64, n_tokens int64)``; a text longer than the model accepts is a
    :class:`DataError` naming the request."""
    limit = max_sequence_length(model, tokenizer)
    mask_id = _mask_id(tokenizer)
    queries: list[MaskedQuery] = []
    owners: list[int] = []
    n_tok = np.zeros(len(requests), dtype=np.int64)
    for r, (prefix, cont) in enumerate(requests):
        text = prefix + cont
        start = len(prefix) + (len(cont) - len(cont.lstrip()))
        ids, (pos,) = token_spans(tokenizer, text, [(start, len(text))])
        if len(ids) > limit:
            raise DataError(f"request {r} ({_short(text)!r}) has {len(ids)} tokens; the model accepts at most {limit}")
        n_tok[r] = len(pos)
        for p in pos:
            m = list(ids)
            m[p] = mask_id
            queries.append(MaskedQuery(tuple(m), (p,), (ids[p],)))
            owners.append(r)
    lp = masked_token_logprobs(model, tokenizer, queries, batch_size=batch_size, device=device)
    out = np.zeros(len(requests), dtype=np.float64)
    for r, v in zip(owners, lp):
        out[r] += float(v[0])
    return out, n_tok


def masked_span_logprobs(model: Any, tokenizer: Any,
                         requests: Sequence[tuple[str, tuple[int, int], Sequence[tuple[int, int]]]], *,
                         batch_size: int | None = None, device: Any = None) -> list[np.ndarray]:
    """Masked-LM log-probabilities of the tokens of a chosen span, masked together (Kurita et al. 2019).

    Each request is ``(text, scored, also_masked)``: the text is tokenised once with special tokens;
    the tokens overlapping the character span ``scored`` and those overlapping each span of
    ``also_masked`` are replaced by the mask token, and the log-probabilities of the original
    tokens at the scored positions are returned (one float32 array per request, in token order).
    A text longer than the model accepts is a :class:`DataError` naming it."""
    limit = max_sequence_length(model, tokenizer)
    mask_id = _mask_id(tokenizer)
    queries = []
    for text, scored, also in requests:
        ids, (tpos, *others) = token_spans(tokenizer, text, [tuple(scored), *[tuple(a) for a in also]])
        if len(ids) > limit:
            raise DataError(f"sentence {text!r} has {len(ids)} tokens; the model accepts at most {limit}")
        m = list(ids)
        for p in [*tpos, *(p for o in others for p in o)]:
            m[p] = mask_id
        queries.append(MaskedQuery(tuple(m), tuple(tpos), tuple(ids[p] for p in tpos)))
    return masked_token_logprobs(model, tokenizer, queries, batch_size=batch_size, device=device)
