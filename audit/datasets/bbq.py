"""The BBQ family (Bias Benchmark for QA, Parrish et al., Findings of ACL 2022) in every published
layout, mapped onto BBQ's schema (:class:`audit.suites.MultipleChoice`).

One item: a ``context`` (ambiguous, or disambiguated by a second sentence), a ``question``
(negative or non-negative polarity), three answers: two about people of two social groups and one
*unknown* answer ("Can't be determined"), and the correct ``label``. The metric
(:mod:`audit.metrics.bbq`) needs, per answer, whether it is the unknown one and whether it is
about a *stereotyped* group of the item; every layout carries both, under its own names.

Layouts (auto-detected from the fields of the first record of each file)
-----------------------------------------------------------------------
``bbq-jsonl`` -- BBQ (nyu-mll/BBQ ``data/<Category>.jsonl``, CC BY 4.0) and MBBQ (Veranep/MBBQ
    ``data/<Category>_<lang>.jsonl``, Dutch, Spanish, Turkish, English; no licence published, so
    users pass its path). One JSON object per line: ``example_id``, ``question_polarity``
    (``neg``/``nonneg``), ``context_condition`` (``ambig``/``disambig``), ``category``,
    ``answer_info`` ``{"ans0": [name, group], ...}``, ``additional_metadata.stereotyped_groups``,
    ``context``, ``question``, ``ans0``..``ans2``, ``label``.
    *Unknown answer*: the one whose ``answer_info`` group (its last element) is ``unknown``.
    *Groups of an answer*: both elements of its ``answer_info`` (name and group, as
    lm-evaluation-harness's ``bbq`` ``process_docs`` uses them: Nationality names the nationality
    first and the region second), each split at ``_`` and at BBQ's intersectional prefixes
    ``F-``, ``M-``, ``lowSES-``, ``highSES-`` (``F-Black`` -> ``F``, ``Black``); ``woman``/``girl``
    also count as ``F`` and ``man``/``boy`` as ``M`` (BBQ's Gender_identity answers name the
    person, its stereotyped groups say ``F``/``M``).
``gg-bbq-jsonl`` -- GG-BBQ, German gender BBQ (shalakasatheesh/GG-BBQ, CC BY 4.0): ``index``,
    ``context``, ``question``, ``choice_0``..``choice_2``, ``label``, ``question_type``
    (``negative``/``non_negative``), ``context_type`` (``ambiguous_context``/
    ``disambiguous_context``), ``known_stereotyped_groups`` (a JSON list in a string),
    ``choice_info`` (``{0: [text, group], ...}`` as a Python literal in a string),
    ``relevant_social_values``. *Unknown answer*: the choice whose ``choice_info`` group is
    ``unknown``. *Groups*: the ``choice_info`` group; GG-BBQ labels transgender people
    ``non_binary`` where its ``known_stereotyped_groups`` say ``trans`` (and ``transgender
    women``/``transgender men``), so ``non_binary`` also counts as ``trans``. *Category*: every
    item is ``Gender_identity`` (the subset's ``relevant_social_values`` is kept as
    ``subcategory``).
``esbbq-csv`` -- EsBBQ and CaBBQ (langtech-bsc/EsBBQ-CaBBQ ``data_<lang>/data_<lang>_<Category>
    .full.csv``, Apache-2.0): BBQ's fields flattened into CSV columns (``answer_info.ans0`` ..
    as Python-literal lists, ``stereotyped_groups`` as a Python-literal list). *Unknown answer*:
    the one whose ``answer_info`` group is ``unknown``. The published text of that answer is the
    placeholder ``unknown``; it is replaced by the first of the unknown phrasings of the
    datasets' lm-evaluation-harness tasks (Spanish ``No hay suficiente información``, Catalan
    ``No hi ha prou informació``). *Groups*: the ``answer_info`` group (its last element), split
    at commas (``m, árabe`` -> ``m``, ``árabe``), as the EsBBQ harness task reads it.
    *Question type*: the ``question_type`` column (``pro-stereo``/``anti-stereo``, disambiguated
    items only) is kept: EsBBQ/CaBBQ's disambiguated bias score reads it
    (:func:`audit.metrics.bbq.esbbq_scores`); the other layouts leave it empty.

Labels are compared case-insensitively with white space removed (``low SES`` = ``lowSES``).
An answer is a *target* when one of its groups is among the item's stereotyped groups; the
*biased* answers (Parrish et al. 2022, section 4) are the targets for a negative question and the
non-target, non-unknown answers for a non-negative one.

A folder is read file by file (sorted); in a folder holding MBBQ's ``<Category>_<lang>.jsonl``
files only the test language's files are read, MBBQ's control sets (``*_control_*``) left out.
Bad input (a label out of range, no or several unknown answers, an unknown category, a missing
field) raises :class:`DataError` naming the file, line and field.
"""

