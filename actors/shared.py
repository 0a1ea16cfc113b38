"""Read-only data a sweep puts in Ray's object store once, deserialised once per worker process.

A sweep sends its loaded tests (word sets, sentence templates, CrowS-Pairs and BBQ frames: 46 MB
pickled for ``jobs/specs/smoke-languages.yaml``, most of it EsBBQ and CaBBQ) with every measure
request and every statistics task. Passed as an ``ObjectRef`` argument, Ray resolves and unpickles
it again for each call (0.14 s of CPU each on this machine, every batch of every model). Wrapped in
:class:`Shared`, the reference travels unresolved (Ray resolves only top-level ``ObjectRef``
arguments) and :meth:`Shared.get` reads it from the store the first time a process asks, then keeps
it for the next calls. The object must not be changed by its readers.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

#: The last few objects read in this process, by object id (a worker serves one sweep at a time;
#: one that served an earlier sweep of the same job keeps at most this many).
_KEEP = 2
_CACHE: collections.OrderedDict[str, Any] = collections.OrderedDict()
_LOCK = threading.Lock()


class Shared:
    """A handle to an object in Ray's store (``Shared(ray.put(obj))``), picklable, read with
    :meth:`get` once per process."""

    __slots__ = ("_ref",)

    def __init__(self, ref: Any):
        self._ref = (ref,)  # nested in a tuple: never resolved by Ray on the way

    def get(self) -> Any:
        ref = self._ref[0]
        key = ref.hex()
        with _LOCK:
            if key in _CACHE:
                _CACHE.move_to_end(key)
                return _CACHE[key]
        import ray

        obj = ray.get(ref)
        with _LOCK:
            _CACHE[key] = obj
            while len(_CACHE) > _KEEP:
                _CACHE.popitem(last=False)
        return obj


def resolve(obj: Any) -> Any:
    """``obj.get()`` for a :class:`Shared` handle, ``obj`` itself otherwise (in-process callers
    pass the object directly)."""
    return obj.get() if isinstance(obj, Shared) else obj
