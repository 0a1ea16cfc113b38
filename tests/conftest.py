"""Suite-wide guard: the variables the service reads (``MLFLOW_TRACKING_URI`` has precedence over a
spec's default store, ``BIASAUDIT_*`` move data and outputs) are restored after every test, so a
test that sets one (directly or through a library: ``mlflow.set_tracking_uri`` writes
``MLFLOW_TRACKING_URI``) cannot change what a later test reads.

Tiers: every test carries exactly one of the markers in ``TIERS`` (registered in pyproject.toml,
described in the README's "Tests" section); a test with none, or with two, fails collection. A test
marked ``unit`` that starts Ray fails (mark it ``ray``)."""

from __future__ import annotations

import gc
import os
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from actors.gc_tuning import tune_gc

pytest_plugins = ["pytester"]  # tests/test_tiers.py runs the suite's own rules on made-up test files

_GUARDED_PREFIXES = ("BIASAUDIT_", "MLFLOW_TRACKING_URI")
TIERS = ("unit", "ray", "e2e", "wheel", "gpu")


def missing_test_dependencies(pyproject: Path) -> list[str]:
    """The `[test]` extras and the `--no-deps` test packages of ``pyproject`` (README "Tests") that are
    not installed at a version they allow, one line each."""
    conf = tomllib.loads(pyproject.read_text("utf-8"))
    wanted = conf["project"]["optional-dependencies"]["test"] + conf["tool"]["biasaudit"]["no-deps"]
    missing = []
    for req in map(Requirement, wanted):
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{req} is not installed")
            continue
        if not req.specifier.contains(have, prereleases=True):
            missing.append(f"{req} is needed, {have} is installed")
    return missing


def pytest_configure(config):
    """Every process the suite starts (commands, sweeps, Ray heads and their workers, servers) runs
    OpenMP/torch on one thread (``OMP_NUM_THREADS=1`` unless set): commands, Ray workers and
    pytest-xdist workers (``-n 2``) share the 2-core machine, and a second intra-op thread
    spin-waits for a core (see ``_one_torch_thread``).

    A pytest-xdist worker inherits SIGINT ignored from its controller (as does a suite started in
    the background by a non-interactive shell), and so would every command a test starts (Python
    raises no KeyboardInterrupt where SIGINT was ignored at its start): the process takes Python's
    own handler back, and its subprocesses start with SIGINT's default, as from a user's shell.

    Every Ray the suite starts, in its process or in a command, runs without Ray's token
    authentication (``RAY_AUTH_MODE=disabled``, whatever the environment said): a process that
    started a token-mode Ray keeps that mode in Ray's native configuration, and a later loopback
    head of the same process then starts its GCS with tokens and refuses its own driver (with
    ``-n 2``, a failure of whichever tests came next on that worker). The embedded Ray's own token
    is checked in a process of its own, from a user's environment
    (``test_security::test_embedded_ray_has_no_dashboard_and_refuses_clients_without_the_token``).

    Every process the suite starts caches the bytecode it compiles (``PYTHONDONTWRITEBYTECODE``
    removed, also where the environment set it; the caches go to the ``__pycache__`` folders that
    ``.gitignore`` names): the suite starts about 400 Python processes (commands, sweep drivers,
    Ray's workers), and each compiled the project's modules again, 0.3 CPU-seconds a Ray worker
    on this machine (``test_sweep_e2e``'s submit-and-resume test: 89.9 CPU-s of the machine with
    the variable set, 84.1 without).

    Every process of the suite collects its cyclic garbage less often: the test processes here,
    and the commands, sweep drivers and Ray workers they start through biasaudit's own entry
    points (:func:`actors.gc_tuning.tune_gc`). A worker of ``pytest -m unit`` spent 11-19 CPU-s in
    collections with CPython's thresholds, each full one walking its 1.2-1.5 million objects.

    No test reaches the real Hugging Face Hub: ``HF_HUB_OFFLINE=1`` and ``HF_DATASETS_OFFLINE=1``
    unless the environment sets them, here, before anything imports ``huggingface_hub`` (the Hub's
    code paths run against the loopback Hub of ``tests/hub_server.py``, whose tests go online to
    it). Ten test modules used to set them when imported, so a module run alone without them went
    online: ``test_chat_template``'s probe of a name in no cache retried the real Hub for 15 s."""
    import signal

    tune_gc()

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # lm-evaluation-harness's tasks load their documents with it
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_GroupIds(), "biasaudit-xdist-group-ids")


