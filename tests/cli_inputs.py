"""Shared inputs of the command-line tests (tests/test_bad_input.py, test_fuzz_cli.py,
test_degenerate_sets.py, test_refuse_sizes.py, test_reader_rules.py): one small WEAT test, its
words, a one-model sweep spec, and ``run_cli``, the in-process ``audit`` call."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np

from jobs import cli

ROOT = Path(__file__).resolve().parent.parent

#: The small test's sets (flowers/insects x pleasant/unpleasant).
WORDS = {"X": ["rose", "tulip", "daisy", "lily"], "Y": ["ant", "wasp", "flea", "moth"],
         "A": ["love", "peace", "joy"], "B": ["hate", "war", "pain"]}
ALL = [w for ws in WORDS.values() for w in ws]

TEST = """name: small
language: en
provenance: made up
licence: CC0
targets:
- {name: flowers, words: [rose, tulip, daisy, lily]}
- {name: insects, words: [ant, wasp, flea, moth]}
attributes:
- {name: pleasant, words: [love, peace, joy]}
- {name: unpleasant, words: [hate, war, pain]}
"""

SPEC = """name: s
output_dir: out
languages: [en]
tests: [weat1]
metrics: [weat]
models:
  - ref: ok.vec
"""


def run_cli(argv) -> tuple[int | str | None, str, str]:
    """``(exit status, stdout, stderr)`` of ``audit ARGV`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def write_vectors(path, words, *, seed: int = 0, dim: int = 5) -> None:
    """A word2vec-text file (no header) of seeded standard-normal vectors for ``words``."""
    rng = np.random.default_rng(seed)
    lines = [w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=dim)) for w in words]
    Path(path).write_text("\n".join(lines) + "\n")


def subprocess_env(**set_vars: str) -> dict[str, str]:
    """The environment of an ``audit``/``python -m jobs.cli`` subprocess: this checkout first on
    ``PYTHONPATH``, no inherited MLflow store (and, as for every process of the suite, no Ray token:
    ``conftest.pytest_configure``);
    ``set_vars`` on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(set_vars)
    return env
