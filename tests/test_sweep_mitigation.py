"""Debiasing in the sweep service: ``models[i].mitigation`` in a spec, the debiased copy built
before its tasks, child runs of both models under one parent, before/after reports, resume.

The model is GloVe 6B 50d restricted to its 20000 most frequent words plus every word of the
tests and of the ``en/gender`` definitions, saved as ``.npy`` + vocabulary. Hard Debias gives
each word the vector it gets on all 400000 words (the bias direction comes from the defining
pairs only, and neutralising/equalising treats words independently), so the WEAT numbers are
those of ``docs/mitigation.md``: WEAT 6 1.708 -> 0.957, WEAT 7 1.495 -> -1.116.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from audit.errors import DataError, ParameterError
from jobs.plan import attach_keys, expand
from jobs.spec import load_spec, parse_spec


TESTS = ["weat6", "weat7"]


def spec_dict(**model_extra) -> dict:
    return {
        "name": "mit",
        "metrics": ["weat"],
        "languages": ["en"],
        "tests": TESTS,
        "models": [{"ref": "glove-6b-50d", "name": "glove", "params": {"casefold": True}, **model_extra}],
    }


# --------------------------------------------------------------------------------------
# Spec validation
# --------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "mitigation, field, message",
    [
        ({"method": "hard_debais"}, "models[0].mitigation.method", "unknown mitigation 'hard_debais'"),
        ({"method": "hd", "params": {"n_component": 3}}, "models[0].mitigation.params.n_component",
         "unknown field (did you mean 'n_components'?); allowed fields: case_variants, n_components"),
        ({"method": "hd", "params": {"n_components": 0}}, "models[0].mitigation.params.n_components", "must be >= 1, got 0"),
        ({"method": "hd", "definitions": "en/genre"}, "models[0].mitigation.definitions", "not a file and not a registered name"),
        ({"method": "hd", "scope": "some"}, "models[0].mitigation.scope", "unknown scope 'some'"),
        ([{"method": "hd"}, {"method": "hsr", "colour": 1}], "models[0].mitigation[1].colour", "unknown field"),
        ([{"method": "hd"}, {"params": {}}], "models[0].mitigation[1].method", "missing required field"),
        ([{"method": "hd"}, {"method": "hard_debias", "params": {"n_components": 2}}],
         "models[0].mitigation[1].name", "duplicate model name 'glove+hard_debias'"),
        ({"method": "hd", "name": "glove debiased"}, "models[0].mitigation.name", "use letters, digits"),
    ],
)
def test_invalid_mitigation_names_the_field(mitigation, field, message):
    with pytest.raises((ParameterError, DataError)) as e:
        parse_spec(spec_dict(mitigation=mitigation), "my.yaml")
    assert str(e.value).startswith(f"my.yaml: {field}: ")
    assert message in str(e.value)


@pytest.mark.unit
def test_load_options_an_engine_would_ignore_are_refused_at_planning():
    """dtype/device/device_map on static vectors, device_map on a sentence-transformers model:
    refused before anything runs, naming the spec field (ignored, a dtype would still enter the
    key of numbers it did not change); a dtype on a Hugging Face checkpoint is planned."""
    d = spec_dict()
    for model, named in (({"ref": "glove-6b-50d", "dtype": "bfloat16"}, "dtype"),
                         ({"ref": "glove-6b-50d", "device": "cpu"}, "device"),
                         ({"ref": "glove-6b-50d", "revision": "main", "trust_remote_code": True},
                          "revision, trust_remote_code"),
                         ({"ref": "minilm", "subword": False}, "subword"),
                         ({"ref": "st:minilm", "device_map": "auto"}, "device_map")):
        d["models"] = [{"ref": "minilm", "name": "ok", "dtype": "float32"}, model]
        with pytest.raises(ParameterError, match=rf"^my.yaml: models\[1\]: model '{model['ref']}' is .*: {named} "
                                                 r"appl(ies|y) to (Hugging Face (models|checkpoints)|fastText vectors) only"):
            expand(parse_spec(d, "my.yaml"))


@pytest.mark.unit
def test_parameters_a_model_kind_does_not_use_are_left_out_or_refused():
    """A metric entry's parameter for every model (``layer``) reaches the models that use it and is
    left out of a static model's tasks (and keys); written in a static model's own ``params`` it is
    refused, naming the field."""
    d = spec_dict()
    d["languages"], d["tests"] = ["en"], ["weat7"]
    d["models"] = [{"ref": "glove-6b-50d", "params": {"casefold": True}}, {"ref": "minilm", "name": "minilm"}]
    d["metrics"] = [{"name": "weat", "params": {"layer": -2}}]
    tasks = {t.model: t.params for t in expand(parse_spec(d, "my.yaml")).tasks}
    assert tasks["minilm"]["layer"] == -2 and "layer" not in tasks["glove-6b-50d"]
    assert tasks["glove-6b-50d"]["casefold"] is True
    d["models"][0]["params"]["layer"] = -2
    d["metrics"] = ["weat"]
    with pytest.raises(ParameterError, match=r"^my.yaml: models\[0\].params.layer: metric 'weat' on model "
                                             r"'glove-6b-50d' \(static word vectors\) does not use it$"):
        expand(parse_spec(d, "my.yaml"))


@pytest.mark.unit
def test_mitigation_of_a_non_static_model_is_refused():
    d = spec_dict()
    d["models"] = [{"name": "tiny-bert", "build": {"kind": "bert"}, "mitigation": "hd"}]
    with pytest.raises(ParameterError, match=r"^my.yaml: models\[0\].mitigation: model 'tiny-bert' is not static"):
        parse_spec(d, "my.yaml")
    d["models"] = [{"ref": "bert-base-uncased", "backend": "hf-mlm", "mitigation": "hd"}]
    with pytest.raises(ParameterError, match=r"models\[0\].mitigation: .*static embeddings only"):
        parse_spec(d, "my.yaml")
    # the kind known only at planning (a local checkpoint): refused there, naming the field
    from jobs.resolve import resolve_ref

    d["models"] = [{"ref": "glove-6b-50d", "name": "g"}, {"ref": "minilm", "mitigation": {"method": "hsr"}}]
    spec = parse_spec(d, "my.yaml")
    assert resolve_ref("minilm")  # installed
    with pytest.raises(ParameterError, match=r"^my.yaml: models\[1\].mitigation: model 'minilm' is a encoder model"):
        expand(spec)


@pytest.mark.unit
def test_plan_adds_one_debiased_model_per_step_with_the_same_tasks(tmp_path):
    d = spec_dict(mitigation=[{"method": "hd", "params": {"n_components": 10}},
                              {"method": "half_sibling_regression", "name": "glove-hsr"}])
    d["output_dir"] = str(tmp_path)
    spec = parse_spec(d, "my.yaml")
    assert [m.name for m in spec.models] == ["glove", "glove+hard_debias", "glove-hsr"]
    hd = spec.model("glove+hard_debias")
    assert hd.ref == "built:glove+hard_debias" and hd.mitigated_from == "glove"
    assert dict(hd.params) == {"casefold": True}
    assert dict(hd.build) == {"kind": "mitigation", "base": "glove", "method": "hard_debias",
                              "definitions": "en/gender", "params": {"n_components": 10}, "scope": "all"}
    assert hd.run_tags["audit.mitigation"] == "hard_debias" and hd.run_tags["audit.base_model"] == "glove"
    assert hd.run_tags["audit.mitigation.param.n_components"] == "10"
    assert spec.model("glove").run_tags == {"audit.mitigation": "none", "audit.base_model": "glove"}
    plan = expand(spec)
    assert len(plan.tasks) == 6
    assert {m: plan.models[m].kind for m in plan.models} == dict.fromkeys(plan.models, "static")
    assert plan.models["glove-hsr"].local_ref == str(tmp_path.resolve() / "models" / "glove-hsr" / "vectors.npy")
    for name in ("glove+hard_debias", "glove-hsr"):
        assert [(t.test, t.metric, t.params) for t in plan.tasks_of(name)] == \
            [(t.test, t.metric, t.params) for t in plan.tasks_of("glove")]
    # before the build there is no file: no key for the copy's tasks (the original's are keyed)
    attach_keys(plan)
    assert all(t.key for t in plan.tasks_of("glove")) and not any(t.key for t in plan.tasks_of("glove-hsr"))
    # the example spec plans too
    ex = load_spec(Path(__file__).resolve().parents[1] / "jobs" / "specs" / "mitigation-example.yaml")
    assert [m.name for m in ex.models] == ["glove", "glove+hard_debias", "glove+half_sibling_regression"]
    assert len(expand(ex).tasks) == 12


# --------------------------------------------------------------------------------------
# End to end on Ray
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_glove(tmp_path_factory) -> str:
    """GloVe 6B 50d: 20000 most frequent words + the tests' and definitions' words (npy)."""
    from audit.mitigation import load_definitions
    from audit.mitigation.evaluation import words_of_tests
    from audit.mitigation.matrix import load_glove_6b_50d

    d = load_definitions("en/gender")
    extra = {w.lower() for s in (*d.definitional_sets, *d.equalize_sets) for w in s} | set(d.specific_words)
    full = load_glove_6b_50d()
    keep = set(words_of_tests([f"weat{i}" for i in (1, 6, 7, 8)], full)) | extra
    small = load_glove_6b_50d(top=20000, words=keep)
    saved = small.save_npy(tmp_path_factory.mktemp("glove") / "glove20k.npy")
    return saved.ref


def write_spec(tmp_path: Path, model_ref: str) -> Path:
    text = f"""
