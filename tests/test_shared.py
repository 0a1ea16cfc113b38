"""A sweep's tests travel to its workers once per process (:mod:`actors.shared`): a
:class:`actors.shared.Shared` handle is deserialised by the first call in a worker and kept for the
next ones, where a plain ``ObjectRef`` argument is unpickled again by every call."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from actors.shared import Shared, resolve




def _loaded(path: str, payload):
    """Runs wherever the object is unpickled: one line per deserialisation, naming the process."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    return Payload(path, payload)


class Payload:
    def __init__(self, path: str, words):
        self.path, self.words = path, words

    def __reduce__(self):
        return _loaded, (self.path, self.words)


def _count(path: Path) -> collections.Counter:
    return collections.Counter(path.read_text().split()) if path.exists() else collections.Counter()


@pytest.mark.ray
def test_a_shared_object_is_deserialised_once_per_worker_process(local_ray, tmp_path):
    ray = local_ray
    log = tmp_path / "loads.txt"

    @ray.remote(num_cpus=1)
    def read(tests):
        obj = resolve(tests)
        return os.getpid(), sorted(obj.words)

    ref = ray.put(Payload(str(log), {"he", "she"}))
    log.unlink(missing_ok=True)  # (ray.put does not unpickle; nothing should be there)
    calls = collections.Counter(pid for pid, words in ray.get([read.remote(Shared(ref)) for _ in range(12)]))
    assert sum(calls.values()) == 12
    loads = _count(log)
    assert set(loads) == {str(p) for p in calls}  # every process that ran a call read it ...
    assert all(n == 1 for n in loads.values()), loads  # ... once

    # the control: the same object as a plain ObjectRef argument is unpickled by every call
    log.unlink()
    plain = collections.Counter(pid for pid, _ in ray.get([read.remote(ref) for _ in range(12)]))
    assert sum(_count(log).values()) == 12 == sum(plain.values())


@pytest.mark.unit
def test_resolve_passes_plain_objects_through():
    tests = {"weat7": object()}
    assert resolve(tests) is tests
