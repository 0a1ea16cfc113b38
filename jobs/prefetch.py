"""Download the next models' Hub snapshots while the current ones are measured.

A sweep over many Hub checkpoints spends much of its time downloading. The driver knows the
order in which the worker pool will load the models (:mod:`jobs.pool`), so a small thread pool
here fetches the snapshots of the next models into the Hugging Face cache
(``huggingface_hub.snapshot_download``, the same cache and the same commit the loader uses:
:func:`audit.backends.hf.load_hf_model` then finds every file in place and downloads nothing)
while the workers measure.

Bounds (``ray.prefetch`` and ``ray.prefetch_disk_mb``):

- at most ``ahead`` models are downloaded ahead of the pool: downloading, or downloaded and not
  yet handed to a worker (``0`` switches prefetching off);
- the snapshots downloaded ahead take at most ``disk_bytes`` together (sizes from the Hub's file
  listing before the download); a model whose snapshot does not fit waits until earlier ones
  have been handed to a worker; a snapshot larger than the whole budget is not prefetched (the
  worker downloads it when it loads it, as without prefetch).

Only Hub ids with a resolved commit are prefetched (local folders, static files and models whose
revision the planner could not resolve are not), never with ``HF_HUB_OFFLINE`` set. Only what
the loader reads is fetched: every file that is not a weight file (configuration, tokenizer)
and the safetensors weights, or the pickle weights when the repository has no safetensors and
the model allows pickle. The download goes through the Hub client's own function
(``audit.backends.hf.fetch_hub_snapshot``: the loader's file selection, retries, no progress
bars) where it exists. A failed prefetch is harmless: it is logged, and the worker downloads
(and reports any error) when it loads the model.

The cache must be visible to the workers: the driver's node, or a shared ``HF_HOME``. On a
multi-node cluster without a shared cache, workers on other nodes download as before.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from audit.backends import hf

log = logging.getLogger("jobs.prefetch")

#: Weight files (the loader reads one format; the others are not downloaded ahead).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx", ".ot",
                    ".tflite", ".gguf", ".pb", ".mlmodel", ".keras")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


def hub_offline() -> bool:
    """Whether the Hugging Face Hub must not be contacted (``HF_HUB_OFFLINE``)."""
    try:
        from huggingface_hub import is_offline_mode

        return bool(is_offline_mode())
    except ImportError:  # pragma: no cover
        import os

        return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


@dataclasses.dataclass
class Snapshot:
    """A model to prefetch: Hub ``repo`` at commit ``revision``."""

    name: str
    repo: str
    revision: str
    allow_pickle: bool = False
    cache_dir: str | None = None


def hub_snapshot(name: str, local_ref: str, kind: str, revision: str | None, options: dict[str, Any]) -> Snapshot | None:
    """The :class:`Snapshot` of a model, or ``None`` when there is nothing to prefetch (a
    static model, a local folder, an unresolved revision)."""
    if kind == "static" or not revision or not hf.is_hf_ref(local_ref):
        return None
    repo, _ = hf.parse_hf_ref(local_ref)
    if Path(repo).expanduser().exists() or repo.startswith((".", "/", "~")):
        return None
    return Snapshot(name=name, repo=repo, revision=revision, allow_pickle=bool(options.get("allow_pickle")),
                    cache_dir=options.get("cache_dir"))


def select_files(files: list[tuple[str, int]], *, allow_pickle: bool) -> list[tuple[str, int]]:
    """The files the loader reads, from ``(path, size)`` pairs: every non-weight file, plus the
    safetensors weights, or (no safetensors, ``allow_pickle``) the pickle weights."""
    def weight(p: str) -> bool:
        return p.lower().endswith(_WEIGHT_SUFFIXES)

    keep = [f for f in files if not weight(f[0])]
    safe = [f for f in files if f[0].lower().endswith(".safetensors")]
    if safe:
        keep += safe
    elif allow_pickle:
        keep += [f for f in files if f[0].lower().endswith(_PICKLE_SUFFIXES)]
    return keep


def loader_files(files: list[tuple[str, int]], *, allow_pickle: bool) -> list[tuple[str, int]]:
    """The ``(path, size)`` pairs the loader downloads: the Hub client's own rule when
    :mod:`audit.backends.hf` exposes it (``download_patterns``), else :func:`select_files`."""
    rule = getattr(hf, "download_patterns", None) or getattr(hf, "_download_patterns", None)
    if rule is None:
        return select_files(files, allow_pickle=allow_pickle)
    names = [p for p, _ in files]
    use_safe = any(n.lower().endswith(".safetensors") for n in names)
    keep = set(rule(names, use_safe, False))
    if not use_safe and not allow_pickle:  # the loader refuses pickle weights: fetch none
        keep = {n for n in keep if not n.lower().endswith(_PICKLE_SUFFIXES)}
    return [f for f in files if f[0] in keep]


def list_snapshot(snap: Snapshot) -> list[tuple[str, int]]:
    """``(path, size)`` of every file of ``snap`` (one Hub call)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(snap.repo, revision=snap.revision, files_metadata=True, timeout=30)
    return [(s.rfilename, int(s.size or 0)) for s in (info.siblings or [])]


