"""The suite's own rules (tests/conftest.py, README "Tests"): every test has exactly one tier, a
``unit`` test starts no Ray, and a missing test dependency stops the suite instead of skipping."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import missing_test_dependencies

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def suite(pytester, monkeypatch):
    """A made-up suite under the project's conftest and pytest configuration, run in a process of
    its own (``runpytest_subprocess``: an in-process run restores ``sys.modules`` afterwards, and a
    Ray module it imported first would come back as a second, unconnected copy for a later Ray test
    of the same worker), on one worker (``-n 0``: the configuration's ``-n auto`` could start three
    workers for a few lines)."""
    shutil.copy(REPO / "pyproject.toml", pytester.path / "pyproject.toml")
    shutil.copy(REPO / "tests" / "conftest.py", pytester.path / "conftest.py")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-n 0")
    return pytester


def test_a_test_without_a_tier_fails_collection_also_when_deselected(suite):
    suite.makepyfile(test_a="""
        import pytest

        @pytest.mark.unit
        def test_tiered():
            assert 1 + 1 == 2

        def test_untiered():
            pass

        @pytest.mark.unit
        @pytest.mark.ray
        def test_twice():
            pass
        """)
    for args in ((), ("-m", "unit")):
        r = suite.runpytest_subprocess(*args)
        assert r.ret == pytest.ExitCode.USAGE_ERROR
        r.stderr.fnmatch_lines(["*2 test(s) need exactly one tier marker (unit, ray, e2e, wheel*",
                                "*test_a.py::test_untiered: no tier", "*test_a.py::test_twice: two tiers ray, unit"])
        r.assert_outcomes()  # nothing ran


def test_an_unregistered_marker_is_refused(suite):
    suite.makepyfile(test_b="""
        import pytest

        @pytest.mark.unti
        def test_typo():
            pass
        """)
    r = suite.runpytest_subprocess()
    assert r.ret != pytest.ExitCode.OK
    r.stdout.fnmatch_lines(["*'unti' not found in `markers` configuration option*"])


def test_a_unit_test_that_starts_ray_fails_naming_its_tier(suite):
    suite.makepyfile(test_c="""
        import pytest
        import ray

        pytestmark = pytest.mark.unit

        def test_starts_ray():
            ray.init(address="local", num_cpus=1)

        def test_pure():
            assert not ray.is_initialized()
        """)
    r = suite.runpytest_subprocess()
    r.assert_outcomes(passed=1, failed=1)
    r.stdout.fnmatch_lines(["*test_c.py::test_starts_ray is marked `unit` but starts Ray: mark it `ray`*"])


def test_missing_or_wrong_test_dependencies_are_named(tmp_path):
    text = (REPO / "pyproject.toml").read_text("utf-8")
    assert missing_test_dependencies(REPO / "pyproject.toml") == []
    bad = text.replace('no-deps = ["wefe==1.0.1"]', 'no-deps = ["wefe==1.0.1", "no-such-package-xq==1.0"]')
    bad = bad.replace('"pytest>=8",', '"pytest<2",')
    assert bad.count("no-such-package-xq") == 1 and bad.count('"pytest<2"') == 1
    (tmp_path / "pyproject.toml").write_text(bad, "utf-8")
    from importlib.metadata import version

    assert missing_test_dependencies(tmp_path / "pyproject.toml") == [
        f"pytest<2 is needed, {version('pytest')} is installed", "no-such-package-xq==1.0 is not installed"]


def test_a_missing_test_dependency_stops_the_suite_with_one_line(suite):
    conf = (suite.path / "pyproject.toml").read_text("utf-8")
    (suite.path / "pyproject.toml").write_text(
        conf.replace('no-deps = ["wefe==1.0.1"]', 'no-deps = ["wefe==1.0.1", "no-such-package-xq==1.0"]'))
    suite.makepyfile(test_d="import pytest\n\n@pytest.mark.unit\ndef test_x():\n    pass\n")
    r = suite.runpytest_subprocess()
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*test dependencies missing (run scripts/setup.sh --test): "
                            "no-such-package-xq==1.0 is not installed*"])


def import_skips(path: Path) -> list[str]:
    """The places in the test module ``path`` that would skip, or quietly do less, where an import
    fails: ``pytest.importorskip(...)`` and ``except ImportError``/``ModuleNotFoundError``. Every
    package a test imports is a pinned dependency or a ``[test]`` extra, whose absence stops the
    suite (``missing_test_dependencies``), and the project's own modules are always there."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
        if isinstance(node, ast.Call) and (getattr(node.func, "attr", None) == "importorskip"
                                           or getattr(node.func, "id", None) == "importorskip"):
            found.append(f"{path.name}:{node.lineno}: importorskip")
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = [n for n in ast.walk(node.type) if isinstance(n, (ast.Name, ast.Attribute))]
            if any(getattr(n, "id", getattr(n, "attr", None)) in ("ImportError", "ModuleNotFoundError")
                   for n in names):
                found.append(f"{path.name}:{node.lineno}: except ImportError")
    return found


