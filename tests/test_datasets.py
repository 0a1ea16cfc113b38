"""Test definitions: native YAML, BIAS readers, registry, shipped lists, SEAT/LPBS templates."""

from __future__ import annotations

import dataclasses
import json
import shutil
import unicodedata
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from audit import catalog, registry, runner
from audit import datasets as ds
from audit.datasets.external import data_root
from audit.errors import DataError, ParameterError
from audit.suites import WordSet, WordTest

pytestmark = pytest.mark.unit

SHARED = data_root()
BIAS = SHARED / "bias-framework"
needs_shared = pytest.mark.skipif(not BIAS.is_dir(), reason=f"reference data not found at {BIAS}")

WEAT_SIZES = {  # (|X|, |Y|, |A|, |B|) per Caliskan et al. (2017) supplement
    1: (25, 25, 25, 25), 2: (25, 25, 25, 25), 3: (32, 32, 25, 25), 4: (18, 18, 25, 25),
    5: (18, 18, 8, 8), 6: (8, 8, 8, 8), 7: (8, 8, 8, 8), 8: (8, 8, 8, 8), 9: (6, 6, 7, 7),
    10: (8, 8, 8, 8),
}
WEFE_KEYS = {
    1: ("flowers", "insects", "pleasant_5", "unpleasant_5a"),
    2: ("instruments", "weapons", "pleasant_5", "unpleasant_5a"),
    3: ("european_american_names_5", "african_american_names_5", "pleasant_5", "unpleasant_5b"),
    4: ("european_american_names_7", "african_american_names_7", "pleasant_5", "unpleasant_5b"),
    5: ("european_american_names_7", "african_american_names_7", "pleasant_9", "unpleasant_9"),
    6: ("male_names", "female_names", "career", "family"),
    7: ("math", "arts", "male_terms", "female_terms"),
    8: ("science", "arts_2", "male_terms_2", "female_terms_2"),
    9: ("mental_disease", "physical_disease", "temporary", "permanent"),
    10: ("young_people_names", "old_people_names", "pleasant_9", "unpleasant_9"),
}
# Intentional differences from WEFE's WEAT.json, documented in the YAML descriptions:
# (test, set index, position) -> (ours, WEFE's). Both follow the paper's supplement.
WEFE_DIFFERENCES = {
    (9, 2, 4): ("short-term", "short"),   # supplement: "short-term" (word2vec runs used "short")
    (10, 0, 7): ("Billy", "Bill"),        # supplement: "Billy"
}


def _sets(t: WordTest) -> list[WordSet]:
    return [*t.targets, *t.attributes]


def _word_tests(lang: str) -> list[str]:
    """The registered word-set tests of a language (not CrowS-Pairs, HONEST or BBQ stubs)."""
    df = catalog.list_tests(lang)
    return [n for n, m in zip(df.name, df.metrics) if "weat" in m.split(", ")]


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return p


MINIMAL = """\
name: mini
language: en
provenance: made up for a test
licence: CC0
targets:
  - {name: flowers, words: [aster, rose]}
  - {name: insects, words: [fly, ant]}
attributes:
  - {name: pleasant, words: [love, peace]}
  - {name: unpleasant, words: [hatred, filth]}
"""


# ------------------------------------------------------------------ shipped files


#: The canonical tests every language ships (issue 5), and the English WEAT 1-10 replicas.
CANONICAL = ("gender_career", "gender_math", "gender_science", "origin_valence", "age_valence",
             "cw1", "cw2", "cw3", "cw4", "cw5")
MY_LANGUAGES = ("en", "de", "fr", "tr")


def test_registry_names_resolve():
    reg = ds.registry()
    for n in range(1, 11):
        assert reg[f"en/weat{n}"] == reg[f"weat{n}"]
    for lang in MY_LANGUAGES:
        for stem in CANONICAL:
            assert reg[f"{lang}/{stem}"].name == f"{stem}.yaml"
    for stem in CANONICAL:  # a stem shipped in several languages has no short name
        assert stem not in reg
    assert not any("templates" in k for k in reg)
    a, b, c = ds.load_test("weat1"), ds.load_test("en/weat1"), ds.load_test(reg["weat1"])
    assert a == b == c and a.digest() == c.digest()
    assert ds.load_test("de/cw3").name == "cw3" and ds.load_test("de/cw3").language == "de"
    with pytest.raises(DataError, match="test name 'cw3' is ambiguous: de/cw3, en/cw3.*use the language prefix"):
        ds.load_test("cw3")


def test_a_bare_name_with_a_language_is_that_languages_test():
    """``--test cw3 --language de`` is de/cw3; a name with no version in the language asked
    for is refused, never silently replaced by another language's test."""
    assert ds.load_test("cw3", language="de") == ds.load_test("de/cw3")
    assert ds.load_test("cw3", language="en").language == "en"
    assert runner.load_test("weat7", language="en") == ds.load_test("en/weat7")
    with pytest.raises(DataError, match=r"test 'weat7' has no de version \(registered: en/weat7\)"):
        ds.load_test("weat7", language="de")


@pytest.mark.skipif(not (SHARED / "crows-pairs-multilingual").is_dir(), reason=f"reference data not found at {SHARED} ($BIASAUDIT_DATA)")
def test_crows_pairs_with_a_language_is_that_languages_set():
    fr, nl = ds.load_test("crows_pairs", language="fr"), ds.load_test("crows_pairs", language="nl")
    assert (fr.language, len(fr.table)) == ("fr", len(ds.load_test("fr/crows_pairs").table))
    assert fr.digest() == ds.load_test("fr/crows_pairs").digest()
    assert nl.language == "nl" and nl.encoding.startswith("mac_roman")
    assert ds.load_test("crows_pairs").language == "en"  # the bare name alone: the English set
    with pytest.raises(DataError, match="test 'crows_pairs' has no de version"):
        ds.load_test("crows_pairs", language="de")


def test_a_yaml_file_is_parsed_once_per_content_and_each_caller_gets_its_own_copy(tmp_path, monkeypatch):
    """``_load_yaml`` keeps what it parsed (``audit.datasets._common.parsed_once``, kind ``yaml``):
    the registry read again parses no file again; a caller that changes its document does not
    change the next caller's; a file rewritten in place with the same size and modification time is
    parsed again; a malformed file still fails with its line, every time."""
    import os

    from audit.datasets import _common

    parsed = []
    parse = _common._parse_yaml
    monkeypatch.setattr(_common, "_parse_yaml", lambda path: parsed.append(Path(path).name) or parse(path))
    monkeypatch.setattr(_common, "_PARSED", {})  # this process's earlier reads do not count
    before = catalog.list_tests()
    n = len(parsed)
    assert n >= 100  # every registered file of the datasets folder
    assert catalog.list_tests().equals(before) and len(parsed) == n
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "seed": 1, "words": ["a", "b"]}), encoding="utf-8")
    a = _common._load_yaml(p)
    a["words"].append("changed")
    assert _common._load_yaml(p) == {"name": "t", "seed": 1, "words": ["a", "b"]} and parsed[n:] == ["t.yaml"]
    st = p.stat()
    p.write_text(yaml.safe_dump({"name": "t", "seed": 2, "words": ["a", "b"]}), encoding="utf-8")
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert p.stat().st_size == st.st_size and p.stat().st_mtime_ns == st.st_mtime_ns
    assert _common._load_yaml(p)["seed"] == 2 and parsed[n:] == ["t.yaml", "t.yaml"]
    p.write_text("name: t\nwords: [a,\n  b: c\n", encoding="utf-8")
    for _ in range(2):
        with pytest.raises(DataError, match=r"t.yaml: malformed YAML at line 4, column 1"):
            _common._load_yaml(p)