class _GroupIds:
    """The group suffix of ``--dist loadgroup`` where pytest-xdist's own no longer takes (a worker
    only; after every other ``pytest_collection_modifyitems``).

    pytest-xdist 3.8 marks a grouped test by appending ``@<group>`` to its node id, by writing the
    item's ``_nodeid``; pytest 9.2 keeps node ids structured (``item._id``) and ``nodeid`` no longer
    reads ``_nodeid``, so the suffix never reached the controller and every test was a work unit of
    its own (pytest-xdist issue 1386): the groups of :func:`_schedule_for_workers` did nothing, a
    module's fixture was built on both workers (``test_compare_runs``'s store, 4.1 and 3.9 s) and
    so was the session's ``ray start`` head. Here the structured id gets the suffix wherever the
    node id lacks it; with a pytest or pytest-xdist where the suffix takes, nothing changes."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not config.getvalue("loadgroup"):
            return
        for item in items:
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")})
            suffix = "@" + "_".join(names)
            if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(item.nodeid + suffix)


def pytest_collection_finish(session):
    """What collection built lives for the whole session: the imported stack (torch,
    transformers, pandas, MLflow, Ray) and every test item, about 1.2-1.5 million objects in a
    pytest-xdist worker. It is collected once, then moved out of the collector's reach
    (``gc.freeze``), so the full collections the tests trigger walk only what the tests
    allocated: a model worker's ``release`` in ``test_sweep_pool``'s release test, a
    ``gc.collect()`` over that heap, took 0.34 CPU-s, 0.005 after a freeze. Nothing the tests
    allocate is frozen: their garbage, cyclic or not, is collected as before."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """The session is over: its garbage is collected once, then everything still alive is moved
    out of the collector's reach (``gc.freeze``), before pytest's unraisable-exception plugin
    collects ten more times and the interpreter's shutdown once more, each of which walked the
    whole heap again: the last pytest-xdist worker of ``pytest -m unit`` took 6.9 s from its last
    test to the controller's end, 2.5 s with the freeze. The first collection runs every
    finalizer it finds, so an exception raised in one is still reported."""
    gc.collect()
    gc.freeze()


def pytest_sessionstart(session):
    """A missing test dependency stops the suite with one line per package, instead of skipping tests."""
    missing = missing_test_dependencies(session.config.rootpath / "pyproject.toml")
    if missing:
        raise pytest.UsageError("test dependencies missing (run scripts/setup.sh --test): " + "; ".join(missing))


#: Memory the machine must have available for the workers: each runs its own sweeps, Ray heads
#: and MLflow servers; the suite peaked at 11.1 GB on two workers and 14.1 GB on three (sampled
#: every 5 s; one process: 5.6 GB). With less, Ray's memory monitor kills sweep workers and
#: their tasks fail.
_WORKERS_NEED_GIB = 18


def _available_gib() -> float:
    try:
        with open("/proc/meminfo") as fh:
            kib = next(int(ln.split()[1]) for ln in fh if ln.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0.0
    return kib / 2**20


def pytest_xdist_auto_num_workers(config):
    """How many pytest-xdist workers ``-n auto`` (the default: ``pyproject.toml``) starts: two
    where the machine has two cores and ``_WORKERS_NEED_GIB`` of memory available and the whole
    suite or a tier of it runs (``-m``, ``-k``); else none, one process (a run of named files or
    tests, where each worker would pay the collection, 17 CPU-seconds, for a few tests). ``-n N``
    and ``PYTEST_XDIST_AUTO_NUM_WORKERS`` choose themselves.

    Two, not three: the suite keeps both cores busy (90-94 % on three workers as on two), so a
    third worker only adds its collection and the contention of three processes on two cores.
    Measured on this 2-core machine, quiet, same commit: the whole suite 18 min 39 s on two
    workers (2,006 CPU-seconds) against 21 min 46 s on three (about 2,510); ``-m unit`` 2 min 48 s
    (311 CPU-seconds) against 3 min 12 s (377)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    root = config.rootpath / "tests"
    named = any((config.invocation_params.dir / a).resolve() != root for a in config.args)  # a file, a node id
    if named or (os.cpu_count() or 1) < 2 or _available_gib() < _WORKERS_NEED_GIB:
        return 0
    return 2


