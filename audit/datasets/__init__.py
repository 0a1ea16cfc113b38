"""Test definitions on disk, one module per job (this package knows nothing of metrics or models):

- :mod:`audit.datasets.native`: the native YAML format (parse, validate, read, write);
- :mod:`audit.datasets.bias`: the BIAS Detection Framework's WEAT ``.txt`` and SEAT/LPBS ``.jsonl``;
- :mod:`audit.datasets.crows_pairs`: CrowS-Pairs in every published layout;
- :mod:`audit.datasets.honest`: HONEST completion templates and the HurtLex lexicon (read from a
  path, never shipped);
- :mod:`audit.datasets.bbq`: the BBQ family (BBQ, MBBQ, GG-BBQ, EsBBQ, CaBBQ) mapped onto BBQ's schema;
- :mod:`audit.datasets.external`: stubs registering tests whose data lives elsewhere;
- :mod:`audit.datasets.registry`: the tests shipped under ``datasets/``, look-up by name or path,
  allow-lists;
- :mod:`audit.datasets.templates`: template grammar and the single placeholder filler (SEAT,
  LPBS, word templates);
- :mod:`audit.datasets.corpus`: training text for tiny per-language models (smoke sweeps).

Formats
-------
native YAML (``.yaml``/``.yml``)
    One test per file, documented in ``docs/datasets.md``; read by :func:`read_native`,
    written by :func:`write_native`.
BIAS WEAT ``.txt``
    The BIAS Detection Framework's word-list format (BFH-AMI/BIAS, Puttick et al.; Rankwiler
    & Kurpicz-Briki 2024): ``#`` comment lines, among them ``# Target: <name>`` and
    ``# Attribute: <name>`` in set order, then exactly four comma-separated lines X, Y, A, B.
    Read by :func:`read_bias_weat_txt`.
BIAS SEAT / LPBS ``.jsonl``
    Despite the extension, one pretty-printed JSON object per file with keys ``targ1``,
    ``targ2``, ``attr1``, ``attr2``: SEAT sets are ``{"category", "examples": [sentences]}``;
    LPBS target sets are ``{"singular": [...], "plural": [...]}``, LPBS attribute sets are word
    lists, and ``templates`` holds ``{"singular": [...], "plural": [...]}`` with ``TARGET``
    and ``ATTRIBUTE`` placeholders. Read by :func:`read_bias_jsonl`.

Conventions shared by every reader
----------------------------------
- Files must be UTF-8; a UTF-8 byte-order mark and CRLF/CR line ends are accepted.
- Every string is NFC-normalised on read (the shipped files are NFC already, which the test
  suite checks). Words are stripped and inner runs of whitespace collapse to one space
  (multi-word entries are space separated).
- Bad input raises :class:`audit.errors.DataError` naming the file and the field, line or word.
- A word may not repeat within a set, nor occur on both sides of a pair of sets (two target
  sets, or two attribute sets); a word may be both a target and an attribute.
- Set names must be unique within a test (they label results).

Template filling (SEAT, May et al. 2019; LPBS, Kurita et al. 2019) is documented at
:func:`fill_templates` and :func:`lpbs_items`.
"""

from __future__ import annotations

from audit.datasets._common import SUPPORTED_LANGUAGES, datasets_root
from audit.datasets.bias import read_bias_jsonl, read_bias_weat_txt
from audit.datasets.corpus import corpus_from_tests, tokenize_sentence
from audit.datasets.native import (
    NATIVE_FIELDS,
    REQUIRED_FIELDS,
    SET_FIELDS,
    dump_native,
    parse_native,
    read_native,
    to_native,
    write_native,
)
from audit.datasets.registry import load_allowlist, load_test, read_registered, registry, stub_of, test_type
from audit.datasets.templates import (
    ARTICLE_KEYS,
    FORM_KEYS,
    KINDS,
    NUMBERS,
    SEAT_PLACEHOLDERS,
    TEMPLATE_USES,
    LPBSItem,
    TemplateSet,
    article_for,
    english_plural,
    fill_lpbs,
    fill_templates,
    load_templates,
    lpbs_items,
    parse_templates,
    seat_items,
    seat_sentence_sets,
    upper_first,
    with_seat_sentences,
)

__all__ = [
    "SUPPORTED_LANGUAGES", "NATIVE_FIELDS", "REQUIRED_FIELDS", "SET_FIELDS", "KINDS", "FORM_KEYS", "NUMBERS",
    "TEMPLATE_USES", "SEAT_PLACEHOLDERS", "ARTICLE_KEYS",
    "datasets_root", "registry", "load_test", "load_allowlist", "read_registered", "stub_of", "test_type",
    "read_native", "parse_native", "to_native", "dump_native", "write_native",
    "read_bias_weat_txt", "read_bias_jsonl",
    "TemplateSet", "load_templates", "parse_templates", "english_plural", "article_for", "upper_first",
    "seat_items", "fill_templates", "seat_sentence_sets", "with_seat_sentences",
    "LPBSItem", "fill_lpbs", "lpbs_items",
    "corpus_from_tests", "tokenize_sentence",
]
