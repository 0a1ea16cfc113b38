"""The security promises of ``SECURITY.md``, each checked for real:

- a model's own code (``trust_remote_code``) runs only for the model the spec flags, and never
  after a terminal prompt: without the flag the model is refused and its code never runs;
- pickle-based formats (gensim ``.kv``, ``pytorch_model.bin`` weights) are refused unless the
  spec allows them for that model: without the flag a booby-trapped pickle is never opened;
- the embedded Ray starts no dashboard and keeps Ray's token authentication (its gRPC ports
  listen on every interface, so a client without the token must be refused); the throw-away
  head of :func:`jobs.cluster.local_head` listens on loopback only;
- hub tokens come from the environment and end up nowhere: a fake ``HF_TOKEN`` planted in the
  environment is absent from the MLflow store (SQLite file and artifacts), the output
  directory (write-ahead log, Parquet, run log), the terminal output and Ray's session logs
  after a sweep and an ``audit score``; a spec cannot interpolate ``${HF_TOKEN}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import time
from pathlib import Path

import pytest

from actors.model_actor import ModelServer
from jobs import cli
from audit.datasets import load_test
from jobs.spec import load_spec

from audit.tiny_models import tiny_model_dir  # noqa: E402

FAKE_TOKEN = "hf_biasauditFAKEtoken0123456789abcdefXYZ"


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


def serve(spec, name: str, test_name: str = "weat1", metric: str = "weat"):
    """Measure one task in-process on the model ``name`` of ``spec``, with exactly the options
    the spec gives it (what its Ray actor would do)."""
    from actors.model_actor import MeasureRequest

    m = spec.model(name)
    server = ModelServer(m.name, m.ref, m.ref, dict(m.options))
    (o,) = server.measure_batch([MeasureRequest(index=0, test=test_name, metric=metric, params={"max_missing": 1.0})],
                                {test_name: load_test(test_name)})
    return o


# --------------------------------------------------------------------------------------
# A model's own code
# --------------------------------------------------------------------------------------


@pytest.fixture
def remote_code_model(tmp_path) -> tuple[Path, Path]:
    """A tiny BERT whose config points at its own Python code (``auto_map``); importing that
    code writes a marker file, which is how the test sees whether it ran."""
    d = tmp_path / "remote-model"
    shutil.copytree(tiny_model_dir("bert"), d)
    marker = tmp_path / "REMOTE_CODE_RAN"
    cfg = json.loads((d / "config.json").read_text())
    cfg.update({"model_type": "biasaudit-remote", "architectures": ["RemoteBertModel"],
                "auto_map": {"AutoConfig": "configuration_remote.RemoteConfig",
                             "AutoModel": "modeling_remote.RemoteBertModel"}})
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "configuration_remote.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertConfig\n\n\nclass RemoteConfig(BertConfig):\n    model_type = 'biasaudit-remote'\n")
    (d / "modeling_remote.py").write_text(
        "from transformers import BertModel\nfrom .configuration_remote import RemoteConfig\n\n\n"
        "class RemoteBertModel(BertModel):\n    config_class = RemoteConfig\n")
    return d, marker


@pytest.mark.unit
def test_remote_code_runs_only_for_the_model_the_spec_flags(remote_code_model, tmp_path, monkeypatch):
    d, marker = remote_code_model
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    refusal = (f"model '{d}' ships its own Python code (auto_map in its config), which runs on loading; allow it "
               "explicitly with trust_remote_code=True (spec: `trust_remote_code: true` on this model; audit score: "
               "--trust-remote-code) after reviewing that code")
    # audit score without --trust-remote-code: refused in one line, no prompt, the code never ran
    code, out, err = run_cli(["score", "--model", str(d), "--test", "weat1", "--metric", "weat"])
    assert (code, err.strip()) == (2, f"audit: error: {refusal}") and "[y/N]" not in out + err
    assert not marker.exists()
    # a spec with the same model twice: only the flagged one may run its code
    spec_path = tmp_path / "remote.yaml"
    spec_path.write_text(f"""name: remote