def _tiers(item) -> list[str]:
    return sorted({m.name for m in item.iter_markers() if m.name in TIERS})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an untiered test fails whatever is selected
def pytest_collection_modifyitems(config, items):
    bad = [f"{item.nodeid}: {'no tier' if not t else 'two tiers ' + ', '.join(t)}"
           for item in items if len(t := _tiers(item)) != 1]
    if bad:
        raise pytest.UsageError(
            f"{len(bad)} test(s) need exactly one tier marker ({', '.join(TIERS)}; README 'Tests'):\n  "
            + "\n  ".join(bad))
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (`-n N`, README "Tests"): its own order and groups
        _schedule_for_workers(items)
        return
    # Modules whose tests share the session's Ray head (`local_ray`) run one after the other, then
    # those that submit jobs to the session's `job_head`, last, in their order of collection, so each
    # head starts about once and `job_head` ends with the session; the order inside a module is kept.
    shared = {item.module for item in items if _uses_shared_ray(item)}
    jobs = {item.module for item in items if "job_head" in getattr(item, "fixturenames", ())} - shared
    items[:] = ([i for i in items if i.module not in shared | jobs] + [i for i in items if i.module in shared]
                + [i for i in items if i.module in jobs])


#: Seconds a module's tests took in a profile of the whole suite run three at a time (2-core machine,
#: load 3-12), for the modules of over 30 s. Only the order of the work given to pytest-xdist's
#: workers depends on it: after the unit tier, longest first, so that no long test starts last (a
#: wrong or missing figure costs wall time, never a result). A module not listed counts by its tier.
_MODULE_SECONDS = {
    "test_hub_e2e": 227, "test_faults": 196, "test_smoke_languages": 194, "test_docs_commands": 189,
    "test_signals": 148, "test_regression_e2e": 147, "test_contention": 145, "test_sweep_e2e": 144,
    "test_sweep_pool": 118, "test_exactly_once": 112, "test_sync_hint": 64, "test_cluster": 47,
    "test_lm_debias_sweep_run": 45, "test_watch": 43, "test_security": 39, "test_reports_scale": 33,
    "test_wheel": 32,
}
_TIER_SECONDS = {"e2e": 20, "wheel": 20, "ray": 15, "unit": 0, "gpu": 0}
#: The same for the ``unit`` tier alone (seconds of each module's unit tests, for those of 5 s or more, in
#: a profile of the whole suite on two workers): the unit tier too goes longest first, so that a module
#: whose tests share a fixture (one unit of work) does not start last and leave the other worker idle.
_UNIT_MODULE_SECONDS = {
    "test_reports_scale": 31, "test_chat_template": 19, "test_honest": 19, "test_bbq_harness": 18, "test_causal": 14,
    "test_bbq": 11, "test_tracker": 11, "test_tiers": 10, "test_compare_runs": 10, "test_hub_server": 10,
    "test_causal_lm_eval": 9, "test_cli": 8, "test_hub_loading": 8, "test_static_backends": 7, "test_contextual": 7,
    "test_sweep_pool": 7, "test_honest_official": 7, "test_mitigation": 6, "test_lm_scoring": 6, "test_datasets": 6,
    "test_architecture": 5, "test_watch": 5, "test_cluster": 5,
}


