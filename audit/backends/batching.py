"""Batched forward passes shared by the model engines: the automatic batch size and halving on
CUDA out-of-memory, and the padded batch itself (:func:`pad_batch`, :func:`positions`): one place
for each; the Hugging Face scorers, generators and pooling use them."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from audit import schema
from audit.errors import ModelError

__all__ = [
    "AUTO_BATCH_CPU",
    "AUTO_BATCH_CUDA",
    "SCORE_BATCH_CPU",
    "SCORE_BATCH_CUDA",
    "PADDING_SIDES",
    "Padded",
    "check_batch_size",
    "default_batch_size",
    "fill_batch",
    "inference",
    "pad_batch",
    "positions",
    "run_batched",
    "transformers_quiet",
]

@contextlib.contextmanager
def inference(*, no_grad: bool = False) -> Iterator[None]:
    """The mode of every forward pass of the engines: ``torch.inference_mode()`` (``no_grad``:
    ``torch.no_grad()``, for tensors that may meet autograd later), and where CUDA is available,
    scaled-dot-product attention without cuDNN's backend (flash, memory-efficient or math
    attention instead). cuDNN's attention builds an execution plan for each new input shape, and
    length-sorted batches under a token budget have a new shape almost every batch. Measured on an
    H100 (a BERT-base-sized masked LM, the 1508 CrowS-Pairs pairs, 42,508 masked copies, bfloat16):
    5.14 s with cuDNN's attention chosen by default, 1.35 s without it, scores within 1.5e-1 nat of
    float32 either way; float32, where cuDNN's attention does not apply, 4.7 s either way. On the
    CPU only the grad mode is set (attention kernels as torch chooses)."""
    import torch

    grad = torch.no_grad() if no_grad else torch.inference_mode()
    if not torch.cuda.is_available():
        with grad:
            yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with grad, sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


@contextlib.contextmanager
def transformers_quiet(*, progress_bars: bool = True) -> Iterator[None]:
    """Transformers' log records below ERROR left out inside (``progress_bars=False``: its progress
    bars too), the earlier settings restored on the way out.

    Nested uses cost nothing: the level is set only where it is below ERROR. Setting a logging level
    clears the cached levels of every logger of the process (``logging.Manager._clear_cache``,
    about 0.5 ms with transformers' loggers), so a loop of ``generate`` calls is wrapped once, not
    call by call: HONEST's greedy branches on the tiny GPT-2 set it 266 times per task (0.13 of
    2.3 CPU-s)."""
    from transformers.utils import logging as tlog

    old = tlog.get_verbosity()
    quiet = old < tlog.ERROR
    bars = not progress_bars and tlog.is_progress_bar_enabled()
    if quiet:
        tlog.set_verbosity_error()
    if bars:
        tlog.disable_progress_bar()
    try:
        yield
    finally:
        if quiet:
            tlog.set_verbosity(old)
        if bars:
            tlog.enable_progress_bar()


#: Where a batch's shorter sequences get their padding.
PADDING_SIDES = ("right", "left")


class Padded(NamedTuple):
    """A padded batch (:func:`pad_batch`).

    ids:     ``(n, width)`` int64 tensor, the tokens, ``pad_id`` elsewhere.
    mask:    ``(n, width)`` int64 tensor, 1 on tokens, 0 on padding (the attention mask).
    real:    the same mask as a NumPy bool array.
    offsets: ``(n,)`` column of each row's first token (0 with right padding).
    lengths: ``(n,)`` tokens per row.
    """

    ids: Any
    mask: Any
    real: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> Padded:
    """Token sequences as one padded batch, as wide as the longest: right padding (tokens from
    column 0) for encoders and for reading scores at known positions; left padding (tokens end in
    the last column) for generation and for continuing from a KV cache, where every row's last
    state must sit in the same column. The padded cells hold ``pad_id`` and are masked out, so
    which id pads does not change a masked model's numbers. Built with NumPy masks, not row by row
    (a third of the causal scorer's time on short sentences went to per-row tensors)."""
    import torch

    schema.choice(side, "padding_side", PADDING_SIDES)
    lens = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    width = int(lens.max()) if len(lens) else 0
    off = width - lens if side == "left" else np.zeros_like(lens)
    col = np.arange(width)[None, :]
    real = (col >= off[:, None]) & (col < (off + lens)[:, None])
    ids = np.full((len(seqs), width), int(pad_id), dtype=np.int64)
    ids[real] = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    return Padded(torch.from_numpy(ids), torch.from_numpy(real.astype(np.int64)), real, off, lens)


def positions(mask: Any) -> Any:
    """Position ids of a padded batch: ``cumsum(mask) - 1``, 0 on padding, so a left-padded row's
    first token is at position 0 as it would be alone."""
    return (mask.cumsum(1) - 1).clamp(min=0)

#: Batch sizes used when ``batch_size=None`` for passes that keep every hidden state (embeddings,
#: generation): on CPU a fixed 32; on CUDA 256 sentences (short SEAT/CrowS-Pairs sentences fit
#: easily in a few GiB at that size), halved on out-of-memory.
AUTO_BATCH_CPU = 32
AUTO_BATCH_CUDA = 256
#: The same for scoring passes (:mod:`audit.backends.hf_scoring`: the LM head on the scored
#: positions only) of short sequences (masked copies of one sentence, CrowS-Pairs/LPBS sentences
#: of ~10-60 tokens): on CPU ~128 x 30 tokens keeps the matrix products large without leaving the
#: cache (measured with benchmarks/crows_pairs.py: 128 beat 32 and 512); on CUDA 512.
SCORE_BATCH_CPU = 128
SCORE_BATCH_CUDA = 512
_DEFAULT_BATCH = {"embed": (AUTO_BATCH_CPU, AUTO_BATCH_CUDA), "score": (SCORE_BATCH_CPU, SCORE_BATCH_CUDA)}


def default_batch_size(device: Any, purpose: str = "embed") -> int:
    """The automatic initial batch size (halved on out-of-memory) for ``purpose``: ``"embed"``
    32 on CPU, 256 on CUDA; ``"score"`` 128 on CPU, 512 on CUDA."""
    dev_type = getattr(device, "type", str(device).split(":")[0])
    cpu, cuda = _DEFAULT_BATCH[purpose]
    return cuda if dev_type == "cuda" else cpu


def fill_batch(lengths: Sequence[int] | None, i: int, size: int) -> int:
    """How many items from ``i`` form the next batch: ``size`` items, or with ``lengths`` (``size``
    a token budget) the longest run whose padded size, items x longest, stays within ``size`` (at
    least one item)."""
    if lengths is None:
        return size
    n, longest = 0, 0
    while i + n < len(lengths):
        longest = max(longest, int(lengths[i + n]))
        if n and (n + 1) * longest > size:
            break
        n += 1
    return n


def check_batch_size(batch_size: Any) -> int | None:
    """The one rule of a ``batch_size`` argument: a positive integer, or ``None`` (the default of
    the operation: :func:`default_batch_size`, or a token budget)."""
    return None if batch_size is None else schema.integer(batch_size, "batch_size", 1)


def run_batched(fn: Callable[[list], Sequence], items: list, batch_size: int | None, *,
                device: Any, lengths: Sequence[int] | None = None) -> list:
    """Apply ``fn`` to consecutive batches of ``items`` and concatenate the per-item results.

    ``fn(batch)`` must return one result per item (a list, or an array whose first axis is
    the batch). With ``batch_size=None`` the start size is :func:`default_batch_size`
    (CPU 32, CUDA 256). With ``lengths`` (tokens of each item; items best sorted longest first)
    ``batch_size`` is a token budget instead of a count: a batch holds as many consecutive items
    as fit in it padded (items x longest <= budget; a longer item alone). When a batch raises
    :class:`torch.cuda.OutOfMemoryError`, the CUDA
    cache is emptied, the batch size is halved and the same batch is retried; later batches
    keep the smaller size. Out of memory at batch size 1 raises :class:`ModelError`.
    Results are in the order of ``items``.
    """
    import torch

    batch_size = check_batch_size(batch_size)
    if batch_size is None:
        batch_size = default_batch_size(device)
    if lengths is not None and len(lengths) != len(items):
        raise ValueError(f"run_batched: {len(lengths)} lengths for {len(items)} items")
    out: list = []
    i, size = 0, batch_size
    while i < len(items):
        batch = items[i:i + fill_batch(lengths, i, size)]
        try:
            res = fn(batch)
        except torch.cuda.OutOfMemoryError as e:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if size == 1 or (lengths is not None and len(batch) == 1):
                raise ModelError("out of GPU memory even at batch size 1") from e
            size = max(1, size // 2)
            continue
        res = list(res)
        if len(res) != len(batch):
            raise RuntimeError(f"run_batched: fn returned {len(res)} results for {len(batch)} items")
        out.extend(res)
        i += len(batch)
    return out
