"""LPBS (Kurita et al. 2019): design from test definitions, log-probabilities against a one
forward pass per sentence implementation, and the effect size / permutation test."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from audit.datasets.external import data_root  # noqa: E402
from audit.errors import DataError, ModelError, ParameterError  # noqa: E402
from audit.measure.lpbs import DEFAULT_TEMPLATES, lpbs_design, lpbs_scores, lpbs_sentences  # noqa: E402
from audit.metrics.lpbs import lpbs_attribute_scores, lpbs_metric  # noqa: E402
from audit.suites import WordSet, WordTest  # noqa: E402

pytestmark = pytest.mark.unit

DATA = data_root()
LPBS_DIR = DATA / "bias-framework" / "en" / "LPBS"
needs_data = pytest.mark.skipif(not LPBS_DIR.is_dir(), reason=f"BIAS LPBS data absent at {LPBS_DIR}")

SMALL = {
    "targ1": {"singular": ["he"], "plural": ["boys"]},
    "targ2": {"singular": ["she"], "plural": ["girls"]},
    "attr1": ["calculus", "algebra"],
    "attr2": ["poetry", "art"],
    "templates": {"singular": ["TARGET likes ATTRIBUTE.", "TARGET is interested in ATTRIBUTE."],
                  "plural": ["TARGET like ATTRIBUTE."]},
}


# --------------------------------------------------------------------------- design


def test_design_from_bias_mapping_and_fill():
    d = lpbs_design(SMALL)
    assert d.targets[0] == {"singular": ("he",), "plural": ("boys",)}
    assert d.cells() == [("singular", "TARGET likes ATTRIBUTE."),
                         ("singular", "TARGET is interested in ATTRIBUTE."),
                         ("plural", "TARGET like ATTRIBUTE.")]
    rows = lpbs_sentences(d)
    assert len(rows) == 3 * 2 * 4  # cells x targets x attributes
    r = rows[(rows["target"] == "boys") & (rows["attribute"] == "poetry")].iloc[0]
    assert r["sentence"] == "boys like poetry."
    assert r["target_span"] == (0, 4) and r["attribute_span"] == (10, 16)
    assert lpbs_sentences(d, forms=["singular"])["form"].unique().tolist() == ["singular"]


def test_design_from_wordtest_forms_and_defaults():
    t = WordTest("t", "en", (WordSet("X", ("he", "flower")), WordSet("Y", ("she", "insect"))),
                 (WordSet("A", ("love",)), WordSet("B", ("hate",))),
                 templates={"lpbs": {"singular": ["TARGET is ATTRIBUTE."], "plural": ["TARGET are ATTRIBUTE."]}},
                 extra={"forms": {"he": {"plural": ["boys", "men"]}, "flower": {"plural": "flowers"},
                                  "insect": {"plural": "insects", "kind": "thing"}}})
    d = lpbs_design(t)
    assert d.targets[0] == {"singular": ("he", "flower"), "plural": ("boys", "men", "flowers")}
    assert d.targets[1] == {"singular": ("she", "insect"), "plural": ("insects",)}
    assert d.target_names == ("X", "Y") and d.templates_source == "test"
    # no LPBS templates: Kurita's template for English; singular only without plural forms
    bare = WordTest("w", "en", (WordSet("X", ("rose",)), WordSet("Y", ("ant",))),
                    (WordSet("A", ("love",)), WordSet("B", ("hate",))))
    d = lpbs_design(bare)
    assert d.templates_source == "default" and d.templates["singular"] == DEFAULT_TEMPLATES["singular"]
    assert d.cells() == [("singular", "TARGET is ATTRIBUTE.")]
    with pytest.raises(DataError, match="no LPBS templates.*'de'"):
        lpbs_design(WordTest("cw1", "de", bare.targets, bare.attributes))


@needs_data
def test_design_matches_datasets_lpbs_items():
    from audit import datasets
    for name in ("LPBS_1.jsonl", "LPBS_7.jsonl"):
        t = datasets.read_bias_jsonl(LPBS_DIR / name)
        ours = lpbs_sentences(lpbs_design(t))
        theirs = datasets.lpbs_items(t)
        key = lambda r: (r[0], r[1], r[2], r[3])  # noqa: E731
        assert sorted(map(key, zip(ours["form"], ours["template"], ours["target"], ours["attribute"]))) == \
            sorted(map(key, ((i.number, i.template, i.target, i.attribute) for i in theirs)))
        assert set(ours["sentence"]) == {i.sentence for i in theirs}
        raw = json.loads((LPBS_DIR / name).read_text(encoding="utf-8"))
        assert sorted(lpbs_sentences(lpbs_design(raw))["sentence"]) == sorted(ours["sentence"])


def test_design_errors():
    bad = dict(SMALL, templates={"singular": ["TARGET likes things."]})
    with pytest.raises(DataError, match="'TARGET likes things.' must contain TARGET and ATTRIBUTE"):
        lpbs_design(bad)
    with pytest.raises(DataError, match="'attr2' is missing"):
        lpbs_design({k: v for k, v in SMALL.items() if k != "attr2"})
    only_plural = dict(SMALL, targ1={"singular": ["he"]}, templates={"plural": ["TARGET like ATTRIBUTE."]})
    # read by the one BIAS LPBS reader, which pairs the target sets per number
    with pytest.raises(DataError, match="plural words by position, but 'X' has 0 and 'Y' has 1"):
        lpbs_design(only_plural)
    no_plural_targets = WordTest("np", "en", (WordSet("X", ("he",)), WordSet("Y", ("she",))),
                                 (WordSet("A", ("d",)), WordSet("B", ("e",))),
                                 templates={"lpbs": {"plural": ["TARGET like ATTRIBUTE."]}})
    with pytest.raises(DataError, match="no template form"):
        lpbs_design(no_plural_targets)
    three = WordTest("t3", "en", (WordSet("X", ("a",)), WordSet("Y", ("b",)), WordSet("Z", ("c",))),
                     (WordSet("A", ("d",)), WordSet("B", ("e",))))
    with pytest.raises(DataError, match="exactly 2 target"):
        lpbs_design(three)


# --------------------------------------------------------------------------- measure


@pytest.fixture(scope="module")
def tiny_mlms():
    import torch
    from audit import tiny_models
    from audit.backends.hf import load_hf_model

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {k: load_hf_model(str(tiny_models.tiny_model_dir(k)), kind="mlm") for k in ("bert", "roberta")}
    torch.set_num_threads(old)


def _find(seq, sub, last=False):
    idx = [i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub]
    assert idx, (seq, sub)
    return list(range(idx[-1] if last else idx[0], (idx[-1] if last else idx[0]) + len(sub)))


def naive_logps(hm, sentence, target, attribute):
    """One full forward pass per masked sentence; spans found by searching the words' own ids."""
    import torch

    tok, model = hm.tokenizer, hm.model
    ids = tok(sentence)["input_ids"]
    wordpiece = tok.cls_token == "[CLS]"  # BERT: words tokenise alike anywhere
    lead = "" if wordpiece or sentence.startswith(target) else " "
    tpos = _find(ids, tok(lead + target, add_special_tokens=False)["input_ids"])
    sp = "" if wordpiece else " "
    apos = _find(ids, tok(sp + attribute, add_special_tokens=False)["input_ids"], last=True)
    out = []
    for masked in (tpos, tpos + apos):
        m = list(ids)
        for p in masked:
            m[p] = tok.mask_token_id
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([m])).logits[0], -1)
        out.append(sum(lp[p, ids[p]].item() for p in tpos))
    return out[0], out[1], len(tpos), len(apos)


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_scores_equal_one_pass_per_sentence(kind, tiny_mlms):
    hm = tiny_mlms[kind]
    tab = lpbs_scores(hm, SMALL, batch_size=7)
    assert len(tab) == 24 and np.isfinite(tab["ilp"]).all()
    for r in tab.itertuples():
        lt, lpr, nt, na = naive_logps(hm, r.sentence, r.target, r.attribute)
        assert r.logp_target == pytest.approx(lt, abs=1e-4)
        assert r.logp_prior == pytest.approx(lpr, abs=1e-4)
        assert r.ilp == pytest.approx(lt - lpr, abs=2e-4)
        assert (r.n_target_tokens, r.n_attribute_tokens) == (nt, na)
    assert tab["n_target_tokens"].max() > 1 or tab["n_attribute_tokens"].max() > 1  # spans exercised
    # the prior does not depend on the attribute word, only on its token count
    g = tab.groupby(["target", "template", "n_attribute_tokens"])["logp_prior"].nunique()
    assert (g == 1).all()
    np.testing.assert_allclose(lpbs_scores(hm, SMALL, batch_size=64)["ilp"], tab["ilp"], atol=1e-5)