def test_every_shipped_file_loads_and_is_clean_utf8_nfc():
    root = ds.datasets_root()
    every = sorted(f for lang in ds.SUPPORTED_LANGUAGES for f in (root / lang).glob("*.yaml"))
    stubs = [f for f in every if f.stem != "templates" and ds.stub_of(f) is not None]
    for f in stubs:  # tests whose data is elsewhere name it, and where to get it
        s = ds.stub_of(f)
        assert s.name == f.stem and s.language == f.parent.name and s.url and s.provenance and s.licence
    files = [f for f in every if f not in stubs]
    for lang in MY_LANGUAGES:
        stems = {f.stem for f in files if f.parent.name == lang}
        extra = {f"weat{n}" for n in range(1, 11)} if lang == "en" else set()
        assert stems == {"templates", *CANONICAL} | extra, lang
    for f in files:
        raw = f.read_bytes()
        text = raw.decode("utf-8")
        assert not text.startswith("\ufeff") and "\r" not in text, f
        assert unicodedata.normalize("NFC", text) == text, f
        if f.stem == "templates":
            ts = ds.load_templates(f.parent.name)
            assert ts.language == f.parent.name
            continue
        t = ds.read_native(f)
        assert t.name == f.stem and t.language == f.parent.name
        assert t.provenance and t.licence and t.extra["description"]
        assert len(t.targets) == 2 and len(t.attributes) == 2
        assert catalog.supported_metrics(t)[:2] == ["weat", "seat"]


def test_weat_sizes_and_names():
    for n, sizes in WEAT_SIZES.items():
        t = ds.load_test(f"weat{n}")
        assert tuple(len(s.words) for s in _sets(t)) == sizes, n
    t = ds.load_test("weat3")
    assert t.targets[0].words[:3] == ("Adam", "Harry", "Josh")
    assert "bomb" in t.attributes[1].words and "agony" not in t.attributes[1].words
    assert "agony" in ds.load_test("weat1").attributes[1].words
    assert ds.load_test("weat10").targets[0].words[-1] == "Billy"
    assert "short-term" in ds.load_test("weat9").attributes[0].words


def test_weat_lists_match_wefe_word_for_word():
    import wefe as wefe_package  # the test oracle (scripts/setup.sh --test); missing, the suite refuses to start

    wefe = json.loads((Path(wefe_package.__file__).parent / "datasets" / "data" / "WEAT.json").read_text("utf-8"))
    seen_diffs = {}
    for n, keys in WEFE_KEYS.items():
        t = ds.load_test(f"weat{n}")
        for k, (ours, key) in enumerate(zip(_sets(t), keys)):
            theirs = wefe[key]
            assert len(ours.words) == len(theirs), (n, key)
            for pos, (a, b) in enumerate(zip(ours.words, theirs)):
                if a != b:
                    seen_diffs[(n, k, pos)] = (a, b)
    assert seen_diffs == WEFE_DIFFERENCES


@needs_shared
def test_weat_lists_match_bias_txt_word_for_word():
    for n in (1, 2, 3, 7):
        theirs = ds.read_bias_weat_txt(BIAS / "en" / "WEAT" / f"WEAT_{n}.txt")
        ours = ds.load_test(f"weat{n}")
        assert [s.words for s in _sets(ours)] == [s.words for s in _sets(theirs)], n


@needs_shared
def test_cw_lists_match_bias_txt_word_for_word():
    for n in range(1, 6):
        theirs = ds.read_bias_weat_txt(BIAS / "de" / "WEAT" / f"CW{n}.txt")
        ours = ds.load_test(f"de/cw{n}")
        assert [(s.name, s.words) for s in _sets(ours)] == [(s.name, s.words) for s in _sets(theirs)]
        assert ours.licence.startswith("Apache-2.0")
    cw1 = ds.load_test("de/cw1")
    assert "Nachlässigkeit" in cw1.targets[1].words and "Überforderung" in cw1.targets[1].words


def test_digest_stable_and_sensitive(tmp_path):
    t = ds.load_test("weat1")
    assert t.digest() == "sha256:b3f5ad1cc4fbfe9368755049fc3d3a089415a982160709022dcf20ec1ffa33c5"
    assert ds.load_test("de/cw1").digest() == (
        "sha256:962cdd10f5fdc1d3a228ab126784174698d8beb5c54d1696c470ee893ed90b25")
    copy = shutil.copy(ds.registry()["weat1"], tmp_path / "weat1.yaml")
    assert ds.read_native(copy).digest() == t.digest()  # the path is not part of the digest
    text = Path(copy).read_text("utf-8").replace("aster, clover", "aster, clover2")
    changed = ds.read_native(_write(tmp_path, "changed.yaml", text))
    assert changed.digest() != t.digest()


def test_list_tests():
    df = catalog.list_tests()
    assert list(df.columns) == ["name", "language", "targets", "attributes", "provenance", "licence",
                                "metrics", "path", "available"]
    assert len(df) >= 50 and set(MY_LANGUAGES) <= set(df.language)
    row = df.set_index("name").loc["en/weat1"]
    assert row.targets == "flowers (25), insects (25)"
    assert row.metrics.split(", ")[:2] == ["weat", "seat"] and "lpbs" not in row.metrics
    assert _word_tests("de") == sorted(f"de/{s}" for s in CANONICAL)
    de = catalog.list_tests("de").set_index("name")
    assert de.loc["de/honest", "targets"] == "630 templates" and de.loc["de/honest", "metrics"] == "honest"
    if de.loc["de/bbq", "available"]:
        assert de.loc["de/bbq", "targets"] == "968 items" and de.loc["de/bbq", "metrics"] == "bbq, bbq_generate"
    fr = catalog.list_tests("fr").set_index("name")
    assert fr.loc["fr/gender_math", "targets"] == "math (8), arts (8)"
    assert fr.loc["fr/gender_math", "metrics"].split(", ")[:3] == ["weat", "seat", "lpbs"]
    with pytest.raises(DataError, match="'xx' is not supported"):
        catalog.list_tests("xx")


# ------------------------------------------------------------------ BIAS readers


@needs_shared
def test_bias_txt_crlf_umlauts_and_names():
    path = BIAS / "de" / "WEAT" / "CW1.txt"
    assert b"\r\n" in path.read_bytes()
    t = ds.read_bias_weat_txt(path)
    assert (t.name, t.language) == ("CW1", "de")
    assert [s.name for s in _sets(t)] == ["productive", "unproductive", "business", "children"]
    assert [len(s.words) for s in _sets(t)] == [10, 10, 8, 8]
    assert t.targets[1].words[3] == "Nachlässigkeit" and t.targets[1].words[5] == "Überforderung"
    assert all("\r" not in w and w == w.strip() for s in _sets(t) for w in s.words)
    assert "co-creation" in t.extra["description"] and t.extra["format"] == "bias-weat-txt"
    w7 = ds.read_bias_weat_txt(BIAS / "en" / "WEAT" / "WEAT_7.txt")  # ", " separated
    assert w7.targets[0].words[:2] == ("math", "algebra")
    w1 = ds.read_bias_weat_txt(BIAS / "en" / "WEAT" / "WEAT_1.txt")  # no comments at all
    assert [s.name for s in _sets(w1)] == ["X", "Y", "A", "B"] and w1.language == "en"
    for f in sorted((BIAS / "de" / "WEAT").glob("*.txt")) + sorted((BIAS / "en" / "WEAT").glob("*.txt")):
        ds.load_test(str(f))


