"""The sentence-transformers engine: embedding models audited with their own configured modules.

A sentence-transformers model is a local folder holding ``modules.json`` (the module pipeline:
Transformer, then Pooling, often Normalize or Dense), loaded with
``sentence_transformers.SentenceTransformer``. It is named explicitly, so that a checkpoint that
also loads as a plain Hugging Face encoder keeps the numbers and keys its audits already have:

* the prefix ``st:`` -- ``st:/path/to/folder``, ``st:./models/x``, ``st:minilm`` or
  ``st:pkg:<module>`` (a packaged checkpoint, :func:`audit.runner.resolve_packaged`); or
* ``backend: sentence-transformers`` on the model (a spec) / ``backend="sentence-transformers"``
  (:func:`audit.runner.load_model`).

A folder without ``modules.json`` is refused (one line): the model's own pooling is what is
audited, and sentence-transformers would otherwise invent a mean pooling for it. Hub ids are not
fetched by this engine: download the folder first (``huggingface-cli download``) and name it.

The model interface (:class:`audit.backends.base.LanguageModel`) it implements is ``embed``:
``SentenceTransformer.encode(sentences, batch_size, convert_to_numpy=True)`` -- the configured
pooling, normalisation and dense layers, exactly as users of the model embed text -- as float32
``(n, dim)``. Conventions are the library's: the tokenizer's special tokens, truncation at the
model's ``max_seq_length`` (sentence-transformers truncates silently, so a sentence longer than
that is refused here with :class:`~audit.errors.DataError`), padding per batch. Pooling methods
other than ``"model"`` (the configured modules) and layers other than the last are refused with
:class:`~audit.errors.ParameterError` (``spans`` are ignored, as the Hugging Face engine ignores them
for whole-sentence pooling); the log-likelihood and completion operations
with :class:`~audit.errors.ModelError` (an embedding model has no LM head). Model kind:
``sentence``; revision: the ``sha256:`` digest of the folder (:func:`audit.backends.hf.dir_digest`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from audit.backends import table as backend_table
from audit.backends.batching import check_batch_size
from audit.backends.hf import dir_digest, pick_device
from audit.backends.hf_embed import MODEL_METHOD
from audit.errors import DataError, ModelError, ParameterError
from audit.provenance import canonical_dtype

__all__ = ["PREFIX", "BACKEND", "KIND", "METHOD", "STModel", "is_st_ref", "strip_prefix", "load_st_model", "load",
           "probe_revision"]

#: This engine's row of the backend table (:mod:`audit.backends.table`): its name, kind and prefix
#: are written there once.
_ROW = backend_table.get("sentence-transformers")
PREFIX = _ROW.prefix
BACKEND = _ROW.name
KIND = _ROW.kind
#: The one pooling method: the model's configured modules.
METHOD = MODEL_METHOD


def is_st_ref(ref: str | os.PathLike) -> bool:
    """Whether a reference names a sentence-transformers model by itself (the ``st:`` prefix)."""
    return backend_table.of_prefix(ref) is _ROW


def strip_prefix(ref: str) -> str:
    """The reference without its ``st:`` prefix (:func:`audit.backends.table.strip_prefix`)."""
    return backend_table.strip_prefix(ref, _ROW)


@dataclasses.dataclass
class STModel:
    """A loaded sentence-transformers model (the model interface's ``embed``; module docstring)."""

    ref: str
    path: str
    revision: str
    encoder: Any
    device: Any
    backend: str = BACKEND
    kind: str = KIND

    @property
    def dim(self) -> int:
        return int(self.encoder.get_embedding_dimension())

    @property
    def max_length(self) -> int:
        return int(self.encoder.max_seq_length)

    @property
    def num_hidden_layers(self) -> int:
        return 0  # one output: the configured pipeline's; layer -1 (or 0) names it

    def provenance(self) -> dict[str, str]:
        return {"model": self.ref, "name_or_path": self.path, "revision": self.revision, "backend": self.backend,
                "resolution": "local directory", "device": str(self.device),
                "modules": ", ".join(type(m).__name__ for m in self.encoder)}

    def load_info(self) -> dict[str, str]:
        return {"device": str(self.device), "modules": ", ".join(type(m).__name__ for m in self.encoder)}

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text with the tokenizer's special tokens, untruncated."""
        tok = self.encoder.tokenizer
        return [len(ids) for ids in tok(list(texts), add_special_tokens=True, truncation=False)["input_ids"]]

    def embed(self, sentences: Sequence[str], *, method: str | None = None, spans: Any = None, layer: int = -1,
              batch_size: int | None = 32, padding_side: str = "right") -> np.ndarray:
        """``SentenceTransformer.encode`` of the sentences: float32 ``(n, dim)`` (module docstring)."""
        if method not in (None, METHOD):
            raise ParameterError(f"method: model {self.ref!r} is a sentence-transformers model, embedded with its "
                                 f"configured modules only (method {METHOD!r}), not {method!r}")
        if isinstance(layer, bool) or layer not in (-1, 0):
            raise ParameterError(f"layer: model {self.ref!r} has one output, its configured pipeline's "
                                 f"(layer -1), not {layer!r}")
        if padding_side != "right":
            raise ParameterError(f"padding_side: {padding_side!r}; sentence-transformers pads on the right")
        batch_size = check_batch_size(batch_size)
        if isinstance(sentences, str) or not all(isinstance(s, str) and s.strip() for s in sentences):
            raise DataError("sentences: expected a list of non-empty strings")
        sentences = list(sentences)
        if not sentences:
            return np.zeros((0, self.dim), dtype=np.float32)
        limit = self.max_length
        for s, n in zip(sentences, self.count_tokens(sentences)):
            if n > limit:
                short = s if len(s) <= 80 else s[:77] + "..."
                raise DataError(f"sentence {short!r} has {n} tokens; model {self.ref!r} accepts at most {limit}")
        out = self.encoder.encode(sentences, batch_size=batch_size or 32, convert_to_numpy=True,
                                  show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    def is_unknown_word(self, word: str) -> bool:
        tok = self.encoder.tokenizer
        unk = getattr(tok, "unk_token_id", None)
        if unk is None:
            return False
        ids = tok(word, add_special_tokens=False)["input_ids"]
        return bool(ids) and all(i == unk for i in ids)

    def _no_lm(self, what: str) -> None:
        raise ModelError(f"model {self.ref!r} is a sentence-transformers embedding model (kind={KIND!r}); {what} "
                         "needs a masked LM or a causal LM")

    def loglikelihood(self, requests, *, batch_size=None, start="always"):
        self._no_lm("log-likelihood")

    def loglikelihood_rolling(self, sentences, *, batch_size=None, start="always"):
        self._no_lm("rolling log-likelihood")

    def pair_pll(self, pairs, *, batch_size=None):
        self._no_lm("pair pseudo-log-likelihood")

    def masked_scores(self, requests, *, batch_size=None):
        self._no_lm("masked-LM scores")

    def topk_fills(self, templates, k, *, slot="[M]", batch_size=None):
        self._no_lm("top-k fills")

    def first_words(self, prompts, k, *, decoding="greedy", seed=0, max_new_tokens=8, batch_size=None,
                    start="always"):
        self._no_lm("generation")

    def samples(self, prompts, k, *, seed=0, max_new_tokens=10, temperature=1.0, top_k=50, top_p=1.0,
                batch_size=None, start="always"):
        self._no_lm("generation")

    def token_positions(self, text, spans):
        self._no_lm("token positions")


def load_st_model(ref: str, *, path: str | None = None, device: str | None = None) -> STModel:
    """Load a sentence-transformers folder (``path``, default ``ref`` without its ``st:`` prefix)
    offline on ``device`` (default CUDA when available, else CPU)."""
    folder = Path(path or strip_prefix(ref)).expanduser()
    if not folder.is_dir():
        raise ModelError(f"model {ref!r}: {str(folder)!r} is not a local folder; the sentence-transformers engine "
                         "loads local folders (download a Hub model first and name its folder)")
    if not (folder / "modules.json").is_file():
        raise ModelError(f"model {ref!r}: {str(folder)!r} has no modules.json, so it is not a sentence-transformers "
                         "model; load it as a Hugging Face checkpoint (backend hf-encoder) instead")
    from sentence_transformers import SentenceTransformer

    dev = str(pick_device(device))
    try:
        enc = SentenceTransformer(str(folder), device=dev, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - one line naming the model
        raise ModelError(f"model {ref!r}: sentence-transformers could not load {str(folder)!r} "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    enc.eval()
    return STModel(ref=ref, path=str(folder), revision=dir_digest(folder), encoder=enc, device=dev)


def load(ref: str, *, path: str, device: Any = None, dtype: str | None = None) -> STModel:
    """The engine's loader (the ``sentence-transformers`` row of :mod:`audit.backends.table`):
    float32 only."""
    if canonical_dtype(dtype) != "float32":
        raise ParameterError(f"dtype: model {ref!r} is a sentence-transformers model, loaded in float32; "
                             f"{dtype!r} is not supported by that engine")
    return load_st_model(ref, path=path, device=device)


def probe_revision(path: str) -> str | None:
    """The revision :func:`load` reports for a local model folder (its content digest), without
    loading; ``None`` for a Hub id (known after loading)."""
    p = Path(path).expanduser()
    return dir_digest(p) if p.is_dir() else None
