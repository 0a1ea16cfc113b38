"""``audit compare run:... run:...``: two finished sweeps in MLflow compared from their stored
per-item tables (jobs.compare_runs). The sweeps' child runs are written by the tracker from
``audit score`` results (no Ray needed); the comparison is checked against audit.compare called
on the same per-item tables directly."""

from __future__ import annotations

import json

import pytest

from actors.stats import TaskOutcome
from audit import runner
from audit.compare import compare_item_means, compare_weat_items
from audit.errors import DataError, ParameterError
from jobs import cli as jobs_cli
from jobs.compare_runs import compare_parents, find_parent, load_items
from jobs.plan import Task
from jobs.spec import ModelSpec
from jobs.tracker import Tracker
from test_regression import planted_models, write_w2v

pytestmark = pytest.mark.unit


TESTS = ("weat1", "weat7")
METRICS = ("weat", "same", "ect")


#: (ref, test, metric, params) -> (``runner.score`` result, ``load_model(ref).describe()``): each model
#: file of the module (:func:`model_files`) is audited once, whichever sweeps log it: the same file
#: gives the same result in two sweeps or in two tests' experiments (test_compare_states_each_left_out_task_and_why
#: took 3.6 CPU-s auditing its own copies of the files, 1.4 with this)
_SCORED: dict[tuple[str, str, str, str], tuple] = {}


def _score(ref: str, test: str, metric: str, params: dict) -> tuple:
    key = (ref, test, metric, json.dumps(params, sort_keys=True))  # the parameters are part of what is audited
    if key not in _SCORED:
        _SCORED[key] = (runner.score(ref, test, metric, params, seed=0), runner.load_model(ref).describe())
    return _SCORED[key]


def log_sweep(tr: Tracker, name: str, models: dict[str, str], drop: set[str] = frozenset()) -> tuple[str, dict]:
    """A finished sweep: one parent run, one child run per (model, test, metric)."""
    parent, _ = tr.start_parent(name, f"id-{name}")
    results = {}
    for model, ref in models.items():
        for test in TESTS:
            for metric in METRICS:
                params = {"n_bootstrap": 50} if metric == "weat" else {}
                res, described = _score(ref, test, metric, params)
                results[(model, test, metric)] = res
                task = Task(model=model, language="en", test=f"en/{test}", metric=metric, params=params, seed=0,
                            key=res.provenance["key"])
                outcome = TaskOutcome(index=0, status="finished", result=res, model=described)
                tr.log_task(task, sweep=name, model_spec=ModelSpec(ref=ref, name=model), kind="static",
                            plan_key=task.key, outcome=outcome)
    tr.end_parent(failed=0, summary={"tasks_failed": 0})
    return parent, results


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> list[str]:
    """The three revisions of :func:`planted_models` (``delta=0.8``) as word2vec files, and the
    third without one flower."""
    d = tmp_path_factory.mktemp("models")
    v1, v2, v3 = planted_models(delta=0.8)
    refs = [write_w2v(d / f"v{i}.vec", v) for i, v in enumerate((v1, v2, v3), start=1)]
    # revision 3 lacks one flower: an item of one run only
    refs.append(write_w2v(d / "v3-sparse.vec", {w: v for w, v in v3.items() if w != "aster"}))
    return refs


@pytest.fixture(scope="module")
def store(tmp_path_factory, model_files):
    d = tmp_path_factory.mktemp("sweeps")
    refs = model_files
    uri = f"sqlite:///{d}/mlflow.db"
    tr = Tracker(uri, "releases")
    runs = {}
    for name, models in (("rel-1", {"m": refs[0]}), ("rel-2", {"m": refs[1]}), ("rel-3", {"m": refs[3]}),
                         ("both", {"m": refs[1], "other": refs[2]})):
        runs[name] = log_sweep(tr, name, models)
    return uri, tr, runs


