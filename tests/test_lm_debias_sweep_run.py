"""The shipped LM debiasing spec (jobs/specs/lm-debias-example.yaml) end to end: every task
finished, bias and LM ability side by side in the report and in `audit compare`."""

from __future__ import annotations

import json

import pandas as pd
import pytest

pytestmark = pytest.mark.ray

#: Tasks of the shipped spec (`audit run jobs/specs/lm-debias-example.yaml --dry-run` prints them).
N_TASKS = 228


def _recorded(registry, name):
    """A registered metric's recorded names (``crows_pairs`` and ``crows_pairs_causal``)."""
    return [name, *registry.get(name).result_names.values()]


def test_shipped_lm_debias_spec_runs_every_task_side_by_side(tmp_path, local_ray, monkeypatch, capsys):
    """jobs/specs/lm-debias-example.yaml: tiny BERT and GPT-2, each with INLP, SentenceDebias, CDA and
    Dropout fitted with en and with de pairs and corpora, and Self-Debias; WEAT + SEAT + LPBS on
    gender_career (en, de, fr), CrowS-Pairs (en, fr), BBQ (en, de) and (pseudo-)perplexity (en, de, fr).
    Every technique is audited on every family of the spec it applies to, in two pair languages."""
    from pathlib import Path

    from audit import registry
    from audit.lm_mitigation import TECHNIQUES, family_reason
    from jobs.compare_runs import compare_parents, find_parent
    from jobs.spec import load_spec
    from jobs.sweep import run_sweep
    from jobs.tracker import Tracker

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    spec = load_spec(repo / "jobs" / "specs" / "lm-debias-example.yaml", output_dir=tmp_path / "out")
    out = run_sweep(spec, progress=False)
    assert out.exit_code == 0 and out.failed == 0 and out.planned == out.ran == N_TASKS
    df = out.results
    assert set(df["status"]) == {"finished"}
    # each technique, with en and with de pairs (Self-Debias: its prompt), on each family it applies to
    fam = {r: registry.get(n).family.name for n in registry.names() for r in _recorded(registry, n)}
    fam = {m: fam[m] for m in set(df["metric_name"])}
    assert set(fam.values()) == {"association", "sentences", "lpbs", "sentence_pairs", "multiple_choice",
                                 "perplexity"}
    pair_languages: dict[str, set] = {}
    for m in spec.models:
        if not m.mitigated_from:
            continue
        tech, base = m.build["technique"], m.mitigated_from
        ran = df[df["model"] == m.name]
        base_ran = df[df["model"] == base]
        want = {(lang, x) for lang, x in zip(base_ran["language"], base_ran["metric_name"])
                if family_reason(tech, fam[x]) is None}
        assert set(zip(ran["language"], ran["metric_name"])) == want and want, m.name
        assert {fam[x] for _, x in want} == set(TECHNIQUES[tech].families) & set(fam.values()), m.name
        pair_languages.setdefault((base, tech), set()).add(m.build["language"])
    assert {t for _, t in pair_languages} == set(TECHNIQUES)
    for (base, tech), langs in pair_languages.items():
        assert langs == ({"en"} if tech == "self_debias" else {"en", "de"}), (base, tech)
    got = df.groupby("model")["metric"].agg(lambda m: set(m))
    assert got["tiny-gpt2+inlp-en"] == {"weat", "seat"}
    assert got["tiny-bert+self_debias"] == {"lpbs", "crows_pairs", "bbq", "pseudo_perplexity"}
    assert got["tiny-gpt2+cda-de"] == {"weat", "seat", "lpbs_causal", "crows_pairs_causal", "bbq", "perplexity"}
    v = df.set_index(["model", "language", "metric"])["value"]
    assert v[("tiny-bert+inlp-en", "en", "seat")] != pytest.approx(v[("tiny-bert", "en", "seat")], abs=1e-6)
    assert v[("tiny-gpt2+self_debias", "de", "perplexity")] != pytest.approx(v[("tiny-gpt2", "de", "perplexity")],
                                                                            abs=1e-6)
    assert v[("tiny-bert+sentence_debias-de", "de", "seat")] != pytest.approx(v[("tiny-bert", "de", "seat")],
                                                                             abs=1e-6)
    assert v[("tiny-bert+self_debias", "fr", "pseudo_perplexity")] != pytest.approx(
        v[("tiny-bert", "fr", "pseudo_perplexity")], abs=1e-6)
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
