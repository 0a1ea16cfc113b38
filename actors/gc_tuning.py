"""The cyclic garbage collector's thresholds in biasaudit's own processes: the sweep driver
(``audit``'s command line), the Ray model workers and the statistics workers.

CPython (3.11) collects its youngest generation after every 700 net allocations of container
objects, and the whole heap after ten of the middle generation's collections once a quarter of
the heap is new. These processes import torch, transformers, pandas, MLflow and Ray: 400,000 to
1.5 million objects that live as long as the process, which every full collection walks again
(0.1-0.5 s each on this machine). ``benchmarks/gc_thresholds.py`` (fresh processes, best of 2,
collections timed by ``gc.callbacks`` in thread CPU time):

* a model worker's start (``ModelServer()``, then a tiny Llama's load): 0.93 CPU-s in collections
  of 4.35, 0.48 of 3.80 tuned (1.14x the process's CPU);
* the driver of ``audit run jobs/specs/smoke.yaml``: 1.28 of 8.01, 0.47 of 7.13 (1.12x);
* a pytest-xdist worker of ``pytest -m unit``: 11-19 CPU-s, 4-10 with it (tests/conftest.py).

Raising the first threshold only makes each young collection rarer (and each one larger); nothing
is left uncollected, and garbage in cycles waits for at most :data:`GC_THRESHOLD` ``[0]``
allocations instead of 700. Objects freed by reference counting (almost all of them, tensors
included) are freed at once as before. A model worker still calls ``gc.collect()`` itself when it
releases a model (:meth:`actors.model_actor.ModelServer.release`).
"""

from __future__ import annotations

import gc

#: ``gc.set_threshold`` of biasaudit's processes: young collections every 10,000 net allocations
#: (CPython's default: 700); the older generations' factors unchanged. 50,000 saved nothing more
#: on a model worker's imports and load (0.42 against 0.36 CPU-s of collections, thresholds set
#: before every import).
GC_THRESHOLD = (10_000, 10, 10)


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLD` in this process, unless the collector is off or its first
    threshold is already higher (a setting of the user's own is kept). Called by the
    ``audit`` command, the model worker's constructor and the statistics tasks."""
    if gc.isenabled() and 0 < gc.get_threshold()[0] < GC_THRESHOLD[0]:
        gc.set_threshold(*GC_THRESHOLD)
