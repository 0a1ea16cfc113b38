"""Template grammar and filling: the one placeholder filler, SEAT templates (May et al. 2019),
LPBS items (Kurita et al. 2019), articles, plurals and casing per language."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from audit import schema
from audit.datasets._common import (
    _TEMPLATE_FILE,
    _check_keys,
    _check_language,
    _check_unique,
    _clean_entry,
    _load_yaml,
    _nfc,
    _string_list,
    _text,
    _typename,
    _where,
    datasets_root,
    parsed_once,
)
from audit.errors import DataError, ParameterError, suggest
from audit.suites import WordTest

#: The template uses of the native format (``templates.seat``: SEAT sentence templates;
#: ``templates.lpbs``: LPBS templates with TARGET and ATTRIBUTE) and of language template files.
#: The keys are format vocabulary (they name the measure steps that fill them).
SEAT_USE = "seat"
LPBS_USE = "lpbs"
TEMPLATE_USES = (SEAT_USE, LPBS_USE)
#: Grammatical numbers.
NUMBERS = ("singular", "plural")

#: Word classes for SEAT template filling (each has its own template lists in a language's
#: ``templates.yaml``): person names, other proper nouns, count nouns for things and for
#: persons, mass nouns, adjectives, adverbs, verbs and three kinds of pronouns.
KINDS = (
    "name", "proper", "thing", "person", "mass", "adjective", "adverb", "verb",
    "subject_pronoun", "object_pronoun", "possessive_pronoun",
)
#: Keys of a word's entry in ``forms`` (and in a templates file's ``lexicon``).
FORM_KEYS = ("kind", "number", "singular", "plural", "gender", "definite", "plural_definite", "article",
             "definite_article", "plural_definite_article", "plural_indefinite_article")
GENDERS = ("m", "f", "n")
#: Keys of a templates file's ``articles.definite`` / ``articles.indefinite`` table: the
#: singular article by gender (or ``default``), the plural article (``plural``, or by gender
#: ``plural_m`` ...), and the forms before a vowel (``before_vowel``, ``before_vowel_m`` ...,
#: ``plural_before_vowel``, ``plural_before_vowel_m`` ...); see :func:`article_for`.
ARTICLE_KEYS = (
    *GENDERS, "default", "plural", *(f"plural_{g}" for g in GENDERS),
    "before_vowel", *(f"before_vowel_{g}" for g in GENDERS),
    "plural_before_vowel", *(f"plural_before_vowel_{g}" for g in GENDERS),
)
#: Letters that select the ``before_vowel`` articles unless a templates file sets ``vowels``.
DEFAULT_VOWELS = "aeiou"
#: Languages whose dotted/dotless i needs its own upper case (Turkish: i -> İ, ı -> I).
_TURKIC_UPPER = {"tr": str.maketrans({"i": "İ", "ı": "I"})}

#: Placeholders of SEAT templates: the bare form, the form with its definite article, the form
#: with its indefinite article (whole words; ``_`` binds, so ``THE_WORD`` is one placeholder).
SEAT_PLACEHOLDERS = ("WORD", "THE_WORD", "A_WORD")
_SEAT_RE = re.compile(r"\b(THE_WORD|A_WORD|WORD)\b")
_LPBS_RE = re.compile(r"\b(TARGET|ATTRIBUTE)\b")
#: Placeholders of word templates (a word's Dusi-style context sentences): every one of them is
#: filled with the word.
WORD_PLACEHOLDERS = ("WORD", "TARGET", "ATTRIBUTE")
_WORD_RE = re.compile(r"\b(WORD|TARGET|ATTRIBUTE)\b")


def fill(template: str, values: Mapping[str, str], pattern: re.Pattern[str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """The one placeholder filler of the project.

    Replaces every whole-word match of ``pattern`` (whose group 1 is the placeholder's name) by
    ``values[name]``, left to right, and returns the sentence with, per placeholder name, the
    character span (Python slice convention) of its *first* filled value, computed by
    construction (never by searching the sentence). No re-casing. Raises :class:`DataError`
    when the template has no placeholder or one that ``values`` lacks.
    """
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    pos = last = 0
    for m in pattern.finditer(template):
        name = m.group(1)
        if name not in values:
            raise DataError(f"template {template!r}: no value for placeholder {name}")
        out.append(template[last: m.start()])
        pos += m.start() - last
        value = values[name]
        spans.setdefault(name, (pos, pos + len(value)))
        out.append(value)
        pos += len(value)
        last = m.end()
    if not spans:
        raise DataError(f"template {template!r} has no placeholder ({pattern.pattern})")
    out.append(template[last:])
    return "".join(out), spans


def fill_word(template: str, word: str) -> tuple[str, tuple[int, int]]:
    """A word template (placeholders :data:`WORD_PLACEHOLDERS`, each filled with ``word``): the
    sentence and the span of the first filled occurrence (:func:`fill`)."""
    sentence, spans = fill(template, dict.fromkeys(WORD_PLACEHOLDERS, word), _WORD_RE)
    return sentence, min(spans.values())




def _check_seat_template(t: str, where: str, field: str) -> None:
    found = _SEAT_RE.findall(t)
    if len(found) != 1:
        raise DataError(
            f"{where}: {field} {t!r} must contain exactly one placeholder "
            f"({', '.join(SEAT_PLACEHOLDERS)}), found {len(found)}"
        )


def _check_lpbs_template(t: str, where: str, field: str) -> None:
    found = _LPBS_RE.findall(t)
    if sorted(found) != ["ATTRIBUTE", "TARGET"]:
        raise DataError(f"{where}: {field} {t!r} must contain TARGET and ATTRIBUTE exactly once each")


def _parse_form(word: str, entry: Any, where: str, field: str) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise DataError(f"{where}: {field}: forms of {word!r} must be a mapping with keys "
                        f"{', '.join(FORM_KEYS)}")
    _check_keys(entry, FORM_KEYS, where, field)
    out: dict[str, Any] = {}
    for k, v in entry.items():
        if k == "plural" and isinstance(v, list):
            v = _string_list(v, where, f"{field}.plural")
            _check_unique(v, where, f"{field}.plural", "plural form")
            out[k] = v
            continue
        v = _clean_entry(v, where, f"{field}.{k}")
        allowed = {"kind": KINDS, "number": NUMBERS, "gender": GENDERS}.get(k)
        if allowed is not None:
            schema.choice(v, f"{where}: {field}.{k}", allowed, error=DataError)
        out[k] = v
    if out.get("number") == "plural" and "plural" in out:
        raise DataError(f"{where}: {field}: a word whose number is plural gives its singular, not a plural")
    if out.get("number", "singular") == "singular" and "singular" in out:
        raise DataError(f"{where}: {field}: 'singular' is only for words whose number is plural")
    if isinstance(out.get("plural"), list) and "plural_definite" in out:
        raise DataError(f"{where}: {field}: plural_definite needs a single plural form, not a list")
    return out


def _parse_forms(value: Any, words: set[str], where: str, field: str = "forms",
                 check_words: bool = True) -> dict[str, dict[str, str]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DataError(f"{where}: field {field} must be a mapping word -> {{{', '.join(FORM_KEYS)}}}")
    out: dict[str, dict[str, str]] = {}
    for word, entry in value.items():
        w = _clean_entry(word, where, f"{field} key {word!r}")
        if check_words and w not in words:
            raise DataError(f"{where}: {field}: word {w!r} is in no set of the test{suggest(w, words, cutoff=0.5)}")
        if w in out:
            raise DataError(f"{where}: {field}: word {w!r} is given twice")
        out[w] = _parse_form(w, entry, where, f"{field}.{w}")
    return out



# ======================================================================================
# SEAT templates
# ======================================================================================


@dataclasses.dataclass(frozen=True)
class TemplateSet:
    """A language's SEAT templates (``datasets/<lang>/templates.yaml``).

    seat:         kind -> number -> templates (placeholders ``WORD``, ``THE_WORD``, ``A_WORD``).
    articles:     ``definite``/``indefinite`` -> key -> article, keys :data:`ARTICLE_KEYS`:
                  gender (``m``/``f``/``n``) or ``default`` (words without gender),
                  ``plural`` or ``plural_<gender>``, and the forms before a vowel
                  (``before_vowel[_<gender>]``, ``plural_before_vowel[_<gender>]``: English
                  *an*, French/Italian *l'*, Italian *gli*); see :func:`article_for`. An
                  article ending in an apostrophe is written without a space (*l'homme*).
    lexicon:      default forms of common words (same keys as a test's ``forms``).
    default_kind: kind of words with no ``kind`` in forms or lexicon, for ``capitalised`` and
                  ``lowercase`` words.
    auto_plural:  derive missing plurals of count nouns with :func:`english_plural` (English).
    source:       the file.
    vowels:       letters (lower case) that select the ``before_vowel`` articles when a form
                  starts with one of them (default ``aeiou``; French adds accented vowels and
                  ``h``, whose *h aspiré* words override the article in ``forms``).
    """

    language: str
    seat: dict[str, dict[str, tuple[str, ...]]]
    articles: dict[str, dict[str, str]]
    lexicon: dict[str, dict[str, str]]
    default_kind: dict[str, str]
    auto_plural: bool = False
    source: str = ""
    vowels: str = DEFAULT_VOWELS


_TEMPLATE_FILE_FIELDS = ("language", "description", "provenance", "licence", "articles",
                         "default_kind", "auto_plural", "vowels", SEAT_USE, "lexicon")


def parse_templates(data: Any, source: str | Path = "") -> TemplateSet:
    """Validate a templates file's mapping (see ``docs/datasets.md``) into a :class:`TemplateSet`."""
    where = _where(source)
    if not isinstance(data, Mapping):
        raise DataError(f"{where}: a templates file must hold a mapping with fields {', '.join(_TEMPLATE_FILE_FIELDS)}")
    _check_keys(data, _TEMPLATE_FILE_FIELDS, where, "")
    for f in ("language", "provenance", "licence", SEAT_USE, "default_kind"):
        if f not in data:
            raise DataError(f"{where}: missing required field {f!r}")
    language = _check_language(data["language"], where)
    _text(data["provenance"], where, "provenance")
    _text(data["licence"], where, "licence")
    seat = data[SEAT_USE]
    if not isinstance(seat, Mapping) or not seat:
        raise DataError(f"{where}: field seat must be a mapping kind -> {{singular, plural}}")
    kinds: dict[str, dict[str, tuple[str, ...]]] = {}
    for kind, lists in seat.items():
        if kind not in KINDS:
            raise DataError(f"{where}: seat: unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
        if not isinstance(lists, Mapping):
            raise DataError(f"{where}: seat.{kind} must be a mapping with keys singular, plural")
        _check_keys(lists, NUMBERS, where, f"seat.{kind}")
        kinds[kind] = {}
        for num, lst in lists.items():
            lst = _string_list(lst, where, f"seat.{kind}.{num}")
            for k, t in enumerate(lst):
                _check_seat_template(t, where, f"seat.{kind}.{num}[{k}]")
            _check_unique(lst, where, f"seat.{kind}.{num}", "template")
            kinds[kind][num] = tuple(lst)
    articles: dict[str, dict[str, str]] = {}
    art = data.get("articles") or {}
    if not isinstance(art, Mapping):
        raise DataError(f"{where}: field articles must be a mapping definite/indefinite -> gender -> article")
    _check_keys(art, ("definite", "indefinite"), where, "articles")
    for which, table in art.items():
        if not isinstance(table, Mapping):
            raise DataError(f"{where}: articles.{which} must be a mapping gender -> article")
        _check_keys(table, ARTICLE_KEYS, where, f"articles.{which}")
        articles[which] = {}
        for g, a in table.items():
            if not isinstance(a, str):
                raise DataError(f"{where}: articles.{which}.{g} must be a string, got {_typename(a)}")
            articles[which][g] = _nfc(a).strip()
    dk = data["default_kind"]
    if not isinstance(dk, Mapping):
        raise DataError(f"{where}: field default_kind must be a mapping with keys capitalised, lowercase")
    _check_keys(dk, ("capitalised", "lowercase"), where, "default_kind")
    default_kind = {}
    for k in ("capitalised", "lowercase"):
        if dk.get(k) not in kinds:
            raise DataError(f"{where}: default_kind.{k}: {dk.get(k)!r} is not a kind with templates in "
                            f"this file ({', '.join(kinds)})")
        default_kind[k] = dk[k]
    auto_plural = data.get("auto_plural", False)
    if not isinstance(auto_plural, bool):
        raise DataError(f"{where}: field auto_plural must be true or false")
    vowels = data.get("vowels", DEFAULT_VOWELS)
    if not isinstance(vowels, str) or not vowels.strip() or vowels != vowels.lower():
        raise DataError(f"{where}: field vowels must be a non-empty string of lower-case letters, "
                        f"got {vowels!r}")
    vowels = _nfc(vowels).replace(" ", "")
    lexicon = _parse_forms(data.get("lexicon"), set(), where, "lexicon", check_words=False)
    for w, f in lexicon.items():
        if "kind" in f and f["kind"] not in kinds:
            raise DataError(f"{where}: lexicon.{w}.kind: no templates for kind {f['kind']!r} in this file")
    return TemplateSet(language=language, seat=kinds, articles=articles, lexicon=lexicon,
                       default_kind=default_kind, auto_plural=auto_plural, source=str(source),
                       vowels=vowels)


def load_templates(language: str, root: str | Path | None = None) -> TemplateSet:
    """The SEAT templates of a language, from ``<root>/<language>/templates.yaml`` (parsed once per
    process and file content: :func:`audit.datasets._common.parsed_once`)."""
    language = _check_language(language, "load_templates", "language (argument)")
    path = (Path(root) if root is not None else datasets_root()) / language / f"{_TEMPLATE_FILE}.yaml"
    if not path.is_file():
        raise DataError(f"no SEAT templates for language {language!r}: {path} does not exist; give the "
                        "test a templates.seat field or add that file")

    def parse() -> TemplateSet:
        ts = parse_templates(_load_yaml(path), source=path)
        if ts.language != language:
            raise DataError(f"{path}: field language is {ts.language!r}, expected {language!r}")
        return ts

    return parsed_once("templates", (language,), [path], parse)


_ES_ENDINGS = ("s", "sh", "ch", "x", "z")


def english_plural(word: str) -> str:
    """Regular English plural of a word's last token: May et al.'s (2019,
    ``generate_basic_contexts.py``) rule with ``x``/``z`` added. ``man``/``woman`` (whole
    word) -> ``men``/``women``; consonant + ``y`` -> ``ies``; ``s``, ``sh``, ``ch``, ``x``,
    ``z`` -> ``+es``; otherwise ``+s``. Irregular plurals belong in ``forms``/``lexicon``."""
    last = word.split(" ")[-1]
    head = word[: len(word) - len(last)]
    low = last.lower()
    if low in ("man", "woman"):
        return head + last[:-2] + "en"
    if low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        return head + last[:-1] + "ies"
    if low.endswith(_ES_ENDINGS):
        return head + last + "es"
    return head + last + "s"


def _resolve_info(word: str, forms: Mapping[str, Mapping[str, str]], ts: TemplateSet) -> dict[str, str]:
    info = dict(ts.lexicon.get(word, {}))
    info.update(forms.get(word, {}))
    if "kind" not in info:
        info["kind"] = ts.default_kind["capitalised" if word[:1].isupper() else "lowercase"]
    return info


#: Per-word article overrides in ``forms`` (which, number) -> key.
_ARTICLE_OVERRIDES = {
    ("indefinite", "singular"): "article",
    ("definite", "singular"): "definite_article",
    ("definite", "plural"): "plural_definite_article",
    ("indefinite", "plural"): "plural_indefinite_article",
}


def article_for(ts: TemplateSet, which: str, number: str, gender: str | None, form: str,
                info: Mapping[str, Any] | None = None) -> str | None:
    """The article a SEAT template puts before a word form, or ``None`` if the templates file
    has none for it.

    Order of look-up (first found wins):

    1. the word's own override in ``forms``/``lexicon``: ``article`` (indefinite singular),
       ``definite_article``, ``plural_definite_article``, ``plural_indefinite_article``
       (French *h aspiré*: ``héros: {definite_article: le}``; Italian ``studente:
       {definite_article: lo, article: uno, plural_definite_article: gli}``);
    2. if the form starts with one of the file's ``vowels``: ``before_vowel_<gender>``, then
       ``before_vowel`` (singular), or ``plural_before_vowel_<gender>``, then
       ``plural_before_vowel`` (plural);
    3. singular: ``<gender>``, then ``default``; plural: ``plural_<gender>``, then ``plural``.

    ``which`` is ``definite`` or ``indefinite``; ``number`` is ``singular`` or ``plural``.
    An empty string is a valid article (no article: English bare plurals, Turkish).
    """
    info = info or {}
    override = info.get(_ARTICLE_OVERRIDES[(which, number)])
    if override is not None:
        return override
    table = ts.articles.get(which, {})
    vowel = form[:1].lower() in ts.vowels if form else False
    g = [f"_{gender}"] if gender else []
    if number == "plural":
        keys = ([f"plural_before_vowel{x}" for x in g] + ["plural_before_vowel"] if vowel else [])
        keys += [f"plural{x}" for x in g] + ["plural"]
    else:
        keys = ([f"before_vowel{x}" for x in g] + ["before_vowel"] if vowel else [])
        keys += ([gender] if gender else []) + ["default"]
    for k in keys:
        if k in table:
            return table[k]
    return None


def _article(ts: TemplateSet, which: str, number: str, gender: str | None, form: str,
             info: Mapping[str, str], word: str, where: str, template: str) -> str:
    art = article_for(ts, which, number, gender, form, info)
    if art is None:
        need = "gender" if number == "singular" and not gender else "article"
        raise DataError(
            f"{where}: word {word!r} needs a grammatical {need} for template {template!r} "
            f"(language {ts.language!r}, {which} article, {number}); add forms: {{{word}: {{gender: m|f|n}}}}"
            if need == "gender" else
            f"{where}: {ts.source}: no {which} {number} article for gender {gender!r} (word {word!r})"
        )
    return art


def _join_article(article: str | None) -> str:
    """The article and the space after it; no space after an elided article (``l'``)."""
    if not article:
        return ""
    return article if article.endswith(("'", "’")) else article + " "


def upper_first(sentence: str, language: str = "en") -> str:
    """The sentence with its first letter in upper case, with the language's casing rules
    (Turkish: ``i`` -> ``İ``, ``ı`` -> ``I``; otherwise :meth:`str.upper` of the first
    character; a character whose upper case is longer, such as ``ß``, is left alone)."""
    if not sentence or not sentence[0].islower():
        return sentence
    first = sentence[0]
    table = _TURKIC_UPPER.get(language)
    up = first.translate(table) if table else first
    up = up.upper() if up == first else up
    return sentence if len(up) != 1 else up + sentence[1:]


def _fill_seat(template: str, form: str, article_form: str, definite: str | None,
               indefinite: str | None, language: str = "en") -> tuple[str, tuple[int, int]]:
    """Fill the single placeholder; capitalise the first letter; span of the word form."""
    ph = _SEAT_RE.search(template).group(1)
    if ph == "WORD":
        prefix, filled = "", form
    elif ph == "THE_WORD":
        prefix, filled = _join_article(definite), article_form
    else:
        prefix, filled = _join_article(indefinite), form
    sentence, spans = fill(template, {ph: prefix + filled}, _SEAT_RE)
    start = spans[ph][0] + len(prefix)
    return upper_first(sentence, language), (start, start + len(filled))


def _seat_lists(test: WordTest, ts: TemplateSet | None
                ) -> tuple[dict[str, dict[str, tuple[str, ...]]] | None, TemplateSet | None]:
    """Template lists (the test's own ``templates.seat`` for every word, else ``None`` for the
    language's lists by kind) and the language's :class:`TemplateSet` (articles, lexicon,
    plurals; ``None`` only when the test has its own templates and the language has no file)."""
    own = test.templates.get(SEAT_USE) if test.templates else None
    if ts is None:
        try:
            ts = load_templates(test.language)
        except DataError:
            if not own:
                raise
    if own:
        if isinstance(own, (list, tuple)):
            own = {"singular": own}
        return {"*": {n: tuple(v) for n, v in own.items()}}, ts
    return None, ts


def _word_forms(word: str, info: Mapping[str, Any], ts: TemplateSet | None) -> list[tuple[str, str]]:
    """(number, form) pairs of a word: its singular form(s), then its plural form(s)."""
    number = info.get("number", "singular")
    sing = [word] if number == "singular" else [info["singular"]] if "singular" in info else []
    plur = _plural_forms(info) if number == "singular" else [word]
    if (not plur and number == "singular" and ts is not None and ts.auto_plural
            and info.get("kind") in ("thing", "person")):
        plur = [english_plural(word)]
    return [("singular", f) for f in sing] + [("plural", f) for f in plur]


def _word_sentences(word: str, forms: Mapping[str, Any], own: Mapping | None, ts: TemplateSet | None,
                    where: str, language: str = "en") -> Iterable[dict[str, Any]]:
    """The filled templates of one word (rules at :func:`seat_items`), as row dicts."""
    info = _resolve_info(word, forms, ts) if ts is not None else dict(forms.get(word, {}))
    kind = info.get("kind", "*")
    if own is not None:
        lists = own["*"]
    elif kind not in ts.seat:
        raise DataError(f"{where}: word {word!r} is of kind {kind!r}, which has no SEAT templates in {ts.source}")
    else:
        lists = ts.seat[kind]
    gender = info.get("gender")
    for num, form in _word_forms(word, info, ts):
        art_form = info.get("definite" if num == "singular" else "plural_definite", form)
        for tpl in lists.get(num, ()):
            ph = _SEAT_RE.search(tpl).group(1)
            definite = indefinite = None
            if ph != "WORD" and ts is None:
                raise DataError(f"{where}: template {tpl!r} needs articles; use WORD or add a templates "
                                "file for the language")
            if ph == "THE_WORD":
                definite = _article(ts, "definite", num, gender, form, info, word, where, tpl)
            elif ph == "A_WORD":
                indefinite = _article(ts, "indefinite", num, gender, form, info, word, where, tpl)
            sentence, (a, b) = _fill_seat(tpl, form, art_form, definite, indefinite,
                                          ts.language if ts is not None else language)
            yield {"word": word, "kind": kind, "number": num, "template": tpl, "sentence": sentence,
                   "start": a, "end": b}


def seat_items(test: WordTest, templates: TemplateSet | None = None) -> pd.DataFrame:
    """Every SEAT sentence of a test's words, one row per (word, number, template).

    Filling rules (May et al. 2019's "semantically bleached" templates, extended for articles,
    number and German gender):

    1. A word's forms are the test's ``forms`` entry over the templates file's ``lexicon``
       entry; its kind is ``forms.kind``, else ``default_kind`` by capitalisation (English:
       capitalised -> ``name``, else ``thing``; German: ``thing``).
    2. The listed word is singular unless ``number: plural``. Its singular form is the word (or
       ``singular:``), its plural forms ``plural:`` (one or a list; or the word itself); for
       English count nouns (``thing``, ``person``) a missing plural is :func:`english_plural`.
    3. For each number with a form, each template of the word's kind and number is filled:
       ``WORD`` -> the form; ``THE_WORD`` -> definite article + ``definite`` (singular) or
       ``plural_definite`` (plural) form, default the form; ``A_WORD`` -> indefinite article +
       form. Articles are chosen by :func:`article_for`: the word's own override, else the
       templates file's table by gender (``m``/``f``/``n``) or ``default``, with the
       ``before_vowel`` forms when the form starts with one of the file's ``vowels`` (English
       *a*/*an*, French *le*/*la*/*l'*); the plural has its own entries (English: none; French
       *les*/*des*). A noun of a language whose file has no ``default`` article (German,
       French) needs a ``gender``. An article ending in an apostrophe takes no space
       (*l'homme*).
    4. The first letter of the sentence is upper-cased with the language's rules
       (:func:`upper_first`: Turkish *i* -> *İ*). Duplicate sentences within a set are dropped
       (first kept).

    A test's own ``templates.seat`` (``{singular, plural}``) replaces the language's templates
    for every word (articles still come from the language's file when used).

    Returns
    -------
    DataFrame
        Columns ``role`` (``target``/``attribute``), ``set_index``, ``set_name``, ``word``,
        ``kind``, ``number``, ``template``, ``sentence``, ``start``, ``end`` (character span of
        the word form in the sentence, Python slice convention).
    """
    where = _where(test.source or test.name)
    own, ts = _seat_lists(test, templates)
    forms = test.extra.get("forms") or {}
    rows = []
    for role, sets in (("target", test.targets), ("attribute", test.attributes)):
        for i, ws in enumerate(sets):
            if not ws.words:
                raise DataError(f"{where}: {role} set {ws.name!r} has no words to fill SEAT templates with")
            seen: set[str] = set()
            for word in ws.words:
                for r in _word_sentences(word, forms, own, ts, where, test.language):
                    if r["sentence"] not in seen:
                        seen.add(r["sentence"])
                        rows.append({"role": role, "set_index": i, "set_name": ws.name, **r})
            if not seen:
                raise DataError(f"{where}: {role} set {ws.name!r}: no SEAT template applies to its words")
    cols = ["role", "set_index", "set_name", "word", "kind", "number", "template", "sentence", "start", "end"]
    return pd.DataFrame(rows, columns=cols)


def fill_templates(test: WordTest, use: str = SEAT_USE, templates: TemplateSet | None = None
                   ) -> dict[str, list[list[dict[str, Any]]]]:
    """Fill a test's words into its SEAT templates (rules at :func:`seat_items`).

    Parameters
    ----------
    test : WordTest
    use : {"seat"}
        Only SEAT sentence sets are filled here; LPBS items come from :func:`lpbs_items`.
    templates : TemplateSet, optional
        Defaults to the test's own ``templates.seat``, else ``datasets/<lang>/templates.yaml``.

    Returns
    -------
    dict
        ``{"targets": [set0, set1, ...], "attributes": [...]}`` in set order (the shape of
        ``WordTest.sentences``), where each set is a list of entries ``{"sentence", "word",
        "span": (start, end), "template", "number", "kind"}``; ``span`` is the word form's
        character span in the sentence.
    """
    if use != SEAT_USE:
        raise ParameterError(f"use: {use!r} is not supported; fill_templates fills 'seat' templates "
                             "(LPBS items come from lpbs_items)")
    items = seat_items(test, templates)
    out: dict[str, list[list[dict[str, Any]]]] = {
        "targets": [[] for _ in test.targets], "attributes": [[] for _ in test.attributes]}
    for r in items.itertuples(index=False):
        out[r.role + "s"][r.set_index].append({
            "sentence": r.sentence, "word": r.word, "span": (int(r.start), int(r.end)),
            "template": r.template, "number": r.number, "kind": r.kind})
    return out


def seat_sentence_sets(test: WordTest, templates: TemplateSet | None = None) -> dict[str, list[list[str]]]:
    """The SEAT sentence sets of a test: its own ``sentences`` (BIAS ``.jsonl``, native
    ``sentences``) if it has them, else its words filled into templates; shape
    ``{"targets": [[...], ...], "attributes": [[...], ...]}``."""
    if test.sentences:
        return {k: [list(s) for s in test.sentences[k]] for k in ("targets", "attributes")}
    filled = fill_templates(test, SEAT_USE, templates)
    return {k: [[e["sentence"] for e in s] for s in filled[k]] for k in ("targets", "attributes")}


def with_seat_sentences(test: WordTest, templates: TemplateSet | None = None) -> WordTest:
    """The test with ``sentences`` set to :func:`seat_sentence_sets`, so that its
    :meth:`~audit.suites.WordTest.digest` covers the sentences a SEAT run actually used
    (forms and the language's template file are not part of the test's own digest)."""
    if test.sentences:
        return test
    return dataclasses.replace(test, sentences=seat_sentence_sets(test, templates))


# ======================================================================================
# LPBS
# ======================================================================================


@dataclasses.dataclass(frozen=True)
class LPBSItem:
    """One LPBS sentence (Kurita et al. 2019): a template filled with one target and one
    attribute word.

    number:         ``singular`` or ``plural`` (which template list and target words).
    template:       the template (``TARGET``/``ATTRIBUTE`` placeholders), for re-filling with
                    mask tokens via :func:`fill_lpbs`.
    pair:           index of the target pair within its number (targets pair up by position).
    target_set:     0 (X) or 1 (Y).
    target:         the target word.
    attribute_set:  index of the attribute set (0 = A, 1 = B).
    attribute:      the attribute word.
    sentence:       the template filled with both.
    target_span, attribute_span: character spans in ``sentence`` (slice convention).
    """

    number: str
    template: str
    pair: int
    target_set: int
    target: str
    attribute_set: int
    attribute: str
    sentence: str
    target_span: tuple[int, int]
    attribute_span: tuple[int, int]


def fill_lpbs(template: str, target: str, attribute: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
    """Fill ``TARGET`` and ``ATTRIBUTE`` (each exactly once, whole words) of an LPBS template;
    return the sentence and the target's and attribute's character spans. No capitalisation
    (the masked LM predicts the target as written; BIAS does the same). Pass a mask string
    (e.g. ``"[MASK]"``) as ``target`` and/or ``attribute`` to build the masked inputs."""
    _check_lpbs_template(template, "fill_lpbs", "template")
    sentence, spans = fill(template, {"TARGET": target, "ATTRIBUTE": attribute}, _LPBS_RE)
    return sentence, spans["TARGET"], spans["ATTRIBUTE"]


def _plural_forms(info: Mapping[str, Any]) -> list[str]:
    p = info.get("plural")
    return [] if p is None else ([p] if isinstance(p, str) else list(p))


def number_forms(words: Sequence[str], forms: Mapping[str, Any], where: str = "test") -> dict[str, list[str]]:
    """A target set's words per grammatical number (the one rule for LPBS, BIAS framework
    convention): its singular words are its words not marked ``number: plural``; its plural
    words are, in word order, the plural forms of its words (``forms[w].plural``, one or a
    list) and its words marked ``number: plural``."""
    out: dict[str, list[str]] = {"singular": [], "plural": []}
    for w in words:
        info = forms.get(w) or {}
        if not isinstance(info, Mapping):
            raise DataError(f"{where}: forms of {w!r} must be a mapping (e.g. {{'plural': 'flowers'}})")
        if info.get("number", "singular") == "plural":
            out["plural"].append(w)
        else:
            out["singular"].append(w)
            out["plural"] += _plural_forms(info)
    return out


def _lpbs_pairs(test: WordTest, numbers: Sequence[str] = NUMBERS) -> dict[str, list[tuple[str, str]]]:
    """Target pairs per number (:func:`number_forms` of each target set); the two target
    sets' words of a number pair up by position. Only the ``numbers`` asked for are paired
    (and must have equal counts): a test whose LPBS templates are all singular may give plural
    forms to some target words for SEAT."""
    where = _where(test.source or test.name)
    if len(test.targets) != 2:
        raise DataError(f"{where}: LPBS needs exactly two target sets, got {len(test.targets)}")
    forms = test.extra.get("forms") or {}
    by_set = [number_forms(s.words, forms, where) for s in test.targets]
    pairs = {}
    for num in numbers:
        sides = [b[num] for b in by_set]
        if len(sides[0]) != len(sides[1]):
            raise DataError(
                f"{where}: LPBS pairs the two target sets' {num} words by position, but "
                f"{test.targets[0].name!r} has {len(sides[0])} and {test.targets[1].name!r} has {len(sides[1])}"
            )
        pairs[num] = list(zip(sides[0], sides[1]))
    return pairs


def lpbs_items(test: WordTest) -> list[LPBSItem]:
    """Every LPBS sentence of a test, in the order number -> template -> target pair ->
    attribute set -> attribute -> target side (X then Y), so consecutive items are the two
    sides of one comparison.

    The test needs ``templates["lpbs"]`` (``{singular, plural}``, each template with one
    ``TARGET`` and one ``ATTRIBUTE``) and exactly two target sets. Singular templates take the
    target words, plural templates their plural forms (``forms[word].plural``, a string or a
    list; words marked ``number: plural`` are plural themselves); the two target sets' words of
    a number pair up by position (BIAS convention: ``he``/``she``; ``boys``/``girls``,
    ``men``/``women``).
    Attribute words are used as written in both numbers. Only the numbers that have templates
    are paired, so plural forms given for SEAT do not need to pair up when the LPBS templates
    are all singular.
    """
    where = _where(test.source or test.name)
    lp = test.templates.get(LPBS_USE) if test.templates else None
    if not lp:
        raise DataError(f"{where}: test {test.name!r} has no LPBS templates (field templates.lpbs)")
    pairs = _lpbs_pairs(test, [n for n in NUMBERS if lp.get(n)])
    items = []
    for num in pairs:
        for tpl in lp.get(num, ()):
            for p, pair in enumerate(pairs[num]):
                for a_idx, aset in enumerate(test.attributes):
                    for attr in aset.words:
                        for t_idx, tgt in enumerate(pair):
                            s, ts, as_ = fill_lpbs(tpl, tgt, attr)
                            items.append(LPBSItem(num, tpl, p, t_idx, tgt, a_idx, attr, s, ts, as_))
    if not items:
        raise DataError(f"{where}: LPBS templates and target words give no sentence "
                        "(no target words of a number that has templates)")
    return items



def has_seat_templates(test: WordTest) -> bool:
    """Whether a test's words can be filled into SEAT templates: its own ``templates.seat``, or
    its language's ``datasets/<lang>/templates.yaml``."""
    if test.templates.get(SEAT_USE):
        return True
    return (datasets_root() / test.language / f"{_TEMPLATE_FILE}.yaml").is_file()
