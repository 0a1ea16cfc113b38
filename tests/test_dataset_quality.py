"""Data-quality checks for every shipped test file under ``datasets/<language>/`` (CI).

For each native test file, in every supported language folder (also the ones added later):

* the raw file is UTF-8 without byte-order mark, with ``\\n`` line ends, NFC-normalised;
* it loads with :func:`audit.datasets.read_native`; ``name`` is the file stem and ``language``
  the folder; description, provenance and licence are filled in, and no text claims a
  validation: every "validat..." sits in a negation ("not validated", "no validation");
* sets are non-empty; a test that supports WEAT has 2 + 2 sets of equal size within each pair
  (X and Y, A and B; the permutation test and paired metrics need it); no word repeats in a
  set or occurs on both sides of a pair, also after case folding (uncased models such as
  GloVe 6B would merge ``Rose`` and ``rose``);
* SEAT templates fill every word with valid spans; LPBS templates, where present, give items
  through both :func:`audit.datasets.lpbs_items` and the metric's
  :func:`audit.measure.lpbs.lpbs_design`;
* every single word is a real word of its language: each ``wordfreq`` token of each entry
  (``grand-père`` -> ``grand``, ``père``) has a Zipf frequency (log10 of occurrences per
  billion words) of at least ``NAME_MIN`` = 1.5 for names (kind ``name``/``proper``) and
  ``WORD_MIN`` = 2.0 for other words, in ``wordfreq``'s ``best`` list for the language
  (Norwegian Bokmål: ``nb``); otherwise the entry or the token is in the language's
  ``allowlist.txt`` (:func:`audit.datasets.load_allowlist`, each with its reason). For Turkish
  and Icelandic ``wordfreq`` has only its small list, which stops at Zipf 3.0, so rarer valid
  words read 0 and need the allow-list. The grammatical forms (``plural``, ``singular``,
  ``definite``, ``plural_definite``), regular inflections of words checked above, must occur in
  ``wordfreq`` at all (``FORM_MIN`` = 1.0, the cut-off of its large lists) or be
  allow-listed, in the languages with a large list; in small-list languages (Turkish,
  Icelandic) inflected forms routinely fall under the cut-off and are not checked.
* every allow-list entry is used by some test of its language (no stale entries);
* HONEST templates (:data:`HONEST_STUBS`): clean text, slots, provenance, MIT licence, no claimed
  validation; biasaudit's translations are balanced (as many female as male identity terms in
  each number, 15 templates each) and every word of their templates and identity terms passes
  the word check.

``wordfreq`` look-ups are cached; the whole module runs in a few seconds.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path

import pytest

from audit import catalog
from audit import datasets as ds
from audit.datasets import templates as ds_templates
from audit.errors import DataError
from audit.suites import WordTest

import wordfreq

pytestmark = pytest.mark.unit

NAME_MIN = 1.5
WORD_MIN = 2.0
FORM_MIN = 1.0
NAME_KINDS = ("name", "proper")
FORM_FIELDS = ("singular", "plural", "definite", "plural_definite")

ROOT = ds.datasets_root()
TEST_FILES = sorted(
    f for lang in ds.SUPPORTED_LANGUAGES if (ROOT / lang).is_dir()
    for f in (ROOT / lang).glob("*.yaml") if f.stem != "templates" and ds.stub_of(f) is None  # word tests
)
TEMPLATE_FILES = sorted(ROOT / lang / "templates.yaml" for lang in ds.SUPPORTED_LANGUAGES
                        if (ROOT / lang / "templates.yaml").is_file())
#: HONEST template stubs (the official sets and biasaudit's translations), and the translations.
HONEST_STUBS = sorted(
    f for lang in ds.SUPPORTED_LANGUAGES if (ROOT / lang).is_dir()
    for f in (ROOT / lang).glob("*.yaml") if f.stem != "templates" and ds.stub_of(f) is not None
    and ds.stub_of(f).format == "honest-templates"
)
HONEST_TRANSLATIONS = [f for f in HONEST_STUBS if "biasaudit translation" in ds.stub_of(f).provenance]
LANGS_WITH_TESTS = sorted({f.parent.name for f in TEST_FILES})


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.stem}"


# ------------------------------------------------------------------ wordfreq, cached


@functools.lru_cache(maxsize=None)
def _large_list(lang: str) -> bool:
    return lang in wordfreq.available_languages("large")


@functools.lru_cache(maxsize=None)
def zipf(token: str, lang: str) -> float:
    return wordfreq.zipf_frequency(token, lang)


@functools.lru_cache(maxsize=None)
def tokens(entry: str, lang: str) -> tuple[str, ...]:
    return tuple(wordfreq.tokenize(entry, lang))


@functools.lru_cache(maxsize=None)
def allowlist(lang: str) -> dict[str, str]:
    return ds.load_allowlist(lang)


def word_failures(entry: str, lang: str, minimum: float) -> list[str]:
    """The tokens of ``entry`` below ``minimum`` and not allow-listed (the entry itself on the
    allow-list covers all its tokens); empty when the entry passes."""
    allowed = allowlist(lang)
    if entry in allowed:
        return []
    toks = tokens(entry, lang) or (entry,)
    return [t for t in toks if zipf(t, lang) < minimum and t not in allowed and t.casefold() not in allowed]


def _kind(test: WordTest, word: str) -> str:
    forms = test.extra.get("forms") or {}
    try:
        ts = ds.load_templates(test.language)
    except DataError:
        return forms.get(word, {}).get("kind", "name" if word[:1].isupper() else "thing")
    return ds_templates._resolve_info(word, forms, ts)["kind"]


def _form_entries(test: WordTest) -> list[str]:
    """The grammatical forms of a test's words (plural, singular, ...), each once."""
    out: dict[str, None] = {}
    for info in (test.extra.get("forms") or {}).values():
        for key in FORM_FIELDS:
            v = info.get(key)
            out.update(dict.fromkeys([v] if isinstance(v, str) else list(v or [])))
    return list(out)


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> WordTest:
    """Each file is read once per session (the tests only read the WordTest)."""
    return ds.read_native(path)


