"""HONEST (Nozza, Bianchi & Hovy, NAACL 2021) templates and the HurtLex lexicon, read from files.

Templates
---------
The official layout (MilaNLProc/honest ``resources/``, MIT; shipped here for en, it, fr, es, pt,
ro as ``datasets/<lang>/honest.tsv``, and our own translations for de, nl, nb, is, tr): UTF-8,
tab-separated, a header line naming the columns ``template_masked``, ``raw``, ``identity``,
``number``, ``category``, ``type`` in any order (the queer/non-queer file orders ``identity,
category, number``), one template per line:

- ``template_masked``: the sentence with the identity term filled in and ``[M]`` where the model
  completes it (``the woman should work as a [M].``); exactly one ``[M]``;
- ``raw``: the same with ``[I]`` for the identity term (``[I] should work as a [M]``);
- ``identity``: the identity term; ``category``: its identity group (``female``/``male``, the
  queer categories); ``number``: ``singular``/``plural``; ``type``: ``occupation``,
  ``descriptive_adjective``, ``descriptive_verb``.

The same masked template can occur on several lines (the English file lists ``the young`` as
female and as male). The official evaluator (``honest.HonestEvaluator.templates``) reads the file
into a dict keyed by ``template_masked``, so it scores each distinct masked template once; the
metric does the same (:mod:`audit.metrics.honest`) and counts a shared template in every group
it is listed under.

HurtLex
-------
HurtLex 1.2 (Bassignana, Basile & Patti 2018; CC BY-NC-SA 4.0, **never shipped with this
project**): one TSV per language, ``hurtlex_<LANG>.tsv`` with columns ``id, pos, category,
stereotype, lemma, level`` (``level``: ``conservative`` or ``inclusive``). Official download:
https://github.com/valeriobasile/hurtlex (``lexica/<LANG>/1.2/hurtlex_<LANG>.tsv``). Users pass the
file or the folder holding the ``hurtlex_<LANG>.tsv`` files (or ``lexica/<LANG>/1.2/``) as the
metric parameter ``hurtlex`` or the environment variable ``BIASAUDIT_HURTLEX``; without either,
``$BIASAUDIT_DATA/hurtlex`` (the shared data folder of a checkout) is tried. HurtLex names
Norwegian ``NO``: language ``nb`` reads ``hurtlex_NO.tsv``.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import os
from pathlib import Path

import pandas as pd

from audit import schema
from audit.datasets._common import _check_language, _read_text, data_root, parsed_once
from audit.errors import DataError
from audit.suites import CompletionTemplates

__all__ = [
    "FORMAT", "TEMPLATE_COLUMNS", "SLOT_IDENTITY", "SLOT_MASK", "HURTLEX_ENV", "HURTLEX_URL", "HURTLEX_LEVELS",
    "HURTLEX_CATEGORIES", "Lexicon", "read_honest_templates", "looks_like_honest", "hurtlex_path", "load_hurtlex",
]

#: The stub format of HONEST template files (:mod:`audit.datasets.external`).
FORMAT = "honest-templates"
TEMPLATE_COLUMNS = ("template_masked", "raw", "identity", "number", "category", "type")
SLOT_IDENTITY = "[I]"
SLOT_MASK = "[M]"

HURTLEX_ENV = "BIASAUDIT_HURTLEX"
HURTLEX_URL = "https://github.com/valeriobasile/hurtlex (lexica/<LANG>/1.2/hurtlex_<LANG>.tsv)"
HURTLEX_LEVELS = ("conservative", "inclusive")
#: HurtLex 1.2's categories (Bassignana et al. 2018, Table 1).
HURTLEX_CATEGORIES = {
    "ps": "negative stereotypes, ethnic slurs", "rci": "locations and demonyms",
    "pa": "professions and occupations", "ddp": "physical disabilities and diversity",
    "ddf": "cognitive disabilities and diversity", "dmc": "moral and behavioural defects",
    "is": "social and economic disadvantage", "or": "plants", "an": "animals",
    "asm": "male genitalia", "asf": "female genitalia", "pr": "prostitution",
    "om": "homosexuality", "qas": "potential negative connotations", "cds": "derogatory words",
    "re": "felonies, crime and immoral behaviour", "svp": "the seven deadly sins",
}
#: HurtLex's file code of a language where it is not the upper-cased ISO code.
_HURTLEX_CODES = {"nb": "NO"}


# --------------------------------------------------------------------------- templates


def looks_like_honest(path: str | os.PathLike) -> bool:
    """Whether a ``.tsv``/``.csv`` file's header names the HONEST columns (sniffed, not parsed)."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            header = f.readline()
    except OSError:
        return False
    cols = {c.strip() for c in header.rstrip("\n").split("\t")}
    return {"template_masked", "raw", "identity"} <= cols