name: mitsweep
seed: 0
output_dir: {tmp_path / 'out'}
permutations: 1000
n_bootstrap: 0
languages: [en]
tests: [{", ".join(TESTS)}]
metrics: [weat]
models:
  - ref: "{model_ref}"
    name: glove20k
    params: {{casefold: true}}
    mitigation: {{method: hard_debias, definitions: en/gender, params: {{n_components: 10}}}}
ray: {{batch_size: 2, actor_num_cpus: 0.5, stats_num_cpus: 1}}
"""
    p = tmp_path / "mitsweep.yaml"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.ray
def test_sweep_audits_original_and_debiased_side_by_side_and_resumes(tmp_path, small_glove, local_ray):
    from jobs.sweep import run_sweep
    from jobs.tracker import Tracker

    spec = load_spec(write_spec(tmp_path, small_glove))
    out = run_sweep(spec, progress=False)
    assert out.exit_code == 0 and out.planned == out.ran == 4 and out.failed == 0

    # --- the debiased copy: built into <output_dir>/models, loadable, with its manifest
    mdir = spec.output_dir.resolve() / "models" / "glove20k+hard_debias"
    man = json.loads((mdir / "mitigation.json").read_text())
    assert man["base_model"] == "glove20k" and man["method"] == "hard_debias" and man["params"] == {"n_components": 10}
    assert man["definitions_digest"].startswith("sha256:") and man["n_words"] > 20000 and man["dim"] == 50
    from audit.backends.static import load_static

    wv = load_static(man["ref"])
    assert wv.revision == man["revision"]
    vec = wv.lookup(["nurse"]).vectors["nurse"]
    assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-6)  # Hard Debias: unit rows

    # --- child runs of both models under one parent, tagged for comparison
    tr = Tracker(spec.resolved_tracking_uri, spec.resolved_experiment)
    runs = tr.task_runs()
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {out.parent_run_id}
    by_model = {}
    for r in runs:
        by_model.setdefault(r.data.tags["audit.model"], []).append(r)
    assert set(by_model) == {"glove20k", "glove20k+hard_debias"}
    for r in by_model["glove20k+hard_debias"]:
        t, p = r.data.tags, r.data.params
        assert t["audit.mitigation"] == "hard_debias" and t["audit.base_model"] == "glove20k"
        assert t["audit.mitigation.param.n_components"] == "10" and t["audit.mitigation.definitions"] == "en/gender"
        assert p["mitigation"] == "hard_debias" and p["mitigation.param.n_components"] == "10"
        assert p["model"] == "built:glove20k+hard_debias" and p["revision"] == man["revision"]
    for r in by_model["glove20k"]:
        assert r.data.tags["audit.mitigation"] == "none" and r.data.tags["audit.base_model"] == "glove20k"

    # --- the numbers: WEAT d before and after, as measured on all 400000 GloVe words
    df = out.results.set_index(["model", "test"])
    d = lambda m, t: df.loc[(m, f"en/{t}"), "value"]  # noqa: E731
    assert d("glove20k", "weat6") == pytest.approx(1.708, abs=5e-4)
    assert d("glove20k+hard_debias", "weat6") == pytest.approx(0.957, abs=5e-4)
    assert d("glove20k", "weat7") == pytest.approx(1.495, abs=5e-4)
    assert d("glove20k+hard_debias", "weat7") == pytest.approx(-1.116, abs=5e-4)
    assert abs(d("glove20k+hard_debias", "weat6")) < abs(d("glove20k", "weat6")) - 0.7

    # --- before/after reports, on disk and on the parent run
    rep = out.report_dir
    ba = pd.read_parquet(rep / "mitigation" / "before_after.parquet")
    assert len(ba) == 2 and set(ba["model"]) == {"glove20k+hard_debias"} and set(ba["base_model"]) == {"glove20k"}
    row = ba.set_index("test").loc["en/weat6"]
    assert row["value_before"] == pytest.approx(1.708, abs=5e-4) and row["value_after"] == pytest.approx(0.957, abs=5e-4)
    assert row["change"] == pytest.approx(row["value_after"] - row["value_before"])
    assert row["abs_change"] == pytest.approx(abs(row["value_after"]) - abs(row["value_before"]))
    assert pd.read_csv(rep / "mitigation" / "before_after.csv").shape == ba.shape
    tex = (rep / "tables" / "mitigation_weat_en.tex").read_text()
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"\multicolumn{3}{c}{glove20k+hard\_debias}" in tex
    # marks from Holm-adjusted p-values (family glove20k x weat: 2 tests): 1/1001 sampled -> 0.002, **
    assert "weat6 & 1.71$^{**}$ & 0.96" in tex and "$-$0.75" in tex
    assert "(Holm-adjusted p-values over all tests of one model and metric in the sweep)" in tex
    png = (rep / "plots" / "mitigation_weat_en.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # 4.1 MB matrix: below ARTIFACT_MAX_BYTES, so the vectors themselves are logged
    logged = {f.path for f in tr.client.list_artifacts(out.parent_run_id, "reports/mitigation/glove20k+hard_debias")}
    assert logged == {f"reports/mitigation/glove20k+hard_debias/{n}"
                      for n in ("mitigation.json", "vectors.npy", "vectors.vocab.txt")}
    parent_files = {f.path for f in tr.client.list_artifacts(out.parent_run_id, "reports/mitigation")}
    assert "reports/mitigation/before_after.parquet" in parent_files
    assert {f.path for f in tr.client.list_artifacts(out.parent_run_id, "reports/plots")} >= {"reports/plots/mitigation_weat_en.png"}

    # --- resume: no rebuild (same file), no new child runs, no model load
    mtime = (mdir / "vectors.npy").stat().st_mtime_ns
    again = run_sweep(load_spec(write_spec(tmp_path, small_glove)), progress=False)
    assert again.exit_code == 0 and again.ran == 0 and again.skipped_existing == 4 and again.loads == 0
    assert again.parent_run_id == out.parent_run_id and len(tr.task_runs()) == 4
    assert (mdir / "vectors.npy").stat().st_mtime_ns == mtime

    # --- a forced rebuild is bit-identical: same revision, so the keys still match
    import shutil

    from jobs.builders import build_models

    shutil.rmtree(mdir)
    build_models(spec, expand(spec))
    assert json.loads((mdir / "mitigation.json").read_text())["revision"] == man["revision"]
    plan = attach_keys(expand(spec))
    assert {t.key for t in plan.tasks} <= set(tr.finished_keys())


@pytest.mark.unit
def test_large_matrix_is_logged_as_a_pointer(tmp_path):
    """Above ARTIFACT_MAX_BYTES only the manifest (path + digest) goes into the reports."""
    from jobs import report
    from jobs.builders import ARTIFACT_MAX_BYTES

    m = tmp_path / "models" / "g+hd"
    m.mkdir(parents=True)
    (m / "vectors.npy").write_bytes(b"x" * 10)
    (m / "vectors.vocab.txt").write_text("a\n")
    man = {"model": "g+hd", "base_model": "g", "method": "hard_debias", "matrix": str(m / "vectors.npy"),
           "vocab": str(m / "vectors.vocab.txt"), "revision": "sha256:ab", "bytes": ARTIFACT_MAX_BYTES + 1}
    (m / "mitigation.json").write_text(json.dumps(man))
    rows = [
        {"model": "g", "language": "en", "test": "en/weat6", "metric": "weat", "status": "finished", "value": 1.5,
         "p_value": 0.001, "model_ref": "glove-6b-50d"},
        {"model": "g+hd", "language": "en", "test": "en/weat6", "metric": "weat", "status": "finished", "value": -0.5,
         "p_value": 0.2, "model_ref": "built:g+hd"},
        {"model": "g", "language": "en", "test": "en/weat7", "metric": "weat", "status": "finished", "value": 1.0,
         "p_value": 0.01, "model_ref": "glove-6b-50d"},
        {"model": "g+hd", "language": "en", "test": "en/weat7", "metric": "weat", "status": "failed", "value": None,
         "p_value": None, "model_ref": "built:g+hd", "error": "boom"},
    ]
    df = report.results_frame(rows)
    written = report.write_reports(df, tmp_path / "reports")
    names = {p.relative_to(tmp_path / "reports").as_posix() for p in written}
    assert "mitigation/g+hd/mitigation.json" in names and "mitigation/g+hd/vectors.npy" not in names
    pointer = json.loads((tmp_path / "reports" / "mitigation" / "g+hd" / "mitigation.json").read_text())
    assert pointer["revision"] == "sha256:ab" and pointer["artifact"].startswith("pointer only")
    ba = pd.read_parquet(tmp_path / "reports" / "mitigation" / "before_after.parquet").set_index("test")
    assert ba.loc["en/weat6", "change"] == pytest.approx(-2.0) and ba.loc["en/weat6", "abs_change"] == pytest.approx(-1.0)
    assert np.isnan(ba.loc["en/weat7", "value_after"]) and ba.loc["en/weat7", "status_after"] == "failed"
    tex = (tmp_path / "reports" / "tables" / "mitigation_weat_en.tex").read_text()
    assert "weat6 & 1.50$^{**}$ & $-$0.50 & $-$2.00" in tex and "weat7 & 1.00$^{*}$ & -- & --" in tex


@pytest.mark.unit
def test_scope_tests_changes_only_the_test_words_and_build_errors_name_the_step(tmp_path, small_glove):
    from audit.backends.static import load_static
    from audit.errors import CoverageError
    from jobs.builders import build_models

    d = spec_dict(mitigation=[{"method": "hd", "name": "g-all"}, {"method": "hd", "name": "g-tests", "scope": "tests"}])
    d["models"][0]["ref"] = small_glove
    d["output_dir"] = str(tmp_path / "out")
    spec = parse_spec(d, "my.yaml")
    paths = build_models(spec, expand(spec))
    orig, full, part = (load_static(r) for r in (small_glove, str(paths["g-all"]), str(paths["g-tests"])))
    man = json.loads((paths["g-tests"].parent / "mitigation.json").read_text())
    assert man["scope"] == "tests" and 50 < man["n_words_changed"] < 200
    v = lambda m, w: np.asarray(m.lookup([w]).vectors[w])  # noqa: E731
    for w in ("executive", "family", "math", "poetry"):  # test words: as in the full run
        np.testing.assert_array_equal(v(part, w), v(full, w))
        assert not np.allclose(v(part, w), v(orig, w))
    for w in ("table", "river"):  # not in the tests: not neutralised (Hard Debias still scales every row to unit)
        unit = v(orig, w) / np.linalg.norm(v(orig, w))
        np.testing.assert_allclose(v(part, w), unit, atol=1e-6)
        assert not np.allclose(v(full, w), unit, atol=1e-3)

    bad = tmp_path / "defs.json"
    bad.write_text(json.dumps({"name": "xx/none", "language": "en",
                               "definitional_sets": [["qqzzx", "zzqqy"], ["xqzq", "zqxq"]]}))
    d["models"][0]["mitigation"] = {"method": "hd", "definitions": str(bad)}
    with pytest.raises(CoverageError, match=r"^model 'glove\+hard_debias' \(hard_debias of 'glove'\): .*qqzzx"):
        s = parse_spec(d, "my.yaml")
        build_models(s, expand(s))