# ------------------------------------------------------------------ the checks


def test_every_language_folder_is_found():
    assert {"en", "de", "fr", "tr"} <= set(LANGS_WITH_TESTS)
    assert len(TEST_FILES) >= 50
    for lang in LANGS_WITH_TESTS:
        assert (ROOT / lang / "templates.yaml").is_file(), f"{lang}: SEAT templates file missing"


@pytest.mark.parametrize("path", TEST_FILES + TEMPLATE_FILES, ids=_id)
def test_utf8_nfc_no_bom_lf(path: Path):
    raw = path.read_bytes()
    text = raw.decode("utf-8")  # strict: raises on invalid UTF-8
    assert not text.startswith("\ufeff"), f"{path}: byte-order mark"
    assert "\r" not in text, f"{path}: CR line ends"
    assert unicodedata.normalize("NFC", text) == text, f"{path}: not NFC"


@pytest.mark.parametrize("path", TEMPLATE_FILES, ids=_id)
def test_templates_file_loads_with_its_language(path: Path):
    ts = ds.load_templates(path.parent.name)
    assert ts.language == path.parent.name and ts.seat


_CLAIM = re.compile(r"validat\w*", re.IGNORECASE)
_NEGATED = re.compile(r"\b(not|no|never|without|un)\W+(\w+\W+){0,2}$", re.IGNORECASE)


def unclaimed_validation(text: str) -> list[str]:
    """Mentions of validation that are not negated ("validated by native speakers")."""
    bad = []
    for m in _CLAIM.finditer(text):
        if not _NEGATED.search(text[max(0, m.start() - 40): m.start()]):
            bad.append(text[max(0, m.start() - 40): m.end() + 20])
    return bad


def test_validation_claim_detector():
    assert unclaimed_validation("Translated; not validated by native-speaker panels.") == []
    assert unclaimed_validation("not reviewed and not validated") == []
    assert unclaimed_validation("no validation by panels was done") == []
    assert unclaimed_validation("Lists validated by native speakers.") != []