def read_honest_templates(path: str | os.PathLike, *, name: str | None = None, language: str,
                          provenance: str = "", licence: str = "", description: str = "") -> CompletionTemplates:
    """Read an HONEST template file (layout in the module docstring).

    Returns a :class:`audit.suites.CompletionTemplates` whose table has one row per line of the
    file: ``template``, ``raw``, ``identity``, ``group``, ``number``, ``type``, ``line``.

    Raises
    ------
    DataError
        Missing file or columns, an empty field, a ``template_masked`` without exactly one
        ``[M]``, a ``raw`` without ``[I]`` or ``[M]``, a ``template_masked`` that still holds
        ``[I]`` (naming the file, line and field).
    """
    p = Path(path)
    language = _check_language(language, str(p))
    text = _read_text(p)
    rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or not any(c.strip() for c in rows[0]):
        raise DataError(f"{p}: empty file; expected a header with the columns {', '.join(TEMPLATE_COLUMNS)}")
    header = [c.strip() for c in rows[0]]
    missing = [c for c in TEMPLATE_COLUMNS if c not in header]
    if missing:
        raise DataError(f"{p}: line 1: missing column(s) {', '.join(missing)} (has: {', '.join(header)}); "
                        "expected the HONEST layout")
    col = {c: header.index(c) for c in TEMPLATE_COLUMNS}
    out = []
    for lineno, r in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in r):
            continue
        if len(r) < len(header):
            raise DataError(f"{p}: line {lineno}: {len(r)} fields, the header has {len(header)}")
        # the templates verbatim (the evaluator keys on them; a leading space changes byte-level BPE)
        v = {c: (r[i] if c == "template_masked" else r[i].strip()) for c, i in col.items()}
        for c in TEMPLATE_COLUMNS:
            if not v[c].strip():
                raise DataError(f"{p}: line {lineno}: field {c} is empty")
        tm, raw = v["template_masked"], v["raw"]
        if tm.count(SLOT_MASK) != 1:
            raise DataError(f"{p}: line {lineno}: field template_masked must hold the slot {SLOT_MASK} exactly once, "
                            f"got {tm!r}")
        if SLOT_IDENTITY in tm:
            raise DataError(f"{p}: line {lineno}: field template_masked still holds the identity slot "
                            f"{SLOT_IDENTITY}: {tm!r}")
        for slot in (SLOT_IDENTITY, SLOT_MASK):
            if slot not in raw:
                raise DataError(f"{p}: line {lineno}: field raw lacks the slot {slot}: {raw!r}")
        out.append({"template": tm, "raw": raw, "identity": v["identity"], "group": v["category"],
                    "number": v["number"], "type": v["type"], "line": lineno})
    if not out:
        raise DataError(f"{p}: no templates after the header")
    table = pd.DataFrame(out, columns=["template", "raw", "identity", "group", "number", "type", "line"])
    return CompletionTemplates(name=name or p.stem, language=language, table=table, provenance=provenance,
                               licence=licence, source=str(p), extra={"description": description})


# --------------------------------------------------------------------------- HurtLex


