"""The shipped LM debiasing spec (jobs/specs/lm-debias-example.yaml) end to end: every task
finished, bias and LM ability side by side in the report and in `audit compare`."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytestmark = pytest.mark.ray


def test_shipped_lm_debias_spec_runs_every_task_side_by_side(tmp_path, local_ray, monkeypatch, capsys):
    """jobs/specs/lm-debias-example.yaml: tiny BERT and GPT-2, each with INLP (en, de),
    SentenceDebias, Self-Debias, CDA and Dropout, SEAT + LPBS + (pseudo-)perplexity in en and de."""
    from pathlib import Path

    from jobs.compare_runs import compare_parents, find_parent
    from jobs.spec import load_spec
    from jobs.sweep import run_sweep
    from jobs.tracker import Tracker

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    spec = load_spec(repo / "jobs" / "specs" / "lm-debias-example.yaml", output_dir=tmp_path / "out")
    out = run_sweep(spec, progress=False)
    assert out.exit_code == 0 and out.failed == 0 and out.planned == out.ran == 56
    df = out.results
    assert set(df["status"]) == {"finished"}
    models = set(df["model"])
    assert {"tiny-bert+inlp-de", "tiny-gpt2+sentence_debias", "tiny-bert+self_debias", "tiny-gpt2+cda"} <= models
    # projections change SEAT only; Self-Debias the scores and the perplexity; CDA/Dropout everything
    got = df.groupby("model")["metric"].agg(lambda m: set(m))
    assert got["tiny-gpt2+inlp-en"] == {"seat"} and got["tiny-bert+self_debias"] == {"lpbs", "pseudo_perplexity"}
    assert got["tiny-gpt2+cda"] == {"seat", "lpbs_causal", "perplexity"}
    v = df.set_index(["model", "language", "metric"])["value"]
    assert v[("tiny-bert+inlp-en", "en", "seat")] != pytest.approx(v[("tiny-bert", "en", "seat")], abs=1e-6)
    assert v[("tiny-gpt2+self_debias", "de", "perplexity")] != pytest.approx(v[("tiny-gpt2", "de", "perplexity")],
                                                                            abs=1e-6)
    # the variants' revisions (hence audit.key) carry the fitted step; their results its provenance
    rev = df.set_index("model")["revision"]
    base_rev = rev["tiny-bert"].iloc[0]
    assert rev["tiny-bert+inlp-en"].iloc[0].startswith(base_rev + "+inlp:")
    assert rev["tiny-bert+inlp-en"].iloc[0] != rev["tiny-bert+inlp-de"].iloc[0]
    man = json.loads((tmp_path / "out" / "models" / "tiny-bert+inlp-de" / "lm_mitigation.json").read_text())
    assert man["provenance"]["pairs"]["language"] == "de" and man["provenance"]["corpus"]["digest"].startswith("sha256")
    # bias and LM ability side by side: the report file and the printed summary
    ba = pd.read_csv(out.report_dir / "bias_ability.csv")
    en = ba[ba["language"] == "en"].set_index("model")
    assert {"seat", "lpbs", "lpbs_causal", "perplexity", "pseudo_perplexity"} <= set(ba.columns)
    assert en.loc["tiny-gpt2+self_debias", "perplexity"] == pytest.approx(v[("tiny-gpt2+self_debias", "en",
                                                                             "perplexity")])
    assert "bias and LM ability (de)" in capsys.readouterr().out
    # audit compare: the original against its Self-Debias variant, bias and perplexity rows compared
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    parent = find_parent(tr.client, f"run:{out.parent_run_id}")
    cmp, _ = compare_parents(tr.client, parent, parent, model_a="tiny-gpt2", model_b="tiny-gpt2+self_debias",
                             n_bootstrap=50)
    rows = cmp.set_index(["language", "metric"])
    assert rows.loc[("en", "perplexity"), "status"] == "compared"
    assert rows.loc[("en", "perplexity"), "value_b"] == pytest.approx(v[("tiny-gpt2+self_debias", "en", "perplexity")])
    assert rows.loc[("en", "perplexity"), "value_a"] == pytest.approx(v[("tiny-gpt2", "en", "perplexity")])
    assert rows.loc[("de", "lpbs_causal"), "status"] == "compared"