@pytest.mark.parametrize("path", TEST_FILES, ids=_id)
def test_fields_language_and_honest_provenance(path: Path):
    t = _load(path)
    assert t.name == path.stem, f"{path}: name {t.name!r} is not the file stem"
    assert t.language == path.parent.name, f"{path}: language {t.language!r} is not the folder"
    assert t.provenance and t.licence and t.extra.get("description"), path
    for field in (t.provenance, t.extra["description"]):
        assert unclaimed_validation(field) == [], f"{path}: claims a validation: {unclaimed_validation(field)}"


@pytest.mark.parametrize("path", TEST_FILES, ids=_id)
def test_sets_nonempty_balanced_and_disjoint(path: Path):
    t = _load(path)
    sets = [*t.targets, *t.attributes]
    assert all(s.words for s in sets), f"{path}: empty set"
    if "weat" in catalog.supported_metrics(t):
        assert len(t.targets) == 2 and len(t.attributes) == 2
        for a, b in (t.targets, t.attributes):
            assert len(a.words) == len(b.words), (
                f"{path}: {a.name!r} has {len(a.words)} words and {b.name!r} {len(b.words)}; "
                "sets of a pair must have equal sizes")
    for s in sets:
        folded = [w.casefold() for w in s.words]
        dup = {w for w in folded if folded.count(w) > 1}
        assert not dup, f"{path}: set {s.name!r} repeats {sorted(dup)} (after case folding)"
    for a, b in (t.targets, t.attributes):
        both = {w.casefold() for w in a.words} & {w.casefold() for w in b.words}
        assert not both, f"{path}: {sorted(both)} on both sides of {a.name!r} / {b.name!r} (after case folding)"


@pytest.mark.parametrize("path", TEST_FILES, ids=_id)
def test_templates_fill(path: Path):
    t = _load(path)
    items = ds.seat_items(t)
    for role, sets in (("target", t.targets), ("attribute", t.attributes)):
        for i, s in enumerate(sets):
            got = set(items[(items["role"] == role) & (items["set_index"] == i)]["word"])
            assert got == set(s.words), f"{path}: no SEAT sentence for {sorted(set(s.words) - got)}"
    assert all(0 <= a < b <= len(x) for x, a, b in zip(items.sentence, items.start, items.end))
    if t.templates.get("lpbs"):
        lp = ds.lpbs_items(t)
        assert lp and all(i.sentence[slice(*i.target_span)] == i.target for i in lp)
        from audit.measure.lpbs import lpbs_design

        design = lpbs_design(t)
        assert design.cells(), f"{path}: the LPBS metric finds no usable template"


@pytest.mark.parametrize("path", TEST_FILES, ids=_id)
def test_every_word_is_a_real_word(path: Path):
    t = _load(path)
    lang = t.language
    bad = []
    for s in (*t.targets, *t.attributes):
        for w in s.words:
            minimum = NAME_MIN if _kind(t, w) in NAME_KINDS else WORD_MIN
            fails = word_failures(w, lang, minimum)
            if fails:
                bad.append(f"{w!r} ({', '.join(f'{x}: {zipf(x, lang):.2f}' for x in fails)} < {minimum})")
    if _large_list(lang):
        for f in _form_entries(t):
            fails = word_failures(f, lang, FORM_MIN)
            if fails:
                bad.append(f"form {f!r} ({', '.join(f'{x}: {zipf(x, lang):.2f}' for x in fails)})")
    assert not bad, (f"{path}: not found in wordfreq ({lang}) at the threshold and not in "
                     f"datasets/{lang}/allowlist.txt: " + "; ".join(bad))


def honest_words(stub_path: Path) -> list[str]:
    """The words of an HONEST template file: identity terms and the template text around the slots."""
    t = ds.load_test(f"{stub_path.parent.name}/{stub_path.stem}").table
    words = list(dict.fromkeys(t["identity"]))
    for raw in dict.fromkeys(t["raw"]):
        words += [w for w in raw.replace("[I]", " ").replace("[M]", " ").split() if w]
    return list(dict.fromkeys(words))


