"""Sweep specs: validation errors that name the field, expansion into tasks, dry runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from audit.datasets.external import data_root
from audit.errors import DataError, ParameterError
from jobs import plan as plan_mod
from jobs.spec import load_spec, parse_spec, read_yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
SHARED = data_root()
SPECS = REPO / "jobs" / "specs"

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"reference data not found at {SHARED}")


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


BASE = {
    "name": "t",
    "models": [{"ref": "glove-6b-50d", "languages": ["en"]}],
    "metrics": ["weat"],
    "tests": ["weat1"],
}


@pytest.fixture()
def small_registry(tmp_path, monkeypatch):
    """A datasets folder with three shipped tests only (the real registry keeps growing)."""
    import shutil

    from audit.datasets import registry

    root = tmp_path / "datasets"
    for name in ("en/weat1", "en/weat7", "de/cw1", "de/cw2", "en/crows_pairs"):
        src = registry()[name]
        (root / name.split("/")[0]).mkdir(parents=True, exist_ok=True)
        shutil.copy(src, root / name.split("/")[0] / src.name)
    for lang in ("en", "de"):
        tpl = REPO / "datasets" / lang / "templates.yaml"
        if tpl.is_file():
            shutil.copy(tpl, root / lang / "templates.yaml")
    monkeypatch.setenv("BIASAUDIT_DATASETS", str(root))
    return root


def parse(**changes):
    d = {**BASE, **changes}
    return parse_spec(d, source="s.yaml")


# --------------------------------------------------------------------------------------
# Validation errors
# --------------------------------------------------------------------------------------


def test_malformed_yaml_names_file_and_line(tmp_path):
    p = write(tmp_path, "name: x\nmodels:\n  - ref: a\n   bad: [1, 2\n")
    with pytest.raises(DataError, match=r"spec\.yaml: malformed YAML at line \d+, column \d+"):
        load_spec(p)


def test_duplicate_yaml_key_is_refused(tmp_path):
    p = write(tmp_path, "name: x\nname: y\nmodels: [glove-6b-50d]\nmetrics: [weat]\n")
    with pytest.raises(DataError, match=r"line 2.*duplicate key 'name'"):
        read_yaml(p)


def test_missing_file_and_non_utf8(tmp_path):
    with pytest.raises(DataError, match="nope.yaml: spec file not found"):
        load_spec(tmp_path / "nope.yaml")
    p = tmp_path / "latin.yaml"
    p.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match="latin.yaml: not UTF-8"):
        load_spec(p)


def test_unknown_top_level_field_suggests_the_right_one():
    with pytest.raises(DataError, match=r"s\.yaml: metric: unknown field \(did you mean 'metrics'\?\)"):
        parse_spec({**BASE, "metric": ["weat"]}, source="s.yaml")


def test_unknown_model_field_names_the_model():
    with pytest.raises(DataError, match=r"models\[0\]\.revison: unknown field \(did you mean 'revision'\?\)"):
        parse(models=[{"ref": "glove-6b-50d", "revison": "main"}])


def test_unknown_metric_names_the_index():
    with pytest.raises(ParameterError, match=r"metrics\[1\]\.name: unknown metric 'waet' \(did you mean 'weat'\?\)"):
        parse(metrics=["weat", "waet"])


def test_unknown_metric_parameter():
    with pytest.raises(ParameterError, match=r"metrics\[0\]\.params\.permutation: metric 'weat' takes no parameter 'permutation'"):
        parse(metrics=[{"name": "weat", "params": {"permutation": 10}}])


def test_bad_permutations_value():
    with pytest.raises(ParameterError, match=r"metrics\[0\]\.params\.permutations: must be >= 1, got 0"):
        parse(metrics=[{"name": "weat", "params": {"permutations": 0}}])
    with pytest.raises(ParameterError, match=r"permutations: expected exact, auto or a positive integer, got 'all'"):
        parse(permutations="all")


def test_unknown_backend_names_the_model():
    with pytest.raises(ParameterError, match=r"models\[0\]\.backend: unknown backend 'hf-mlmm' \(did you mean 'hf-mlm'\?\)"):
        parse(models=[{"ref": "org/model", "backend": "hf-mlmm"}])


def test_unknown_language_top_level_and_model():
    with pytest.raises(ParameterError, match=r"languages\[1\]: unknown language 'ger'"):
        parse(languages=["en", "ger"])
    with pytest.raises(ParameterError, match=r"models\[0\]\.languages\[0\]: unknown language 'english'"):
        parse(models=[{"ref": "glove-6b-50d", "languages": ["english"]}])


def test_type_errors_name_the_field():
    with pytest.raises(DataError, match=r"models\[0\]\.allow_pickle: expected true or false, got 'yes'"):
        parse(models=[{"ref": "wefe-test-model", "allow_pickle": "yes"}])
    with pytest.raises(DataError, match=r"seed: expected an integer, got 1.5"):
        parse(seed=1.5)
    with pytest.raises(DataError, match=r"models: expected a non-empty list of models"):
        parse(models=[])
    with pytest.raises(ParameterError, match=r"ray\.batch_size: must be >= 1, got 0"):
        parse(ray={"batch_size": 0})
    with pytest.raises(DataError, match=r"ray\.num_gpu: unknown field \(did you mean 'num_cpus'\?\)"):
        parse(ray={"num_gpu": 1})


def test_required_fields():
    with pytest.raises(DataError, match=r"s\.yaml: name: missing required field"):
        parse_spec({k: v for k, v in BASE.items() if k != "name"}, source="s.yaml")
    with pytest.raises(DataError, match=r"models\[0\]: missing required field 'ref'"):
        parse(models=[{"name": "x"}])
    with pytest.raises(DataError, match="the spec is empty"):
        parse_spec(None, source="s.yaml")


def test_duplicate_model_names():
    with pytest.raises(ParameterError, match=r"models\[1\]\.name: duplicate model name 'glove-6b-50d' \(also models\[0\]\)"):
        parse(models=["glove-6b-50d", "glove-6b-50d"])


def test_file_tracking_store_refused():
    with pytest.raises(ParameterError, match=r"tracking\.uri: 'file:///tmp/mlruns'.*file store is not supported"):
        parse(tracking={"uri": "file:///tmp/mlruns"})


def test_environment_variables(monkeypatch):
    monkeypatch.setenv("BA_OUT", "/data/out")
    s = parse(output_dir="${BA_OUT}/x", tests=["${BA_UNSET_FOR_TEST:-weat1}"])
    assert s.output_dir == Path("/data/out/x")
    assert s.tests == ("weat1",)
    monkeypatch.delenv("BA_UNSET_FOR_TEST", raising=False)
    with pytest.raises(DataError, match=r"tests\[0\]: environment variable BA_UNSET_FOR_TEST is not set"):
        parse(tests=["${BA_UNSET_FOR_TEST}"])


def test_defaults_and_overrides(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    s = parse()
    assert s.seed == 0 and s.output_dir == Path("out/t")
    assert s.resolved_experiment == "biasaudit-t"
    assert s.resolved_tracking_uri == "sqlite:///" + str((Path("out/t") / "mlflow.db").resolve())
    p = write(tmp_path, "name: t\nmodels: [glove-6b-50d]\nmetrics: [weat]\n")
    s2 = load_spec(p, output_dir=tmp_path / "o", tracking_uri="http://127.0.0.1:5000")
    assert s2.output_dir == tmp_path / "o" and s2.resolved_tracking_uri == "http://127.0.0.1:5000"
    # what runs defines the sweep, not where it writes
    assert s2.sweep_id() == load_spec(p).sweep_id()
    assert parse(seed=1).sweep_id() != parse(seed=2).sweep_id()


def test_nan_and_infinity_are_data_errors_like_in_the_watch_spec():
    """A number field holding NaN or infinity is malformed (DataError) in every spec; the sweep
    spec called NaN a ParameterError and let infinity through."""
    with pytest.raises(DataError, match=r"s\.yaml: ray\.num_cpus: expected a finite number, got nan"):
        parse(ray={"num_cpus": float("nan")})
    with pytest.raises(DataError, match=r"ray\.actor_num_cpus: expected a finite number, got inf"):
        parse(ray={"actor_num_cpus": float("inf")})
    with pytest.raises(DataError, match=r"metrics\[0\]\.params\.alpha: expected a finite number, got nan"):
        parse(metrics=[{"name": "weat", "params": {"alpha": float("nan")}}])
    with pytest.raises(ParameterError, match=r"ray\.stats_num_cpus: must be >= 0, got -1"):
        parse(ray={"stats_num_cpus": -1})


def test_tracking_uri_precedence_flag_spec_environment_default(tmp_path, monkeypatch):
    """--tracking-uri > tracking.uri > $MLFLOW_TRACKING_URI > sqlite:///<output_dir>/mlflow.db."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "o"
    bare = write(tmp_path, f"name: t\nmodels: [glove-6b-50d]\nmetrics: [weat]\noutput_dir: {out}\n", "bare.yaml")
    pinned = write(tmp_path, bare.read_text() + "tracking: {uri: 'http://spec.example:5000'}\n", "pinned.yaml")
    default = "sqlite:///" + str((out / "mlflow.db").resolve())
    assert load_spec(bare).resolved_tracking_uri == default
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://env.example:5000")
    assert load_spec(bare).resolved_tracking_uri == "http://env.example:5000"
    assert load_spec(pinned).resolved_tracking_uri == "http://spec.example:5000"
    assert load_spec(pinned, tracking_uri="http://flag.example:5000").resolved_tracking_uri == "http://flag.example:5000"
    assert load_spec(bare, tracking_uri="http://flag.example:5000").resolved_tracking_uri == "http://flag.example:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")
    assert load_spec(bare).resolved_tracking_uri == default
    with pytest.raises(ParameterError, match=r"--tracking-uri: 'file:///tmp/mlruns': use sqlite:///"):
        load_spec(bare, tracking_uri="file:///tmp/mlruns")


