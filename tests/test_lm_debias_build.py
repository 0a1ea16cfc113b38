"""CDA / Dropout checkpoints: trained once, keyed on base revision + parameters + corpus digest."""

from __future__ import annotations

import json

import pytest

from audit import runner, tiny_models
from audit.datasets.corpus import corpus_from_tests
from audit.errors import DataError, ParameterError
from jobs import lm_builders

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    p = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    p.write_text("\n".join(corpus_from_tests(["en"], seed=0, sentences_per_word=2)["en"][:400]) + "\n",
                 encoding="utf-8")
    return p


def test_cda_checkpoint_is_built_once_and_keyed(tmp_path, corpus, monkeypatch):
    base = tiny_models.tiny_model_dir("bert")
    calls = []
    real = lm_builders.further_pretrain
    monkeypatch.setattr(lm_builders, "further_pretrain", lambda *a, **k: calls.append(k) or real(*a, **k))
    kw = dict(kind="mlm", technique="cda", corpus=corpus, params={"steps": 2, "batch_size": 4})
    out = lm_builders.build_lm_debiased(tmp_path, "bert+cda", base, **kw)
    rec = json.loads((out / "mitigation.json").read_text())
    assert rec["base_revision"].startswith("sha256:") and rec["corpus_digest"].startswith("sha256:")
    assert rec["params"]["steps"] == 2 and len(rec["losses"]) == 2 and rec["provenance"]["technique"] == "cda"
    assert rec["provenance"]["augmented"]["n_sentences"] > 50
    assert lm_builders.build_lm_debiased(tmp_path, "bert+cda", base, **kw) == out
    assert len(calls) == 1  # resumed: not retrained
    lm_builders.build_lm_debiased(tmp_path, "bert+cda", base, **{**kw, "params": {"steps": 3, "batch_size": 4}})
    assert len(calls) == 2  # another parameter: retrained
    # the debiased checkpoint is audited like any model, its LM ability beside the original's
    (tmp_path / "h.txt").write_text("the man said that he would call his sister .\nthe roads were icy .\n")
    (tmp_path / "h.yaml").write_text("name: h\nlanguage: en\nformat: text\ndata: ./h.txt\n")
    r0 = runner.score(str(base), str(tmp_path / "h.yaml"), "perplexity")
    r1 = runner.score(str(out), str(tmp_path / "h.yaml"), "perplexity")
    assert r0.metric == r1.metric == "pseudo_perplexity" and r0.value != r1.value
    assert r0.fields["n_tokens"] == r1.fields["n_tokens"]


def test_dropout_checkpoint_and_bad_input(tmp_path, corpus):
    base = tiny_models.tiny_model_dir("gpt2")
    out = lm_builders.build_lm_debiased(tmp_path, "gpt2+dropout", base, kind="causal", technique="dropout",
                                        corpus=corpus, params={"steps": 1, "batch_size": 2})
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["resid_pdrop"] == cfg["embd_pdrop"] == cfg["attn_pdrop"] == 0.15
    with pytest.raises(ParameterError, match="technique 'inlp' is not trained"):
        lm_builders.build_lm_debiased(tmp_path, "x", base, kind="causal", technique="inlp", corpus=corpus)
    with pytest.raises(ParameterError, match=r"^cda: epochs: unknown field; allowed fields: "
                                                "batch_size, lr, max_length, seed, steps$"):
        lm_builders.build_lm_debiased(tmp_path, "x", base, kind="causal", technique="cda", corpus=corpus,
                                      params={"epochs": 1})
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(DataError, match="empty.txt: the corpus has no sentences"):
        lm_builders.build_lm_debiased(tmp_path, "x", base, kind="causal", technique="cda",
                                      corpus=tmp_path / "empty.txt")
