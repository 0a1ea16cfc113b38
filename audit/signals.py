"""SIGINT and SIGTERM as an exception in the main thread, which a finalizer cannot lose.

Python runs a signal handler in the main thread between two bytecodes, wherever that thread is.
When it is inside a finalizer (``__del__``, a weakref callback, a garbage-collection pass), an
exception the handler raises is printed ("Exception ignored in ...") and dropped, and the command
goes on as if no signal had come. A sweep's driver ignores a second signal, so that its cleanup is
not cut (:func:`jobs.sweep.on_signals`): after such a loss only SIGKILL could stop it.

So the handler records the signal before it raises (:func:`interrupt`). Loops call
:func:`raise_pending` at their safe points (the sweep's scheduling loop, once per tick), and a
command calls it before reporting how it ended. The command that catches :class:`Interrupted`
calls :func:`clear`. While :func:`raised_in_main_thread` holds, the lost raise prints nothing
(``sys.unraisablehook``): it is raised again, and the command's one line says how it ended.

Inside :func:`deferred` (a write to a database-backed tracking store: ``jobs.tracker.tracking_client``)
the signal is recorded and raised when the block ends, not in the middle of it: raised inside an
MLflow commit on SQLite it left that connection's write transaction open, and the driver's
cleanup (the parent run marked KILLED, the sweep's lease released) then waited 20 s per write
for SQLite's lock and failed: a signalled sweep took about 50 s to exit and left its lease behind
(5 of 60 signals at random moments of a write loop, ``tests/test_signals.py``).
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

#: The signal delivered as :class:`Interrupted` and not yet handled by its command (``None``: none).
_pending: int | None = None
#: How many :func:`deferred` blocks the main thread is in (a signal is then recorded, not raised).
_deferring = 0
#: The signal that arrived inside the current :func:`deferred` blocks, raised when they end.
_held: int | None = None


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the main thread; ``signum`` says which (exit status ``128 + signum``)."""

    def __init__(self, signum: int):
        super().__init__(int(signum))
        self.signum = int(signum)


def interrupt(signum: int) -> None:
    """Record ``signum`` as pending, then raise :class:`Interrupted`: the last step of a handler.
    Inside :func:`deferred` it only records: the block raises it when it ends."""
    global _pending, _held
    _pending = int(signum)
    if _deferring:
        _held = int(signum)
        return
    raise Interrupted(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Run the block whole: a signal that :func:`interrupt` handles meanwhile is recorded and
    raised when the outermost block ends normally; when the block raises, its exception goes on
    and the signal stays pending for the next safe point (:func:`raise_pending`). Only a signal
    that arrived inside the blocks is raised at their end: the writes of a command's cleanup,
    after its signal was raised and before :func:`clear`, run whole and raise nothing (raising
    the pending signal again there cut the sweep's lease release after its first write). Only
    the main thread defers (Python runs signal handlers there); in another thread the block
    runs unchanged."""
    global _deferring, _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = None
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring:  # the outermost block: what it held is its own to raise, or to leave pending
            held, _held = _held, None
    if held is not None:
        raise Interrupted(held)


def raise_pending() -> None:
    """Raise :class:`Interrupted` again for a signal whose first raise was lost (see the module)."""
    if _pending is not None:
        raise Interrupted(_pending)


def clear() -> None:
    """The command handled the interruption (one line, its exit status)."""
    global _pending, _held
    _pending = _held = None


def _raise(signum, frame) -> None:  # noqa: ARG001 - the signal module's signature
    interrupt(signum)


SIGNALS = (signal.SIGINT, signal.SIGTERM)


def install(handler: Callable, signums: tuple[int, ...] = SIGNALS) -> dict | None:
    """Make ``signums`` call ``handler``; returns the handlers they had. Only in the main thread
    (where Python runs handlers); elsewhere nothing changes and it returns ``None``."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {s: signal.signal(s, handler) for s in signums}


@contextmanager
def raised_in_main_thread(handler: Callable = _raise, signums: tuple[int, ...] = SIGNALS) -> Iterator[None]:
    """Within the block, ``signums`` call ``handler`` (by default: :func:`interrupt`); the previous
    handlers come back after it. Only in the main thread; elsewhere the block runs unchanged."""
    old = install(handler, signums)
    if old is None:
        yield
        return
    before = sys.unraisablehook

    def quiet_when_pending(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Interrupted):
            before(unraisable)

    sys.unraisablehook = quiet_when_pending
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if sys.unraisablehook is quiet_when_pending:
            sys.unraisablehook = before