def test_compare_parents_matches_audit_compare_on_the_stored_tables(store):
    uri, tr, runs = store
    c = tr.client
    pa, pb = find_parent(c, "sweep:rel-2"), find_parent(c, f"run:{runs['rel-3'][0]}")
    assert pa.info.run_id == runs["rel-2"][0]
    df, sides = compare_parents(c, pa, pb, seed=4, n_bootstrap=100)
    assert (sides["A"]["sweep"], sides["B"]["sweep"], sides["A"]["model"]) == ("rel-2", "rel-3", "m")
    by = {(r["test"], r["metric"]): r for r in df.to_dict("records")}
    assert set(by) == {(t, m) for t in TESTS for m in METRICS}
    assert by[("weat1", "ect")]["status"] == "not comparable"
    res_a, res_b = runs["rel-2"][1], runs["rel-3"][1]
    for t in TESTS:
        r = by[(t, "weat")]
        ia, ib = res_a[("m", t, "weat")].items, res_b[("m", t, "weat")].items
        if t == "weat1":  # the flower rev 3 lacks is left out of both, and named
            assert r["dropped_items"] == "A/X/aster"
            ia = ia[ia["word"] != "aster"]
        else:
            assert r["dropped_items"] == ""
        direct = compare_weat_items(ia, ib, seed=4, n_bootstrap=100)
        assert (r["value_a"], r["value_b"], r["p_value"]) == pytest.approx((direct.value_a, direct.value_b, direct.p_value))
        assert [r["ci_low"], r["ci_high"]] == pytest.approx(direct.ci)
        assert r["ci_b_low"] == pytest.approx(res_b[("m", t, "weat")].fields["ci"][0])
        if t == "weat7":  # items.json keeps 10 significant digits (pandas' to_json, as MLflow's log_table)
            assert r["value_a"] == pytest.approx(res_a[("m", t, "weat")].value, abs=1e-8)
        s = by[(t, "same")]
        d2 = compare_item_means(res_a[("m", t, "same")].items.query("word != 'aster'"),
                                res_b[("m", t, "same")].items, seed=4, n_bootstrap=100)
        assert s["status"] == "compared" and s["value_b"] == pytest.approx(d2.value_b)
    # Holm over the compared tests of each metric
    w = df[(df["metric"] == "weat")]
    p = sorted(w["p_value"])
    assert w["p_holm"].max() == pytest.approx(min(1.0, max(2 * p[0], p[1])))
    # the stored table as written by the tracker
    items = load_items(c, w["run_a"].iloc[0])
    assert {"word", "set", "score"} <= set(items.columns) and items["word"].map(type).eq(str).all()


def test_sweeps_with_several_models_need_a_choice(store):
    uri, tr, runs = store
    c = tr.client
    with pytest.raises(ParameterError, match=r"sweep both audited 2 models \(m, other\); choose one with --model-a"):
        compare_parents(c, find_parent(c, "sweep:rel-1"), find_parent(c, "sweep:both"))
    df, sides = compare_parents(c, find_parent(c, "sweep:both"), find_parent(c, "sweep:both"), model_a="m",
                                model_b="other", metrics=["weat"], tests=["en/weat7"], n_bootstrap=0)
    assert df["test"].tolist() == ["weat7"] and sides["B"]["model"] == "other"
    with pytest.raises(DataError, match="sweep both has no finished run of model 'nope'"):
        compare_parents(c, find_parent(c, "sweep:both"), find_parent(c, "sweep:both"), model_a="nope")
    with pytest.raises(DataError, match="sweep:missing: no sweep of that name"):
        find_parent(c, "sweep:missing")
    child = c.search_runs([c.get_experiment_by_name("releases").experiment_id], "tags.`audit.role` = 'task'",
                          max_results=1)[0]
    with pytest.raises(DataError, match="not a sweep's parent run"):
        find_parent(c, f"run:{child.info.run_id}")


