"""Suite-wide guard: the variables the service reads (``MLFLOW_TRACKING_URI`` has precedence over a
spec's default store, ``BIASAUDIT_*`` move data and outputs) are restored after every test, so a
test that sets one (directly or through a library: ``mlflow.set_tracking_uri`` writes
``MLFLOW_TRACKING_URI``) cannot change what a later test reads."""

from __future__ import annotations

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
