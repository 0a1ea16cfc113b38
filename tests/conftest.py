"""Suite-wide guard: the variables the service reads (``MLFLOW_TRACKING_URI`` has precedence over a
spec's default store, ``BIASAUDIT_*`` move data and outputs) are restored after every test, so a
test that sets one (directly or through a library: ``mlflow.set_tracking_uri`` writes
``MLFLOW_TRACKING_URI``) cannot change what a later test reads."""

from __future__ import annotations

import contextlib
import os

import pytest

_GUARDED_PREFIXES = ("BIASAUDIT_", "MLFLOW_TRACKING_URI")


@pytest.fixture(autouse=True)
def _restore_service_environment():
    before = {k: v for k, v in os.environ.items() if k.startswith(_GUARDED_PREFIXES)}
    yield
    for k in [k for k in os.environ if k.startswith(_GUARDED_PREFIXES)]:
        if k not in before:
            del os.environ[k]
    os.environ.update(before)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one torch thread, and on a shared CPU two threads spin-wait.
    Modules that score tiny models use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@contextlib.contextmanager
def _loopback_ray(module):
    """A private 2-CPU Ray head for one test module (``address="local"``: never another Ray on the
    machine), auth disabled only because it is loopback; the module's own classes (test server
    subclasses) travel to the workers by value; the environment it set is restored after."""
    ray = pytest.importorskip("ray")
    names = ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    old = {k: os.environ.get(k) for k in names}
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", num_cpus=2, object_store_memory=200_000_000, include_dashboard=False,
             log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(module)
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def local_ray(request):
    """One loopback Ray head shared by the tests of a module."""
    with _loopback_ray(request.module) as ray:
        yield ray


@pytest.fixture
def fresh_ray(request):
    """A loopback Ray head of the test's own (tests that kill workers or fill the store)."""
    with _loopback_ray(request.module) as ray:
        yield ray


@pytest.fixture(scope="session")
def pg_mlflow():
    """An MLflow tracking server backed by a real PostgreSQL database, on loopback, for the whole
    session (:class:`pg_server.PostgresMlflow`: ``initdb`` in a temporary directory, ``postgres``
    and ``mlflow server`` on free ports, both stopped by PID at the end). Yields ``{"uri": ...,
    "db_uri": ..., "seconds": {...}}``; each test uses its own experiment names."""
    from pg_server import PostgresMlflow

    srv = PostgresMlflow()
    try:
        srv.start()
        yield {"uri": srv.uri, "db_uri": srv.db_uri, "seconds": dict(srv.seconds)}
    finally:
        srv.stop()
