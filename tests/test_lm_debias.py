"""LM debiasing (audit.lm_mitigation) cross-checked against bias-bench on tiny models.

The reference is tests/bias_bench_ref.py, a transcription of McGill-NLP/bias-bench at 291426a
(files named there). Tolerances: INLP projection and SentenceDebias subspace/projections 1e-6;
CDA token for token; Self-Debias masked 1e-6 (measured 4.8e-7), causal 1e-5 on log-probabilities
(measured 1.9e-6 on values near -10, i.e. float32 rounding; the probabilities agree to 4e-8):
bias-bench runs the regular and the prompted inputs in one left-padded batch, biasaudit each input
unpadded, so the float32 sums over attention positions are ordered differently.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import bias_bench_ref as ref
from audit import tiny_models
from audit.errors import DataError, ParameterError
from audit.lm_mitigation import TECHNIQUES, check_applicable
from audit.lm_mitigation.cda import augment_corpus
from audit.lm_mitigation.inlp import inlp_projection, labels_for, mean_last_hidden, split_dataset
from audit.lm_mitigation.pairs import derive_pairs, load_pairs, with_punctuation
from audit.lm_mitigation.self_debias import DEBIASING_PREFIXES, causal_logprobs, masked_logprobs, rescale
from audit.lm_mitigation.sentence_debias import bias_direction, counterfactual_pairs, mean_pooled, project_out

pytestmark = pytest.mark.unit

#: The first gender pairs of bias-bench's data/bias_attribute_words.json (male, female).
BB_GENDER = [["actor", "actress"], ["boy", "girl"], ["brother", "sister"], ["he", "she"], ["him", "her"],
             ["his", "her"], ["man", "woman"], ["father", "mother"], ["son", "daughter"]]

CORPUS = [
    "the man said that he would call his sister tomorrow .",
    "she thanked him, and the boy laughed.",
    "my father is an actor; his son is not!",
    "nothing here mentions anyone at all today .",
    "The Man and the woman met her brother: he smiled?",
    "a girl and a boy and another boy played with the daughter of the actress .",
    "the weather was cold and the roads were icy .",
    "her mother told the man about his new job .",
]


# ------------------------------------------------------------------------------ pairs
def test_pairs_derived_from_the_shipped_tests_per_language():
    en = derive_pairs("en")
    assert ("man", "woman") in en.pairs and ("he", "she") in en.pairs and ("husband", "wife") in en.pairs
    assert en.provenance["tests"] == ["en/cw4", "en/cw5", "en/gender_math", "en/gender_science", "en/weat7",
                                      "en/weat8"]
    de = derive_pairs("de")
    assert de.pairs[:3] == (("Mann", "Frau"), ("Junge", "Mädchen"), ("Bruder", "Schwester"))
    assert ("Brüder", "Schwestern") in de.pairs  # plural from the test's forms
    # Mädchen is its own plural: the plural pair Jungen/Mädchen conflicts and is recorded, not used
    assert "de/cw4: Jungen/Mädchen" in de.provenance["conflicts"]
    assert all(("Jungen", "Mädchen") != p for p in de.pairs)
    words = de.words()
    assert len(words) == len(set(words)) == 2 * len(de.pairs)
    with pytest.raises(ParameterError, match="'es'.*no shipped word test has paired gender terms"):
        derive_pairs("es")
    with pytest.raises(ParameterError, match="bias_type 'race'.*gender, age, nationality only"):
        derive_pairs("en", "race")


def test_pairs_file_in_bias_bench_format(tmp_path):
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"gender": BB_GENDER, "race": [["black", "caucasian", "asian"]]}))
    assert load_pairs(p, "gender").pairs[0] == ("actor", "actress")
    assert load_pairs(p, "race").pairs == (("black", "caucasian", "asian"),)
    with pytest.raises(DataError, match=r"w.json: no field 'religion'"):
        load_pairs(p, "religion")
    p.write_text(json.dumps({"gender": [["a", "b"], ["c"]]}))
    with pytest.raises(DataError, match=r"gender\[1\] must be a list of 2 single words"):
        load_pairs(p, "gender")


def test_registry_says_where_each_technique_applies():
    assert set(TECHNIQUES) == {"inlp", "sentence_debias", "self_debias", "cda", "dropout"}
    check_applicable("inlp", "mlm", "sentences")
    check_applicable("self_debias", "causal", "sentence_pairs")
    with pytest.raises(ParameterError, match="inlp does not apply to the sentence_pairs family: it changes "
                                             "representations"):
        check_applicable("inlp", "mlm", "sentence_pairs")
    with pytest.raises(ParameterError, match="self_debias does not apply to encoder models"):
        check_applicable("self_debias", "encoder", "sentences")


# ------------------------------------------------------------------------------ CDA
@pytest.mark.parametrize("lang", ["bias-bench", "en", "de"])
def test_cda_equals_bias_bench_token_for_token(lang):
    pairs = BB_GENDER if lang == "bias-bench" else [list(p) for p in derive_pairs(lang).pairs]
    corpus = CORPUS + ["der Mann und seine Brüder, die Frau.", "Die Schwestern. Der Vater! die Mutter?"]
    expected = ref.gender_counterfactual_augmentation_text(
        corpus, ref._create_bias_attribute_words({"gender": pairs}, "gender"))
    got = augment_corpus(corpus, pairs)
    assert got == expected
    assert len(with_punctuation(pairs)) == 7 * len(pairs)


def test_cda_known_output():
    got = augment_corpus(CORPUS[:4], BB_GENDER)
    # "his" maps to "her" (his/her); "her" maps to "his" (the last pair containing it wins)
    assert got[:2] == ["the woman said that she would call her brother tomorrow .", CORPUS[0]]
    assert got[2] == "he thanked her, and the girl laughed."
    assert got[4] == "my mother is an actress; her daughter is not!"
    assert len(got) == 6  # the sentence without attribute words is dropped (two-sided CDA on matches only)
    assert augment_corpus(CORPUS[3:4], BB_GENDER, keep_unmatched=True) == CORPUS[3:4]


# ------------------------------------------------------------------------------ INLP
def _planted(seed=0, n=60, d=12):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3 * n, d))
    y = labels_for([n, n, n], gender=True)
    X[:, 0] += 1.5 * y  # male +1.5, female 0, neutral -1.5 along axis 0
    X[:, 1] += 0.8 * (y == 0)
    return X, y


def test_inlp_projection_equals_bias_bench():
    X, y = _planted()
    parts = split_dataset(X, y)
    Xtr, Xdev, Xte, ytr, ydev, yte = parts
    Pr, _, Ws_ref = ref._apply_nullspace_projection(*ref._split_gender_dataset(X[y == 1], X[y == 0], X[y == -1]),
                                                   n_classifiers=6, input_dim=X.shape[1])
    P, Ws, accs = inlp_projection(Xtr, ytr, Xdev, ydev, n_classifiers=6)
    assert np.abs(P - Pr).max() < 1e-6
    assert len(Ws) == 6 and all(np.allclose(w, wr) for w, wr in zip(Ws, Ws_ref))
    # a symmetric projection that removes every classifier's rows (3 one-vs-rest rows each)
    assert np.allclose(P @ P, P) and np.allclose(P, P.T)
    assert round(float(np.trace(P))) == 12 - min(12, sum(np.linalg.matrix_rank(w) for w in Ws))
    assert all(np.abs(w @ P).max() < 1e-8 for w in Ws)
    assert accs[0] > 0.6 and accs[-1] < accs[0]  # the label gets harder to predict


def test_inlp_features_equal_bias_bench_on_a_tiny_bert():
    model, tok = tiny_models.load_tiny("bert")
    sents = [s.lower() for s in CORPUS]
    ours = mean_last_hidden(model, tok, sents)
    m, f, n = ref._extract_gender_features(model.base_model, tok, sents[:3], sents[3:6], sents[6:])
    assert np.abs(ours - np.concatenate([m, f, n])).max() < 1e-6
    with pytest.raises(ParameterError, match=r"^n_classifiers: must be >= 1, got 0$"):
        inlp_projection(ours, np.arange(8) % 2, ours, np.arange(8) % 2, n_classifiers=0)


# ------------------------------------------------------------------------------ SentenceDebias
@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_sentence_debias_subspace_and_projection_equal_bias_bench(kind):
    model, tok = tiny_models.load_tiny(kind)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    base = model.base_model
    pairs = [tuple(p) for p in BB_GENDER]
    ex = counterfactual_pairs(CORPUS, pairs)
    ref_ex = ref.generic_load_examples(CORPUS, pairs)
    assert ex == [(e["female_example"], e["male_example"]) for e in ref_ex]
    assert len(ex) == 23
    v_ref = ref.compute_gender_subspace(ref_ex, base, tok, batch_size=4).numpy()
    side0 = mean_pooled(model, tok, [a for a, _ in ex], batch_size=4, drop_last=True)
    side1 = mean_pooled(model, tok, [b for _, b in ex], batch_size=4, drop_last=True)
    assert len(side0) == 20  # bias-bench drops the last incomplete batch
    v = bias_direction(side1, side0)  # bias-bench stacks its "male_example" side first
    assert v.shape == (1, model.config.hidden_size if hasattr(model.config, "hidden_size") else model.config.n_embd)
    assert np.abs(v[0] - v_ref).max() < 1e-6
    import torch
    enc = tok(CORPUS[:3], return_tensors="pt", padding=True)
    with torch.no_grad():
        h = base(**{k: enc[k] for k in ("input_ids", "attention_mask")})["last_hidden_state"]
    expected = ref.sentence_debias_hook_apply(h.clone(), torch.tensor(v[0], dtype=torch.float32)).numpy()
    got = project_out(h.numpy(), v)
    assert np.abs(got - expected).max() < 1e-6
    assert np.abs(got @ v[0]).max() < 1e-6  # nothing left along the direction


# ------------------------------------------------------------------------------ Self-Debias
def test_rescale_formula_by_hand():
    import torch
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    biased = torch.log(torch.tensor([0.2, 0.3, 0.5]))
    # delta = (0, 0, 0.3); alpha = (1, 1, max(exp(-15), 0.01) = 0.01); p~ = (0.5, 0.3, 0.002) / 0.802
    got = rescale(logits, [biased]).numpy()
    np.testing.assert_allclose(np.exp(got), np.array([0.5, 0.3, 0.002]) / 0.802, rtol=1e-6)
    got = rescale(logits, [biased], decay_constant=1.0).numpy()
    w = np.array([0.5, 0.3, 0.2 * np.exp(-0.3)])
    np.testing.assert_allclose(np.exp(got), w / w.sum(), rtol=1e-6)
    with pytest.raises(ParameterError, match=r"^self_debias: epsilon: must be > 0, got 0$"):
        rescale(logits, [biased], epsilon=0)
    with pytest.raises(ParameterError, match=r"^self_debias: decay_constant: expected a finite number, got nan$"):
        rescale(logits, [biased], decay_constant=float("nan"))


def test_self_debias_causal_equals_bias_bench():
    import torch
    model, tok = tiny_models.load_tiny("gpt2")
    tok.pad_token = tok.eos_token
    prefixes = [DEBIASING_PREFIXES["gender"], DEBIASING_PREFIXES["religion"]]
    ids = tok("the man said that he would call his sister", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        lm, _ = ref.gpt2_compute_loss_self_debiasing(model, tok, torch.tensor([ids]), prefixes)
    expected = lm[0, -len(ids):].numpy()
    got = causal_logprobs(model, tok, ids, prefixes).numpy()
    diff = np.abs(got - expected).max()
    assert diff < 1e-5, diff
    with torch.no_grad():
        plain = torch.log_softmax(model(input_ids=torch.tensor([ids]))["logits"][0], -1).numpy()
    assert np.abs(got - plain).max() > 1e-3  # the prompts changed something


def test_self_debias_masked_equals_bias_bench():
    import torch
    model, tok = tiny_models.load_tiny("bert")
    prefixes = [DEBIASING_PREFIXES["gender"]]
    ids = tok(f"the man said that {tok.mask_token} would call", add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        expected = ref.mlm_get_token_logits_self_debiasing(model, tok, torch.tensor([ids]), prefixes).numpy()
    got = masked_logprobs(model, tok, ids, prefixes).numpy()
    diff = np.abs(got - expected).max()
    assert diff < 1e-6, diff
    with pytest.raises(ParameterError, match="exactly one mask token, got 0"):
        masked_logprobs(model, tok, ids[:3], prefixes)


# ------------------------------------------------------------------------------ steps on a generated corpus
@pytest.fixture(scope="module")
def corpora():
    from audit.datasets.corpus import corpus_from_tests
    return corpus_from_tests(["en", "de"], seed=0, sentences_per_word=3)


@pytest.mark.parametrize("lang", ["en", "de"])
def test_inlp_sentences_equal_bias_bench(corpora, lang):
    from audit.lm_mitigation.inlp import gender_sentences
    pairs = derive_pairs(lang).pairs
    lower = [[w.lower() for w in p] for p in pairs]  # bias-bench's list is lower case; ours lower-cases it
    for n in (15, 10000):
        got = gender_sentences(corpora[lang], pairs, n_sentences=n, seed=3)
        assert got == ref._load_gender_data(corpora[lang], lower, n_sentences=n, seed=3)
    assert len(got["male"]) > 20 and len(got["female"]) > 20 and len(got["neutral"]) > 100


def test_inlp_and_sentence_debias_steps_fit_with_provenance(corpora):
    from sklearn.svm import LinearSVC

    from audit.lm_mitigation.steps import INLP, SentenceDebias, corpus_digest
    model, tok = tiny_models.load_tiny("bert")
    pairs = derive_pairs("en")
    inlp = INLP(n_classifiers=4, n_sentences=60).fit(model, tok, corpora["en"], pairs)
    pv = inlp.provenance_
    assert pv["technique"] == "inlp" and pv["params"] == {"n_classifiers": 4, "n_sentences": 60, "seed": 0}
    assert pv["corpus"]["digest"] == corpus_digest(corpora["en"]) and pv["pairs"]["tests"][0] == "en/cw4"
    assert pv["n_train"] == {"male": 60, "female": 60, "neutral": 60}
    assert pv["rank_removed"] == 12  # 4 classifiers x 3 one-vs-rest rows
    assert pv["dev_accuracy_last"] < pv["dev_accuracy_first"]
    # after the projection a fresh classifier predicts the gender label worse than before
    data = {k: [s for s in corpora["en"] if f" {w} " in f" {s.lower()} "][:40]
            for k, w in (("m", "man"), ("f", "woman"))}
    X = mean_last_hidden(model, tok, data["m"] + data["f"])
    y = np.r_[np.ones(len(data["m"])), np.zeros(len(data["f"]))]
    before = LinearSVC(dual=False).fit(X, y).score(X, y)
    after = LinearSVC(dual=False).fit(inlp.transform(X), y).score(inlp.transform(X), y)
    assert after < before, (before, after)
    sd = SentenceDebias(batch_size=16).fit(model, tok, corpora["en"][:400], pairs)
    assert sd.directions_.shape == (1, 32) and sd.provenance_["n_examples"] == sd.provenance_["n_encoded"] > 10
    h = np.random.default_rng(0).normal(size=(2, 5, 32))
    assert np.abs(sd.transform(h) @ sd.directions_[0]).max() < 1e-9
    with pytest.raises(ParameterError, match=r"^inlp: n_classifiers: must be >= 1, got 0$"):
        INLP(n_classifiers=0)
    with pytest.raises(ParameterError, match="sentence_debias: call fit before transform"):
        SentenceDebias().transform(h)


def test_self_debias_and_cda_steps():
    from audit.lm_mitigation.steps import CDA, SelfDebias
    with pytest.raises(ParameterError, match="no prompt for bias_type 'caste'"):
        SelfDebias(bias_type="caste")
    model, tok = tiny_models.load_tiny("gpt2")
    ids = tok("the man said", add_special_tokens=False)["input_ids"]
    lp = SelfDebias().logprobs(model, tok, ids, kind="causal")
    assert lp.shape == (len(ids), model.config.vocab_size)
    np.testing.assert_allclose(lp.exp().sum(-1).numpy(), 1.0, rtol=1e-5)
    de = derive_pairs("de")
    step = CDA()
    out = step.transform(["Der Vater und die Töchter .", "Es regnet heute ."], de)
    # word-for-word swaps: the article does not follow (a known limit of CDA in gendered languages)
    assert out == ["Der Mutter und die Söhne .", "Der Vater und die Töchter ."]
    assert step.provenance_["augmented"]["n_sentences"] == 2 and step.provenance_["pairs"]["language"] == "de"


# ------------------------------------------------------------------------------ CDA / Dropout training
def test_cda_and_dropout_further_pretraining(corpora):
    import torch

    from audit.lm_mitigation.training import further_pretrain, set_dropout
    from audit.lm_mitigation.steps import CDA
    aug = CDA().transform(corpora["en"], derive_pairs("en"))

    def run(seed):
        model, tok = tiny_models.load_tiny("bert")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        losses = further_pretrain(model, tok, aug, kind="mlm", steps=3, batch_size=4, seed=seed)
        return model, before, losses

    m1, before, l1 = run(0)
    m2, _, l2 = run(0)
    assert len(l1) == 3 and all(np.isfinite(l1)) and l1 == l2  # seeded: identical runs
    assert not m1.training
    w = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(m1.state_dict()[w], before[w])
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    g, gtok = tiny_models.load_tiny("gpt2")
    assert set_dropout(g.config) == {"resid_pdrop": 0.15, "embd_pdrop": 0.15, "attn_pdrop": 0.15}
    assert set_dropout(m1.config)["hidden_dropout_prob"] == 0.20
    lg = further_pretrain(g, gtok, corpora["de"], kind="causal", steps=2, batch_size=4, seed=1)
    assert len(lg) == 2 and all(np.isfinite(lg))
    with pytest.raises(ParameterError, match=r"^further pre-training: steps: must be >= 1, got 0$"):
        further_pretrain(g, gtok, corpora["de"], kind="causal", steps=0)


# ------------------------------------------------------------------------------ a debiased model in an audit
def test_projection_debiased_model_runs_seat_beside_the_original(corpora):
    from audit import runner
    from audit.errors import ModelError
    from audit.lm_mitigation.models import debiased
    from audit.lm_mitigation.steps import SentenceDebias
    base = runner.load_model(str(tiny_models.tiny_model_dir("bert")))
    model, tok = tiny_models.load_tiny("bert")
    step = SentenceDebias(batch_size=16).fit(model, tok, corpora["en"][:300], derive_pairs("en"))
    deb = debiased(base, step)
    assert deb.ref.endswith("+sentence_debias") and deb.revision.startswith(base.revision + "+sentence_debias:")
    sents = ["the man is here .", "the woman is here ."]
    e0 = base.handle.embed(sents, method="mean")
    e1 = deb.handle.embed(sents, method="mean")
    np.testing.assert_allclose(e1, project_out(e0, step.directions_), atol=1e-5)
    # pooling the projected token vectors (bias-bench's hook) equals projecting the pooled vector
    import torch
    enc = tok(sents[:1], return_tensors="pt")
    with torch.no_grad():
        h = model.base_model(**enc)["last_hidden_state"][0].numpy()
    np.testing.assert_allclose(project_out(h, step.directions_).mean(0), project_out(h.mean(0), step.directions_),
                               atol=1e-5)
    r0 = runner.score(base, "weat7", "seat", {"n_bootstrap": 20})
    r1 = runner.score(deb, "weat7", "seat", {"n_bootstrap": 20})
    assert np.isfinite(r0.value) and np.isfinite(r1.value) and r0.value != r1.value
    assert r1.provenance["revision"] == deb.revision
    with pytest.raises(ModelError, match="sentence_debias debiases representations; pair_pll reads the output"):
        deb.handle.pair_pll([("a", "b")])
    with pytest.raises(ModelError, match="layer=0 is not debiased"):
        deb.handle.embed(sents, layer=0)
