"""Hugging Face implementation of the model interface's ``embed`` operation: pooled hidden states of
sentences or of spans in them (SEAT, word metrics on encoders, masked LMs and decoder-only causal LMs).
Families call it through :meth:`audit.backends.hf.HFModel.embed`; the SEAT sentences and word
templates are built in :mod:`audit.measure.contextual`.

Pooling methods (``method``), computed on one hidden layer (``layer``, indexed like a Python
list over ``hidden_states``: 0 = embedding output, -1 = last layer, the default):

``cls``
    the hidden state of the first token, which must be a special token added by the tokenizer
    (``[CLS]`` for BERT, ``<s>`` for RoBERTa). This is SEAT's sentence representation for BERT
    (May et al. 2019, "On Measuring Social Biases in Sentence Encoders", NAACL, Sec. 3).
    Refused for causal LMs: their first token (BOS) attends only to itself, so its state is the
    same for every sentence.
``target_first``
    the hidden state of the first subtoken of the target word.
``target_pooled``
    the mean of the hidden states of all subtokens of the target word.
``mean``
    encoders and masked LMs: the attention-masked mean over *all* tokens of the sentence,
    special tokens included (the convention of sentence-transformers' mean pooling). Causal LMs:
    the mean over the sentence's own tokens, the start token excluded (its state is the same
    for every input, and decoders give it a very large norm -- an "attention sink" -- that would
    dominate the mean).
``weighted_mean``
    position-weighted mean over the sentence's own tokens (special tokens excluded), weight
    ``i / sum_j j`` for the i-th token (1-based): later tokens of a decoder have seen more of the
    sentence. SGPT's pooling for decoder-only models (Muennighoff 2022, "SGPT: GPT Sentence
    Embeddings for Semantic Search", arXiv:2202.08904). **The SEAT default for causal LMs.**
``last``
    the hidden state of the sentence's last token (special tokens excluded): in a decoder the one
    state that has seen the whole sentence (the pooling of cpt-text, Neelakantan et al. 2022,
    "Text and Code Embeddings by Contrastive Pre-Training", arXiv:2201.10005, on the appended
    end token of a contrastively trained model; here on the last token of the text).
``model``
    the model's own configured modules (pooling, normalisation, dense layers): sentence-transformers
    models only (:mod:`audit.backends.st`, their one method and their default); refused here.

Defaults per model kind (:data:`DEFAULT_SENTENCE_METHOD`, :data:`DEFAULT_WORD_METHOD`): SEAT
sentences ``cls`` for encoders and masked LMs (May et al.), ``weighted_mean`` for causal LMs
(SGPT), ``model`` for sentence-transformers models; words ``target_pooled`` for every Hugging Face
kind (the word's own subtokens, averaged over its SEAT templates as Dusi et al. 2024 do for
encoders), ``model`` for sentence-transformers models. On a decoder a word's states see only the
text to their left: a word that opens a template is embedded from the start token alone there,
and the template average mixes such positions with later ones.

Causal LMs get their start token (BOS, else EOS, :func:`audit.backends.hf_scoring.causal_start_id`)
put first exactly once, as the scorers do, whether or not the tokenizer adds it (Llama and
Mistral tokenizers do; GPT-2 and Qwen2 do not). No chat template is applied.

The target word is located by *character* span: ``spans[i] = (start, end)`` is the word's span
in ``sentences[i]`` (Python slice convention), and the target's subtokens are the non-special
tokens whose ``offset_mapping`` overlaps it (``tok_start < end and tok_end > start``, empty
offsets ignored). Token ids are never searched.

Batching: sentences are tokenised once, sorted by tokenised length (stable), cut into batches
padded to the longest member (``padding_side``: right by default; left for causal LMs only,
with position ids computed from the attention mask so that positions do not shift), attention
mask 0 on padding, one forward pass per batch under :func:`torch.inference_mode`, and the
original order is restored. On CPU the results equal batch-size-1 results to ~1e-6 (tests
assert 1e-5). Hidden states are cast to float32 before pooling; the returned arrays are float32.

Words (Dusi et al. 2024 convention for word-level metrics on contextual models): a word's
embedding is the mean, over its template sentences, of the target embedding of the word in
each sentence; with no templates, the bare input ``<special> word <special>`` (the tokenizer's
own special tokens) pooled by ``method``.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import numpy as np

from audit import schema
from audit.backends.batching import PADDING_SIDES, inference, pad_batch, positions, run_batched
from audit.backends.hf_scoring import causal_start_id, right_padding_unmasked
from audit.backends.table import pooling_of
from audit.errors import DataError, ModelError, ParameterError

__all__ = ["METHODS", "MODEL_METHOD", "POOLINGS", "TARGET_METHODS", "DEFAULT_SENTENCE_METHOD", "DEFAULT_WORD_METHOD",
           "PADDING_SIDES", "default_method", "check_method", "check_layer", "check_sentences", "embed_sentences", "all_unknown"]

#: The Hugging Face engine's pooling methods.
METHODS = ("cls", "target_first", "target_pooled", "mean", "weighted_mean", "last")
#: The pooling of sentence-transformers models: their configured modules (:mod:`audit.backends.st`).
MODEL_METHOD = "model"
#: Every pooling method a family may ask for (an engine refuses those it has not).
POOLINGS = (*METHODS, MODEL_METHOD)
TARGET_METHODS = ("target_first", "target_pooled")
#: Pooling of SEAT sentences when none is given, per model kind (see the module docstring).
DEFAULT_SENTENCE_METHOD = {"encoder": "cls", "mlm": "cls", "causal": "weighted_mean"}
#: Pooling of words (in their templates) when none is given, per model kind.
DEFAULT_WORD_METHOD = {"encoder": "target_pooled", "mlm": "target_pooled", "causal": "target_pooled"}


def default_method(kind: str, what: str = "sentence") -> str:
    """The default pooling for a model ``kind`` and ``what`` (``"sentence"`` or ``"word"``); a kind of
    another engine: its row's ``pooling`` in the backend table (sentence-transformers: ``model``)."""
    own = pooling_of(kind)
    if own is not None:
        return own
    table = DEFAULT_SENTENCE_METHOD if what == "sentence" else DEFAULT_WORD_METHOD
    return table.get(kind, "cls" if what == "sentence" else "target_pooled")

