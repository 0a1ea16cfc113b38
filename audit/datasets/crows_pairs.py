"""CrowS-Pairs (Nangia, Vania, Bhalerao & Bowman 2020) and its translations, read from their
published files. The metric and its conventions are documented in :mod:`audit.metrics.crows_pairs`.

One loader (:func:`load_crows_pairs`) for every published layout:

* the official CSV (nyu-mll/crows-pairs ``crows_pairs_anonymized.csv``: comma-separated, UTF-8,
  an unnamed first index column, annotation columns);
* the multilingual TSVs of Névéol, Dupont, Bezançon & Fort (2022), "French CrowS-Pairs", ACL:
  French (1677 pairs) and the revised English set (1677 pairs, adds bias type ``autre``; the
  set lm-evaluation-harness's ``crows_pairs_english`` scores): tab-separated despite their
  original ``.csv`` names, an unnamed first index column, CSV quoting inside the fields;
* the Dutch translation (jerryspan/Dutch-CrowS-Pairs, 1463 pairs): comma-separated, CRLF line
  ends, an ``id`` first column, and **Mac Roman** text, with one line in UTF-8.

Delimiter: a tab when the header line has one, else a comma. Index column: a first column named
``""``, ``Unnamed: 0`` or ``id`` becomes ``pair_id`` (integers when every id is one; the French
set's ids are strings, its 210 new pairs being ``LA0``, ``LA1``, ...), else ``pair_id`` is the row
number. Encoding (:func:`decode_text`): given, or detected -- UTF-8 when the whole file is UTF-8,
otherwise each line that is valid UTF-8 is read as UTF-8 and every other line in the legacy
encoding (Mac Roman, Windows-1252 or Latin-1) whose decoding looks most like European text; the
encoding used is returned and recorded with every result (``encoding`` in the provenance).
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.errors import DataError, ParameterError
from audit.suites import SentencePairs

__all__ = ["TEST_NAME", "REQUIRED_COLUMNS", "DIRECTIONS", "LEGACY_ENCODINGS", "INVALID_MODES", "decode_text", "load_crows_pairs",
           "read_crows_pairs", "select_pairs"]

#: The registered name of the CrowS-Pairs test in each language (``datasets/<lang>/crows_pairs.yaml``).
TEST_NAME = "crows_pairs"
REQUIRED_COLUMNS = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
DIRECTIONS = ("stereo", "antistereo")
#: Legacy 8-bit encodings tried, in this order on ties, for lines that are not UTF-8.
LEGACY_ENCODINGS = ("mac_roman", "cp1252", "latin-1")
#: Non-ASCII characters expected in European text besides lower-case letters that follow a letter.
_TYPOGRAPHIC = set("\u2018\u2019\u201a\u201c\u201d\u201e\u2013\u2014\u2026\u00ab\u00bb\u00a0\u20ac\u00b0\u00a3")
_INDEX_COLUMNS = ("", "id", "Unnamed: 0")


def _plausibility(text: str) -> int:
    """+1 per non-ASCII character that reads as European text (a lower-case letter after a
    letter, an upper-case letter at a word start, typographic quotes and dashes), -1 for any
    other (symbols, controls, upper-case letters inside words)."""
    score = 0
    for i, ch in enumerate(text):
        if ord(ch) < 128:
            continue
        prev = text[i - 1] if i else " "
        ok = (ch in _TYPOGRAPHIC or (ch.isalpha() and ch.islower() and (prev.isalpha() or prev in "'\u2019-"))
              or (ch.isalpha() and ch.isupper() and not prev.isalpha()) or (ch.isalpha() and ch.islower() and prev == " "))
        score += 1 if ok else -1
    return score


def decode_text(data: bytes, encoding: str | None = None, where: str = "file") -> tuple[str, str]:
    """Decode a text file; return ``(text, encoding used)``.

    ``encoding`` given: the whole file strictly in it (:class:`DataError` naming the line of the
    first undecodable byte). ``None``/``"auto"``: UTF-8 (``utf-8-sig`` with a byte-order mark)
    when the whole file is UTF-8; otherwise line by line, UTF-8 where a line is valid UTF-8 and
    else the legacy encoding of :data:`LEGACY_ENCODINGS` that decodes every other line with the
    highest :func:`_plausibility` (Mac Roman's ``0x8e`` is ``é``, Windows-1252's is ``Ž``); the
    returned name then says so, e.g. ``"mac_roman (detected; 1 line UTF-8)"``.
    """
    if encoding not in (None, "auto"):
        try:
            return data.decode(encoding), encoding
        except LookupError:
            raise ParameterError(f"encoding: unknown text encoding {encoding!r}") from None
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise DataError(f"{where}: line {line} is not valid {encoding} (byte 0x{data[e.start]:02x}); "
                            "give the file's encoding, or encoding='auto' to detect it") from None
    if data.startswith(b"\xef\xbb\xbf"):
        try:
            return data.decode("utf-8-sig"), "utf-8-sig"
        except UnicodeDecodeError:
            pass
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    lines = data.splitlines(keepends=True)
    utf8: dict[int, str] = {}
    legacy: list[int] = []
    for i, ln in enumerate(lines):
        try:
            utf8[i] = ln.decode("utf-8")
        except UnicodeDecodeError:
            legacy.append(i)
    best, best_score = None, None
    for enc in LEGACY_ENCODINGS:
        try:
            text = "".join(lines[i].decode(enc) for i in legacy)
        except UnicodeDecodeError:
            continue
        sc = _plausibility(text)
        if best_score is None or sc > best_score:
            best, best_score = enc, sc
    if best is None:  # latin-1 decodes any byte: not reached
        raise DataError(f"{where}: cannot decode the text; give its encoding")
    out = "".join(utf8[i] if i in utf8 else lines[i].decode(best) for i in range(len(lines)))
    n_utf8 = sum(1 for i, t in utf8.items() if any(ord(c) > 127 for c in t))
    note = f"{best} (detected" + (f"; {n_utf8} line{'s' if n_utf8 != 1 else ''} UTF-8)" if n_utf8 else ")")
    return out, note


def load_crows_pairs(path: str | os.PathLike, *, bias_types: Sequence[str] | None = None,
                     limit: int | None = None, encoding: str | None = None,
                     invalid: str = "skip") -> pd.DataFrame:
    """Read a CrowS-Pairs file in any published layout (see the module docstring).

    Parameters
    ----------
    path : path of the CSV/TSV (columns ``sent_more``, ``sent_less``, ``stereo_antistereo``,
        ``bias_type``; an index first column and annotation columns are allowed).
    bias_types : optional list of bias types to keep (e.g. ``["gender", "race-color"]``).
    limit : optional maximum number of pairs (the first ones after filtering).
    encoding : optional text encoding; ``None``/``"auto"`` detects it (:func:`decode_text`).
    invalid : ``"skip"`` (default, the one rule for a registered test and a file passed by
        path): a row with an empty sentence or bias type, or an unknown direction, is dropped
        and listed in ``attrs["skipped"]`` with its reason (the published French set has one
        pair whose ``sent_less`` is empty, row 129); a file with no valid row is a
        :class:`DataError`. ``"error"``: the first such row is a :class:`DataError` naming it.

    Returns
    -------
    DataFrame with ``pair_id`` (the file's own index column when present, else the row number),
    ``sent_more``, ``sent_less``, ``stereo_antistereo``, ``bias_type`` (plus the other columns
    of the file), in file order; ``attrs["encoding"]`` is the encoding used,
    ``attrs["delimiter"]`` the delimiter and ``attrs["skipped"]`` the rows dropped.

    Raises
    ------
    DataError
        Missing or unreadable file, missing columns (named), empty sentences or a direction
        other than ``stereo``/``antistereo`` (row named).
    ParameterError
        Unknown bias type in ``bias_types`` (the known ones are listed), bad ``limit``, unknown
        encoding.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"CrowS-Pairs file {str(p)!r} does not exist")
    text, used = decode_text(p.read_bytes(), encoding, where=f"CrowS-Pairs file {str(p)!r}")
    header = text.split("\n", 1)[0]
    sep = "\t" if "\t" in header else ","
    try:
        df = pd.read_csv(io.StringIO(text), sep=sep, dtype=str, keep_default_na=False, quoting=csv.QUOTE_MINIMAL)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise DataError(f"CrowS-Pairs file {str(p)!r} is not a readable CSV/TSV: {e}") from e
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"CrowS-Pairs file {str(p)!r} lacks column(s) {', '.join(missing)} "
                        f"(has: {', '.join(map(str, df.columns))})")
    first = df.columns[0]
    if first in _INDEX_COLUMNS or str(first).startswith("Unnamed"):
        df = df.rename(columns={first: "pair_id"})
        ids = df["pair_id"].astype(str).str.strip()
        if ids.str.fullmatch(r"-?\d+").all():
            df["pair_id"] = ids.astype(int)
        elif ids.is_unique and (ids != "").all():  # the French set's 210 new pairs are LA0, LA1, ...
            df["pair_id"] = ids.astype(object)
        else:
            df["pair_id"] = np.arange(len(df))
    elif "pair_id" not in df.columns:
        df.insert(0, "pair_id", np.arange(len(df)))
    df = _validate_rows(df, str(p), invalid)
    skipped = df.attrs.get("skipped", [])
    out = select_pairs(df, bias_types, limit)
    out.attrs["skipped"] = skipped
    out.attrs["encoding"] = used
    out.attrs["delimiter"] = "tab" if sep == "\t" else "comma"
    return out


