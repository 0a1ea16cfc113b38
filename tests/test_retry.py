"""The shared back-off helper (``audit.retry``): delays, Retry-After, what counts as transient."""

from __future__ import annotations

import email.utils
import random
import socket

import pytest

from audit.errors import ParameterError
from audit.retry import Backoff, call_with_retry, http_status, retry_after, transient_reason

pytestmark = pytest.mark.unit


class _Resp:
    def __init__(self, status: int, headers: dict | None = None):
        self.status_code = status
        self.headers = headers or {}


class _HTTPError(Exception):
    def __init__(self, status: int, headers: dict | None = None):
        super().__init__(f"HTTP error {status}\nsecond line")
        self.response = _Resp(status, headers)


def test_backoff_delays_exponential_capped_and_jitter_seeded():
    b = Backoff(initial=0.5, factor=2, max=3, retries=5)
    assert [b.delay(k) for k in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert b.attempts == 6
    j = Backoff(initial=1, factor=2, max=100, jitter=0.25, seed=7)
    rng = random.Random(7)
    expect = [min(100.0, 2.0 ** k * (1 + 0.25 * (2 * rng.random() - 1))) for k in range(4)]
    r2 = random.Random(7)
    assert [j.delay(k, r2) for k in range(4)] == pytest.approx(expect)
    assert all(0.75 * 2 ** k <= d <= 1.25 * 2 ** k for k, d in enumerate(expect))
    for bad in (dict(initial=-1), dict(factor=0.5), dict(retries=-1), dict(retries=1.5), dict(jitter=1.0),
                dict(max=float("nan"))):
        with pytest.raises(ParameterError, match="back-off"):
            Backoff(**bad)
    # audit.schema's words, as every other parameter
    for bad, line in ((dict(retries=-1), "back-off retries: must be >= 0, got -1"),
                      (dict(retries=1.5), "back-off retries: expected an integer, got 1.5"),
                      (dict(retries=True), "back-off retries: expected an integer, got True"),
                      (dict(factor=0.5), "back-off factor: must be >= 1"),
                      (dict(jitter=1.0), "back-off jitter: must be < 1"),
                      (dict(initial=True), "back-off initial: ")):
        with pytest.raises(ParameterError) as e:
            Backoff(**bad)
        assert str(e.value).startswith(line), str(e.value)
    # finite, as the watch spec's backoff section declares (jobs.watch.spec.BackoffFields): an
    # infinite initial wait would never end; the variables name themselves
    with pytest.raises(ParameterError) as e:
        Backoff.from_env(environ={"BIASAUDIT_HUB_RETRY_MAX": "inf"})
    assert str(e.value) == ("back-off max: expected a finite number, got inf "
                            "(environment variables BIASAUDIT_HUB_RETRIES/RETRY_DELAY/RETRY_MAX)")


def test_from_env_names_the_variable():
    b = Backoff.from_env(environ={"BIASAUDIT_HUB_RETRIES": "2", "BIASAUDIT_HUB_RETRY_DELAY": "0.1",
                                  "BIASAUDIT_HUB_RETRY_MAX": "5"})
    assert (b.retries, b.initial, b.max) == (2, 0.1, 5.0)
    assert Backoff.from_env(environ={}) == Backoff()
    assert Backoff.from_env(environ={}, retries=1).retries == 1
    with pytest.raises(ParameterError, match="BIASAUDIT_HUB_RETRIES: 'two' is not an integer"):
        Backoff.from_env(environ={"BIASAUDIT_HUB_RETRIES": "two"})
    with pytest.raises(ParameterError, match="BIASAUDIT_HUB_RETRIES/RETRY_DELAY/RETRY_MAX"):
        Backoff.from_env(environ={"BIASAUDIT_HUB_RETRY_DELAY": "-3"})


def test_transient_classification():
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

    req = httpx2.Request("GET", "http://127.0.0.1/x")

    def hub_error(cls, status):
        return cls(f"{status} Client Error.\n\nmore", response=httpx2.Response(status, request=req))

    assert transient_reason(hub_error(HfHubHTTPError, 503)) == "HTTP 503"
    assert transient_reason(hub_error(HfHubHTTPError, 429)) == "HTTP 429"
    assert transient_reason(hub_error(HfHubHTTPError, 408)) == "HTTP 408"
    for status in (400, 401, 403, 404, 409):
        assert transient_reason(hub_error(HfHubHTTPError, status)) is None
    assert transient_reason(hub_error(RepositoryNotFoundError, 401)) is None
    assert transient_reason(httpx2.ConnectError("refused", request=req)) == "ConnectError: refused"
    assert transient_reason(httpx2.ReadTimeout("slow", request=req)) == "ReadTimeout: slow"
    assert transient_reason(httpx2.RemoteProtocolError("gone", request=req)) == "RemoteProtocolError: gone"
    assert transient_reason(httpx2.ProxyError("bad proxy", request=req)) is None
    assert transient_reason(OfflineModeIsEnabled("offline")) is None
    assert transient_reason(ConnectionResetError("reset")) == "ConnectionResetError: reset"
    assert transient_reason(TimeoutError()) == "TimeoutError: TimeoutError"
    assert transient_reason(socket.gaierror("dns")) == "gaierror: dns"
    import errno

    assert transient_reason(OSError(errno.ENETUNREACH, "Network is unreachable")) == (
        "OSError: [Errno 101] Network is unreachable")
    for other in (ValueError("x"), FileNotFoundError("f"), KeyError("k"), RuntimeError("r"),
                  PermissionError(errno.EACCES, "denied"), OSError(errno.ENOSPC, "full")):
        assert transient_reason(other) is None
    # a library's wrapper without a status of its own: classified by its cause
    try:
        try:
            raise hub_error(HfHubHTTPError, 502)
        except HfHubHTTPError as inner:
            raise OSError("There was a specific connection error") from inner
    except OSError as wrapped:
        assert transient_reason(wrapped) == "HTTP 502"
    try:
        try:
            raise hub_error(HfHubHTTPError, 404)
        except HfHubHTTPError as inner:
            raise OSError("no such file") from inner
    except OSError as wrapped:
        assert transient_reason(wrapped) is None
    # urllib's HTTPError carries .code and .headers
    import urllib.error

    e = urllib.error.HTTPError("http://x", 503, "busy", {"Retry-After": "4"}, None)
    assert http_status(e) == 503 and transient_reason(e) == "HTTP 503" and retry_after(e) == 4.0


def test_retry_after_seconds_and_http_date():
    assert retry_after(_HTTPError(429, {"Retry-After": "3"})) == 3.0
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert retry_after(_HTTPError(503, {"Retry-After": date}), now=now) == pytest.approx(12.0)
    assert retry_after(_HTTPError(503, {"Retry-After": "soon"})) is None
    assert retry_after(_HTTPError(503)) is None
    assert retry_after(ValueError()) is None


def test_call_with_retry_waits_retries_and_reraises():
    sleeps: list[float] = []
    events = []
    answers = [_HTTPError(503), _HTTPError(503), "ok"]

    def fn():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    pol = Backoff(initial=0.5, factor=2, max=10, retries=4)
    assert call_with_retry(fn, policy=pol, sleep=sleeps.append, on_retry=events.append) == "ok"
    assert sleeps == [0.5, 1.0]
    assert [e.describe("model 'x': hub") for e in events] == ["model 'x': hub: HTTP 503 (retry 1 of 4 in 0.50 s)",
                                                              "model 'x': hub: HTTP 503 (retry 2 of 4 in 1.00 s)"]

    # Retry-After raises the wait; beyond `max` it is not waited for
    sleeps.clear()
    answers[:] = [_HTTPError(429, {"Retry-After": "3"}), "ok"]
    assert call_with_retry(fn, policy=pol, sleep=sleeps.append, on_retry=lambda e: None) == "ok"
    assert sleeps == [3.0]
    sleeps.clear()
    answers[:] = [_HTTPError(429, {"Retry-After": "3600"}), "ok"]
    with pytest.raises(_HTTPError):
        call_with_retry(fn, policy=pol, sleep=sleeps.append, on_retry=lambda e: None)
    assert sleeps == []

    # exhausted: the last error, unchanged, after `retries` waits
    calls = []

    def down():
        calls.append(1)
        raise _HTTPError(502)

    with pytest.raises(_HTTPError) as e:
        call_with_retry(down, policy=Backoff(initial=0, retries=2), sleep=sleeps.append, on_retry=lambda e: None)
    assert len(calls) == 3 and e.value.response.status_code == 502

    # permanent errors: no retry at all
    calls.clear()

    def missing():
        calls.append(1)
        raise _HTTPError(404)

    with pytest.raises(_HTTPError):
        call_with_retry(missing, policy=pol, sleep=sleeps.append)
    assert len(calls) == 1

    # a custom classifier (the watcher's own "unavailable" errors, a locked store ...)
    class Locked(Exception):
        pass

    seq = [Locked("database is locked"), 5]

    def store():
        x = seq.pop(0)
        if isinstance(x, Exception):
            raise x
        return x

    assert call_with_retry(store, policy=pol, sleep=sleeps.append, on_retry=lambda e: None,
                           is_transient=lambda e: str(e) if isinstance(e, Locked) else None) == 5


def test_default_on_retry_logs_one_line(caplog):
    answers = [ConnectionResetError("peer reset"), 1]

    def fn():
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    with caplog.at_level("WARNING", logger="audit.retry"):
        call_with_retry(fn, policy=Backoff(initial=0.25), sleep=lambda s: None, what="hub listing")
    assert caplog.messages == ["hub listing: ConnectionResetError: peer reset (retry 1 of 4 in 0.25 s)"]
