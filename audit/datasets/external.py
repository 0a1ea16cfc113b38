"""Registered tests whose data lives outside the project (licence or size): a small YAML *stub*
under ``datasets/<lang>/`` names the format, where the data is, and where to download it.

Stub fields::

    name: crows_pairs                 # the registered name (with the language: en/crows_pairs)
    language: en
    format: crows-pairs               # the reader (:data:`READERS`)
    data: crows-pairs/crows_pairs_anonymized.csv   # path under the data root (a file or a
                                                   # folder); ./name: beside the stub (shipped)
    env: BIASAUDIT_CROWS_PAIRS        # optional: environment variable with a full path (wins)
    url: https://...                  # where users download the data
    encoding: utf-8                   # optional, for readers that take one (default: detected)
    invalid: skip                     # optional, CrowS-Pairs: skip (default: drop and record malformed rows) or error
    description, provenance, licence  # as in the native format

The data root is ``$BIASAUDIT_DATA``, else ``../shared/data`` beside the checkout. A stub whose
data cannot be found loads as a :class:`DataError` naming the path, the environment variables
that set it and the download address; listings mark it unavailable instead of failing.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from audit.datasets._common import _check_keys, _check_language, _text, _where, data_root
from audit.datasets import bbq as bbq_data
from audit.datasets import honest as honest_data
from audit.datasets.crows_pairs import read_crows_pairs
from audit.errors import DataError
from audit.suites import TEST_TYPES

__all__ = ["STUB_FIELDS", "READERS", "FORMAT_TYPES", "SNIFFERS", "register_format", "sniffed_format", "Stub",
           "data_root", "parse_stub", "is_stub", "load_stub"]

STUB_FIELDS = ("name", "language", "format", "data", "env", "url", "encoding", "invalid", "description",
               "provenance", "licence")


def _read_crows_pairs(path: Path, stub: "Stub") -> Any:
    return read_crows_pairs(path, name=stub.name, language=stub.language, provenance=stub.provenance,
                            licence=stub.licence, encoding=stub.encoding or None, invalid=stub.invalid or "skip")


def _read_honest(path: Path, stub: "Stub") -> Any:
    return honest_data.read_honest_templates(path, name=stub.name, language=stub.language, provenance=stub.provenance,
                                             licence=stub.licence, description=stub.description)


def _read_bbq(path: Path, stub: "Stub") -> Any:
    return bbq_data.read_bbq(path, name=stub.name, language=stub.language, provenance=stub.provenance,
                             licence=stub.licence, description=stub.description)


#: format -> ``reader(path, stub) -> test object``.
READERS: dict[str, Callable[[Path, "Stub"], Any]] = {
    "crows-pairs": _read_crows_pairs, honest_data.FORMAT: _read_honest, bbq_data.FORMAT: _read_bbq}
#: format -> the type of test object its reader returns (``words``: a WordTest; ``pairs``: a
#: SentencePairs; ``completion``: CompletionTemplates; ``multiple_choice``: MultipleChoice), known
#: without reading the data.
FORMAT_TYPES: dict[str, str] = {"crows-pairs": "pairs", honest_data.FORMAT: "completion",
                                bbq_data.FORMAT: "multiple_choice"}
#: format -> ``sniff(path) -> bool``: whether a data file passed by path is in that format (formats
#: registered with one are read from a bare data file too, no stub needed).
SNIFFERS: dict[str, Callable[[Path], bool]] = {}


def register_format(name: str, reader: Callable[[Path, "Stub"], Any], test_type: str,
                    sniff: Callable[[Path], bool] | None = None) -> None:
    """Add a data format (a plugin's or a new benchmark's reader): stubs may name it in their
    ``format`` field and, with ``sniff``, a data file passed by path is read with ``reader``.
    ``test_type`` is a registered test type (:data:`audit.suites.TEST_TYPES`)."""
    if test_type not in TEST_TYPES:
        raise ValueError(f"format {name!r}: unknown test type {test_type!r}; known: {', '.join(TEST_TYPES)}")
    if name in READERS and READERS[name] is not reader:
        raise ValueError(f"format {name!r} is registered twice")
    READERS[name], FORMAT_TYPES[name] = reader, test_type
    if sniff is not None:
        SNIFFERS[name] = sniff


def sniffed_format(path: Path) -> str | None:
    """The registered format whose sniffer recognises the data file ``path``, or ``None``."""
    return next((f for f, sniff in SNIFFERS.items() if path.is_file() and sniff(path)), None)


@dataclasses.dataclass(frozen=True)
class Stub:
    """A parsed stub (see the module docstring)."""

    name: str
    language: str
    format: str
    data: str
    env: str = ""
    url: str = ""
    encoding: str = ""
    invalid: str = ""
    description: str = ""
    provenance: str = ""
    licence: str = ""
    source: str = ""

    def path(self) -> Path:
        """The data file or folder: ``$<env>`` when set, else ``data`` beside the stub when it
        starts with ``./`` (data shipped with the project), else under :func:`data_root`."""
        if self.env and os.environ.get(self.env):
            return Path(os.environ[self.env])
        if self.data.startswith("./") and self.source:
            return Path(self.source).parent / self.data[2:]
        p = Path(self.data).expanduser()
        return p if p.is_absolute() else data_root() / p

    def available(self) -> bool:
        return self.path().exists()

    def missing_message(self) -> str:
        how = f"set {self.env} to the file or " if self.env else ""
        url = f"; download it from {self.url}" if self.url else ""
        return (f"{self.source or self.name}: the data of test {self.language}/{self.name} is not at {self.path()} "
                f"({how}set BIASAUDIT_DATA to the folder holding {self.data}){url}")


def is_stub(data: Any) -> bool:
    return isinstance(data, Mapping) and "format" in data


def parse_stub(data: Mapping[str, Any], source: str | Path = "") -> Stub:
    where = _where(source)
    _check_keys(data, STUB_FIELDS, where, "stub")
    fmt = _text(data.get("format"), where, "format")
    if fmt not in READERS:
        raise DataError(f"{where}: field format: unknown format {fmt!r}; known: {', '.join(READERS)}")
    opt = {k: _text(data.get(k), where, k, required=False) or "" for k in
           ("env", "url", "encoding", "invalid", "description", "provenance", "licence")}
    return Stub(name=_text(data.get("name"), where, "name"),
                language=_check_language(data.get("language"), where),
                format=fmt, data=_text(data.get("data"), where, "data"), source=str(source), **opt)


def load_stub(stub: Stub) -> Any:
    """The test object of a stub (a :class:`DataError` naming where to get missing data)."""
    p = stub.path()
    if not p.exists():
        raise DataError(stub.missing_message())
    return READERS[stub.format](p, stub)