INVALID_MODES = ("error", "skip")


def _plain(v):
    """A pair id as a plain Python int or str (JSON-able provenance)."""
    return int(v) if isinstance(v, (int, np.integer)) else str(v)


def _validate_rows(df: pd.DataFrame, where: str, invalid: str = "error") -> pd.DataFrame:
    """Check every row; ``invalid="skip"`` drops a row with an empty field or an unknown
    direction instead of raising, and lists it in ``attrs["skipped"]`` (``pair_id``, ``row``
    -- the data row, 1-based --, ``reason``)."""
    schema.choice(invalid, "invalid", INVALID_MODES)
    df = df.reset_index(drop=True)
    reasons: dict[int, str] = {}
    for col in ("sent_more", "sent_less", "bias_type"):
        for i in df.index[df[col].astype(str).str.strip() == ""]:
            reasons.setdefault(int(i), f"column {col!r} is empty")
    d = df["stereo_antistereo"].astype(str).str.strip()
    for i in df.index[~d.isin(DIRECTIONS)]:
        reasons.setdefault(int(i), f"column 'stereo_antistereo' must be 'stereo' or 'antistereo', "
                                   f"got {df.loc[i, 'stereo_antistereo']!r}")
    if reasons and (invalid == "error" or len(reasons) == len(df)):
        i = min(reasons)
        every = " (no valid row left)" if invalid == "skip" else ""
        raise DataError(f"{where}: {reasons[i]} in row {i + 1} (pair_id {df.loc[i, 'pair_id']}){every}")
    skipped = [{"pair_id": _plain(df.loc[i, "pair_id"]), "row": i + 1, "reason": r} for i, r in sorted(reasons.items())]
    df = df.assign(stereo_antistereo=d, bias_type=df["bias_type"].astype(str).str.strip())
    df = df.drop(index=sorted(reasons)).reset_index(drop=True)
    df.attrs["skipped"] = skipped
    return df


