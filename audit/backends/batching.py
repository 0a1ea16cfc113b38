"""Batched forward passes shared by the model engines: the automatic batch size and halving on
CUDA out-of-memory (one place for both; the Hugging Face scorers, generators and pooling use it)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from audit.errors import ModelError, ParameterError

__all__ = ["AUTO_BATCH_CPU", "AUTO_BATCH_CUDA", "default_batch_size", "run_batched"]

#: Batch sizes used when ``batch_size=None``: on CPU a fixed 32; on CUDA 256 sentences (short
#: SEAT/CrowS-Pairs sentences fit easily in a few GiB at that size), halved on out-of-memory.
AUTO_BATCH_CPU = 32
AUTO_BATCH_CUDA = 256


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
