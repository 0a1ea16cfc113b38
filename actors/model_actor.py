"""The model worker: a process that holds one loaded model at a time for a sweep.

:class:`ModelServer` is a plain class (tests call it in-process); :func:`model_actor_class`
wraps it as a Ray actor with explicit ``num_cpus``/``num_gpus`` and ``max_restarts`` /
``max_task_retries``, so that an actor that dies (killed, out of memory, node lost) is restarted,
reloads its model, and receives again the requests that were pending.

A worker serves one model after another (``ray.reuse_workers``, :mod:`jobs.pool`): each request
(:meth:`ModelServer.serve`) names the model it is for (a :class:`ModelAssignment`), and a
request for another model than the loaded one first releases the loaded model completely
(:meth:`ModelServer.release`: every reference dropped, the backends' caches cleared,
``gc.collect()``, ``torch.cuda.empty_cache()`` when CUDA is in use, and glibc's
``malloc_trim`` so that freed memory goes back to the operating system), then loads the new one.
Because every request carries its model, a restarted worker re-sent its pending requests loads
the right model again.

The model is loaded lazily by the first request (and again after a restart), never in
``__init__``: a model that fails to load is then an application error recorded on each of its
tasks (the sweep goes on), not an actor that cannot be created. Every load appends one line to
``load_log`` (JSON: model, pid, seconds, time), which is how tests and the benchmark count loads.

A request carries several tasks of the same model; each is measured independently
(:func:`audit.runner.measure`) and an application error in one (:class:`audit.errors.AuditError`
or any other exception) is returned as that task's failure.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from actors.gc_tuning import tune_gc
from actors.shared import resolve
from audit.errors import one_line
from audit.runner import load_model, measure


@dataclasses.dataclass
class MeasureRequest:
    """One task as the actor needs it (the test travels separately, shared by reference)."""

    index: int
    test: str
    metric: str
    params: dict[str, Any]


@dataclasses.dataclass
class MeasureOutcome:
    """The measure step's outcome for one task.

    model:       ``LoadedModel.describe()`` of the model that measured it (ref, backend, kind,
                 revision), ``None`` if the model could not be loaded.
    measurement: an :class:`audit.runner.Measurement` (``None`` when failed).
    error:       ``"<ExceptionType>: message"`` for a failed task; ``traceback`` the details.
    load_id:     ``"<pid>:<n>"`` of the model load that served it (counts loads per sweep).
    """

    index: int
    model: dict[str, str] | None
    measurement: Any = None
    error: str | None = None
    traceback: str | None = None
    seconds: float = 0.0
    load_id: str | None = None


@dataclasses.dataclass(frozen=True)
class ModelAssignment:
    """Which model a request is for: what :class:`ModelServer` needs to load it.

    name:      the model's name in the spec (unique in a sweep).
    ref:       the spec's reference (what results record as the model).
    local_ref: what :func:`audit.runner.load_model` loads.
    options:   keyword arguments of ``load_model``.
    words:     for static models, the words the sweep's tasks need (``None``: all).
    """

    name: str
    ref: str
    local_ref: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    words: tuple[str, ...] | None = None


def format_error(e: BaseException) -> str:
    """A one-line failure reason: the type and message (AuditError messages name the culprit),
    made one line by :func:`audit.errors.one_line` (a worker's traceback in Ray's errors: its last
    line). Ray's ``RayTaskError`` gives the exception the task raised (its ``cause``)."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and cause is not e:
        return format_error(cause)
    return f"{type(e).__name__}: {one_line(str(e).strip() or repr(e))}"