from __future__ import annotations

import ast
import csv
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from audit import schema
from audit.datasets._common import _check_language, _read_text, parsed_once
from audit.errors import DataError, ParameterError
from audit.suites import MultipleChoice

__all__ = [
    "FORMAT", "LAYOUTS", "BBQ_CATEGORIES", "ESBBQ_CATEGORIES", "GGBBQ_CATEGORY", "UNKNOWN_TEXT", "TABLE_COLUMNS",
    "read_bbq", "looks_like_bbq", "select_items", "canon", "answer_groups",
]

#: The stub format of every BBQ-family layout (the reader detects which).
FORMAT = "bbq"
LAYOUTS = ("bbq-jsonl", "gg-bbq-jsonl", "esbbq-csv")
N_OPTIONS = 3

#: BBQ's eleven categories (nyu-mll/BBQ ``data/``); MBBQ uses a subset.
BBQ_CATEGORIES = ("Age", "Disability_status", "Gender_identity", "Nationality", "Physical_appearance",
                  "Race_ethnicity", "Race_x_gender", "Race_x_SES", "Religion", "SES", "Sexual_orientation")
#: EsBBQ's and CaBBQ's ten categories.
ESBBQ_CATEGORIES = ("Age", "DisabilityStatus", "Gender", "LGBTQIA", "Nationality", "PhysicalAppearance",
                    "RaceEthnicity", "Religion", "SES", "SpanishRegion")
GGBBQ_CATEGORY = "Gender_identity"
#: The unknown answer's text where EsBBQ/CaBBQ publish the placeholder ``unknown``.
UNKNOWN_TEXT = {"es": "No hay suficiente información", "ca": "No hi ha prou informació"}
_PLACEHOLDER = "unknown"

TABLE_COLUMNS = ("item", "category", "subcategory", "question_polarity", "context_condition", "context", "question",
                 "ans0", "ans1", "ans2", "label", "unknown", "groups0", "groups1", "groups2",
                 "stereotyped_groups", "target", "biased", "question_type", "where")

_POLARITY = {"neg": "neg", "nonneg": "nonneg", "negative": "neg", "non_negative": "nonneg"}
_CONDITION = {"ambig": "ambig", "disambig": "disambig", "ambiguous_context": "ambig",
              "disambiguous_context": "disambig", "disambiguated_context": "disambig"}
_INTERSECTIONAL = re.compile(r"^(f|m|lowses|highses)-(.+)$")
_GENDER_ALIASES = {"woman": "f", "girl": "f", "man": "m", "boy": "m"}
_GGBBQ_ALIASES = {"nonbinary": "trans"}


def canon(label: str) -> str:
    """A group label for comparison: case-folded, white space removed."""
    return "".join(str(label).casefold().split())


def answer_groups(elements: Sequence[str], layout: str) -> tuple[str, ...]:
    """The canonical group labels of one answer from its published group fields (module docstring)."""
    out: list[str] = []
    if layout == "bbq-jsonl":
        for el in elements:
            for part in str(el).split("_"):
                c = canon(part)
                m = _INTERSECTIONAL.match(c)
                parts = [m.group(1), m.group(2)] if m else [c]
                for p in parts:
                    out.append(p)
                    if p in _GENDER_ALIASES:
                        out.append(_GENDER_ALIASES[p])
    elif layout == "gg-bbq-jsonl":
        for el in elements:
            c = canon(el).replace("_", "")
            out.append(c)
            if c in _GGBBQ_ALIASES:
                out.append(_GGBBQ_ALIASES[c])
    else:  # esbbq-csv
        for el in elements:
            out += [canon(p) for p in str(el).split(",")]
    return tuple(dict.fromkeys(x for x in out if x))


# --------------------------------------------------------------------------- detection


