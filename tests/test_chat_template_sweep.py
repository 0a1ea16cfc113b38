"""jobs/specs/chat-template-example.yaml run for real: one instruct-style tiny model audited with and
without its chat template in one sweep, both recorded (the template's digest and the system
instruction in the chat runs), then compared task by task by ``audit compare run:... run:...``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.datasets.external import data_root
from jobs import cli as jobs_cli
from jobs.spec import load_spec
from jobs.sweep import run_sweep
from jobs.tracker import Tracker

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "jobs" / "specs" / "chat-template-example.yaml"
DATA = data_root()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not (DATA / "bbq" / "en").is_dir(), reason="BBQ data absent")]


def test_with_and_without_the_template_in_one_sweep_then_compared(tmp_path, local_ray, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "out"
    text = SPEC.read_text(encoding="utf-8").replace("output_dir: out/chat-template", f"output_dir: {out}")
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    res = run_sweep(load_spec(path), progress=False)
    assert res.exit_code == 0 and res.ran == 6 and res.failed == 0
    df = res.results.set_index(["model", "metric"])
    assert set(df.index) == {(m, x) for m in ("tiny-instruct", "tiny-instruct-chat")
                             for x in ("crows_pairs_causal", "bbq", "bbq_generate")}

    uri = f"sqlite:///{out}/mlflow.db"
    tr = Tracker(uri, "biasaudit-chat-template")
    parent = tr.sweep_runs()[0].info.run_id
    children = tr.client.search_runs([tr.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    by = {(c.data.tags["audit.model"], c.data.tags["audit.metric"]): c for c in children}
    chat = by[("tiny-instruct-chat", "crows_pairs_causal")].data.params
    plain = by[("tiny-instruct", "crows_pairs_causal")].data.params
    assert chat["param.chat_template"] == "true" and "param.chat_template" not in plain
    assert by[("tiny-instruct-chat", "crows_pairs_causal")].data.tags["audit.key"] != \
        by[("tiny-instruct", "crows_pairs_causal")].data.tags["audit.key"]
    recorded = {**by[("tiny-instruct-chat", "bbq")].data.params, **by[("tiny-instruct-chat", "bbq")].data.tags}
    assert recorded["chat_template_digest"].startswith("sha256:") and json.loads(
        recorded["param.system_instruction"]) == "Answer the question with one of the options."
    assert "chat_template_digest" not in by[("tiny-instruct", "bbq")].data.params
    gen = by[("tiny-instruct-chat", "bbq_generate")].data.metrics
    assert gen["n_unparseable"] + gen["n_non_unknown_amb"] + gen["n_non_unknown_disamb"] <= gen["n_items"] == 4

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["compare", f"run:{parent}", f"run:{parent}", "--model-a", "tiny-instruct", "--model-b",
            "tiny-instruct-chat", "--tracking-uri", uri, "--experiment", "biasaudit-chat-template", "--format", "json"]
    capsys.readouterr()  # the sweep's own output
    assert jobs_cli.main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {(c["test"], c["metric"]): c for c in doc["comparisons"]}
    cp = rows[("crows_pairs", "crows_pairs_causal")]
    assert cp["status"] == "compared" and cp["n_items"] == 24
    a, b = df.loc[("tiny-instruct", "crows_pairs_causal"), "value"], df.loc[("tiny-instruct-chat",
                                                                                "crows_pairs_causal"), "value"]
    assert cp["delta"] == pytest.approx(b - a)
    assert rows[("bbq", "bbq")]["status"] == "not comparable"
