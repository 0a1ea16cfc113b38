"""Retries with exponential back-off for transient failures of remote services (the Hugging Face
Hub, tracking servers): one policy, one classifier, one loop, shared by the model loader, the
planner's revision probe and the watcher.

Policy (:class:`Backoff`): retry ``k`` (0-based) waits ``min(max, initial * factor**k)`` seconds,
times ``u`` uniform in ``[1 - jitter, 1 + jitter]`` drawn from the caller's ``random.Random`` (no
draw when ``jitter = 0``), the product capped at ``max``; at most ``retries`` retries follow the
first try (``retries + 1`` attempts in all). A server's ``Retry-After`` (seconds, or an HTTP date)
raises the wait to what it asks; when it asks for more than ``max`` seconds the failure is not
retried (it is re-raised at once: a task does not sleep for an hour on a rate limit).

Transient (:func:`transient_reason`): HTTP 408, 425, 429 and every 5xx; connection errors and
timeouts (``ConnectionError``, ``TimeoutError``, ``socket.gaierror``, an ``OSError`` whose errno says the
network or host is unreachable, and the transport errors of
``httpx``/``httpx2``/``httpcore``/``requests``/``urllib3``: connect, read, write, timeout, remote
protocol). Not transient: any other HTTP status (401, 403, 404 ...: the answer will not change),
proxy misconfiguration, offline mode (``huggingface_hub``'s ``OfflineModeIsEnabled``), and every
other exception. An exception without an HTTP status of its own is classified by its
``__cause__``/``__context__`` chain (libraries wrap a 503 in their own errors).

Configuration from the environment (:meth:`Backoff.from_env`, prefix ``BIASAUDIT_HUB_`` for hub
calls): ``<PREFIX>RETRIES`` (retries after the first try, default 4), ``<PREFIX>RETRY_DELAY``
(``initial``, seconds, default 1), ``<PREFIX>RETRY_MAX`` (``max``, seconds, default 30); a bad
value is a :class:`~audit.errors.ParameterError` naming the variable.

This module is part of the core: no Ray, MLflow, ``jobs`` or ``actors`` imports, and no import
of the HTTP client libraries (they are recognised by their class names and modules).
"""

from __future__ import annotations

import dataclasses
import email.utils
import errno
import logging
import os
import random
import socket
import time
from typing import Any, Callable, Mapping, TypeVar

from audit import schema
from audit.errors import ParameterError

__all__ = ["Backoff", "RetryEvent", "call_with_retry", "transient_reason", "http_status", "retry_after",
           "first_line"]

T = TypeVar("T")
log = logging.getLogger("audit.retry")