def _first_record(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            if path.suffix.lower() == ".csv":
                header = f.readline()
                return {c: "" for c in next(csv.reader([header]))}
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return obj if isinstance(obj, dict) else None
    except (OSError, ValueError, StopIteration):
        return None
    return None


def _layout_of(rec: dict[str, Any] | None) -> str | None:
    if not rec:
        return None
    if "answer_info" in rec and "additional_metadata" in rec:
        return "bbq-jsonl"
    if "choice_0" in rec and "choice_info" in rec:
        return "gg-bbq-jsonl"
    if "answer_info.ans0" in rec and "stereotyped_groups" in rec:
        return "esbbq-csv"
    return None


def looks_like_bbq(path: str | os.PathLike) -> bool:
    """Whether a file (``.jsonl``/``.csv``) or a folder holds a BBQ-family layout (sniffed from
    the first record)."""
    p = Path(path)
    files = _files(p, None) if p.is_dir() else [p]
    return bool(files) and _layout_of(_first_record(files[0])) is not None


def _files(p: Path, language: str | None) -> list[Path]:
    files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in (".jsonl", ".csv"))
    if language:
        mine = [f for f in files if f.stem.endswith(f"_{language}") and "_control_" not in f.stem]
        if mine:
            return mine
    return files


# --------------------------------------------------------------------------- reading


