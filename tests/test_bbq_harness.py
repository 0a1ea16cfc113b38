"""BBQ protocol ``harness`` against lm-evaluation-harness 0.4.13's ``bbq``, ``esbbq`` and ``cabbq``
tasks run by the harness itself, and EsBBQ/CaBBQ's own scores against their code.

The oracle: ``lm_eval.evaluator.simple_evaluate`` on the harness's own task configurations
(``lm_eval/tasks/bbq/bbq_multiple_choice.yaml``, ``lm_eval/tasks/esbbq/_esbbq_common_yaml``,
``lm_eval/tasks/cabbq/_cabbq_common_yaml``, included unchanged: prompt, choices, target,
``process_docs``, ``process_results``, metric aggregations), their documents read from the local
copies of the datasets instead of the Hub (``dataset_path: json``, the published records in the
shape the Hub datasets have: BBQ's JSONL lines; EsBBQ's and CaBBQ's CSV rows with
``answer_info``/``stereotyped_groups`` parsed into a dict and a list), scored by the harness's
``HFLM`` around the same tiny causal model (Qwen2-style tokenizer: no BOS, so the start-token rule
matters). Compared item by item (the harness's per-document
arg-max, logged samples) and in aggregate (the task's reported metrics).

EsBBQ/CaBBQ's ``bias_score.py`` (langtech-bsc/EsBBQ-CaBBQ at ee2e0f6) is, function for function
(docstrings aside), the code of the harness's ``esbbq``/``cabbq`` ``utils.py``: the aggregate check
above is therefore a check against their code; ``test_esbbq_scores_equal_their_code`` also runs
their functions (as the harness ships them) on arbitrary predictions of every Spanish and Catalan
item, and, where ``BIASAUDIT_ESBBQ_REPO`` names a checkout of their repository, asserts that
its ``bias_score.py`` still has those functions unchanged.
"""

from __future__ import annotations

import ast
import functools
import glob
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from audit import tiny_models  # noqa: E402
from audit.backends.hf import load_hf_model  # noqa: E402
from audit.datasets.bbq import read_bbq, select_items  # noqa: E402
from audit.datasets.external import data_root  # noqa: E402
from audit.errors import DataError, ParameterError  # noqa: E402
from audit.measure import bbq as mbbq  # noqa: E402
from audit.metrics.bbq import bbq_counts, bbq_metric, esbbq_scores, harness_scores  # noqa: E402
from lm_eval_compat import assert_close_to_harness, harness_lm, without_env_info  # noqa: E402

DATA = data_root() / "bbq"
needs = pytest.mark.skipif(not all((DATA / x).is_dir() for x in ("en", "es", "ca")),
                           reason=f"BBQ data absent at {DATA}")

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py

LIMIT = {"en": 6, "es": 3, "ca": 3}  # per category and context condition: 72 English, 60 Spanish/Catalan before the fit
LANG = {"bbq": "en", "esbbq": "es", "cabbq": "ca"}  # the harness task of each language


_CACHE: dict = {}


def _es(lang: str) -> tuple[pd.DataFrame, dict[str, dict]]:
    """The Spanish/Catalan test table and published records, read once per module."""
    if lang not in _CACHE:
        _CACHE[lang] = (read_bbq(DATA / lang, language=lang).table, _es_docs(lang))
    return _CACHE[lang]


@pytest.fixture(scope="module")
def model():
    hm = load_hf_model(tiny_models.tiny_model_dir("qwen2"), kind="causal")
    return hm, harness_lm(hm.model, hm.tokenizer, batch_size=16)


def _fits(hm, items: pd.DataFrame, task: str) -> pd.DataFrame:
    """The items whose every request fits the tiny model (both tools refuse or truncate longer ones)."""
    prompts = mbbq.item_prompts(items, mbbq.default_prompt(LANG[task]))
    choices, _ = mbbq.harness_choices(items, task)
    n = [max(len(hm.tokenizer(p + " " + c)["input_ids"]) for c in cs) for p, cs in zip(prompts, choices)]
    return items[np.array(n) < 250].reset_index(drop=True)


def _en_doc(row) -> dict:
    """The published BBQ record of an item (the Hub dataset has the same fields)."""
    f, line = row.where.rsplit(":", 1)
    rec = json.loads(open(DATA / "en" / f, encoding="utf-8").read().split("\n")[int(line) - 1])
    keep = ("example_id", "question_index", "question_polarity", "context_condition", "category", "answer_info",
            "context", "question", "ans0", "ans1", "ans2", "label")
    return {**{k: rec[k] for k in keep},
            "additional_metadata": {"stereotyped_groups": rec["additional_metadata"]["stereotyped_groups"]}}


