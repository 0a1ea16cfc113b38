"""One driver per sweep: a lease held in the tracking store itself.

Several invocations of one spec may start at once, on one machine or on several machines
against one MLflow server. Without coordination each one finds the same keys unfinished and
runs them (two FINISHED child runs per key) and each writes the reports. The lease makes the
sweep's driver exclusive: the invocation that holds it syncs the write-ahead log, runs the
tasks, writes the child runs and the reports and closes the parent run; any other invocation
of the same sweep (same :meth:`jobs.spec.SweepSpec.sweep_id` in the same experiment) exits
with :data:`BUSY_EXIT_CODE` and one line naming the holder, having written nothing. A later
invocation takes the lease and resumes.

The lease is built on the one MLflow primitive with a uniqueness guarantee in the database:
a registered model's name is its primary key, so ``create_registered_model`` of an existing
name fails (``RESOURCE_ALREADY_EXISTS``) on SQLite, on PostgreSQL/MySQL and through an
``mlflow server`` alike. Lease *generations* are registered models named
``biasaudit-lease.<experiment id>.<sweep id>.<generation>`` whose tags say who holds them:

- ``holder`` (``host:pid:start``, :func:`jobs.tracker.driver_id`), ``host``, ``pid``,
  ``acquired`` and ``heartbeat`` (epoch seconds), ``ttl`` (seconds), ``released`` (``1`` once
  the holder is done);
- the newest generation is the lease. It is free when it is released, or stale: its holder
  is a process of this host that is gone (a killed driver), or its heartbeat is older than its
  ``ttl`` (a driver on another host that died; the hosts' clocks are assumed synchronised,
  NTP);
- to acquire, a driver creates generation ``newest + 1`` with its tags in the same call: of
  any number of drivers that saw the same free lease exactly one creation succeeds. The winner
  then checks that no newer generation exists (a driver acting on an old view could have
  recreated a cleaned-up number) and deletes the generations below its own;
- while it runs, the holder refreshes ``heartbeat`` every ``ttl / 4`` seconds from a thread;
  if it finds a newer generation (it was paused longer than ``ttl`` and taken over) it marks
  the lease lost and the sweep writes no reports (:attr:`Lease.lost`);
- released by tagging ``released=1``; a sweep that ended normally then deletes its generation,
  so that no lease is left on MLflow's Models page. Generation numbers are never reused all
  the same (a paused old holder must never find "its" number again): before deleting, the
  releaser records the generation in the experiment tag ``biasaudit.lease.<sweep id>``
  (:func:`lease_tag`), and an acquirer numbers from the larger of the newest generation and
  that tag. The tag is written before the deletion, so every acquirer that no longer sees the
  generation sees the tag, and racing acquirers still compute the same next number.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
from typing import Any

from jobs.tracker import all_pages, driver_alive

PREFIX = "biasaudit-lease"
#: Exit status of an invocation that found another driver running the same sweep.
BUSY_EXIT_CODE = 5
#: Seconds without a heartbeat after which a lease of a driver on another host is stale.
DEFAULT_TTL = 60.0


def lease_prefix(experiment_id: str, sweep_id: str) -> str:
    """The name every generation of a sweep's lease starts with."""
    return f"{PREFIX}.{experiment_id}.{sweep_id}."


def lease_tag(sweep_id: str) -> str:
    """The experiment tag holding the last generation a normally ended sweep deleted."""
    return f"{PREFIX}.{sweep_id}"


def generation_of(name: str, prefix: str) -> int | None:
    """The generation number of a lease name (``None`` for a name that is not one of ``prefix``)."""
    if not name.startswith(prefix):
        return None
    tail = name[len(prefix):]
    return int(tail) if tail.isdigit() else None


@dataclasses.dataclass(frozen=True)
class Holder:
    """What a lease generation's tags say about its holder."""

    name: str
    generation: int
    holder: str
    host: str
    pid: int
    acquired: float
    heartbeat: float
    ttl: float
    released: bool

    @classmethod
    def from_tags(cls, name: str, generation: int, tags: dict[str, str]) -> "Holder":
        def num(k: str, default: float = 0.0) -> float:
            try:
                return float(tags.get(k, default))
            except ValueError:
                return default

        return cls(name=name, generation=generation, holder=tags.get("holder", ""), host=tags.get("host", "?"),
                   pid=int(num("pid")), acquired=num("acquired"), heartbeat=num("heartbeat"),
                   ttl=num("ttl", DEFAULT_TTL), released=tags.get("released") == "1")

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.acquired)) if self.acquired else "?"
        ago = max(0.0, now - self.heartbeat)
        return f"host {self.host} pid {self.pid} (since {since}, last heartbeat {ago:.0f} s ago; lease {self.name})"


def lease_state(h: Holder | None, *, now: float, alive: bool | None) -> str:
    """``free`` (no lease, or released), ``stale`` (the holder died: ``alive`` is ``False``, or its
    heartbeat is older than its ttl) or ``held``. ``alive``: whether the holder process runs
    (:func:`jobs.tracker.driver_alive`: ``None`` when it is on another host)."""
    if h is None or h.released:
        return "free"
    if alive is False or now - h.heartbeat > h.ttl:
        return "stale"
    return "held"


