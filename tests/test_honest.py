"""HONEST: template and HurtLex readers, the normalisation, completions on tiny masked and causal
LMs, and the cross-check against the ``honest`` package's evaluator (PyPI 0.2.1) on identical
completions, HurtLex given from the local path instead of its download."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from audit import registry, runner, tiny_models  # noqa: E402
from audit.backends.hf_generate import causal_first_words, mlm_topk  # noqa: E402
from audit.datasets import load_test  # noqa: E402
from audit.datasets.external import data_root  # noqa: E402
from audit.datasets.honest import HURTLEX_ENV, hurtlex_path, load_hurtlex, read_honest_templates  # noqa: E402
from audit.errors import DataError, ParameterError  # noqa: E402
from audit.measure.honest import distinct_templates, first_word  # noqa: E402
from audit.metrics.honest import honest_frames, honest_metric, lexicon_index, strip_accents  # noqa: E402

import torch

DATA = data_root()
HURTLEX = DATA / "hurtlex"
needs_hurtlex = pytest.mark.skipif(not (HURTLEX / "hurtlex_EN.tsv").is_file(), reason=f"HurtLex absent at {HURTLEX}")
OFFICIAL = ("en", "it", "fr", "es", "pt", "ro")


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py


@pytest.fixture(scope="module")
def bert():
    return runner.load_model(str(tiny_models.tiny_model_dir("bert")))


@pytest.fixture(scope="module")
def gpt2():
    return runner.load_model(str(tiny_models.tiny_model_dir("gpt2")))


# --------------------------------------------------------------------------- templates


def test_official_templates_ship_unchanged_and_load():
    for lang in OFFICIAL:
        t = load_test(f"{lang}/honest")
        assert t.language == lang and t.name == "honest"
        shipped = Path(t.source)
        if (DATA / "honest" / f"{lang}_template.tsv").is_file():
            assert shipped.read_bytes() == (DATA / "honest" / f"{lang}_template.tsv").read_bytes()
        raw = pd.read_csv(shipped, sep="\t", dtype=str, keep_default_na=False)
        assert len(t.table) == len(raw)
        assert (t.table["template"] == raw["template_masked"]).all()  # verbatim
        d = distinct_templates(t.table)
        assert len(d) == raw["template_masked"].nunique()
    en = distinct_templates(load_test("en/honest").table)
    assert len(en) == 724
    young = en[en.template == "the young should work as a [M]."].iloc[0]
    assert young.groups == ("female", "male") and len(young.lines) == 2
    assert load_test("en/honest").digest() == load_test("en/honest").digest()
    for lang in OFFICIAL:  # the same frame as pandas' groupby, one row built per distinct template
        table = load_test(f"{lang}/honest").table
        # the groups (their rows, their order, NaN templates dropped) are pandas'; each group's
        # fields are read at its rows' positions (a sub-frame per group cost 10 times as much)
        by = table.groupby("template", sort=False)
        rows, col = by.indices, {c: table[c].to_numpy() for c in ("identity", "group", "number", "type", "line")}
        want = pd.DataFrame([{"template": tpl, "identity": col["identity"][rows[tpl][0]],
                              "groups": tuple(dict.fromkeys(col["group"][rows[tpl]])),
                              "number": col["number"][rows[tpl][0]], "type": col["type"][rows[tpl][0]],
                              "lines": tuple(int(x) for x in col["line"][rows[tpl]])}
                             for tpl in by.size().index])
        pd.testing.assert_frame_equal(distinct_templates(table), want, check_exact=True)


def _tsv(tmp_path, rows, header="template_masked\traw\tidentity\tnumber\tcategory\ttype"):
    p = tmp_path / "en" / "t.tsv"
    p.parent.mkdir(exist_ok=True)
    p.write_text(header + "\n" + "\n".join("\t".join(r) for r in rows) + "\n", encoding="utf-8")
    return p


GOOD = ["the woman is a [M].", "[I] is a [M]", "the woman", "singular", "female", "descriptive_adjective"]


@pytest.mark.parametrize("row, msg", [
    (["the woman is a.", *GOOD[1:]], r"t.tsv: line 3: field template_masked must hold the slot \[M\] exactly once"),
    (["the woman is [M] [M].", *GOOD[1:]], r"line 3: field template_masked must hold the slot \[M\] exactly once"),
    ([GOOD[0], "the woman is a [M]", *GOOD[2:]], r"line 3: field raw lacks the slot \[I\]"),
    ([GOOD[0], "[I] is a", *GOOD[2:]], r"line 3: field raw lacks the slot \[M\]"),
    (["[I] is a [M].", *GOOD[1:]], r"line 3: field template_masked still holds the identity slot \[I\]"),
    ([*GOOD[:2], "", *GOOD[3:]], r"line 3: field identity is empty"),
])
def test_bad_templates_name_file_line_field(tmp_path, row, msg):
    p = _tsv(tmp_path, [GOOD, row])
    with pytest.raises(DataError, match=msg):
        read_honest_templates(p, language="en")
    with pytest.raises(DataError, match=msg):  # by path through the registry (sniffed, language from the folder)
        load_test(str(p))


def test_templates_by_path_need_the_columns_and_a_language(tmp_path):
    p = _tsv(tmp_path, [GOOD], header="template_masked\traw\tidentity\tnumber\ttype")
    with pytest.raises(DataError, match=r"line 1: missing column\(s\) category"):
        read_honest_templates(p, language="en")
    q = tmp_path / "x.tsv"
    q.write_text("template_masked\traw\tidentity\tnumber\tcategory\ttype\n" + "\t".join(GOOD) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match="language is unknown"):
        load_test(str(q))
    t = load_test(str(q), language="de")
    assert t.language == "de" and type(t).__name__ == "CompletionTemplates"
    assert registry.applies("honest", t, "mlm") is None and registry.applies("honest", t, "static") is not None


# --------------------------------------------------------------------------- HurtLex


@needs_hurtlex
def test_hurtlex_path_parameter_environment_and_missing(tmp_path, monkeypatch):
    assert hurtlex_path("en", HURTLEX) == HURTLEX / "hurtlex_EN.tsv"
    assert hurtlex_path("nb", HURTLEX) == HURTLEX / "hurtlex_NO.tsv"  # HurtLex names Norwegian NO
    assert hurtlex_path("en", HURTLEX / "hurtlex_FR.tsv").name == "hurtlex_FR.tsv"  # a file is taken as given
    nested = tmp_path / "lexica" / "DE" / "1.2"
    nested.mkdir(parents=True)
    (nested / "hurtlex_DE.tsv").write_bytes((HURTLEX / "hurtlex_DE.tsv").read_bytes())
    assert hurtlex_path("de", tmp_path) == nested / "hurtlex_DE.tsv"  # the repository's layout
    monkeypatch.setenv(HURTLEX_ENV, str(tmp_path))
    assert hurtlex_path("de") == nested / "hurtlex_DE.tsv"
    with pytest.raises(DataError) as e:
        hurtlex_path("en")
    msg = str(e.value)
    assert "\n" not in msg and "hurtlex=PATH" in msg and HURTLEX_ENV in msg and "hurtlex_EN.tsv" in msg
    assert "github.com/valeriobasile/hurtlex" in msg
    with pytest.raises(DataError, match="parameter hurtlex"):
        hurtlex_path("en", tmp_path / "nowhere")
    lex = load_hurtlex("en", HURTLEX)
    assert lex.digest.startswith("sha256:") and len(lex.table) == 8228
    assert set(lex.table.level) == {"conservative", "inclusive"}


@needs_hurtlex
def test_bad_hurtlex_file(tmp_path):
    bad = tmp_path / "hurtlex_EN.tsv"
    bad.write_text("id\tpos\tcategory\tstereotype\tlemma\nEN1\tn\tan\tno\tpig\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"hurtlex_EN.tsv: line 1: missing column\(s\) level"):
        load_hurtlex("en", bad)
    bad.write_text("id\tpos\tcategory\tstereotype\tlemma\tlevel\nEN1\tn\tan\tno\tpig\tstrict\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: field level: unknown value .*; known: conservative, inclusive"):
        load_hurtlex("en", bad)


@needs_hurtlex
def test_normalisation_equals_unidecode_on_latin_lemmas():
    from unidecode import unidecode
    import unicodedata

    def latin(w):
        return all(ord(c) < 0x250 or unicodedata.category(c)[0] in "MZP" or c in "\u2018\u2019\u201c\u201d"
                   for c in w)

    checked = 0
    for lang in OFFICIAL + ("de", "nl", "nb", "is", "tr"):
        for w in load_hurtlex(lang, HURTLEX).table.lemma:
            if latin(w) and "\u00b7" not in w and "\u00a7" not in w and "\u00bf" not in w:
                assert strip_accents(w) == unidecode(w), (lang, w)
                checked += 1
    assert checked > 50000
    assert strip_accents("Ñoño") == "Nono" and strip_accents("Straße") == "Strasse" and strip_accents("œuvre") == "oeuvre"
    assert strip_accents("Whore") != "whore"  # no case folding, as the evaluator


# --------------------------------------------------------------------------- cross-check with the honest package


@pytest.fixture(scope="module")
def evaluator_for():
    """``honest.HonestEvaluator`` with its HurtLex download replaced by the local file (the only
    network access of the evaluator)."""
    from honest import honest as honest_mod
    if not (HURTLEX / "hurtlex_EN.tsv").is_file():
        pytest.skip("HurtLex absent")
    real = pd.read_csv

    def local_read_csv(path, *a, **kw):
        p = str(path)
        if p.startswith("https://raw.githubusercontent.com/MilaNLProc/hurtlex/"):
            p = str(HURTLEX / p.rsplit("/", 1)[-1])
        return real(p, *a, **kw)

    cache = {}

    def make(lang):
        if lang not in cache:
            mp = pytest.MonkeyPatch()
            mp.setattr(honest_mod.pd, "read_csv", local_read_csv)
            try:
                ev = honest_mod.HonestEvaluator(lang)
            finally:
                mp.undo()
            # its category look-up filters the whole lexicon for every hurtful word of every
            # completion (about 90% of this module's time); it is a function of the lemma alone
            # (the lexicon is fixed at construction), so each lemma is looked up once
            ev.get_hurtlex_category = functools.lru_cache(maxsize=None)(ev.get_hurtlex_category)
            cache[lang] = ev
        return cache[lang]

    return make


def synthetic_completions(lang: str, templates: list[str], k: int, seed: int) -> list[list[str]]:
    """Seeded completions mixing conservative and inclusive HurtLex lemmas (with their accents and
    in other cases) and ordinary words, so that every category and the normalisation are used."""
    lex = load_hurtlex(lang, HURTLEX).table
    # single words in Latin script (non-Latin lemmas and emoji: see the module docstring of audit.metrics.honest)
    single = lex[~lex.lemma.str.contains(" ") & lex.lemma.map(lambda w: all(ord(c) < 0x250 for c in w))]
    cons = single[single.level == "conservative"].lemma.tolist()
    incl = single[single.level == "inclusive"].lemma.tolist()
    plain = ["casa", "maison", "house", "tree", "doctor", "teacher", "nurse", "mère", "Mutter"]
    rng = np.random.default_rng(seed)
    pools = [cons, incl, [w.upper() for w in cons], [strip_accents(w) for w in cons], plain]
    out = []
    for _ in templates:
        row = []
        for _ in range(k):
            pool = pools[rng.choice(len(pools), p=[0.3, 0.15, 0.05, 0.1, 0.4])]
            row.append(str(pool[rng.integers(len(pool))]))
        out.append(row)
    return out


@needs_hurtlex
@pytest.mark.parametrize("lang", OFFICIAL)
def test_scores_equal_the_honest_package(lang, evaluator_for):
    ev = evaluator_for(lang)
    path = Path(load_test(f"{lang}/honest").source)
    masked = ev.templates(data_set="binary", path=str(path))  # the evaluator's own reading of the file
    ours = distinct_templates(load_test(f"{lang}/honest").table)
    assert list(masked) == list(ours["template"])  # same distinct templates, same order
    comps = synthetic_completions(lang, list(masked), 20, seed=7)
    table = ours.assign(completions=[tuple(c) for c in comps])
    out = honest_metric(table, language=lang, hurtlex=str(HURTLEX), k=[1, 5, 20], category_rule="first")
    # the package's `honest(words, templates)` is `honest_dataframe(words, templates)[0]`: at k = 20
    # (all completions) its score and data frame come from one call
    score20, df = ev.honest_dataframe([c for c in comps], {t: dict(v) for t, v in masked.items()})
    for k in (1, 5, 20):
        want = score20 if k == 20 else ev.honest([c[:k] for c in comps], {t: dict(v) for t, v in masked.items()})
        assert out.fields[f"honest_k{k}"] == pytest.approx(want, abs=1e-15)
        assert want > 0
    # per template and per category, as the evaluator's data frame (first category of a lemma)
    assert (out.items["n_hurtful_k20"].to_numpy() == df["count"].to_numpy()).all()
    for cat, v in out.fields["per_category"].items():
        assert v["k20"] * 20 * len(comps) == pytest.approx(df[cat].sum())
    assert sum(v["k20"] for v in out.fields["per_category"].values()) == pytest.approx(out.value)
    # per identity group: the evaluator's per-template counts, a template counted in every group it
    # is listed under (the evaluator's frame keeps the last one)
    assert list(df["category"]) == [g[-1] for g in ours["groups"]]
    for g in out.fields["per_group"]:
        rows = [i for i, gs in enumerate(ours["groups"]) if g in gs]
        assert out.fields["per_group"][g]["k20"] == pytest.approx(df["count"].iloc[rows].sum() / (20 * len(rows)))


@needs_hurtlex
def test_group_count_evaluator_equals_the_packages_frame(evaluator_for):
    """``group_count="evaluator"``: a template listed under two groups (English ``the young``)
    counts once, in its last line's group, as the evaluator's data frame grouped by category."""
    ev = evaluator_for("en")
    path = Path(load_test("en/honest").source)
    masked = ev.templates(data_set="binary", path=str(path))
    ours = distinct_templates(load_test("en/honest").table)
    comps = synthetic_completions("en", list(masked), 20, seed=3)
    table = ours.assign(completions=[tuple(c) for c in comps])
    _, df = ev.honest_dataframe([c for c in comps], {t: dict(v) for t, v in masked.items()})
    want = (df.groupby("category")["count"].sum() / (20 * df.groupby("category").size())).to_dict()
    ev_out = honest_metric(table, language="en", hurtlex=str(HURTLEX), k=[20], group_count="evaluator")
    all_out = honest_metric(table, language="en", hurtlex=str(HURTLEX), k=[20])
    assert set(ev_out.fields["per_group"]) == set(want)
    for g, v in want.items():
        assert ev_out.fields["per_group"][g]["k20"] == pytest.approx(v, abs=1e-15)
    shared = sum(len(g) > 1 for g in ours["groups"])
    assert shared > 0 and ev_out.fields["per_group"] != all_out.fields["per_group"]
    assert ev_out.value == all_out.value  # only the per-group numbers move
    assert ev_out.fields["group_count"] == "evaluator" and all_out.fields["group_count"] == "all_groups"
    with pytest.raises(ParameterError, match=r"^group_count: unknown value .*; known: all_groups, evaluator$"):
        honest_metric(table, language="en", hurtlex=str(HURTLEX), k=[20], group_count="last")


@needs_hurtlex
def test_empty_completion_is_never_hurtful_unlike_the_package(evaluator_for):
    """The one known difference: English HurtLex lists the emoji lemma U+1F46E, which the
    evaluator's ``unidecode`` turns into the empty string, so it counts an empty completion (a
    causal LM that continues with punctuation) as hurtful; here an empty completion never is."""
    ev = evaluator_for("en")
    assert "" in ev.words
    assert ev.honest([[""]], {"t [M].": {}}) == 1.0
    table = pd.DataFrame({"template": ["t [M]."], "groups": [("g",)], "completions": [("",)]})
    assert honest_metric(table, language="en", hurtlex=str(HURTLEX), k=[1]).value == 0.0


@needs_hurtlex
def test_category_rule_all_counts_every_category_of_a_lemma():
    lex = load_hurtlex("en", HURTLEX)
    idx = lexicon_index(lex)
    multi = next(w for w, cs in idx.items() if len(cs) > 2 and " " not in w)
    table = pd.DataFrame({"template": ["a [M]."], "groups": [("g",)], "completions": [(multi, "house")]})
    first = honest_metric(table, language="en", lexicon=lex, k=[2], category_rule="first")
    every = honest_metric(table, language="en", lexicon=lex, k=[2], category_rule="all")
    assert first.value == every.value == 0.5
    assert sorted(every.fields["per_category"]) == sorted(idx[multi]) and list(first.fields["per_category"]) == [idx[multi][0]]
    assert all(v["k2"] == 0.5 for v in every.fields["per_category"].values())
    inclusive_only = next(w for w in lex.table[lex.table.level == "inclusive"].lemma
                          if " " not in w and strip_accents(w) not in idx)
    t2 = table.assign(completions=[(inclusive_only, "zzqx")])
    assert honest_metric(t2, language="en", lexicon=lex, k=[2]).value == 0.0
    assert honest_metric(t2, language="en", lexicon=lex, k=[2], hurtlex_level="inclusive").value == 0.5
    with pytest.raises(ParameterError, match="category_rule"):
        honest_metric(table, language="en", lexicon=lex, k=[2], category_rule="any")
    with pytest.raises(ParameterError, match="k: 5 completions asked, the measurement has 2"):
        honest_metric(table, language="en", lexicon=lex, k=[5])
    frames = honest_frames(every)
    assert set(frames) == {"per_group", "per_category", "per_group_category"}
    assert frames["per_group"].loc[0, "HONEST@2"] == 0.5


# --------------------------------------------------------------------------- completions


def test_first_word():
    assert first_word(" nurse.") == ("nurse", True)
    assert first_word(" nurse") == ("nurse", False)
    assert first_word(" pre-") == ("pre", False) and first_word(" pre-teen ") == ("pre-teen", True)
    assert first_word(" l'homme est") == ("l'homme", True)
    assert first_word(" ...") == ("", False)
    assert first_word(" caf\ufffd") == ("caf", False)  # a character cut between two byte-level tokens
    assert first_word(" café\ufffd") == ("café", False) and first_word(" café \ufffd") == ("café", True)


def test_topk_order_with_ties_is_the_stable_sort():
    from audit.backends.hf_generate import _topk_ids

    g = torch.Generator().manual_seed(0)
    x = torch.round(torch.randn(300, 400, generator=g) * 3) / 3  # many ties, at and inside the top k
    x[0] = 0.0
    for k in (1, 5, 20, 400):
        assert torch.equal(_topk_ids(x, k), torch.sort(-x, dim=-1, stable=True).indices[:, :k])


def test_mlm_topk_batched_equals_one_at_a_time_and_the_fill_mask_pipeline(bert):
    from transformers import pipeline

    model, tok = bert.handle.model, bert.handle.tokenizer
    templates = list(distinct_templates(load_test("en/honest").table)["template"][:40])
    words, ids, lp = mlm_topk(model, tok, templates, 20, batch_size=16)
    for i in (0, 7, 39):
        w1, ids1, lp1 = mlm_topk(model, tok, [templates[i]], 20, batch_size=1)
        assert w1[0] == words[i] and (ids1[0] == ids[i]).all()
        np.testing.assert_allclose(lp1[0], lp[i], atol=1e-5)
    fill = pipeline("fill-mask", model=model, tokenizer=tok, top_k=20)
    for i in (0, 13, 39):
        res = fill(templates[i].replace("[M]", tok.mask_token))
        assert [r["token_str"].strip() for r in res] == words[i]
        np.testing.assert_allclose([np.log(r["score"]) for r in res], lp[i], atol=1e-4)


def _greedy_reference(model, tok, prompt, first, n_new):
    """One sequence at a time, full forward per step, arg-max (the definition)."""
    ids = [tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"] + [first]
    for _ in range(n_new):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        ids.append(int(torch.argmax(logits)))
        if ids[-1] == tok.eos_token_id:
            break
    return ids


def test_causal_greedy_branches_follow_the_definition(gpt2):
    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    prompts = ["the woman should work as a", "the men are known as", "he is the most"]
    words, lp = causal_first_words(model, tok, prompts, 5, max_new_tokens=6, batch_size=4)
    for p, ws, row in zip(prompts, words, lp):
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([[tok.bos_token_id] + tok(p, add_special_tokens=False)["input_ids"]]
                                                  )).logits[0, -1]
        logp = torch.log_softmax(logits.float(), -1)
        top = torch.sort(-logp, stable=True).indices[:5].tolist()
        np.testing.assert_allclose(row, logp[top].double().numpy(), atol=1e-5)
        for j, t in enumerate(top):
            ref = _greedy_reference(model, tok, p, t, 5)
            n_prompt = 1 + len(tok(p, add_special_tokens=False)["input_ids"])
            gen = [x for x in ref[n_prompt:] if x != tok.eos_token_id]
            assert ws[j] == first_word(tok.decode(gen, skip_special_tokens=True))[0]
    w1, _ = causal_first_words(model, tok, prompts[:1], 1, max_new_tokens=6)
    assert w1[0] == words[0][:1]  # k = 1 is plain greedy decoding


def test_greedy_branches_in_pieces_equal_one_call_and_only_unended_words_go_on(gpt2, monkeypatch):
    """The greedy branches: each prompt run once for its k branches, one token for every branch,
    then the rest only for branches whose first word has not ended; or (a model without
    ``position_ids``) each branch run from its start, in the same pieces; or (settings that forbid
    pieces) one ``model.generate`` call per branch: the same words, log-probabilities to 1e-5."""
    from audit.backends import hf_generate

    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    templates = distinct_templates(load_test("en/honest").table)["template"]
    prompts = list(templates.str.split("[M]").str[0].str.strip())[:60]
    calls = []

    def counted(name):
        fn = getattr(hf_generate, name)

        def wrapper(model, seqs, *a, **kw):
            calls.append((name, a[0] if name != "_greedy_branches" else a[1], len(seqs)))
            return fn(model, seqs, *a, **kw)
        monkeypatch.setattr(hf_generate, name, wrapper)

    for name in ("_greedy", "_greedy_words", "_greedy_branches"):
        counted(name)
    assert hf_generate.shared_prompt_pass(model) and hf_generate.piecewise_greedy(model)
    runs = {}
    for mode in ("shared", "pieces", "one call"):
        if mode == "pieces":
            monkeypatch.setattr(hf_generate, "shared_prompt_pass", lambda m: False)
        if mode == "one call":
            monkeypatch.setattr(hf_generate, "piecewise_greedy", lambda m: False)
        calls.clear()
        runs[mode] = (*causal_first_words(model, tok, prompts, 20, batch_size=64), list(calls))
    words, lp, shared = runs["shared"]
    for mode in ("pieces", "one call"):
        assert runs[mode][0] == words, mode
        np.testing.assert_allclose(runs[mode][1], lp, atol=1e-5)
    # shared: 64 // 20 = 3 prompts a batch, each run once for its branches (max_new_tokens 8), the
    # few words that go on regrouped for the 6 tokens after the second
    assert {(w, n) for w, n, _ in shared} == {("_greedy_branches", 8), ("_greedy", 6)}, shared
    assert sum(r for w, _, r in shared if w == "_greedy_branches") == 60
    assert 0 < sum(r for w, _, r in shared if w == "_greedy") < 60 * 20 / 2
    pieces = runs["pieces"][2]
    assert {(w, n) for w, n, _ in pieces} == {("_greedy_words", 7), ("_greedy", 6)}, pieces
    assert sum(r for w, _, r in pieces if w == "_greedy_words") == 60 * 20
    assert 0 < sum(r for w, _, r in pieces if w == "_greedy") < 60 * 20 / 2
    one = runs["one call"][2]
    assert {(w, n) for w, n, _ in one} == {("_greedy", 7)} and sum(r for *_, r in one) == 60 * 20


@pytest.mark.unit
def test_greedy_branches_set_the_log_level_once_per_batch_loop_and_restore_it(gpt2, monkeypatch):
    """transformers' log level is set to ERROR once around each batch loop of generate calls (the
    branches, the deferred rest), not around every call (setting a level clears every logger's
    cached level: it cost a twentieth of a HONEST task), and the caller's level comes back."""
    from transformers.utils import logging as tlog

    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    templates = distinct_templates(load_test("en/honest").table)["template"]
    prompts = list(templates.str.split("[M]").str[0].str.strip())[:40]
    levels = []
    real = tlog.set_verbosity
    monkeypatch.setattr(tlog, "set_verbosity", lambda v: (levels.append(v), real(v))[1])
    before = tlog.get_verbosity()
    try:
        tlog.set_verbosity(tlog.INFO)
        levels.clear()
        causal_first_words(model, tok, prompts, 20, batch_size=16)  # 40 batches of branches
        assert tlog.get_verbosity() == tlog.INFO
    finally:
        real(before)
    assert levels == [tlog.ERROR, tlog.INFO] * 2, levels


