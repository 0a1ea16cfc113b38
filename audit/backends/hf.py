"""Hugging Face model loading: references, revisions, safe weights, device and batching.

A *reference* is either a local directory holding a ``config.json`` (a ``save_pretrained``
folder) or a Hub id ``org/name`` with an optional revision, ``org/name@rev``; the prefix
``hf:`` forces the Hugging Face backend (``hf:bert-base-uncased``, ``hf:./models/x``).

Provenance: every loaded model records a resolved ``revision``:

* Hub models: the 40-hex commit hash the files were loaded from. Online, the Hub's model info
  at the requested branch, tag or commit gives it; the files Transformers needs are then
  downloaded at that commit (:func:`fetch_hub_snapshot`) and the branch -> commit pair is
  recorded in the Hugging Face cache (``refs/<branch>``, as ``huggingface_hub`` does), so that
  with ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached after the retries, the branch
  resolves to the commit it had when last fetched (:func:`resolve_hub_revision`). The model and
  tokenizer are then loaded from the cache *at that commit*, so the recorded hash is the one
  used; :attr:`HFModel.resolution` says where it came from (``offline: main resolved to <sha>
  from the cache``).
* Hub errors: transient failures (connection errors, timeouts, HTTP 429 and 5xx) are retried
  with exponential back-off (:mod:`audit.retry`, honouring ``Retry-After``); the others are one
  line saying what to do (:func:`hub_error_message`: check the id or revision on 404, set
  ``HF_TOKEN`` on 401, accept the licence of a gated model).
* Local directories: ``sha256:<hex>`` over every regular file below the directory (``.git``
  folders excluded), in sorted order of their POSIX relative paths; for each file the digest
  takes ``len(name)``, the name, ``len(bytes)`` and the bytes (streamed in 1 MiB blocks), so
  renaming, adding, removing or editing any file (weights included) changes it.

Safety: weights are read from safetensors whenever the model has them; a model with pickle
weights only (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``, ``*.pth``) is refused with
:class:`~audit.errors.UnsafeModelError` unless ``allow_pickle=True``; ``trust_remote_code`` is always passed to Transformers
explicitly (``False`` unless the caller sets it), so a model that ships its own code is refused
with :class:`~audit.errors.UnsafeModelError` instead of Transformers prompting on the terminal.

Device and dtype: CUDA when available, else CPU. Default dtype: float32 on every device, so that
a task's numbers, and its ``audit.key`` (which holds a requested dtype, not the device), do not
depend on where it runs: on an H100 float32 scores equal the CPU's to 5e-6 nat, bfloat16 moves
them by up to 0.07 nat (``tests/test_gpu.py``). ``dtype="bfloat16"`` is about 2.5x faster there
(a BERT-base-sized model on CrowS-Pairs: 1.95 s vs 4.89 s) and halves the memory; it enters the
key. Models are put in ``eval()`` mode; callers run forward passes under
:func:`audit.backends.batching.inference`. ``device_map`` (models that need several
GPUs) is passed to Transformers as given; dtype, device and device map are recorded
(:meth:`HFModel.load_info`).

Causal LMs: tokenizers without a pad token are used as they are (the scorers build padded
batches themselves, :mod:`audit.backends.hf_scoring`); a chat template is applied only when a
family's ``chat_template`` parameter asks for it (:mod:`audit.backends.chat`), else recorded as present.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from audit import schema
from audit.backends import chat, hf_embed, hf_generate, hf_scoring
from audit.backends.batching import default_batch_size, run_batched, transformers_quiet
from audit.errors import ModelError, ParameterError, UnsafeModelError
from audit.outputs import write_text_atomic
from audit.provenance import canonical_dtype
from audit.retry import Backoff, call_with_retry, first_line, http_status, transient_reason

log = logging.getLogger("audit.backends.hf")

__all__ = [
    "HFModel",
    "KINDS",
    "is_hf_ref",
    "parse_hf_ref",
    "load_hf_model",
    "dir_digest",
    "run_batched",
    "default_batch_size",
    "HubRevision",
    "resolve_hub_revision",
    "fetch_hub_snapshot",
    "snapshot_folder",
    "probe_template",
    "hub_error_message",
    "cached_ref",
    "record_ref",
]

#: ``kind`` -> (Transformers auto class name, backend name, what the head is called in errors)
KINDS: dict[str, tuple[str, str, str]] = {
    "encoder": ("AutoModel", "hf-encoder", ""),
    "mlm": ("AutoModelForMaskedLM", "hf-mlm", "masked-LM"),
    "causal": ("AutoModelForCausalLM", "hf-causal", "causal-LM"),
}


_SAFE_WEIGHTS = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")
_PICKLE_WEIGHTS = re.compile(r"^(pytorch_model(-\d{5}-of-\d{5})?\.bin|.*\.pt|.*\.pth|.*\.ckpt)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
_HUB_ID_WITH_ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*(@[^\s@]+)?$")


# --------------------------------------------------------------------------- references


def _looks_like_path(s: str) -> bool:
    return (s.startswith(("/", "./", "../", "~")) or s in (".", "..")
            or ("/" in s and Path(s).exists()))


def parse_hf_ref(ref: str | os.PathLike) -> tuple[str, str | None]:
    """Split a model reference into ``(name_or_path, revision)``.

    ``"org/name@rev"`` -> ``("org/name", "rev")``; ``"org/name"`` -> ``("org/name", None)``;
    an existing local directory (or a path starting with ``/``, ``./``, ``../``, ``~``) ->
    ``(path, None)``. A leading ``hf:`` is removed first. An existing path wins over the
    ``@`` split, so local folders whose name contains ``@`` work.

    Raises
    ------
    ParameterError
        If ``ref`` is empty, not a string, or neither a path nor a valid Hub id.
    """
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    if not isinstance(ref, str) or not ref.strip():
        raise ParameterError(f"model reference must be a non-empty string, got {ref!r}")
    s = ref.strip()
    if s.startswith("hf:"):
        s = s[3:]
        if not s:
            raise ParameterError(f"model reference {ref!r}: nothing after 'hf:'")
    if Path(s).expanduser().is_dir() or _looks_like_path(s):
        return str(Path(s).expanduser()), None
    name, sep, rev = s.rpartition("@") if "@" in s else (s, "", "")
    if sep and not rev:
        raise ParameterError(f"model reference {ref!r}: empty revision after '@'")
    if not _HUB_ID.match(name) or ".." in name:
        raise ParameterError(
            f"model reference {ref!r} is neither an existing local directory nor a Hub id "
            "of the form 'org/name' or 'org/name@revision'"
        )
    return name, (rev or None)


def is_hf_ref(ref: str | os.PathLike) -> bool:
    """Whether ``ref`` names a Hugging Face model.

    True for a local directory holding ``config.json``, for any ``hf:``-prefixed reference, and
    for an ``org/name`` or ``org/name@rev`` id that is not an existing local path. Bare names
    (``glove-6b-50d``) and files are left to the other backends.
    """
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    if not isinstance(ref, str) or not ref.strip():
        return False
    s = ref.strip()
    if s.startswith("hf:"):
        return True
    p = Path(s).expanduser()
    if p.exists():
        return p.is_dir() and (p / "config.json").is_file()
    if _looks_like_path(s):
        return False
    return bool(_HUB_ID_WITH_ORG.match(s)) and ".." not in s


# --------------------------------------------------------------------------- digests


def _iter_files(root: Path) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for f in filenames:
            p = Path(dirpath) / f
            if p.is_file():
                yield p.relative_to(root).as_posix(), p


def dir_digest(path: str | os.PathLike) -> str:
    """``sha256:<hex>`` content digest of a directory (names + bytes of every file, streamed).

    Files are visited in sorted order of their POSIX relative paths; ``.git`` folders are
    skipped. For each file the hash takes the name length and name, the byte length and the
    bytes, so the digest is unambiguous and independent of timestamps and of the absolute path.
    """
    root = Path(path)
    h = hashlib.sha256()
    for rel, p in sorted(_iter_files(root)):
        name = rel.encode("utf-8")
        h.update(len(name).to_bytes(8, "little"))
        h.update(name)
        h.update(p.stat().st_size.to_bytes(8, "little"))
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return "sha256:" + h.hexdigest()


# --------------------------------------------------------------------------- the model


@dataclasses.dataclass
class HFModel:
    """A loaded Hugging Face model and its fast tokenizer.

    ref:          the reference the user gave.
    name_or_path: the Hub id or the local directory.
    revision:     resolved revision (40-hex commit hash, or ``sha256:`` directory digest).
    kind:         ``"encoder"`` | ``"mlm"`` | ``"causal"``.
    model:        the ``torch.nn.Module`` in eval mode on ``device``.
    tokenizer:    a fast tokenizer (character offsets available).
    device:       the ``torch.device`` inputs go to (with a ``device_map``: the device of the
                  input embeddings).
    dtype:        the model's ``torch.dtype``.
    backend:      ``"hf-encoder"`` | ``"hf-mlm"`` | ``"hf-causal"``.
    resolution:   one line saying how ``revision`` was found (Hub ids: ``online: main is commit
                  <sha>``, ``offline: main resolved to <sha> from the cache``; local folders:
                  ``local directory``).
    device_map:   the ``device_map`` the model was loaded with (``None``: one device).
    chat_template: whether the tokenizer ships a chat template (applied only by families given
                  ``chat_template: true``, :mod:`audit.backends.chat`; recorded so that results say so).
    """

    ref: str
    name_or_path: str
    revision: str
    kind: str
    model: Any
    tokenizer: Any
    device: Any
    dtype: Any
    backend: str
    resolution: str = ""
    device_map: Any = None
    chat_template: bool = False

    @property
    def num_hidden_layers(self) -> int:
        """Number of transformer layers (hidden states returned: this + 1, embeddings first)."""
        cfg = self.model.config
        for attr in ("num_hidden_layers", "n_layer", "num_layers"):
            if getattr(cfg, attr, None) is not None:
                return int(getattr(cfg, attr))
        raise ModelError(f"model {self.ref!r}: config names no number of layers")

    @property
    def hidden_size(self) -> int:
        """Width of the hidden states."""
        cfg = self.model.config
        for attr in ("hidden_size", "n_embd", "d_model"):
            if getattr(cfg, attr, None) is not None:
                return int(getattr(cfg, attr))
        raise ModelError(f"model {self.ref!r}: config names no hidden size")

    # ------------------------------------------------------------------ the model interface
    # (audit.backends.base.LanguageModel): the measure families call these and nothing else of
    # the model. The implementations, with their conventions, are in hf_scoring (log-likelihoods,
    # masked scores), hf_generate (top-k fills, generation until a stop) and hf_embed (pooling).

    @property
    def dim(self) -> int:
        """Width of the embeddings :meth:`embed` returns (the hidden size)."""
        return self.hidden_size

    @property
    def max_length(self) -> int:
        """The longest token sequence the model accepts, special tokens included
        (:func:`audit.backends.hf_scoring.max_sequence_length`)."""

        return hf_scoring.max_sequence_length(self.model, self.tokenizer)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens of each text as the scorers feed it: masked LMs and encoders with the tokenizer's
        special tokens; causal LMs the text's own tokens plus the start token."""
        causal = self.kind == "causal"
        enc = self.tokenizer(list(texts), add_special_tokens=not causal)["input_ids"]
        return [len(e) + (1 if causal else 0) for e in enc]

    def token_positions(self, text: str, spans: Sequence[tuple[int, int]]) -> list[list[int]]:
        """Per character span, the positions of the tokens overlapping it (text tokenised with
        special tokens; :func:`audit.backends.hf_scoring.token_spans`)."""

        return hf_scoring.token_spans(self.tokenizer, text, spans)[1]

    def loglikelihood(self, requests: Sequence[tuple[str, str]], *, batch_size: int | None = None,
                      start: str = "always") -> tuple[Any, Any]:
        """Score of each ``(context, continuation)``: ``(scores float64, n_tokens int64)``.

        Causal LMs: ``log P(continuation | context)``
        (:func:`audit.backends.hf_scoring.continuation_loglik`); masked LMs: the pseudo-log-likelihood
        of the continuation's tokens given everything else (:func:`audit.backends.hf_scoring.span_pll`).
        ``start`` (causal LMs): the start-token rule, ``"always"`` or ``"harness"``
        (:func:`~audit.backends.hf_scoring.encode_requests`)."""

        self._need("mlm", "causal", what="log-likelihood")
        hf_scoring.check_start(start, "start_token")
        if self.kind == "mlm":
            return hf_scoring.span_pll(self.model, self.tokenizer, requests, batch_size=batch_size,
                                       device=self.device)
        ll, n = hf_scoring.continuation_loglik(self.model, self.tokenizer, list(requests), batch_size=batch_size,
                                               device=self.device, start=start)
        return np.asarray(ll, dtype=np.float64), np.asarray(n, dtype=np.int64)

    def loglikelihood_rolling(self, sentences: Sequence[str], *, batch_size: int | None = None,
                              start: str = "always") -> tuple[Any, Any]:
        """Causal LMs: ``(ll, n_tokens)`` of whole sentences given only the start token
        (:func:`audit.backends.hf_scoring.causal_loglik`)."""

        self._need("causal", what="rolling log-likelihood")
        return hf_scoring.causal_loglik(self.model, self.tokenizer, sentences, batch_size=batch_size,
                                        device=self.device, return_counts=True, start=start)

    def pair_pll(self, pairs: Sequence[tuple[str, str]], *, batch_size: int | None = None) -> Any:
        """Masked LMs: CrowS-Pairs pseudo-log-likelihoods of sentence pairs, the tokens both sentences
        share masked one at a time (:func:`audit.backends.hf_scoring.crows_pairs_pll`)."""

        self._need("mlm", what="pair pseudo-log-likelihood")
        return hf_scoring.crows_pairs_pll(self.model, self.tokenizer, pairs, batch_size=batch_size,
                                          device=self.device)

    def masked_scores(self, requests: Sequence[tuple[str, tuple[int, int], Sequence[tuple[int, int]]]], *,
                      batch_size: int | None = None) -> list[Any]:
        """Masked LMs: log-probabilities of the tokens of a chosen span, masked together with other
        spans (:func:`audit.backends.hf_scoring.masked_span_logprobs`)."""

        self._need("mlm", what="masked-LM scores")
        return hf_scoring.masked_span_logprobs(self.model, self.tokenizer, requests, batch_size=batch_size,
                                               device=self.device)

    def topk_fills(self, templates: Sequence[str], k: int, *, slot: str = "[M]", batch_size: int | None = None
                   ) -> tuple[list[list[str]], Any]:
        """Masked LMs: the ``k`` most probable fillers of each template's ``slot`` and their
        log-probabilities (:func:`audit.backends.hf_generate.mlm_topk`)."""

        self._need("mlm", what="top-k fills")
        words, _, lp = hf_generate.mlm_topk(self.model, self.tokenizer, templates, k, batch_size=batch_size,
                                            device=self.device, slot=slot)
        return words, lp

    def first_words(self, prompts: Sequence[str], k: int, *, decoding: str = "greedy", seed: int = 0,
                    max_new_tokens: int = 8, batch_size: int | None = None, start: str = "always"
                    ) -> tuple[list[list[str]], Any]:
        """Causal LMs: ``k`` continuations of each prompt generated until the first word ends
        (:func:`audit.backends.hf_generate.causal_first_words`)."""

        self._need("causal", what="generation")
        return hf_generate.causal_first_words(self.model, self.tokenizer, prompts, k, decoding=decoding, seed=seed,
                                              max_new_tokens=max_new_tokens, batch_size=batch_size,
                                              device=self.device, start=start)

    def generate_until(self, prompts: Sequence[str], *, until: Sequence[str] = (), max_new_tokens: int = 256,
                       batch_size: int | None = None, start: str = "always") -> list[str]:
        """Causal LMs: the greedy continuation of each prompt, cut at the first stop string
        (:func:`audit.backends.hf_generate.causal_generate_until`)."""

        self._need("causal", what="generation")
        return hf_generate.causal_generate_until(self.model, self.tokenizer, prompts, until=until,
                                                 max_new_tokens=max_new_tokens, batch_size=batch_size,
                                                 device=self.device, start=start)

    @property
    def chat_template_digest(self) -> str | None:
        """``sha256:`` of the tokenizer's chat template, ``None`` without one (:mod:`audit.backends.chat`)."""
        return chat.template_digest(self.tokenizer)

    def render_chat(self, texts: Sequence[str], *, system_instruction: str | None = None) -> list[str]:
        """Each text as a user turn rendered by the tokenizer's chat template, the assistant turn
        opened (:func:`audit.backends.chat.render_user_turns`)."""
        return chat.render_user_turns(self.tokenizer, texts, system_instruction=system_instruction, ref=self.ref)
    def samples(self, prompts: Sequence[str], k: int, *, seed: int = 0, max_new_tokens: int = 10,
                temperature: float = 1.0, top_k: int = 50, top_p: float = 1.0, batch_size: int | None = None,
                start: str = "always") -> list[list[str]]:
        """Causal LMs: ``k`` seeded sampled continuations of each prompt, as text
        (:func:`audit.backends.hf_generate.causal_samples`)."""

        self._need("causal", what="generation")
        return hf_generate.causal_samples(self.model, self.tokenizer, prompts, k, seed=seed,
                                          max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                          top_p=top_p, start=start, batch_size=batch_size, device=self.device)

    def embed(self, sentences: Sequence[str], *, method: str | None = None,
              spans: Sequence[tuple[int, int]] | None = None, layer: int = -1, batch_size: int | None = 32,
              padding_side: str = "right") -> Any:
        """Pooled hidden states of sentences or of spans in them, float32 ``(n, dim)``
        (:func:`audit.backends.hf_embed.embed_sentences`)."""

        return hf_embed.embed_sentences(self, sentences, method=method, spans=spans, layer=layer,
                                        batch_size=batch_size, padding_side=padding_side)

    def is_unknown_word(self, word: str) -> bool:
        """Whether every subtoken of ``word`` is the unknown token (:func:`audit.backends.hf_embed.all_unknown`)."""

        return hf_embed.all_unknown(self, word)

    def _need(self, *kinds: str, what: str) -> None:
        if self.kind not in kinds:
            need = " or ".join({"mlm": "a masked LM (kind='mlm')", "causal": "a causal LM (kind='causal')"}[k]
                               for k in kinds)
            raise ModelError(f"model {self.ref!r} is loaded as kind={self.kind!r}; {what} needs {need}")

    def provenance(self) -> dict[str, str]:
        """The provenance fields of a result: model reference, resolved revision, backend."""
        out = {"model": self.ref, "name_or_path": self.name_or_path,
               "revision": self.revision, "backend": self.backend, "resolution": self.resolution}
        out.update(self.load_info())
        return out

    def load_info(self) -> dict[str, str]:
        """How the weights were loaded: ``dtype``, ``device`` or ``device_map``, and
        ``chat_template: "present, not applied"`` for tokenizers that ship one."""
        out = {"dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device)}
        if self.device_map is not None:
            out["device_map"] = self.device_map if isinstance(self.device_map, str) else repr(self.device_map)
        if self.chat_template:
            out["chat_template"] = "present, not applied"
        return out


def _classify_weights(files: Sequence[str]) -> tuple[bool, list[str]]:
    """(has safetensors weights, pickle weight files) among ``files`` (relative names)."""
    base = [f.rsplit("/", 1)[-1] for f in files]
    safe = any(_SAFE_WEIGHTS.match(b) for b in base) or "model.safetensors.index.json" in base
    pickles = sorted(f for f, b in zip(files, base) if _PICKLE_WEIGHTS.match(b))
    return safe, pickles


def _check_weights(ref: str, where: str, files: Sequence[str], allow_pickle: bool) -> bool:
    """Decide ``use_safetensors``; refuse pickle-only models and folders without weights."""
    top = [f for f in files if "/" not in f]
    safe, pickles = _classify_weights(top)
    if safe:
        return True
    if pickles:
        if not allow_pickle:
            raise UnsafeModelError(
                f"model {ref!r} has only pickle weights ({', '.join(pickles)}) in {where}; "
                "loading pickle can run arbitrary code. Convert it to safetensors, or allow it "
                "explicitly with allow_pickle=True (spec: `allow_pickle: true` on this model)."
            )
        return False
    raise ModelError(
        f"model {ref!r}: no weights in {where}; expected 'model.safetensors' (or sharded "
        "'model-00001-of-0000N.safetensors' with 'model.safetensors.index.json'), or, with "
        "allow_pickle=True, 'pytorch_model.bin'"
    )


def _offline() -> bool:
    try:
        from huggingface_hub import is_offline_mode

        if is_offline_mode():
            return True
    except ImportError:  # pragma: no cover - old huggingface_hub
        pass
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


# --------------------------------------------------------------------------- the Hub


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclasses.dataclass(frozen=True)
class HubRevision:
    """A Hub id resolved to a commit, without loading anything.

    name:      the Hub id (``org/name``).
    requested: the branch, tag or commit asked for (``"main"`` when none was given).
    commit:    the 40-hex commit hash it resolved to (what results record as the revision).
    files:     the repository's files at that commit (the Hub's listing; the cached snapshot's
               files when resolved from the cache).
    source:    ``"hub"`` (the Hub answered) or ``"cache"`` (``HF_HUB_OFFLINE`` is set, or the Hub
               could not be reached after the retries).
    note:      one line saying which commit was used and where it came from, e.g.
               ``offline: main resolved to <sha> from the cache``.
    """

    name: str
    requested: str
    commit: str
    files: tuple[str, ...]
    source: str
    note: str


def _hub_cache(cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import constants

    return Path(cache_dir if cache_dir is not None else constants.HF_HUB_CACHE).expanduser()


def _repo_folder(name: str, cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return _hub_cache(cache_dir) / repo_folder_name(repo_id=name, repo_type="model")


def snapshot_folder(name: str, commit: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the Hugging Face cache keeps the files of ``name`` at ``commit``."""
    return _repo_folder(name, cache_dir) / "snapshots" / commit


def cached_ref(name: str, revision: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """The commit a branch or tag pointed to when the model was last fetched online (the
    Hugging Face cache's ``refs/<revision>`` file), ``None`` when the cache has no such ref."""
    p = _repo_folder(name, cache_dir) / "refs" / revision
    try:
        sha = p.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return sha if _COMMIT.match(sha) else None


def record_ref(name: str, revision: str, commit: str, cache_dir: str | os.PathLike | None = None) -> bool:
    """Record ``revision -> commit`` in the Hugging Face cache (``refs/<revision>``, the layout
    ``huggingface_hub`` reads offline), atomically; nothing for a commit hash or an unchanged ref.
    Returns whether the ref was written; a cache that cannot be written is not an error (False)."""
    if revision == commit or not _COMMIT.match(commit) or ".." in revision.split("/"):
        return False
    p = _repo_folder(name, cache_dir) / "refs" / revision
    try:
        if p.is_file() and p.read_text(encoding="utf-8").strip() == commit:
            return False
        write_text_atomic(p, commit)
    except OSError as e:
        log.warning("could not record %s@%s -> %s in the Hugging Face cache: %s", name, revision, commit, e)
        return False
    return True


def _token_in_use() -> bool:
    try:
        from huggingface_hub import get_token

        return get_token() is not None
    except Exception:  # noqa: BLE001 - unreadable token file: treat as none
        return False


def _endpoint() -> str:
    try:
        from huggingface_hub import constants

        return constants.ENDPOINT
    except ImportError:  # pragma: no cover
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def hub_error_message(e: BaseException, name: str, revision: str | None = None, *,
                      ref: str | None = None, attempts: int | None = None) -> str:
    """One line saying what went wrong with a Hub call for ``name`` and what to do about it.

    404 (repository, revision or file): check the id / revision (both named); 401 on a
    repository: not found or private, set ``HF_TOKEN`` to a token that can read it (the Hub does
    not tell the two apart without a token); 401 "invalid credentials": the token was refused;
    gated (401/403 ``GatedRepo``): accept the licence on the model page and use a token of that
    account; other 403: the token lacks permission; transient failures (429, 5xx, network): the
    hub did not answer after ``attempts`` tries. A token is never printed.
    """
    who = f"model {ref!r}" if ref else f"hub repository {name!r}"
    rev = revision or "main"
    endpoint = _endpoint()
    e = _with_status(e)
    status = http_status(e)
    names = {c.__name__ for c in type(e).__mro__}
    token = _token_in_use()

    def paren(*extra: str) -> str:
        parts = ([f"HTTP {status}"] if status else []) + [x for x in extra if x]
        return f" ({', '.join(parts)})" if parts else ""

    if "GatedRepoError" in names:
        return (f"{who} is gated{paren()}: log in at {endpoint}/{name}, accept its licence on the model page, "
                "then set HF_TOKEN to a token of that account"
                + (" (the token in use has no access yet)" if token else ""))
    if "RevisionNotFoundError" in names:
        return f"{who}: revision {rev!r} not found in {name!r}{paren()}; check the branch, tag or commit"
    if "RemoteEntryNotFoundError" in names or "EntryNotFoundError" in names:
        return (f"{who}: a file is missing from {name!r} at revision {rev!r}{paren()}; check the revision "
                "(is it a model repository saved with save_pretrained?)")
    if "OfflineModeIsEnabled" in names:
        return f"{who}: HF_HUB_OFFLINE is set and the files are not in the local Hugging Face cache"
    try:
        msg = (getattr(getattr(e, "response", None), "headers", None) or {}).get("X-Error-Message") or ""
    except Exception:  # noqa: BLE001 - no readable headers
        msg = ""
    if status == 401 and ("RepositoryNotFoundError" not in names or "Invalid credentials" in str(msg)):
        return (f"{who}: the hub at {endpoint} refused the token{paren('invalid credentials')}; set HF_TOKEN to a "
                "valid token, or unset it for public models")
    if "RepositoryNotFoundError" in names or status in (401, 404):
        if not token:
            return (f"{who}: repository {name!r} not found on {endpoint}, or private{paren('no token sent')}; "
                    "check the id, or set HF_TOKEN to a token that can read it")
        return (f"{who}: repository {name!r} not found on {endpoint}{paren()}; check the id; if it is private, "
                "the token in use (HF_TOKEN) cannot read it")
    if status == 403:
        return f"{who}: access to {name!r} denied{paren()}; set HF_TOKEN to a token with read access to it"
    reason = transient_reason(e)
    if reason is not None:
        tries = f" after {attempts} attempt{'s' if attempts != 1 else ''}" if attempts else ""
        return f"{who}: the hub at {endpoint} did not answer ({reason}){tries}; try again later"
    return f"{who}: {type(e).__name__}: {first_line(e)}"


def _with_status(e: BaseException) -> BaseException:
    """The first exception along ``e``'s cause chain that carries an HTTP status (libraries wrap
    the Hub's answer in their own errors), else ``e``."""
    x: BaseException | None = e
    for _ in range(8):
        if x is None:
            break
        if http_status(x) is not None:
            return x
        x = x.__cause__ or (None if x.__suppress_context__ else x.__context__)
    return e


def _hub_policy(retry: Backoff | None) -> Backoff:
    return retry if retry is not None else Backoff.from_env()


def _from_cache(ref: str, name: str, requested: str, cache_dir: str | None,
                online_error: BaseException | None, policy: Backoff) -> HubRevision:
    """Resolve ``requested`` from the local cache: a commit hash as is, a branch/tag through the
    ``refs/`` file the last online fetch wrote; the snapshot folder must exist."""
    if _COMMIT.match(requested):
        commit: str | None = requested
    else:
        commit = cached_ref(name, requested, cache_dir)
    snap = _repo_folder(name, cache_dir) / "snapshots" / commit if commit else None
    if online_error is None:
        how = "HF_HUB_OFFLINE is set"
        where = "offline"
    else:
        how = f"the hub could not be reached ({transient_reason(online_error) or type(online_error).__name__})"
        where = f"hub unreachable ({transient_reason(online_error) or type(online_error).__name__} after " \
                f"{policy.attempts} attempt{'s' if policy.attempts != 1 else ''})"
    if snap is None or not (snap / "config.json").is_file():
        known = ("" if commit is None or _COMMIT.match(requested)
                 else f" ({requested} was {commit[:12]} when last fetched, but that snapshot is missing)")
        raise ModelError(
            f"model {ref!r} (revision {requested}) is not in the local Hugging Face cache{known} and {how}; "
            + ("unset HF_HUB_OFFLINE for one online run (it records the branch), or give a local directory"
               if online_error is None else
               "nothing is lost: run the sweep again when the hub answers (it resumes and redoes only these "
               "tasks), or give a local directory")
        )
    files = tuple(rel for rel, _ in _iter_files(snap))
    if _COMMIT.match(requested):
        note = f"{where}: commit {commit} from the cache"
    else:
        note = f"{where}: {requested} resolved to {commit} from the cache"
    return HubRevision(name, requested, commit, files, "cache", note)


def resolve_hub_revision(name: str, revision: str | None = None, *, ref: str | None = None,
                         cache_dir: str | None = None, retry: Backoff | None = None) -> HubRevision:
    """Resolve a Hub id's branch, tag or commit to a commit hash and file list, without
    downloading (what the planner's probe and the loader share).

    Online: the Hub's model info at ``revision``, retried with back-off on transient failures
    (:mod:`audit.retry`; policy ``retry``, default :meth:`Backoff.from_env`). A permanent Hub
    error (401/403/404, gated) is a :class:`ModelError` with a line saying what to do
    (:func:`hub_error_message`). With ``HF_HUB_OFFLINE`` set, or when the Hub still fails after
    the retries, the cache answers: a commit hash's snapshot, or the commit that ``refs/<branch>``
    recorded when the model was last fetched online (:func:`record_ref`); the
    :attr:`HubRevision.note` says which, and is logged (WARNING for the cache, INFO otherwise).
    """
    ref = ref or name
    requested = revision or "main"
    policy = _hub_policy(retry)
    online_error: BaseException | None = None
    if not _offline():
        from huggingface_hub import HfApi

        api = HfApi()
        try:
            info = call_with_retry(lambda: api.model_info(name, revision=revision, timeout=15), policy=policy,
                                   what=f"model {ref!r}: hub")
        except Exception as e:  # noqa: BLE001 - classified: transient -> the cache, else one line
            if transient_reason(e) is None and "OfflineModeIsEnabled" not in {c.__name__ for c in type(e).__mro__}:
                raise ModelError(hub_error_message(e, name, requested, ref=ref)) from None
            online_error = e
        else:
            if info.sha:
                files = tuple(s.rfilename for s in (info.siblings or []))
                note = f"online: {requested} is commit {info.sha}"
                log.info("model %r: %s", ref, note)
                return HubRevision(name, requested, info.sha, files, "hub", note)
            online_error = RuntimeError("the hub answered without a commit hash")
    res = _from_cache(ref, name, requested, cache_dir, online_error, policy)
    log.warning("model %r: %s", ref, res.note)
    return res


def probe_template(ref: str, revision: str | None = None) -> tuple[bool, str | None]:
    """``(known, digest)`` of the chat template the tokenizer of ``ref`` will carry, read from its
    files without loading the model (:func:`audit.backends.chat.folder_template`, digest
    :func:`audit.backends.chat.text_digest`): a local checkpoint folder's own files; a Hub id's
    ``chat_template.jinja`` and ``tokenizer_config.json`` at the commit the loader will use
    (:func:`resolve_hub_revision`, then only those small files through :func:`fetch_hub_snapshot`;
    the cache's snapshot when the cache answered). ``digest`` is ``None`` for a tokenizer without
    a template; ``known`` is False when the files cannot be read without loading (not a Hugging
    Face reference, a model not built yet, the Hub unreachable and nothing cached): the template
    is then checked after loading."""
    try:
        name, rev = parse_hf_ref(ref)
        p = Path(name).expanduser()
        if p.is_dir() and (p / "config.json").is_file():
            return True, chat.text_digest(chat.folder_template(p))
        if not is_hf_ref(ref) or p.exists():
            return False, None
        res = resolve_hub_revision(name, revision or rev, ref=ref)
        if res.source == "cache":
            snap = snapshot_folder(name, res.commit)
        else:
            snap = fetch_hub_snapshot(res, use_safe=True, ref=ref, only=chat.TEMPLATE_FILES)
        return True, chat.text_digest(chat.folder_template(snap))
    except (ModelError, ParameterError, OSError):  # not reachable, not cached: checked after loading
        return False, None


def _download_patterns(files: Sequence[str], use_safe: bool, trust_remote_code: bool) -> list[str]:
    """The files Transformers needs for a model and its tokenizer: the chosen weights (the
    safetensors files, else ``pytorch_model*.bin``), and every other top-level file except weights
    of other formats (config, tokenizer, generation config ...); ``*.py`` only with remote code."""
    out = []
    for f in files:
        if "/" in f or f == ".gitattributes":
            continue
        base = f.rsplit("/", 1)[-1]
        if _SAFE_WEIGHTS.match(base) or base == "model.safetensors.index.json":
            if use_safe:
                out.append(f)
        elif re.match(r"^pytorch_model(-\d{5}-of-\d{5})?\.bin(\.index\.json)?$", base):
            if not use_safe:
                out.append(f)
        elif base.lower().endswith(_OTHER_WEIGHTS):
            continue
        elif base.endswith(".py") and not trust_remote_code:
            continue
        else:
            out.append(f)
    return out


_OTHER_WEIGHTS = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx", ".ot", ".pt", ".pth", ".ckpt", ".tflite",
                  ".gguf", ".pb", ".mlmodel", ".npz", ".pkl", ".joblib", ".tar", ".gz", ".zip", ".onnx_data")


def _silent_tqdm():
    from tqdm.auto import tqdm

    class _Silent(tqdm):  # the hub's download bars would flood job logs with carriage returns
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return _Silent


def fetch_hub_snapshot(res: HubRevision, *, use_safe: bool, trust_remote_code: bool = False,
                       cache_dir: str | None = None, retry: Backoff | None = None, ref: str | None = None,
                       only: Sequence[str] | None = None) -> Path:
    """Download (or find in the cache) the files Transformers needs of ``res.commit``, retried
    with back-off on transient failures, then record ``res.requested -> res.commit`` in the
    cache (:func:`record_ref`) so that an offline run can resolve the branch. Returns the
    snapshot folder. Files already cached cost no request. ``only``: just those of the files
    (the planner's read of the tokenizer's small files, no weights)."""
    from huggingface_hub import snapshot_download

    ref = ref or res.name
    policy = _hub_policy(retry)
    patterns = _download_patterns(res.files, use_safe, trust_remote_code)
    if only is not None:
        patterns = [f for f in patterns if f in set(only)]
    try:
        snap = call_with_retry(
            lambda: snapshot_download(res.name, revision=res.commit, cache_dir=cache_dir, allow_patterns=patterns,
                                      tqdm_class=_silent_tqdm()),
            policy=policy, what=f"model {ref!r}: download")
    except Exception as e:  # noqa: BLE001 - one line naming the model and what to do
        attempts = policy.attempts if transient_reason(e) is not None else None
        raise ModelError(hub_error_message(e, res.name, res.requested, ref=ref, attempts=attempts)) from None
    record_ref(res.name, res.requested, res.commit, cache_dir)
    return Path(snap)


def pick_device(device: str | None) -> Any:
    """The ``torch.device`` a model is loaded (or trained) on: ``device`` checked, or CUDA when
    available, else the CPU (``None``); a CUDA device on a machine without one is refused."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ParameterError(f"device: {device!r} is not a torch device ({e})") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES") == ""  # a Ray worker given no GPU (actors.model_actor)
        raise ParameterError(f"device: {device!r} requested but CUDA is not available"
                             + (" to this process (CUDA_VISIBLE_DEVICES is empty: a sweep's model worker gets a "
                                "GPU only when it reserves one, ray.actor_num_gpus)" if hidden else ""))
    return dev


def _pick_dtype(dtype: str | None) -> Any:
    import torch

    return getattr(torch, canonical_dtype(dtype))  # float32 on every device unless asked


def _refuse_remote_code(ref: str, e: Exception, trust_remote_code: bool) -> None:
    """Raise :class:`UnsafeModelError` when Transformers refused a model for its own code."""
    if not trust_remote_code and isinstance(e, ValueError) and "custom code" in str(e):
        raise UnsafeModelError(
            f"model {ref!r} ships its own Python code (auto_map in its config), which runs on "
            "loading; allow it explicitly with trust_remote_code=True (spec: `trust_remote_code: "
            "true` on this model; audit score: --trust-remote-code) after reviewing that code"
        ) from None


def _missing_head_keys(model: Any, missing: set[str] | list[str]) -> list[str]:
    """Missing parameters outside the base model (i.e. in the task head)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    return sorted(k for k in missing if not (prefix and k.startswith(prefix + ".")))


def _refuse_masked_as_causal(ref: str, config: Any) -> None:
    """A checkpoint trained as a masked LM (``*ForMaskedLM``) is not a causal LM, even where
    Transformers can build a ``*ForCausalLM`` from the same head weights (BERT, RoBERTa)."""
    archs = list(getattr(config, "architectures", None) or [])
    if archs and all(a.endswith("ForMaskedLM") for a in archs) and not getattr(config, "is_decoder", False):
        raise ModelError(
            f"model {ref!r} is a masked LM ({', '.join(archs)}), not a causal LM; "
            "load it with kind='mlm' (backend hf-mlm)")


def load_hf_model(
    ref: str | os.PathLike,
    *,
    kind: str = "encoder",
    revision: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    device: str | None = None,
    dtype: str | None = None,
    cache_dir: str | None = None,
    retry: Backoff | None = None,
    device_map: str | dict | None = None,
) -> HFModel:
    """Load a model and its fast tokenizer from a local directory or the Hugging Face Hub.

    Parameters
    ----------
    ref : str
        Local directory or Hub id (``org/name`` or ``org/name@rev``, optional ``hf:`` prefix).
    kind : {"encoder", "mlm", "causal"}
        ``AutoModel`` (hidden states), ``AutoModelForMaskedLM`` or ``AutoModelForCausalLM``.
        For ``mlm``/``causal`` a checkpoint whose head weights are missing (Transformers would
        initialise them at random) is refused.
    revision : str, optional
        Hub branch, tag or commit; also accepted as ``@rev`` in ``ref`` (not both, unless equal).
    trust_remote_code : bool, default False
        Run the model's own code (``auto_map`` in its config). Without it such a model is
        refused with :class:`UnsafeModelError`.
    allow_pickle : bool, default False
        Allow models that have only pickle (``.bin``/``.pt``/``.ckpt``) weights.
    device : str, optional
        ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; default CUDA when available.
    dtype : str, optional
        ``"float32"``, ``"float16"`` or ``"bfloat16"``; default float32 on every device (module
        docstring).
    cache_dir : str, optional
        Hugging Face cache folder for Hub ids (default: the Hub's own).
    retry : audit.retry.Backoff, optional
        Back-off of transient Hub failures (connection errors, 429, 5xx) while resolving and
        downloading; default :meth:`audit.retry.Backoff.from_env` (``BIASAUDIT_HUB_RETRIES``,
        ``BIASAUDIT_HUB_RETRY_DELAY``, ``BIASAUDIT_HUB_RETRY_MAX``; 4 retries from 1 s, at most 30 s).
    device_map : str or dict, optional
        Passed to ``from_pretrained`` for models too large for one device (``"auto"``,
        ``"balanced"``, or a module -> device mapping); needs the ``accelerate`` package. The
        model is then not moved with ``.to(device)``; inputs go to the device of its input
        embeddings, and Transformers moves activations between devices layer by layer
        (``docs/causal.md``, "Large models"). Recorded in :meth:`HFModel.provenance`.

    Returns
    -------
    HFModel

    Raises
    ------
    ParameterError
        Bad ``kind``, ``device``, ``dtype``, reference or conflicting revisions.
    UnsafeModelError
        Pickle-only weights without ``allow_pickle``.
    ModelError
        Missing directory/config/weights, model not cached while offline, slow-only tokenizer,
        missing LM head, or a Transformers loading failure (message names the model).
    """
    schema.choice(kind, "kind", sorted(KINDS))
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    name, ref_rev = parse_hf_ref(ref)
    if revision is not None and ref_rev is not None and revision != ref_rev:
        raise ParameterError(
            f"model {ref!r}: revision {revision!r} conflicts with '@{ref_rev}' in the reference")
    revision = revision or ref_rev
    dev = pick_device(device)
    torch_dtype = _pick_dtype(dtype)
    if device_map is not None:
        if device is not None:
            raise ParameterError(f"model {ref!r}: give device or device_map, not both")
        if not isinstance(device_map, (str, dict)) or not device_map:
            raise ParameterError(f"device_map: expected 'auto', 'balanced', ... or a module -> device "
                                 f"mapping, got {device_map!r}")
        import importlib.util

        if importlib.util.find_spec("accelerate") is None:
            raise ModelError(f"model {ref!r}: device_map={device_map!r} needs the accelerate package "
                             "(pip install accelerate)")

    local = Path(name)
    load_kw: dict[str, Any] = {}
    if local.exists() or _looks_like_path(name):
        if revision is not None:
            raise ParameterError(f"model {ref!r}: a revision applies to Hub ids, not local folders")
        if not local.is_dir():
            raise ModelError(f"model {ref!r}: {str(local)!r} is not a directory")
        if not (local / "config.json").is_file():
            raise ModelError(f"model {ref!r}: no config.json in directory {str(local)!r}")
        files = [rel for rel, _ in _iter_files(local)]
        use_safe = _check_weights(ref, f"directory {str(local)!r}", files, allow_pickle)
        resolved = dir_digest(local)
        resolution = "local directory"
        src = str(local)
    else:
        hub = resolve_hub_revision(name, revision, ref=ref, cache_dir=cache_dir, retry=retry)
        use_safe = _check_weights(ref, f"Hub repo {name!r}@{hub.commit[:12]}", hub.files, allow_pickle)
        if hub.source == "hub":
            fetch_hub_snapshot(hub, use_safe=use_safe, trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                               retry=retry, ref=ref)
        resolved, resolution = hub.commit, hub.note
        src = name
        # every file is in the cache now: Transformers reads it there and never asks the Hub
        load_kw = {"revision": resolved, "local_files_only": True}
        if cache_dir is not None:
            load_kw["cache_dir"] = cache_dir
    load_kw["trust_remote_code"] = bool(trust_remote_code)  # False: refuse custom code, never prompt

    import transformers

    auto_name, backend, head = KINDS[kind]
    auto_cls = getattr(transformers, auto_name)
    try:
        with transformers_quiet(progress_bars=False):  # "Loading weights" bars would clutter one-line errors
            tokenizer = transformers.AutoTokenizer.from_pretrained(src, **load_kw)
    except Exception as e:
        _refuse_remote_code(ref, e, trust_remote_code)
        raise ModelError(f"model {ref!r}: cannot load its tokenizer: {type(e).__name__}: {e}") from e
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(
            f"model {ref!r}: only a slow (Python) tokenizer is available; a fast tokenizer "
            "(tokenizer.json) is required for character offsets"
        )
    try:
        with transformers_quiet(progress_bars=False):
            placement = {"device_map": device_map} if device_map is not None else {}
            model, info = auto_cls.from_pretrained(
                src, use_safetensors=use_safe, dtype=torch_dtype, output_loading_info=True,
                **placement, **load_kw)
    except Exception as e:
        _refuse_remote_code(ref, e, trust_remote_code)
        first = (str(e).strip().splitlines() or [""])[0]
        raise ModelError(f"model {ref!r}: cannot load as {kind!r} ({auto_name}): "
                         f"{type(e).__name__}: {first}") from e
    if kind == "causal":
        _refuse_masked_as_causal(ref, model.config)
    missing = set(info.get("missing_keys") or ())
    if head:
        head_missing = _missing_head_keys(model, missing)
        if head_missing:
            raise ModelError(
                f"model {ref!r} has no {head} head (missing weights: "
                f"{', '.join(head_missing[:4])}{', ...' if len(head_missing) > 4 else ''}); "
                + ("LPBS/CrowS-Pairs need one" if kind == "mlm" else "causal LM scoring needs one")
            )
    body_missing = sorted(k for k in missing if not k.startswith("pooler."))
    if body_missing and not head:
        raise ModelError(f"model {ref!r}: weights missing from the checkpoint: "
                         f"{', '.join(body_missing[:4])}{', ...' if len(body_missing) > 4 else ''}")
    if device_map is None:
        model.to(dev)
    else:  # inputs go where the embeddings are; accelerate's hooks move activations onwards
        dev = model.get_input_embeddings().weight.device
    model.eval()
    return HFModel(ref=ref, name_or_path=src, revision=resolved, kind=kind, model=model,
                   tokenizer=tokenizer, device=dev, dtype=torch_dtype, backend=backend, resolution=resolution,
                   device_map=device_map, chat_template=bool(getattr(tokenizer, "chat_template", None)))


# --------------------------------------------------------------------------- batching