def test_bias_txt_bom_crlf_language_and_errors(tmp_path):
    body = "# Target: a\r\n# Target: b\r\n# Attribute: c\r\n# Attribute: d\r\nx1, x2\r\ny1,y2\r\nä1,a2\r\nb1,b2\r\n"
    p = _write(tmp_path, "T.txt", b"\xef\xbb\xbf" + body.encode())
    und = ds.read_bias_weat_txt(p)  # outside a language folder: static-vector metrics need no language
    assert und.language == "und"
    with pytest.raises(DataError, match=r"language is unknown .*pass --language"):
        ds.load_templates(und.language)  # what needs one (templates for transformers) asks for it
    t = ds.read_bias_weat_txt(p, language="de")
    assert t.attributes[0].words == ("ä1", "a2") and t.targets[0].name == "a"
    (tmp_path / "nl").mkdir()
    assert ds.read_bias_weat_txt(shutil.copy(p, tmp_path / "nl" / "T.txt")).language == "nl"
    with pytest.raises(DataError, match=r"T3\.txt: expected 4 comma-separated word lines .*found 3"):
        ds.read_bias_weat_txt(_write(tmp_path, "T3.txt", "a,b\nc,d\ne,f\n"), language="en")
    with pytest.raises(DataError, match=r"line 2: item 2 is empty"):
        ds.read_bias_weat_txt(_write(tmp_path, "T4.txt", "a,b\nc,,d\ne,f\ng,h\n"), language="en")
    with pytest.raises(DataError, match=r"not UTF-8 \(byte 0xe4 at line 3"):
        ds.read_bias_weat_txt(_write(tmp_path, "T5.txt", "a,b\nc,d\nN\xe4he,f\ng,h\n".encode("latin-1")),
                              language="de")
    with pytest.raises(DataError, match="word 'c' is in both targets"):
        ds.read_bias_weat_txt(_write(tmp_path, "T6.txt", "a,c\nc,d\ne,f\ng,h\n"), language="en")
    with pytest.raises(DataError, match="'no' is not supported.*'nb'"):
        ds.read_bias_weat_txt(_write(tmp_path, "T7.txt", "a,b\nc,d\ne,f\ng,h\n"), language="no")


@needs_shared
def test_bias_seat_jsonl():
    files = sorted((BIAS / "de" / "SEAT").glob("*.jsonl"))
    assert len(files) == 9
    for f in files:
        t = ds.read_bias_jsonl(f)
        assert t.language == "de" and all(not s.words for s in _sets(t))
        assert catalog.supported_metrics(t) == ["seat"]
    t = ds.load_test(str(BIAS / "de" / "SEAT" / "CW1_context.jsonl"))
    assert [s.name for s in _sets(t)] == ["productive", "unproductive", "business", "children"]
    assert [len(x) for x in t.sentences["targets"] + t.sentences["attributes"]] == [80, 80, 64, 64]
    assert t.sentences["targets"][0][0] == "Dies ist die Effizienz."
    assert "Die Überforderung ist hier." in t.sentences["targets"][1]
    en = ds.read_bias_jsonl(BIAS / "en" / "SEAT" / "SEAT_TEST.jsonl")
    assert en.sentences == {"targets": [["This is math.", "That is math."], ["This is poetry.", "That is poetry."]],
                            "attributes": [["This is a male.", "That is a male."],
                                           ["This is a female.", "That is a female."]]}
    assert ds.seat_sentence_sets(en) == en.sentences and ds.with_seat_sentences(en) is en


@needs_shared
def test_bias_lpbs_jsonl_and_items():
    t7 = ds.read_bias_jsonl(BIAS / "en" / "LPBS" / "LPBS_7.jsonl")
    assert t7.targets == (WordSet("X", ("he",)), WordSet("Y", ("she",)))
    assert t7.extra["forms"] == {"he": {"plural": ["boys", "men"]}, "she": {"plural": ["girls", "women"]}}
    assert t7.templates["lpbs"] == {"singular": ["TARGET likes ATTRIBUTE.", "TARGET is interested in ATTRIBUTE."],
                                    "plural": ["TARGET like ATTRIBUTE."]}
    items = ds.lpbs_items(t7)
    # singular: 2 templates x 1 pair x 16 attributes x 2 sides; plural: 1 x 2 pairs x 16 x 2
    assert len(items) == 2 * 1 * 16 * 2 + 1 * 2 * 16 * 2
    first, second = items[0], items[1]
    assert (first.sentence, first.target, second.target) == ("he likes math.", "he", "she")
    assert first.sentence[slice(*first.target_span)] == "he"
    assert first.sentence[slice(*first.attribute_span)] == "math"
    plural = [i for i in items if i.number == "plural"]
    assert {(i.pair, i.target) for i in plural} == {(0, "boys"), (0, "girls"), (1, "men"), (1, "women")}
    assert plural[-1].sentence == "women like sculpture."
    masked, tspan, aspan = ds.fill_lpbs(first.template, "[MASK]", first.attribute)
    assert masked == "[MASK] likes math." and masked[slice(*tspan)] == "[MASK]" and masked[slice(*aspan)] == "math"
    t1 = ds.load_test(str(BIAS / "en" / "LPBS" / "LPBS_1.jsonl"))
    assert t1.extra["forms"] == {"flower": {"plural": "flowers"}, "insect": {"plural": "insects"}}
    assert len(ds.lpbs_items(t1)) == 2 * 25 * 2 * 2 and "lpbs" in catalog.supported_metrics(t1)
    # the same forms drive SEAT filling: "flowers" is the plural of "flower"
    assert "Flowers are things." in ds.seat_sentence_sets(t1)["targets"][0]


