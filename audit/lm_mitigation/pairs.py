"""Attribute-word tuples for debiasing language models, per language and bias type.

bias-bench (Meade, Poole-Dayan & Reddy 2022; McGill-NLP/bias-bench ``data/bias_attribute_words.json``)
uses English ``[male, female]`` pairs (gender) and triples (race, religion). biasaudit derives
its tuples from the group terms of its own shipped tests, so that every language with a suite
gets them, with provenance (the tests used and their dataset digests). The rule, per bias type
(:data:`GROUP_SETS`: the set names that hold its two groups):

* ``gender``: sets ``male_terms`` / ``female_terms`` or ``male`` / ``female``; ``age``: ``young`` /
  ``old`` (age_valence, cw2); ``nationality`` (CrowS-Pairs' name for the native / immigrant
  contrast): ``native`` / ``immigrant`` (cw3);
* a tuple is two word sets of the **same side** of a registered word test, of equal length,
  paired **by position** (the gender tests document kinship terms paired by position:
  man/woman, boy/girl, ...; for the other types the position pairs a group term with a term of
  the other group: ``teenager/senior``, ``citizen/immigrant``);
* for the bias types other than gender a pair is kept only when the test's ``forms`` mark both
  words as person nouns (``kind: person``), both are single words, and their grammatical genders
  (where the forms give both) agree, so that a swap changes the group and nothing else; the other
  pairs are listed in ``provenance["skipped"]``;
* the plural of each word, when the test's ``forms`` gives one for both words of a pair, adds a
  plural pair (``Bruder/Schwester`` -> ``Brüder/Schwestern``);
* the pairs of all such tests of a language are merged in test-name order; a word already paired
  keeps its first partner, and the conflicting pair is recorded in ``provenance["conflicts"]``.

First names (gender_career, origin_valence, WEAT 3-5) are not derived: they are not counterfactual
pairs. A language or bias type without such sets is refused with one line naming both (es and ca
ship no word test: HONEST's es identity terms are two unpaired lists); other tuples, such as
bias-bench's race and religion triples, come from a file (:func:`load_pairs`, bias-bench's JSON
format). The convention of a pair is bias-bench's: ``(male, female)``; for the other derived
types ``(first group, second group)`` in :data:`GROUP_SETS` order (``(young, old)``,
``(native, immigrant)``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.datasets._common import datasets_root
from audit.datasets.registry import _scan, read_registered, test_type
from audit.errors import DataError, ParameterError
from audit.suites import WordTest

__all__ = ["AttributePairs", "BIAS_TYPES", "GROUP_SETS", "derive_pairs", "load_pairs", "with_punctuation",
           "PUNCTUATION"]

#: Per bias type, the set names of a word test that hold its two groups' terms, paired by position.
GROUP_SETS: dict[str, tuple[tuple[str, str], ...]] = {
    "gender": (("male_terms", "female_terms"), ("male", "female")),
    "age": (("young", "old"),),
    "nationality": (("native", "immigrant"),),
}
#: The bias types :func:`derive_pairs` derives from the shipped tests.
BIAS_TYPES = tuple(GROUP_SETS)
#: bias-bench's punctuation marks glued to every attribute word for CDA (``run_mlm.py``).
PUNCTUATION = (".", ",", "?", "!", ";", ":")


@dataclass(frozen=True)
class AttributePairs:
    """Ordered attribute-word tuples of one bias type and language, with where they came from.

    ``pairs``: tuples ``(male, female)`` for gender (bias-bench's order), ``(young, old)``,
    ``(native, immigrant)``, or a file's tuples (two or more words each). ``provenance``: a dict with
    ``source`` (``"tests"`` or the file), ``tests`` (the test names used), ``digests`` (each test's
    dataset digest), ``conflicts``, ``skipped``."""

    language: str
    bias_type: str
    pairs: tuple[tuple[str, ...], ...]
    provenance: dict[str, Any] = field(default_factory=dict)

    def words(self) -> list[str]:
        """Every word of every pair, in order, without repetition."""
        return list(dict.fromkeys(w for p in self.pairs for w in p))


def _form(test: Any, word: str) -> dict[str, Any]:
    """The test's ``forms`` entry of ``word`` (``{}`` when it has none)."""
    f = ((getattr(test, "extra", None) or {}).get("forms") or {}).get(word)
    return f if isinstance(f, dict) else {}


def _plural(test: Any, word: str) -> str | None:
    p = _form(test, word).get("plural")
    return p if isinstance(p, str) else None


def _swap_problem(test: Any, a: str, b: str) -> str | None:
    """Why ``a``/``b`` is not a counterfactual pair for a bias type other than gender, or ``None``."""
    fa, fb = _form(test, a), _form(test, b)
    if fa.get("kind") != "person" or fb.get("kind") != "person":
        return "not two person nouns"
    if any(c.isspace() for c in a + b):
        return "not single words"
    if fa.get("gender") and fb.get("gender") and fa["gender"] != fb["gender"]:
        return f"grammatical genders differ ({fa['gender']}/{fb['gender']})"
    return None


def derive_pairs(language: str, bias_type: str = "gender", *, root: str | os.PathLike | None = None,
                 plurals: bool = True) -> AttributePairs:
    """Pairs of ``bias_type`` (:data:`BIAS_TYPES`) of ``language`` from its registered word tests
    (see the module docstring for the rule). Raises :class:`ParameterError` (one line naming the
    language and the bias type) for another bias type or a language whose tests have no such
    paired group terms."""
    if bias_type not in GROUP_SETS:
        raise ParameterError(f"bias_type {bias_type!r}: pairs are derived from the shipped tests for "
                             f"{', '.join(BIAS_TYPES)} only; pass a pairs file (load_pairs) instead")
    set_names = GROUP_SETS[bias_type]
    tests, _ = _scan(Path(root) if root else datasets_root())
    pairs: list[tuple[str, str]] = []
    partner: dict[str, str] = {}
    used: list[str] = []
    digests: dict[str, str] = {}
    conflicts: list[str] = []
    skipped: list[str] = []
    for name in sorted(tests):
        if not name.startswith(f"{language}/") or test_type(name) != "words":
            continue  # only word tests have group sets; the others' data (BBQ folders) is not read
        try:
            test = read_registered(tests[name])
        except DataError:
            continue  # tests whose data lives outside the project (BBQ readers); no word sets
        if not isinstance(test, WordTest):
            continue
        found = False
        for side in ("targets", "attributes"):
            sets = {s.name: s.words for s in getattr(test, side)}
            for m_name, f_name in set_names:
                if m_name not in sets or f_name not in sets or len(sets[m_name]) != len(sets[f_name]):
                    continue
                cand = list(zip(sets[m_name], sets[f_name]))
                if bias_type != "gender":
                    why = {(m, f): _swap_problem(test, m, f) for m, f in cand}
                    skipped += [f"{name}: {m}/{f} ({w})" for (m, f), w in why.items() if w]
                    cand = [p for p in cand if not why[p]]
                if plurals:
                    cand += [(pm, pf) for m, f in cand
                             if (pm := _plural(test, m)) and (pf := _plural(test, f))]
                found = found or bool(cand)
                for m, f in cand:
                    if partner.get(m) == f and partner.get(f) == m:
                        continue
                    if m in partner or f in partner:
                        conflicts.append(f"{name}: {m}/{f}")
                        continue
                    partner[m], partner[f] = f, m
                    pairs.append((m, f))
        if found:
            used.append(name)
            digests[name] = test.digest()
    if not pairs:
        sets_text = ", ".join("/".join(s) for s in set_names)
        raise ParameterError(f"language {language!r}, bias_type {bias_type!r}: no shipped word test has paired "
                             f"{bias_type} terms (same-side sets {sets_text}); pass a pairs file")
    rule = f"same-side sets {' or '.join('/'.join(s) for s in set_names)}, paired by position"
    if bias_type != "gender":
        rule += "; person nouns of one word and the same grammatical gender only"
    return AttributePairs(language, bias_type, tuple(pairs),
                          {"source": "tests", "tests": used, "digests": digests, "conflicts": conflicts,
                           "skipped": skipped, "rule": rule + (", plus plurals from forms" if plurals else "")})


def load_pairs(path: str | os.PathLike, bias_type: str, language: str = "en") -> AttributePairs:
    """Pairs (or triples) of ``bias_type`` from a JSON file in bias-bench's format
    (``{"gender": [["actor", "actress"], ...], "race": [[...3 words...]], ...}``).
    Bad files raise :class:`DataError` naming the file and the field."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{p}: cannot read attribute pairs: {e}") from None
    if not isinstance(data, dict) or bias_type not in data:
        raise DataError(f"{p}: no field {bias_type!r} (fields: {', '.join(data) if isinstance(data, dict) else '-'})")
    rows = data[bias_type]
    if not isinstance(rows, list) or not rows:
        raise DataError(f"{p}: field {bias_type!r} must be a non-empty list of word lists")
    size = len(rows[0]) if isinstance(rows[0], list) else 0
    out = []
    for i, r in enumerate(rows):
        if (not isinstance(r, list) or len(r) != size or size < 2
                or not all(isinstance(w, str) and w and not any(c.isspace() for c in w) for w in r)):
            raise DataError(f"{p}: {bias_type}[{i}] must be a list of {max(size, 2)} single words, got {r!r}")
        out.append(tuple(r))
    return AttributePairs(language, bias_type, tuple(out), {"source": str(p), "tests": [], "conflicts": []})


def with_punctuation(pairs: AttributePairs | list | tuple) -> list[tuple[str, ...]]:
    """bias-bench's CDA word list (``run_mlm.py`` ``_create_bias_attribute_words``): the pairs,
    then for each mark of :data:`PUNCTUATION` every pair with the mark glued to each word."""
    base = list(pairs.pairs if isinstance(pairs, AttributePairs) else pairs)
    out = [tuple(p) for p in base]
    for mark in PUNCTUATION:
        out += [tuple(w + mark for w in p) for p in base]
    return out
