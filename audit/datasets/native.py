"""The native YAML test format (``docs/datasets.md``): parse, validate, read and write."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from audit import schema
from audit.datasets._common import (
    _check_keys,
    _check_language,
    _check_unique,
    _load_yaml,
    _string_list,
    _text,
    _typename,
    _where,
)
from audit.datasets.templates import (
    LPBS_USE,
    NUMBERS,
    SEAT_USE,
    TEMPLATE_USES,
    _check_lpbs_template,
    _check_seat_template,
    _parse_forms,
)
from audit.errors import DataError
from audit.suites import SIDES, WordSet, WordTest

#: Top-level fields of a native test file, in the order :func:`to_native` writes them.
NATIVE_FIELDS = (
    "name", "language", "description", "provenance", "licence",
    "targets", "attributes", "protected_groups", "templates", "forms", "metrics",
)
#: Fields of ``protected_groups``: which side holds the social groups, and why.
GROUPS_FIELDS = ("side", "reason")
#: Fields a native test file must have.
REQUIRED_FIELDS = ("name", "language", "provenance", "licence", "targets", "attributes")
#: Fields of one word set.
SET_FIELDS = ("name", "words", "sentences")
#: Template uses and grammatical numbers.

# ======================================================================================
# Building and validating a WordTest
# ======================================================================================


def _check_sets(targets: Sequence[WordSet], attributes: Sequence[WordSet],
                sentences: Mapping[str, Any], where: str) -> None:
    """Counts, emptiness, duplicates within a set and across the sides of a pair, names."""
    if len(targets) < 1 or len(attributes) < 1:
        raise DataError(f"{where}: a test needs at least one target set and one attribute set "
                        f"(got {len(targets)} and {len(attributes)})")
    names: dict[str, str] = {}
    for role, sets in (("targets", targets), ("attributes", attributes)):
        sent = sentences.get(role) if sentences else None
        for i, s in enumerate(sets):
            field = f"{role}[{i}] ({s.name!r})"
            if s.name in names:
                raise DataError(f"{where}: set name {s.name!r} is used twice ({names[s.name]} and {field}); "
                                "set names must be unique within a test")
            names[s.name] = field
            if not s.words and not (sent and sent[i]):
                raise DataError(f"{where}: {field} is empty (no words)")
            _check_unique(s.words, where, f"{field}.words")
            if sent:
                _check_unique(sent[i], where, f"{field}.sentences", "sentence")
        for i in range(len(sets)):
            for j in range(i + 1, len(sets)):
                other = set(sets[j].words)
                common = [w for w in sets[i].words if w in other]
                if common:
                    raise DataError(
                        f"{where}: word {common[0]!r} is in both {role}[{i}] ({sets[i].name!r}) and "
                        f"{role}[{j}] ({sets[j].name!r}); the two sides of a pair must not share words"
                    )
                if sent:
                    other_s = set(sent[j])
                    both = [x for x in sent[i] if x in other_s]
                    if both:
                        raise DataError(
                            f"{where}: sentence {both[0]!r} is in both {role}[{i}] ({sets[i].name!r}) "
                            f"and {role}[{j}] ({sets[j].name!r})"
                        )


def _parse_templates_field(value: Any, where: str) -> dict[str, Any]:
    """``templates`` of a test: ``seat`` (a list, or ``{singular, plural}``) and ``lpbs``
    (``{singular, plural}``); every template must hold its placeholder(s)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DataError(f"{where}: field templates must be a mapping with keys {', '.join(TEMPLATE_USES)}")
    _check_keys(value, TEMPLATE_USES, where, "templates")
    out: dict[str, Any] = {}
    if SEAT_USE in value:
        seat = value[SEAT_USE]
        if isinstance(seat, list):
            seat = {"singular": seat}
        if not isinstance(seat, Mapping):
            raise DataError(f"{where}: field templates.seat must be a list of templates or a mapping "
                            "with keys singular, plural")
        _check_keys(seat, NUMBERS, where, "templates.seat")
        out[SEAT_USE] = {}
        for num in NUMBERS:
            if num in seat:
                lst = _string_list(seat[num], where, f"templates.seat.{num}")
                for k, t in enumerate(lst):
                    _check_seat_template(t, where, f"templates.seat.{num}[{k}]")
                _check_unique(lst, where, f"templates.seat.{num}", "template")
                out[SEAT_USE][num] = lst
        if not out[SEAT_USE]:
            raise DataError(f"{where}: field templates.seat is empty")
    if LPBS_USE in value:
        lp = value[LPBS_USE]
        if not isinstance(lp, Mapping):
            raise DataError(f"{where}: field templates.lpbs must be a mapping with keys singular, plural")
        _check_keys(lp, NUMBERS, where, "templates.lpbs")
        out[LPBS_USE] = {}
        for num in NUMBERS:
            if num in lp:
                lst = _string_list(lp[num], where, f"templates.lpbs.{num}", allow_empty=True)
                for k, t in enumerate(lst):
                    _check_lpbs_template(t, where, f"templates.lpbs.{num}[{k}]")
                _check_unique(lst, where, f"templates.lpbs.{num}", "template")
                out[LPBS_USE][num] = lst
        if not any(out[LPBS_USE].values()):
            raise DataError(f"{where}: field templates.lpbs has no templates")
    return out

