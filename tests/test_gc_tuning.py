"""The garbage collector's thresholds in biasaudit's own processes (actors/gc_tuning.py): set by
every entry point that starts one (the ``audit`` command, the model worker, the statistics
tasks), never lowered, never turned back on."""

from __future__ import annotations

import gc

import pytest

from actors.gc_tuning import GC_THRESHOLD, tune_gc

pytestmark = pytest.mark.unit


@pytest.fixture
def default_gc():
    """CPython's own thresholds for the test, the suite's restored afterwards."""
    before, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)
    (gc.enable if enabled else gc.disable)()


def test_the_suites_processes_collect_less_often():
    assert gc.get_threshold()[0] >= GC_THRESHOLD[0]  # tests/conftest.py


def test_tune_raises_the_default_and_keeps_a_higher_or_disabled_setting(default_gc):
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLD == (10_000, 10, 10)
    gc.set_threshold(50_000, 5, 5)
    tune_gc()
    assert gc.get_threshold() == (50_000, 5, 5)
    gc.set_threshold(0)  # automatic collection off
    tune_gc()
    assert gc.get_threshold()[0] == 0
    gc.set_threshold(700, 10, 10)
    gc.disable()
    tune_gc()
    assert gc.get_threshold()[0] == 700 and not gc.isenabled()


@pytest.mark.parametrize("entry", ["model worker", "statistics task", "audit command"])
def test_every_entry_point_of_a_process_tunes_it(default_gc, entry, capsys):
    if entry == "model worker":
        from actors.model_actor import ModelServer

        ModelServer()
    elif entry == "statistics task":
        from actors.stats import analyse_batch

        assert analyse_batch([], [], {}) == []
    else:
        from jobs.cli import main

        assert main(["metrics"]) == 0
    assert gc.get_threshold() == GC_THRESHOLD
