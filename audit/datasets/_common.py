"""Text, YAML and field helpers shared by every reader of :mod:`audit.datasets`
(package-private). Conventions: see :mod:`audit.datasets`."""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import os
import pickle
import sys
import threading
import time
import unicodedata
from copy import deepcopy
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import yaml

from audit.errors import DataError
from audit.outputs import cache_dir, private_folder, write_atomic

#: Languages of shipped tests and accepted language tags. Spanish, Catalan, Portuguese and Romanian
#: have completion and question-answering tests (HONEST, the BBQ family) but no word lists.
SUPPORTED_LANGUAGES = ("en", "de", "nl", "it", "nb", "is", "tr", "fr", "es", "ca", "pt", "ro")

#: The language of a test read from a file outside any folder named after a language, when none
#: is given (ISO 639-2 "undetermined"): static-vector metrics run on it; whatever needs the
#: language (templates for transformers) asks for one.
UNDETERMINED = "und"


# ======================================================================================
# Parsed files kept per process
# ======================================================================================

_T = TypeVar("_T")

#: Most values :func:`parsed_once` keeps per kind of file in one process (EsBBQ's 27,000 items take
#: about 25 MB as a table); a kind may ask for more (:data:`YAML_KEEP`).
PARSED_KEEP = 8
_PARSED: dict[str, collections.OrderedDict[tuple, Any]] = {}
_PARSED_LOCK = threading.Lock()
_MISSING = object()


def _contents_key(files: Sequence[Path]) -> tuple[tuple[str, str], ...] | None:
    """Each file's resolved path and BLAKE2 digest of its bytes; ``None`` if one cannot be read."""
    try:
        return tuple((str(Path(f).resolve()), hashlib.blake2b(Path(f).read_bytes(), digest_size=16).hexdigest())
                     for f in files)
    except OSError:
        return None


def parsed_once(kind: str, args: tuple, files: Sequence[Path], parse: Callable[[], _T],
                copy: Callable[[_T], _T] | None = None, keep: int = PARSED_KEEP, disk: bool = False) -> _T:
    """``parse()``, or the value an earlier call of this process parsed from the same ``files`` with
    the same ``kind`` and ``args``; ``copy`` (default: none) makes what each caller gets its own.

    The one cache of parsed data files (BBQ-family data, HurtLex lexicons, SEAT templates, YAML
    files: :func:`_load_yaml`). Keyed by
    the files' *content* (a digest of their bytes: reading and hashing EsBBQ's 18 MB takes 0.035 s,
    parsing it 1.0 s), so a file rewritten in place is parsed again even within one tick of the
    file system's clock and at the same size. The last ``keep`` (default :data:`PARSED_KEEP`) values
    of each kind are kept. A file that cannot be read, or a ``parse`` that raises, leaves nothing behind (the
    reader's own error is raised).

    disk: also keep the value between processes (:func:`_disk_value`), for data whose parsing
    costs seconds (BBQ-family folders: EsBBQ 1.9 CPU-s to parse, 0.07 to load)."""
    key = _contents_key(files)
    if key is None:
        return parse()
    key = (args, key)
    with _PARSED_LOCK:
        table = _PARSED.setdefault(kind, collections.OrderedDict())
        value = table.get(key, _MISSING)
        if value is not _MISSING:
            table.move_to_end(key)
    if value is _MISSING:
        value = _disk_value(kind, key, parse) if disk else parse()
        with _PARSED_LOCK:
            table[key] = value
            while len(table) > keep:
                table.popitem(last=False)
    return copy(value) if copy is not None else value


#: Parsing that takes less CPU time than this is not kept on disk (loading would save little).
PARSED_DISK_MIN_S = 0.25
#: Most files :func:`_disk_value` keeps (the least recently used go first): the four BBQ-family
#: folders take 41 MB.
PARSED_DISK_KEEP = 16