def _quiet_tqdm():
    from tqdm.auto import tqdm

    class Quiet(tqdm):  # no download bars (carriage returns) in the driver's log
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Quiet


def download_snapshot(snap: Snapshot, files: list[tuple[str, int]]) -> None:
    """Fetch what the loader reads of ``snap`` (``files``: every file of the snapshot) into the
    Hugging Face cache: through the Hub client's own download (``fetch_hub_snapshot``: its
    file selection, retries and back-off) when :mod:`audit.backends.hf` has it, else
    ``snapshot_download`` of :func:`loader_files`."""
    fetch, revision_cls = getattr(hf, "fetch_hub_snapshot", None), getattr(hf, "HubRevision", None)
    names = tuple(p for p, _ in files)
    if fetch is not None and revision_cls is not None:
        res = revision_cls(snap.repo, snap.revision, snap.revision, names, "hub", f"prefetch of {snap.revision}")
        fetch(res, use_safe=any(n.lower().endswith(".safetensors") for n in names), cache_dir=snap.cache_dir)
        return
    from huggingface_hub import snapshot_download

    snapshot_download(snap.repo, revision=snap.revision, allow_patterns=[p for p, _ in loader_files(files, allow_pickle=snap.allow_pickle)],
                      cache_dir=snap.cache_dir, tqdm_class=_quiet_tqdm())


@dataclasses.dataclass
class PrefetchStats:
    """What the prefetcher did: models fetched, bytes, seconds spent downloading (summed over
    threads), models skipped (too large, failed)."""

    fetched: int = 0
    bytes: int = 0
    seconds: float = 0.0
    skipped: int = 0
    failed: int = 0