def test_no_test_skips_or_does_less_when_an_import_fails(tmp_path):
    """A missing or broken dependency fails the suite (issue 19: an ``importorskip`` of pinned
    packages turned a broken install into skipped tests); the rule catches both forms."""
    tests = sorted((REPO / "tests").glob("test_*.py")) + [REPO / "tests" / "conftest.py"]
    assert [hit for p in tests for hit in import_skips(p)] == []
    bad = tmp_path / "test_bad.py"
    bad.write_text("import pytest\ntorch = pytest.importorskip('torch')\ntry:\n    import audit.stats\n"
                   "except (ModuleNotFoundError, OSError):\n    pass\n", "utf-8")
    assert import_skips(bad) == ["test_bad.py:2: importorskip", "test_bad.py:5: except ImportError"]


@pytest.mark.parametrize("args,cpus,gib,env,workers", [
    (["tests"], 2, 21.0, None, 2),                       # the whole suite (or a tier: -m unit) on this machine
    (["tests"], 2, 12.0, None, 0),                       # too little memory: one process
    (["tests"], 1, 64.0, None, 0),                       # one core
    (["tests/test_stats.py"], 2, 21.0, None, 0),         # named files or tests: one process
    (["tests/test_stats.py::test_x"], 2, 21.0, None, 0),
    (["tests"], 2, 12.0, "3", 3),                        # PYTEST_XDIST_AUTO_NUM_WORKERS decides
])
def test_auto_workers_where_they_fit(monkeypatch, args, cpus, gib, env, workers):
    import types

    import conftest

    monkeypatch.setattr(conftest.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(conftest, "_available_gib", lambda: gib)
    if env is None:
        monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", env)
    config = types.SimpleNamespace(rootpath=REPO, args=args, invocation_params=types.SimpleNamespace(dir=REPO))
    assert conftest.pytest_xdist_auto_num_workers(config) == workers


def test_a_module_fixture_is_built_once_on_one_of_two_workers(suite, monkeypatch):
    """On two pytest-xdist workers (``--dist loadgroup``, ``pyproject.toml``) the tests that share a
    module-scoped fixture run on one worker, which builds it once (tests/conftest.py,
    ``_schedule_for_workers``); the other tests go to either. With pytest 9.2, pytest-xdist's group
    suffix did not take (pytest-xdist issue 1386; ``_GroupIds``): the module's tests went to both
    workers and each built the fixture."""
    monkeypatch.setenv("PYTEST_ADDOPTS", "-n 2")
    built = suite.path / "built.txt"
    suite.makepyfile(test_g=f"""
        import os
        import time

        import pytest

        pytestmark = pytest.mark.unit

        @pytest.fixture(scope="module")
        def shared():
            with open({str(built)!r}, "a") as f:
                f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
            return 1

        @pytest.mark.parametrize("i", range(6))
        def test_uses_it(shared, i):
            time.sleep(0.05)
            print("ran on", os.environ["PYTEST_XDIST_WORKER"])
            assert shared == 1

        @pytest.mark.parametrize("i", range(6))
        def test_alone(i):
            time.sleep(0.05)
        """)
    r = suite.runpytest_subprocess("-v")
    r.assert_outcomes(passed=12)
    assert len(built.read_text().split()) == 1  # one worker, one build
    grouped = [ln for ln in r.outlines if "test_uses_it" in ln and "PASSED" in ln]
    assert len(grouped) == 6 and all(ln.endswith("@test_g") or "@test_g " in ln for ln in grouped), grouped
    assert len({ln.split("]")[0] for ln in grouped}) == 1, grouped  # [gw0] or [gw1], the same for all six


def test_every_module_on_the_shared_ray_head_is_one_group_on_the_workers(pytester):
    """The tests of every module that uses ``local_ray`` (the session's shared Ray head) form one
    group for pytest-xdist (``_ONE_WORKER_FIXTURES``): one worker runs them one after the other and
    starts the head once, instead of once per module; the module's other tests stay units of
    their own, and a module-scoped fixture of another name still groups by its module."""
    from conftest import _schedule_for_workers

    shared = """
        import pytest

        pytestmark = pytest.mark.ray

        @pytest.fixture(scope="module")
        def local_ray():  # stands in for the conftest's: nothing runs here, the items are only collected
            return None

        def test_on_the_head(local_ray):
            pass

        def test_alone():
            pass
        """
    own = """
        import pytest

        pytestmark = pytest.mark.ray

        @pytest.fixture(scope="module")
        def model():
            return None

        def test_with_a_model(model):
            pass
        """
    pytester.makepyfile(test_one=shared, test_two=shared, test_three=own)
    items, _ = pytester.inline_genitems("-p", "no:cacheprovider")
    _schedule_for_workers(items)
    groups = {i.nodeid: [m.args[0] for m in i.iter_markers("xdist_group")] for i in items}
    on_head = [g for n, g in groups.items() if n.endswith("::test_on_the_head")]
    assert len(on_head) == 2 and on_head[0] == on_head[1] and len(on_head[0]) == 1, groups
    assert all(g == [] for n, g in groups.items() if n.endswith("::test_alone")), groups
    assert groups["test_three.py::test_with_a_model"] == ["test_three"], groups


def test_the_session_job_head_stops_after_the_last_test_that_uses_it(suite, tmp_path):
    """The session's ``ray start`` head (``job_head``) is started by the first test that asks for it,
    kept over a ``unit`` test, stopped before the next test of another tier that does not use it
    (an idle head costs CPU), and a test that asks for it afterwards fails saying why; ``ray start``
    is stood in for by a context manager that records its start and stop."""
    events = tmp_path / "events.txt"
    suite.makepyfile(test_heads=f"""
        import contextlib

        import pytest

        import jobs.cluster
        from conftest import _JOB_HEAD

        def note(x):
            with open({str(events)!r}, "a") as f:
                f.write(x + "\\n")

        @contextlib.contextmanager
        def fake_head(**kw):
            note("start")
            yield "http://127.0.0.1:9"
            note("stop")

        jobs.cluster.local_head = fake_head

        @pytest.mark.e2e
        def test_a(job_head):
            note("a " + job_head)

        @pytest.mark.e2e
        def test_b(job_head):
            note("b")

        @pytest.mark.unit
        def test_u():
            note(f"u {{_JOB_HEAD.running}}")

        @pytest.mark.e2e
        def test_c():
            note(f"c {{_JOB_HEAD.running}}")

        @pytest.mark.e2e
        def test_d(job_head):
            note("d")
        """)
    r = suite.runpytest_subprocess("-p", "no:cacheprovider")
    r.assert_outcomes(passed=4, errors=1)  # test_d: at its set-up
    assert events.read_text().split("\n")[:-1] == ["start", "a http://127.0.0.1:9", "b", "u True", "stop", "c False"]
    assert "the session's job_head was stopped after its tests had run" in r.stdout.str()