languages: [en]
tests: [weat1]
metrics: [weat]
models:
  - {{name: plain, ref: "{d}"}}
  - {{name: trusted, ref: "{d}", trust_remote_code: true}}
""")
    spec = load_spec(spec_path)
    assert "trust_remote_code" not in spec.model("plain").options
    o = serve(spec, "plain")
    assert o.error == f"model '{d}' could not be loaded: UnsafeModelError: {refusal}"
    assert not marker.exists()
    o = serve(spec, "trusted")
    assert o.error is None and o.measurement is not None and marker.read_text() == "ran"


# --------------------------------------------------------------------------------------
# Pickle-based formats
# --------------------------------------------------------------------------------------


class _Booby:
    """Unpickling this writes a file: the harmless stand-in for arbitrary code in a pickle."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "unpickled"))


@pytest.mark.unit
def test_pickle_models_are_refused_unless_allowed_for_that_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PICKLE_RAN"
    (tmp_path / "trap.kv").write_bytes(pickle.dumps(_Booby(marker)))
    # a Hugging Face folder whose weights are a torch pickle only
    import torch
    from safetensors.torch import load_file

    hf = tmp_path / "pickle-bert"
    shutil.copytree(tiny_model_dir("bert"), hf)
    torch.save(load_file(hf / "model.safetensors"), hf / "pytorch_model.bin")
    (hf / "model.safetensors").unlink()

    code, out, err = run_cli(["score", "--model", "trap.kv", "--test", "weat1", "--metric", "weat"])
    assert code == 2 and err.strip() == (
        "audit: error: model 'trap.kv' (trap.kv) is a gensim KeyedVectors/model file, a Python pickle: loading it can "
        "run arbitrary code. Pass allow_pickle=True (allow_pickle: true in the model spec, --allow-pickle on the "
        "command line) only for a file you trust, or convert it once with KeyedVectors.save_word2vec_format and load "
        "the word2vec file instead")
    assert not marker.exists()
    code, out, err = run_cli(["score", "--model", str(hf), "--test", "weat1", "--metric", "weat"])
    assert code == 2 and err.strip() == (
        f"audit: error: model '{hf}' has only pickle weights (pytorch_model.bin) in directory '{hf}'; loading pickle "
        "can run arbitrary code. Convert it to safetensors, or allow it explicitly with allow_pickle=True (spec: "
        "`allow_pickle: true` on this model).")
    code, out, err = run_cli(["score", "--model", "wefe-test-model", "--test", "weat1", "--metric", "weat"])
    assert code == 2 and err.startswith("audit: error: model 'wefe-test-model' (") and "a Python pickle" in err

    spec_path = tmp_path / "pickle.yaml"
    spec_path.write_text(f"""name: pickles
languages: [en]
tests: [weat1]
metrics: [weat]
models:
  - {{name: trap, ref: trap.kv}}
  - {{name: trap-allowed, ref: trap.kv, allow_pickle: true}}
  - {{name: bert-pickle, ref: "{hf}"}}
  - {{name: bert-pickle-allowed, ref: "{hf}", allow_pickle: true}}
""")
    spec = load_spec(spec_path)
    o = serve(spec, "trap")
    assert o.error.startswith("model 'trap.kv' could not be loaded: UnsafeModelError:") and not marker.exists()
    assert serve(spec, "bert-pickle").error.startswith(f"model '{hf}' could not be loaded: UnsafeModelError:")
    assert not marker.exists()
    # allowed for that model only: then the pickle is opened (and its code runs: the flag is the gate)
    o = serve(spec, "trap-allowed")
    assert marker.read_text() == "unpickled" and o.error.startswith("model 'trap.kv' could not be loaded: ModelError:")
    o = serve(spec, "bert-pickle-allowed")
    assert o.error is None and o.measurement is not None


# --------------------------------------------------------------------------------------
# Ray: no dashboard, token authentication, loopback head
# --------------------------------------------------------------------------------------