def test_bias_jsonl_errors(tmp_path):
    (tmp_path / "en").mkdir()
    seat = {k: {"category": k, "examples": [f"This is {k}."]} for k in ("targ1", "targ2", "attr1", "attr2")}
    good = tmp_path / "en" / "s.jsonl"
    good.write_text(json.dumps(seat, indent=2), encoding="utf-8")
    assert ds.read_bias_jsonl(good).sentences["targets"] == [["This is targ1."], ["This is targ2."]]
    bad = tmp_path / "en" / "bad.jsonl"
    bad.write_text('{\n  "targ1": {"category": "a",\n  "examples": ["x",]}\n}', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl: malformed JSON at line 3"):
        ds.read_bias_jsonl(bad)
    two = tmp_path / "en" / "two.jsonl"
    two.write_text(json.dumps(seat) + "\n" + json.dumps(seat), encoding="utf-8")
    with pytest.raises(DataError, match="expected one JSON object, found more data at line 2"):
        ds.read_bias_jsonl(two)
    miss = tmp_path / "en" / "miss.jsonl"
    miss.write_text(json.dumps({k: v for k, v in seat.items() if k != "attr2"}), encoding="utf-8")
    with pytest.raises(DataError, match="missing required field 'attr2'"):
        ds.read_bias_jsonl(miss)
    extra = tmp_path / "en" / "extra.jsonl"
    extra.write_text(json.dumps({**seat, "notes": 1}), encoding="utf-8")
    with pytest.raises(DataError, match="unknown field 'notes'; allowed: targ1, targ2, attr1, attr2, templates"):
        ds.read_bias_jsonl(extra)
    lp = {"targ1": {"singular": ["he"], "plural": ["men"]}, "targ2": {"singular": ["she"], "plural": []},
          "attr1": ["math"], "attr2": ["art"], "templates": {"singular": ["TARGET likes ATTRIBUTE."]}}
    unpaired = tmp_path / "en" / "unpaired.jsonl"
    unpaired.write_text(json.dumps(lp), encoding="utf-8")
    with pytest.raises(DataError, match="plural words by position, but 'X' has 1 and 'Y' has 0"):
        ds.read_bias_jsonl(unpaired)
    lp["targ2"]["plural"] = ["women"]
    lp["templates"]["singular"] = ["TARGET likes it."]
    noph = tmp_path / "en" / "noph.jsonl"
    noph.write_text(json.dumps(lp), encoding="utf-8")
    with pytest.raises(DataError, match=r"templates\.lpbs\.singular\[0\] 'TARGET likes it\.' must contain TARGET and ATTRIBUTE"):
        ds.read_bias_jsonl(noph)


# ------------------------------------------------------------------ native format


def test_round_trip_every_shipped_test(tmp_path):
    for key, path in ds.registry().items():
        if "/" not in key or ds.stub_of(path) is not None:  # stubs hold no test of their own
            continue
        t = ds.read_native(path)
        back = ds.parse_native(yaml.safe_load(ds.dump_native(t)), source=path)
        assert back == t and back.digest() == t.digest()
        assert (back.templates, back.sentences, back.extra) == (t.templates, t.sentences, t.extra)
    t = ds.load_test("de/cw3")
    again = ds.read_native(ds.write_native(t, tmp_path / "cw3.yaml"))
    assert again.extra == t.extra and again.digest() == t.digest()


@needs_shared
def test_round_trip_bias_seat_and_lpbs_through_native(tmp_path):
    for f in (BIAS / "de" / "SEAT" / "CW4_context.jsonl", BIAS / "en" / "LPBS" / "LPBS_7.jsonl"):
        t = ds.read_bias_jsonl(f)
        t = WordTest(**{**t.__dict__, "provenance": t.provenance, "licence": "Apache-2.0"})
        back = ds.read_native(ds.write_native(t, tmp_path / (f.stem + ".yaml")))
        assert back.digest() == t.digest() and back.sentences == t.sentences
        assert back.extra["forms"] == t.extra["forms"]
    assert ds.lpbs_items(back) == ds.lpbs_items(t)


_word = st.text(st.characters(categories=["Lu", "Ll", "Lo"]), min_size=1, max_size=8).map(
    lambda s: unicodedata.normalize("NFC", s))


@settings(max_examples=40, deadline=None)
@given(st.lists(_word, min_size=4, max_size=16, unique=True))
def test_round_trip_property(words):
    half = len(words) // 2
    t = ds.parse_native({
        "name": "p", "language": "is", "provenance": "x", "licence": "y",
        "targets": [{"name": "X", "words": words[:1]}, {"name": "Y", "words": words[1:half]}],
        "attributes": [{"name": "A", "words": words[half:-1]}, {"name": "B", "words": words[-1:]}],
    })
    back = ds.parse_native(yaml.safe_load(ds.dump_native(t)))
    assert back == t and back.digest() == t.digest()


def test_native_normalises_nfc_bom_crlf_and_whitespace(tmp_path):
    nfd = unicodedata.normalize("NFD", "Nachlässigkeit")
    text = MINIMAL.replace("aster, rose", f"'  {nfd} ', 'red  rose'").replace("\n", "\r\n")
    t = ds.read_native(_write(tmp_path, "n.yaml", b"\xef\xbb\xbf" + text.encode("utf-8")))
    assert t.targets[0].words == ("Nachlässigkeit", "red rose")
    assert t.targets[0].words[0] == unicodedata.normalize("NFC", "Nachlässigkeit")
    assert t.extra == {"format": "native", "description": "", "forms": {}, "metrics": None}


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("targets:\n", "targets:\n  - {name: [\n"), r"malformed YAML at line \d+"),
    (lambda s: s.replace("licence: CC0\n", ""), "missing required field 'licence'"),
    (lambda s: s + "colour: red\n", r"unknown field 'colour'; allowed: name, language, description"),
    (lambda s: s.replace("{name: insects", "{nmae: x, name: insects"), r"unknown field targets\[1\]\.'nmae'"),
    (lambda s: s.replace("[fly, ant]", "[]"), r"targets\[1\] \('insects'\)\.words is empty"),
    (lambda s: s.replace("[fly, ant]", "[fly, ant, fly]"),
     r"targets\[1\] \('insects'\)\.words: duplicate word 'fly' \(positions 0 and 2\)"),
    (lambda s: s.replace("[fly, ant]", "[fly, rose]"),
     r"word 'rose' is in both targets\[0\] \('flowers'\) and targets\[1\] \('insects'\)"),
    (lambda s: s.replace("[hatred, filth]", "[hatred, yes]"),
     r"attributes\[1\] \('unpleasant'\)\.words\[1\] is boolean True, not a string .*quote it"),
    (lambda s: s.replace("language: en", "language: klingon"), "language 'klingon' is not supported"),
    (lambda s: s + "language: de\n", "duplicate key 'language'"),
    (lambda s: s.replace("name: insects", "name: flowers"), "set name 'flowers' is used twice"),
    (lambda s: s + "templates:\n  seat: [This is it.]\n",
     r"templates\.seat\.singular\[0\] 'This is it\.' must contain exactly one placeholder"),
    (lambda s: s + "templates:\n  lpbs: {singular: [TARGET is here.]}\n",
     "must contain TARGET and ATTRIBUTE exactly once each"),
    (lambda s: s + "forms:\n  flie: {plural: flies}\n", r"forms: word 'flie' is in no set of the test \(did you mean 'fly'\?\)"),
    (lambda s: s + "forms:\n  fly: {kind: insect}\n", r"forms\.fly\.kind: unknown value 'insect'; known: name, proper"),
    (lambda s: s + "metrics: [weat, weta]\n", "unknown metric 'weta'"),
    (lambda s: s + "metrics: [lpbs]\n", "'lpbs' does not fit this test's sets"),
    (lambda s: "- just\n- a list\n", "must hold a mapping"),
])
def test_native_errors_name_file_and_field(tmp_path, edit, message):
    p = _write(tmp_path, "bad.yaml", edit(MINIMAL))
    with pytest.raises(DataError, match=message) as e:
        runner.load_test(p)  # reading, and the declared metrics checked against the registry
    assert str(p) in str(e.value)