def _parse_metrics(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    lst = _string_list(value, where, "metrics")
    _check_unique(lst, where, "metrics", "metric")
    return lst


def _parse_groups(value: Any, where: str) -> tuple[str, str]:
    """``protected_groups: {side: targets|attributes, reason: ...}`` -> (side, reason); absent:
    ``("targets", "")`` (the WEFE convention; shipped tests always give the field)."""
    if value is None:
        return "targets", ""
    if not isinstance(value, Mapping):
        raise DataError(f"{where}: field protected_groups must be a mapping with keys side and reason, "
                        f"got {_typename(value)} {value!r}")
    _check_keys(value, GROUPS_FIELDS, where, "protected_groups")
    side = _text(value.get("side"), where, "protected_groups.side")
    schema.choice(side, f"{where}: field protected_groups.side", SIDES, error=DataError)
    return side, _text(value.get("reason"), where, "protected_groups.reason")


def _build(*, name: str, language: str, targets: list[WordSet], attributes: list[WordSet],
           provenance: str, licence: str, source: str, templates: dict | None = None,
           sentences: dict | None = None, extra: dict | None = None, groups: str = "targets",
           groups_reason: str = "") -> WordTest:
    sentences = sentences or {}
    _check_sets(targets, attributes, sentences, _where(source))
    return WordTest(
        name=name, language=language, targets=tuple(targets), attributes=tuple(attributes),
        provenance=provenance, licence=licence, source=source,
        templates=templates or {}, sentences=sentences, extra=extra or {},
        groups=groups, groups_reason=groups_reason,
    )


# ======================================================================================
# Native YAML format
# ======================================================================================


def parse_native(data: Any, source: str | Path = "") -> WordTest:
    """Validate a native test given as a mapping (what the YAML file holds) and build it.

    Parameters
    ----------
    data : mapping
        Fields as documented in ``docs/datasets.md``: required ``name``, ``language``,
        ``provenance``, ``licence``, ``targets``, ``attributes``; optional ``description``,
        ``templates``, ``forms``, ``metrics``.
    source : str or Path
        Where the data came from, used in error messages and stored in ``WordTest.source``.

    Returns
    -------
    WordTest
        ``extra`` holds ``format`` (``"native"``), ``description``, ``forms`` (word -> forms)
        and ``metrics`` (the declared list, or ``None`` for the default).

    Raises
    ------
    DataError
        For a missing or unknown field, a wrong type, an empty set, a duplicate word, an
        unsupported language, a template without its placeholder, a form for an unknown word.
    """
    where = _where(source)
    if not isinstance(data, Mapping):
        raise DataError(f"{where}: the file must hold a mapping with fields {', '.join(NATIVE_FIELDS)}, "
                        f"got {_typename(data)}")
    _check_keys(data, NATIVE_FIELDS, where, "")
    missing = [f for f in REQUIRED_FIELDS if f not in data]
    if missing:
        raise DataError(f"{where}: missing required field {missing[0]!r} (required: {', '.join(REQUIRED_FIELDS)})")
    name = _text(data["name"], where, "name")
    language = _check_language(data["language"], where)
    description = _text(data.get("description"), where, "description", required=False)
    provenance = _text(data["provenance"], where, "provenance")
    licence = _text(data["licence"], where, "licence")

    sets: dict[str, list[WordSet]] = {}
    sent: dict[str, list[list[str]]] = {}
    for role in ("targets", "attributes"):
        value = data[role]
        if not isinstance(value, list) or not value:
            raise DataError(f"{where}: field {role} must be a non-empty list of sets {{name, words}}")
        sets[role], sent[role] = [], []
        for i, entry in enumerate(value):
            field = f"{role}[{i}]"
            if not isinstance(entry, Mapping):
                raise DataError(f"{where}: {field} must be a mapping with keys {', '.join(SET_FIELDS)}")
            _check_keys(entry, SET_FIELDS, where, field)
            if "name" not in entry:
                raise DataError(f"{where}: {field} has no name")
            sname = _text(entry["name"], where, f"{field}.name")
            field = f"{role}[{i}] ({sname!r})"
            if "words" not in entry and "sentences" not in entry:
                raise DataError(f"{where}: {field} has neither words nor sentences")
            words = _string_list(entry.get("words", []), where, f"{field}.words",
                                 allow_empty="sentences" in entry)
            sents = _string_list(entry["sentences"], where, f"{field}.sentences") if "sentences" in entry else None
            sets[role].append(WordSet(sname, tuple(words)))
            sent[role].append(sents)
    with_sent = [s is not None for r in ("targets", "attributes") for s in sent[r]]
    if any(with_sent) and not all(with_sent):
        raise DataError(f"{where}: either every set has sentences or none does "
                        "(SEAT sentence sets come in full)")
    sentences = ({r: [list(s) for s in sent[r]] for r in ("targets", "attributes")}
                 if all(with_sent) else {})

    templates = _parse_templates_field(data.get("templates"), where)
    all_words = {w for r in sets.values() for s in r for w in s.words}
    forms = _parse_forms(data.get("forms"), all_words, where)
    metrics = _parse_metrics(data.get("metrics"), where)
    groups, groups_reason = _parse_groups(data.get("protected_groups"), where)
    test = _build(
        groups=groups, groups_reason=groups_reason,
        name=name, language=language, targets=sets["targets"], attributes=sets["attributes"],
        provenance=provenance, licence=licence, source=str(source), templates=templates,
        sentences=sentences,
        extra={"format": "native", "description": description, "forms": forms, "metrics": metrics},
    )
    return test


def read_native(path: str | Path) -> WordTest:
    """Read a native YAML test file (see ``docs/datasets.md``); see :func:`parse_native`."""
    path = Path(path)
    return parse_native(_load_yaml(path), source=path)


def to_native(test: WordTest) -> dict[str, Any]:
    """The native-format mapping of a test (the inverse of :func:`parse_native`)."""
    out: dict[str, Any] = {"name": test.name, "language": test.language}
    description = test.extra.get("description") or ""
    if description:
        out["description"] = description
    out["provenance"] = test.provenance
    out["licence"] = test.licence
    for role, sets in (("targets", test.targets), ("attributes", test.attributes)):
        rows = []
        for i, s in enumerate(sets):
            row: dict[str, Any] = {"name": s.name}
            if s.words or not test.sentences:
                row["words"] = list(s.words)
            if test.sentences:
                row["sentences"] = list(test.sentences[role][i])
            rows.append(row)
        out[role] = rows
    if test.groups_reason:
        out["protected_groups"] = {"side": test.groups, "reason": test.groups_reason}
    if test.templates:
        out["templates"] = {k: ({"singular": list(t)} if isinstance(t, (list, tuple))
                                else {n: list(v) for n, v in t.items()})
                            for k, t in test.templates.items()}
    forms = test.extra.get("forms") or {}
    if forms:
        out["forms"] = {w: dict(f) for w, f in forms.items()}
    if test.extra.get("metrics") is not None:
        out["metrics"] = list(test.extra["metrics"])
    return out


def dump_native(test: WordTest) -> str:
    """The native YAML text of a test (UTF-8 safe, word lists in flow style)."""
    return yaml.safe_dump(to_native(test), allow_unicode=True, sort_keys=False,
                          default_flow_style=None, width=100)


def write_native(test: WordTest, path: str | Path) -> Path:
    """Write a test as a native YAML file (UTF-8, ``\\n`` line ends); returns the path."""
    path = Path(path)
    path.write_text(dump_native(test), encoding="utf-8", newline="\n")
    return path