def _module_scoped(item) -> bool:
    """The test uses a fixture kept for its module or class (a tiny model, a server, ``local_ray``):
    the module's tests that do run on one worker, one after the other."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d and d[-1].scope in ("module", "class") for d in defs.values())


#: Fixtures of a head that a worker keeps running once started: the tests that use one run on one
#: worker, one after the other. ``job_head``: a ``ray start`` head with its dashboard costs CPU while
#: idle. ``local_ray``: the session's shared head (``_SHARED_RAY``), which a worker stops before any
#: other test that starts Ray; with each module of its own group the modules that use it were spread
#: over both workers between such tests, and the head was started again for each of them (ten starts
#: in a run, 4.4-9.5 s of set-up each, where one per run will do).
_ONE_WORKER_FIXTURES = ("job_head", "local_ray")


def _schedule_for_workers(items) -> None:
    """The order and grouping for ``pytest -n N --dist loadgroup`` (each worker is a process with its
    own session fixtures: Ray heads, PostgreSQL server, store template). Tests that share a
    module-scoped fixture, or one of ``_ONE_WORKER_FIXTURES``, form one group (``xdist_group``: one
    worker runs them in their order; groups that share a test merge); every other test is a unit of
    its own. The ``unit`` tier goes first (in-process work that keeps the cores busy), then the
    other tiers by their module's measured seconds (``_MODULE_SECONDS``, else by tier), longest
    first. (Longest first over the whole suite was slower: 22 min instead of 16 with three workers,
    as the sweeps, servers and Ray heads of several end-to-end tests then share the two cores. Giving
    the tests that mostly wait -- ``test_contention``, ``test_faults``, ``test_signals``,
    ``test_exactly_once``, ``test_security``, ``test_sync_hint``: their processes used 0.38-0.66
    CPU-seconds per second, a sweep's 0.9-1.3 -- out between the others, so that one of each ran
    side by side, was no faster: 15 min 10 s against 14 min 41 s, the machine 90 % busy either
    way, as those tests slowed beside a sweep by about what they left free; 2026-11-27.)"""
    def weight(item) -> float:
        stem, tier = Path(str(item.fspath)).stem, _tiers(item)[0]
        if tier == "unit":
            return _UNIT_MODULE_SECONDS.get(stem, 0)
        return _MODULE_SECONDS.get(stem, _TIER_SECONDS[tier])

    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            k = parent[k]
        return k

    keys = {}
    for item in items:
        ks = [Path(str(item.fspath)).stem] if _module_scoped(item) else []
        ks += [f for f in _ONE_WORKER_FIXTURES if f in getattr(item, "fixturenames", ())]
        keys[id(item)] = ks
        for k in ks[1:]:
            parent[find(k)] = find(ks[0])
    for item in items:
        if keys[id(item)]:
            item.add_marker(pytest.mark.xdist_group(find(keys[id(item)][0])))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (_tiers(item) != ["unit"], -weight(item), order[id(item)]))


@pytest.fixture(autouse=True)
def _unit_tests_start_no_ray(request):
    """A ``unit`` test that calls ``ray.init`` (directly or through the service) fails naming its tier."""
    if "unit" not in _tiers(request.node):
        yield
        return
    ray = sys.modules.get("ray")
    was_live = ray is not None and ray.is_initialized()  # a shared head of a `ray` test is not this test's
    if ray is not None:
        def refuse(*a, **k):
            raise RuntimeError(f"{request.node.nodeid} is marked `unit` but starts Ray: mark it `ray`")
        mp = pytest.MonkeyPatch()
        mp.setattr(ray, "init", refuse)
    yield
    if ray is not None:
        mp.undo()
    ray = sys.modules.get("ray")
    if not was_live and ray is not None and ray.is_initialized():
        pytest.fail(f"{request.node.nodeid} is marked `unit` but left Ray running: mark it `ray`")


@pytest.fixture(autouse=True)
def _restore_service_environment():
    before = {k: v for k, v in os.environ.items() if k.startswith(_GUARDED_PREFIXES)}
    yield
    for k in [k for k in os.environ if k.startswith(_GUARDED_PREFIXES)]:
        if k not in before:
            del os.environ[k]
    os.environ.update(before)


def _torch_on_one_thread() -> None:
    torch = sys.modules.get("torch")  # not imported here: a test that needs no torch pays nothing
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Every in-process model runs on one torch thread (set before each test once torch is
    imported, by a test module or a module-scoped model fixture, and again after a test that
    imported it): on this 2-core machine, shared with other processes, a second intra-op thread
    spin-waits (MiniLM on the shipped ``weat1`` SEAT sentences: 3.2 s of CPU on one thread, 10.8 s
    on two, and slower in wall time too). Subprocesses and Ray workers are not affected (Ray sets
    their ``OMP_NUM_THREADS``)."""
    _torch_on_one_thread()
    yield
    _torch_on_one_thread()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one torch thread, and on a shared CPU two threads spin-wait.
    Modules that score tiny models use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


