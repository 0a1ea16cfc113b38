"""The sweep as its users meet it: a model listed twice, output inside a Ray job, progress
lines in job logs, the parent run's metrics across invocations (issue 12, items 7, 8, 9).

The models are small ``.vec`` files written here (random vectors for the words of the tests),
so a sweep takes seconds on a 2-CPU local Ray.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from actors.model_actor import ModelServer
from audit.runner import load_test
from jobs import sweep
from jobs.spec import load_spec

TESTS = ["weat1", "weat2"]


def write_vec(path: Path, seed: int, tests=TESTS, dim: int = 8) -> Path:
    """A word2vec text file with random vectors for every word of ``tests``."""
    words = sorted({w for t in tests for s in (*load_test(t).targets, *load_test(t).attributes)
                    for w in s.words})
    rng = np.random.default_rng(seed)
    lines = [f"{len(words)} {dim}"] + [w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=dim)) for w in words]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_spec(tmp_path: Path, name: str, models: str, *, tests=TESTS, out: Path | None = None,
               ray: str = "num_cpus: 2, actor_num_cpus: 0.5, stats_num_cpus: 1, batch_size: 1") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(f"""
name: {name}
seed: 0
output_dir: {out or tmp_path / 'out'}
permutations: 200
n_bootstrap: 20
languages: [en]
tests: [{", ".join(tests)}]
metrics: [weat]
models:
{models}
ray: {{{ray}}}
""", encoding="utf-8")
    return p


# --------------------------------------------------------------------------------------
# A model listed twice
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_a_model_listed_twice_is_refused_with_one_line(tmp_path, capsys):
    """Two entries for the same model (same reference, revision and options) would be loaded and
    run twice, and their results reported under the first name (the keys are the same): the spec
    is refused, naming both entries. Before any model is loaded, also in a dry run."""
    vec = write_vec(tmp_path / "m.vec", 0)
    same = write_spec(tmp_path, "dup", f'  - {{name: a, ref: "{vec}"}}\n  - {{name: b, ref: "{vec}"}}')
    assert sweep.main([str(same), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"audit: error: {same}: models[1]: model 'b' is the same model as models[0] ('a'): {vec}, same "
                   "options; its tasks would be 'a''s tasks, loaded and run twice; list it once (or give it different params)"]
    # a load option that does not change what is measured: the same tasks (same keys) once the
    # revisions are known; refused before Ray starts or anything is loaded
    keyed = write_spec(tmp_path, "dup2", f'  - {{name: a, ref: "{vec}"}}\n  - {{name: b, ref: "{vec}", subword: true}}')
    assert sweep.main([str(keyed), "--no-progress"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"audit: error: {keyed}: models[1]: model 'b' is the same model as models[0] ('a'): {vec} "
                           "at revision sha256:")
    assert not (tmp_path / "out" / "loads.jsonl").exists()
    # different parameters are different tasks: allowed
    params = write_spec(tmp_path, "dup3", f'  - {{name: a, ref: "{vec}"}}\n  - {{name: b, ref: "{vec}", params: {{casefold: true}}}}')
    assert sweep.main([str(params), "--dry-run"]) == 0


# --------------------------------------------------------------------------------------
# Output inside a Ray job
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_job_output_dir_is_anchored_outside_the_jobs_temporary_copy(tmp_path, monkeypatch):
    copy = tmp_path / "session" / "runtime_resources" / "working_dir_files" / "_ray_pkg_abc"
    copy.mkdir(parents=True)
    home = tmp_path / "home"
    monkeypatch.setenv("BIASAUDIT_HOME", str(home))
    spec = load_spec(write_spec(tmp_path, "inside", '  - {name: a, ref: "m.vec"}', out=Path("out/inside")))
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"}, "metadata": {"job_submission_id": "raysubmit_1"}}
    moved, note = sweep.job_output_dir(spec, job=job, cwd=copy)
    assert moved.output_dir == home / "out" / "inside"
    assert moved.resolved_tracking_uri == f"sqlite:///{home / 'out' / 'inside' / 'mlflow.db'}"
    assert note.startswith(f"inside a Ray job: output directory out/inside -> {home / 'out' / 'inside'}")
    # outside a job, or an absolute path elsewhere: unchanged
    assert sweep.job_output_dir(spec, job=None, cwd=copy)[0] is spec
    elsewhere = load_spec(write_spec(tmp_path, "abs", '  - {name: a, ref: "m.vec"}', out=tmp_path / "shared"))
    assert sweep.job_output_dir(elsewhere, job=job, cwd=copy) == (elsewhere, None)
    # an absolute path inside the copy, or a SQLite store there: refused
    inside = load_spec(write_spec(tmp_path, "in", '  - {name: a, ref: "m.vec"}', out=copy / "out"))
    with pytest.raises(sweep.ParameterError, match=r"output_dir: .* lies in the Ray job's temporary copy"):
        sweep.job_output_dir(inside, job=job, cwd=copy)
    rel_db = load_spec(write_spec(tmp_path, "db", '  - {name: a, ref: "m.vec"}'), tracking_uri="sqlite:///out/mlflow.db")
    with pytest.raises(sweep.ParameterError, match=r"tracking.uri: sqlite:///out/mlflow.db lies in the Ray job's"):
        sweep.job_output_dir(rel_db, job=job, cwd=copy)


@pytest.mark.unit
def test_job_output_dir_without_a_working_dir_copy_is_anchored_too(tmp_path, monkeypatch):
    """A job that runs the installed wheel (runtime_env ``pip``, no ``working_dir``): its driver's
    working directory is the one the node's ``ray start`` ran in, not the submitter's (measured
    on a loopback head: ``out/smoke`` landed in the head's directory). Relative output paths go
    under ``$BIASAUDIT_HOME`` as with a copy (before: into the head's directory); a relative
    SQLite store is refused; an absolute output directory is kept."""
    head_cwd = tmp_path / "where-ray-start-ran"
    head_cwd.mkdir()
    home = tmp_path / "home"
    monkeypatch.setenv("BIASAUDIT_HOME", str(home))
    job = {"runtime_env": {"pip": ["/shared/wheels/biasaudit-0.1.0-py3-none-any.whl"]},
           "metadata": {"job_submission_id": "raysubmit_3"}}
    spec = load_spec(write_spec(tmp_path, "wheel", '  - {name: a, ref: "m.vec"}', out=Path("out/wheel")))
    moved, note = sweep.job_output_dir(spec, job=job, cwd=head_cwd)
    assert moved.output_dir == home / "out" / "wheel"
    assert note.startswith(f"inside a Ray job: output directory out/wheel -> {home / 'out' / 'wheel'}")
    assert f"not at the Ray job driver's working directory ({head_cwd}" in note
    absolute = load_spec(write_spec(tmp_path, "abs2", '  - {name: a, ref: "m.vec"}', out=tmp_path / "shared"))
    assert sweep.job_output_dir(absolute, job=job, cwd=head_cwd) == (absolute, None)
    rel_db = load_spec(write_spec(tmp_path, "db2", '  - {name: a, ref: "m.vec"}'), tracking_uri="sqlite:///out/mlflow.db")
    with pytest.raises(sweep.ParameterError, match=r"tracking.uri: sqlite:///out/mlflow.db lies in the Ray job driver's"):
        sweep.job_output_dir(rel_db, job=job, cwd=head_cwd)


@pytest.mark.unit
def test_main_inside_a_ray_job_writes_to_biasaudit_home(tmp_path, monkeypatch, capsys):
    """``python -m jobs.sweep SPEC`` run literally by ``ray job submit --working-dir .``: the
    spec's relative ``output_dir`` lands under ``$BIASAUDIT_HOME``, not in the job's copy of the
    working directory (here faked: Ray's job variable and a working directory copy)."""
    copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_x"
    copy.mkdir(parents=True)
    vec = write_vec(tmp_path / "m.vec", 0)
    spec = write_spec(tmp_path, "literal", f'  - {{name: a, ref: "{vec}"}}', out=Path("out/literal"))
    monkeypatch.chdir(copy)
    monkeypatch.setenv("BIASAUDIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"},
                                                                   "metadata": {"job_submission_id": "raysubmit_2"}}))
    assert sweep.main([str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    target = tmp_path / "home" / "out" / "literal"
    assert f"output: {target}" in out and str(copy) not in out.split("output:")[1]
    assert f"sqlite:///{target}/mlflow.db" in out


# --------------------------------------------------------------------------------------
# Sweeps on a local Ray
# --------------------------------------------------------------------------------------


class SlowServer(ModelServer):
    """0.4 s per request, so that a sweep lasts long enough for progress lines."""

    def measure_batch(self, requests, tests):
        time.sleep(0.4)
        return super().measure_batch(requests, tests)


@pytest.mark.ray
def test_progress_lines_in_job_logs_and_the_summary(tmp_path, local_ray, capsys):
    """With ``--no-progress`` (and whenever stderr is not a terminal) the driver prints a plain
    line every ``progress_interval`` seconds: tasks done, failed, models loaded, elapsed, time
    left; no carriage return (no tqdm) anywhere in the output."""
    vec = write_vec(tmp_path / "m.vec", 1, tests=["weat1", "weat2", "weat6", "weat7"])
    spec = load_spec(write_spec(tmp_path, "prog", f'  - {{name: a, ref: "{vec}"}}',
                                tests=["weat1", "weat2", "weat6", "weat7"]))
    out = sweep.run_sweep(spec, progress=True, progress_interval=0.3, server_cls=SlowServer)
    assert out.exit_code == 0 and out.ran == 4
    cap = capsys.readouterr()
    assert "\r" not in cap.out and "\r" not in cap.err
    lines = [x for x in cap.out.splitlines() if x.startswith("progress: ")]
    assert len(lines) >= 3, cap.out
    import re

    pat = re.compile(r"^progress: (\d)/4 tasks \((\d+)%\), 0 failed, ([01]) models? loaded, (\d+)s elapsed, "
                     r"(about (\?|\d+s) left|done)$")
    parsed = [pat.match(x) for x in lines]
    assert all(parsed), lines
    done = [int(m.group(1)) for m in parsed]
    assert done == sorted(done) and done[-1] == 4 and lines[-1].endswith("done")
    assert any(m.group(5).startswith("about") and m.group(6) != "?" for m in parsed), lines  # an estimate was given
    assert (spec.output_dir / "run.log").read_text().count("progress: 4/4 tasks (100%)") == 1


@pytest.mark.ray
def test_parent_metrics_describe_the_sweep_across_invocations(tmp_path, local_ray):
    """After the model's files change (a branch moved to a new commit) the re-run audits the new
    revision under the same parent: its metrics say 2 planned tasks, 4 child runs of which 2
    superseded, 2 invocations and running totals, not only the last invocation."""
    vec = write_vec(tmp_path / "m.vec", 2)
    spec = load_spec(write_spec(tmp_path, "moves", f'  - {{name: a, ref: "{vec}"}}'))
    first = sweep.run_sweep(spec, progress=False)
    assert first.exit_code == 0 and first.ran == 2
    write_vec(vec, 3)  # new content: a new revision, new keys
    second = sweep.run_sweep(spec, progress=False)
    assert second.exit_code == 0 and (second.ran, second.skipped_existing) == (2, 0)
    assert first.parent_run_id == second.parent_run_id
    from jobs.tracker import Tracker

    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    run = tr.client.get_run(second.parent_run_id)
    m = run.data.metrics
    assert (m["tasks"], m["tasks_finished"], m["tasks_failed"], m["tasks_missing"]) == (2, 2, 0, 0)
    assert (m["child_runs"], m["child_runs_finished"], m["child_runs_superseded"]) == (4, 4, 2)
    assert (m["invocations"], m["tasks_run_total"], m["models_loaded_total"]) == (2, 4, 2)
    assert m["seconds_total"] == pytest.approx(first.seconds + second.seconds, rel=1e-6)
    history = tr.client.get_metric_history(second.parent_run_id, "tasks_run")
    assert sorted((h.step, h.value) for h in history) == [(1, 2.0), (2, 2.0)]
    assert run.data.tags["audit.state"] == "finished" and run.info.status == "FINISHED"
    assert len(tr.task_runs()) == 4


@pytest.mark.unit
def test_progress_reporter_plain_lines_and_estimate():
    from jobs.progress import Progress, format_seconds, use_bar

    assert [format_seconds(s) for s in (0, 45.4, 125, 3720)] == ["0s", "45s", "2m05s", "1h02m"]
    now = [100.0]
    said = []
    p = Progress(10, label="x", bar=False, interval=30, say=said.append, clock=lambda: now[0])
    now[0] = 110.0
    p.tick()
    assert said == []  # not yet 30 s
    now[0] = 131.0
    p.tick()
    assert said == ["progress: 0/10 tasks (0%), 0 failed, 0 models loaded, 31s elapsed, about ? left"]
    p.update(done=4, failed=1, loads=1)
    now[0] = 161.0
    p.tick()
    # 4 tasks in 61 s: 6 left take about 6 * 61 / 4 = 91.5 s
    assert said[-1] == "progress: 4/10 tasks (40%), 1 failed, 1 model loaded, 1m01s elapsed, about 1m32s left"
    p.update(done=10, failed=1, loads=2)
    now[0] = 200.0
    p.tick()  # all done: the last line is close()'s, printed once
    assert len(said) == 2
    p.close()
    assert said[-1] == "progress: 10/10 tasks (100%), 1 failed, 2 models loaded, 1m40s elapsed, done"
    assert len(said) == 3
    q = Progress(3, label="y", bar=False, interval=30, say=said.append)
    q.close(final_line=False)  # a refused run prints no last line
    assert len(said) == 3

    class Tty:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    assert use_bar(True, Tty(True)) and not use_bar(True, Tty(False)) and not use_bar(False, Tty(True))