def _listening_sockets(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets the processes ``pids`` listen on (Linux /proc)."""
    state = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # LISTEN
                state[f[9]] = f[1]
    out = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = link[8:-1] if link.startswith("socket:[") else None
            if inode in state:
                hexip, hexport = state[inode].split(":")
                if len(hexip) == 8:
                    ip = ".".join(str(int(hexip[i:i + 2], 16)) for i in (6, 4, 2, 0))
                elif hexip.startswith("0000000000000000FFFF0000"):  # IPv4-mapped IPv6
                    ip = ".".join(str(int(hexip[24:][i:i + 2], 16)) for i in (6, 4, 2, 0))
                else:
                    ip = "::" if set(hexip) == {"0"} else hexip
                out.add((ip, int(hexport, 16)))
    return out


def _process_group(pgid: int) -> set[int]:
    pids = set()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                    pids.add(int(p))
            except (OSError, IndexError, ValueError):
                continue
    return pids


def _embedded_ray_checks() -> None:
    """Run in a process of its own by the test below (``python -c``): a process that started a
    token-authenticated Ray keeps that mode in Ray's native configuration, so a later loopback head
    of the same process (``RAY_AUTH_MODE=disabled``) would start its GCS with tokens and refuse its
    own driver."""
    import grpc
    import ray
    from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from jobs.spec import parse_spec
    from jobs.sweep import _init_ray

    assert "RAY_AUTH_MODE" not in os.environ  # what a user's shell has
    spec = parse_spec({"name": "sec", "models": ["x.vec"], "metrics": ["weat"], "ray": {"num_cpus": 1}})
    assert _init_ray(spec, None)
    try:
        assert os.environ.get("RAY_AUTH_MODE") != "disabled"  # the driver does not switch authentication off
        info = ray.init(ignore_reinit_error=True).address_info  # (connected: this session's addresses)
        assert not info.get("webui_url")  # no dashboard at all
        assert get_authentication_mode() == AuthenticationMode.TOKEN
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(grpc.insecure_channel(info["gcs_address"]))
        try:
            stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=20)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAUTHENTICATED, e.code()
        else:
            raise AssertionError("the GCS answered a client without the token")
        token = AuthenticationTokenLoader.instance().get_raw_token(ignore_auth_mode=True)
        ok = stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=20,
                                 metadata=[("authorization", f"Bearer {token}")])
        assert len(ok.node_info_list) == 1  # the positive control: the same call with the token
    finally:
        ray.shutdown()


@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_embedded_ray_has_no_dashboard_and_refuses_clients_without_the_token(tmp_path):
    import subprocess
    import sys

    here = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}  # what a user's shell has
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), str(here), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", "import test_security as t; t._embedded_ray_checks(); print('ok')"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.ray
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_local_head_listens_on_loopback_only(tmp_path):
    from jobs.cluster import local_head

    with local_head(num_cpus=1, log_path=tmp_path / "head.log") as address:
        assert address.startswith("http://127.0.0.1:")
        port = int(address.rsplit(":", 1)[1])
        heads = set()
        for p in os.listdir("/proc"):
            try:
                args = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--head" in args and b"--dashboard-port" in args and str(port).encode() in args:
                heads.add(os.getpgid(int(p)))
        (pgid,) = heads  # `ray start` runs in its own process group with every process it starts
        # the job API answers before every agent of the head listens (under load, seconds later):
        # look until at least four sockets listen, each of them on loopback every time
        deadline = time.monotonic() + 120
        while True:
            sockets = _listening_sockets(_process_group(pgid))
            assert {ip for ip, _ in sockets} <= {"127.0.0.1"}, sockets
            if len(sockets) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert ("127.0.0.1", port) in sockets  # the dashboard / job API
    assert len(sockets) >= 4 and {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets


# --------------------------------------------------------------------------------------
# Hub tokens
# --------------------------------------------------------------------------------------


def _files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.ray
def test_hub_token_is_never_logged_or_stored(tmp_path, monkeypatch, capfd):
    import ray
    from jobs.sweep import run_sweep
    from jobs.wal import sync_spec

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    bert = tiny_model_dir("bert")
    out_dir = tmp_path / "out"
    spec_path = tmp_path / "tok.yaml"
    spec_path.write_text(f"""name: tok
output_dir: {out_dir}
permutations: 100
n_bootstrap: 10
languages: [en]
tests: [weat1, weat7]
metrics: [weat, {{name: seat, tests: [weat7]}}]
models:
  - {{name: ft, build: {{kind: fasttext, dim: 8, epoch: 1}}}}
  - {{name: bert, ref: "{bert}", backend: hf-mlm}}
ray: {{num_cpus: 2, actor_num_cpus: 0.5, stats_num_cpus: 1}}
""")
    spec = load_spec(spec_path)
    if ray.is_initialized():
        ray.shutdown()
    # this test's own local Ray (started with the token in the environment, as a user's would
    # be), so that its session logs can be scanned too
    started = ray.init(address="local", num_cpus=2, object_store_memory=100_000_000, include_dashboard=False)
    session = Path(started.address_info["session_dir"])
    try:
        outcome = run_sweep(spec, progress=False)
    finally:
        ray.shutdown()
    assert outcome.exit_code == 0 and outcome.planned == outcome.ran == 5
    assert sync_spec(spec, quiet=True).pending == 0
    code, out, err = run_cli(["score", "--model", str(bert), "--backend", "hf-mlm", "--test", "weat7",
                              "--metric", "seat", "--permutations", "100", "--n-bootstrap", "10",
                              "--items", str(tmp_path / "items.parquet"), "--format", "json"])
    assert code == 0, err
    (tmp_path / "score.json").write_text(out)
    printed = capfd.readouterr()
    (tmp_path / "terminal.txt").write_text(printed.out + printed.err)

    token = FAKE_TOKEN.encode()
    names = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"mlflow.db", "wal.jsonl", "run.log", "results.parquet", "items.parquet", "terminal.txt", "score.json",
            "result.json", "items.json", "spec.yaml", "loads.jsonl"} <= names
    # the scan sees what the store holds: the positive control is a run's audit.key in the SQLite
    # store's files (the database and its write-ahead journal, jobs.tracker.seed_sqlite_store)
    key = outcome.results["key"].iloc[0].encode()
    store = b"".join(p.read_bytes() for p in out_dir.glob("mlflow.db*") if p.is_file())
    assert key in store and key in (out_dir / "wal.jsonl").read_bytes()
    assert _files_containing(tmp_path, token) == []
    logs = [p for p in session.rglob("*") if p.is_file()]
    assert logs and _files_containing(session, token) == []


@pytest.mark.unit
def test_a_spec_cannot_interpolate_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text('name: s\nmodels: ["${HF_TOKEN}/x.vec"]\nmetrics: [weat]\n')
    code, out, err = run_cli(["run", "s.yaml", "--dry-run"])
    assert code == 2 and FAKE_TOKEN not in out + err
    assert err.strip() == (
        "audit: error: s.yaml: models[0]: ${HF_TOKEN} looks like a secret; specs and their values are stored with "
        "every sweep, so secrets cannot be interpolated (hub tokens are read from HF_TOKEN by the libraries that "
        "need them)")
    # the one exception: a database password in tracking.uri, which is only ever shown redacted
    monkeypatch.setenv("BIASAUDIT_DB_PASSWORD", FAKE_TOKEN)
    (tmp_path / "db.yaml").write_text('name: s\ntracking: {uri: "postgresql://mlflow:${BIASAUDIT_DB_PASSWORD}@db/mlflow"}\n'
                                      'models: ["x.vec"]\nmetrics: [weat]\ntests: [weat1]\nlanguages: [en]\n')
    code, out, err = run_cli(["run", "db.yaml", "--dry-run"])
    assert code == 0 and "tracking: postgresql://***@db/mlflow (experiment biasaudit-s)" in out
    assert FAKE_TOKEN not in out + err