def test_cli_compares_sweeps_and_gates(store, capsys, monkeypatch):
    uri, tr, runs = store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    gate = ["--fail-on-regression", "--min-increase", "0.2", "--metric", "weat", "--n-bootstrap", "50"]
    assert jobs_cli.main(["compare", "sweep:rel-1", "sweep:rel-2", "--tracking-uri", uri, *gate]) == 0
    out = capsys.readouterr().out
    assert "Model A: `m (sweep rel-1, run " in out and "Regressions (|bias| up by >= 0.2" in out and ": none" in out
    assert jobs_cli.main(["compare", "sweep:rel-2", "sweep:rel-3", "--tracking-uri", uri, *gate, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [c["regression"] for c in doc["comparisons"]] == [True, True]
    assert all(c["delta_abs"] > 0.2 and c["p_holm"] <= 0.05 for c in doc["comparisons"])
    # bad input: one line, exit 2
    assert jobs_cli.main(["compare", "sweep:rel-1", "sweep:rel-2"]) == 2
    assert "need --tracking-uri or $MLFLOW_TRACKING_URI" in capsys.readouterr().err
    assert jobs_cli.main(["compare", "sweep:rel-1", "glove-6b-50d", "--tracking-uri", uri]) == 2
    assert "not one of each" in capsys.readouterr().err
    assert jobs_cli.main(["compare", "sweep:rel-1", "sweep:nope", "--tracking-uri", uri]) == 2
    assert "sweep:nope: no sweep of that name" in capsys.readouterr().err


def test_compare_states_each_left_out_task_and_why(store, model_files, capsys, monkeypatch):
    """A masked LM's CrowS-Pairs (``crows_pairs``: pseudo-log-likelihood) and a causal LM's
    (``crows_pairs_causal``: log-likelihood) are different measurements: ``audit compare`` says
    so, on stderr and as a ``not compared`` row of the Markdown/JSON table, and likewise for a
    task only one sweep ran. Before, both were left out silently."""
    import pandas as pd

    from audit.metrics.crows_pairs import crows_pairs_metric
    from audit.result import Result
    from jobs.tracker import task_record

    uri, _, _ = store
    tr = Tracker(uri, "masked-vs-causal")
    refs = model_files[:2]  # planted_models(delta=0.8)'s first two revisions
    table = pd.DataFrame({"bias_type": ["age"] * 4, "sent_more_score": [1.0, 1.0, -1.0, 1.0],
                          "sent_less_score": [0.0] * 4, "stereo_antistereo": "stereo"})

    def add(parent, model, kind, metric, variant, test="en/crows_pairs"):
        out = crows_pairs_metric(table.assign(variant=variant))
        res = Result(metric=metric, value=out.value, fields=out.fields, items=out.items, coverage={}, missing={},
                     params={}, seed=0, provenance={"key": f"{model}-{metric}-{test}"})
        task = Task(model=model, language="en", test=test, metric="crows_pairs", params={}, key=res.provenance["key"])
        rec = task_record(task, sweep="x", model_spec=ModelSpec(ref=f"hf:{model}", name=model), kind=kind,
                          plan_key=task.key, outcome=TaskOutcome(index=0, status="finished", result=res,
                                                                 model={"kind": kind, "backend": "hf"}))
        tr.log_record(rec, parent_id=parent)

    pa, _ = log_sweep(tr, "sweep-bert", {"tiny-bert": refs[0]})
    pb, _ = log_sweep(tr, "sweep-gpt2", {"tiny-gpt2": refs[1]})
    add(pa, "tiny-bert", "mlm", "crows_pairs", "masked_pll")
    add(pb, "tiny-gpt2", "causal", "crows_pairs_causal", "causal_ll")
    add(pb, "tiny-gpt2", "causal", "crows_pairs_causal", "causal_ll", test="en/crows_pairs_revised")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = ["compare", "sweep:sweep-bert", "sweep:sweep-gpt2", "--tracking-uri", uri, "--experiment",
            "masked-vs-causal", "--n-bootstrap", "0"]
    assert jobs_cli.main([*args, "--format", "json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    left = {(c["test"], c["metric"]): c["error"] for c in doc["comparisons"] if c["status"] == "not compared"}
    assert left == {
        ("crows_pairs", "crows_pairs (A) / crows_pairs_causal (B)"):
            "different measurements: A is crows_pairs on a masked LM (pseudo-log-likelihood), "
            "B is crows_pairs_causal on a causal LM (log-likelihood)",
        ("crows_pairs_revised", "crows_pairs_causal"): "only sweep B has a finished run of it"}
    assert sum(c["status"] == "compared" for c in doc["comparisons"]) == len(TESTS) * 2  # weat, same
    assert "audit: left out en/crows_pairs crows_pairs (A) / crows_pairs_causal (B): different measurements" in cap.err
    assert jobs_cli.main(args) == 0
    md = capsys.readouterr().out
    assert "| not compared: different measurements: A is crows_pairs on a masked LM" in md
    # only the left-out tasks selected: refused, naming them
    assert jobs_cli.main([*args, "--metric", "crows_pairs"]) == 2
    assert "left out: en/crows_pairs crows_pairs (A) / crows_pairs_causal (B): different measurements" in \
        capsys.readouterr().err
