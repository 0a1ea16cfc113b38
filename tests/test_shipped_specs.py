"""Every spec shipped in jobs/specs/ is run the way its own comment says.

- Sweep specs: ``audit run SPEC --dry-run`` (the plan; hub models and large ones are not
  loaded). Their real runs are tested elsewhere: smoke.yaml in tests/test_sweep_e2e.py,
  smoke-languages.yaml in tests/test_smoke_languages.py (its dry run alone takes over a minute on
  a shared CPU, so it is left to that test), mitigation-example.yaml in
  tests/test_sweep_mitigation.py.
- watch-local-example.yaml: ``BIASAUDIT_MODELS=<root> audit watch SPEC --once --dry-run`` and
  ``--once`` in the layout its comment describes (``<model>/<revision>/`` folders: a checkpoint
  folder and a folder holding ``vectors.vec``, no ``file:``); the real run audits the vectors
  revision on a local Ray and every task finishes (before, the planner took the folder for a
  static model and all 10 tasks failed to load it).
- watch-example.yaml needs the Hub: tests/test_watch_hub.py runs it against a loopback Hub.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from jobs import sweep
from jobs import watch as W

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "jobs" / "specs"
REAL_RUN_ELSEWHERE = {"smoke-languages.yaml": "tests/test_smoke_languages.py"}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "BIASAUDIT_MODELS", "BIASAUDIT_WATCH_DIR"):
        monkeypatch.delenv(var, raising=False)


def sweep_specs() -> list[Path]:
    return [p for p in sorted(SPECS.glob("*.yaml")) if not p.name.startswith("watch")]


@pytest.mark.e2e
def test_every_shipped_spec_is_covered_here_or_named():
    names = {p.name for p in SPECS.glob("*.yaml")}
    assert {"smoke.yaml", "default.yaml", "hub-example.yaml", "watch-local-example.yaml"} <= names
    assert all((REPO / t).is_file() for t in REAL_RUN_ELSEWHERE.values())


@pytest.mark.e2e
@pytest.mark.parametrize("path", [p for p in sweep_specs() if p.name not in REAL_RUN_ELSEWHERE], ids=lambda p: p.name)
def test_sweep_spec_dry_run_as_documented(path, tmp_path, capsys):
    assert f"audit run jobs/specs/{path.name}" in path.read_text()  # the command its comment gives
    assert sweep.main([str(path), "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sweep '{path.stem.split('-example')[0]}") or "tasks over" in out
    assert not (tmp_path / "out" / "mlflow.db").exists()  # a dry run writes no results


def _words() -> list[str]:
    from audit.runner import load_test

    spec = yaml.safe_load((SPECS / "smoke.yaml").read_text())
    words: set[str] = set()
    for name in spec["tests"]:
        t = load_test(name)
        words |= {w for s in (*t.targets, *t.attributes) for w in s.words}
    return sorted(words)


def _layout(root: Path) -> None:
    """The layout of the example's comment: a checkpoint folder and a vectors folder, one revision each."""
    from audit.tiny_models import build_tiny_bert

    old = time.time() - 3600
    bert = build_tiny_bert(root / "our-bert" / "2025-06-01", train=False)
    vec = root / "our-vectors" / "v3"
    vec.mkdir(parents=True)
    words = _words()
    rng = np.random.default_rng(0)
    lines = [f"{len(words)} 16"] + [w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=16)) for w in words]
    (vec / "vectors.vec").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for d in (Path(bert), vec):
        for f in [*d.iterdir(), d]:
            os.utime(f, (old, old))


@pytest.mark.e2e
def test_watch_local_example_in_its_documented_layout(tmp_path, monkeypatch, capsys, local_ray):
    from watch_fakes import InlineSubmitter

    spec = SPECS / "watch-local-example.yaml"
    text = spec.read_text()
    assert "BIASAUDIT_MODELS=/srv/models audit watch jobs/specs/watch-local-example.yaml --once" in text
    assert "our-vectors/v3/vectors.vec" in text and "\n    file:" not in text
    root = tmp_path / "models"
    _layout(root)
    monkeypatch.setenv("BIASAUDIT_MODELS", str(root))
    monkeypatch.setenv("BIASAUDIT_WATCH_DIR", str(tmp_path / "watch"))

    assert W.main([str(spec), "--once", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "2 revision(s) seen: 0 submitted, 0 skipped, 2 to submit (dry run), 0 error(s), 0 failed" in out
    # what the dry run planned, the run loads: the vectors folder is a static model, the checkpoint an MLM
    from jobs.plan import model_infos
    from jobs.spec import load_spec

    kinds = {}
    for g in (tmp_path / "watch" / "specs").glob("*.yaml"):
        s = load_spec(g)
        kinds.update({Path(i.local_ref).parent.name: i.kind for i in model_infos(s).values()})
    assert kinds == {"our-bert": "mlm", "our-vectors": "static"}

    # the real run of the vectors revision (the checkpoint's LM tasks are left to the LM tests)
    import shutil

    shutil.rmtree(root / "our-bert")
    sub = InlineSubmitter()
    monkeypatch.setattr("jobs.watch.watcher.RaySubmitter", lambda address=None: sub)
    assert W.main([str(spec), "--once"]) == 0
    [outcome] = sub.outcomes.values()
    assert outcome.exit_code == 0 and outcome.failed == 0 and outcome.ran == 10  # weat and same on 5 tests
    assert W.main([str(spec), "--once"]) == 0  # audited: skipped, compared with nothing earlier
    out = capsys.readouterr().out
    assert "already audited: sweep run" in out and "0 failed" in out


@pytest.mark.e2e
def test_a_model_folder_is_one_rule_for_planner_loader_and_score(tmp_path, capsys):
    """A folder holding one vectors file is that file for every command (score, compare, sweeps
    and their planner); a folder with nothing loadable is refused by the dry run, naming it."""
    from audit import cli
    from audit.backends.static import folder_vectors
    from jobs.resolve import model_kind, probe_revision
    from audit.runner import load_model

    words = _words()
    rng = np.random.default_rng(1)
    good = tmp_path / "vec" / "v1"
    good.mkdir(parents=True)
    (good / "vectors.vec").write_text(f"{len(words)} 4\n" + "".join(
        w + " " + " ".join(f"{x:.4f}" for x in rng.normal(size=4)) + "\n" for w in words), encoding="utf-8")
    (good / "README.md").write_text("notes\n", encoding="utf-8")
    assert folder_vectors(good) == good / "vectors.vec"
    m = load_model(str(good))
    assert m.kind == "static" and model_kind(str(good)) == "static"
    assert m.revision == probe_revision(str(good), "static") == load_model(str(good / "vectors.vec")).revision
    assert cli.main(["score", "--model", str(good), "--test", "weat1", "--metric", "weat", "--permutations", "100",
                     "--n-bootstrap", "0", "--format", "json"]) == 0
    assert '"effect_size"' in capsys.readouterr().out

    two = tmp_path / "two"
    two.mkdir()
    for n in ("a.vec", "b.txt"):
        (two / n).write_text("1 2\nx 1 2\n", encoding="utf-8")
    empty = tmp_path / "empty"
    empty.mkdir()
    from audit.errors import AuditError

    with pytest.raises(AuditError, match=r"holds 2 vectors files \('a.vec', 'b.txt'\); give the file itself"):
        load_model(str(two))
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "output_dir": str(tmp_path / "o"), "tests": ["weat1"],
                                    "metrics": ["weat"], "models": [{"name": "e", "ref": str(empty)}]}))
    assert sweep.main([str(spec), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "models[0]" in err[0] and f"{empty} is a folder without config.json" in err[0]
