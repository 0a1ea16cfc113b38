"""The sentence-transformers engine (audit/backends/st.py): SEAT and the word metrics on an
embedding model with its own configured modules, cross-checked against SentenceTransformer.encode
and against the Hugging Face engine's pooling of the same weights."""

from __future__ import annotations

import numpy as np
import pytest

from audit import runner, tiny_models
from audit.backends.hf import load_hf_model
from audit.errors import DataError, ModelError, ParameterError
from audit.provenance import load_key
from audit.measure.contextual import ContextualWordVectors, seat_sentences
from audit.datasets import load_test
from jobs.resolve import model_kind, probe_revision, resolve_ref


def _st(path):
    """``SentenceTransformer(path, device="cpu")``, the reference encoder, imported where it is
    used: only the pytest worker that runs these tests pays for importing the package."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SENTENCES = ["This is a rose.", "A tulip grew there.", "Here is an insect.", "The spider is here, near the wall."]


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory):
    return str(tiny_models.build_tiny_st(tmp_path_factory.mktemp("st")))


@pytest.fixture(scope="module")
def minilm_path():
    return runner.resolve_packaged("minilm")


@pytest.mark.unit
def test_tiny_model_embeds_as_sentence_transformers_does(tiny_st):
    m = runner.load_model("st:" + tiny_st)
    assert (m.kind, m.backend, m.handle.dim) == ("sentence", "sentence-transformers", 8)
    assert [type(x).__name__ for x in m.handle.encoder] == ["Transformer", "Pooling", "Dense", "Normalize"]
    got = m.handle.embed(SENTENCES, batch_size=3)
    ref = _st(tiny_st).encode(SENTENCES, convert_to_numpy=True)
    assert got.dtype == np.float32 and got.shape == (4, 8)
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)  # Normalize applied
    # a second build with the same seed is the same model (revision = folder digest of identical files)
    assert m.revision.startswith("sha256:")


@pytest.mark.unit
def test_minilm_uses_its_own_pooling_and_normalisation(minilm_path):
    m = runner.load_model("st:minilm")
    assert m.kind == "sentence" and m.handle.path == minilm_path
    items = seat_sentences(load_test("weat7"), "model")
    sents = list(items["sentence"])[:40]
    got = m.handle.embed(sents, batch_size=16)
    ref = _st(minilm_path).encode(sents, convert_to_numpy=True)
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)
    # the same weights through the Hugging Face engine: mean pooling (special tokens included), then L2
    hf = load_hf_model(minilm_path, kind="encoder")
    mean = hf.embed(sents, method="mean", batch_size=16).astype(np.float64)
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean, axis=1, keepdims=True), atol=1e-5, rtol=0)
    cls = hf.embed(sents, method="cls", batch_size=16)
    assert np.abs(cls - got).max() > 0.1  # the HF default (cls, unnormalised) is another representation


@pytest.mark.unit
def test_seat_and_word_metrics_run_on_the_engine(tiny_st):
    model = runner.load_model("st:" + tiny_st)
    seat = runner.score(model, "weat7", "seat", {"permutations": 200}, seed=1)
    assert seat.metric == "seat" and np.isfinite(seat.value) and -2 <= seat.value <= 2
    weat = runner.score(model, "weat7", "weat", {"permutations": 200}, seed=1)
    assert np.isfinite(weat.value)
    # the word vectors are the encoded template sentences averaged (Dusi et al.), by the model's modules
    wv = ContextualWordVectors(model.handle, method="model", templates=["This is WORD.", "WORD is there."])
    enc = _st(tiny_st).encode(["This is rose.", "rose is there."])
    np.testing.assert_allclose(wv.lookup(["rose"]).vectors["rose"], enc.astype(np.float64).mean(0), atol=1e-6)
    assert seat.provenance["backend"] == "sentence-transformers" and seat.provenance["revision"] == model.revision


@pytest.mark.unit
def test_refusals_are_one_line(tiny_st, tmp_path):
    m = runner.load_model("st:" + tiny_st).handle
    with pytest.raises(ParameterError, match=r"^method: model .* configured modules only"):
        m.embed(["a b"], method="cls")
    with pytest.raises(ParameterError, match=r"^layer: "):
        m.embed(["a b"], layer=2)
    with pytest.raises(DataError, match=r"accepts at most"):
        m.embed([" ".join(["word"] * 2000)])
    with pytest.raises(ModelError, match=r"sentence-transformers embedding model .*log-likelihood needs"):
        m.loglikelihood([("a", " b")])
    with pytest.raises(ModelError, match=r"has no modules.json"):
        runner.load_model("st:" + str(tiny_models.tiny_model_dir("bert")))
    with pytest.raises(ModelError, match=r"is not a local folder"):
        runner.load_model("st:" + str(tmp_path / "nothing"))
    hf = load_hf_model(tiny_models.tiny_model_dir("bert"), kind="mlm")
    with pytest.raises(ParameterError, match=r"method: 'model' .* needs a sentence-transformers model"):
        hf.embed(["a b"], method="model")


@pytest.mark.unit
def test_planner_knows_the_engine_without_loading(tiny_st, minilm_path):
    assert model_kind("st:minilm") == "sentence"
    assert model_kind(minilm_path) == "encoder"  # a folder with modules.json stays a HF checkpoint unless named
    assert model_kind(minilm_path, backend="sentence-transformers") == "sentence"
    local = resolve_ref("st:minilm")
    assert local == "st:" + minilm_path
    assert probe_revision(local, "sentence") == runner.load_model("st:minilm").revision
    m = runner.load_model(tiny_st, backend="sentence-transformers")
    assert m.kind == "sentence" and probe_revision("st:" + tiny_st, "sentence") == m.revision
    # the same folder through the two engines: different numbers, so different keys (the load component)
    assert m.load == load_key({"backend": "sentence-transformers"}) == "engine=sentence-transformers"
    assert load_key({"backend": "hf-encoder"}) == load_key({}) == "" and runner.load_model("st:" + tiny_st).load == ""
    both = load_key({"dtype": "bfloat16", "backend": "sentence-transformers"})
    assert both == "dtype=bfloat16,engine=sentence-transformers"
    with pytest.raises(ParameterError, match=r"^dtype: model 'st:.*' is a sentence-transformers model"):
        runner.load_model("st:" + tiny_st, dtype="bfloat16")
