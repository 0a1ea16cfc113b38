"""The eight-language smoke sweep (jobs/specs/smoke-languages.yaml): one tiny fastText model per
language trained on the text built from that language's shipped word lists, audited with WEAT and
SAME on every shipped test of its language, finishes with no failed task."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from audit.catalog import list_tests  # noqa: E402
from audit.datasets import SUPPORTED_LANGUAGES  # noqa: E402
from jobs.spec import load_spec  # noqa: E402
from jobs.sweep import run_sweep  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "smoke-languages.yaml"


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", num_cpus=2, object_store_memory=200_000_000, include_dashboard=False,
             log_to_driver=False)
    yield
    ray.shutdown()


def test_every_language_every_test_finishes(tmp_path, local_ray):
    spec = load_spec(SPEC, output_dir=str(tmp_path / "out"))
    out = run_sweep(spec, progress=False)
    tests = list_tests()
    expected = int(tests.metrics.str.contains("weat").sum()) * 2  # weat and same on every shipped word test
    assert out.exit_code == 0
    assert out.planned == expected and out.ran == expected and out.failed == 0
    assert out.loads == 8
    df = out.results
    assert set(df["language"]) == set(SUPPORTED_LANGUAGES) == {"en", "de", "nl", "it", "nb", "is", "tr", "fr"}
    assert (df["status"] == "finished").all()
    # the per-language text covers every test word: full coverage everywhere
    assert df["coverage_min"].notna().all()
    assert (df["coverage_min"] == 1.0).all()