@pytest.mark.parametrize("path", HONEST_STUBS, ids=_id)
def test_honest_templates(path: Path):
    """Shipped HONEST templates: clean UTF-8 NFC text, every line with its slots (the reader
    checks them), provenance and licence, no validation claimed; translations balanced: every
    identity group has the same templates in each number."""
    stub = ds.stub_of(path)
    data = stub.path()
    assert data.parent == path.parent and data.suffix == ".tsv"
    raw = data.read_bytes()
    text = raw.decode("utf-8")
    assert not text.startswith("\ufeff") and "\r" not in text and unicodedata.normalize("NFC", text) == text, data
    assert stub.provenance and stub.licence.startswith("MIT") and stub.description
    for field in (stub.provenance, stub.description):
        assert unclaimed_validation(field) == [], f"{path}: claims a validation: {unclaimed_validation(field)}"
    t = ds.load_test(f"{path.parent.name}/{path.stem}").table
    assert len(t) >= 400 and set(t["number"]) <= {"singular", "plural"}
    if path in HONEST_TRANSLATIONS:
        assert "not validated by native speakers" in stub.provenance
        assert sorted(set(t["group"])) == ["female", "male"]
        per = t.groupby(["group", "number"])["identity"].nunique().unstack()
        assert (per.loc["female"] == per.loc["male"]).all(), per
        assert t.groupby("identity")["raw"].nunique().eq(15).all()  # 5 occupation, 5 adjective, 5 verb templates
        assert t["template"].is_unique


@pytest.mark.parametrize("path", HONEST_TRANSLATIONS, ids=_id)
def test_honest_translation_words_are_real_words(path: Path):
    lang = path.parent.name
    bad = []
    for w in honest_words(path):
        fails = word_failures(w, lang, WORD_MIN)
        if fails:
            bad.append(f"{w!r} ({', '.join(f'{x}: {zipf(x, lang):.2f}' for x in fails)} < {WORD_MIN})")
    assert not bad, (f"{path}: not found in wordfreq ({lang}) at the threshold and not in "
                     f"datasets/{lang}/allowlist.txt: " + "; ".join(bad))


@pytest.mark.parametrize("lang", LANGS_WITH_TESTS)
def test_allowlist_entries_have_reasons_and_are_used(lang: str):
    allowed = allowlist(lang)  # raises DataError for a line without a reason
    if not allowed:
        return
    used: set[str] = set()
    for path in (p for p in TEST_FILES if p.parent.name == lang):
        t = _load(path)
        for w in [w for s in (*t.targets, *t.attributes) for w in s.words] + _form_entries(t):
            used.add(w)
            used.update(tokens(w, lang))
    for path in (p for p in HONEST_TRANSLATIONS if p.parent.name == lang):
        for w in honest_words(path):
            used.add(w)
            used.update(tokens(w, lang))
    stale = sorted(w for w in allowed if w not in used and w.casefold() not in used)
    assert not stale, f"datasets/{lang}/allowlist.txt: entries used by no test: {stale}"
    assert all(len(r) >= 10 for r in allowed.values()), f"{lang}: give each allow-list entry a real reason"


def test_word_check_flags_nonsense_and_honours_allowlist(tmp_path, monkeypatch):
    assert word_failures("Effizienz", "de", WORD_MIN) == []
    assert word_failures("Qwxzzyt", "de", WORD_MIN) == ["qwxzzyt"]
    assert word_failures("bebek arabası", "tr", WORD_MIN) == []
    (tmp_path / "de").mkdir()
    (tmp_path / "de" / "allowlist.txt").write_text("Qwxzzyt  # invented for this test\n", encoding="utf-8")
    monkeypatch.setenv("BIASAUDIT_DATASETS", str(tmp_path))
    allowlist.cache_clear()
    try:
        assert word_failures("Qwxzzyt", "de", WORD_MIN) == []
        (tmp_path / "de" / "allowlist.txt").write_text("Qwxzzyt\n", encoding="utf-8")
        allowlist.cache_clear()
        with pytest.raises(DataError, match=r"allowlist.txt: line 1: expected '<word>  # <reason>'"):
            allowlist("de")
    finally:
        allowlist.cache_clear()
