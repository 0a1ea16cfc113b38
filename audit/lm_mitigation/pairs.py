"""Attribute-word pairs for debiasing language models, per language.

bias-bench (Meade, Poole-Dayan & Reddy 2022; McGill-NLP/bias-bench ``data/bias_attribute_words.json``)
uses English ``[male, female]`` pairs (gender) and triples (race, religion). biasaudit derives
its pairs from the group terms of its own shipped tests, so that every language with a gender
suite gets pairs, with provenance:

* a pair is two word sets of the **same side** of a registered word test, named ``male_terms`` /
  ``female_terms`` or ``male`` / ``female``, of equal length, paired **by position** (the tests
  document that these sets are kinship terms paired by position: man/woman, boy/girl, ...);
* the plural of each word, when the test's ``forms`` gives one for both words of a pair, adds a
  plural pair (``Bruder/Schwester`` -> ``Brüder/Schwestern``);
* the pairs of all such tests of a language are merged in test-name order; a word already paired
  keeps its first partner, and the conflicting pair is recorded in ``provenance["conflicts"]``.

Only gender is derived: the shipped suites have no other *paired* group terms (first names are
not counterfactual pairs; the age and origin lists are not paired by position). Other bias types
come from a file (:func:`load_pairs`, bias-bench's JSON format). The convention of a pair is
bias-bench's: ``(male, female)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.datasets._common import datasets_root
from audit.datasets.registry import _scan, read_registered
from audit.errors import DataError, ParameterError
from audit.suites import WordTest

__all__ = ["AttributePairs", "derive_pairs", "load_pairs", "with_punctuation", "PUNCTUATION"]

#: Set names that hold male / female group terms paired by position.
_GENDER_SETS = (("male_terms", "female_terms"), ("male", "female"))
#: bias-bench's punctuation marks glued to every attribute word for CDA (``run_mlm.py``).
PUNCTUATION = (".", ",", "?", "!", ";", ":")


@dataclass(frozen=True)
class AttributePairs:
    """Ordered attribute-word tuples of one bias type and language, with where they came from.

    ``pairs``: tuples ``(male, female)`` for gender (bias-bench's order). ``provenance``: a dict
    with ``source`` (``"tests"`` or the file), ``tests`` (the test names used), ``conflicts``."""

    language: str
    bias_type: str
    pairs: tuple[tuple[str, ...], ...]
    provenance: dict[str, Any] = field(default_factory=dict)

    def words(self) -> list[str]:
        """Every word of every pair, in order, without repetition."""
        return list(dict.fromkeys(w for p in self.pairs for w in p))


def _plural(test: Any, word: str) -> str | None:
    forms = (getattr(test, "extra", None) or {}).get("forms") or {}
    f = forms.get(word)
    return f.get("plural") if isinstance(f, dict) and isinstance(f.get("plural"), str) else None


def derive_pairs(language: str, bias_type: str = "gender", *, root: str | os.PathLike | None = None,
                 plurals: bool = True) -> AttributePairs:
    """Gender pairs ``(male, female)`` of ``language`` from its registered word tests (see the
    module docstring for the rule). Raises :class:`ParameterError` for another bias type or a
    language whose tests have no paired gender terms."""
    if bias_type != "gender":
        raise ParameterError(f"bias_type {bias_type!r}: only 'gender' pairs can be derived from the shipped "
                             "tests (no other paired group terms); pass a pairs file (load_pairs) instead")
    tests, _ = _scan(Path(root) if root else datasets_root())
    pairs: list[tuple[str, str]] = []
    partner: dict[str, str] = {}
    used: list[str] = []
    conflicts: list[str] = []
    for name in sorted(tests):
        if not name.startswith(f"{language}/"):
            continue
        try:
            test = read_registered(tests[name])
        except DataError:
            continue  # tests whose data lives outside the project (BBQ readers); no word sets
        if not isinstance(test, WordTest):
            continue
        found = False
        for side in ("targets", "attributes"):
            sets = {s.name: s.words for s in getattr(test, side)}
            for m_name, f_name in _GENDER_SETS:
                if m_name not in sets or f_name not in sets or len(sets[m_name]) != len(sets[f_name]):
                    continue
                found = True
                cand = list(zip(sets[m_name], sets[f_name]))
                if plurals:
                    cand += [(pm, pf) for m, f in cand
                             if (pm := _plural(test, m)) and (pf := _plural(test, f))]
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
    if not pairs:
        raise ParameterError(f"language {language!r}: no shipped word test has paired gender terms "
                             f"(sets {', '.join('/'.join(s) for s in _GENDER_SETS)}); pass a pairs file")
    return AttributePairs(language, "gender", tuple(pairs),
                          {"source": "tests", "tests": used, "conflicts": conflicts,
                           "rule": "same-side sets male_terms/female_terms or male/female, paired by position"
                                   + (", plus plurals from forms" if plurals else "")})


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