@needs_data
def test_real_lpbs_files_end_to_end(tiny_mlms):
    hm = tiny_mlms["bert"]
    raw = json.loads((LPBS_DIR / "LPBS_1.jsonl").read_text(encoding="utf-8"))
    tab = lpbs_scores(hm, raw)
    assert len(tab) == 2 * 2 * 50  # forms x targets x attributes, one template each
    out = lpbs_metric(tab, seed=0)
    assert out.fields["permutation"]["method"] == "exact"
    assert out.fields["permutation"]["n_partitions"] == 126410606437752  # C(50, 25)
    assert np.isfinite(out.value) and 0 < out.fields["p_value"] <= 1
    assert len(out.items) == 50 and set(out.items["set"]) == {"A", "B"}
    singular = lpbs_scores(hm, raw, forms=["singular"])
    assert set(singular["form"]) == {"singular"} and len(singular) == 100


def test_scores_refuse_non_mlm():
    class Enc:
        kind = "encoder"
        ref = "minilm"

    with pytest.raises(ModelError, match="'minilm'.*LPBS needs a masked LM"):
        lpbs_scores(Enc(), SMALL)


# --------------------------------------------------------------------------- analyse


def synthetic_table(seed=0, n_a=4, n_b=4, shift=0.5):
    """ILP values for 2 targets per set, 2 singular templates and 1 plural template."""
    rng = np.random.default_rng(seed)
    rows = []
    cells = [("singular", "T1"), ("singular", "T2"), ("plural", "T3")]
    attrs = [(0, f"a{i}") for i in range(n_a)] + [(1, f"b{i}") for i in range(n_b)]
    for ai, a in attrs:
        for form, tpl in cells:
            for ti in (0, 1):
                for k in range(2):
                    v = rng.normal() + (shift if (ai == 0) == (ti == 0) else 0.0)
                    rows.append((ti, f"t{ti}{k}", form, tpl, ai, a, v))
    return pd.DataFrame(rows, columns=["target_set", "target", "form", "template", "attribute_set", "attribute", "ilp"])


