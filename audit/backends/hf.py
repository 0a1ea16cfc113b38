"""Hugging Face model loading: references, revisions, safe weights, device and batching.

A *reference* is either a local directory holding a ``config.json`` (a ``save_pretrained``
folder) or a Hub id ``org/name`` with an optional revision, ``org/name@rev``; the prefix
``hf:`` forces the Hugging Face backend (``hf:bert-base-uncased``, ``hf:./models/x``).

Provenance: every loaded model records a resolved ``revision``:

* Hub models: the 40-hex commit hash the files were loaded from (``HfApi().model_info(...).sha``
  online; the cached snapshot folder's commit hash with ``HF_HUB_OFFLINE=1`` or when the Hub
  cannot be reached). The model and tokenizer are then loaded *at that commit*, so the
  recorded hash is the one used.
* Local directories: ``sha256:<hex>`` over every regular file below the directory (``.git``
  folders excluded), in sorted order of their POSIX relative paths; for each file the digest
  takes ``len(name)``, the name, ``len(bytes)`` and the bytes (streamed in 1 MiB blocks), so
  renaming, adding, removing or editing any file (weights included) changes it.

Safety: weights are read from safetensors whenever the model has them; a model with pickle
weights only (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``, ``*.pth``) is refused with
:class:`~audit.errors.UnsafeModelError` unless ``allow_pickle=True``; ``trust_remote_code`` is always passed to Transformers
explicitly (``False`` unless the caller sets it), so a model that ships its own code is refused
with :class:`~audit.errors.UnsafeModelError` instead of Transformers prompting on the terminal.

Device and dtype: CUDA when available, else CPU. Default dtype: float32 on CPU; on CUDA
bfloat16 where the GPU supports it, else float16. Models are put in ``eval()`` mode; callers
run forward passes under :func:`torch.inference_mode`. ``device_map`` (models that need several
GPUs) is passed to Transformers as given; dtype, device and device map are recorded
(:meth:`HFModel.load_info`).

Causal LMs: tokenizers without a pad token are used as they are (the scorers build padded
batches themselves, :mod:`audit.measure.lm_scoring`); a chat template is never applied, only
recorded as present.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from audit.errors import ModelError, ParameterError, UnsafeModelError

__all__ = [
    "HFModel",
    "KINDS",
    "is_hf_ref",
    "parse_hf_ref",
    "load_hf_model",
    "dir_digest",
    "run_batched",
    "default_batch_size",
]

#: ``kind`` -> (Transformers auto class name, backend name, what the head is called in errors)
KINDS: dict[str, tuple[str, str, str]] = {
    "encoder": ("AutoModel", "hf-encoder", ""),
    "mlm": ("AutoModelForMaskedLM", "hf-mlm", "masked-LM"),
    "causal": ("AutoModelForCausalLM", "hf-causal", "causal-LM"),
}

#: Batch sizes used when ``batch_size=None``: on CPU a fixed 32; on CUDA 256 sentences (short
#: SEAT/CrowS-Pairs sentences fit easily in a few GiB at that size), halved on out-of-memory.
AUTO_BATCH_CPU = 32
AUTO_BATCH_CUDA = 256

_SAFE_WEIGHTS = re.compile(r"^model(-\d{5}-of-\d{5})?\.safetensors$")
_PICKLE_WEIGHTS = re.compile(r"^(pytorch_model(-\d{5}-of-\d{5})?\.bin|.*\.pt|.*\.pth|.*\.ckpt)$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
_HUB_ID_WITH_ORG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*(@[^\s@]+)?$")
_DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
           "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


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
    device_map:   the ``device_map`` the model was loaded with (``None``: one device).
    chat_template: whether the tokenizer ships a chat template (never applied: biasaudit scores
                  and embeds the text as given; recorded so that results say so).
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

    def provenance(self) -> dict[str, str]:
        """The provenance fields of a result: model reference, resolved revision, backend."""
        out = {"model": self.ref, "name_or_path": self.name_or_path,
               "revision": self.revision, "backend": self.backend}
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


def _resolve_hub(ref: str, name: str, revision: str | None,
                 cache_dir: str | None) -> tuple[str, list[str], bool]:
    """Resolve a Hub id to (commit hash, file list, local_files_only)."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    online_error: Exception | None = None
    if not _offline():
        try:
            info = HfApi().model_info(name, revision=revision, timeout=15)
            files = [s.rfilename for s in (info.siblings or [])]
            if info.sha:
                return info.sha, files, False
        except (RepositoryNotFoundError, RevisionNotFoundError) as e:
            raise ModelError(f"model {ref!r}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
        except Exception as e:  # network down: fall back to the cache below
            online_error = e
    try:
        snap = Path(snapshot_download(name, revision=revision, cache_dir=cache_dir,
                                      local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as e:
        how = ("HF_HUB_OFFLINE is set" if online_error is None
               else f"the Hub could not be reached ({type(online_error).__name__})")
        raise ModelError(
            f"model {ref!r} (revision {revision or 'main'}) is not in the local Hugging Face "
            f"cache and {how}; download it first or give a local directory"
        ) from e
    files = [rel for rel, _ in _iter_files(snap)]
    return snap.name, files, True


def _pick_device(device: str | None) -> Any:
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ParameterError(f"device: {device!r} is not a torch device ({e})") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ParameterError(f"device: {device!r} requested but CUDA is not available")
    return dev


def _pick_dtype(dtype: str | None, dev: Any) -> Any:
    import torch

    if dtype is None:
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPES:
        raise ParameterError(f"dtype: {dtype!r} is not one of float32, float16, bfloat16")
    return getattr(torch, _DTYPES[key])


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as tlog

    old = tlog.get_verbosity()
    bars = tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()  # "Loading weights" bars would clutter one-line error output
    try:
        yield
    finally:
        tlog.set_verbosity(old)
        if bars:
            tlog.enable_progress_bar()


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
        ``"float32"``, ``"float16"`` or ``"bfloat16"``; default float32 on CPU, bf16 (else fp16)
        on CUDA.
    cache_dir : str, optional
        Hugging Face cache folder for Hub ids (default: the Hub's own).
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
    if kind not in KINDS:
        raise ParameterError(f"kind: {kind!r} is not one of {sorted(KINDS)}")
    if isinstance(ref, os.PathLike):
        ref = os.fspath(ref)
    name, ref_rev = parse_hf_ref(ref)
    if revision is not None and ref_rev is not None and revision != ref_rev:
        raise ParameterError(
            f"model {ref!r}: revision {revision!r} conflicts with '@{ref_rev}' in the reference")
    revision = revision or ref_rev
    dev = _pick_device(device)
    torch_dtype = _pick_dtype(dtype, dev)
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
        src = str(local)
    else:
        resolved, files, local_only = _resolve_hub(ref, name, revision, cache_dir)
        use_safe = _check_weights(ref, f"Hub repo {name!r}@{resolved[:12]}", files, allow_pickle)
        src = name
        load_kw = {"revision": resolved, "local_files_only": local_only}
        if cache_dir is not None:
            load_kw["cache_dir"] = cache_dir
    load_kw["trust_remote_code"] = bool(trust_remote_code)  # False: refuse custom code, never prompt

    import transformers

    auto_name, backend, head = KINDS[kind]
    auto_cls = getattr(transformers, auto_name)
    try:
        with _quiet_transformers():
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
        with _quiet_transformers():
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
                   tokenizer=tokenizer, device=dev, dtype=torch_dtype, backend=backend,
                   device_map=device_map, chat_template=bool(getattr(tokenizer, "chat_template", None)))


# --------------------------------------------------------------------------- batching


def default_batch_size(device: Any) -> int:
    """The automatic initial batch size: 32 on CPU, 256 on CUDA (halved on out-of-memory)."""
    dev_type = getattr(device, "type", str(device).split(":")[0])
    return AUTO_BATCH_CUDA if dev_type == "cuda" else AUTO_BATCH_CPU


def run_batched(fn: Callable[[list], Sequence], items: list, batch_size: int | None, *,
                device: Any) -> list:
    """Apply ``fn`` to consecutive batches of ``items`` and concatenate the per-item results.

    ``fn(batch)`` must return one result per item (a list, or an array whose first axis is
    the batch). With ``batch_size=None`` the start size is :func:`default_batch_size`
    (CPU 32, CUDA 256). When a batch raises :class:`torch.cuda.OutOfMemoryError`, the CUDA
    cache is emptied, the batch size is halved and the same batch is retried; later batches
    keep the smaller size. Out of memory at batch size 1 raises :class:`ModelError`.
    Results are in the order of ``items``.
    """
    import torch

    if batch_size is None:
        batch_size = default_batch_size(device)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ParameterError(f"batch_size: must be a positive integer or None, got {batch_size!r}")
    out: list = []
    i, size = 0, batch_size
    while i < len(items):
        batch = items[i:i + size]
        try:
            res = fn(batch)
        except torch.cuda.OutOfMemoryError as e:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if size == 1:
                raise ModelError("out of GPU memory even at batch size 1") from e
            size = max(1, size // 2)
            continue
        res = list(res)
        if len(res) != len(batch):
            raise RuntimeError(f"run_batched: fn returned {len(res)} results for {len(batch)} items")
        out.extend(res)
        i += len(batch)
    return out