#: ``ast.literal_eval`` once per distinct text: EsBBQ and CaBBQ repeat about 1,200 texts over their
#: 220,000 list fields (2.6 of this module's 17 CPU-s under cProfile went to parsing them again). The
#: parsed lists are shared between records; the harness's ``process_results`` only reads them.
_literal = functools.lru_cache(maxsize=None)(ast.literal_eval)


_ES_FIELDS = ("instance_id", "question_polarity", "context_condition", "category", "context", "question", "ans0",
              "ans1", "ans2", "question_type")
_ES_PARSED = ("answer_info.ans0", "answer_info.ans1", "answer_info.ans2", "stereotyped_groups")


def _es_docs(lang: str) -> dict[str, dict]:
    """EsBBQ/CaBBQ's CSV rows as the Hub dataset's records (lists and dicts parsed), by item id.

    The columns are read as Python lists (``Series.tolist``: the same ``int``/``str`` values as
    ``DataFrame.to_dict("records")``, which boxed the 24 columns of every row one by one and took
    0.8 of the 1.3 CPU-s a language took)."""
    out = {}
    for f in sorted(glob.glob(str(DATA / lang / "*.csv"))):
        df = pd.read_csv(f, keep_default_na=False)
        cols = {k: df[k].tolist() for k in (*_ES_FIELDS, "label", *_ES_PARSED)}
        for j in range(len(df)):
            doc = {k: cols[k][j] for k in _ES_FIELDS}
            doc["label"] = int(cols["label"][j])
            doc["answer_info"] = {f"ans{i}": _literal(cols[f"answer_info.ans{i}"][j]) for i in range(3)}
            doc["stereotyped_groups"] = _literal(cols["stereotyped_groups"][j])
            out[f"{doc['category']}-{doc['instance_id']}"] = doc
    return out


def _run_harness(tmp: Path, lm, docs: dict[str, list[dict]]) -> dict:
    """``simple_evaluate`` on the harness's own task configs, the documents from local JSONL files."""
    import lm_eval
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    src = Path(lm_eval.__file__).parent / "tasks"
    base = {"bbq": src / "bbq" / "bbq_multiple_choice.yaml", "esbbq": src / "esbbq" / "_esbbq_common_yaml",
            "cabbq": src / "cabbq" / "_cabbq_common_yaml"}
    for task, ds in docs.items():
        data = tmp / f"{task}.jsonl"
        data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in ds), encoding="utf-8")
        (tmp / f"{task}_local.yaml").write_text(
            f"include: {base[task]}\ntask: {task}_local\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    test: {data}\n", encoding="utf-8")
    tm = TaskManager(include_path=str(tmp), include_defaults=False)
    return simple_evaluate(model=lm, tasks=[f"{t}_local" for t in docs], task_manager=tm, log_samples=True,
                           bootstrap_iters=0)


