"""What runs where: the shipped tests with the metrics they support (``audit datasets``), and per
language which metric runs on which model kind.

Listings read the test registry (:mod:`audit.datasets`) and the metric registry
(:mod:`audit.registry`); a test whose data lives elsewhere (a stub) is listed without reading its
data, marked unavailable when the data is not found.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pandas as pd

from audit import registry
from audit.datasets import SUPPORTED_LANGUAGES, datasets_root, read_registered, stub_of
from audit.datasets._common import _check_language as check_language
from audit.datasets._common import _reader_code
from audit.outputs import cache_dir, write_text_atomic
from audit.datasets.external import FORMAT_TYPES
from audit.datasets.registry import _scan
from audit.entries import MODEL_KINDS
from audit.errors import DataError
from audit.suites import TEST_TYPES, SentencePairs, WordTest

__all__ = ["LANGUAGE_NAMES", "supported_metrics", "list_tests", "datasets_markdown", "coverage_table"]

#: English names of the supported languages, for listings.
LANGUAGE_NAMES = {"en": "English", "de": "German", "nl": "Dutch", "it": "Italian", "nb": "Norwegian Bokmål",
                  "is": "Icelandic", "tr": "Turkish", "fr": "French", "es": "Spanish", "ca": "Catalan",
                  "pt": "Portuguese", "ro": "Romanian"}




def supported_metrics(test: WordTest | SentencePairs) -> list[str]:
    """The metrics a test supports (:func:`audit.registry.supported`)."""
    return registry.supported(test)


def _stub_metrics(stub) -> list[str]:
    ttype = FORMAT_TYPES[stub.format]
    return [n for n, e in registry.METRICS.items() if e.family.test_type == ttype]


def _signature(*paths: Path) -> tuple:
    """What a stub's size depends on: name, size and modification time of the stub file and of every
    file under its data path (a stat per file, no reading)."""
    out = []
    for p in paths:
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        out.extend((str(f), st.st_size, st.st_mtime_ns) for f in files for st in [f.stat()])
    return tuple(out)


@functools.cache
def _code_signature() -> tuple:
    """The code a stub's size depends on besides its data, part of the disk cache's key: the
    readers and the test types (their digest, the one the parsed-data cache keys on:
    :func:`audit.datasets._common._reader_code`) and this module (name, size, modification time)."""
    return (_reader_code(), *_signature(Path(__file__)))


def _cache_file(path: str, signature: tuple) -> Path:
    key = json.dumps([path, signature, _code_signature()], separators=(",", ":"))
    return cache_dir() / "catalog" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def _read_cached(f: Path) -> str | None:
    try:
        got = json.loads(f.read_text("utf-8"))
    except (OSError, ValueError):
        return None  # not there, unreadable, or a torn write: read the data again
    return got.get("size") if isinstance(got, dict) and isinstance(got.get("size"), str) else None


def _write_cached(f: Path, size: str) -> None:
    """Best effort (a read-only home costs a re-read, never a failure); written to a temporary
    file then renamed, so a reader in another process sees the whole entry or none."""
    try:
        write_text_atomic(f, json.dumps({"size": size}))
    except OSError:
        pass


@functools.lru_cache(maxsize=64)
def _stub_size(path: str, signature: tuple) -> tuple[bool, str]:
    """``(available, "27320 items")`` of the stub at ``path``, or ``(False, the DataError)``: its data
    is read in full (the reader validates every row), once per process and ``signature``
    (:func:`_signature`): a listing repeated in one process (tests, ``audit datasets`` after
    ``--coverage``) does not read a BBQ folder again unless a file of it changed. A size is also
    kept on disk (:func:`cache_dir`, ``catalog/``), keyed by ``path``, ``signature`` and the
    signature of the reader code (:func:`_code_signature`), so the next process does not read the data
    again either (the four BBQ folders took 7 s); an error is never cached, its message is current."""
    f = _cache_file(path, signature)
    if (size := _read_cached(f)) is not None:
        return True, size
    stub = stub_of(Path(path))
    try:
        size = f"{len(read_registered(Path(path)).table)} {TEST_TYPES[FORMAT_TYPES[stub.format]].unit or 'rows'}"
    except DataError as e:
        return False, str(e)
    _write_cached(f, size)
    return True, size


def list_tests(language: str | None = None, root: str | Path | None = None) -> pd.DataFrame:
    """One row per registered test (qualified names only), sorted by name.

    Columns: ``name`` (``en/weat1``), ``language``, ``targets`` and ``attributes`` (``"set
    (size), ..."``; for sentence-pair tests the number of pairs), ``provenance``, ``licence``,
    ``metrics`` (comma separated), ``path``, ``available`` (whether the data is there: always for
    shipped tests; for stubs, whether their data file was found). For a stub, ``targets`` holds
    its size (``1508 pairs``, ``810 templates``, ``11956 items``).
    """
    if language is not None:
        language = check_language(language, "list_tests", "language (argument)")
    qualified, _ = _scan(Path(root) if root is not None else datasets_root())
    rows = []
    for key, path in qualified.items():
        if language is not None and not key.startswith(language + "/"):
            continue
        stub = stub_of(path)
        if stub is not None:
            ok = stub.available()
            size = ""
            if ok:
                ok, size = _stub_size(str(path), _signature(path, stub.path()))
            rows.append({
                "name": key, "language": stub.language, "targets": size or f"data not found ({stub.path()})",
                "attributes": "", "provenance": stub.provenance, "licence": stub.licence,
                "metrics": ", ".join(_stub_metrics(stub)), "path": str(stub.path()), "available": ok,
            })
            continue
        t = read_registered(path)

        def sizes(sets, role):
            if t.sentences:
                return ", ".join(f"{s.name} ({len(x)} sentences)" for s, x in zip(sets, t.sentences[role]))
            return ", ".join(f"{s.name} ({len(s.words)})" for s in sets)

        rows.append({
            "name": key, "language": t.language,
            "targets": sizes(t.targets, "targets"), "attributes": sizes(t.attributes, "attributes"),
            "provenance": t.provenance, "licence": t.licence,
            "metrics": ", ".join(supported_metrics(t)), "path": str(path), "available": True,
        })
    cols = ["name", "language", "targets", "attributes", "provenance", "licence", "metrics", "path", "available"]
    return pd.DataFrame(rows, columns=cols)


def _md(text: str) -> str:
    """A Markdown table cell: pipes escaped, line breaks as spaces."""
    return " ".join(str(text).split()).replace("|", "\\|")


def datasets_markdown(language: str | None = None, root: str | Path | None = None) -> str:
    """The shipped tests as Markdown: one section per language (in :data:`SUPPORTED_LANGUAGES`
    order, languages without tests left out), one row per test with its target and attribute
    sets (sizes) and the metrics it supports (:func:`supported_metrics`).

    Pure text, no extra dependency (``pandas.DataFrame.to_markdown`` needs ``tabulate``); the
    content is that of :func:`list_tests`.
    """
    df = list_tests(language, root)
    out: list[str] = []
    for lang in SUPPORTED_LANGUAGES:
        rows = df[df.language == lang]
        if rows.empty:
            continue
        out.append(f"### {LANGUAGE_NAMES[lang]} (`{lang}`): {len(rows)} tests\n")
        out.append("| test | targets | attributes | metrics |")
        out.append("| --- | --- | --- | --- |")
        for r in rows.itertuples(index=False):
            out.append(f"| `{r.name}` | {_md(r.targets)} | {_md(r.attributes)} | {_md(r.metrics)} |")
        out.append("")
    return "\n".join(out)


def coverage_table(language: str | None = None, root: str | Path | None = None) -> pd.DataFrame:
    """Per language and metric, on how many of the language's tests the metric runs for each
    model kind (0 where it cannot run on that kind): rows ``(language, metric)``, one column per
    model kind. Stubs whose data is missing count as not running."""
    df = list_tests(language, root)
    rows = []
    for lang in SUPPORTED_LANGUAGES:
        sub = df[(df.language == lang) & df.available]
        if sub.empty:
            continue
        for name, e in registry.METRICS.items():
            n = int(sum(name in [m.strip() for m in str(ms).split(",")] for ms in sub.metrics))
            rows.append({"language": lang, "metric": name,
                         **{k: (n if k in e.model_kinds else 0) for k in MODEL_KINDS}})
    return pd.DataFrame(rows, columns=["language", "metric", *MODEL_KINDS])