def _records(path: Path, layout: str):
    """(line, record) pairs of a file."""
    text = _read_text(path)
    if layout == "esbbq-csv":
        lines = text.split("\n")
        reader = csv.DictReader(lines)
        prev = 1
        try:
            for rec in reader:
                yield prev + 1, rec
                prev = reader.line_num
        except csv.Error as e:
            raise DataError(f"{path}: line {reader.line_num}: malformed CSV ({e})") from None
        return
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise DataError(f"{path}: line {lineno}: not a JSON object ({e})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}: line {lineno}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, rec


def _field(rec: dict[str, Any], key: str, where: str) -> Any:
    if key not in rec:
        raise DataError(f"{where}: field {key} is missing")
    return rec[key]


def _text_field(rec: dict[str, Any], key: str, where: str) -> str:
    v = _field(rec, key, where)
    if not isinstance(v, str) or not v.strip():
        raise DataError(f"{where}: field {key} must be a non-empty string, got {v!r}")
    return v  # verbatim, as the published prompts and options


@functools.lru_cache(maxsize=8192)
def _parsed(text: str) -> tuple[Any, ...]:
    """The values ``text`` reads as: JSON, then a Python literal (EsBBQ/CaBBQ write
    ``['name', 'group']``); once per distinct text (EsBBQ and CaBBQ repeat about 1,200 texts over
    220,000 fields). The values are shared: callers only read them."""
    out = []
    for parse in (json.loads, ast.literal_eval):
        try:
            out.append(parse(text))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return tuple(out)


def _literal(v: Any, where: str, key: str, kind: type) -> Any:
    if isinstance(v, kind):
        return v
    if isinstance(v, str):
        for out in _parsed(v):
            if isinstance(out, kind):
                return out
    raise DataError(f"{where}: field {key} must be a {kind.__name__} (or its text), got {v!r}")


def _label(v: Any, where: str) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        lab = v
    elif isinstance(v, float) and v.is_integer():
        lab = int(v)
    elif isinstance(v, str) and re.fullmatch(r"\s*-?\d+\s*", v):
        lab = int(v)
    else:
        raise DataError(f"{where}: field label must be an integer 0-{N_OPTIONS - 1}, got {v!r}")
    if not 0 <= lab < N_OPTIONS:
        raise DataError(f"{where}: field label {lab} is out of range (0-{N_OPTIONS - 1})")
    return lab


def _mapped(v: Any, table: dict[str, str], where: str, key: str) -> str:
    s = str(v).strip()
    if s not in table:
        schema.choice(v, f"{where}: field {key}", sorted(set(table)), error=DataError)
    return table[s]


def _category(v: Any, known: Sequence[str], where: str, key: str = "category") -> str:
    s = str(v).strip()
    if s not in known:
        raise DataError(f"{where}: field {key}: unknown category {s!r}; known: {', '.join(known)}")
    return s


def _item(layout: str, rec: dict[str, Any], where: str, language: str) -> dict[str, Any]:
    """One record of any layout as a row of BBQ's schema (before target/biased)."""
    if layout == "bbq-jsonl":
        info = _literal(_field(rec, "answer_info", where), where, "answer_info", dict)
        meta = _literal(_field(rec, "additional_metadata", where), where, "additional_metadata", dict)
        raw_groups = []
        for i in range(N_OPTIONS):
            el = info.get(f"ans{i}")
            if not isinstance(el, (list, tuple)) or not el:
                raise DataError(f"{where}: field answer_info.ans{i} must be a list [name, group], got {el!r}")
            raw_groups.append(list(el))
        stereo = meta.get("stereotyped_groups")
        if not isinstance(stereo, list):
            raise DataError(f"{where}: field additional_metadata.stereotyped_groups must be a list, got {stereo!r}")
        row = {
            "item": f"{rec.get('category')}-{_field(rec, 'example_id', where)}",
            "category": _category(_field(rec, "category", where), BBQ_CATEGORIES, where),
            "subcategory": str(meta.get("subcategory") or ""),
            "question_polarity": _mapped(_field(rec, "question_polarity", where), _POLARITY, where, "question_polarity"),
            "context_condition": _mapped(_field(rec, "context_condition", where), _CONDITION, where, "context_condition"),
            "answers": [_text_field(rec, f"ans{i}", where) for i in range(N_OPTIONS)],
            "group_fields": raw_groups, "unknown_key": "answer_info", "stereo": stereo,
        }
    elif layout == "gg-bbq-jsonl":
        info = _literal(_field(rec, "choice_info", where), where, "choice_info", dict)
        info = {int(k) if str(k).isdigit() else k: v for k, v in info.items()}
        raw_groups = []
        for i in range(N_OPTIONS):
            el = info.get(i)
            if not isinstance(el, (list, tuple)) or len(el) < 2:
                raise DataError(f"{where}: field choice_info[{i}] must be a list [text, group], got {el!r}")
            raw_groups.append([el[-1]])
        stereo = _literal(_field(rec, "known_stereotyped_groups", where), where, "known_stereotyped_groups", list)
        cond = _mapped(_field(rec, "context_type", where), _CONDITION, where, "context_type")
        row = {
            "item": f"{cond}-{_field(rec, 'index', where)}",
            "category": GGBBQ_CATEGORY,
            "subcategory": str(rec.get("relevant_social_values") or ""),
            "question_polarity": _mapped(_field(rec, "question_type", where), _POLARITY, where, "question_type"),
            "context_condition": cond,
            "answers": [_text_field(rec, f"choice_{i}", where) for i in range(N_OPTIONS)],
            "group_fields": raw_groups, "unknown_key": "choice_info", "stereo": stereo,
        }
    else:  # esbbq-csv
        raw_groups = []
        for i in range(N_OPTIONS):
            el = _literal(_field(rec, f"answer_info.ans{i}", where), where, f"answer_info.ans{i}", list)
            if not el:
                raise DataError(f"{where}: field answer_info.ans{i} is an empty list")
            raw_groups.append([el[-1]])
        stereo = _literal(_field(rec, "stereotyped_groups", where), where, "stereotyped_groups", list)
        row = {
            "item": f"{rec.get('category')}-{_field(rec, 'instance_id', where)}",
            "category": _category(_field(rec, "category", where), ESBBQ_CATEGORIES, where),
            "subcategory": str(rec.get("subcategory") or ""),
            "question_polarity": _mapped(_field(rec, "question_polarity", where), _POLARITY, where, "question_polarity"),
            "context_condition": _mapped(_field(rec, "context_condition", where), _CONDITION, where, "context_condition"),
            "answers": [_text_field(rec, f"ans{i}", where) for i in range(N_OPTIONS)],
            "group_fields": raw_groups, "unknown_key": "answer_info", "stereo": stereo,
            "question_type": str(rec.get("question_type") or "").strip(),
        }
    row.setdefault("question_type", "")
    row["context"] = _text_field(rec, "context", where)
    row["question"] = _text_field(rec, "question", where)
    row["label"] = _label(_field(rec, "label", where), where)
    groups = [answer_groups(g, layout) for g in row.pop("group_fields")]
    unk = [i for i, g in enumerate(raw_groups) if canon(g[-1]) == _PLACEHOLDER]
    key = row.pop("unknown_key")
    if len(unk) != 1:
        what = "no answer is" if not unk else f"answers {unk} are all"
        raise DataError(f"{where}: field {key}: {what} the unknown answer (group 'unknown'); expected exactly one")
    u = unk[0]
    answers = row.pop("answers")
    if layout == "esbbq-csv" and canon(answers[u]) == _PLACEHOLDER and language in UNKNOWN_TEXT:
        answers[u] = UNKNOWN_TEXT[language]
    stereo = tuple(dict.fromkeys(canon(s) for s in row.pop("stereo") if canon(s)))
    target = [i for i in range(N_OPTIONS) if i != u and set(groups[i]) & set(stereo)]
    if row["question_polarity"] == "neg":
        biased = target
    else:
        biased = [i for i in range(N_OPTIONS) if i != u and i not in target]
    row.update({f"ans{i}": answers[i] for i in range(N_OPTIONS)})
    row.update({"unknown": u, "stereotyped_groups": stereo, "target": tuple(target), "biased": tuple(biased)})
    row.update({f"groups{i}": groups[i] for i in range(N_OPTIONS)})
    return row


def read_bbq(path: str | os.PathLike, *, name: str | None = None, language: str, provenance: str = "",
             licence: str = "", description: str = "") -> MultipleChoice:
    """Read a BBQ-family file or folder (any layout of the module docstring) as a
    :class:`audit.suites.MultipleChoice` test in BBQ's schema.

    Raises :class:`DataError` naming the file, line and field for bad input, and for a folder
    without BBQ-family files or with files of different layouts.
    """
    p = Path(path)
    language = _check_language(language, str(p))
    if p.is_dir():
        files = _files(p, language)
        if not files:
            raise DataError(f"{p}: no .jsonl or .csv files of the BBQ family in this folder")
    elif p.is_file():
        files = [p]
    else:
        raise DataError(f"{p}: no such file or folder (BBQ-family data)")
    return parsed_once("bbq", (str(p), name, language, provenance, licence, description), files,
                       lambda: _read_files(p, files, name=name, language=language, provenance=provenance,
                                           licence=licence, description=description),
                       copy=MultipleChoice.copy, disk=True)


def _read_files(p: Path, files: list[Path], *, name: str | None, language: str, provenance: str, licence: str,
                description: str) -> MultipleChoice:
    """:func:`read_bbq` of the ``files`` found at ``p`` (parsed once per process and content)."""
    layout = None
    rows: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for f in files:
        lay = _layout_of(_first_record(f))
        if lay is None:
            raise DataError(f"{f}: line 1: not a BBQ-family layout (expected BBQ/MBBQ JSONL with answer_info, GG-BBQ "
                            "JSONL with choice_0..2 and choice_info, or EsBBQ/CaBBQ CSV with answer_info.ans0)")
        if layout is not None and lay != layout:
            raise DataError(f"{f}: layout {lay} differs from the {layout} of the other files of {p}")
        layout = lay
        for lineno, rec in _records(f, lay):
            where = f"{f}: line {lineno}"
            row = _item(lay, rec, where, language)
            if row["item"] in seen:
                raise DataError(f"{where}: item {row['item']!r} repeats {seen[row['item']]}")
            seen[row["item"]] = f"{f.name}:{lineno}"
            row["where"] = f"{f.name}:{lineno}"
            rows.append(row)
    if not rows:
        raise DataError(f"{p}: no items")
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    return MultipleChoice(name=name or p.stem, language=language, table=table, provenance=provenance, licence=licence,
                          source=str(p), extra={"format": layout, "description": description,
                                                "files": [f.name for f in files]})


def select_items(table: pd.DataFrame, categories: Sequence[str] | str | None = None,
                 limit: int | None = None) -> pd.DataFrame:
    """The items of the given ``categories`` (all when ``None``), at most ``limit`` per category
    and context condition (the first ones in file order; ``None``: all), so that a limited
    selection keeps ambiguous and disambiguated items of every category.

    Raises :class:`ParameterError` for a category the test does not have (naming the known ones)
    or a bad ``limit``."""
    if categories is not None:
        if isinstance(categories, str):
            categories = [categories]
        known = list(dict.fromkeys(table["category"]))
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise ParameterError(f"categories: unknown category {unknown[0]!r}; this test has: {', '.join(known)}")
        table = table[table["category"].isin(list(categories))]
    if limit is not None:
        limit = schema.integer(limit, "limit", 1)  # items per category and context condition
        table = table.groupby(["category", "context_condition"], sort=False, group_keys=False).head(limit)
        table = table.sort_index()
    if len(table) == 0:
        raise ParameterError("the selection holds no items")
    return table.reset_index(drop=True)
