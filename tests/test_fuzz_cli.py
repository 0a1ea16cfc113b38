"""The command-line fuzz test: every command against a table of bad-input classes.

Each case runs one command of the installed ``audit`` (:func:`jobs.cli.main`, in this process)
with one bad input: a file that is missing, empty, binary, in the wrong encoding, truncated, or
malformed YAML/CSV/TSV; a number that is NaN, infinite, negative, huge or not a number; an
unknown name; a path that is a directory, under a file, or not writable; a bad ``--param``
JSON value. It asserts the status docs/failures.md documents (2 for bad input), exactly one
line on standard error and no ``Traceback`` anywhere. A few cases run in a subprocess: Ctrl-C
and SIGTERM in ``audit score`` and ``audit compare`` (one line, 130 / 143), and the installed
entry point end to end.

The bad-input *messages* (the whole line) are pinned by tests/test_bad_input.py; here the
classes are crossed with every command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jobs import cli

REPO = Path(__file__).resolve().parents[1]
from cli_inputs import SPEC, TEST, WORDS, run_cli  # noqa: E402

WATCH = """name: w
output_dir: wout
audit: {spec: SPEC_PATH}
watch:
  - local: models
"""
CROWS_HEAD = "sent_more,sent_less,stereo_antistereo,bias_type\n"

#: The bad contents every file-taking argument is tried with (name -> bytes, or None: no file, or "dir").
FILE_CLASSES: dict[str, bytes | str | None] = {
    "missing": None,
    "empty": b"",
    "blank": b"\n\n   \n",
    "binary": bytes(range(256)) * 8,
    "nul": b"name: s\x00\x00\x00\n",
    "latin1": "name: café\nlanguage: en\ntargets: [x]\n".encode("latin-1"),
    "utf16": "name: s\nmodels: [a]\n".encode("utf-16"),
    "truncated": SPEC.encode()[: len(SPEC) // 2 + 3] + b"{ref: ok",
    "malformed_yaml": b"name: [s\nmodels: : :\n  - {ref: ok.vec\n",
    "directory": "dir",
    "list_not_mapping": b"- a\n- b\n",
    "huge_number": b"name: s\noutput_dir: out\ntests: [weat1]\nmetrics: [{name: weat, params: {n_bootstrap: 1e400}}]\n"
                   b"models: [{ref: ok.vec}]\n",
}


def _vec(words, rng, dim=5) -> str:
    return "".join(w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=dim)) + "\n" for w in words)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(0)
    words = sorted({w for ws in WORDS.values() for w in ws})
    from audit.runner import load_test

    t = load_test("weat1")
    words += sorted({w for s in (*t.targets, *t.attributes) for w in s.words} - set(words))
    (d / "ok.vec").write_text(_vec(words, rng), encoding="utf-8")
    (d / "ok2.vec").write_text(_vec(words, rng), encoding="utf-8")
    (d / "small.yaml").write_text(TEST, encoding="utf-8")
    (d / "spec.yaml").write_text(SPEC, encoding="utf-8")
    (d / "watch.yaml").write_text(WATCH.replace("SPEC_PATH", str(d / "spec.yaml")), encoding="utf-8")
    (d / "models").mkdir()
    (d / "afile").write_text("a file\n", encoding="utf-8")
    (d / "adir").mkdir()
    for cls, content in FILE_CLASSES.items():
        for ext in (".yaml", ".vec", ".csv", ".tsv"):
            p = d / f"{cls}{ext}"
            if content == "dir":
                p.mkdir()
            elif content is not None:
                p.write_bytes(content)
    (d / "bad_cols.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    (d / "ragged.csv").write_text(CROWS_HEAD + 'x y,"unterminated\n', encoding="utf-8")
    (d / "ragged.tsv").write_text("sent_more\tsent_less\n\t\t\t\n", encoding="utf-8")
    (d / "nan.vec").write_text("rose nan 1 2 3 4\n" + _vec(words[1:], rng), encoding="utf-8")
    return d


S = ["score", "--model", "ok.vec", "--test", "small.yaml", "--metric", "weat", "--permutations", "50",
     "--n-bootstrap", "0"]
C = ["compare", "ok.vec", "ok2.vec", "--test", "small.yaml", "--metric", "weat", "--permutations", "50",
     "--n-bootstrap", "0"]


#: Text that reads as word vectors holding none of the test's words: ``audit compare`` compares what it
#: can and exits 3 ("a (test, metric) could not be compared", docs/failures.md); ``audit score`` refuses (2).
COMPARE_STATUS = {"nul": 3, "latin1": 3, "truncated": 3, "malformed_yaml": 3, "list_not_mapping": 3, "huge_number": 3}


def _file_cases() -> list[tuple[str, list[str], int]]:
    out = []
    for cls in FILE_CLASSES:
        out += [
            (f"score-test-{cls}", ["score", "--model", "ok.vec", "--test", f"{cls}.yaml", "--metric", "weat"], 2),
            (f"score-model-{cls}", ["score", "--model", f"{cls}.vec", "--test", "small.yaml", "--metric", "weat"], 2),
            (f"score-crows-{cls}", ["score", "--model", "ok.vec", "--test", f"{cls}.csv", "--metric", "crows_pairs"],
             2),
            (f"compare-model-{cls}", ["compare", f"{cls}.vec", "ok.vec", "--test", "small.yaml"],
             COMPARE_STATUS.get(cls, 2)),
            (f"table-test-{cls}", ["table", "--model", "ok.vec", "--test", f"{cls}.yaml"], 2),
            (f"run-spec-{cls}", ["run", f"{cls}.yaml", "--dry-run"], 2),
            (f"sync-spec-{cls}", ["sync", f"{cls}.yaml"], 2),
            (f"watch-spec-{cls}", ["watch", f"{cls}.yaml", "--once", "--dry-run"], 2),
        ]
    return out


NUMBERS = ["nan", "inf", "-inf", "-1", "1e400", "abc", ""]
CASES: list[tuple[str, list[str], int]] = [
    *_file_cases(),
    # numbers
    *[(f"score-permutations-{v or 'blank'}", [*S[:7], "--permutations", v], 2) for v in NUMBERS],
    *[(f"score-n-bootstrap-{v or 'blank'}", [*S, "--n-bootstrap", v], 2) for v in ("nan", "-1", "abc", "1.5")],
    *[(f"score-max-missing-{v}", [*S, "--max-missing", v], 2) for v in ("nan", "inf", "-0.1", "2", "x")],
    *[(f"score-seed-{v}", [*S, "--seed", v], 2) for v in ("x", "1.5", "nan")],
    *[(f"score-limit-{v}", [*S[:5], "--test", "crows_pairs", "--metric", "crows_pairs", "--limit", v], 2)
      for v in ("0", "-3", "x")],
    *[(f"score-batch-size-{v}", [*S, "--batch-size", v], 2) for v in ("0", "x")],
    ("score-layer-x", [*S, "--layer", "x"], 2),
    *[(f"compare-confidence-{v}", [*C, "--confidence", v], 2) for v in ("nan", "2", "0", "x")],
    *[(f"compare-alpha-{v}", [*C, "--alpha", v], 2) for v in ("nan", "-1", "2")],
    *[(f"compare-min-increase-{v}", [*C, "--min-increase", v], 2) for v in ("nan", "inf", "-1")],
    ("compare-n-bootstrap-neg", [*C[:9], "--n-bootstrap", "-5"], 2),
    *[(f"watch-interval-{v}", ["watch", "watch.yaml", "--once", "--dry-run", "--interval", v], 2)
      for v in ("0", "-1", "nan", "x")],
    ("watch-max-polls-0", ["watch", "watch.yaml", "--max-polls", "0", "--dry-run"], 2),
    ("run-progress-interval-0", ["run", "spec.yaml", "--dry-run", "--progress-interval", "0"], 2),
    # parameters (JSON values of --param, and the registry's types)
    *[(f"score-param-{i}", [*S, "--param", p], 2) for i, p in enumerate((
        "n_bootstrap", "n_bootstrap=nan", "n_bootstrap=-3", "n_bootstrap=1.5", "confidence=2", "confidence=\"x\"",
        "confidence=[1]", "nosuch=1", "ddof=true", "casefold=3", "permutations=0", "max_missing=7"))],
    ("score-honest-limit", ["score", "--model", "ok.vec", "--test", "en/honest", "--metric", "honest",
                            "--limit", "40"], 2),
    ("compare-param-unknown", [*C, "--param", "nosuch=1"], 2),
    ("compare-param-nan", [*C, "--param", "confidence=NaN"], 2),
    # unknown names
    ("score-unknown-metric", [*S[:5], "--metric", "wat"], 2),
    ("score-unknown-test", [*S[:3], "--test", "no_such_test", "--metric", "weat"], 2),
    ("score-unknown-language", [*S[:3], "--test", "crows_pairs", "--metric", "crows_pairs", "--language", "xx"], 2),
    ("score-unknown-backend", [*S, "--backend", "nope"], 2),
    ("score-unknown-embedding", [*S, "--embedding", "nope"], 2),
    ("score-unknown-model", ["score", "--model", "no-such-model", "--test", "weat1", "--metric", "weat"], 2),
    ("compare-unknown-metric", [*C[:5], "--metric", "wat"], 2),
    ("table-unknown-metric", ["table", "--model", "ok.vec", "--test", "small.yaml", "--metric", "wat"], 2),
    ("datasets-format", ["datasets", "--format", "xml"], 2),
    ("datasets-language", ["datasets", "--language", "zz"], 2),
    ("metrics-format", ["metrics", "--format", "xml"], 2),
    ("unknown-command", ["frobnicate"], 2),
    ("unknown-option", [*S, "--frobnicate"], 2),
    ("no-command", [], 2),
    ("watch-no-spec", ["watch"], 2),
    ("watch-unknown-option", ["watch", "watch.yaml", "--frobnicate"], 2),
    ("run-unknown-option", ["run", "spec.yaml", "--frobnicate"], 2),
    ("run-bad-tracking-uri", ["run", "spec.yaml", "--dry-run", "--tracking-uri", "file:///x"], 2),
    ("compare-run-without-uri", ["compare", "run:abc", "run:def"], 2),
    # paths
    ("score-items-directory", [*S, "--items", "adir"], 2),
    ("score-items-under-file", [*S, "--items", "afile/x.csv"], 2),
    ("score-items-suffix", [*S, "--items", "x.txt"], 2),
    ("score-items-proc", [*S, "--items", "/proc/no/such/x.csv"], 2),
    ("run-output-under-file", ["run", "spec.yaml", "--output-dir", "afile/out"], 2),
    ("run-output-is-file", ["run", "spec.yaml", "--output-dir", "afile"], 2),
    ("run-output-proc", ["run", "spec.yaml", "--output-dir", "/proc/no/such"], 2),
    ("run-dry-output-under-file", ["run", "spec.yaml", "--dry-run", "--output-dir", "afile/out"], 2),
    ("watch-output-under-file", ["watch", "watch.yaml", "--once", "--dry-run", "--output-dir", "afile/w"], 2),
    ("sync-output-under-file", ["sync", "spec.yaml", "--output-dir", "afile/out"], 2),
    ("score-model-nan-vectors", ["score", "--model", "nan.vec", "--test", "small.yaml", "--metric", "weat"], 2),
    ("score-crows-bad-columns", ["score", "--model", "ok.vec", "--test", "bad_cols.csv", "--metric", "crows_pairs"], 2),
    ("score-crows-ragged-csv", ["score", "--model", "ok.vec", "--test", "ragged.csv", "--metric", "crows_pairs"], 2),
    ("score-crows-ragged-tsv", ["score", "--model", "ok.vec", "--test", "ragged.tsv", "--metric", "crows_pairs"], 2),
]




@pytest.mark.unit
def test_the_table_is_large_and_covers_every_command():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 100
    commands = {c[1][0] for c in CASES if c[1]}
    assert commands >= {"score", "compare", "table", "run", "sync", "watch", "datasets", "metrics"}


@pytest.mark.unit
@pytest.mark.parametrize("case_id,argv,status", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_documented_status_no_traceback(work, monkeypatch, case_id, argv, status):
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code, out, err = run_cli(list(argv))
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert code == status, (code, out[-500:], err[-2000:])
    if status == 3:  # compared what it could: the table says what it could not
        assert "could not be compared" in out or "not compared" in out or "misses" in out, out
        return
    assert len(lines) == 1, err
    assert ": error: " in lines[0]


# --------------------------------------------------------------------------------------
# subprocesses: signals and the installed entry point
# --------------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


@pytest.mark.e2e
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", ["score", "compare"])
def test_a_signal_ends_score_and_compare_with_one_line(work, tmp_path, command, sig, status):
    """The model is a named pipe: the command blocks reading it (inside the command, after the
    imports), the signal arrives there."""
    fifo = tmp_path / "model.vec"
    os.mkfifo(fifo)
    argv = (["score", "--model", str(fifo), "--test", "weat1", "--metric", "weat"] if command == "score" else
            ["compare", str(fifo), str(work / "ok.vec"), "--test", "weat1", "--metric", "weat"])
    p = subprocess.Popen([sys.executable, "-m", "jobs.cli", *argv], cwd=work, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    fd = None
    try:
        deadline = time.monotonic() + 120
        while fd is None:  # opening the writer end succeeds once the command has opened the pipe to read
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.1)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if fd is not None:
            os.close(fd)
        if p.poll() is None:
            p.kill()
    assert p.returncode == status, err
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1, err
    assert err.strip().startswith(f"audit: {'interrupted (SIGINT)' if status == 130 else 'terminated (SIGTERM)'}")


@pytest.mark.e2e
def test_entry_point_end_to_end(work):
    """The installed command as a user runs it: a good score (0) and a bad one (2, one line)."""
    audit = REPO / ".venv" / "bin" / "audit"
    exe = [str(audit)] if audit.exists() else [sys.executable, "-m", "jobs.cli"]
    ok = subprocess.run([*exe, *S], cwd=work, env=_env(), capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "weat on small" in ok.stdout, ok.stderr
    bad = subprocess.run([*exe, *S, "--param", "n_bootstrap=nan"], cwd=work, env=_env(), capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "Traceback" not in bad.stderr


@pytest.mark.unit
def test_table_exit_1_when_a_test_fails(work, monkeypatch):
    """``audit table``: a test the model cannot score is a row saying why, and status 1."""
    monkeypatch.chdir(work)
    (work / "unknown_words.yaml").write_text(TEST.replace("name: small", "name: unknown")
                                             .replace("rose, tulip, daisy, lily", "qqa, qqb, qqc, qqd"),
                                             encoding="utf-8")
    code, out, err = run_cli(["table", "--model", "ok.vec", "--test", "small.yaml", "unknown_words.yaml",
                              "--permutations", "50"])
    assert code == 1 and "Traceback" not in out + err, err
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[2].startswith("| en/small | en | ") and " | failed | " in rows[3] and "unknown" in rows[3]


@pytest.mark.unit
def test_every_option_of_every_command_has_help_text():
    import argparse

    from jobs import sweep, wal
    from jobs.watch import cli as watch_cli

    missing = []

    def walk(p: argparse.ArgumentParser, name: str) -> None:
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                for sub, sp in act.choices.items():
                    walk(sp, f"{name} {sub}")
            elif not act.help and act.dest != "help":
                missing.append(f"{name} {'/'.join(act.option_strings) or act.dest}")

    for p, name in ((cli.build_parser(), "audit"), (sweep.build_parser(), "audit run"),
                    (wal.build_parser(), "audit sync"), (watch_cli.build_parser(), "audit watch")):
        walk(p, name)
    assert missing == []


@pytest.mark.unit
def test_compare_of_runs_and_watch_turn_mlflow_download_bars_off(work, monkeypatch):
    """MLflow's "Downloading artifacts" bars would clutter the comparison table and the decision log."""
    monkeypatch.chdir(work)
    for argv in (["compare", "run:a", "run:b"], ["watch", "missing.yaml", "--once"]):
        monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
        assert run_cli(argv)[0] == 2
        from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR

        assert MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.get() is False