class ModelServer:
    """Holds one model at a time and measures tasks on it.

    The constructor's model (optional) is the first one served by :meth:`measure_batch`;
    :meth:`serve` switches to the model its request names (releasing the loaded one first).

    ref:       the spec's reference (what results record as the model).
    local_ref: what :func:`audit.runner.load_model` loads (``minilm`` resolved to a path, ...).
    options:   keyword arguments of ``load_model`` (backend, revision, dtype, device,
               allow_pickle, trust_remote_code, subword).
    words:     for static models, the union of the words every task of the sweep needs
               (text formats then keep only those rows).
    load_log:  a file to which each load appends one JSON line (``None``: no log).
    """

    def __init__(self, name: str | None = None, ref: str | None = None, local_ref: str | None = None,
                 options: dict[str, Any] | None = None, words: list[str] | None = None,
                 load_log: str | None = None):
        tune_gc()  # before the first load imports torch and transformers (actors.gc_tuning)
        self.gpus_hidden = hide_unassigned_gpus()
        self.name = name
        self.ref = ref
        self.local_ref = local_ref if local_ref is not None else ref
        self.options = dict(options or {})
        self.words = set(words) if words else None
        self.load_log = load_log
        self.model = None
        self.load_error: BaseException | None = None
        self.load_count = 0
        self.load_id: str | None = None
        self.released = 0

    # ------------------------------------------------------------------ model
    def assign(self, model: ModelAssignment) -> None:
        """Make ``model`` the one served (releasing the loaded model if it is another)."""
        if model.name == self.name and model.ref == self.ref:
            return
        self.release()
        self.name, self.ref, self.local_ref = model.name, model.ref, model.local_ref
        self.options = dict(model.options or {})
        self.words = set(model.words) if model.words else None

    def release(self) -> None:
        """Drop the loaded model and give its memory back (CPU and GPU): every reference this
        worker holds, the static backends' caches (``functools`` caches of loaded matrices),
        then ``gc.collect()``, cuBLAS's workspaces and ``torch.cuda.empty_cache()`` when CUDA was used, and
        ``malloc_trim(0)`` (glibc keeps freed blocks in its arenas otherwise)."""
        had = self.model is not None or self.load_error is not None
        self.model = None
        self.load_error = None
        self.load_id = None
        self.name = self.ref = self.local_ref = None
        self.options, self.words = {}, None
        if not had:
            return
        for modname in ("audit.backends.static", "audit.backends.hf", "audit.contextual", "audit.runner"):
            mod = sys.modules.get(modname)
            for obj in list(vars(mod).values()) if mod is not None else ():
                if callable(getattr(obj, "cache_clear", None)) and hasattr(obj, "cache_info"):
                    obj.cache_clear()
        gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
                    # cuBLAS's workspaces (one per handle and stream, 32 MiB each on Hopper) live in the
                    # caching allocator and outlive the model; torch has no public call that frees them
                    # (measured in a fresh Ray worker on an H200: 32 MiB left allocated without this)
                    clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
                    if clear_workspaces is not None:
                        clear_workspaces()
                    torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001 - no usable CUDA: nothing to empty
                pass
        trim_heap()
        self.released += 1

    def ensure_loaded(self):
        """Load the model once; a load error is kept and re-raised for every later request."""
        if self.model is not None:
            return self.model
        if self.load_error is not None:
            raise self.load_error
        if self.ref is None:
            raise RuntimeError("no model assigned to this worker")

        t0 = time.perf_counter()
        try:
            opts = dict(self.options)
            if self.words is not None:
                opts["words"] = self.words
            model = load_model(self.local_ref, **opts)
        except BaseException as e:  # noqa: BLE001 - recorded on every task of this model
            self.load_error = e
            raise
        model.ref = self.ref  # results record the spec's reference, not a resolved path
        self.model = model
        self.load_count += 1
        self.load_id = f"{os.getpid()}:{self.load_count}"
        seconds = time.perf_counter() - t0
        if self.load_log:
            line = {"model": self.name, "ref": self.ref, "pid": os.getpid(), "load_id": self.load_id,
                    "seconds": round(seconds, 3), "time": time.time(), "revision": model.revision,
                    "rss": rss_bytes()}
            Path(self.load_log).parent.mkdir(parents=True, exist_ok=True)
            with open(self.load_log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
        return model

    def describe(self) -> dict[str, str]:
        return self.ensure_loaded().describe()

    # ------------------------------------------------------------------ requests
    def serve(self, model: ModelAssignment, requests: list[MeasureRequest], tests: dict[str, Any]) -> list[MeasureOutcome]:
        """Measure ``requests`` on ``model`` (loading it first, after releasing another one);
        ``tests`` by name, or a :class:`actors.shared.Shared` handle to them."""
        self.assign(model)
        return self.measure_batch(requests, resolve(tests))

    def measure_batch(self, requests: list[MeasureRequest], tests: dict[str, Any]) -> list[MeasureOutcome]:
        """Measure several tasks; one task's failure does not stop the others."""
        try:
            model = self.ensure_loaded()
        except BaseException as e:  # noqa: BLE001
            err = f"model {self.ref!r} could not be loaded: {format_error(e)}"
            tb = "".join(traceback.format_exception(e))
            return [MeasureOutcome(index=r.index, model=None, error=err, traceback=tb) for r in requests]

        out = []
        for r in requests:
            t0 = time.perf_counter()
            try:
                meas = measure(model, tests[r.test], r.metric, r.params)
                out.append(MeasureOutcome(index=r.index, model=model.describe(), measurement=meas,
                                          seconds=time.perf_counter() - t0, load_id=self.load_id))
            except Exception as e:  # noqa: BLE001 - recorded as the task's failure
                out.append(MeasureOutcome(index=r.index, model=model.describe(), error=format_error(e),
                                          traceback="".join(traceback.format_exception(e)),
                                          seconds=time.perf_counter() - t0, load_id=self.load_id))
        return out

    def pid(self) -> int:
        return os.getpid()

    def loads(self) -> int:
        return self.load_count

    def memory(self) -> int:
        """This process's resident set size in bytes (``/proc/self/statm``)."""
        return rss_bytes()


def hide_unassigned_gpus() -> bool:
    """In a Ray actor that Ray gave no GPU, make every GPU invisible to this process
    (``CUDA_VISIBLE_DEVICES=""``, before CUDA is initialised); ``True`` when it did.

    Ray sets ``CUDA_VISIBLE_DEVICES`` for an actor that reserves GPUs. For an actor with
    ``num_gpus=0`` it leaves the variable alone: ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO`` is off by
    default in Ray 2.60 (``ray._private.utils.set_visible_accelerator_ids``). Such a worker sees
    every GPU of its node, and the engines' default device, CUDA when available
    (:func:`audit.backends.hf.pick_device`), would put its model on a GPU it never reserved,
    beside the actors that did (a spec's ``ray.actor_num_gpus: 0`` on a GPU cluster). Hidden, the
    worker loads on the CPU, and a model that names ``device: cuda`` without a GPU reserved for it
    fails with one line saying so. Outside a Ray actor
    (the driver, ``audit run``'s in-process path, tests) nothing changes; nor where this process
    has already initialised CUDA (too late for the variable to count)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    if ray.get_runtime_context().get_actor_id() is None or ray.get_gpu_ids():
        return False
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return False
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return True


def rss_bytes() -> int:
    """Resident set size of this process in bytes (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim_heap() -> bool:
    """Ask glibc to return freed heap memory to the operating system (``malloc_trim(0)``);
    ``False`` where there is no glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def model_actor_class(server_cls: type | None = None):
    """The Ray actor class wrapping :class:`ModelServer` or a subclass (created lazily:
    importing this module does not import Ray)."""
    import ray

    return ray.remote(server_cls or ModelServer)


def actor_options(*, kind: str, num_cpus: float, num_gpus: float | str, cluster_gpus: float,
                  max_restarts: int, max_task_retries: int) -> dict[str, Any]:
    """Ray options of a model actor.

    ``num_gpus="auto"``: one GPU per Hugging Face model when the cluster has GPUs, none
    otherwise; a number is used as given (a fraction packs several models on one GPU) when the
    cluster has GPUs. Static models never reserve a GPU.
    """
    gpus = 0.0
    if kind != "static" and cluster_gpus > 0:
        gpus = 1.0 if num_gpus == "auto" else float(num_gpus)
    return {
        "num_cpus": float(num_cpus),
        "num_gpus": gpus,
        "max_restarts": int(max_restarts),
        "max_task_retries": int(max_task_retries),
    }