@functools.cache
def _reader_code() -> str:
    """SHA-256 of what a parsed value depends on besides its files: the readers (this package),
    the test types (``audit/suites.py``), and the pandas, numpy and Python versions that pickled it.
    Also part of the key of the catalog's sizes (:func:`audit.catalog._code_signature`)."""
    import numpy
    import pandas

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(f"{pandas.__version__} {numpy.__version__} {sys.version_info[:2]}".encode())
    for f in (*sorted(here.rglob("*.py")), here.parent / "suites.py"):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def _disk_value(kind: str, key: tuple, parse: Callable[[], _T]) -> _T:
    """The value kept in ``$BIASAUDIT_CACHE/parsed/`` (:func:`audit.outputs.cache_dir`) for
    ``kind`` and ``key`` (the arguments and the files' digests, :func:`parsed_once`) by an earlier
    process, else ``parse()``, kept there when it took at least :data:`PARSED_DISK_MIN_S` CPU
    seconds. The file's name is the SHA-256 of the key and of :func:`_reader_code`, so edited
    reader code or another pandas parses again. Kept as a pickle, and therefore only in a folder
    that this user owns and nobody else may write to (:func:`audit.outputs.private_folder`;
    otherwise nothing is read or written there); written whole or not at all (a temporary file
    renamed). A file that cannot be read or unpickled is parsed again and replaced; a folder that
    cannot be written costs a parse, never a failure. At most :data:`PARSED_DISK_KEEP` files are
    kept, the least recently used removed first."""
    root = cache_dir() / "parsed"
    if not private_folder(root):
        return parse()
    name = hashlib.sha256(repr((kind, key, _reader_code())).encode()).hexdigest()
    f = root / f"{kind}-{name}.pickle"
    try:
        with open(f, "rb") as fh:
            value = pickle.load(fh)
    except Exception:  # noqa: BLE001 - none yet, or a damaged one: parsed (again) and written
        pass
    else:
        with contextlib.suppress(OSError):
            os.utime(f)  # recently used (pruned last)
        return value
    t = time.process_time()
    value = parse()
    if time.process_time() - t >= PARSED_DISK_MIN_S:
        try:
            write_atomic(f, lambda tmp: tmp.write_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)))
            _prune(root, PARSED_DISK_KEEP)
        except OSError:
            pass
    return value


def _prune(root: Path, keep: int) -> None:
    """Remove all but the ``keep`` most recently used ``*.pickle`` files of ``root``."""
    files = []
    for f in root.glob("*.pickle"):
        try:
            files.append((f.stat().st_mtime_ns, f))
        except OSError:
            continue
    for _, f in sorted(files, reverse=True)[keep:]:
        try:
            f.unlink()
        except OSError:
            pass


# ======================================================================================
# Small helpers: text, YAML, validation
# ======================================================================================


def _where(source: str | Path) -> str:
    return str(source) if str(source) else "<test>"


def _read_text(path: Path) -> str:
    """The file's text: strict UTF-8, BOM dropped, line ends made ``\\n``, NFC-normalised."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a test file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(
            f"{path}: not UTF-8 (byte 0x{raw[e.start]:02x} at line {line}, offset {e.start}); "
            "save the file as UTF-8"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


class _RefuseDuplicateKeys:
    """Mixin of a safe loader: duplicate mapping keys (which PyYAML silently drops) are refused."""

    def construct_mapping(self, node, deep=False):  # noqa: D102 (PyYAML hook)
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"unhashable key {key!r}", key_node.start_mark) from None
                if dup:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _StrictLoader(_RefuseDuplicateKeys, yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate mapping keys."""


