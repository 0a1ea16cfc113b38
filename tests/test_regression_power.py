"""Simulation of release-over-release detection (issue 15): revisions with no change are flagged
at most at rate alpha (within Monte-Carlo error), and planted changes are detected with power
growing with their size. The simulated revisions are benchmarks/regression_power.py's; the
full grid is that benchmark's report."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "regression_power.py"
_spec = importlib.util.spec_from_file_location("regression_power", _PATH)
rp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rp)

ALPHA = 0.05


@pytest.mark.parametrize("n_targets,permutations,seeds", [(6, 199, 300), (18, 199, 300)])
def test_false_positive_rate_at_most_alpha(n_targets, permutations, seeds):
    """Pairs of revisions with no planted change (every word's two vectors exchangeable,
    retraining noise on targets and attributes): the two-sided label-swap test of all words
    (compare_weat's default for vectors in one space) rejects at rate <= alpha up to 3
    Monte-Carlo standard errors."""
    cell = rp.run_cell(n_targets, 0.0, 0.5, range(seeds), alpha=ALPHA, permutations=permutations)
    se = math.sqrt(ALPHA * (1 - ALPHA) / seeds)
    assert cell["rate"] <= ALPHA + 3 * se
    assert abs(cell["mean_dd"]) < 0.05  # no systematic change in d


def test_target_only_swap_is_anticonservative_under_attribute_noise():
    """Why compare_weat swaps all words when it can: with noise on the attribute words too, a
    swap of the target scores alone treats the coherent shift it causes as a change."""
    from audit.compare import compare_weat

    rejected = sum(
        compare_weat(*rp.simulate_pair(s, 18, noise=0.5), swap="targets", n_bootstrap=0,
                     permutations=199, seed=s).p_value <= ALPHA
        for s in range(300)
    )
    words = rp.run_cell(18, 0.0, 0.5, range(300), alpha=ALPHA, permutations=199)["rate"]
    assert rejected / 300 > words


def test_power_grows_with_the_planted_change():
    small = rp.run_cell(18, 0.25, 0.5, range(100, 180), alpha=ALPHA, permutations=199)
    large = rp.run_cell(18, 1.5, 0.5, range(100, 180), alpha=ALPHA, permutations=199)
    assert 0 < small["mean_dd"] < large["mean_dd"]
    assert small["rate"] < large["rate"]
    assert large["rate"] >= 0.8
    assert rp.detectable_change([{"delta": 0.0, "rate": 0.05, "mean_dd": 0.0}, small, large]) is not None


def test_detectable_change_interpolates():
    cells = [{"delta": 0.0, "rate": 0.05, "mean_dd": 0.0}, {"delta": 1.0, "rate": 0.6, "mean_dd": 0.2},
             {"delta": 2.0, "rate": 1.0, "mean_dd": 0.4}]
    assert rp.detectable_change(cells) == pytest.approx(0.3)
    assert rp.detectable_change(cells[:2]) is None