def select_pairs(df: pd.DataFrame, bias_types: Sequence[str] | None, limit: int | None) -> pd.DataFrame:
    if bias_types is not None:
        if isinstance(bias_types, str):
            bias_types = [bias_types]
        known = sorted(df["bias_type"].unique())
        unknown = [b for b in bias_types if b not in known]
        if unknown:
            raise ParameterError(f"bias_types: unknown bias type(s) {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(known)}")
        df = df[df["bias_type"].isin(list(bias_types))]
    if limit is not None:
        df = df.head(schema.integer(limit, "limit", 1))
    return df.reset_index(drop=True)


def read_crows_pairs(path: str | os.PathLike, *, name: str | None = None, language: str = "en",
                     provenance: str = "", licence: str = "", encoding: str | None = None,
                     invalid: str = "skip") -> SentencePairs:
    """A CrowS-Pairs file as a :class:`audit.suites.SentencePairs` test (:func:`load_crows_pairs`);
    its ``encoding`` is the one used (given, or detected); rows skipped with ``invalid="skip"``
    are listed in ``extra["skipped"]``."""
    p = Path(path)
    table = load_crows_pairs(p, encoding=encoding, invalid=invalid)
    extra = {"skipped": list(table.attrs.get("skipped", []))} if table.attrs.get("skipped") else {}
    return SentencePairs(name=name or p.stem, language=language, table=table, provenance=provenance,
                         licence=licence, source=str(p), encoding=table.attrs.get("encoding", encoding or "utf-8"),
                         extra=extra)