# Model types whose position ids start after the padding index (max positions - pad - 1 usable).
_PADDED_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                     "longformer", "roberta-prelayernorm", "bart", "mbart"}


# --------------------------------------------------------------------------- validation


def check_method(method: str, allowed: Sequence[str] = POOLINGS) -> None:
    schema.choice(method, "method", allowed)


def check_layer(m: Any, layer: int) -> int:
    n = m.num_hidden_layers + 1
    layer = schema.exact_integer(layer, "layer")
    if not -n <= layer < n:
        raise ParameterError(
            f"layer: {layer} is out of range for model {m.ref!r}, which returns {n} hidden states "
            f"(0 = embeddings .. {n - 1} = last layer; negative indices count from the end)")
    return layer


def _max_tokens(m: Any) -> int:
    """Longest input the model accepts, from the tokenizer and the position embeddings."""
    limits = []
    tml = getattr(m.tokenizer, "model_max_length", None)
    if isinstance(tml, int) and 0 < tml < 1_000_000:
        limits.append(tml)
    cfg = m.model.config
    pos = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if pos:
        if getattr(cfg, "model_type", "") in _PADDED_POSITIONS and cfg.pad_token_id is not None:
            pos = pos - cfg.pad_token_id - 1
        limits.append(int(pos))
    return min(limits) if limits else 1_000_000


def check_sentences(sentences: Sequence[str], what: str = "sentences") -> list[str]:
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise ParameterError(f"{what}: expected a list of strings, got {type(sentences).__name__}")
    out = []
    for i, s in enumerate(sentences):
        if not isinstance(s, str) or not s.strip():
            raise DataError(f"{what}[{i}]: expected a non-empty string, got {s!r}")
        out.append(s)
    return out


def _check_spans(sentences: list[str], spans: Any) -> list[tuple[int, int]]:
    if spans is None:
        raise ParameterError("spans: target_* methods need the target's character span in each sentence")
    spans = list(spans)
    if len(spans) != len(sentences):
        raise ParameterError(f"spans: {len(spans)} spans for {len(sentences)} sentences")
    out = []
    for i, (s, sp) in enumerate(zip(sentences, spans)):
        try:
            a, b = (int(sp[0]), int(sp[1]))
            ok = len(sp) == 2
        except (TypeError, ValueError, IndexError):
            ok = False
        if not ok or not 0 <= a < b <= len(s):
            raise DataError(f"spans[{i}]: {sp!r} is not a (start, end) character span inside "
                            f"sentence {s!r} (length {len(s)})")
        out.append((a, b))
    return out


# --------------------------------------------------------------------------- token selection


