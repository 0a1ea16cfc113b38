"""Provenance: package versions and the deterministic identity of a task (``audit.key``)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from functools import lru_cache
from typing import Any

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


def load_key(options: dict[str, Any] | None) -> str:
    """The part of a model's load options that changes its numbers, as a key component: the
    requested ``dtype`` (``"dtype=bfloat16"``) and an engine chosen by ``backend`` among
    :data:`ENGINE_BACKENDS` (``"engine=sentence-transformers"``), comma-joined; ``""`` when both
    are the defaults. Devices and device maps do not enter (the same weights give the same numbers
    up to rounding)."""
    options = options or {}
    dtype = options.get("dtype")
    parts = [f"dtype={dtype}"] if dtype not in (None, "", "auto") else []
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