@needs
def test_harness_protocol_equals_lm_eval_tasks(model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    without_env_info(monkeypatch)  # its environment report (pip list & co.): nothing compared here
    hm, lm = model
    en = _fits(hm, select_items(read_bbq(DATA / "en", language="en").table, None, LIMIT["en"]), "bbq")
    es_table, es_docs = _es("es")
    es = _fits(hm, select_items(es_table, None, LIMIT["es"]), "esbbq")
    ca_table, ca_docs = _es("ca")
    ca = _fits(hm, select_items(ca_table, None, LIMIT["ca"]), "cabbq")
    items = {"bbq": en, "esbbq": es, "cabbq": ca}
    docs = {"bbq": [_en_doc(r) for r in en.itertuples()], "esbbq": [es_docs[i] for i in es["item"]],
            "cabbq": [ca_docs[i] for i in ca["item"]]}
    assert len(en) >= 60 and len(es) >= 25 and len(ca) >= 25
    res = _run_harness(tmp_path, lm, docs)
    tables = {}
    for task, t in items.items():
        samples = sorted(res["samples"][f"{task}_local"], key=lambda s: s["doc_id"])
        assert len(samples) == len(t)
        table = mbbq.harness_option_scores(hm, t, task=task, batch_size=16)
        tables[task] = table.copy()
        # the same requests: prompts and choices as the harness built them
        for s, (p, cs) in zip(samples, zip(mbbq.item_prompts(t, mbbq.default_prompt(LANG[task])),
                                           mbbq.harness_choices(t, task)[0])):
            assert [a[0] for a in s["arguments"]] == [p] * len(cs) and [a[1] for a in s["arguments"]] == [" " + c
                                                                                                           for c in cs]
        # item by item: the harness's arg-max over its choices is our prediction
        lls = np.array([[float(r[0]) for r in s["filtered_resps"]] for s in samples])
        assert table["harness_choice"].tolist() == np.argmax(lls, axis=1).tolist()
        assert_close_to_harness(np.array(table["unknown_scores"].tolist()), lls[:, 2:])
        # in aggregate: the task's reported metrics
        out = bbq_metric(table, n_bootstrap=0, harness_task=task)
        got, want = out.fields["harness"], res["results"][f"{task}_local"]
        for k, v in got.items():
            assert v == pytest.approx(float(want[f"{k},none"]), abs=1e-12, nan_ok=True), (task, k)
        if task == "bbq":  # the per-category scores too, and the harness's acc equals ours
            for c, pc in out.fields["per_category"].items():
                assert pc["harness"]["amb_bias_score"] == pytest.approx(float(want[f"amb_bias_score_{c},none"]),
                                                                        abs=1e-12)
                assert pc["harness"]["disamb_bias_score"] == pytest.approx(
                    float(want[f"disamb_bias_score_{c},none"]), abs=1e-12)
            assert out.fields["acc"] == pytest.approx(float(want["acc,none"]), abs=1e-12)
        else:
            assert out.fields["esbbq_bias_amb"] == got["bias_score_ambig"]
            assert out.fields["esbbq_bias_disamb"] == got["bias_score_disambig"]
    # the protocol differs from the item's own options: some predictions change on this model
    plain = mbbq.bbq_option_scores(hm, en, prompt=mbbq.DEFAULT_PROMPT, batch_size=16)
    harness = tables["bbq"]  # harness_option_scores(hm, en, task="bbq", batch_size=16), compared above
    assert (bbq_metric(plain, n_bootstrap=0).items["prediction"]
            != bbq_metric(harness, n_bootstrap=0).items["prediction"]).sum() > 0


@needs
def test_protocol_recorded_in_result_and_key(model):
    from audit import runner
    from audit.runner import LoadedModel

    hm, _ = model
    lm = LoadedModel(ref="tiny-qwen2", kind="causal", backend="hf-causal", revision="x", handle=hm)
    plain = runner.score(lm, "en/bbq", "bbq", {"limit": 2, "n_bootstrap": 0}, seed=1)
    harn = runner.score(lm, "en/bbq", "bbq", {"limit": 2, "n_bootstrap": 0, "protocol": "harness"}, seed=1)
    assert (plain.fields["protocol"], plain.fields["start_token"]) == ("item_options", "always")
    assert (harn.fields["protocol"], harn.fields["start_token"], harn.fields["harness_task"]) == (
        "harness", "harness", "bbq")
    assert plain.provenance["key"] != harn.provenance["key"]
    assert "harness" not in plain.fields and set(harn.fields["harness"]) == {
        "acc", "accuracy_amb", "accuracy_disamb", "amb_bias_score", "disamb_bias_score"}
    assert {"esbbq_bias_amb", "esbbq_bias_disamb"} <= set(plain.fields)
    from jobs.tracker import result_metrics  # the MLflow child run's metrics, beside s_amb / s_dis

    m = result_metrics(harn)
    assert {"s_amb", "s_dis", "esbbq_bias_amb", "esbbq_bias_disamb", "harness.acc", "harness.amb_bias_score",
            "per_category.Age.esbbq_bias_amb"} <= set(m)
    assert m["harness.acc"] == harn.fields["harness"]["acc"]
    with pytest.raises(ParameterError, match="protocol: harness: lm-evaluation-harness has BBQ tasks for en"):
        runner.score(lm, "de/bbq", "bbq", {"limit": 2, "protocol": "harness"})
    with pytest.raises(ParameterError, match=r"^protocol: unknown value 'harnes' \(did you mean 'harness'\?\); known: item_options, harness$"):
        runner.score(lm, "en/bbq", "bbq", {"limit": 2, "protocol": "harnes"})
    with pytest.raises(ParameterError, match="prompt: protocol harness uses the harness task's own prompt"):
        runner.score(lm, "en/bbq", "bbq", {"limit": 2, "protocol": "harness", "prompt": "{context} {question}"})


# --------------------------------------------------------------------------- EsBBQ/CaBBQ's own scores


def _pred_table(t: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    sc = np.full((len(t), 3), -5.0)
    sc[np.arange(len(t)), pred] = -1.0
    out = t[["item", "category", "question_polarity", "context_condition", "label", "unknown", "target", "biased",
             "question_type"]].copy()
    for i in range(3):
        out[f"score{i}"] = sc[:, i]
    return out


@needs
@pytest.mark.parametrize("lang", ["es", "ca"])
@pytest.mark.parametrize("weights", [(1, 1, 1), (1, 4, 2)])
def test_esbbq_scores_equal_their_code(lang, weights):
    from lm_eval.tasks.esbbq import utils as their  # = bias_score.py of langtech-bsc/EsBBQ-CaBBQ (module docstring)

    t, docs = _es(lang)
    rng = np.random.default_rng(sum(weights))
    p = np.array(weights, dtype=float) / sum(weights)
    pred = rng.choice(3, size=len(t), p=p)
    out = bbq_metric(_pred_table(t, pred), n_bootstrap=0)
    res = []
    for item, a in zip(t["item"], pred):
        lls = [-5.0] * 11
        lls[int(a)] = -1.0  # option a (2: the first unknown wording)
        res.append(their.process_results(docs[item], [(x, False) for x in lls]))
    want_amb = their.bias_score_ambig_agg([r["bias_score_ambig"] for r in res])
    want_dis = their.bias_score_disambig_agg([r["bias_score_disambig"] for r in res])
    assert out.fields["esbbq_bias_amb"] == pytest.approx(want_amb, abs=1e-12)
    assert out.fields["esbbq_bias_disamb"] == pytest.approx(want_dis, abs=1e-12)
    assert out.fields["acc_amb"] == pytest.approx(their.acc_ambig_agg([r["acc_ambig"] for r in res]), abs=1e-12)
    assert out.fields["acc_disamb"] == pytest.approx(their.acc_disambig_agg([r["acc_disambig"] for r in res]),
                                                     abs=1e-12)
    # their disambiguated score is not s_DIS: a different number on the same predictions
    assert abs(out.fields["esbbq_bias_disamb"] - out.fields["s_dis"]) > 1e-3
    for c in sorted(set(t["category"])):
        m = (t["category"] == c).to_numpy()
        rc = [r for r, k in zip(res, m) if k]
        assert out.fields["per_category"][c]["esbbq_bias_disamb"] == pytest.approx(
            their.bias_score_disambig_agg([r["bias_score_disambig"] for r in rc]), abs=1e-12, nan_ok=True)


@needs
def test_question_type_from_the_data_where_it_differs_from_the_label():
    """EsBBQ's ``question_type`` disagrees with ``label in biased`` on 4 Spanish items; their code
    reads the column, and so do we."""
    t, _ = _es("es")
    dis = t[t.context_condition == "disambig"]
    derived = np.where([lab in b for lab, b in zip(dis.label, dis.biased)], "pro-stereo", "anti-stereo")
    assert int((derived != dis.question_type.to_numpy()).sum()) == 4
    pred = dis.label.to_numpy()  # every disambiguated item answered correctly: both accuracies 1
    e = esbbq_scores(dis.reset_index(drop=True), bbq_counts(dis.reset_index(drop=True), pred))
    assert e["esbbq_bias_disamb"] == 0.0 and np.isnan(e["esbbq_bias_amb"])


def test_their_bias_score_py_is_the_harness_code():
    repo = os.environ.get("BIASAUDIT_ESBBQ_REPO")
    if not repo or not (Path(repo) / "bias_score.py").is_file():
        pytest.skip("BIASAUDIT_ESBBQ_REPO does not name a checkout of langtech-bsc/EsBBQ-CaBBQ")
    import lm_eval.tasks.esbbq.utils as harness

    def fns(path) -> dict[str, str]:
        out = {}
        for n in ast.parse(Path(path).read_text(encoding="utf-8")).body:
            if isinstance(n, ast.FunctionDef):
                if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
                    n.body = n.body[1:]
                out[n.name] = ast.dump(n)
        return out

    theirs, ours = fns(Path(repo) / "bias_score.py"), fns(harness.__file__)
    assert {k: theirs.get(k) for k in ours} == ours


# --------------------------------------------------------------------------- the protocol's rules


def test_harness_choices_and_refusals():
    t = pd.DataFrame({"item": ["a", "b"], "unknown": [0, 2], "ans0": ["Unknown", "x"], "ans1": ["p", "y"],
                      "ans2": ["q", "Not known"]})
    ch, own = mbbq.harness_choices(t, "bbq")
    assert ch[0][:3] == ["p", "q", "Unknown"] and len(ch[0]) == 12 and own[0][:3] == [1, 2, 0]
    assert ch[1][:2] == ["x", "y"] and own[1] == [0, 1] + [2] * 10
    bad = t.assign(ans0=["I do not know", "x"])
    with pytest.raises(DataError, match="item a: its unknown answer 'I do not know' is none of the harness bbq"):
        mbbq.harness_choices(bad, "bbq")
    with pytest.raises(DataError, match="item a: the harness esbbq task takes ans2 as the unknown answer"):
        mbbq.harness_choices(t, "esbbq")
    ch, own = mbbq.harness_choices(t.iloc[[1]], "cabbq")
    assert ch[0][:3] == ["x", "y", "No hi ha prou informació"] and len(ch[0]) == 11
    from types import SimpleNamespace

    from audit.errors import ModelError

    with pytest.raises(ModelError, match="protocol harness: lm-evaluation-harness's bbq task scores causal LMs; "
                                         "model 'bert' is loaded as kind='mlm'"):
        mbbq.harness_option_scores(SimpleNamespace(kind="mlm", ref="bert"), t, task="bbq")


def test_harness_prediction_refuses_length_norm():
    t = pd.DataFrame({"item": ["a"], "category": ["Age"], "context_condition": ["ambig"], "label": [2],
                      "unknown": [2], "biased": [(0,)], "score0": [-1.0], "score1": [-2.0], "score2": [-3.0],
                      "n_chars0": [1], "n_chars1": [1], "n_chars2": [1], "harness_prediction": [2]})
    assert bbq_metric(t, n_bootstrap=0).items["prediction"].tolist() == [2]  # the harness's, not the 3-way arg-max
    with pytest.raises(ParameterError, match="length_norm: protocol harness predicts by raw log-likelihood"):
        bbq_metric(t, n_bootstrap=0, length_norm="chars")
    assert harness_scores(t, bbq_counts(t, np.array([0])), "bbq")["amb_bias_score"] == 1.0


def test_wordings_and_prompts_are_the_harness_tasks():
    """:data:`HARNESS_UNKNOWN` and the prompts are those of the YAML and utils the harness ships
    (``bbq``, ``esbbq``, ``cabbq``)."""
    import re

    import lm_eval
    from lm_eval.tasks.bbq import utils as bbq_utils

    src = Path(lm_eval.__file__).parent / "tasks"
    assert list(mbbq.HARNESS_UNKNOWN["bbq"]) == bbq_utils.UNKNOWN_RESPONSES
    bbq_yaml = (src / "bbq" / "bbq_multiple_choice.yaml").read_text(encoding="utf-8")
    assert 'doc_to_text: "{{context}}\\n\\nQ: {{question}}\\nA:"' in bbq_yaml
    assert mbbq.default_prompt("en") == "{context}\n\nQ: {question}\nA:"
    for task, lang in (("esbbq", "es"), ("cabbq", "ca")):
        text = (src / task / f"_{task}_common_yaml").read_text(encoding="utf-8")
        choice = re.search(r"doc_to_choice: \"\{\{\[ans0, ans1, (.*)\]\}\}\"", text).group(1)
        assert [w.strip().strip("'") for w in choice.split("',")] == list(mbbq.HARNESS_UNKNOWN[task])
        prompt = re.search(r'doc_to_text: "(.*)"', text).group(1).replace("\\n", "\n")
        assert mbbq.default_prompt(lang) == prompt.replace("{{context}}", "{context}").replace("{{question}}",
                                                                                              "{question}")


# --------------------------------------------------------------------------- EsBBQ/CaBBQ scores in the breakdowns


@needs
def test_esbbq_intervals_are_the_bootstrap_of_their_scores():
    """The bootstrap interval of EsBBQ's scores: on each resample (the same multinomial draws as
    the five common scores, stratum by stratum), :func:`esbbq_scores` of the resampled items;
    the percentile interval of those. The common scores' intervals are unchanged by them."""
    from audit.metrics import bbq as mb

    t, _ = _es("es")
    t = select_items(t, ["Age", "Gender"], 20).reset_index(drop=True)
    pred = np.random.default_rng(3).choice(3, size=len(t), p=[0.4, 0.35, 0.25])
    out = bbq_metric(_pred_table(t, pred), n_bootstrap=200, seed=11)
    counts = bbq_counts(t, pred)
    amb = counts["amb"].to_numpy(dtype=bool)
    strata = np.array([f"{c}\x00{a}" for c, a in zip(t["category"].astype(str), amb)])
    rng = mb._stream(11, "\x00overall")
    weights = {s: rng.multinomial((strata == s).sum(), np.full((strata == s).sum(), 1 / (strata == s).sum()),
                                  size=200) for s in np.unique(strata)}  # one chunk (_BOOT_CHUNK)
    assert mb._BOOT_CHUNK >= 200
    dist = {k: [] for k in mb.ESBBQ_NAMES}
    for b in range(200):
        idx = np.concatenate([np.repeat(np.flatnonzero(strata == s), weights[s][b]) for s in np.unique(strata)])
        e = esbbq_scores(t.iloc[idx].reset_index(drop=True), counts.iloc[idx].reset_index(drop=True))
        for k in dist:
            dist[k].append(e[k])
    for k in mb.ESBBQ_NAMES:
        d = np.array(dist[k])
        want = np.quantile(d[np.isfinite(d)], [0.025, 0.975])
        np.testing.assert_allclose(out.fields["cis"][k], want, rtol=0, atol=1e-12)
        assert out.fields["cis"][k][0] <= out.fields[k] <= out.fields["cis"][k][1]
    assert set(out.fields["per_category"]["Age"]["ci"]) >= set(mb.ESBBQ_NAMES)


@needs
def test_esbbq_scores_in_the_report_breakdowns(tmp_path):
    """breakdowns.parquet, a LaTeX table and a plot of each EsBBQ/CaBBQ score by category, with
    its n and bootstrap interval, from the MLflow rows of real results."""
    from audit.result import Result
    from jobs.report import results_frame, write_breakdowns
    from jobs.tracker import _row, result_metrics

    t, _ = _es("ca")
    t = select_items(t, ["Age", "SES"], 10).reset_index(drop=True)
    rows, outs = [], {}
    for m, seed in (("m1", 1), ("m2", 2)):
        pred = np.random.default_rng(seed).choice(3, size=len(t))
        out = outs[m] = bbq_metric(_pred_table(t, pred), n_bootstrap=200, seed=5)
        res = Result(metric="bbq", value=out.value, fields=out.fields, items=None, coverage={}, missing={},
                     params={}, seed=0, provenance={})
        tags = {"audit.model": m, "audit.language": "ca", "audit.test": "ca/bbq", "audit.metric": "bbq",
                "audit.status": "finished"}
        rows.append(_row(tags, {}, result_metrics(res), None))
    (tmp_path / "tables").mkdir()
    (tmp_path / "plots").mkdir()
    names = {p.name for p in write_breakdowns(results_frame(rows), tmp_path)}
    for k in ("esbbq_bias_amb", "esbbq_bias_disamb"):
        assert {f"bbq_ca_bbq_per_category_{k}.tex", f"bbq_ca_bbq_per_category_{k}.png"} <= names
    bd = pd.read_parquet(tmp_path / "breakdowns.parquet")
    row = bd[(bd.model == "m2") & (bd.category == "Age") & (bd.score == "esbbq_bias_disamb")].iloc[0]
    pc = outs["m2"].fields["per_category"]["Age"]
    assert (row["value"], row["low"], row["high"], row["n"]) == (
        pytest.approx(pc["esbbq_bias_disamb"]), pytest.approx(pc["ci"]["esbbq_bias_disamb"][0]),
        pytest.approx(pc["ci"]["esbbq_bias_disamb"][1]), pc["n_items"])
    tex = (tmp_path / "tables" / "bbq_ca_bbq_per_category_esbbq_bias_disamb.tex").read_text()
    assert f"n={pc['n_items']}" in tex and f"[{pc['ci']['esbbq_bias_disamb'][0]:.2f}, " in tex
    # SES's first 10 disambiguated items are all of one question type: no score, no row (never a NaN cell)
    assert outs["m2"].fields["per_category"]["SES"]["esbbq_bias_disamb"] is None
    assert not ((bd.category == "SES") & (bd.score == "esbbq_bias_disamb")).any()
