"""The one way a model is written into ``<output_dir>/models/<name>/``: built in a temporary
sibling folder, its ``build.json`` (the record of what it was built from) written last, then
renamed over the old folder, so a reader sees either the old model or the whole new one and an
interrupted build leaves nothing behind. Used by the tiny models and debiased copies
(:mod:`jobs.builders`) and the debiased LM variants (:mod:`jobs.lm_builders`); a model is rebuilt
only when its record changes (:func:`is_built`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from jobs.resolve import model_kind, resolve_ref

__all__ = ["BUILD_RECORD", "is_built", "write_built", "original"]

#: The record of what a built folder was built from (compared as text: JSON with sorted keys).
BUILD_RECORD = "build.json"


def original(spec: Any, model: Any) -> tuple[dict[str, Any], Any, str, str]:
    """What a derived model (a debiased copy or LM variant: ``build.base`` names its original) is
    built from: ``(its build block, the original's ModelSpec, the original's local reference,
    the original's model kind)`` (:func:`jobs.resolve.resolve_ref`, :func:`jobs.resolve.model_kind`)."""
    b = dict(model.build)
    base = spec.model(b["base"])
    build = dict(base.build) if base.build else None
    local = resolve_ref(base.ref, output_dir=spec.output_dir, build=build)
    return b, base, local, model_kind(base.ref, base.backend, build, local_ref=local)


def is_built(target: Path, record: str) -> bool:
    """Whether ``target`` holds a model built from ``record`` (its ``build.json`` reads the same)."""
    marker = Path(target) / BUILD_RECORD
    return marker.is_file() and marker.read_text(encoding="utf-8") == record


def write_built(target: Path, record: str, fill: Callable[[Path], Any]) -> Any:
    """``fill(folder)`` writes the model into a fresh temporary sibling of ``target`` (readable by
    workers running as other users: mode 0755, not ``mkdtemp``'s 0700); then ``build.json`` =
    ``record`` is written and the folder replaces ``target``. What ``fill`` returns is returned; if
    it raises, the temporary folder is removed and ``target`` is left as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o755)
    try:
        out = fill(tmp)
        (tmp / BUILD_RECORD).write_text(record, encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
