"""Look-up policy: how the entries of word sets become vectors.

Rules (applied by :func:`resolve_sets`, mirrored by :func:`words_needed`):

1. **Unicode.** Every entry is NFC-normalised first (always). ``strip_accents`` decomposes
   with NFKD, drops the combining marks (Unicode category ``M*``, ``unicodedata.combining``)
   and recomposes with NFC: ``"Émile" -> "Emile"``, ``"naïve" -> "naive"`` (NFKD also maps
   compatibility characters: ``"ﬁ" -> "fi"``). ``casefold`` lower-cases with ``str.lower``
   and, where it differs, also tries Python's full case folding ``str.casefold``
   (``"Straße" -> "straße"``, then ``"strasse"``): lower-cased vocabularies such as GloVe keep
   ``ß``, case-folded ones do not.
2. **Multi-word entries.** An entry is split on whitespace; an entry of several words
   (``"ice cream"``, ``"New York"``) gets the arithmetic mean of its words' vectors (float64),
   a project convention (the usual bag-of-words phrase vector). An entry with any missing
   word is missing; no phrase token (``New_York``) is tried.
3. **Order of look-up**, per word: the exact (NFC) spelling first, then the normalised forms
   (only when ``casefold``/``strip_accents`` is on) in the order ``lower``, ``casefold``.
   A form the model knows *in its vocabulary* wins over a form it can only build from
   subwords (fastText out-of-vocabulary vectors): exact in-vocabulary, normalised
   in-vocabulary, exact subword, normalised subword. An entry is reported in
   :attr:`ResolvedSet.subword` when any of its words came from subwords.
4. **Coverage.** ``coverage = found / asked`` per set (entries counted with repetition).
   A set whose missing fraction ``1 - coverage`` exceeds ``max_missing`` (strictly greater)
   raises :class:`~audit.errors.CoverageError`; a set with no entry found always raises, even
   with ``max_missing=1``. The error lists every failing set with its fraction and missing
   words.
5. **Vector checks.** A NaN/inf vector raises :class:`~audit.errors.DataError` naming the
   word; so does an all-zero vector (its cosine similarity is undefined), or a multi-word
   mean that is all zero.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from audit import schema
from audit.backends.base import Lookup, WordVectors
from audit.errors import CoverageError, DataError, ModelError, ParameterError
from audit.suites import WordSet

__all__ = ["ResolvedSet", "normalise", "candidates", "resolve_sets", "words_needed"]

#: At most this many missing words are spelled out per set in a CoverageError message.
MAX_LISTED = 50


@dataclasses.dataclass
class ResolvedSet:
    """The vectors of one word set.

    name:     the set's name.
    words:    the entries found (original spelling, in input order, repeats kept).
    vectors:  float64 array of shape (len(words), dim), row i the vector of ``words[i]``.
    missing:  the entries not found (original spelling, input order).
    subword:  the found entries built (at least in part) from subword vectors.
    coverage: len(words) / number of entries asked (vocabulary and subword-built entries).
    """

    name: str
    words: list[str]
    vectors: np.ndarray
    missing: list[str]
    subword: list[str]
    coverage: float

    @property
    def vocabulary_coverage(self) -> float:
        """The fraction of the entries asked that the model knows *in its vocabulary*:
        ``(len(words) - len(subword)) / (len(words) + len(missing))``. A fastText model that
        built every word from subwords has ``coverage`` 1.0 and vocabulary coverage 0.0."""
        n = len(self.words) + len(self.missing)
        return (len(self.words) - len(self.subword)) / n if n else 0.0


def normalise(word: str, *, casefold: bool = False, strip_accents: bool = False) -> str:
    """NFC form of ``word``; accents stripped (NFKD, combining marks dropped, NFC) and/or
    lower-cased (``str.lower``) on request.

    >>> normalise("Émile", casefold=True, strip_accents=True)
    'emile'
    """
    if not isinstance(word, str):
        raise DataError(f"word {word!r} is a {type(word).__name__}, not a string")
    w = unicodedata.normalize("NFC", word)
    if strip_accents:
        w = unicodedata.normalize(
            "NFC", "".join(c for c in unicodedata.normalize("NFKD", w) if not unicodedata.combining(c))
        )
    if casefold:
        w = w.lower()
    return w


def candidates(word: str, *, casefold: bool = False, strip_accents: bool = False) -> list[str]:
    """Spellings tried for one word, in order: NFC, then (on request) the lower-cased and the
    fully case-folded normalised forms, then, for words with a capital dotted or dotless I, the
    Turkish/Azerbaijani lower case (``İ`` -> ``i``, ``I`` -> ``ı``; Python's ``"İ".lower()`` is
    ``i`` + a combining dot, which no uncased vocabulary contains); duplicates removed.

    >>> candidates("İstanbul", casefold=True)
    ['İstanbul', 'i̇stanbul', 'istanbul']
    """
    out = [normalise(word)]
    if casefold or strip_accents:
        low = normalise(word, casefold=casefold, strip_accents=strip_accents)
        out.append(low)
        if casefold:
            out.append(unicodedata.normalize("NFC", low.casefold()))
            if "İ" in word or "I" in word:
                turkish = normalise(word.replace("İ", "i").replace("I", "ı"), casefold=True,
                                    strip_accents=strip_accents)
                out.append(turkish)
    return list(dict.fromkeys(out))


def _entries(sets: Sequence[WordSet]) -> list[WordSet]:
    if isinstance(sets, WordSet):
        raise ParameterError("sets must be a sequence of WordSet, got a single WordSet (wrap it in a list)")
    sets = list(sets)
    for s in sets:
        if not isinstance(s, WordSet):
            raise ParameterError(f"sets must hold WordSet objects, got {type(s).__name__}: {s!r}")
        if not s.words:
            raise DataError(f"word set {s.name!r} is empty")
        for i, w in enumerate(s.words):
            if not isinstance(w, str) or not w.strip():
                raise DataError(f"word set {s.name!r}: entry {i} ({w!r}) is not a non-blank string")
    return sets


def words_needed(sets: Iterable[WordSet], *, casefold: bool = False, strip_accents: bool = False) -> set[str]:
    """Every spelling :func:`resolve_sets` may look up for these sets: pass it as ``words=``
    to a static loader so it keeps exactly those rows."""
    schema.flag(casefold, "casefold")
    schema.flag(strip_accents, "strip_accents")
    out: set[str] = set()
    for s in _entries(list(sets)):
        for entry in s.words:
            for part in entry.split():
                out.update(candidates(part, casefold=casefold, strip_accents=strip_accents))
    return out


def _pick(cands: list[str], found: Lookup) -> tuple[str | None, bool]:
    """(spelling to use, via subword?) for one word; in-vocabulary spellings first."""
    for c in cands:
        if c in found.vectors and c not in found.subword:
            return c, False
    for c in cands:
        if c in found.vectors:
            return c, True
    return None, False


def _vector(model: WordVectors, found: Lookup, key: str, entry: str, set_name: str) -> np.ndarray:
    v = np.asarray(found.vectors[key], dtype=np.float64)
    where = f"model {getattr(model, 'ref', '?')!r}, word set {set_name!r}"
    if v.shape != (model.dim,):
        raise ModelError(f"{where}: the vector of {key!r} has shape {v.shape}, expected ({model.dim},)")
    if not np.isfinite(v).all():
        raise DataError(f"{where}: the vector of {key!r} (entry {entry!r}) has NaN or infinite values")
    if not v.any():
        raise DataError(
            f"{where}: the vector of {key!r} (entry {entry!r}) is all zeros: cosine undefined"
        )
    return v


def resolve_sets(
    model: WordVectors,
    sets: Sequence[WordSet],
    *,
    casefold: bool = False,
    strip_accents: bool = False,
    max_missing: float = 0.2,
    test_name: str = "",
) -> list[ResolvedSet]:
    """Look up every entry of every set (one ``model.lookup`` call) and check coverage.

    Parameters
    ----------
    model : WordVectors
    sets : sequence of WordSet
    casefold, strip_accents : bool, default False
        Also try normalised spellings after the exact one (see the module docstring).
    max_missing : float in [0, 1], default 0.2
        Largest fraction of a set's entries that may be missing.
    test_name : str
        Named in the CoverageError message.

    Returns
    -------
    list of ResolvedSet, in the order of ``sets``.

    Raises
    ------
    CoverageError
        A set misses more than ``max_missing`` of its entries, or all of them.
    DataError
        An empty set, a blank entry, a NaN/inf or all-zero vector.
    ParameterError
        ``max_missing`` outside [0, 1], non-boolean flags.
    """
    threshold = schema.number(max_missing, "max_missing", 0.0, maximum=1.0, inclusive=True)
    schema.flag(casefold, "casefold")
    schema.flag(strip_accents, "strip_accents")
    sets = _entries(sets)
    if not sets:
        raise ParameterError("sets is empty: nothing to resolve")
    plan = {
        part: candidates(part, casefold=casefold, strip_accents=strip_accents)
        for s in sets for entry in s.words for part in entry.split()
    }
    found = model.lookup(list(dict.fromkeys(c for cs in plan.values() for c in cs)))

    out: list[ResolvedSet] = []
    failures: list[str] = []
    for s in sets:
        words, rows, missing, sub = [], [], [], []
        for entry in s.words:
            vecs, via_sub = [], False
            for part in entry.split():
                key, is_sub = _pick(plan[part], found)
                if key is None:
                    break
                vecs.append(_vector(model, found, key, entry, s.name))
                via_sub |= is_sub
            else:
                v = vecs[0] if len(vecs) == 1 else np.mean(vecs, axis=0)
                if not v.any():
                    raise DataError(
                        f"model {getattr(model, 'ref', '?')!r}, word set {s.name!r}: the mean vector of "
                        f"{entry!r} is all zeros: cosine undefined"
                    )
                words.append(entry)
                rows.append(v)
                if via_sub:
                    sub.append(entry)
                continue
            missing.append(entry)
        n = len(s.words)
        frac = len(missing) / n
        if not words or frac > threshold:
            listed = ", ".join(missing[:MAX_LISTED]) + (
                f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else ""
            )
            failures.append(f"set {s.name!r} misses {len(missing)} of {n} entries ({frac:.0%}): {listed}")
        vectors = np.vstack(rows) if rows else np.zeros((0, model.dim))
        out.append(ResolvedSet(s.name, words, vectors, missing, sub, len(words) / n))
    if failures:
        test = f"test {test_name!r}" if test_name else "test"
        raise CoverageError(
            f"{test}, model {getattr(model, 'ref', '?')!r}: " + "; ".join(failures)
            + f" (max_missing={threshold:g}; a set with no entry found always fails)"
        )
    return out
