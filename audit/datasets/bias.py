"""Readers of the BIAS Detection Framework's formats: WEAT ``.txt`` and SEAT/LPBS ``.jsonl``
(BFH-AMI/BIAS; Puttick et al.; Rankwiler & Kurpicz-Briki 2024)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

from audit.datasets._common import (
    SUPPORTED_LANGUAGES,
    UNDETERMINED,
    _check_keys,
    _check_language,
    _check_unique,
    _nfc,
    _read_text,
    _string_list,
    _text,
)
from audit.datasets.native import _build, _parse_templates_field
from audit.datasets.templates import LPBS_USE, NUMBERS, _lpbs_pairs
from audit.errors import DataError
from audit.suites import WordSet, WordTest

# ======================================================================================
# BIAS Detection Framework formats
# ======================================================================================


def _language_from_path(path: Path, language: str | None, where: str) -> str:
    if language is not None:
        return _check_language(language, where, "language (argument)")
    parent = path.resolve().parent
    for folder in (parent, parent.parent):  # <lang>/file or <lang>/<WEAT|SEAT|LPBS>/file
        if folder.name.lower() in SUPPORTED_LANGUAGES:
            return folder.name.lower()
    return UNDETERMINED  # static-vector metrics need none; templates ask for --language


#: The documented rule for the protected-group side of BIAS-format files, which declare none.
BIAS_GROUPS_RULE = ("BIAS-format files declare no role: their target sets are taken as the social groups "
                    "(the WEFE convention, Badilla et al. 2020); pass the groups parameter (groups: attributes) "
                    "for a file written the other way round, as Caliskan's WEAT 7 and 8")

_BIAS_NAME_RE = re.compile(r"^#\s*(target|attribute)\s*:\s*(.*?)\s*$", re.IGNORECASE)


def read_bias_weat_txt(path: str | Path, *, language: str | None = None) -> WordTest:
    """Read a BIAS Detection Framework WEAT ``.txt`` word-list file.

    Format: lines starting with ``#`` are comments; ``# Target: <name>`` and
    ``# Attribute: <name>`` (case-insensitive) name the sets in order; blank lines are
    ignored; exactly four other lines remain: target X, target Y, attribute A, attribute B,
    each comma-separated (spaces around words are stripped). Without name comments the sets
    are named ``X``, ``Y``, ``A``, ``B``.

    Parameters
    ----------
    path : str or Path
    language : str, optional
        ISO 639-1 code; by default the parent or grandparent folder's name when it is a
        supported language (``.../de/WEAT/CW1.txt`` -> ``de``).

    Returns
    -------
    WordTest
        ``name`` is the file stem; the other comment lines go to ``extra["description"]``
        and ``provenance``; ``licence`` is empty (the format does not state one).
    """
    path = Path(path)
    where = str(path)
    text = _read_text(path)
    lang = _language_from_path(path, language, where)
    names = {"target": [], "attribute": []}
    comments: list[str] = []
    data: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.split("\n"), start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("#"):
            m = _BIAS_NAME_RE.match(s)
            if m:
                if not m.group(2):
                    raise DataError(f"{where}: line {lineno}: set name comment has no name")
                names[m.group(1).lower()].append(_nfc(m.group(2)))
            else:
                c = s.lstrip("#").strip()
                if c:
                    comments.append(c)
            continue
        data.append((lineno, line))
    if len(data) != 4:
        lines = ", ".join(str(n) for n, _ in data) or "none"
        raise DataError(f"{where}: expected 4 comma-separated word lines (X, Y, A, B), found "
                        f"{len(data)} (lines {lines})")
    n_named = len(names["target"]) + len(names["attribute"])
    if n_named and (len(names["target"]) != 2 or len(names["attribute"]) != 2):
        raise DataError(f"{where}: expected 2 '# Target:' and 2 '# Attribute:' comments, found "
                        f"{len(names['target'])} and {len(names['attribute'])}")
    set_names = (names["target"] + names["attribute"]) if n_named else ["X", "Y", "A", "B"]
    sets = []
    for (lineno, line), sname in zip(data, set_names):
        words = []
        for k, item in enumerate(line.split(",")):
            w = " ".join(item.split())
            if not w:
                raise DataError(f"{where}: line {lineno}: item {k + 1} is empty "
                                "(two commas in a row, or a trailing comma?)")
            words.append(w)
        sets.append(WordSet(sname, tuple(words)))
    description = " / ".join(comments)
    provenance = f"BIAS Detection Framework WEAT word-list file {path.name}"
    if description:
        provenance += f" ({description})"
    return _build(
        groups_reason=BIAS_GROUPS_RULE,
        name=path.stem, language=lang, targets=sets[:2], attributes=sets[2:],
        provenance=provenance, licence="", source=str(path),
        extra={"format": "bias-weat-txt", "description": description, "forms": {}, "metrics": None},
    )


_BIAS_JSON_KEYS = ("targ1", "targ2", "attr1", "attr2", "templates")


def read_bias_jsonl(path: str | Path, *, language: str | None = None) -> WordTest:
    """Read a BIAS Detection Framework SEAT or LPBS ``.jsonl`` file (one JSON object).

    SEAT: ``targ1``, ``targ2``, ``attr1``, ``attr2`` are ``{"category": name, "examples":
    [sentences]}``; the test gets empty word sets named by ``category`` and
    ``sentences = {"targets": [[...], [...]], "attributes": [[...], [...]]}``.

    LPBS: ``targ1``/``targ2`` are ``{"singular": [words], "plural": [words]}``,
    ``attr1``/``attr2`` are word lists and ``templates`` is ``{"singular": [...],
    "plural": [...]}`` with ``TARGET``/``ATTRIBUTE`` placeholders. A target set's words are
    its singular words and ``extra["forms"]`` maps each to its plural: one to one when the
    lists have equal lengths (``flower -> flowers``), to the whole plural list when there is
    one singular word (BIAS ``LPBS_7``: ``he -> [boys, men]``); otherwise the plural words
    become words of the set with ``forms[w] = {"number": "plural"}``. ``templates["lpbs"]``
    holds the templates. The format has no set names: sets are named ``X``, ``Y``, ``A``, ``B``.

    Parameters
    ----------
    path : str or Path
    language : str, optional
        As for :func:`read_bias_weat_txt`.
    """
    path = Path(path)
    where = str(path)
    text = _read_text(path)
    lang = _language_from_path(path, language, where)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            raise DataError(f"{where}: expected one JSON object, found more data at line {e.lineno}, "
                            f"column {e.colno}") from None
        raise DataError(f"{where}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with keys targ1, targ2, attr1, attr2")
    _check_keys(obj, _BIAS_JSON_KEYS, where, "")
    for k in ("targ1", "targ2", "attr1", "attr2"):
        if k not in obj:
            raise DataError(f"{where}: missing required field {k!r}")
    if isinstance(obj["targ1"], dict) and "examples" in obj["targ1"]:
        return _bias_seat(obj, path, lang)
    if isinstance(obj["targ1"], dict) and ("singular" in obj["targ1"] or "plural" in obj["targ1"]):
        return _bias_lpbs(obj, path, lang)
    raise DataError(f"{where}: field targ1 must be a SEAT set {{category, examples}} or an LPBS "
                    "target set {singular, plural}")


def _bias_seat(obj: dict, path: Path, lang: str) -> WordTest:
    where = str(path)
    if "templates" in obj:
        raise DataError(f"{where}: unknown field 'templates' in a SEAT file (only LPBS files have templates)")
    sets, sentences = {"targets": [], "attributes": []}, {"targets": [], "attributes": []}
    for key, role in (("targ1", "targets"), ("targ2", "targets"), ("attr1", "attributes"), ("attr2", "attributes")):
        entry = obj[key]
        if isinstance(entry, (list, tuple)):
            entry = {"singular": list(entry)}
        if not isinstance(entry, Mapping):
            raise DataError(f"{where}: field {key} must be an object {{category, examples}}")
        _check_keys(entry, ("category", "examples"), where, key)
        for f in ("category", "examples"):
            if f not in entry:
                raise DataError(f"{where}: missing required field {key}.{f}")
        name = _text(entry["category"], where, f"{key}.category")
        sentences[role].append(_string_list(entry["examples"], where, f"{key}.examples"))
        sets[role].append(WordSet(name, ()))
    return _build(
        groups_reason=BIAS_GROUPS_RULE,
        name=path.stem, language=lang, targets=sets["targets"], attributes=sets["attributes"],
        provenance=f"BIAS Detection Framework SEAT sentence file {path.name}", licence="",
        source=where, sentences=sentences,
        extra={"format": "bias-seat-jsonl", "description": "", "forms": {}, "metrics": None},
    )


def _bias_lpbs(obj: dict, path: Path, lang: str) -> WordTest:
    if "templates" not in obj:
        raise DataError(f"{path}: missing required field 'templates' (LPBS files need templates)")
    return parse_bias_lpbs(obj, name=path.stem, language=lang, source=str(path))


def parse_bias_lpbs(obj: Mapping[str, Any], *, name: str, language: str, source: str = "") -> WordTest:
    """A test from a mapping in the BIAS framework's LPBS layout (``targ1``/``targ2`` =
    ``{singular: [...], plural: [...]}`` or a plain list, ``attr1``/``attr2`` lists, optional
    ``templates`` = ``{singular: [...], plural: [...]}``): the one reader of that layout, used
    for ``.jsonl`` files and for mappings given in code. Without ``templates`` the test has no
    LPBS templates (the LPBS measure step then uses Kurita et al.'s English template)."""
    where = source or name
    for key in ("targ1", "targ2", "attr1", "attr2"):
        if key not in obj:
            raise DataError(f"{where}: field {key!r} is missing (LPBS layout: targ1, targ2, attr1, attr2, templates)")
    targets, forms = [], {}
    for key, set_name in (("targ1", "X"), ("targ2", "Y")):
        entry = obj[key]
        if isinstance(entry, (list, tuple)):
            entry = {"singular": list(entry)}
        if not isinstance(entry, Mapping):
            raise DataError(f"{where}: field {key} must be an object {{singular, plural}}")
        _check_keys(entry, NUMBERS, where, key)
        sing = _string_list(entry.get("singular", []), where, f"{key}.singular", allow_empty=True)
        plur = _string_list(entry.get("plural", []), where, f"{key}.plural", allow_empty=True)
        if not sing and not plur:
            raise DataError(f"{where}: field {key} has no singular and no plural words")
        _check_unique(plur, where, f"{key}.plural")
        if not plur:
            words = sing
        elif len(sing) == len(plur):        # flower -> flowers, one to one
            forms.update({s: {"plural": p} for s, p in zip(sing, plur)})
            words = sing
        elif len(sing) == 1:                # he -> boys, men
            forms[sing[0]] = {"plural": plur}
            words = sing
        else:                               # no 1:n reading: plural words are words of their own
            forms.update({p: {"number": "plural"} for p in plur})
            words = sing + plur
        targets.append(WordSet(set_name, tuple(words)))
    attributes = []
    for key, set_name in (("attr1", "A"), ("attr2", "B")):
        attributes.append(WordSet(set_name, tuple(_string_list(obj[key], where, key))))
    templates = _parse_templates_field({LPBS_USE: obj["templates"]}, where) if "templates" in obj else {}
    test = _build(
        groups_reason=BIAS_GROUPS_RULE,
        name=name, language=language, targets=targets, attributes=attributes,
        provenance=f"BIAS Detection Framework LPBS layout ({Path(source).name or name})", licence="", source=source,
        templates=templates,
        extra={"format": "bias-lpbs-jsonl", "description": "", "forms": forms, "metrics": None},
    )
    if templates:
        _lpbs_pairs(test)  # the two target sets must pair up per number
    return test

