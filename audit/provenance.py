"""Provenance: package versions and the deterministic identity of a task (``audit.key``)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from functools import lru_cache
from typing import Any

from audit import schema

#: Distributions whose versions change numbers; recorded with every result.
TRACKED_PACKAGES = (
    "biasaudit",
    "numpy",
    "scipy",
    "scikit-learn",
    "pandas",
    "torch",
    "transformers",
    "tokenizers",
    "fasttext-wheel",
    "spacy",
)


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Installed versions of :data:`TRACKED_PACKAGES` (absent ones omitted) and Python's."""
    out = {"python": platform.python_version()}
    for name in TRACKED_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def code_version() -> str:
    """The biasaudit version that produced a result (part of ``audit.key``)."""
    return package_versions().get("biasaudit", "0+unknown")


#: Backends that load a reference through another engine than the one it gets by itself (a
#: sentence-transformers folder is a Hugging Face checkpoint too): their numbers differ for the
#: same reference and revision, so the backend enters the key (``audit.backends.table``).
ENGINE_BACKENDS = ("sentence-transformers",)


#: The dtypes a Hugging Face model loads in, by every name the loaders accept -> the canonical name.
DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}
#: The canonical names, in the order commands and specs list them.
DTYPE_NAMES = ("float32", "float16", "bfloat16")
#: The dtype when none is asked for, on every device (:mod:`audit.backends.hf`): a task's numbers
#: must not depend on where it runs, since its key holds no device.
DEFAULT_DTYPE = "float32"


def canonical_dtype(dtype: Any) -> str:
    """The canonical name of a requested dtype (``None`` or ``""``: :data:`DEFAULT_DTYPE`;
    ``"bf16"``, ``torch.bfloat16``: ``"bfloat16"``); another is a :class:`ParameterError`."""
    if dtype is None or dtype == "":
        return DEFAULT_DTYPE
    key = str(dtype).replace("torch.", "").lower()
    if key not in DTYPES:
        schema.choice(dtype, "dtype", DTYPE_NAMES)  # refuses, naming the choices
    return DTYPES[key]


def load_key(options: dict[str, Any] | None) -> str:
    """The part of a model's load options that changes its numbers, as a key component: the
    dtype when it is not the default (``"dtype=bfloat16"``, by its canonical name) and an engine
    chosen by ``backend`` among :data:`ENGINE_BACKENDS` (``"engine=sentence-transformers"``),
    comma-joined; ``""`` when both are the defaults. Devices and device maps do not enter: the
    default dtype is the same on every device, and the same weights in the same dtype give the
    same numbers up to rounding (5e-6 nat between an H100 and the CPU, ``tests/test_gpu.py``)."""
    options = options or {}
    dtype = canonical_dtype(options.get("dtype"))
    parts = [f"dtype={dtype}"] if dtype != DEFAULT_DTYPE else []
    if options.get("backend") in ENGINE_BACKENDS:
        parts.append(f"engine={options['backend']}")
    return ",".join(parts)


def task_key(
    *,
    model_revision: str,
    model_ref: str,
    dataset_digest: str,
    metric: str,
    params: dict[str, Any],
    seed: int | None,
    version: str | None = None,
    load: str = "",
) -> str:
    """A deterministic hex key of everything that changes a task's numbers.

    sha256 over the canonical JSON (sorted keys) of model reference and resolved revision,
    dataset digest, metric name, metric parameters, seed and code version, and the load options
    that change numbers (``load``, e.g. ``dtype=bfloat16``; left out of the JSON when empty, so
    keys of models loaded with their defaults do not depend on it). Two runs with the same key
    produce the same numbers, so a sweep may skip a key that already has a finished run.
    """
    fields = {
        "model": model_ref,
        "revision": model_revision,
        "dataset": dataset_digest,
        "metric": metric,
        "params": params,
        "seed": seed,
        "version": version if version is not None else code_version(),
    }
    if load:
        fields["load"] = load
    blob = json.dumps(
        fields,
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    ).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()