def test_native_non_utf8_and_missing_file(tmp_path):
    p = _write(tmp_path, "latin.yaml", MINIMAL.replace("aster", "N\xe4he").encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.yaml: not UTF-8 \(byte 0xe4 at line 6"):
        ds.read_native(p)
    with pytest.raises(DataError, match="nope.yaml: file not found"):
        ds.load_test(str(tmp_path / "nope.yaml"))


def test_registry_root_override_ambiguity_and_unknown(tmp_path, monkeypatch):
    for lang in ("en", "de"):
        (tmp_path / lang).mkdir()
        _write(tmp_path / lang, "mini.yaml", MINIMAL.replace("language: en", f"language: {lang}"))
    _write(tmp_path / "en", "other.yml", MINIMAL.replace("name: mini", "name: other"))
    monkeypatch.setenv("BIASAUDIT_DATASETS", str(tmp_path))
    assert ds.datasets_root() == tmp_path
    assert sorted(ds.registry()) == ["de/mini", "en/mini", "en/other", "other"]
    assert ds.load_test("de/mini").language == "de" and ds.load_test("other").name == "other"
    with pytest.raises(DataError, match="'mini' is ambiguous: de/mini, en/mini"):
        ds.load_test("mini")
    with pytest.raises(DataError, match="unknown test 'othr'.*did you mean other"):
        ds.load_test("othr")
    monkeypatch.setenv("BIASAUDIT_DATASETS", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="does not exist"):
        ds.registry()


# ------------------------------------------------------------------ templates


def _mini(words_x, words_y, *, language="en", forms=None, templates=None) -> WordTest:
    attrs = ("love", "hatred") if language == "en" else ("Liebe", "Hass")
    if language == "de":
        forms = {"Liebe": {"gender": "f"}, "Hass": {"gender": "m"}, **(forms or {})}
    data = {"name": "t", "language": language, "provenance": "p", "licence": "l",
            "targets": [{"name": "X", "words": words_x}, {"name": "Y", "words": words_y}],
            "attributes": [{"name": "A", "words": [attrs[0]]}, {"name": "B", "words": [attrs[1]]}]}
    if forms:
        data["forms"] = forms
    if templates:
        data["templates"] = templates
    return ds.parse_native(data)


def _by_word(test: WordTest) -> dict[str, list[str]]:
    items = ds.seat_items(test)
    return {w: list(g.sentence) for w, g in items.groupby("word", sort=False)}


def test_fill_templates_english_articles_names_plural():
    t = _mini(["aster", "fly", "Adam"], ["man", "honor", "math"])
    s = _by_word(t)
    assert s["aster"][:2] == ["This is an aster.", "That is an aster."]
    assert "An aster is a thing." in s["aster"] and "It is an aster." in s["aster"]
    assert "The aster is here." in s["aster"] and "These are asters." in s["aster"]
    assert s["fly"][0] == "This is a fly." and "Flies are things." in s["fly"] and len(s["fly"]) == 14
    assert s["Adam"] == ["This is Adam.", "That is Adam.", "There is Adam.", "Here is Adam.", "Adam is here.",
                         "Adam is there.", "Adam is a person.", "The person's name is Adam."]
    assert "A man is a person." in s["man"] and "Men are people." in s["man"] and "The men are there." in s["man"]
    assert s["honor"][0] == "This is an honor."  # lexicon article override (h is a consonant letter)
    assert s["math"] == ["This is math.", "That is math.", "There is math.", "It is math."]
    assert s["love"][0] == "This is love." and s["hatred"][-1] == "It is hatred."
    filled = ds.fill_templates(t, "seat")
    assert len(filled["targets"]) == 2 and len(filled["attributes"]) == 2
    for sets in filled.values():
        for entries in sets:
            for e in entries:
                a, b = e["span"]
                assert e["sentence"][a:b].lower() in (e["word"].lower(), ds.english_plural(e["word"]).lower(),
                                                      "men")
    with pytest.raises(ParameterError, match="use: 'lpbs' is not supported"):
        ds.fill_templates(t, "lpbs")


def test_fill_templates_weat7_pronouns_and_plural_nouns():
    s = _by_word(ds.load_test("weat7"))
    assert s["he"] == ["He is here.", "He is there.", "Here he is.", "There he is.", "He is a person."]
    assert s["her"] == ["It is her.", "This is her.", "That is her."]
    assert s["equations"][0] == "This is an equation." and s["equations"][-1] == "Equations are things."
    counts = ds.seat_items(ds.load_test("weat7")).groupby(["role", "set_index"]).size()
    assert counts.to_dict() == {("attribute", 0): 80, ("attribute", 1): 80, ("target", 0): 72, ("target", 1): 82}


def test_fill_templates_german_articles_gender_plural():
    s = _by_word(ds.load_test("de/cw4"))
    assert s["Gewichtheben"][0] == "Dies ist das Gewichtheben."
    assert "Die Feuerwehr ist eine Sache." in s["Feuerwehr"] and len(s["Feuerwehr"]) == 8
    assert s["Mädchen"][0] == "Dies ist das Mädchen." and "Die Mädchen sind hier." in s["Mädchen"]
    assert s["Mann"][6:] == ["Der Mann ist ein Mensch.", "Es ist der Mann.", "Dies sind Männer.", "Das sind Männer.",
                             "Sie sind Männer.", "Die Männer sind hier.", "Die Männer sind dort.",
                             "Männer sind Menschen."]
    s3 = _by_word(ds.load_test("de/cw3"))
    assert s3["Einheimischer"][0] == "Dies ist der Einheimische."
    assert "Dies sind Einheimische." in s3["Einheimischer"] and "Die Einheimischen sind hier." in s3["Einheimischer"]
    assert "Migrationshintergründe sind Sachen." in s3["Migrationshintergrund"]
    items = ds.seat_items(ds.load_test("de/cw3"))
    row = items[items.sentence == "Die Einheimischen sind hier."].iloc[0]
    assert row.sentence[row.start:row.end] == "Einheimischen" and row.number == "plural"
    with pytest.raises(DataError, match="word 'Tisch' needs a grammatical gender .*forms: {Tisch: {gender: m|f|n}}"):
        ds.seat_items(_mini(["Tisch"], ["Stuhl"], language="de"))
    ok = _mini(["Tisch"], ["Stuhl"], language="de", forms={"Tisch": {"gender": "m"}, "Stuhl": {"gender": "m"}})
    assert _by_word(ok)["Tisch"][4] == "Der Tisch ist hier."


@needs_shared
def test_german_fill_reproduces_bias_seat_files():
    """Our CW forms + German templates give the BIAS SEAT sentence sets, in order, except for
    the corrections documented in cw1.yaml and cw2.yaml."""
    keys = (("targets", 0, "targ1"), ("targets", 1, "targ2"), ("attributes", 0, "attr1"), ("attributes", 1, "attr2"))
    diffs = {}
    for n in range(1, 6):
        ours = ds.seat_sentence_sets(ds.load_test(f"de/cw{n}"))
        theirs = json.loads((BIAS / "de" / "SEAT" / f"CW{n}_context.jsonl").read_text("utf-8"))
        for role, i, k in keys:
            a, b = ours[role][i], theirs[k]["examples"]
            if a != b:
                diffs[(n, k)] = (sorted(set(b) - set(a)), sorted(set(a) - set(b)))
    person = "ist ein Mensch."
    assert diffs == {
        (1, "attr1"): (["Die Fachkraft ist eine Sache."], ["Die Fachkraft " + person]),
        (1, "attr2"): (sorted(["Das Elternteil ist eine Sache.", "Dies sind die Kinder.", "Das sind die Kinder.",
                               "Dort sind die Kinder.", "Hier sind die Kinder.", "Die Kinder sind eine Sache.",
                               "Es sind die Kinder."]),
                       sorted(["Das Elternteil " + person, "Dies sind Kinder.", "Das sind Kinder.",
                               "Sie sind Kinder.", "Kinder sind Menschen."])),
        (2, "attr1"): (sorted(f"Die {w} ist eine Person." for w in ("Jugendliche", "Schülerin", "Studentin")),
                       sorted(f"Die {w} {person}" for w in ("Jugendliche", "Schülerin", "Studentin"))),
        (2, "attr2"): ([], sorted(["Dies ist die Erwachsene.", "Das ist die Erwachsene.", "Dort ist die Erwachsene.",
                                   "Hier ist die Erwachsene.", "Die Erwachsene ist hier.",
                                   "Die Erwachsene ist dort.", "Die Erwachsene " + person,
                                   "Es ist die Erwachsene."])),
    }


def test_test_level_seat_templates_and_with_seat_sentences():
    t = _mini(["aster"], ["fly"], templates={"seat": {"singular": ["I see WORD."], "plural": ["I see WORD too."]}})
    assert ds.seat_sentence_sets(t) == {"targets": [["I see aster.", "I see asters too."],
                                                     ["I see fly.", "I see flies too."]],
                                        "attributes": [["I see love."], ["I see hatred."]]}
    filled = ds.with_seat_sentences(t)
    assert filled.sentences == ds.seat_sentence_sets(t) and filled.digest() != t.digest()
    assert ds.with_seat_sentences(filled) is filled
    t2 = _mini(["Tisch"], ["Stuhl"], language="de", templates={"seat": ["THE_WORD ist hier."]})
    with pytest.raises(DataError, match="needs a grammatical gender"):
        ds.seat_items(t2)


def test_every_shipped_test_fills_with_valid_spans():
    for key, path in ds.registry().items():
        if "/" not in key or ds.stub_of(path) is not None:
            continue
        items = ds.seat_items(ds.read_native(path))
        assert len(items) and not items.duplicated(["role", "set_index", "sentence"]).any()
        assert all(0 <= a < b <= len(s) for s, a, b in zip(items.sentence, items.start, items.end))
        assert all(s[0].isupper() and s.endswith((".", "!")) for s in items.sentence), key


def test_lpbs_needs_templates_and_two_targets():
    t = _mini(["he"], ["she"])
    with pytest.raises(DataError, match="has no LPBS templates"):
        ds.lpbs_items(t)
    t = _mini(["he"], ["she"], templates={"lpbs": {"singular": ["TARGET likes ATTRIBUTE."]}})
    assert [i.sentence for i in ds.lpbs_items(t)] == ["he likes love.", "she likes love.",
                                                      "he likes hatred.", "she likes hatred."]


def test_templates_file_errors(tmp_path, monkeypatch):
    good = yaml.safe_load((ds.datasets_root() / "de" / "templates.yaml").read_text("utf-8"))
    ts = ds.parse_templates(good, "de.yaml")
    assert ts.articles["definite"] == {"m": "der", "f": "die", "n": "das", "plural": "die"}
    bad = dict(good, seat={"noun": {"singular": ["Das ist WORD."]}})
    with pytest.raises(DataError, match="seat: unknown kind 'noun'"):
        ds.parse_templates(bad, "x.yaml")
    bad = dict(good, default_kind={"capitalised": "name", "lowercase": "verb"})
    with pytest.raises(DataError, match="default_kind.lowercase: 'verb' is not a kind with templates"):
        ds.parse_templates(bad, "x.yaml")
    monkeypatch.setenv("BIASAUDIT_DATASETS", str(tmp_path))  # a datasets folder without templates
    with pytest.raises(DataError, match="no SEAT templates for language 'fr'"):
        ds.load_templates("fr")
    nl = _mini(["roos"], ["vlieg"], language="en")
    nl = WordTest(**{**nl.__dict__, "language": "nl"})
    assert "seat" not in catalog.supported_metrics(nl) and "weat" in catalog.supported_metrics(nl)
    with pytest.raises(DataError, match="no SEAT templates for language 'nl'"):
        ds.fill_templates(nl)


def test_contextual_seat_sentences_consumes_fill_templates():
    from audit.measure import contextual
    df = contextual.seat_sentences(ds.load_test("de/cw4"), method="target_pooled")
    row = df[df.sentence == "Die Männer sind hier."].iloc[0]
    assert row.sentence[int(row.span_start):int(row.span_end)] == "Männer" and row.word == "Mann"
    assert df.groupby("set").size().to_dict() == {"attribute0": 70, "attribute1": 70, "target0": 40, "target1": 40}


# ------------------------------------------------------------------ issue 5: languages, articles, corpus


def test_supported_metrics_are_read_from_the_registry():
    t = ds.load_test("weat1")
    assert catalog.supported_metrics(t)[:2] == ["weat", "seat"] and "lpbs" not in catalog.supported_metrics(t)
    for name in catalog.supported_metrics(t):
        e = registry.get(name)
        assert e.n_targets[0] <= len(t.targets) and e.n_attributes[0] <= len(t.attributes), name
    assert catalog.supported_metrics(ds.load_test("crows_pairs")) == ["crows_pairs"]
    # a registry change shows up without editing the datasets package
    original = registry.METRICS["rnd"]
    try:
        registry.METRICS["rnd"] = dataclasses.replace(original, n_targets=(3, 3))
        assert "rnd" not in catalog.supported_metrics(t)
        assert "needs exactly 3 target sets" in registry.applies("rnd", t)
    finally:
        registry.METRICS["rnd"] = original
    assert "rnd" in catalog.supported_metrics(t)


def _ts(language="fr", **articles) -> ds.TemplateSet:
    return ds.TemplateSet(language=language, seat={"thing": {"singular": ("WORD.",)}}, lexicon={},
                          articles=articles, default_kind={"capitalised": "thing", "lowercase": "thing"},
                          vowels="aeiouyàâéèêîôœh")


def test_article_for_gender_elision_plural_and_overrides():
    fr = _ts(definite={"m": "le", "f": "la", "before_vowel": "l'", "plural": "les"},
             indefinite={"m": "un", "f": "une", "plural": "des"})
    assert ds.article_for(fr, "definite", "singular", "m", "livre") == "le"
    assert ds.article_for(fr, "definite", "singular", "f", "algèbre") == "l'"
    assert ds.article_for(fr, "definite", "singular", "m", "homme") == "l'"          # h muet
    assert ds.article_for(fr, "definite", "singular", "m", "héros", {"definite_article": "le"}) == "le"
    assert ds.article_for(fr, "definite", "plural", "f", "algèbres") == "les"
    assert ds.article_for(fr, "indefinite", "singular", "f", "équation") == "une"   # no elision of une
    assert ds.article_for(fr, "indefinite", "plural", None, "enfants") == "des"
    assert ds.article_for(fr, "definite", "singular", None, "livre") is None         # needs a gender
    # Italian-style tables: gendered plurals, gendered forms before a vowel, per-word overrides
    it = _ts("it", definite={"m": "il", "f": "la", "before_vowel": "l'", "plural_m": "i", "plural_f": "le",
                             "plural_before_vowel_m": "gli"},
             indefinite={"m": "un", "f": "una", "before_vowel_f": "un'", "plural": ""})
    assert ds.article_for(it, "definite", "plural", "m", "ingegneri") == "gli"
    assert ds.article_for(it, "definite", "plural", "f", "ingegnere") == "le"
    assert ds.article_for(it, "definite", "plural", "m", "medici") == "i"
    assert ds.article_for(it, "indefinite", "singular", "f", "amica") == "un'"
    assert ds.article_for(it, "indefinite", "singular", "m", "amico") == "un"
    assert ds.article_for(it, "definite", "singular", "m", "studente",
                          {"definite_article": "lo", "plural_definite_article": "gli"}) == "lo"
    assert ds.article_for(it, "definite", "plural", "m", "studenti", {"plural_definite_article": "gli"}) == "gli"
    assert ds.article_for(it, "indefinite", "plural", "m", "studenti", {"plural_indefinite_article": "degli"}) == "degli"
    en = ds.load_templates("en")
    assert [ds.article_for(en, "indefinite", "singular", None, w) for w in ("aster", "fly")] == ["an", "a"]


def test_upper_first_turkish_and_others():
    assert ds.upper_first("insan burada.", "tr") == "İnsan burada."
    assert ds.upper_first("ılık su.", "tr") == "Ilık su."
    assert ds.upper_first("insan here.", "en") == "Insan here."
    assert ds.upper_first("élan.", "fr") == "Élan."
    assert ds.upper_first("ßx", "de") == "ßx" and ds.upper_first("", "tr") == ""


def test_french_templates_articles_elision_and_plural():
    s = _by_word(ds.load_test("fr/gender_math"))
    assert s["algèbre"][:4] == ["C'est l'algèbre.", "Voici l'algèbre.", "Voilà l'algèbre.", "L'algèbre est ici."]
    assert "Un homme est une personne." in s["homme"] and "L'homme est là." in s["homme"]
    assert "Les grands-pères sont des personnes." in s["grand-père"]
    assert "C'est une équation." in s["équation"] and "Ce sont des équations." in s["équation"]
    assert s["mathématiques"] == ["Ce sont les mathématiques.", "Voici les mathématiques.",
                                  "Voilà les mathématiques.", "Les mathématiques sont ici.",
                                  "Les mathématiques sont là."]
    items = ds.seat_items(ds.load_test("fr/gender_math"))
    row = items[items.sentence == "L'algèbre est ici."].iloc[0]
    assert row.sentence[row.start:row.end] == "algèbre"
    t = _mini(["héros"], ["héroïne"], language="en")
    t = WordTest(**{**t.__dict__, "language": "fr", "extra": {**t.extra, "forms": {
        "héros": {"gender": "m", "definite_article": "le"}, "héroïne": {"gender": "f"},
        "love": {"gender": "m"}, "hatred": {"gender": "f"}}}})
    s = _by_word(t)
    assert s["héros"][0] == "C'est le héros." and s["héroïne"][0] == "C'est l'héroïne."


def test_turkish_templates_no_articles_and_dotted_capital():
    s = _by_word(ds.load_test("tr/age_valence"))
    assert s["öğrenci"] == ["Bu öğrenci.", "Şu öğrenci.", "İşte öğrenci.", "Öğrenci burada.", "Öğrenci orada.",
                            "Bu bir öğrenci.", "Öğrenci bir insan.", "Bunlar öğrenciler.", "Şunlar öğrenciler.",
                            "İşte öğrenciler.", "Öğrenciler burada.", "Öğrenciler orada."]
    assert "İhtiyar burada." in s["ihtiyar"] and s["gençlik"][0] == "Bu gençlik."
    lp = ds.lpbs_items(ds.load_test("tr/gender_career"))
    assert lp[0].sentence == "Mehmet yönetici ile ilgileniyor." and lp[1].sentence == "Fatma yönetici ile ilgileniyor."


def test_lpbs_pairs_only_the_numbers_with_templates():
    t = _mini(["he", "boy"], ["she"], templates={"lpbs": {"singular": ["TARGET likes ATTRIBUTE."]}})
    with pytest.raises(DataError, match="singular words by position, but 'X' has 2 and 'Y' has 1"):
        ds.lpbs_items(t)
    forms = {"he": {"plural": ["boys", "men"]}, "she": {"plural": "girls"}}
    t = _mini(["he"], ["she"], forms=forms, templates={"lpbs": {"singular": ["TARGET likes ATTRIBUTE."]}})
    assert len(ds.lpbs_items(t)) == 4  # plural forms 2 vs 1 do not matter without plural templates
    t = _mini(["he"], ["she"], forms=forms, templates={"lpbs": {"singular": ["TARGET likes ATTRIBUTE."],
                                                                 "plural": ["TARGET like ATTRIBUTE."]}})
    with pytest.raises(DataError, match="plural words by position, but 'X' has 2 and 'Y' has 1"):
        ds.lpbs_items(t)


def test_shipped_lpbs_templates_agree_with_the_metric_design():
    from audit.measure.lpbs import lpbs_design, lpbs_sentences

    for key in ("en/age_valence", "fr/cw3", "de/gender_career", "tr/origin_valence"):
        t = ds.load_test(key)
        ours = sorted(i.sentence for i in ds.lpbs_items(t))
        theirs = sorted(lpbs_sentences(lpbs_design(t))["sentence"])
        assert ours == theirs, key


def test_load_allowlist(tmp_path):
    assert ds.load_allowlist("tr")["emzik"].startswith("'pacifier")
    (tmp_path / "fr").mkdir()
    assert ds.load_allowlist("fr", root=tmp_path) == {}
    f = tmp_path / "fr" / "allowlist.txt"
    f.write_text("# comment\n\ntétine  # a pacifier\nbébé  # a baby\n", encoding="utf-8")
    assert ds.load_allowlist("fr", root=tmp_path) == {"tétine": "a pacifier", "bébé": "a baby"}
    f.write_text("tétine  # a pacifier\ntétine  # again\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"allowlist.txt: line 2: word 'tétine' is listed twice"):
        ds.load_allowlist("fr", root=tmp_path)
    f.write_text("tétine\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 1: expected '<word>  # <reason>', got 'tétine'"):
        ds.load_allowlist("fr", root=tmp_path)


def test_datasets_markdown():
    md = catalog.datasets_markdown()
    for lang in MY_LANGUAGES:
        assert f"### {catalog.LANGUAGE_NAMES[lang]} (`{lang}`)" in md
    assert ("| `fr/cw4` | male hobbies (5), female hobbies (5) | male (5), female (5) | weat, seat, lpbs, "
            in md)
    assert md.index("(`en`)") < md.index("(`de`)") < md.index("(`tr`)") < md.index("(`fr`)")
    assert "### German" in catalog.datasets_markdown("de") and "### French" not in catalog.datasets_markdown("de")


def test_tokenize_sentence():
    assert ds.tokenize_sentence("Dies ist der Mann.") == "Dies ist der Mann ."
    assert ds.tokenize_sentence("C'est l'homme, qu'il voit!") == "C' est l' homme , qu' il voit !"
    assert ds.tokenize_sentence("Aujourd'hui grand-père « rit ».") == "Aujourd'hui grand-père « rit » ."


def test_corpus_from_tests_covers_every_word_and_is_seeded():
    a = ds.corpus_from_tests(["fr", "tr"], seed=3, sentences_per_word=6)
    assert list(a) == ["fr", "tr"]
    assert a == ds.corpus_from_tests(["fr", "tr"], seed=3, sentences_per_word=6)
    assert a["fr"] != ds.corpus_from_tests(["fr"], seed=4, sentences_per_word=6)["fr"]
    n_fr = sum(len(s.words) for k in _word_tests("fr") for s in _sets(ds.load_test(k)))
    assert len(a["fr"]) == 6 * n_fr
    for lang, sentences in a.items():
        counts: dict[str, int] = {}
        for s in sentences:
            for tok in set(s.split()):
                counts[tok] = counts.get(tok, 0) + 1
        for key in _word_tests(lang):
            for ws in _sets(ds.load_test(key)):
                for w in ws.words:
                    assert all(counts.get(tok, 0) >= 6 for tok in w.split()), (key, w)
    assert "Qui dit efficacité dit homme ." in a["fr"] or any(s.startswith("C' est l' ") for s in a["fr"])
    raw = ds.corpus_from_tests("fr", seed=3, sentences_per_word=6, tokenize=False)["fr"]
    assert len(raw) == len(a["fr"]) and any("l'" in s and "l' " not in s for s in raw)


def test_corpus_from_tests_errors(tmp_path):
    with pytest.raises(ParameterError, match=r"^seed: expected an integer, got None$"):
        ds.corpus_from_tests(["fr"], seed=None)
    with pytest.raises(ParameterError, match=r"^sentences_per_word: must be >= 1, got 0$"):
        ds.corpus_from_tests(["fr"], seed=0, sentences_per_word=0)
    with pytest.raises(DataError, match="language 'xx' is not supported"):
        ds.corpus_from_tests(["xx"], seed=0)
    (tmp_path / "nl").mkdir()
    with pytest.raises(DataError, match="no tests for language 'nl'"):
        ds.corpus_from_tests(["nl"], seed=0, root=tmp_path)


def test_tiny_fasttext_on_the_corpus_covers_the_tests(tmp_path):
    """The corpus trains a tiny fastText model whose vocabulary holds every word of the tests
    (the smoke sweep's use)."""
    import fasttext
    text = ds.corpus_from_tests(["tr"], seed=0, sentences_per_word=4)["tr"]
    path = tmp_path / "tr.txt"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    model = fasttext.train_unsupervised(str(path), model="skipgram", dim=8, epoch=1, minCount=1,
                                        bucket=2000, minn=3, maxn=4, thread=1, verbose=0)
    vocab = set(model.words)
    missing = [w for k in _word_tests("tr") for s in _sets(ds.load_test(k)) for w in s.words
               for tok in w.split() if tok not in vocab]
    assert missing == []


@pytest.mark.skipif(not (SHARED / "crows-pairs").is_dir(), reason=f"reference data not found at {SHARED} ($BIASAUDIT_DATA)")
def test_list_tests_reads_a_stubs_data_once_per_version(tmp_path, monkeypatch):
    """A stub's size (``N pairs``) is read once per process and content version of its data: a
    second listing reads nothing, an appended row is counted."""
    import pandas as pd

    (tmp_path / "en").mkdir()
    pd.read_csv(SHARED / "crows-pairs" / "crows_pairs_anonymized.csv").head(7).to_csv(tmp_path / "en" / "cp.csv",
                                                                                       index=False)
    (tmp_path / "en" / "cp.yaml").write_text("name: cp\nlanguage: en\nformat: crows-pairs\ndata: ./cp.csv\n"
                                              "provenance: a test\nlicence: CC BY-SA 4.0\n", encoding="utf-8")
    monkeypatch.setenv("BIASAUDIT_CACHE", str(tmp_path / "cache"))
    reads = []
    real = catalog.read_registered
    monkeypatch.setattr(catalog, "read_registered", lambda p: reads.append(p) or real(p))
    assert catalog.list_tests(root=tmp_path).set_index("name").loc["en/cp", "targets"] == "7 pairs"
    assert catalog.list_tests(root=tmp_path).set_index("name").loc["en/cp", "targets"] == "7 pairs"
    assert len(reads) == 1
    df = pd.read_csv(SHARED / "crows-pairs" / "crows_pairs_anonymized.csv").head(8)
    df.to_csv(tmp_path / "en" / "cp.csv", index=False)
    assert catalog.list_tests(root=tmp_path).set_index("name").loc["en/cp", "targets"] == "8 pairs"
    assert len(reads) == 2


@pytest.mark.skipif(not (SHARED / "crows-pairs").is_dir(), reason=f"reference data not found at {SHARED} ($BIASAUDIT_DATA)")
def test_list_tests_keeps_a_stubs_size_on_disk_for_the_next_process(tmp_path, monkeypatch):
    """The next process (here: the in-process cache cleared) lists a stub without reading its data
    again (``$BIASAUDIT_CACHE/catalog``; the four BBQ folders took 7 s per process), with the same
    row; a changed data file, or a torn cache entry, is read again; an error is never cached."""
    import pandas as pd

    monkeypatch.setenv("BIASAUDIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "en").mkdir()
    csv = tmp_path / "en" / "cp.csv"
    pd.read_csv(SHARED / "crows-pairs" / "crows_pairs_anonymized.csv").head(7).to_csv(csv, index=False)
    (tmp_path / "en" / "cp.yaml").write_text("name: cp\nlanguage: en\nformat: crows-pairs\ndata: ./cp.csv\n"
                                              "provenance: a test\nlicence: CC BY-SA 4.0\n", encoding="utf-8")
    reads = []
    real = catalog.read_registered
    monkeypatch.setattr(catalog, "read_registered", lambda p: reads.append(p) or real(p))

    def listed() -> pd.Series:
        catalog._stub_size.cache_clear()  # a new process
        return catalog.list_tests(root=tmp_path).set_index("name").loc["en/cp"]

    first = listed()
    assert first["targets"] == "7 pairs" and first["available"] and len(reads) == 1
    [entry] = (tmp_path / "cache" / "catalog").glob("*.json")
    assert json.loads(entry.read_text("utf-8")) == {"size": "7 pairs"}
    assert listed().equals(first) and len(reads) == 1  # from disk: the data was not read
    entry.write_text('{"size": ', encoding="utf-8")  # torn: read the data again, never fail
    assert listed()["targets"] == "7 pairs" and len(reads) == 2
    pd.read_csv(SHARED / "crows-pairs" / "crows_pairs_anonymized.csv").head(9).to_csv(csv, index=False)
    assert listed()["targets"] == "9 pairs" and len(reads) == 3
    assert listed()["targets"] == "9 pairs" and len(reads) == 3
    csv.write_text("not,a,crows,pairs,file\n", encoding="utf-8")
    for n in (4, 5):  # an unreadable file: unavailable, its error read again each time
        row = listed()
        assert not row["available"] and "cp.csv" in row["targets"] and len(reads) == n