class Busy(Exception):
    """Another live driver holds the sweep's lease; ``holder`` says which."""

    def __init__(self, holder: Holder):
        super().__init__(holder.describe())
        self.holder = holder


class Lease:
    """A sweep's lease in the tracking store of ``client`` (an :class:`mlflow.MlflowClient`).

    ``acquire()`` takes it or raises :class:`Busy`; ``release()`` frees it; while held a
    thread refreshes the heartbeat. ``taken_over`` names the stale holder this lease replaced."""

    def __init__(self, client, experiment_id: str, sweep_id: str, *, driver: str, ttl: float = DEFAULT_TTL):
        self.client = client
        self.experiment_id, self.tag = experiment_id, lease_tag(sweep_id)
        self.prefix = lease_prefix(experiment_id, sweep_id)
        self.driver = driver
        self.ttl = float(ttl)
        self.name: str | None = None
        self.generation = 0
        self.lost = False
        self.taken_over: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ reading
    def generations(self) -> list[tuple[int, Any]]:
        """``(generation, registered model)`` of every generation of this lease, oldest first."""
        found = all_pages(self.client.search_registered_models, filter_string=f"name LIKE '{self.prefix}%'")
        out = [(g, rm) for rm in found if (g := generation_of(rm.name, self.prefix)) is not None]
        return sorted(out, key=lambda x: x[0])

    def deleted_generation(self) -> int:
        """The last generation deleted by a normally ended sweep (the experiment tag; 0 for none)."""
        tags = dict(self.client.get_experiment(self.experiment_id).tags or {})
        raw = tags.get(self.tag, "0")
        return int(raw) if raw.isdigit() else 0

    def newest(self) -> Holder | None:
        gens = self.generations()
        if not gens:
            return None
        g, rm = gens[-1]
        return Holder.from_tags(rm.name, g, dict(rm.tags or {}))

    # ------------------------------------------------------------------ acquiring
    def _tags(self, now: float) -> dict[str, str]:
        host, pid = (self.driver.rsplit(":", 2) + ["", ""])[:2] if self.driver.count(":") >= 2 else \
            (socket.gethostname(), str(os.getpid()))
        return {"holder": self.driver, "host": host, "pid": pid,
                "acquired": f"{now:.3f}", "heartbeat": f"{now:.3f}", "ttl": f"{self.ttl:g}"}

    def acquire(self, attempts: int = 5) -> "Lease":
        for _ in range(attempts):
            now = time.time()
            cur = self.newest()
            state = lease_state(cur, now=now, alive=driver_alive(cur.holder) if cur else None)
            if state == "held":
                raise Busy(cur)
            gen = max(cur.generation if cur else 0, self.deleted_generation()) + 1
            name = f"{self.prefix}{gen:08d}"
            try:
                self.client.create_registered_model(name, tags=self._tags(now),
                                                    description=f"biasaudit sweep lease (generation {gen})")
            except Exception as e:  # noqa: BLE001
                if getattr(e, "error_code", None) == "RESOURCE_ALREADY_EXISTS":
                    continue  # another driver won this generation: look again
                raise
            newer = [g for g, _ in self.generations() if g > gen]
            if newer:  # acted on an old view: a newer generation is the lease
                self._delete(name)
                continue
            self.name, self.generation = name, gen
            self.taken_over = cur if state == "stale" else None
            for g, rm in self.generations():
                if g < gen:
                    self._delete(rm.name)
            self._thread = threading.Thread(target=self._beat, name="biasaudit-lease", daemon=True)
            self._thread.start()
            return self
        cur = self.newest()
        if cur is not None:
            raise Busy(cur)
        raise RuntimeError(f"could not acquire the sweep lease {self.prefix}*")

    def _delete(self, name: str) -> None:
        try:
            self.client.delete_registered_model(name)
        except Exception:  # noqa: BLE001 - gone already, or the store is down: harmless
            pass

    # ------------------------------------------------------------------ holding
    def still_held(self) -> bool:
        """Whether this lease's generation is still the newest (else it was taken over)."""
        if self.name is None:
            return False
        gens = self.generations()
        return bool(gens) and gens[-1][0] == self.generation

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                if not self.still_held():
                    self.lost = True
                    return
                self.client.set_registered_model_tag(self.name, "heartbeat", f"{time.time():.3f}")
            except Exception:  # noqa: BLE001 - the store is down; the sweep runs on, the lease may go stale
                continue

    def release(self, *, delete: bool = False) -> None:
        """Stop the heartbeat and mark the lease released; with ``delete`` (the sweep ended
        normally) record the generation in the experiment tag, then delete the registered
        model (best effort: a store that is down leaves it to go stale)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.name is not None and not self.lost:
            try:
                self.client.set_registered_model_tag(self.name, "released", "1")
                if delete and self.still_held():
                    if self.generation > self.deleted_generation():
                        self.client.set_experiment_tag(self.experiment_id, self.tag, str(self.generation))
                    self._delete(self.name)
            except Exception:  # noqa: BLE001
                pass
        self.name = None


__all__ = ["Lease", "Busy", "Holder", "BUSY_EXIT_CODE", "DEFAULT_TTL", "lease_state", "lease_prefix",
           "lease_tag", "generation_of"]