def test_metric_against_hand_computation_and_brute_force():
    t = synthetic_table()
    out = lpbs_metric(t, permutations="exact")
    # score(a) = mean over cells of (mean ILP of target set 0 - mean ILP of target set 1)
    want = {}
    for (ai, a), g in t.groupby(["attribute_set", "attribute"]):
        cells = [c[c.target_set == 0].ilp.mean() - c[c.target_set == 1].ilp.mean()
                 for _, c in g.groupby(["form", "template"])]
        want[a] = np.mean(cells)
    got = dict(zip(out.items["attribute"], out.items["score"]))
    assert got == pytest.approx(want)
    sa = np.array([want[f"a{i}"] for i in range(4)])
    sb = np.array([want[f"b{i}"] for i in range(4)])
    d = (sa.mean() - sb.mean()) / np.std(np.r_[sa, sb])  # ddof=0 (BIAS framework)
    assert out.value == pytest.approx(d) and out.fields["ddof"] == 0
    assert out.fields["std"] == pytest.approx(np.std(np.r_[sa, sb]))
    # two-sided exact p by enumeration: |mean diff| of a partition >= observed
    allv = np.r_[sa, sb]
    obs = abs(sa.mean() - sb.mean())
    k = 0
    for idx in itertools.combinations(range(8), 4):
        m = np.zeros(8, bool)
        m[list(idx)] = True
        k += abs(allv[m].mean() - allv[~m].mean()) >= obs - 1e-12
    assert out.fields["p_value"] == pytest.approx(k / 70)
    assert out.fields["permutation"]["n_partitions"] == 70
    assert out.fields["n_cells"] == 3 and out.fields["n_attributes"] == [4, 4]


def test_metric_symmetry_and_bias_pairing():
    t = synthetic_table(seed=3, n_a=5, n_b=3)
    out = lpbs_metric(t)
    swapped = lpbs_metric(t.assign(target_set=1 - t["target_set"]))
    assert swapped.value == pytest.approx(-out.value)
    assert swapped.fields["p_value"] == pytest.approx(out.fields["p_value"])
    # BIAS framework: mean over zip(T1, T2) pairs and templates of ILP(t1) - ILP(t2)
    sg = t[t["form"] == "singular"]
    s = lpbs_attribute_scores(sg)
    for a, g in sg.groupby("attribute"):
        diffs = [c[c.target_set == 0].ilp.to_numpy() - c[c.target_set == 1].ilp.to_numpy()
                 for _, c in g.groupby("template")]
        assert s.set_index("attribute").loc[a, "score"] == pytest.approx(np.mean(diffs))
    one = lpbs_metric(t, alternative="greater", permutations=40, seed=1)  # 40 of C(8, 5) = 56
    assert one.fields["permutation"]["method"] == one.fields["p_method"] == "sampled"
    assert one.fields["permutation"]["seed"] == 1
    assert one.fields["p_value"] == lpbs_metric(t, alternative="greater", permutations=40, seed=1).fields["p_value"]
    assert one.fields["p_min"] == 1 / 41 and one.fields["p_convention"] == "phipson_smyth"
    # more draws than the 56 partitions: the exact test, and a note saying so
    many = lpbs_metric(t, alternative="greater", permutations=2000, seed=1)
    assert many.fields["p_method"] == "exact" and many.fields["permutation"]["n_partitions"] == 56
    assert "exact test run instead" in many.fields["p_note"] and many.fields["p_min"] == 1 / 56


def test_metric_errors():
    t = synthetic_table()
    with pytest.raises(DataError, match="lacks column.*ilp"):
        lpbs_metric(t.drop(columns="ilp"))
    bad = t.copy()
    bad.loc[5, "ilp"] = np.inf
    with pytest.raises(DataError, match="ilp is not finite for target 't01', attribute 'a0'"):
        lpbs_metric(bad)
    with pytest.raises(DataError, match="same score"):
        lpbs_metric(t.assign(ilp=1.0))
    with pytest.raises(DataError, match="lacks one target set"):
        lpbs_metric(t[~((t.attribute == "a1") & (t.template == "T2") & (t.target_set == 1))])
    with pytest.raises(ParameterError):
        lpbs_metric(t, permutations=0)
    with pytest.raises(DataError, match="empty"):
        lpbs_metric(t.iloc[:0])