#: HTTP statuses worth retrying: request timeout, too early, too many requests, server errors.
TRANSIENT_STATUS = frozenset({408, 425, 429})
_CLIENT_MODULES = ("httpx", "httpx2", "httpcore", "requests", "urllib3")
#: Transport error classes of those modules (matched by name along the MRO).
_TRANSIENT_NAMES = frozenset({
    "TimeoutException", "NetworkError", "RemoteProtocolError", "ConnectError", "ReadError", "WriteError",
    "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout",            # httpx / httpx2 / httpcore
    "ConnectionError", "Timeout", "ChunkedEncodingError",                       # requests
    "ProtocolError", "NewConnectionError", "TimeoutError", "ReadTimeoutError",  # urllib3
    "ConnectTimeoutError", "IncompleteRead",
})
#: ``OSError`` numbers of a network that cannot be reached for now (not ``ConnectionError`` subclasses).
_UNREACHABLE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN})
_NEVER_NAMES = frozenset({"ProxyError", "OfflineModeIsEnabled", "SSLError", "LocalProtocolError",
                          "UnsupportedProtocol", "InvalidURL"})


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Exponential back-off (see the module docstring for the formula).

    initial: seconds before the first retry.   factor: growth per retry (>= 1).
    max:     cap of one wait, and the longest ``Retry-After`` honoured.
    retries: retries after the first try.      jitter: fraction in [0, 1).
    seed:    seed of the jitter's ``random.Random`` when the caller passes none.
    """

    initial: float = 1.0
    factor: float = 2.0
    max: float = 30.0
    retries: int = 4
    jitter: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        """Each field checked in :mod:`audit.schema`'s words (``back-off retries: must be >= 0, got -1``),
        with the watch spec's ranges (:class:`jobs.watch.spec.BackoffFields`): finite numbers, so an
        infinite wait or cap (``BIASAUDIT_HUB_RETRY_MAX=inf``) is refused, as NaN always was."""
        for name in ("initial", "max"):
            schema.number(getattr(self, name), f"back-off {name}", 0.0)
        schema.number(self.factor, "back-off factor", 1.0)
        schema.exact_integer(self.retries, "back-off retries", 0)
        schema.number(self.jitter, "back-off jitter", 0.0, maximum=1.0)

    @property
    def attempts(self) -> int:
        """Tries in all (the first and the retries)."""
        return self.retries + 1

    def delay(self, k: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry ``k`` (0-based), without any ``Retry-After``."""
        d = min(self.max, self.initial * self.factor ** k)
        if self.jitter > 0:
            d *= 1.0 + self.jitter * (2.0 * (rng or random.Random(self.seed)).random() - 1.0)
        return float(min(self.max, d))

    @classmethod
    def from_env(cls, prefix: str = "BIASAUDIT_HUB_", environ: Mapping[str, str] | None = None,
                 **defaults: Any) -> "Backoff":
        """The policy with ``<prefix>RETRIES``, ``<prefix>RETRY_DELAY``, ``<prefix>RETRY_MAX`` from
        the environment over ``defaults`` (keyword fields) over the class defaults."""
        env = os.environ if environ is None else environ
        kw = dict(defaults)
        for var, field, conv in ((f"{prefix}RETRIES", "retries", int), (f"{prefix}RETRY_DELAY", "initial", float),
                                 (f"{prefix}RETRY_MAX", "max", float)):
            raw = env.get(var)
            if raw is None or not raw.strip():
                continue
            try:
                kw[field] = conv(raw.strip())
            except ValueError:
                raise ParameterError(f"environment variable {var}: {raw!r} is not "
                                     f"{'an integer' if conv is int else 'a number'}") from None
        try:
            return cls(**kw)
        except ParameterError as e:
            raise ParameterError(f"{e} (environment variables {prefix}RETRIES/RETRY_DELAY/RETRY_MAX)") from None


