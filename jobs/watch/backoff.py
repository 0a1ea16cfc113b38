"""Back-off of transient failures: the one policy and retry loop of :mod:`audit.retry` (shared with
the model loader and the planner's revision probe), with the watcher's defaults and its poll
back-off."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable

from audit import retry as core_retry


class SourceUnavailable(Exception):
    """A transient failure (network, HTTP 429/5xx, a locked store): retried with back-off. Raised
    ``from`` the original error, so that a server's ``Retry-After`` is honoured."""


@dataclasses.dataclass(frozen=True)
class Backoff(core_retry.Backoff):
    """:class:`audit.retry.Backoff` (retry ``k`` waits ``min(max, initial * factor**k)``, jitter
    from the caller's ``random.Random``, at most ``retries`` retries) with the watcher's defaults
    (2 s, doubling, at most 300 s, 4 retries) and its poll back-off: after ``n`` polls with errors
    in a row the next poll waits ``min(max_interval, interval * factor**n)`` instead of
    ``interval``."""

    initial: float = 2.0
    max: float = 300.0
    max_interval: float = 6 * 3600.0

    def poll_delay(self, interval: float, failed_polls: int) -> float:
        """Seconds until the next poll after ``failed_polls`` polls with errors in a row."""
        if failed_polls <= 0:
            return float(interval)
        return float(min(max(self.max_interval, interval), interval * self.factor ** failed_polls))


def retry(fn: Callable[[], Any], *, backoff: Backoff, rng: random.Random, sleep: Callable[[float], None],
          on_retry: Callable[[int, float, BaseException], None]) -> Any:
    """Call ``fn``; on :class:`SourceUnavailable` call ``on_retry(k, delay, error)`` (``k`` from
    1), wait and retry, at most ``backoff.retries`` times, then re-raise
    (:func:`audit.retry.call_with_retry`, which also honours a ``Retry-After`` on the cause)."""
    return core_retry.call_with_retry(
        fn, policy=backoff, rng=rng, sleep=sleep,
        is_transient=lambda e: str(e) if isinstance(e, SourceUnavailable) else None,
        on_retry=lambda ev: on_retry(ev.attempt, ev.delay, ev.error),
    )


__all__ = ["Backoff", "SourceUnavailable", "retry"]