def _target_tokens(offsets: Sequence[tuple[int, int]], special: Sequence[int],
                   span: tuple[int, int]) -> list[int]:
    """Indices of the non-special tokens whose character offsets overlap ``span`` (an
    ``[UNK]`` produced from the text counts: it has offsets; added special tokens do not)."""
    a, b = span
    return [j for j, ((s, e), sp) in enumerate(zip(offsets, special))
            if not sp and e > s and s < b and e > a]


def _selections(m: Any, sentences: list[str], enc: dict, method: str,
                spans: list[tuple[int, int]] | None) -> list[list[int] | None]:
    """For each sentence the token indices to average (``None``: all attended tokens)."""
    out: list[list[int] | None] = []
    causal = m.kind == "causal"
    if method == "cls" and causal:
        raise ModelError(
            f"model {m.ref!r} is a causal LM: method 'cls' would take the state of its start token, "
            "which sees only itself and is the same for every sentence; use 'weighted_mean', 'mean', "
            "'last' or a target_* method")
    for i, ids in enumerate(enc["input_ids"]):
        special = enc["special_tokens_mask"][i]  # added [CLS]/[SEP]/<s>..., not [UNK] from text
        own = [j for j, sp in enumerate(special) if not sp]
        if method in ("weighted_mean", "last") or (method == "mean" and causal):
            if not own:
                raise DataError(f"sentence {sentences[i]!r} has no tokens besides special tokens")
            out.append(own[-1:] if method == "last" else own)
        elif method == "mean":
            out.append(None)
        elif method == "cls":
            if not ids or not special[0]:
                raise ModelError(
                    f"model {m.ref!r}: method 'cls' needs a tokenizer that puts a special token "
                    "([CLS], <s>) first; this one does not. Use 'mean' or a target_* method")
            out.append([0])
        else:
            assert spans is not None
            toks = _target_tokens(enc["offset_mapping"][i], special, spans[i])
            if not toks:
                a, b = spans[i]
                raise DataError(f"span {spans[i]} ({sentences[i][a:b]!r}) maps to no token of "
                                f"sentence {sentences[i]!r}")
            out.append(toks[:1] if method == "target_first" else toks)
    return out


def _weights(sel: list[int] | None, length: int, width: int, method: str = "mean", offset: int = 0) -> np.ndarray:
    """Pooling weights over the padded positions of one sentence (sum to 1); the sentence's
    tokens start at ``offset`` (left padding)."""
    w = np.zeros(width, dtype=np.float32)
    if sel is None:
        w[offset: offset + length] = 1.0 / length
    elif method == "weighted_mean":
        k = np.arange(1, len(sel) + 1, dtype=np.float64)
        w[np.asarray(sel) + offset] = (k / k.sum()).astype(np.float32)
    else:
        w[np.asarray(sel) + offset] = 1.0 / len(sel)
    return w


def _start_first(m: Any, enc: dict) -> None:
    """Causal LMs: put the start token first exactly once (in place), as the scorers do."""
    sid = causal_start_id(m.tokenizer)
    if sid is None:
        return
    for i, ids in enumerate(enc["input_ids"]):
        if ids and ids[0] == sid:
            continue
        enc["input_ids"][i] = [sid] + list(ids)
        enc["offset_mapping"][i] = [(0, 0)] + list(enc["offset_mapping"][i])
        enc["special_tokens_mask"][i] = [1] + list(enc["special_tokens_mask"][i])


# --------------------------------------------------------------------------- sentences


