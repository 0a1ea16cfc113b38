"""Test definitions (word sets, templates, sentence sets) and where they come from.

A *test* (``WordTest``) names two or more target sets and two or more attribute sets, its
language, its provenance and its licence. Readers for the native YAML format and for the BIAS
Detection Framework's WEAT ``.txt`` format, and the registry of the tests shipped under
``datasets/``, live in :mod:`audit.datasets`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

import pandas as pd


@dataclasses.dataclass(frozen=True)
class WordSet:
    """A named list of words (or multi-word entries, space separated)."""

    name: str
    words: tuple[str, ...]


#: The two sides of a word test.
SIDES = ("targets", "attributes")


@dataclasses.dataclass(frozen=True)
class WordTest:
    """One bias test.

    name:       registered name (``weat1``, ``de/cw1``) or the file stem for ad-hoc files.
    language:   ISO 639-1 code (``en``, ``de``, ``nl``, ``it``, ``nb``, ``is``, ``tr``, ``fr``).
    targets:    target sets, X first then Y (WEAT needs exactly two).
    attributes: attribute sets, A first then B (WEAT needs exactly two).
    provenance: where the lists come from (paper, translation of which test, new).
    licence:    licence of the lists.
    source:     the file it was read from ("" when built in code).
    templates:  optional templates by use, e.g. ``{"seat": {"singular": [...], "plural": [...]},
                "lpbs": {...}}``, placeholders ``WORD``/``TARGET``/``ATTRIBUTE``.
    sentences:  optional sentence sets for SEAT by role and index, e.g.
                ``{"targets": [[...], [...]], "attributes": [[...], [...]]}``.
    extra:      any further documented fields of the file (forms, description, ...).
    groups:     which side holds the protected groups (``"targets"`` or ``"attributes"``): the
                social groups whose association is measured, the other side being the words
                measured. Asymmetric metrics (SAME, Direct Bias, Cramér's V, RND, RNSB, MAC, ECT,
                RIPA) take their group sets from this side unless a task's ``groups`` parameter
                overrides it. ``groups_reason`` says why (native files must give one).
    """

    name: str
    language: str
    targets: tuple[WordSet, ...]
    attributes: tuple[WordSet, ...]
    provenance: str = ""
    licence: str = ""
    source: str = ""
    templates: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)
    sentences: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)
    groups: str = "targets"
    groups_reason: str = dataclasses.field(default="", compare=False)

    def canonical(self) -> dict[str, Any]:
        """Everything that changes a test's numbers, as a JSON-able dict (no source path)."""
        return {
            "name": self.name,
            "language": self.language,
            "targets": [[s.name, list(s.words)] for s in self.targets],
            "attributes": [[s.name, list(s.words)] for s in self.attributes],
            "templates": self.templates,
            "sentences": self.sentences,
            "groups": self.groups,
        }

    def digest(self) -> str:
        """``sha256:<hex>`` of the canonical JSON form: the dataset digest recorded with results."""
        blob = json.dumps(self.canonical(), sort_keys=True, ensure_ascii=False).encode("utf-8")
        return "sha256:" + hashlib.sha256(blob).hexdigest()


def _table_digest(table: Any) -> str:
    """``sha256:<hex>`` of a table's content (pandas' row hashes, index included). Cells holding
    lists or tuples (answer groups) are hashed through their JSON text."""
    t = table
    if isinstance(t, pd.DataFrame):
        obj = [c for c in t.columns if t[c].dtype == object
               and any(isinstance(v, (list, tuple, dict)) for v in t[c].head(50))]
        if obj:
            t = t.copy()
            for c in obj:
                t[c] = [json.dumps(v, ensure_ascii=False, sort_keys=True) if isinstance(v, (list, tuple, dict))
                        else v for v in t[c]]
    h = hashlib.sha256(pd.util.hash_pandas_object(t, index=True).values.tobytes()).hexdigest()
    return "sha256:" + h


@dataclasses.dataclass(frozen=True)
class TableTest:
    """A test held as one table, one row per item (the base of the sentence-pair, completion and
    multiple-choice types below; each documents its own columns).

    name:     registered name or the file stem.
    language: ISO 639-1 code.
    source:   the file (or folder) it was read from.
    """

    name: str
    language: str
    table: Any = dataclasses.field(hash=False, compare=False)
    provenance: str = ""
    licence: str = ""
    source: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False, compare=False)
    #: ``digest()`` once computed (the table is never changed in place once read: readers build a
    #: new frame, the families derive theirs).
    _memo: dict[str, str] = dataclasses.field(default_factory=dict, init=False, repr=False, hash=False,
                                              compare=False)

    def digest(self) -> str:
        """``sha256:<hex>`` of the table's content (:func:`_table_digest`), computed once per object:
        EsBBQ's 27,000 items take 0.44 CPU-s, and a sweep's statistics workers asked for it on every
        task's result. The driver computes it before the test travels to the workers
        (:func:`jobs.plan.attach_keys`), so they receive it with the test."""
        d = self._memo.get("digest")
        if d is None:
            d = self._memo["digest"] = _table_digest(self.table)
        return d

    def copy(self) -> TableTest:
        """The same test with a table (and ``extra``) of its own: what a cache of parsed files hands
        out, so that no caller can change another's table. The digest memo is shared: the same content."""
        new = dataclasses.replace(self, table=self.table.copy(), extra=copy.deepcopy(self.extra))
        object.__setattr__(new, "_memo", self._memo)
        return new


