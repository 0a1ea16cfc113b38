"""The wheel stands alone: built from the checkout, installed without dependencies into a
temporary directory, and run from another working directory with the project's environment for
the dependencies (docs/architecture.md, "Packaging").

The shipped test suites, templates, stubs and specs are package data and the tiny-model builders
package code, so ``audit datasets``, ``audit score`` and ``audit run jobs/specs/smoke.yaml`` (by
its packaged name) work with no checkout in sight.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from audit.datasets.external import data_root
from jobs.cluster import short_temp_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED = data_root()


@pytest.mark.unit
def test_every_source_package_is_packaged():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for pkg in ("audit", "actors", "jobs")
             for p in (ROOT / pkg).rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(site dir, environment) of the wheel installed alone into a temporary directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"), str(ROOT)],
        capture_output=True, text=True, cwd=tmp, timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheels = list((tmp / "dist").glob("biasaudit-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "audit/_data/en/weat7.yaml" in names and "audit/_data/en/templates.yaml" in names
    assert "jobs/specs/smoke.yaml" in names and "audit/tiny_models.py" in names
    assert not any(n.startswith(("tests/", "datasets/")) for n in names)
    site = tmp / "site"
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheels[0])],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BIASAUDIT_")}
    env["PYTHONPATH"] = str(site)  # the wheel first; the project's environment for the dependencies
    short = Path(short_temp_dir("whl-"))  # Ray's sockets live below TMPDIR (a worker's tmp_path is too deep)
    env["TMPDIR"] = str(short)
    if SHARED.is_dir():
        env["BIASAUDIT_DATA"] = str(SHARED)
    work = tmp / "elsewhere"
    work.mkdir()
    yield site, env, work
    shutil.rmtree(short, ignore_errors=True)


def _audit(installed, *args, timeout=600):
    site, env, work = installed
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], capture_output=True, text=True, cwd=work,
                          env=env, timeout=timeout)


@pytest.mark.wheel
def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    site, env, work = installed
    out = subprocess.run([sys.executable, "-c", "import audit, jobs, actors; print(audit.__file__, jobs.__file__)"],
                         capture_output=True, text=True, cwd=work, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert all(Path(p).resolve().is_relative_to(site.resolve()) for p in out.stdout.split()), out.stdout


@pytest.mark.wheel
def test_datasets_from_the_wheel(installed):
    out = _audit(installed, "datasets", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    names = {r["name"] for r in rows}
    assert {"en/weat7", "de/cw1", "fr/gender_math", "tr/cw5"} <= names
    site = installed[0].resolve()
    # data read from a path (CrowS-Pairs, the BBQ family) lies outside; shipped tests, HONEST templates included, inside
    external = ("crows", "/bbq")
    assert all(Path(r["path"]).resolve().is_relative_to(site) for r in rows
               if r["available"] and not any(e in r["name"] for e in external))
    honest = {r["name"]: r for r in rows if r["name"].endswith("/honest")}
    assert len(honest) == 11 and all(r["available"] and r["path"].endswith("honest.tsv") for r in honest.values())


@pytest.mark.wheel
def test_score_from_the_wheel(installed):
    out = _audit(installed, "score", "--model", "glove-6b-50d", "--test", "weat7", "--metric", "weat", "--casefold",
                 "--format", "json", "--n-bootstrap", "0")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["metric"] == "weat" and res["value"] == pytest.approx(1.495, abs=5e-4)
    assert res["p_method"] == "exact"


@pytest.mark.wheel
def test_smoke_sweep_by_its_packaged_name(installed):
    if not SHARED.is_dir():
        pytest.skip(f"the smoke sweep reads LPBS and CrowS-Pairs from {SHARED}, not found ($BIASAUDIT_DATA)")
    out = _audit(installed, "run", "jobs/specs/smoke.yaml", "--no-progress", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    work = installed[2]
    assert (work / "out" / "smoke" / "reports" / "results.parquet").is_file()
    assert " 0 failed" in out.stdout
    # the models were built by the packaged builders, next to the outputs
    assert (work / "out" / "smoke" / "models").is_dir()
    tree = ast.parse((ROOT / "jobs" / "builders.py").read_text())
    assert not any(isinstance(n, ast.Constant) and "tests/tiny_models" in str(n.value) for n in ast.walk(tree))
