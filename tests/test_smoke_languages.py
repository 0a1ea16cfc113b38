"""The eight-language smoke sweep (jobs/specs/smoke-languages.yaml): one tiny fastText model per
language trained on the text built from that language's shipped word lists, audited with WEAT and
SAME on every shipped test of its language; one multilingual tiny Llama-style causal LM audited on
every word test of every language with every family that applies to it (WEAT, SAME, SEAT, causal
LPBS, CrowS-Pairs in English, revised English, French and Dutch); a tiny masked LM and a tiny causal
LM on HONEST in every language with templates and on the BBQ family where its data is found;
finishes with no failed task."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.catalog import list_tests  # noqa: E402
from audit.datasets import SUPPORTED_LANGUAGES  # noqa: E402
from jobs.spec import load_spec  # noqa: E402
from jobs.sweep import run_sweep  # noqa: E402

pytestmark = pytest.mark.ray

SPEC = Path(__file__).resolve().parents[1] / "jobs" / "specs" / "smoke-languages.yaml"


def test_every_language_every_test_finishes(tmp_path, local_ray):
    spec = load_spec(SPEC, output_dir=str(tmp_path / "out"))
    out = run_sweep(spec, progress=False)
    tests = list_tests()
    available = tests[tests.available]
    n = {m: int(available.metrics.str.contains(rf"\b{m}\b").sum()) for m in ("weat", "seat", "lpbs", "crows_pairs")}
    assert n["crows_pairs"] == 4  # en, en revised, fr, nl
    fasttext = n["weat"] * 2  # weat and same on every shipped word test
    llama = n["weat"] * 2 + n["seat"] + n["lpbs"] + n["crows_pairs"]
    honest = tests[tests.metrics == "honest"]
    bbq = tests[tests.metrics.str.contains(r"\bbbq\b") & tests.available]  # listed with bbq_generate too  # nl/tr (MBBQ) only with BIASAUDIT_MBBQ
    lms = 2 * len(honest) + 2 * len(bbq)  # HONEST and BBQ on a masked and a causal tiny LM
    assert out.exit_code == 0
    assert out.planned == fasttext + llama + lms and out.ran == out.planned and out.failed == 0
    assert out.loads == 11
    df = out.results
    assert (df["status"] == "finished").all()
    assert set(SUPPORTED_LANGUAGES) == {"en", "de", "nl", "it", "nb", "is", "tr", "fr", "es", "ca", "pt", "ro"}
    causal = df[df["model"] == "tiny-llama-multi"]
    assert len(causal) == llama
    # a causal model in every language with word tests, with every family that has data there
    fam = causal.groupby("language")["metric"].agg(set)
    for lang in ("en", "de", "nl", "it", "nb", "is", "tr", "fr"):
        assert {"weat", "same", "seat", "lpbs_causal"} <= fam[lang], lang
    assert {lang for lang, ms in fam.items() if "crows_pairs_causal" in ms} == {"en", "fr", "nl"}
    # the per-language text covers every test word (fastText) and every word has its template
    # sentences (the causal LM): full coverage everywhere
    words = df[df["metric"].isin(["weat", "same"])]
    assert words["coverage_min"].notna().all() and (words["coverage_min"] == 1.0).all()
    # HONEST in the eleven languages with templates, on a masked and a causal LM
    h = df[df.metric == "honest"]
    assert set(h["language"]) == set(SUPPORTED_LANGUAGES) - {"ca"} and set(h["model"]) == {"tiny-bert", "tiny-gpt2"}
    assert h["value"].between(0, 1).all() and (h["n_items"] > 400).all()
    b = df[df.metric == "bbq"]
    assert set(b["test"]) == set(bbq.name) and b["value"].between(-1, 1).all()
    assert set(b["model"]) == {"tiny-bert", "tiny-gpt2"}