@dataclasses.dataclass(frozen=True)
class SentencePairs(TableTest):
    """A test of paired sentences (CrowS-Pairs and its translations): one row per pair.

    table:    columns ``pair_id``, ``sent_more``, ``sent_less``, ``stereo_antistereo``
              (``stereo``/``antistereo``), ``bias_type`` (and the file's other columns).
    encoding: the text encoding the file was read with.
    """

    encoding: str = "utf-8"


@dataclasses.dataclass(frozen=True)
class CompletionTemplates(TableTest):
    """A test of sentence templates whose slot a language model completes (HONEST, Nozza et al.
    2021): one row per template (:mod:`audit.datasets.honest`).

    table:    columns ``template`` (the identity filled in, ``[M]`` marking the slot), ``raw``
              (with ``[I]`` and ``[M]``), ``identity``, ``group`` (the identity group: the
              file's ``category``, e.g. ``female``/``male``), ``number``, ``type``, ``line``
              (line of the file, the header being line 1).
    """


@dataclasses.dataclass(frozen=True)
class MultipleChoice(TableTest):
    """A multiple-choice question-answering bias test in BBQ's schema (Parrish et al. 2022): one
    row per item (:mod:`audit.datasets.bbq` maps every published layout onto it).

    table:    one row per item: ``item``, ``category``, ``question_polarity`` (``neg``/``nonneg``),
              ``context_condition`` (``ambig``/``disambig``), ``context``, ``question``, ``ans0``..
              ``ans2``, ``label``, ``unknown`` (index of the unknown option), ``groups0``..``groups2``
              (each answer's group labels), ``stereotyped_groups``, ``target`` (indices of the answers
              about a stereotyped group), ``biased`` (indices of the biased answers), ``where``
              (file and line).
    source:   ``extra["format"]`` names the published layout.
    """


@dataclasses.dataclass(frozen=True)
class OptionItems(TableTest):
    """A generic multiple-choice test for the scored-options family (:mod:`audit.measure.options`):
    one row per item.

    table:     ``item``, ``context`` (``""`` for whole-sentence options), ``option0``..
               ``option{k-1}``, ``gold`` (index of the gold or stereotyped option) and any
               per-item or per-option metadata columns (``group0``, ``category``, ...).
    n_options: k (>= 2), the same for every item.
    """

    n_options: int = 2


@dataclasses.dataclass(frozen=True)
class HeldOutText(TableTest):
    """A held-out text for language-modelling ability (perplexity, pseudo-perplexity): one row per
    sentence (:mod:`audit.measure.perplexity`).

    table: columns ``sentence`` and ``line`` (its line in the file, from 1).
    """


@dataclasses.dataclass(frozen=True)
class UnreadableTest:
    """A registered test whose file could not be read (a malformed template file, a BBQ row whose
    label is out of range, ...). A sweep plans its tasks as usual and each of them fails with
    ``error`` (one line naming the file, line and field), so the other tests go on.

    test_type: the type of test the file would hold (``None``: unknown, every type's metrics).
    """

    name: str
    language: str
    error: str
    test_type: str | None = None

    def digest(self) -> str:
        return "unreadable:" + hashlib.sha256(self.error.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class TestType:
    """A type of test object, registered once (:func:`register_test_type`): the planner, the
    listings and the readers' formats all read it from here.

    name: the key families declare (``Family.test_type``) and formats map to.
    cls:  the Python type of its test objects.
    what: how messages name its tests (``"sentence-pair tests (CrowS-Pairs)"``).
    unit: what one row of its table is, for listings (``"pairs"``); ``""`` for word tests.
    """

    name: str
    cls: type
    what: str
    unit: str = ""

    __test__ = False  # not a pytest class


#: Test type name -> :class:`TestType`.
TEST_TYPES: dict[str, TestType] = {}


def register_test_type(t: TestType) -> TestType:
    """Add a test type (a plugin may add one); a name registered twice with another class is a
    programming error."""
    old = TEST_TYPES.get(t.name)
    if old is not None and old.cls is not t.cls:
        raise ValueError(f"test type {t.name!r} is registered twice")
    TEST_TYPES[t.name] = t
    return t


for _t in (TestType("words", WordTest, "word-set tests"),
           TestType("pairs", SentencePairs, "sentence-pair tests (CrowS-Pairs)", "pairs"),
           TestType("completion", CompletionTemplates, "completion-template tests (HONEST)", "templates"),
           TestType("multiple_choice", MultipleChoice, "multiple-choice tests (BBQ)", "items"),
           TestType("options", OptionItems, "scored-option tests", "items"),
           TestType("text", HeldOutText, "held-out texts (perplexity)", "sentences")):
    register_test_type(_t)