class Prefetcher:
    """Fetches the snapshots of ``order`` (model names, the pool's loading order) ahead of the
    pool. ``snapshots``: name -> :class:`Snapshot` (models absent from it are skipped).

    :meth:`tick` starts downloads (call it often), :meth:`started` tells that a model was handed
    to a worker (it leaves the look-ahead window and the disk budget), :meth:`close` waits for
    nothing: downloads still running are abandoned to their threads (daemon), which end with
    the process.
    """

    def __init__(self, order: list[str], snapshots: dict[str, Snapshot], *, ahead: int, disk_bytes: int,
                 threads: int = 2, lister: Callable = list_snapshot, downloader: Callable = download_snapshot):
        self.order = [n for n in order]
        self.snapshots = dict(snapshots)
        self.ahead = max(0, int(ahead))
        self.disk_bytes = max(0, int(disk_bytes))
        self.lister = lister
        self.downloader = downloader
        self.stats = PrefetchStats()
        self._lock = threading.Lock()
        self._started: set[str] = set()       # handed to a worker
        self._state: dict[str, str] = {}      # name -> listing | waiting | downloading | done | failed | skipped
        self._sizes: dict[str, int] = {}
        self._files: dict[str, list] = {}
        self._reserved = 0                    # bytes of snapshots fetched ahead and not yet started
        self._pool = cf.ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="prefetch") if self.ahead else None
        self.enabled = bool(self.ahead and self.snapshots and not hub_offline())

    # ------------------------------------------------------------------ driver side
    def started(self, name: str) -> None:
        with self._lock:
            self._started.add(name)
            if self._state.get(name) in ("downloading", "done"):
                self._reserved -= self._sizes.get(name, 0)

    def window(self) -> list[str]:
        """The next ``ahead`` models not yet handed to a worker."""
        return [n for n in self.order if n not in self._started][: self.ahead]

    def tick(self) -> None:
        if not self.enabled or self._pool is None:
            return
        with self._lock:
            for name in self.window():
                snap = self.snapshots.get(name)
                if snap is None:
                    continue
                if self._state.get(name) is None:
                    self._state[name] = "listing"
                    self._pool.submit(self._list, name, snap)
            self._admit()

    def _admit(self) -> None:
        """Start the downloads that fit the disk budget in the window's order (lock held): a model
        whose files are still being listed, or that does not fit, holds back the ones after it, so
        the next model to load is fetched first whichever listing finished first."""
        for name in self.window():
            if name not in self.snapshots:
                continue  # nothing to fetch (not a Hub model)
            st = self._state.get(name)
            if st in (None, "listing"):
                return
            if st == "waiting":
                if not self._fits(name):
                    return
                self._start_download(name, self.snapshots[name])

    def status(self, name: str) -> str | None:
        with self._lock:
            return self._state.get(name)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ------------------------------------------------------------------ threads
    def _fits(self, name: str) -> bool:
        return self._reserved + self._sizes[name] <= self.disk_bytes

    def _start_download(self, name: str, snap: Snapshot) -> None:
        self._state[name] = "downloading"
        self._reserved += self._sizes[name]
        self._pool.submit(self._download, name, snap)

    def _list(self, name: str, snap: Snapshot) -> None:
        try:
            files = self.lister(snap)
            size = sum(sz for _, sz in loader_files(files, allow_pickle=snap.allow_pickle))
        except Exception as e:  # noqa: BLE001 - the worker downloads and reports at load time
            log.info("prefetch of %s (%s@%s) skipped: cannot list its files: %s", name, snap.repo, snap.revision[:12], e)
            with self._lock:
                self._state[name] = "failed"
                self.stats.failed += 1
            return
        with self._lock:
            self._files[name], self._sizes[name] = files, size
            if size > self.disk_bytes:
                self._state[name] = "skipped"
                self.stats.skipped += 1
                log.info("prefetch of %s skipped: %d bytes exceed ray.prefetch_disk_mb", name, size)
            elif name in self._started:
                self._state[name] = "skipped"  # a worker took it meanwhile
            else:
                self._state[name] = "waiting"
                self._admit()

    def _download(self, name: str, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        try:
            self.downloader(snap, self._files[name])
        except Exception as e:  # noqa: BLE001
            log.info("prefetch of %s (%s@%s) failed: %s", name, snap.repo, snap.revision[:12], e)
            with self._lock:
                self._state[name] = "failed"
                self.stats.failed += 1
                if name not in self._started:
                    self._reserved -= self._sizes.get(name, 0)
            return
        dt = time.perf_counter() - t0
        with self._lock:
            self._state[name] = "done"
            self.stats.fetched += 1
            self.stats.bytes += self._sizes.get(name, 0)
            self.stats.seconds += dt
        log.info("prefetched %s (%s@%s, %d bytes) in %.1f s", name, snap.repo, snap.revision[:12],
                 self._sizes.get(name, 0), dt)


__all__ = ["Prefetcher", "Snapshot", "PrefetchStats", "hub_snapshot", "select_files", "loader_files", "list_snapshot",
           "download_snapshot"]
