"""CrowS-Pairs (Nangia, Vania, Bhalerao & Bowman 2020) read from its published files. The metric
and its conventions are documented in :mod:`audit.metrics.crows_pairs`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from audit.errors import DataError, ParameterError
from audit.suites import SentencePairs

__all__ = ["TEST_NAME", "REQUIRED_COLUMNS", "DIRECTIONS", "load_crows_pairs", "read_crows_pairs", "select_pairs"]

#: The registered name of the English CrowS-Pairs test (``datasets/en/crows_pairs.yaml``).
TEST_NAME = "crows_pairs"
REQUIRED_COLUMNS = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
DIRECTIONS = ("stereo", "antistereo")


def load_crows_pairs(path: str | os.PathLike, *, bias_types: Sequence[str] | None = None,
                     limit: int | None = None) -> pd.DataFrame:
    """Read the official CrowS-Pairs CSV (``crows_pairs_anonymized.csv``).

    Parameters
    ----------
    path : path of the CSV (columns ``sent_more``, ``sent_less``, ``stereo_antistereo``,
        ``bias_type``; an unnamed first index column and annotation columns are allowed).
    bias_types : optional list of bias types to keep (e.g. ``["gender", "race-color"]``).
    limit : optional maximum number of pairs (the first ones after filtering).

    Returns
    -------
    DataFrame with ``pair_id`` (the CSV's own index column when present, else the row number),
    ``sent_more``, ``sent_less``, ``stereo_antistereo``, ``bias_type`` (plus the other columns
    of the file), in file order.

    Raises
    ------
    DataError
        Missing or unreadable file, missing columns (named), empty sentences or a direction
        other than ``stereo``/``antistereo`` (row named).
    ParameterError
        Unknown bias type in ``bias_types`` (the known ones are listed), bad ``limit``.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"CrowS-Pairs file {str(p)!r} does not exist")
    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False, encoding="utf-8")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise DataError(f"CrowS-Pairs file {str(p)!r} is not a readable UTF-8 CSV: {e}") from e
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"CrowS-Pairs file {str(p)!r} lacks column(s) {', '.join(missing)} "
                        f"(has: {', '.join(map(str, df.columns))})")
    first = df.columns[0]
    if first in ("", "Unnamed: 0") or str(first).startswith("Unnamed"):
        df = df.rename(columns={first: "pair_id"})
        try:
            df["pair_id"] = df["pair_id"].astype(int)
        except ValueError:
            df["pair_id"] = np.arange(len(df))
    elif "pair_id" not in df.columns:
        df.insert(0, "pair_id", np.arange(len(df)))
    df = _validate_rows(df, str(p))
    return select_pairs(df, bias_types, limit)


def _validate_rows(df: pd.DataFrame, where: str) -> pd.DataFrame:
    for col in ("sent_more", "sent_less", "bias_type"):
        bad = df.index[df[col].astype(str).str.strip() == ""]
        if len(bad):
            raise DataError(f"{where}: column {col!r} is empty in row {int(bad[0]) + 1} "
                            f"(pair_id {df.loc[bad[0], 'pair_id']})")
    d = df["stereo_antistereo"].astype(str).str.strip()
    bad = df.index[~d.isin(DIRECTIONS)]
    if len(bad):
        raise DataError(f"{where}: column 'stereo_antistereo' must be 'stereo' or 'antistereo', "
                        f"got {df.loc[bad[0], 'stereo_antistereo']!r} in row {int(bad[0]) + 1}")
    df = df.copy()
    df["stereo_antistereo"] = d
    df["bias_type"] = df["bias_type"].astype(str).str.strip()
    return df.reset_index(drop=True)


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
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1:
            raise ParameterError(f"limit: must be a positive integer, got {limit!r}")
        df = df.head(int(limit))
    return df.reset_index(drop=True)


def read_crows_pairs(path: str | os.PathLike, *, name: str | None = None, language: str = "en",
                     provenance: str = "", licence: str = "", encoding: str = "utf-8") -> SentencePairs:
    """A CrowS-Pairs file as a :class:`audit.suites.SentencePairs` test (:func:`load_crows_pairs`)."""
    p = Path(path)
    table = load_crows_pairs(p)
    return SentencePairs(name=name or p.stem, language=language, table=table, provenance=provenance,
                         licence=licence, source=str(p), encoding=encoding)
