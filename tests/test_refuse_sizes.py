"""Statistics sizes are settled before work: a permutation count at or above the number of
distinct partitions runs the exact test at once (and says so); a bootstrap that cannot fit in
memory is refused with one line naming the parameter and the size, before any model loads."""

from __future__ import annotations

import json
import time

import pytest

from audit import runner, stats
from audit.errors import ParameterError
from cli_inputs import run_cli, write_vectors

TEST = """name: tiny
language: en
provenance: made up
licence: CC0
targets:
- {name: flowers, words: [rose, tulip, daisy, lily, iris, aster, poppy, lotus]}
- {name: insects, words: [ant, wasp, flea, moth, gnat, tick, bee, fly]}
attributes:
- {name: pleasant, words: [love, peace, joy]}
- {name: unpleasant, words: [hate, war, pain]}
"""
WORDS = ("rose tulip daisy lily iris aster poppy lotus ant wasp flea moth gnat tick bee fly "
         "love peace joy hate war pain").split()


_run = run_cli


@pytest.fixture
def files(tmp_path, monkeypatch):
    write_vectors(tmp_path / "ok.vec", WORDS)
    (tmp_path / "t.yaml").write_text(TEST)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.unit
def test_permutations_1e14_on_8_plus_8_is_the_exact_test_at_once(files):
    t0 = time.perf_counter()
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "t.yaml", "--metric", "weat",
                           "--permutations", "1e14", "--n-bootstrap", "0", "--format", "json"])
    assert code == 0, err
    assert time.perf_counter() - t0 < 60
    f = json.loads(out)
    assert f["p_method"] == "exact" and f["n_partitions"] == 12_870
    assert f["p_note"] == ("permutations=100,000,000,000,000 >= the 12,870 distinct partitions of 8+8 items: "
                           "exact test run instead")
    assert f["p_min"] == 1 / 12_870 and f["p_value"] >= f["p_min"]


@pytest.mark.unit
@pytest.mark.parametrize("value", ["1e11", "100000000000"])
def test_bootstrap_that_cannot_fit_is_refused_before_the_model_loads(files, monkeypatch, value):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner, "load_model", no_load)
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "t.yaml", "--metric", "weat",
                           "--param", f"n_bootstrap={value}"])
    mem = stats._fmt_bytes(stats.physical_memory())
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"audit: error: n_bootstrap=100,000,000,000: 100,000,000,000 resamples of 16 items need at least "
        f"11.6 TiB of memory, more than this machine's {mem}; use at most "
        f"{stats.physical_memory() // (8 * 16):,}"]


@pytest.mark.unit
def test_check_resample_memory_bounds():
    stats.check_resample_memory("n_bootstrap", 1000, 50, memory=8 * 1000 * 50)  # fits exactly
    with pytest.raises(ParameterError, match=r"^n_bootstrap=1,001: 1,001 resamples of 50 items need at least "
                                             r"391\.0 KiB of memory, more than this machine's 390\.6 KiB; "
                                             r"use at most 1,000$"):
        stats.check_resample_memory("n_bootstrap", 1001, 50, memory=8 * 1000 * 50)
    for ignored in ("many", None, True, 2.5, -3):  # left to the metric's own validation
        stats.check_resample_memory("n_bootstrap", ignored, 50, memory=1)