def test_audit_run_writes_to_mlflow_tracking_uri_from_the_environment(tmp_path, monkeypatch, capsys):
    from jobs.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:s3cret@mlflow.example:5000")
    assert main(["run", str(SPECS / "smoke.yaml"), "--dry-run", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tracking: http://***@mlflow.example:5000 (experiment biasaudit-smoke)" in out and "s3cret" not in out


def test_the_spec_checks_metric_parameters_without_the_planner():
    """jobs.spec does not import jobs.plan (plan imports spec); spec and planner read the metric
    names and parameters from the one registry."""
    import ast

    from audit import registry

    tree = ast.parse((REPO / "jobs" / "spec.py").read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "jobs.plan" not in imported and "jobs" not in imported and "audit" in {m.split(".")[0] for m in imported}
    for m in registry.names():
        assert plan_mod.accepted_params(m) == registry.accepted_params(m), m
        with pytest.raises(ParameterError, match=f"metric {m!r} takes no parameter 'no_such_param'"):
            parse(models=[{"ref": "glove-6b-50d"}], metrics=[{"name": m, "params": {"no_such_param": 1}}])


# --------------------------------------------------------------------------------------
# Expansion
# --------------------------------------------------------------------------------------


def test_static_model_gets_no_lm_metrics_and_missing_language_is_reported(small_registry):
    s = parse(
        models=[{"ref": "glove-6b-50d", "params": {"casefold": True}}],
        languages=["en", "de"],
        metrics=["weat", "seat", {"name": "crows_pairs", "tests": ["crows_pairs"]}],
        tests=["weat1", "weat7", "cw1"],
        permutations=100,
    )
    assert plan_mod.registered_tests() == {"de": ["de/cw1", "de/cw2"], "en": ["en/crows_pairs", "en/weat1", "en/weat7"]}
    p = plan_mod.expand(s)
    labels = sorted((t.language, t.test, t.metric) for t in p.tasks)
    # GloVe has no language restriction here: English WEAT 1/7 and German CW1 are all planned
    assert labels == [("de", "de/cw1", "weat"), ("en", "en/weat1", "weat"), ("en", "en/weat7", "weat")]
    t = p.tasks[0]
    assert t.params == {"permutations": 100, "casefold": True}
    reasons = [(x.language, x.test, x.metric, x.reason) for x in p.skipped]
    seat_skip = "seat cannot run on static word vectors (needs encoder, mlm, causal, sentence)"
    assert ("*", "*", "seat", seat_skip) in reasons
    assert any(r[2] == "crows_pairs" and "cannot run on static word vectors" in r[3] for r in reasons)
    assert ("de", "weat1", "weat", "no test matching 'weat1' in language de") in reasons
    assert ("en", "cw1", "weat", "no test matching 'cw1' in language en") in reasons
    assert p.counts().loc["glove-6b-50d", "weat"] == 3


def test_model_languages_restrict_tests_and_globs_match(small_registry):
    s = parse(models=[{"ref": "glove-6b-50d", "languages": ["de"]}], tests=["cw*", "weat*"])
    p = plan_mod.expand(s)
    assert [t.test for t in p.tasks] == ["de/cw1", "de/cw2"]
    assert any(x.reason == "no test matching 'weat*' in language de" for x in p.skipped)


def test_model_param_that_no_metric_takes():
    s = parse(models=[{"ref": "glove-6b-50d", "params": {"casefolds": True}}])
    with pytest.raises(ParameterError, match=r"models\[0\]\.params\.casefolds: no metric of the spec takes"):
        plan_mod.expand(s)


def test_hub_model_without_backend_asks_for_one(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    s = parse(models=[{"ref": "biasaudit-test/not-cached-anywhere"}])
    with pytest.raises(ParameterError, match=r"models\[0\].*set `backend: hf-encoder \| hf-mlm \| hf-causal`"):
        plan_mod.expand(s)


def test_keys_are_deterministic_and_match_the_runner(monkeypatch):
    """The planner's audit.key (computed without loading) equals the key of the result that
    the runner computes after loading the model."""
    from audit import runner

    s = parse(models=[{"ref": "glove-6b-50d", "params": {"casefold": True}}], tests=["weat7"],
              metrics=[{"name": "weat", "params": {"n_bootstrap": 0, "permutations": 200}}])
    p1 = plan_mod.attach_keys(plan_mod.expand(s))
    p2 = plan_mod.attach_keys(plan_mod.expand(s))
    assert [t.key for t in p1.tasks] == [t.key for t in p2.tasks] and p1.tasks[0].key
    t = p1.tasks[0]
    res = runner.score("glove-6b-50d", "weat7", "weat", dict(t.params), seed=t.seed)
    assert res.provenance["key"] == t.key
    s2 = dataclasses.replace(s, seed=1)
    assert plan_mod.attach_keys(plan_mod.expand(s2)).tasks[0].key != t.key


# --------------------------------------------------------------------------------------
# Shipped specs and dry runs
# --------------------------------------------------------------------------------------


@needs_shared
def test_smoke_spec_plan_and_dry_run_loads_nothing(monkeypatch, capsys):
    from audit import runner
    from jobs import sweep

    def boom(*a, **k):
        raise AssertionError("a dry run must not load a model")

    monkeypatch.setattr(runner, "load_model", boom)
    monkeypatch.setenv("BIASAUDIT_DATA", str(SHARED))
    assert sweep.main([str(SPECS / "smoke.yaml"), "--dry-run", "--output-dir", "/nonexistent/biasaudit-dry"]) == 0
    out = capsys.readouterr().out
    assert "sweep 'smoke': 52 tasks over 4 models" in out
    assert "skip tiny-fasttext x crows_pairs: crows_pairs cannot run on static word vectors" in out
    assert not Path("/nonexistent/biasaudit-dry").exists()
    s = load_spec(SPECS / "smoke.yaml")
    c = plan_mod.expand(s).counts()
    assert c.loc["tiny-fasttext", "total"] == 10
    assert c.loc["tiny-bert", "total"] == 14
    assert c.loc["tiny-gpt2", "crows_pairs"] == 1
    # causal LMs get every family: word metrics and SEAT on hidden states, causal LPBS, CrowS-Pairs
    assert c.loc["tiny-gpt2", "total"] == c.loc["tiny-llama", "total"] == 14
    assert c.loc["tiny-llama", "lpbs"] == c.loc["tiny-llama", "seat"] - 1 == 1


def test_audit_run_dry_run_through_the_cli(capsys):
    from jobs.cli import main

    assert main(["run", str(SPECS / "default.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sweep 'default'" in out and "glove-6b-50d" in out and "minilm" in out and "spacy-fr-md" in out
    assert "skip spacy-fr-md x seat: seat cannot run on static word vectors" in out


def test_audit_run_reports_spec_errors_in_one_line(tmp_path, capsys):
    from jobs.cli import main

    p = write(tmp_path, "name: x\nmodels: [glove-6b-50d]\nmetrics: [weat]\nlanguage: [en]\n")
    assert main(["run", str(p), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("audit: error: ") and "language: unknown field (did you mean 'languages'?)" in err
    assert "Traceback" not in err


def test_hub_example_plans_offline():
    s = load_spec(SPECS / "hub-example.yaml")
    assert len(s.models) >= 12
    assert all(m.options.get("revision") == "main" for m in s.models)
    p = plan_mod.expand(s)
    kinds = {name: info.kind for name, info in p.models.items()}
    assert kinds["bert-base-uncased"] == "mlm" and kinds["gpt2"] == "causal"
    metrics_of_gpt2 = {t.metric for t in p.tasks_of("gpt2")}
    assert metrics_of_gpt2 == {"weat", "seat", "lpbs", "crows_pairs"}


def test_a_test_pattern_that_matches_nothing_is_an_error_with_a_suggestion(tmp_path):
    from audit.errors import ParameterError
    from jobs.plan import expand
    from jobs.spec import parse_spec

    spec = parse_spec({"name": "typo", "models": ["glove-6b-50d"], "metrics": ["weat"], "tests": ["weat99", "weat1"],
                       "output_dir": str(tmp_path)}, source="typo.yaml")
    with pytest.raises(ParameterError, match=r"'weat99' matches no shipped test in any language \(did you mean 'weat9'"):
        expand(spec)


def test_causal_build_kinds_and_training_languages():
    s = parse(models=[{"name": "l", "build": {"kind": "llama"}},
                      {"name": "q", "build": {"kind": "qwen2", "language": "de"}},
                      {"name": "m", "build": {"kind": "mistral", "language": ["en", "de", "fr"]}}])
    assert [m.build["kind"] for m in s.models] == ["llama", "qwen2", "mistral"]
    assert plan_mod.model_kind("built:l", build={"kind": "llama"}) == "causal"
    with pytest.raises(ParameterError, match=r"models\[0\]\.build\.language: a training language applies to fastText, llama"):
        parse(models=[{"name": "b", "build": {"kind": "bert", "language": "en"}}])
    with pytest.raises(ParameterError, match=r"models\[0\]\.build\.language: a fastText build takes one language"):
        parse(models=[{"name": "f", "build": {"kind": "fasttext", "language": ["en", "de"]}}])
    with pytest.raises(ParameterError, match=r"build\.language\[1\]: unknown language 'xx'"):
        parse(models=[{"name": "m", "build": {"kind": "mistral", "language": ["en", "xx"]}}])
    with pytest.raises(ParameterError, match="unknown kind 'lama'.*did you mean 'llama'"):
        parse(models=[{"name": "m", "build": {"kind": "lama"}}])


def test_an_unreadable_registered_test_fails_its_tasks_not_the_sweep(small_registry):
    """A malformed shipped (or user-registered) test file no longer stops planning: its tasks are
    planned and each fails with the reader's one-line error; the other tests go on."""
    from audit import runner
    from audit.suites import UnreadableTest

    bad = small_registry / "en" / "broken.yaml"
    text = (small_registry / "en" / "weat1.yaml").read_text(encoding="utf-8")
    bad.write_text(text.replace("name: weat1", "name: broken") + "templates:\n  seat: [This is it.]\n", encoding="utf-8")
    s = parse(models=[{"ref": "glove-6b-50d", "params": {"casefold": True}}], languages=["en"],
              metrics=["weat"], tests=["weat1", "broken"], permutations=100)
    p = plan_mod.expand(s)
    assert sorted(t.test for t in p.tasks) == ["en/broken", "en/weat1"]
    broken = p.tests["en/broken"]
    assert isinstance(broken, UnreadableTest) and str(bad) in broken.error
    lm = runner.load_model("glove-6b-50d", words=plan_mod.words_for_tasks(p, p.tasks))
    with pytest.raises(DataError, match=r"broken\.yaml: templates\.seat\.singular\[0\] 'This is it\.' must contain"):
        runner.measure(lm, broken, "weat", {"casefold": True})
    assert runner.measure(lm, p.tests["en/weat1"], "weat", {"casefold": True}).targets