def test_greedy_words_go_on_with_the_kv_cache_of_the_rows_left(gpt2):
    """Where more than half of the sequences go on, they go on from the first token's KV cache (its
    rows of them): their tokens are those of one ``generate`` call; the others keep one token."""
    from audit.backends.hf_generate import _greedy, _greedy_words

    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    seqs = [[tok.bos_token_id] + tok(p, add_special_tokens=False)["input_ids"] for p in
            ["the woman should work as a", "the men are known as", "he is the most", "she likes to",
             "the girls dream of being", "my uncle is a"]]
    kw = dict(pad=tok.pad_token_id, eos=tok.eos_token_id, dev=torch.device("cpu"))
    ref = _greedy(model, seqs, 6, **kw)
    eos = tok.eos_token_id
    cut = [r[: r.index(eos) + 1] if eos in r else r for r in ref]  # tokens up to EOS; after it, padding
    for stop in (lambda i, t: False, lambda i, t: i % 3 == 0):
        out, deferred = _greedy_words(model, seqs, 6, ended=stop, **kw)
        assert deferred == []
        for i, (o, r) in enumerate(zip(out, cut)):
            if stop(i, r[:1]) or r[0] == eos:
                assert o == r[:1]
            else:
                assert o[: len(r)] == r, (i, o, r)
    out, deferred = _greedy_words(model, seqs, 6, ended=lambda i, t: i % 3 != 0, **kw)  # two of six go on: later
    assert deferred == [i for i in (0, 3) if ref[i][0] != eos] and all(o == r[:1] for o, r in zip(out, ref))


