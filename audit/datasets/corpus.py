"""Training text for tiny per-language models (smoke sweeps)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from audit import schema
from audit.datasets._common import (
    _TEMPLATE_FILE,
    SUPPORTED_LANGUAGES,
    _check_language,
    datasets_root,
)
from audit.datasets.registry import _scan, read_registered, stub_of
from audit.datasets.templates import LPBS_USE, lpbs_items, seat_items
from audit.errors import DataError
from audit.stats import check_int_seed
from audit.suites import WordTest

# ======================================================================================
# Training text for tiny per-language models (smoke sweeps)
# ======================================================================================

#: Punctuation split off as tokens by :func:`tokenize_sentence`.
_PUNCT_RE = re.compile(r"([.,!?;:«»\"()])")
#: Elided French/Italian clitics (l', d', qu', c', j', m', n', s', t') split from the next word.
_ELISION_RE = re.compile(r"\b([lLdDjJmMnNsStTcC]|[qQ]u)(['\u2019])(?=\w)")


def tokenize_sentence(sentence: str) -> str:
    """A sentence as space-separated tokens for whitespace tokenizers such as fastText's:
    punctuation is split off (``"Dies ist der Mann."`` -> ``"Dies ist der Mann ."``) and an
    elided clitic is split from its word (``"l'homme"`` -> ``"l' homme"``), so that the words
    of a test appear as tokens. Hyphens and inner apostrophes of words stay (``grand-père``,
    ``aujourd'hui``)."""
    s = _ELISION_RE.sub(r"\1\2 ", sentence)
    s = _PUNCT_RE.sub(r" \1 ", s)
    return " ".join(s.split())


def _word_pool(test: WordTest, has_templates: bool) -> dict[str, list[str]]:
    """Word -> the sentences of a test that contain it (SEAT fillings, LPBS sentences)."""
    pool: dict[str, list[str]] = {}
    if has_templates:
        for r in seat_items(test).itertuples(index=False):
            pool.setdefault(r.word, []).append(r.sentence)
    if test.templates.get(LPBS_USE):
        for it in lpbs_items(test):
            pool.setdefault(it.target, []).append(it.sentence)
            pool.setdefault(it.attribute, []).append(it.sentence)
    return pool


def corpus_from_tests(languages: Iterable[str] | None = None, *, seed: int, sentences_per_word: int = 20,
                      root: str | Path | None = None, tokenize: bool = True) -> dict[str, list[str]]:
    """A small training text per language, built from the shipped tests' word lists and
    templates, for training tiny local models (e.g. fastText) for smoke sweeps.

    For every registered test of a language and every word of its target and attribute sets,
    ``sentences_per_word`` sentences containing the word are drawn:

    * half (rounded up) from the word's template sentences: its SEAT sentences
      (:func:`seat_items`, every form) and the test's LPBS sentences in which it is the target
      or the attribute (:func:`lpbs_items`), sampled with replacement when there are fewer;
      a word without any template sentence gets co-occurrence sentences only;
    * the rest are co-occurrence sentences: the word and up to three other words of its own set,
      in random order, so that a model trained on the text sees the set structure the tests
      probe.

    Words shared by several tests get sentences from each. The sentences of a language are then
    shuffled. Sampling uses ``numpy.random.default_rng([seed, crc32(language)])``: the same
    seed and datasets give the same text.

    Parameters
    ----------
    languages : iterable of str, optional
        ISO 639-1 codes (default: every supported language that has tests).
    seed : int
        Seed of the sampling (required).
    sentences_per_word : int, default 20
        Sentences drawn per word and test (>= 1).
    root : str or Path, optional
        Datasets folder (default :func:`datasets_root`).
    tokenize : bool, default True
        Return :func:`tokenize_sentence` output (punctuation and elided clitics split off),
        ready for a whitespace tokenizer; ``False`` returns the sentences as written.

    Returns
    -------
    dict
        language -> list of sentences, in the order of ``languages``.

    Raises
    ------
    ParameterError
        ``seed`` is not an integer, ``sentences_per_word`` < 1.
    DataError
        An unsupported language, or a language without registered tests.
    """
    import zlib

    import numpy as np

    check_int_seed(seed)
    sentences_per_word = schema.integer(sentences_per_word, "sentences_per_word", 1)
    base = Path(root) if root is not None else datasets_root()
    qualified, _ = _scan(base)
    # word tests only: stubs (sentence pairs, templates, question answering, data elsewhere) give no words
    qualified = {k: p for k, p in qualified.items() if stub_of(p) is None}
    if languages is None:
        langs = [l for l in SUPPORTED_LANGUAGES if any(k.startswith(l + "/") for k in qualified)]
    else:
        if isinstance(languages, str):
            languages = [languages]
        langs = [_check_language(l, "corpus_from_tests", "languages") for l in languages]
    n_tpl = (sentences_per_word + 1) // 2
    out: dict[str, list[str]] = {}
    for lang in langs:
        keys = [k for k in qualified if k.startswith(lang + "/")]
        if not keys:
            raise DataError(f"corpus_from_tests: no tests for language {lang!r} in {base}")
        rng = np.random.default_rng([int(seed), zlib.crc32(lang.encode("utf-8"))])
        has_templates = (base / lang / f"{_TEMPLATE_FILE}.yaml").is_file()
        sentences: list[str] = []
        for key in keys:
            test = read_registered(qualified[key])
            if not isinstance(test, WordTest):  # sentence-pair tests have no word lists
                continue
            pool = _word_pool(test, has_templates)
            for ws in (*test.targets, *test.attributes):
                for word in ws.words:
                    own = pool.get(word, [])
                    k_tpl = n_tpl if own else 0
                    if k_tpl:
                        idx = rng.choice(len(own), size=k_tpl, replace=len(own) < k_tpl)
                        sentences += [own[i] for i in idx]
                    others = [w for w in ws.words if w != word]
                    for _ in range(sentences_per_word - k_tpl):
                        k = min(3, len(others))
                        picked = [others[i] for i in rng.choice(len(others), size=k, replace=False)] if k else []
                        words = [word, *picked]
                        sentences.append(" ".join(words[i] for i in rng.permutation(len(words))) + " .")
        order = rng.permutation(len(sentences))
        sentences = [sentences[i] for i in order]
        out[lang] = [tokenize_sentence(s) for s in sentences] if tokenize else sentences
    return out