@dataclasses.dataclass(frozen=True)
class RetryEvent:
    """What :func:`call_with_retry` tells ``on_retry`` before it sleeps.

    attempt: the retry about to be made (1-based); of: the most retries allowed;
    delay: seconds it will wait; reason: one line (``HTTP 503``, ``ConnectError: ...``);
    error: the exception; retry_after: the server's ``Retry-After`` in seconds, if any.
    """

    attempt: int
    of: int
    delay: float
    reason: str
    error: BaseException
    retry_after: float | None = None

    def describe(self, what: str = "") -> str:
        """``<what>: HTTP 503 (retry 1 of 4 in 0.50 s)``: one line."""
        head = f"{what}: " if what else ""
        return f"{head}{self.reason} (retry {self.attempt} of {self.of} in {self.delay:.2f} s)"


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message (its type name when it has none)."""
    for line in str(e).splitlines():
        if line.strip():
            return line.strip()
    return type(e).__name__


def _response(e: BaseException) -> Any:
    return getattr(e, "response", None)


def http_status(e: BaseException) -> int | None:
    """The HTTP status carried by ``e`` itself (``e.response.status_code``, ``e.status_code``,
    ``e.code`` of ``urllib.error.HTTPError``), ``None`` when it carries none."""
    resp = _response(e)
    for obj, attr in ((resp, "status_code"), (resp, "status"), (e, "status_code"), (e, "status")):
        v = getattr(obj, attr, None) if obj is not None else None
        if isinstance(v, int) and not isinstance(v, bool) and 100 <= v <= 599:
            return v
    code = getattr(e, "code", None)
    if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 and hasattr(e, "headers"):
        return code
    return None


def _headers(e: BaseException) -> Mapping[str, str] | None:
    resp = _response(e)
    h = getattr(resp, "headers", None) if resp is not None else None
    if h is None:
        h = getattr(e, "headers", None)
    return h if hasattr(h, "get") else None


def retry_after(e: BaseException, now: float | None = None) -> float | None:
    """Seconds the server asked to wait (``Retry-After``: delta-seconds or an HTTP date), found on
    ``e`` or along its cause chain; ``None`` when none was given or it cannot be read."""
    for x in _chain(e):
        h = _headers(x)
        if h is None:
            continue
        raw = h.get("Retry-After") or h.get("retry-after")
        if raw is None:
            continue
        raw = str(raw).strip()
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return None


def _chain(e: BaseException, depth: int = 8):
    seen = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen and len(seen) < depth:
        seen.add(id(x))
        yield x
        x = x.__cause__ or (None if x.__suppress_context__ else x.__context__)


def _transport_name(e: BaseException) -> str | None:
    """The matching transport-error class name of an HTTP client library, ``"never"`` for one
    that must not be retried, ``None`` for neither."""
    for cls in type(e).__mro__:
        root = (cls.__module__ or "").split(".")[0]
        if cls.__name__ in _NEVER_NAMES:
            return "never"
        if root in _CLIENT_MODULES and cls.__name__ in _TRANSIENT_NAMES:
            return cls.__name__
    return None


def transient_reason(e: BaseException) -> str | None:
    """A one-line reason when ``e`` is a transient failure worth retrying (see the module
    docstring), else ``None``."""
    for x in _chain(e):
        status = http_status(x)
        if status is not None:
            if status in TRANSIENT_STATUS or 500 <= status <= 599:
                return f"HTTP {status}"
            return None  # the server answered for good
        name = _transport_name(x)
        if name == "never":
            return None
        if name is not None:
            return f"{type(x).__name__}: {first_line(x)}"
        if isinstance(x, (ConnectionError, TimeoutError, socket.gaierror)) or (
                isinstance(x, OSError) and x.errno in _UNREACHABLE):
            return f"{type(x).__name__}: {first_line(x)}"
    return None


def call_with_retry(fn: Callable[[], T], *, policy: Backoff | None = None,
                    is_transient: Callable[[BaseException], str | None] = transient_reason,
                    on_retry: Callable[[RetryEvent], None] | None = None,
                    sleep: Callable[[float], Any] = time.sleep, rng: random.Random | None = None,
                    what: str = "") -> T:
    """Call ``fn()``; while it raises an exception that ``is_transient`` names (a one-line
    reason) and retries are left, wait and call it again. The last exception is re-raised
    unchanged (callers turn it into their own one-line error); exceptions that are not transient
    are re-raised at once.

    The wait before retry ``k`` is ``policy.delay(k, rng)``, raised to the server's
    ``Retry-After`` when that is longer; a ``Retry-After`` above ``policy.max`` is not waited for
    (re-raised). ``on_retry`` gets a :class:`RetryEvent` before each wait (default: a log line
    ``<what>: HTTP 503 (retry 1 of 4 in 1.00 s)`` on the ``audit.retry`` logger at WARNING).
    """
    policy = policy or Backoff()
    if rng is None and policy.jitter > 0:
        rng = random.Random(policy.seed)
    k = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below, re-raised unless transient
            reason = is_transient(e)
            if reason is None or k >= policy.retries:
                raise
            d = policy.delay(k, rng)
            ra = retry_after(e)
            if ra is not None:
                if ra > policy.max:
                    raise
                d = max(d, ra)
            event = RetryEvent(k + 1, policy.retries, d, reason, e, ra)
            if on_retry is None:
                log.warning(event.describe(what))
            else:
                on_retry(event)
            sleep(d)
            k += 1
