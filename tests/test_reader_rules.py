"""Small reader items of issue 18 (item 8): one CrowS-Pairs loader rule for a registered test
and a file passed by path; honest item counts; HONEST items as lists; vocabulary vs subword
coverage."""

from __future__ import annotations


import pandas as pd
import pytest

from audit.datasets.crows_pairs import load_crows_pairs
from audit.datasets.external import data_root
from audit.errors import DataError
from audit.runner import load_test

DATA = data_root()
FR = DATA / "crows-pairs-multilingual" / "crows_pairs_fr.tsv"


@pytest.mark.unit
@pytest.mark.skipif(not FR.is_file(), reason=f"French CrowS-Pairs not found at {FR}")
def test_french_crows_pairs_by_path_equals_the_registered_test():
    """The official French TSV passed by path used to fail on row 129 ("column 'sent_less' is
    empty") while ``fr/crows_pairs`` skipped it: one rule now, the row skipped with its reason."""
    by_name = load_test("fr/crows_pairs")
    by_path = load_test(str(FR), language="fr")
    want = [{"pair_id": "129", "row": 129, "reason": "column 'sent_less' is empty"}]
    assert by_name.extra["skipped"] == by_path.extra["skipped"] == want
    assert len(by_path.table) == 1676
    pd.testing.assert_frame_equal(by_name.table, by_path.table)


@pytest.mark.unit
def test_crows_pairs_rows_skipped_with_reasons_and_a_file_without_valid_rows_refused(tmp_path):
    rows = pd.DataFrame({"sent_more": ["A is bad.", "", "C is bad."], "sent_less": ["B is bad.", "D.", "E."],
                         "stereo_antistereo": ["stereo", "stereo", "sideways"], "bias_type": ["race-color"] * 3})
    rows.to_csv(tmp_path / "cp.csv", index=False)
    t = load_crows_pairs(tmp_path / "cp.csv")
    assert list(t["sent_more"]) == ["A is bad."]
    assert [s["reason"] for s in t.attrs["skipped"]] == [
        "column 'sent_more' is empty", "column 'stereo_antistereo' must be 'stereo' or 'antistereo', got 'sideways'"]
    with pytest.raises(DataError, match=r"column 'sent_more' is empty in row 2 \(pair_id 1\)$"):
        load_crows_pairs(tmp_path / "cp.csv", invalid="error")
    rows.assign(sent_more="").to_csv(tmp_path / "none.csv", index=False)
    with pytest.raises(DataError, match=r"is empty in row 1 \(pair_id 0\) \(no valid row left\)$"):
        load_crows_pairs(tmp_path / "none.csv")


@pytest.mark.unit
def test_honest_items_hold_lists_and_files_keep_them_readable(tmp_path):
    """HONEST per-item cells were tuples, written as Python repr text ("('g',)"): they are lists
    now, a Parquet file gives lists back and a CSV file JSON text."""
    import json

    from audit.cli import write_items
    from audit.metrics.honest import honest_metric

    from audit.datasets.honest import Lexicon

    lex = Lexicon("en", "made-up", "sha256:0", pd.DataFrame({"lemma": ["thief", "liar"], "category": ["re", "an"],
                                                            "level": ["conservative"] * 2}))
    table = pd.DataFrame({"template": ["a [M].", "b [M]."], "groups": [("g", "h"), ("g",)],
                          "completions": [("thief", "house"), ("cat", "liar")]})
    out = honest_metric(table, language="en", lexicon=lex, k=[2])
    assert out.value == 0.5
    row = out.items.iloc[0]
    assert row["groups"] == ["g", "h"] and row["completions"] == ["thief", "house"]
    assert row["hurtful"] == [True, False] and row["hurtful_words"] == ["thief"]
    assert row["categories"] == [["re"], []]
    write_items(out.items, str(tmp_path / "i.parquet"))
    back = pd.read_parquet(tmp_path / "i.parquet")
    assert list(back.loc[1, "hurtful_words"]) == ["liar"] and list(back.loc[0, "groups"]) == ["g", "h"]
    write_items(out.items, str(tmp_path / "i.csv"))
    csv = pd.read_csv(tmp_path / "i.csv")
    assert json.loads(csv.loc[0, "groups"]) == ["g", "h"]
    assert json.loads(csv.loc[0, "categories"]) == [["re"], []]
    assert json.loads(csv.loc[1, "hurtful"]) == [False, True]


@pytest.mark.unit
def test_coverage_tells_vocabulary_words_from_subword_built_ones(tmp_path, monkeypatch):
    """A fastText model that knows none of the test's words in its vocabulary builds them all
    from subwords: coverage 1.00 as before, and now coverage_vocabulary 0.00 and n_subword."""
    import contextlib
    import io
    import json

    import fasttext

    from jobs import cli

    corpus = " ".join(["roses tulips daisies lilies ants wasps fleas moths lovely peaceful joyful hateful "
                       "warlike painful"] * 60)
    (tmp_path / "c.txt").write_text(corpus + "\n")
    ft = fasttext.train_unsupervised(str(tmp_path / "c.txt"), model="skipgram", dim=8, epoch=1, minCount=1,
                                     minn=2, maxn=4, bucket=5000, thread=1, verbose=0)
    ft.save_model(str(tmp_path / "ft.bin"))
    test = """name: tiny
language: en
provenance: made up
licence: CC0
targets:
- {name: flowers, words: [rose, tulip, daisy, roses]}
- {name: insects, words: [ant, wasp, flea, moth]}
attributes:
- {name: pleasant, words: [love, peace, joy]}
- {name: unpleasant, words: [hate, war, pain]}
"""
    (tmp_path / "t.yaml").write_text(test)
    monkeypatch.chdir(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["score", "--model", "ft.bin", "--test", "t.yaml", "--metric", "weat", "--n-bootstrap", "0",
                         "--format", "json"])
    assert code == 0, err.getvalue()
    res = json.loads(out.getvalue())
    assert res["coverage"] == {"flowers": 1.0, "insects": 1.0, "pleasant": 1.0, "unpleasant": 1.0}
    assert res["coverage_vocabulary"] == {"flowers": 0.25, "insects": 0.0, "pleasant": 0.0, "unpleasant": 0.0}
    assert res["n_subword"] == {"flowers": 3, "insects": 4, "pleasant": 3, "unpleasant": 3}