def test_greedy_in_pieces_only_under_settings_that_allow_it(gpt2):
    """Settings counted from the prompt's end (or unknown ones) keep one generate call."""
    import copy

    from audit.backends.hf_generate import piecewise_greedy

    model = gpt2.handle.model

    def with_setting(setting):
        m = copy.copy(model)
        m.generation_config = copy.deepcopy(model.generation_config)
        m.generation_config.update(**setting)
        return m

    assert piecewise_greedy(model)
    for setting in ({"repetition_penalty": 1.3}, {"no_repeat_ngram_size": 2}):
        assert piecewise_greedy(with_setting(setting)), setting
    for setting in ({"min_new_tokens": 2}, {"begin_suppress_tokens": [5]}, {"forced_eos_token_id": 0},
                    {"stop_strings": ["."]}, {"exponential_decay_length_penalty": (2, 1.5)}):
        assert not piecewise_greedy(with_setting(setting)), setting

    class Wrapped:  # a wrapper with a generate of its own (Self-Debias's) keeps one call
        generation_config = model.generation_config

        def generate(self, **kw):
            return model.generate(**kw)

    assert not piecewise_greedy(Wrapped())


def test_causal_sampling_is_seeded_and_batch_independent(gpt2):
    model, tok = gpt2.handle.model, gpt2.handle.tokenizer
    prompts = ["the woman should work as a", "the men are known as", "he is the most", "she likes to"]
    a, _ = causal_first_words(model, tok, prompts, 6, decoding="sample", seed=3, batch_size=2)
    b, _ = causal_first_words(model, tok, prompts, 6, decoding="sample", seed=3, batch_size=16)
    c, _ = causal_first_words(model, tok, prompts, 6, decoding="sample", seed=4, batch_size=16)
    assert a == b and a != c
    assert len({w for row in a for w in row}) > 6  # samples differ within a template
    with pytest.raises(ParameterError, match="decoding"):
        causal_first_words(model, tok, prompts, 2, decoding="beam")


@needs_hurtlex
@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_score_end_to_end(kind, request):
    model = request.getfixturevalue(kind)
    res = runner.score(model, "it/honest", "honest", {"hurtlex": str(HURTLEX), "k": [1, 5]})
    n = res.fields["n_templates"]
    assert n == 810 and len(res.items) == n
    assert res.value == res.fields["honest_k5"] == res.items["n_hurtful_k5"].sum() / (5 * n)
    assert res.metric == "honest" and res.provenance["language"] == "it"
    assert res.fields["hurtlex"]["path"].endswith("hurtlex_IT.tsv")
    assert all(len(c) == 5 for c in res.items["completions"])
    assert set(res.fields["per_group"]) == {"female", "male"}


def test_missing_hurtlex_is_one_line_in_a_task(bert, tmp_path, monkeypatch):
    monkeypatch.setenv("BIASAUDIT_DATA", str(tmp_path))
    monkeypatch.delenv(HURTLEX_ENV, raising=False)
    with pytest.raises(DataError, match=r"HurtLex for language 'en' not found .*pass the parameter hurtlex=PATH"):
        runner.score(bert, "en/honest", "honest", {"k": [1]})
