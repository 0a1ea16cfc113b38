"""The registry of shipped tests under ``datasets/``, look-up by name or path, allow-lists."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from audit.datasets._common import (
    _TEMPLATE_FILE,
    SUPPORTED_LANGUAGES,
    _check_language,
    _load_yaml,
    _read_text,
    datasets_root,
)
from audit.datasets.bbq import looks_like_bbq, read_bbq
from audit.datasets.bias import read_bias_jsonl, read_bias_weat_txt
from audit.datasets.crows_pairs import TEST_NAME as CROWS_PAIRS_TEST
from audit.datasets.crows_pairs import read_crows_pairs
from audit.datasets.external import FORMAT_TYPES, READERS, Stub, is_stub, load_stub, parse_stub, sniffed_format
from audit.datasets.honest import looks_like_honest, read_honest_templates
from audit.datasets.native import parse_native
from audit.errors import DataError
from audit.suites import CompletionTemplates, MultipleChoice, SentencePairs, WordTest

#: Any test object the readers return.
AnyTest = WordTest | SentencePairs | CompletionTemplates | MultipleChoice

_TEST_SUFFIXES = (".yaml", ".yml")
_BIAS_TXT_SUFFIXES = (".txt",)
_BIAS_JSON_SUFFIXES = (".jsonl", ".json")
_PAIRS_SUFFIXES = (".csv", ".tsv")


def _scan(root: Path) -> tuple[dict[str, Path], dict[str, list[str]]]:
    if not root.is_dir():
        raise DataError(f"datasets folder {root} does not exist (set BIASAUDIT_DATASETS to the folder "
                        "that holds <language>/<test>.yaml)")
    # os.scandir: each entry's kind comes with the listing (no stat per file; 1.4 -> 0.8 ms for the
    # shipped folder, looked up on every test name a plan or a command resolves)
    qualified: dict[str, Path] = {}
    with os.scandir(root) as it:
        langs = sorted(e.name for e in it if e.name in SUPPORTED_LANGUAGES and e.is_dir())
    for lang in langs:
        lang_dir = root / lang
        with os.scandir(lang_dir) as it:
            names = sorted(e.name for e in it if e.is_file())
        for name in names:
            f = lang_dir / name
            if f.suffix.lower() in _TEST_SUFFIXES and f.stem != _TEMPLATE_FILE:
                key = f"{lang}/{f.stem}"
                if key in qualified:
                    raise DataError(f"{root}: test {key!r} exists twice ({qualified[key].name} and {f.name})")
                qualified[key] = f
    short: dict[str, list[str]] = {}
    for key in qualified:
        short.setdefault(key.split("/", 1)[1], []).append(key)
    return qualified, short


def registry(root: str | Path | None = None) -> dict[str, Path]:
    """Registered test name -> file, for every native test under the datasets folder.

    Every file ``<root>/<lang>/<stem>.yaml`` (``templates.yaml`` excepted) is registered as
    ``"<lang>/<stem>"`` and, when no other language has the same stem, also as ``"<stem>"``.
    """
    qualified, short = _scan(Path(root) if root is not None else datasets_root())
    out = dict(qualified)
    for stem, keys in short.items():
        if len(keys) == 1 and stem not in out:
            out[stem] = qualified[keys[0]]
    return out


def _looks_like_file(ref: str) -> bool:
    return Path(ref).suffix.lower() in _TEST_SUFFIXES + _BIAS_TXT_SUFFIXES + _BIAS_JSON_SUFFIXES + _PAIRS_SUFFIXES


def read_registered(path: Path) -> AnyTest:
    """A YAML file of the datasets folder: a native test, or a stub whose data is elsewhere
    (:mod:`audit.datasets.external`)."""
    data = _load_yaml(path)
    if is_stub(data):
        return load_stub(parse_stub(data, path))
    return parse_native(data, path)


def stub_of(path: Path) -> Stub | None:
    """The stub a registered YAML file is, or ``None`` for a native test."""
    data = _load_yaml(path)
    return parse_stub(data, path) if is_stub(data) else None


def _file_type(p: Path) -> str:
    """The test type of a data file by suffix and, for ``.csv``/``.tsv``/``.jsonl``/``.json`` and
    folders, by its header or first record (HONEST templates, BBQ-family data)."""
    suffix = p.suffix.lower()
    fmt = sniffed_format(p)
    if fmt is not None:
        return FORMAT_TYPES[fmt]
    if p.is_dir():
        return "multiple_choice" if looks_like_bbq(p) else "words"
    if suffix in _PAIRS_SUFFIXES:
        if looks_like_honest(p):
            return "completion"
        return "multiple_choice" if looks_like_bbq(p) else "pairs"
    if suffix in _BIAS_JSON_SUFFIXES and looks_like_bbq(p):
        return "multiple_choice"
    if suffix in _TEST_SUFFIXES:
        stub = stub_of(p)
        return FORMAT_TYPES[stub.format] if stub else "words"
    return "words"


def test_type(ref: str | Path) -> str:
    """The type of test a registered name or file holds, without reading its data: ``words``
    (native tests, BIAS files) or the stub format's type (``pairs`` for CrowS-Pairs,
    ``completion`` for HONEST templates, ``multiple_choice`` for the BBQ family); a data file or
    folder is sniffed from its header or first record."""
    if isinstance(ref, Path) or _looks_like_file(str(ref)):
        return _file_type(Path(ref))
    qualified, short = _scan(datasets_root())
    path = qualified.get(ref) or (qualified[short[ref][0]] if len(short.get(ref, [])) == 1 else None)
    if path is None:
        return _file_type(Path(ref)) if Path(ref).is_dir() else "words"
    stub = stub_of(path)
    return FORMAT_TYPES[stub.format] if stub else "words"


def _language_of(path: Path, language: str | None) -> str:
    """The language of a data file passed by path: ``language``, else its folder's name when that
    is a supported language; a :class:`DataError` asking for it otherwise."""
    if language:
        return _check_language(language, str(path), "language")
    for folder in (path, path.parent) if path.is_dir() else (path.parent,):
        if folder.name.lower() in SUPPORTED_LANGUAGES:
            return folder.name.lower()
    raise DataError(f"{path}: the test's language is unknown (it is not in a folder named after a language): "
                    "pass --language to `audit score`, or language= in code")


def _read_any(path: Path, language: str | None = None) -> AnyTest:
    suffix = path.suffix.lower()
    fmt = sniffed_format(path) if path.exists() else None
    if fmt is not None:  # a registered format (audit.datasets.external.register_format)
        lang = _language_of(path, language)
        return READERS[fmt](path, Stub(name=path.stem, language=lang, format=fmt, data=str(path), source=str(path)))
    kind = _file_type(path) if path.exists() else None
    if kind == "completion":
        return read_honest_templates(path, language=_language_of(path, language))
    if kind == "multiple_choice":
        return read_bbq(path, language=_language_of(path, language))
    if path.is_dir():
        raise DataError(f"{path}: a folder without BBQ-family data (.jsonl/.csv files with BBQ's fields)")
    if suffix in _TEST_SUFFIXES:
        return read_registered(path)
    if suffix in _BIAS_TXT_SUFFIXES:
        return read_bias_weat_txt(path, language=language)
    if suffix in _BIAS_JSON_SUFFIXES:
        return read_bias_jsonl(path, language=language)
    if suffix in _PAIRS_SUFFIXES:
        return read_crows_pairs(path, language=_check_language(language or "en", str(path), "language"))
    raise DataError(f"{path}: unknown test file type {path.suffix!r}; expected .yaml/.yml (native), "
                    ".txt (BIAS WEAT), .jsonl (BIAS SEAT/LPBS, BBQ), .csv/.tsv (CrowS-Pairs, HONEST templates, "
                    "EsBBQ/CaBBQ) or a folder of BBQ-family files")


def load_test(ref: str | Path, *, language: str | None = None) -> AnyTest:
    """Load a test by registered name (``"weat1"``, ``"en/weat1"``, ``"de/cw1"``,
    ``"crows_pairs"``) or file path.

    A :class:`~pathlib.Path`, or a string ending in ``.yaml``/``.yml``/``.txt``/``.jsonl``/
    ``.json``/``.csv``/``.tsv``, is read as a file by its suffix and header (native YAML or stub,
    BIAS WEAT ``.txt``, BIAS SEAT/LPBS ``.jsonl``, CrowS-Pairs, HONEST templates, BBQ-family
    ``.jsonl``/``.csv``; a folder of BBQ-family files too); any other string is looked up in
    :func:`registry` first and then tried as a path. With ``language``, a bare registered name
    means that language's version (``"crows_pairs"`` with ``language="nl"`` is
    ``"nl/crows_pairs"``; a name with no version in that language is a :class:`DataError`,
    never another language's test); without it, the only version (the bare ``crows_pairs``: the
    English set). For files, ``language`` is the language of a BIAS or CrowS-Pairs file outside
    a folder named after its language (default: the folder's name for BIAS files, English for
    CrowS-Pairs); HONEST templates and BBQ-family data take it from ``language`` or their
    folder's name. Unknown names raise :class:`DataError` with the closest registered names.
    """
    if isinstance(ref, Path):
        return _read_any(ref, language)
    if not isinstance(ref, str) or not ref.strip():
        raise DataError(f"test reference must be a registered name or a file path, got {ref!r}")
    ref = ref.strip()
    if _looks_like_file(ref):
        return _read_any(Path(ref), language)
    qualified, short = _scan(datasets_root())
    if ref in qualified:
        return read_registered(qualified[ref])
    keys = short.get(ref, [])
    if language and keys:
        lang = _check_language(language, ref, "language")
        if f"{lang}/{ref}" in qualified:
            return read_registered(qualified[f"{lang}/{ref}"])
        raise DataError(f"test {ref!r} has no {lang} version (registered: {', '.join(keys)}); "
                        "use one of those names or leave the language out")
    if len(keys) > 1 and ref == CROWS_PAIRS_TEST and f"en/{ref}" in qualified:
        keys = [f"en/{ref}"]  # the bare name has always meant the English set (fr/, nl/ came later)
    if len(keys) == 1:
        return read_registered(qualified[keys[0]])
    if len(keys) > 1:
        raise DataError(f"test name {ref!r} is ambiguous: {', '.join(keys)}; use the language prefix")
    if Path(ref).exists():
        return _read_any(Path(ref), language)
    names = sorted(set(qualified) | set(short))
    close = difflib.get_close_matches(ref, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; registered: {', '.join(names)}"
    raise DataError(f"unknown test {ref!r} (not a registered name in {datasets_root()} nor a file){hint}")


_ALLOWLIST_FILE = "allowlist.txt"


def load_allowlist(language: str, root: str | Path | None = None) -> dict[str, str]:
    """Rare but valid words of a language that the word-frequency check of the test suite
    (``tests/test_dataset_quality.py``) accepts, from ``<root>/<language>/allowlist.txt``.

    Format: UTF-8 text, one entry per line, ``<word>  # <reason>`` (the reason is required:
    why the word is a valid word of the language although it is rare in the ``wordfreq``
    lists, e.g. a dictionary reference); blank lines and lines starting with ``#`` are
    ignored. An entry is a word of a test (as written, also multi-word) or a single token of
    one.

    Returns
    -------
    dict
        word (NFC) -> reason; empty if the language has no allow-list file.

    Raises
    ------
    DataError
        A line without a reason, a repeated word, or a file that is not UTF-8 (naming the
        file and line).
    """
    language = _check_language(language, "load_allowlist", "language (argument)")
    path = (Path(root) if root is not None else datasets_root()) / language / _ALLOWLIST_FILE
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for lineno, line in enumerate(_read_text(path).split("\n"), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        word, sep, reason = s.partition("#")
        word, reason = " ".join(word.split()), reason.strip()
        if not sep or not reason or not word:
            raise DataError(f"{path}: line {lineno}: expected '<word>  # <reason>', got {s!r}")
        if word in out:
            raise DataError(f"{path}: line {lineno}: word {word!r} is listed twice")
        out[word] = reason
    return out