class _LoopbackRay:
    """A private 2-CPU Ray head (``address="local"``: never another Ray on the machine; no token, as
    every Ray of the suite: ``pytest_configure``); the environment it set is restored when it stops."""

    _NAMES = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",)

    def __init__(self):
        self.old: dict[str, str | None] | None = None  # None: not running

    @property
    def running(self) -> bool:
        return self.old is not None

    def start(self):
        import ray

        self.old = {k: os.environ.get(k) for k in self._NAMES}
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(address="local", num_cpus=2, object_store_memory=200_000_000, include_dashboard=False,
                 log_to_driver=False)
        return ray

    def stop(self) -> None:
        if self.old is None:  # never started: a process that never imported Ray does not import it here
            return
        import ray

        ray.shutdown()
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.old = None


#: The session's shared head: started by the first module that asks for ``local_ray``, kept for the
#: next ones (about 5 s quiet, 30 s under load, per start saved), stopped before a test that is not
#: ``unit`` and does not use it (a head of its own, a sweep's embedded head, a subprocess), and
#: at the end of the session.
_SHARED_RAY = _LoopbackRay()


def _uses_shared_ray(item) -> bool:
    return "local_ray" in getattr(item, "fixturenames", ())


class _JobHead:
    """The session's ``ray start`` head (:func:`jobs.cluster.local_head`, 2 CPUs, with its dashboard
    and job API), stoppable before the session ends."""

    def __init__(self):
        self.address: str | None = None  # kept after a stop: the address the tests were given
        self._stack = None

    @property
    def running(self) -> bool:
        return self._stack is not None

    @property
    def stopped(self) -> bool:
        """Started, then stopped: a test given its address would find no head there."""
        return self.address is not None and not self.running

    def start(self, log_path: Path) -> str:
        from contextlib import ExitStack

        from jobs.cluster import local_head

        stack = ExitStack()
        self.address = stack.enter_context(local_head(num_cpus=2, log_path=log_path))
        self._stack = stack
        return self.address

    def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


#: Started by the first test that asks for ``job_head``; stopped before the first test after them
#: that is not ``unit`` (:func:`_session_heads`), else at the end of the session. Idle, its
#: dashboard, dashboard agent and job API cost about 0.08 CPU-seconds a second (53 CPU-s over the
#: 11.5 minutes it had been kept, 380 s of them after its last test, in a profile of the suite).
_JOB_HEAD = _JobHead()


