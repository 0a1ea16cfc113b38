"""What a person watching a sweep sees while it runs.

On a terminal: a tqdm bar (on stderr). Elsewhere (``--no-progress``, a job log, a pipe, CI) a
plain line every ``interval`` seconds, and one at the end, on stdout and in the run log::

    progress: 37/109 tasks (34%), 2 failed, 3 models loaded, 2m05s elapsed, about 4m03s left

The estimate of the time left is the mean time per finished task so far times the tasks left
(``about ?`` before the first task has finished). tqdm never writes to a stream that is not a
terminal, so job logs carry no carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import Callable


def format_seconds(s: float) -> str:
    """``45s``, ``2m05s``, ``1h02m``."""
    s = max(0.0, float(s))
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        m, sec = divmod(int(round(s)), 60)
        return f"{m}m{sec:02d}s"
    h, rem = divmod(int(round(s)), 3600)
    return f"{h}h{rem // 60:02d}m"


def use_bar(progress: bool, stream=None) -> bool:
    """A tqdm bar only when progress is wanted and ``stream`` (default stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(progress) and stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Progress of ``total`` tasks: a bar (``bar=True``) or periodic plain lines through ``say``.

    update: called with the running counts after each task outcome;
    tick:   called often (the driver's wait loop); prints a plain line when ``interval``
            seconds have passed since the last one;
    close:  the last line (plain mode) and the bar closed.
    """

    def __init__(self, total: int, *, label: str, bar: bool, interval: float, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic):
        self.total = int(total)
        self.label = label
        self.interval = float(interval)
        self.say = say
        self.clock = clock
        self.t0 = clock()
        self.last = self.t0
        self.done = self.failed = self.loads = 0
        self.lines = 0
        self._bar = None
        if bar:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, desc=label, unit="task", file=sys.stderr, mininterval=0.5,
                             dynamic_ncols=True)

    def update(self, *, done: int, failed: int, loads: int) -> None:
        if self._bar is not None and done > self.done:
            self._bar.update(done - self.done)
        self.done, self.failed, self.loads = done, failed, loads

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = now - self.t0
        pct = 100.0 * self.done / self.total if self.total else 100.0
        if self.done >= self.total:
            left = "done"
        elif self.done:
            left = f"about {format_seconds(elapsed / self.done * (self.total - self.done))} left"
        else:
            left = "about ? left"
        return (f"progress: {self.done}/{self.total} tasks ({pct:.0f}%), {self.failed} failed, "
                f"{self.loads} model{'s' if self.loads != 1 else ''} loaded, {format_seconds(elapsed)} elapsed, {left}")

    def tick(self, now: float | None = None) -> None:
        """A plain line when ``interval`` seconds have passed; none once every task is done (the
        driver still writes its last results: :meth:`close` prints the final line, once)."""
        now = self.clock() if now is None else now
        # the line of a finished run is close()'s, so that it is printed once
        if self._bar is None and now - self.last >= self.interval and self.done < self.total:
            self.last = now
            self.lines += 1
            self.say(self.line(now))

    def close(self, *, final_line: bool = True) -> None:
        """Close the bar, or print the last plain line (not when ``final_line`` is false: the
        run was refused or broke off)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif final_line:
            self.lines += 1
            self.say(self.line())


__all__ = ["Progress", "format_seconds", "use_bar"]