class _FastStrictLoader(_RefuseDuplicateKeys, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """:class:`_StrictLoader` on libyaml's parser (about 5x faster, same constructor and resolver,
    so the same data); its error wording differs, so a file it refuses is parsed again by
    :class:`_StrictLoader` for the message."""


#: YAML files :func:`_load_yaml` keeps parsed: more than the datasets folder holds (120 files), so a
#: process that reads the registry again (the planner: every registered file's kind, the corpus
#: builder, the catalog) parses each file once. The eight-language smoke sweep's driver parsed
#: them 1,422 times, at 0.67 ms each; a copy of a kept file costs 0.07 ms.
YAML_KEEP = 512


def _load_yaml(path: Path) -> Any:
    """The YAML document of ``path`` (strict UTF-8 text, duplicate keys refused), parsed once per
    content in this process (:func:`parsed_once`); each caller gets its own copy."""
    return parsed_once("yaml", (), [path], lambda: _parse_yaml(path), copy=deepcopy, keep=YAML_KEEP)


def _parse_yaml(path: Path) -> Any:
    text = _read_text(path)
    try:
        try:
            return yaml.load(text, Loader=_FastStrictLoader)  # noqa: S506 (safe loader subclass)
        except yaml.YAMLError:
            return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (PyYAML's own message)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise DataError(f"{path}: malformed YAML{where}: {problem}") from None


def _nfc(s: str) -> str:
    return unicodedata.normalize("NFC", s)


def _text(value: Any, where: str, field: str, *, required: bool = True) -> str:
    """A free-text field: a string (NFC, stripped); empty only if not required."""
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field} must be a string, got {_typename(value)} {value!r}")
    value = _nfc(value).strip()
    if required and not value:
        raise DataError(f"{where}: field {field} is empty")
    return value


def _typename(v: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", type(None): "null"}.get(type(v), type(v).__name__)


def _yaml_hint(v: Any) -> str:
    if isinstance(v, (bool, int, float)) or v is None:
        return " (YAML reads unquoted yes/no/on/off/true/false/null and numbers as non-strings; quote it)"
    return ""


def _clean_entry(value: Any, where: str, field: str) -> str:
    """A word or sentence: a non-empty string, NFC, stripped, inner whitespace collapsed."""
    if not isinstance(value, str):
        raise DataError(f"{where}: {field} is {_typename(value)} {value!r}, not a string{_yaml_hint(value)}")
    s = " ".join(_nfc(value).split())
    if not s:
        raise DataError(f"{where}: {field} is empty")
    return s


def _string_list(value: Any, where: str, field: str, *, allow_empty: bool = False) -> list[str]:
    if not isinstance(value, list):
        raise DataError(f"{where}: field {field} must be a list of strings, got {_typename(value)}")
    out = [_clean_entry(v, where, f"{field}[{i}]") for i, v in enumerate(value)]
    if not out and not allow_empty:
        raise DataError(f"{where}: field {field} is empty")
    return out


def _check_unique(items: Sequence[str], where: str, field: str, what: str = "word") -> None:
    first: dict[str, int] = {}
    for i, w in enumerate(items):
        if w in first:
            raise DataError(f"{where}: {field}: duplicate {what} {w!r} (positions {first[w]} and {i})")
        first[w] = i


def _check_keys(obj: Mapping, allowed: Sequence[str], where: str, field: str) -> None:
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise DataError(
            f"{where}: unknown field {field + '.' if field else ''}{unknown[0]!r}; "
            f"allowed: {', '.join(allowed)}"
        )


def _check_language(language: Any, where: str, field: str = "language") -> str:
    if not isinstance(language, str):
        raise DataError(f"{where}: field {field} must be a string, got {_typename(language)}")
    lang = language.strip().lower()
    if lang == UNDETERMINED:
        raise DataError(f"{where}: the test's language is unknown (its file is not in a folder named after "
                        f"a language): pass --language to `audit score`, or language= in code")
    if lang not in SUPPORTED_LANGUAGES:
        raise DataError(
            f"{where}: field {field}: language {language!r} is not supported; "
            f"use one of {', '.join(SUPPORTED_LANGUAGES)} (ISO 639-1; Norwegian Bokmål is 'nb')"
        )
    return lang



_TEMPLATE_FILE = "templates"  # datasets/<lang>/templates.yaml holds templates, not a test

#: Where an installed wheel holds the shipped ``datasets/`` folder (package data ``audit/_data``).
PACKAGED_DATASETS = Path(__file__).resolve().parents[1] / "_data"


def datasets_root() -> Path:
    """The folder of shipped tests: ``$BIASAUDIT_DATASETS`` if set, else the package data of an
    installed wheel (``audit/_data``), else the checkout's ``datasets/`` (next to ``audit/``)."""
    env = os.environ.get("BIASAUDIT_DATASETS")
    if env:
        return Path(env)
    if PACKAGED_DATASETS.is_dir():
        return PACKAGED_DATASETS
    return Path(__file__).resolve().parents[2] / "datasets"


def data_root() -> Path:
    """Where stubs' ``data`` paths are resolved: ``$BIASAUDIT_DATA``, else ``../shared/data``
    beside the checkout (from an installed package: relative to the working directory, as the
    shipped specs' ``${BIASAUDIT_DATA:-../shared/data}``)."""
    env = os.environ.get("BIASAUDIT_DATA")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return checkout.parent / "shared" / "data"
    return Path("..") / "shared" / "data"
