"""Contextual embeddings of sentences and words: the measure layer of SEAT and of word metrics on
transformers (encoders, masked LMs, decoder-only causal LMs, sentence-transformers models).

Everything model-side goes through the model interface's ``embed(sentences, method, spans, layer)``
(:class:`audit.backends.base.LanguageModel`); the pooling methods, their defaults per model kind and
the conventions (start token, padding, truncation, dtype) are documented where they are implemented,
:mod:`audit.backends.hf_embed`. This module builds the inputs: SEAT sentences of a test
(:func:`seat_sentences`) and word contexts (templates, or the bare word).

Words (Dusi et al. 2024 convention for word-level metrics on contextual models): a word's
embedding is the mean, over its template sentences, of the target embedding of the word in
each sentence; with no templates, the bare input ``<special> word <special>`` (the tokenizer's
own special tokens) pooled by ``method``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit.backends.base import Lookup
from audit.backends.hf_embed import (
    DEFAULT_SENTENCE_METHOD,
    DEFAULT_WORD_METHOD,
    METHODS,
    TARGET_METHODS,
    check_layer,
    check_method,
    check_sentences,
    default_method,
)
from audit.datasets.templates import SEAT_USE, fill_templates, fill_word
from audit.errors import DataError, ParameterError
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



def embed_sentences(m: Any, sentences: list[str], *, method: str | None = "cls",
                    spans: list[tuple[int, int]] | None = None, layer: int = -1,
                    batch_size: int | None = 32, padding_side: str = "right") -> np.ndarray:
    """Embed sentences through the model interface (``m.embed``; pooling and conventions:
    :func:`audit.backends.hf_embed.embed_sentences`). float32 ``(n_sentences, dim)``."""
    return m.embed(sentences, method=method, spans=spans, layer=layer, batch_size=batch_size,
                   padding_side=padding_side)


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


def _mean_over_contexts(m: Any, contexts: list[list[tuple[str, tuple[int, int]]]], *,
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


def word_embeddings(m: Any, words: Sequence[str], *, templates: Sequence[str] | None = None,
                    method: str = "target_pooled", layer: int = -1,
                    batch_size: int | None = 32) -> np.ndarray:
    """One contextual vector per word, float32 of shape ``(len(words), hidden_size)``.

    With ``templates`` (strings with a ``WORD``/``TARGET``/``ATTRIBUTE`` placeholder) the
    vector is the mean over the templates of the word's embedding in the filled sentence,
    pooled by ``method`` (``target_*``: the word's subtokens; ``cls``/``mean``: the sentence);
    the mean is taken in float64. Without templates the input is the word alone between the
    tokenizer's special tokens. All inputs go through one batched :func:`embed_sentences` call.
    """
    check_method(method)
    words = _check_words(words)
    if templates is not None:
        if isinstance(templates, str):
            raise ParameterError("templates: expected a list of template strings, got one string")
        templates = list(templates)
        for t in templates:
            if not isinstance(t, str):
                raise DataError(f"template {t!r}: expected a string")
    if not words:
        return np.zeros((0, m.dim), dtype=np.float32)
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

    def __init__(self, m: Any, *, method: str = "target_pooled", layer: int = -1,
                 templates: Sequence[str] | None = None, test: WordTest | None = None,
                 batch_size: int | None = None) -> None:
        check_method(method)
        self.m = m
        self.method = method
        self.layer = check_layer(m, layer)
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
        self.dim = m.dim
        self._cache: dict[str, np.ndarray] = {}

    def _known(self, word: str) -> bool:
        if word in self._cache:
            return True
        if self._contexts is not None and word not in self._contexts:
            return False
        return not self.m.is_unknown_word(word)

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
    check_method(method)
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
                sents = check_sentences(group, f"{where}: sentences.{key}[{i}]")
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


def seat_vectors(m: Any, test: WordTest, *, method: str | None = "cls", layer: int = -1,
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