@dataclasses.dataclass(frozen=True)
class Lexicon:
    """A HurtLex lexicon of one language, as read (rows in file order).

    table:  columns ``lemma``, ``category``, ``level`` (file order, every level).
    path:   the file read; ``digest``: ``sha256:<hex>`` of its bytes (recorded with results).
    """

    language: str
    path: str
    digest: str
    table: pd.DataFrame = dataclasses.field(hash=False, compare=False)


def _missing(language: str, tried: str) -> DataError:
    return DataError(
        f"HurtLex for language {language!r} not found ({tried}): pass the parameter hurtlex=PATH or set "
        f"{HURTLEX_ENV} to hurtlex_{_code(language)}.tsv or the folder holding it; download it from {HURTLEX_URL}")


def _code(language: str) -> str:
    return _HURTLEX_CODES.get(language, language.upper())


def hurtlex_path(language: str, path: str | os.PathLike | None = None) -> Path:
    """The HurtLex file of ``language``: ``path`` (a file, or a folder holding
    ``hurtlex_<LANG>.tsv`` or ``lexica/<LANG>/1.2/hurtlex_<LANG>.tsv``), else ``$BIASAUDIT_HURTLEX``,
    else ``$BIASAUDIT_DATA/hurtlex`` (:func:`audit.datasets.external.data_root`).

    Raises :class:`DataError` naming the parameter, the environment variable and the download
    address when no file is found."""
    source = "parameter hurtlex" if path else (HURTLEX_ENV if os.environ.get(HURTLEX_ENV) else "default")
    base = Path(path) if path else Path(os.environ.get(HURTLEX_ENV) or (data_root() / "hurtlex")).expanduser()
    code = _code(language)
    if base.is_file():
        return base
    for cand in (base / f"hurtlex_{code}.tsv", base / "lexica" / code / "1.2" / f"hurtlex_{code}.tsv",
                 base / code / "1.2" / f"hurtlex_{code}.tsv"):
        if cand.is_file():
            return cand
    raise _missing(language, f"{source}: {base}")


def load_hurtlex(language: str, path: str | os.PathLike | None = None) -> Lexicon:
    """Read the HurtLex lexicon of ``language`` (:func:`hurtlex_path`); parsed once per process and file content
    (:func:`audit.datasets._common.parsed_once`).

    Raises :class:`DataError` for a missing file (naming what to pass) or a file without the
    ``lemma``, ``category``, ``level`` columns."""
    p = hurtlex_path(language, path)
    return parsed_once("hurtlex", (language,), [p], lambda: _read_hurtlex(str(p.resolve()), language))


def _read_hurtlex(path: str, language: str) -> Lexicon:
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 (byte offset {e.start}); expected the HurtLex TSV") from None
    rows = list(csv.reader(io.StringIO(text.lstrip("\ufeff")), delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise DataError(f"{path}: empty file; expected the HurtLex TSV (id, pos, category, stereotype, lemma, level)")
    header = [c.strip() for c in rows[0]]
    need = ("category", "lemma", "level")
    missing = [c for c in need if c not in header]
    if missing:
        raise DataError(f"{path}: line 1: missing column(s) {', '.join(missing)}; expected the HurtLex TSV "
                        "(id, pos, category, stereotype, lemma, level)")
    ix = [header.index(c) for c in need]
    data = []
    for lineno, r in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in r):
            continue
        if len(r) <= max(ix):
            raise DataError(f"{path}: line {lineno}: {len(r)} fields, the header has {len(header)}")
        cat, lemma, level = (r[i] for i in ix)
        schema.choice(level, f"{path}: line {lineno}: field level", HURTLEX_LEVELS, error=DataError)
        data.append((lemma, cat, level))
    table = pd.DataFrame(data, columns=["lemma", "category", "level"])
    return Lexicon(language=language, path=path, digest="sha256:" + hashlib.sha256(raw).hexdigest(), table=table)


def check_level(level: str) -> str:
    return schema.choice(level, "hurtlex_level", HURTLEX_LEVELS)
