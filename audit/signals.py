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
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, NoReturn

#: The signal delivered as :class:`Interrupted` and not yet handled by its command (``None``: none).
_pending: int | None = None


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the main thread; ``signum`` says which (exit status ``128 + signum``)."""

    def __init__(self, signum: int):
        super().__init__(int(signum))
        self.signum = int(signum)


def interrupt(signum: int) -> NoReturn:
    """Record ``signum`` as pending, then raise :class:`Interrupted`: the last step of a handler."""
    global _pending
    _pending = int(signum)
    raise Interrupted(signum)


def raise_pending() -> None:
    """Raise :class:`Interrupted` again for a signal whose first raise was lost (see the module)."""
    if _pending is not None:
        raise Interrupted(_pending)


def clear() -> None:
    """The command handled the interruption (one line, its exit status)."""
    global _pending
    _pending = None


def _raise(signum, frame) -> NoReturn:  # noqa: ARG001 - the signal module's signature
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