@pytest.fixture(autouse=True)
def _session_heads(request):
    """The session's two heads for the next test. A ``ray``/``e2e``/``wheel`` test stops each head it
    does not use (``local_ray``: ``_SHARED_RAY``; ``job_head``: ``_JOB_HEAD``), so it finds no other
    Ray running and no idle head costs CPU; a ``unit`` test leaves them. A test that uses
    ``local_ray`` finds it running (started again after such a stop). ``job_head`` cannot start
    again (its address is cached for the session): its tests form one group of one worker
    (:func:`_schedule_for_workers`; in one process they run last), and a test that asks for it
    after it was stopped fails saying so, instead of submitting to a head that is gone."""
    other_tier = "unit" not in _tiers(request.node)
    if _uses_shared_ray(request.node):
        if not _SHARED_RAY.running:
            _SHARED_RAY.start()
    elif other_tier:
        _SHARED_RAY.stop()
    if "job_head" in getattr(request.node, "fixturenames", ()):
        if _JOB_HEAD.stopped:
            pytest.fail("the session's job_head was stopped after its tests had run: the tests that use it "
                        "must run one after the other (tests/conftest.py, _schedule_for_workers)", pytrace=False)
    elif other_tier:
        _JOB_HEAD.stop()
    yield


def pytest_sessionfinish(session, exitstatus):
    _SHARED_RAY.stop()


def _idle(ray, wait_s: float = 10.0) -> bool:
    """Every CPU of the head is free again (a module's actors and tasks have ended)."""
    import time

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) >= ray.cluster_resources().get("CPU", 0.0):
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def local_ray(request):
    """The session's loopback Ray head (``_SHARED_RAY``), shared by the tests of this module and the
    next modules that use it; the module's own classes (test server subclasses) travel to the
    workers by value. A module that leaves work holding CPUs hands on no head: it is stopped."""
    ray = _SHARED_RAY.start() if not _SHARED_RAY.running else __import__("ray")
    ray.cloudpickle.register_pickle_by_value(request.module)
    yield ray
    if _SHARED_RAY.running and not _idle(ray):
        _SHARED_RAY.stop()


@pytest.fixture
def fresh_ray(request):
    """A loopback Ray head of the test's own (tests that kill workers or fill the store)."""
    own = _LoopbackRay()
    ray = own.start()
    ray.cloudpickle.register_pickle_by_value(request.module)
    try:
        yield ray
    finally:
        own.stop()


@pytest.fixture(scope="session")
def pg_mlflow():
    """An MLflow tracking server backed by a real PostgreSQL database, on loopback, for the whole
    session (:class:`pg_server.PostgresMlflow`: ``initdb`` in a temporary directory, ``postgres``
    and ``mlflow server`` on free ports, both stopped by PID at the end). Yields ``{"uri": ...,
    "db_uri": ..., "seconds": {...}}``; each test uses its own experiment names."""
    from pg_server import PostgresMlflow

    srv = PostgresMlflow()
    try:
        srv.start()
        yield {"uri": srv.uri, "db_uri": srv.db_uri, "seconds": dict(srv.seconds)}
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def job_head(tmp_path_factory):
    """The address of a loopback Ray head started with ``ray start`` (:func:`jobs.cluster.local_head`,
    2 CPUs) for the tests that submit ``ray job submit`` jobs to it one at a time (a start costs ~5 s
    of CPU, 10-30 s under load, and a stop up to 5 s). They form one group of one worker
    (:func:`_schedule_for_workers`; in one process their modules run last,
    ``pytest_collection_modifyitems``), and the head stops after the last of them
    (:func:`_session_heads`) or with the session. A test that counts jobs counts those it
    submitted."""
    address = _JOB_HEAD.start(tmp_path_factory.mktemp("job-head") / "head.log")
    try:
        yield address
    finally:
        _JOB_HEAD.stop()
