"""Attribute pairs for the bias types other than gender (age, nationality), derived per language
from the shipped tests with provenance, and the techniques over them: INLP's two-class data,
SentenceDebias and CDA over tuples of three words, cross-checked against bias-bench's race/religion
code (tests/bias_bench_ref.py: _load_race_data, _race_augment_func, compute_race_subspace,
ternary_counterfactual_augmentation); refusals name the language and the bias type."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import bias_bench_ref as ref
from audit import tiny_models
from audit.datasets.registry import _scan, read_registered
from audit.datasets._common import datasets_root
from audit.errors import AuditError, ParameterError
from audit.lm_mitigation.cda import augment_corpus
from audit.lm_mitigation.inlp import attribute_sentences
from audit.lm_mitigation.pairs import BIAS_TYPES, derive_pairs, with_punctuation
from audit.lm_mitigation.sentence_debias import bias_direction, counterfactual_examples, mean_pooled
from audit.lm_mitigation.steps import CDA, INLP, SentenceDebias
from jobs.spec import parse_spec

pytestmark = pytest.mark.unit

#: bias-bench's first race triples (data/bias_attribute_words.json, "race").
BB_RACE = [["black", "caucasian", "asian"], ["african", "caucasian", "asian"], ["black", "white", "asian"],
           ["africa", "america", "asia"]]
CORPUS = [
    "the black man and the asian woman walked to africa today .",
    "a white family moved to america last year .",
    "nothing here mentions anyone at all today .",
    "the caucasian boy met an african girl and a black dog .",
    "the weather was cold and the roads were icy .",
    "asia is large , america is far , africa is warm .",
    "short line .",
    "she read the news about the asian markets this morning .",
]


def test_age_and_nationality_pairs_in_two_languages_with_provenance():
    assert BIAS_TYPES == ("gender", "age", "nationality")
    en = derive_pairs("en", "nationality")
    assert en.bias_type == "nationality" and en.pairs == (
        ("native", "foreigner"), ("citizen", "immigrant"), ("national", "emigrant"), ("compatriot", "migrant"),
        ("resident", "newcomer"), ("local", "outsider"))
    assert en.provenance["tests"] == ["en/cw3"]
    tests, _ = _scan(datasets_root())
    assert en.provenance["digests"] == {"en/cw3": read_registered(tests["en/cw3"]).digest()}
    de = derive_pairs("de", "nationality")
    assert de.pairs[:2] == (("Einheimischer", "Ausländer"), ("Bürger", "Einwanderer"))
    assert ("Staatsangehörige", "Immigranten") in de.pairs  # plurals from the forms
    # Migrationshintergrund is not a person noun: its pair is skipped, with the reason
    assert "de/cw3: Ansässiger/Migrationshintergrund (not two person nouns)" in de.provenance["skipped"]
    age = derive_pairs("de", "age")
    assert age.provenance["tests"] == ["de/age_valence", "de/cw2"]
    assert age.pairs[:4] == (("Jugendlicher", "Rentner"), ("Jugendliche", "Rentnerin"), ("Schüler", "Senior"),
                             ("Schülerin", "Seniorin"))
    assert "de/age_valence: Baby/Greis (grammatical genders differ (n/m))" in age.provenance["skipped"]
    assert "de/cw2: Schülerin/Rentner (grammatical genders differ (f/m))" in age.provenance["skipped"]
    assert "de/cw2: Jugendlicher/Älterer" in age.provenance["conflicts"]  # Jugendlicher keeps Rentner
    en_age = derive_pairs("en", "age")
    assert en_age.pairs[0] == ("youth", "elder") and ("schoolgirl", "grandmother") in en_age.pairs
    assert "en/cw2: studies/adult (not two person nouns)" in en_age.provenance["skipped"]
    # gender is unchanged (counts of the docs: en 12, de 14)
    assert len(derive_pairs("en").pairs) == 12 and len(derive_pairs("de").pairs) == 14


def test_refusals_name_the_language_and_the_bias_type(tmp_path):
    for lang in ("es", "ca"):
        for bt in ("gender", "age"):
            with pytest.raises(ParameterError, match=rf"^language '{lang}', bias_type '{bt}': no shipped word test "
                                                     rf"has paired {bt} terms"):
                derive_pairs(lang, bt)
    with pytest.raises(ParameterError, match=r"^bias_type 'religion': pairs are derived from the shipped tests for "
                                             r"gender, age, nationality only; pass a pairs file"):
        derive_pairs("en", "religion")
    corpus = tmp_path / "c.txt"
    corpus.write_text("The citizen met the immigrant at the station today.\n", encoding="utf-8")
    spec = {"name": "t", "output_dir": str(tmp_path / "out"), "languages": ["es"], "tests": ["bbq"],
            "metrics": ["bbq"], "models": [{"name": "m", "build": {"kind": "gpt2"}, "lm_mitigation": [
                {"technique": "cda", "corpus": str(corpus), "language": "es", "bias_type": "age"}]}]}
    with pytest.raises(AuditError, match=r"s\.yaml: models\[0\]\.lm_mitigation\[0\]\.bias_type: language 'es', "
                                         r"bias_type 'age': no shipped word test"):
        parse_spec(yaml.safe_load(yaml.safe_dump(spec)), "s.yaml")
    spec["models"][0]["lm_mitigation"] = [{"technique": "self_debias", "bias_type": "age"}]
    with pytest.raises(AuditError, match=r"lm_mitigation\[0\]\.bias_type: self_debias takes its bias type as "
                                         r"params\.bias_type"):
        parse_spec(yaml.safe_load(yaml.safe_dump(spec)), "s.yaml")
    # a derivable type: the variant carries it in its build (key) and tags
    spec["languages"] = ["en"]
    spec["models"][0]["lm_mitigation"] = [{"technique": "cda", "corpus": str(corpus), "bias_type": "nationality"}]
    parsed = parse_spec(yaml.safe_load(yaml.safe_dump(spec)), "s.yaml")
    v = parsed.models[1]
    assert v.build["bias_type"] == "nationality" and v.run_tags["audit.lm_mitigation.bias_type"] == "nationality"


def test_inlp_two_class_data_equals_bias_bench_race_data():
    words = [w for t in BB_RACE for w in t]
    for n in (2, 10000):
        got = attribute_sentences(CORPUS, words, n_sentences=n, seed=5)
        assert got == ref._load_race_data(CORPUS, BB_RACE, n_sentences=n, seed=5)
    assert len(got["bias"]) == 5 and len(got["neutral"]) == 2  # "short line ." has < 5 tokens


def test_sentence_debias_over_triples_equals_bias_bench_race_subspace():
    model, tok = tiny_models.load_tiny("bert")
    ex = counterfactual_examples(CORPUS, BB_RACE)
    ref_ex = []
    for s in CORPUS:
        ref_ex = ref._race_augment_func(s.lower().strip(), ref_ex, BB_RACE)
    assert ex == [(e["r1_example"], e["r2_example"], e["r3_example"]) for e in ref_ex] and len(ex) == 19
    v_ref = ref.compute_race_subspace(ref_ex, model.base_model, tok, batch_size=4).numpy()
    sides = [mean_pooled(model, tok, [e[i] for e in ex], batch_size=4, drop_last=True) for i in range(3)]
    v = bias_direction(*sides)
    assert np.abs(v[0] - v_ref).max() < 1e-6
    # pairs: the same examples as the two-sided function
    assert counterfactual_examples(CORPUS, [("black", "white")]) == [
        ("the black man and the asian woman walked to africa today .",
         "the white man and the asian woman walked to africa today ."),
        ("a black family moved to america last year .", "a white family moved to america last year ."),
        ("the caucasian boy met an african girl and a black dog .",
         "the caucasian boy met an african girl and a white dog .")]


def test_cda_over_triples_equals_bias_bench_ternary_augmentation():
    rows = with_punctuation(BB_RACE)
    for seed in (0, 1, 7):
        got = augment_corpus(CORPUS, BB_RACE, seed=seed)
        assert got == ref.ternary_counterfactual_augmentation_text(CORPUS, [list(r) for r in rows], seed=seed)
    # seed 7 draws black -> asian, asian -> white, africa -> asia (the last triple holding a word wins)
    assert got[:4] == ["the asian man and the white woman walked to asia today .",
                       "the black man and the asian woman walked to africa today .",
                       "a black family moved to africa last year .", "a white family moved to america last year ."]
    assert len(got) == 10  # five texts with a race word, [counterfactual, original] each
    assert CDA(seed=7).transform(CORPUS, derive_pairs("en", "nationality")) == []  # no nationality word
    with pytest.raises(ParameterError, match="tuples of one length"):
        augment_corpus(CORPUS, [("a", "b", "c"), ("d", "e")])


def test_inlp_and_sentence_debias_fit_age_pairs_on_a_tiny_bert():
    from audit.datasets.corpus import corpus_from_tests
    model, tok = tiny_models.load_tiny("bert")
    lines = corpus_from_tests(["en"], seed=0, sentences_per_word=2)["en"]
    pairs = derive_pairs("en", "age")
    inlp = INLP(n_classifiers=3, n_sentences=40).fit(model, tok, lines, pairs)
    pv = inlp.provenance_
    assert pv["pairs"]["bias_type"] == "age" and pv["n_train"] == {"bias": 40, "neutral": 40}
    assert pv["rank_removed"] == 3  # one binary classifier row per iteration
    sd = SentenceDebias(batch_size=16).fit(model, tok, lines[:300], pairs)
    assert sd.provenance_["pairs"]["bias_type"] == "age" and sd.provenance_["n_examples"] > 5


def test_cda_checkpoint_with_nationality_pairs_keyed_on_the_bias_type(tmp_path):
    import json

    from audit.errors import DataError
    from jobs import lm_builders

    corpus = tmp_path / "c.txt"
    corpus.write_text("the citizen met the immigrant at the station today .\n"
                      "a local and a newcomer shared a table at lunch .\n", encoding="utf-8")
    base = tiny_models.tiny_model_dir("bert")
    kw = dict(kind="mlm", technique="cda", corpus=corpus, params={"steps": 1, "batch_size": 2})
    out = lm_builders.build_lm_debiased(tmp_path, "bert+cda-nat", base, bias_type="nationality", **kw)
    rec = json.loads((out / "mitigation.json").read_text())
    assert rec["pairs"]["bias_type"] == "nationality"
    prov = rec["provenance"]
    assert prov["pairs"]["bias_type"] == "nationality" and prov["augmented"]["n_sentences"] == 4
    gender = tmp_path / "g.txt"
    gender.write_text("the weather was cold and the roads were icy today .\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"g\.txt: no sentence contains a en nationality attribute word"):
        lm_builders.build_lm_debiased(tmp_path, "x", base, bias_type="nationality", **{**kw, "corpus": gender})