def embed_sentences(m: Any, sentences: list[str], *, method: str | None = "cls",
                    spans: list[tuple[int, int]] | None = None, layer: int = -1,
                    batch_size: int | None = 32, padding_side: str = "right") -> np.ndarray:
    """Embed sentences with a Hugging Face model.

    Parameters
    ----------
    m : audit.backends.hf.HFModel
        A loaded model (any kind; the base model's hidden states are used).
    sentences : list of str
    method : {"cls", "target_first", "target_pooled", "mean", "weighted_mean", "last"} or None
        Pooling (see the module docstring); ``None``: the default of the model's kind
        (:data:`DEFAULT_SENTENCE_METHOD`).
    spans : list of (int, int), optional
        Character span of the target word in each sentence; required for ``target_*``.
    layer : int, default -1
        Hidden state index (0 = embeddings, -1 = last layer).
    batch_size : int or None, default 32
        Sentences per forward pass; ``None`` = automatic (see :func:`audit.backends.hf.run_batched`,
        which also halves it on CUDA out-of-memory).
    padding_side : {"right", "left"}
        Where batches are padded; ``"left"`` only for causal LMs (position ids from the attention
        mask). Results are the same either way up to float rounding. A causal LM's right-padded
        batches run without the mask where :func:`audit.backends.hf_scoring.right_padding_unmasked`
        allows (the padding's states get zero weight).

    Returns
    -------
    ndarray of shape (n_sentences, hidden_size), float32

    Raises
    ------
    ParameterError
        Unknown method or layer, missing/mismatched spans.
    DataError
        Empty sentence, span outside its sentence or covering no token, sentence too long.
    ModelError
        ``cls`` on a tokenizer without a leading special token.
    """
    import torch

    if method is None:
        method = default_method(m.kind, "sentence")
    check_method(method)
    if method == MODEL_METHOD:
        raise ParameterError(f"method: 'model' (the configured sentence-transformers modules) needs a "
                             f"sentence-transformers model; {m.ref!r} is a Hugging Face {m.kind!r} model "
                             "(load it with the st: prefix or backend sentence-transformers)")
    schema.choice(padding_side, "padding_side", PADDING_SIDES)
    causal = m.kind == "causal"
    if padding_side == "left" and not causal:
        raise ParameterError(f"padding_side: left padding is for causal LMs; model {m.ref!r} is {m.kind!r}")
    sentences = check_sentences(sentences)
    layer = check_layer(m, layer)
    span_list = _check_spans(sentences, spans) if method in TARGET_METHODS else None
    if not sentences:
        return np.zeros((0, m.hidden_size), dtype=np.float32)

    tok = m.tokenizer
    enc = tok(sentences, add_special_tokens=True, return_offsets_mapping=True,
              return_special_tokens_mask=True, return_attention_mask=False,
              return_token_type_ids=False, truncation=False)
    if causal:
        enc = {k: [list(x) for x in enc[k]] for k in ("input_ids", "offset_mapping", "special_tokens_mask")}
        _start_first(m, enc)
    limit = _max_tokens(m)
    for i, ids in enumerate(enc["input_ids"]):
        if len(ids) > limit:
            raise DataError(f"sentence {sentences[i]!r} has {len(ids)} tokens, more than model "
                            f"{m.ref!r} accepts ({limit})")
    sel = _selections(m, sentences, enc, method, span_list)
    lengths = [len(ids) for ids in enc["input_ids"]]
    order = sorted(range(len(sentences)), key=lengths.__getitem__)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    want_tt = "token_type_ids" in getattr(tok, "model_input_names", ())
    net = getattr(m.model, "base_model", m.model)
    with_pos = causal and "position_ids" in inspect.signature(net.forward).parameters

    def forward(batch: list[int]) -> np.ndarray:
        ids, mask, _, offs, _ = pad_batch([enc["input_ids"][i] for i in batch], pad_id, padding_side)
        width = ids.shape[1]
        w = np.zeros((len(batch), width), dtype=np.float32)
        for r, i in enumerate(batch):
            w[r] = _weights(sel[i], lengths[i], width, method, int(offs[r]))
        inputs = {"input_ids": ids.to(m.device), "attention_mask": mask.to(m.device)}
        if want_tt:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        if with_pos:
            inputs["position_ids"] = positions(inputs["attention_mask"])
        if causal:
            inputs["use_cache"] = False
            if padding_side == "right" and right_padding_unmasked(m.model, inputs["input_ids"], inputs["attention_mask"],
                                                                  inputs.get("position_ids")):
                del inputs["attention_mask"]  # causal attention alone hides the padding (zero weight)
                inputs.pop("position_ids", None)
        with inference():
            out = net(**inputs, output_hidden_states=True, return_dict=True)
            hs = out.hidden_states[layer].float()
            pooled = torch.einsum("bl,blh->bh", torch.from_numpy(w).to(hs.device), hs)
        return pooled.cpu().numpy()

    rows = run_batched(forward, order, batch_size, device=m.device)
    result = np.empty((len(sentences), rows[0].shape[-1]), dtype=np.float32)
    result[order] = np.stack(rows)
    if not np.isfinite(result).all():
        bad = [sentences[i] for i in np.flatnonzero(~np.isfinite(result).all(axis=1))[:3]]
        raise ModelError(f"model {m.ref!r} produced non-finite hidden states for {bad!r} "
                         f"(dtype {m.dtype}; try dtype='float32')")
    return result




def all_unknown(m: Any, word: str) -> bool:
    """Whether every subtoken of ``word`` is the tokenizer's unknown token (such words would all
    share one vector, so word lookups report them missing)."""
    tok = m.tokenizer
    if tok.unk_token_id is None:
        return False
    ids = tok(word, add_special_tokens=False)["input_ids"]
    return bool(ids) and all(i == tok.unk_token_id for i in ids)


