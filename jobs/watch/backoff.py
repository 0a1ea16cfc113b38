"""Back-off of transient failures: the delays, and the retry loop around a call."""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Callable


class SourceUnavailable(Exception):
    """A transient failure (network, HTTP 429/5xx, a locked store): retried with back-off."""


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential back-off of transient failures.

    Retry ``k`` (0-based) waits ``min(max, initial * factor**k) * u`` seconds, ``u`` uniform in
    ``[1 - jitter, 1 + jitter]`` from ``random.Random(seed)`` (``jitter = 0``: no draw), the
    product capped at ``max``; at most ``retries`` retries follow the first try. In poll mode a
    poll with errors is followed, after ``n`` such polls in a row, by a wait of
    ``min(max_interval, interval * factor**n)`` instead of ``interval``.
    """

    initial: float = 2.0
    factor: float = 2.0
    max: float = 300.0
    retries: int = 4
    jitter: float = 0.0
    seed: int = 0
    max_interval: float = 6 * 3600.0

    def delay(self, k: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry ``k`` (0-based)."""
        d = min(self.max, self.initial * self.factor ** k)
        if self.jitter > 0:
            d *= 1.0 + self.jitter * (2.0 * (rng or random.Random(self.seed)).random() - 1.0)
        return float(min(self.max, d))

    def poll_delay(self, interval: float, failed_polls: int) -> float:
        """Seconds until the next poll after ``failed_polls`` polls with errors in a row."""
        if failed_polls <= 0:
            return float(interval)
        return float(min(max(self.max_interval, interval), interval * self.factor ** failed_polls))


def retry(fn: Callable[[], Any], *, backoff: Backoff, rng: random.Random, sleep: Callable[[float], None],
          on_retry: Callable[[int, float, BaseException], None]) -> Any:
    """Call ``fn``; on :class:`SourceUnavailable` call ``on_retry(k, delay, error)`` (``k`` from
    1), wait :meth:`Backoff.delay` and retry, at most ``backoff.retries`` times, then re-raise."""
    k = 0
    while True:
        try:
            return fn()
        except SourceUnavailable as e:
            if k >= backoff.retries:
                raise
            d = backoff.delay(k, rng)
            on_retry(k + 1, d, e)
            sleep(d)
            k += 1


__all__ = ["Backoff", "SourceUnavailable", "retry"]
