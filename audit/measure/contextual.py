"""Contextual embeddings of sentences and words (the measure layer of SEAT and of word metrics
on transformers: encoders, masked LMs and decoder-only causal LMs).

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

Defaults per model kind (:data:`DEFAULT_SENTENCE_METHOD`, :data:`DEFAULT_WORD_METHOD`): SEAT
sentences ``cls`` for encoders and masked LMs (May et al.), ``weighted_mean`` for causal LMs
(SGPT); words ``target_pooled`` for every kind (the word's own subtokens, averaged over its
SEAT templates as Dusi et al. 2024 do for encoders). On a decoder a word's states see only the
text to their left: a word that opens a template is embedded from the start token alone there,
and the template average mixes such positions with later ones.

Causal LMs get their start token (BOS, else EOS, :func:`audit.measure.lm_scoring.causal_start_id`)
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
import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit.backends.base import Lookup
from audit.backends.hf import HFModel, run_batched
from audit.datasets.templates import SEAT_USE, fill_templates, fill_word
from audit.errors import DataError, ModelError, ParameterError
from audit.measure.lm_scoring import causal_start_id
from audit.suites import WordTest

__all__ = [
    "METHODS",
    "DEFAULT_SENTENCE_METHOD",
    "DEFAULT_WORD_METHOD",
    "default_method",
    "embed_sentences",
    "word_embeddings",
    "ContextualWordVectors",
    "locate_word",
    "seat_sentences",
    "seat_vectors",
]

METHODS = ("cls", "target_first", "target_pooled", "mean", "weighted_mean", "last")
TARGET_METHODS = ("target_first", "target_pooled")
#: Pooling of SEAT sentences when none is given, per model kind (see the module docstring).
DEFAULT_SENTENCE_METHOD = {"encoder": "cls", "mlm": "cls", "causal": "weighted_mean"}
#: Pooling of words (in their templates) when none is given, per model kind.
DEFAULT_WORD_METHOD = {"encoder": "target_pooled", "mlm": "target_pooled", "causal": "target_pooled"}
PADDING_SIDES = ("right", "left")


def default_method(kind: str, what: str = "sentence") -> str:
    """The default pooling for a model ``kind`` and ``what`` (``"sentence"`` or ``"word"``)."""
    table = DEFAULT_SENTENCE_METHOD if what == "sentence" else DEFAULT_WORD_METHOD
    return table.get(kind, "cls" if what == "sentence" else "target_pooled")

# Model types whose position ids start after the padding index (max positions - pad - 1 usable).
_PADDED_POSITIONS = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text",
                     "longformer", "roberta-prelayernorm", "bart", "mbart"}


# --------------------------------------------------------------------------- validation


def _check_method(method: str, allowed: Sequence[str] = METHODS) -> None:
    if method not in allowed:
        raise ParameterError(f"method: {method!r} is not one of {', '.join(allowed)}")


def _check_layer(m: HFModel, layer: int) -> int:
    n = m.num_hidden_layers + 1
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise ParameterError(f"layer: must be an integer, got {layer!r}")
    if not -n <= int(layer) < n:
        raise ParameterError(
            f"layer: {layer} is out of range for model {m.ref!r}, which returns {n} hidden states "
            f"(0 = embeddings .. {n - 1} = last layer; negative indices count from the end)")
    return int(layer)


def _max_tokens(m: HFModel) -> int:
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


def _check_sentences(sentences: Sequence[str], what: str = "sentences") -> list[str]:
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


def _selections(m: HFModel, sentences: list[str], enc: dict, method: str,
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


def _start_first(m: HFModel, enc: dict) -> None:
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


def embed_sentences(m: HFModel, sentences: list[str], *, method: str | None = "cls",
                    spans: list[tuple[int, int]] | None = None, layer: int = -1,
                    batch_size: int | None = 32, padding_side: str = "right") -> np.ndarray:
    """Embed sentences with a Hugging Face model.

    Parameters
    ----------
    m : HFModel
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
        mask). Results are the same either way up to float rounding.

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
    _check_method(method)
    if padding_side not in PADDING_SIDES:
        raise ParameterError(f"padding_side: {padding_side!r} is not one of {', '.join(PADDING_SIDES)}")
    causal = m.kind == "causal"
    if padding_side == "left" and not causal:
        raise ParameterError(f"padding_side: left padding is for causal LMs; model {m.ref!r} is {m.kind!r}")
    sentences = _check_sentences(sentences)
    layer = _check_layer(m, layer)
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
        width = max(lengths[i] for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        w = np.zeros((len(batch), width), dtype=np.float32)
        for r, i in enumerate(batch):
            off = width - lengths[i] if padding_side == "left" else 0
            ids[r, off: off + lengths[i]] = torch.tensor(enc["input_ids"][i], dtype=torch.long)
            mask[r, off: off + lengths[i]] = 1
            w[r] = _weights(sel[i], lengths[i], width, method, off)
        inputs = {"input_ids": ids.to(m.device), "attention_mask": mask.to(m.device)}
        if want_tt:
            inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
        if with_pos:
            inputs["position_ids"] = (mask.cumsum(1) - 1).clamp(min=0).to(m.device)
        if causal:
            inputs["use_cache"] = False
        with torch.inference_mode():
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


# --------------------------------------------------------------------------- words


def _check_words(words: Sequence[str]) -> list[str]:
    if isinstance(words, str) or not isinstance(words, Sequence):
        raise ParameterError(f"words: expected a list of strings, got {type(words).__name__}")
    for w in words:
        if not isinstance(w, str) or not w.strip() or w != w.strip():
            raise DataError(f"word {w!r}: expected a non-empty string without surrounding spaces")
    return list(words)


def _word_contexts(words: list[str], templates: Sequence[str] | None
                   ) -> list[list[tuple[str, tuple[int, int]]]]:
    """For each word, its (sentence, target span) inputs: one per template, or the bare word."""
    if templates:
        return [[fill_word(t, w) for t in templates] for w in words]
    return [[(w, (0, len(w)))] for w in words]


def _mean_over_contexts(m: HFModel, contexts: list[list[tuple[str, tuple[int, int]]]], *,
                        method: str, layer: int, batch_size: int | None) -> np.ndarray:
    """Per word, the float64 mean of its contexts' embeddings (one batched call), as float32."""
    sentences = [s for ctx in contexts for s, _ in ctx]
    spans = [sp for ctx in contexts for _, sp in ctx]
    owner = np.repeat(np.arange(len(contexts)), [len(ctx) for ctx in contexts])
    emb = embed_sentences(m, sentences, method=method, spans=spans, layer=layer,
                          batch_size=batch_size)
    sums = np.zeros((len(contexts), emb.shape[1]), dtype=np.float64)
    np.add.at(sums, owner, emb.astype(np.float64))
    counts = np.bincount(owner, minlength=len(contexts))[:, None]
    return (sums / counts).astype(np.float32)


def word_embeddings(m: HFModel, words: Sequence[str], *, templates: Sequence[str] | None = None,
                    method: str = "target_pooled", layer: int = -1,
                    batch_size: int | None = 32) -> np.ndarray:
    """One contextual vector per word, float32 of shape ``(len(words), hidden_size)``.

    With ``templates`` (strings with a ``WORD``/``TARGET``/``ATTRIBUTE`` placeholder) the
    vector is the mean over the templates of the word's embedding in the filled sentence,
    pooled by ``method`` (``target_*``: the word's subtokens; ``cls``/``mean``: the sentence);
    the mean is taken in float64. Without templates the input is the word alone between the
    tokenizer's special tokens. All inputs go through one batched :func:`embed_sentences` call.
    """
    _check_method(method)
    words = _check_words(words)
    if templates is not None:
        if isinstance(templates, str):
            raise ParameterError("templates: expected a list of template strings, got one string")
        templates = list(templates)
        for t in templates:
            if not isinstance(t, str):
                raise DataError(f"template {t!r}: expected a string")
    if not words:
        return np.zeros((0, m.hidden_size), dtype=np.float32)
    return _mean_over_contexts(m, _word_contexts(words, templates), method=method, layer=layer,
                               batch_size=batch_size)


class ContextualWordVectors:
    """A :class:`~audit.backends.base.WordVectors` view of a Hugging Face model.

    ``lookup(words)`` returns one contextual vector per word (computed once, cached), so the
    static metrics (WEAT, SAME, Direct Bias, gWEAT, Cramér's V, ...) run unchanged on
    contextual embeddings. A word whose every subtoken is the tokenizer's unknown token is
    reported missing (all such words would share one vector).

    Parameters
    ----------
    m : HFModel
    method, layer, batch_size : see :func:`word_embeddings`.
    templates : list of str, optional
        Templates with a ``WORD`` placeholder; a word's vector is the mean over them
        (:func:`word_embeddings`). Any word can be looked up.
    test : WordTest, optional
        When ``templates`` is not given: the word's vector is the mean over the word's SEAT
        sentences filled from the test's templates (``audit.datasets.fill_templates(test,
        "seat")``: articles, singular and plural forms, spans by construction). Only the
        test's words are known then; other words are reported missing.
    Neither: the bare ``<special> word <special>`` input.
    """

    def __init__(self, m: HFModel, *, method: str = "target_pooled", layer: int = -1,
                 templates: Sequence[str] | None = None, test: WordTest | None = None,
                 batch_size: int | None = None) -> None:
        _check_method(method)
        self.m = m
        self.method = method
        self.layer = _check_layer(m, layer)
        if isinstance(templates, str):
            raise ParameterError("templates: expected a list of template strings, got one string")
        self.templates = list(templates) if templates is not None else None
        self._contexts: dict[str, list[tuple[str, tuple[int, int]]]] | None = None
        if self.templates is None and test is not None:
            self._contexts = _test_word_contexts(test)
        self.batch_size = batch_size
        self.ref = m.ref
        self.backend = m.backend
        self.revision = m.revision
        self.dim = m.hidden_size
        self._cache: dict[str, np.ndarray] = {}

    def _all_unknown(self, word: str) -> bool:
        tok = self.m.tokenizer
        if tok.unk_token_id is None:
            return False
        ids = tok(word, add_special_tokens=False)["input_ids"]
        return bool(ids) and all(i == tok.unk_token_id for i in ids)

    def _known(self, word: str) -> bool:
        if word in self._cache:
            return True
        if self._contexts is not None and word not in self._contexts:
            return False
        return not self._all_unknown(word)

    def lookup(self, words: Sequence[str]) -> Lookup:
        words = [w for w in dict.fromkeys(words) if isinstance(w, str) and w.strip() and w == w.strip()]
        known = [w for w in words if self._known(w)]
        todo = [w for w in known if w not in self._cache]
        if todo:
            ctx = ([self._contexts[w] for w in todo] if self._contexts is not None
                   else _word_contexts(todo, self.templates))
            vecs = _mean_over_contexts(self.m, ctx, method=self.method, layer=self.layer,
                                       batch_size=self.batch_size)
            self._cache.update(zip(todo, vecs))
        return Lookup(vectors={w: self._cache[w] for w in known})


def _test_word_contexts(test: WordTest) -> dict[str, list[tuple[str, tuple[int, int]]]]:
    """word -> its distinct (sentence, span) SEAT template fillings in the test, in order.

    A multi-word entry (``bebek arabası``) is looked up part by part by
    :func:`audit.vocab.resolve_sets` (the mean of its parts' vectors), so each part is also
    registered with the entry's sentences and the part's own span there (a part shared by several
    entries gets the sentences of each)."""
    out: dict[str, list[tuple[str, tuple[int, int]]]] = {}

    def add(word: str, sentence: str, span: tuple[int, int]) -> None:
        ctx = out.setdefault(word, [])
        if (sentence, span) not in ctx:
            ctx.append((sentence, span))

    filled = _filled_templates(test)
    for key in ("targets", "attributes"):
        for entries in filled[key]:
            for sentence, word, span in entries:
                add(word, sentence, span)
                parts = word.split()
                if len(parts) < 2:
                    continue
                a, b = span
                pieces = [(m.start() + a, m.end() + a) for m in re.finditer(r"\S+", sentence[a:b])]
                if len(pieces) == len(parts):
                    for part, sp in zip(parts, pieces):
                        add(part, sentence, sp)
    return out


# --------------------------------------------------------------------------- SEAT


def locate_word(sentence: str, words: Sequence[str]) -> tuple[int, int] | None:
    """Character span of a set word in a sentence of a SEAT ``.jsonl`` sentence set.

    Documented rule: every word of the set is matched case-insensitively as a whole word
    (``\\b`` boundaries, Unicode-aware); the longest match wins, ties go to the leftmost.
    ``None`` when no word of the set occurs.
    """
    best: tuple[int, int] | None = None
    for w in words:
        for mt in re.finditer(r"(?<!\w)" + re.escape(w) + r"(?!\w)", sentence, flags=re.IGNORECASE):
            a, b = mt.span()
            if best is None or (b - a, -a) > (best[1] - best[0], -best[0]):
                best = (a, b)
    return best


def _set_rows(role: str, i: int, set_name: str, sentences: list[str], words: list[str | None],
              spans: list[tuple[int, int] | None], method: str) -> list[dict]:
    return [{"set": f"{role}{i}", "role": role, "set_index": i, "set_name": set_name,
             "item": j, "sentence": s, "word": w,
             "span_start": sp[0] if sp else None, "span_end": sp[1] if sp else None,
             "method": method}
            for j, (s, w, sp) in enumerate(zip(sentences, words, spans))]


def _filled_templates(test: WordTest) -> dict[str, list[list[tuple[str, str, tuple[int, int]]]]]:
    """(sentence, word, span) per set, from :func:`audit.datasets.fill_templates` (the test's own
    SEAT templates, else its language's ``templates.yaml``)."""
    filled = fill_templates(test, SEAT_USE)
    return {key: [[(e["sentence"], e["word"], tuple(e["span"])) for e in entries] for entries in filled[key]]
            for key in ("targets", "attributes")}


def seat_sentences(test: WordTest, method: str = "cls") -> pd.DataFrame:
    """The SEAT sentences of a test, one row per sentence.

    Columns: ``set`` (``target0``, ``target1``, ``attribute0``, ...), ``role``, ``set_index``,
    ``set_name``, ``item`` (row within the set), ``sentence``, ``word`` (the filled or located
    word, or ``None``), ``span_start``/``span_end`` (target character span, or ``None``),
    ``method``.

    Sources, in order: the test's sentence sets (``test.sentences``, BIAS ``.jsonl``), else
    its words filled into SEAT templates by :func:`audit.datasets.fill_templates` (the test's
    own ``templates.seat``, else its language's ``datasets/<lang>/templates.yaml``).
    For sentence sets and ``target_*`` methods, the target is located by :func:`locate_word`
    with the set's word list; a sentence where no word of its set is found raises
    :class:`DataError` (use ``cls`` or ``mean`` for such sets).
    """
    _check_method(method)
    rows: list[dict] = []
    where = test.source or test.name
    if test.sentences:
        for key, role, sets in (("targets", "target", test.targets),
                                ("attributes", "attribute", test.attributes)):
            groups = test.sentences.get(key)
            if not isinstance(groups, (list, tuple)) or not groups:
                raise DataError(f"{where}: field sentences.{key} must be a non-empty list of "
                                "sentence lists")
            for i, group in enumerate(groups):
                name = sets[i].name if i < len(sets) else f"{role}{i}"
                sents = _check_sentences(group, f"{where}: sentences.{key}[{i}]")
                if not sents:
                    raise DataError(f"{where}: sentences.{key}[{i}] is empty")
                spans: list[tuple[int, int] | None] = [None] * len(sents)
                words: list[str | None] = [None] * len(sents)
                if method in TARGET_METHODS:
                    vocab = list(sets[i].words) if i < len(sets) else []
                    for j, s in enumerate(sents):
                        sp = locate_word(s, vocab)
                        if sp is None:
                            raise DataError(
                                f"{where}: sentences.{key}[{i}][{j}] {s!r}: no word of set "
                                f"{name!r} found to locate the target for method {method!r}; "
                                "use method 'cls' or 'mean' for this sentence set")
                        spans[j], words[j] = sp, s[sp[0]:sp[1]]
                rows += _set_rows(role, i, name, sents, words, spans, method)
    else:
        filled = _filled_templates(test)
        for key, role, sets in (("targets", "target", test.targets),
                                ("attributes", "attribute", test.attributes)):
            for i, entries in enumerate(filled[key]):
                name = sets[i].name if i < len(sets) else f"{role}{i}"
                if not entries:
                    raise DataError(f"{where}: SEAT set {name!r} has no sentences")
                rows += _set_rows(role, i, name, [e[0] for e in entries], [e[1] for e in entries],
                                  [e[2] for e in entries], method)
    return pd.DataFrame(rows)


def seat_vectors(m: HFModel, test: WordTest, *, method: str | None = "cls", layer: int = -1,
                 batch_size: int | None = 32, padding_side: str = "right"
                 ) -> tuple[list[np.ndarray], list[np.ndarray], pd.DataFrame]:
    """SEAT measure step (May et al. 2019): embed every sentence of every set of a test.

    Returns ``(targets, attributes, items)``: one float32 matrix per target set and per
    attribute set (rows = the set's sentences, in file/template order) and the
    :func:`seat_sentences` table. All sentences go through one batched
    :func:`embed_sentences` call. The analysis (WEAT effect size and permutation test on
    these matrices) is :mod:`audit.metrics.weat`'s. ``method=None``: the default of the model's
    kind (:data:`DEFAULT_SENTENCE_METHOD`: ``cls``, or ``weighted_mean`` on causal LMs).
    """
    if method is None:
        method = default_method(m.kind, "sentence")
    items = seat_sentences(test, method)
    spans = None
    if method in TARGET_METHODS:
        spans = list(zip(items["span_start"].astype(int), items["span_end"].astype(int)))
    emb = embed_sentences(m, list(items["sentence"]), method=method, spans=spans, layer=layer,
                          batch_size=batch_size, padding_side=padding_side)
    targets, attributes = [], []
    for role, out in (("target", targets), ("attribute", attributes)):
        sub = items[items["role"] == role]
        for i in sorted(sub["set_index"].unique()):
            out.append(emb[sub.index[sub["set_index"] == i].to_numpy()])
    return targets, attributes, items
