"""Statistics sizes are settled before work: a permutation count at or above the number of
distinct partitions runs the exact test at once (and says so); a bootstrap that cannot fit in
memory is refused with one line naming the parameter and the size, before any model loads."""

from __future__ import annotations

import json
import time

import pytest

from audit import runner, stats
from audit.errors import ParameterError
from cli_inputs import run_cli, write_vectors

TEST = """name: tiny
language: en
provenance: made up
licence: CC0
targets:
- {name: flowers, words: [rose, tulip, daisy, lily, iris, aster, poppy, lotus]}
- {name: insects, words: [ant, wasp, flea, moth, gnat, tick, bee, fly]}
attributes:
- {name: pleasant, words: [love, peace, joy]}
- {name: unpleasant, words: [hate, war, pain]}
"""
WORDS = ("rose tulip daisy lily iris aster poppy lotus ant wasp flea moth gnat tick bee fly "
         "love peace joy hate war pain").split()


_run = run_cli


@pytest.fixture
def files(tmp_path, monkeypatch):
    write_vectors(tmp_path / "ok.vec", WORDS)
    (tmp_path / "t.yaml").write_text(TEST)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.unit
def test_permutations_1e14_on_8_plus_8_is_the_exact_test_at_once(files):
    t0 = time.perf_counter()
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "t.yaml", "--metric", "weat",
                           "--permutations", "1e14", "--n-bootstrap", "0", "--format", "json"])
    assert code == 0, err
    assert time.perf_counter() - t0 < 60
    f = json.loads(out)
    assert f["p_method"] == "exact" and f["n_partitions"] == 12_870
    assert f["p_note"] == ("permutations=100,000,000,000,000 >= the 12,870 distinct partitions of 8+8 items: "
                           "exact test run instead")
    assert f["p_min"] == 1 / 12_870 and f["p_value"] >= f["p_min"]


@pytest.mark.unit
@pytest.mark.parametrize("value", ["1e11", "100000000000"])
def test_bootstrap_that_cannot_fit_is_refused_before_the_model_loads(files, monkeypatch, value):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner, "load_model", no_load)
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "t.yaml", "--metric", "weat",
                           "--param", f"n_bootstrap={value}"])
    mem = stats._fmt_bytes(stats.physical_memory())
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"audit: error: n_bootstrap=100,000,000,000: 100,000,000,000 resamples of 16 items need at least "
        f"11.6 TiB of memory, more than this machine's {mem}; use at most "
        f"{stats.physical_memory() // (8 * 16):,}"]


@pytest.mark.unit
def test_check_resample_memory_bounds():
    stats.check_resample_memory("n_bootstrap", 1000, 50, memory=8 * 1000 * 50)  # fits exactly
    with pytest.raises(ParameterError, match=r"^n_bootstrap=1,001: 1,001 resamples of 50 items need at least "
                                             r"391\.0 KiB of memory, more than this machine's 390\.6 KiB; "
                                             r"use at most 1,000$"):
        stats.check_resample_memory("n_bootstrap", 1001, 50, memory=8 * 1000 * 50)
    for ignored in ("many", None, True, 2.5, -3):  # left to the metric's own validation
        stats.check_resample_memory("n_bootstrap", ignored, 50, memory=1)


# --------------------------------------------------------------------------------------
# choices and sizes in `audit score` and in a sweep plan, before any model loads
# --------------------------------------------------------------------------------------

CHOICES = [
    # one wording for every choice (audit.schema.choice), whichever module declares it
    ("weat", "p_convention", "strict", "p_convention: unknown value 'strict'; known: phipson_smyth, caliskan"),
    ("weat", "alternative", "bigger", "alternative: unknown value 'bigger'; known: greater, less, two-sided"),
    ("weat", "ci_method", "words", "ci_method: unknown value 'words'; known: targets, targets_attributes"),
    ("honest", "decoding", "beam", "decoding: unknown value 'beam'; known: greedy, sample"),
    ("honest", "category_rule", "any", "category_rule: unknown value 'any'; known: all, first"),
    ("honest", "hurtlex_level", "strict", "hurtlex_level: unknown value 'strict'; known: conservative, inclusive"),
    ("bbq", "length_norm", "words", "length_norm: unknown value 'words'; known: none, tokens, chars"),
]


@pytest.mark.unit
@pytest.mark.parametrize("metric,key,value,msg", CHOICES, ids=[f"{m}-{k}" for m, k, _, _ in CHOICES])
def test_a_choice_parameter_is_checked_up_front_against_its_modules_choices(metric, key, value, msg):
    from audit import registry

    with pytest.raises(ParameterError) as e:
        registry.check_params(metric, {key: value})
    assert str(e.value) == msg
    registry.check_params(metric, {key: registry.get(metric).params.get(key)
                                   or {**registry.get(metric).family.params}.get(key)})  # the default passes


@pytest.mark.unit
def test_a_bad_choice_in_audit_score_is_refused_before_the_model_loads(files, monkeypatch):
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner, "load_model", no_load)
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "t.yaml", "--metric", "weat",
                           "--param", 'p_convention="strict"'])
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        "audit: error: p_convention: unknown value 'strict'; known: phipson_smyth, caliskan"]


@pytest.mark.unit
def test_a_sweep_whose_bootstrap_cannot_fit_is_refused_at_plan_time_with_the_size(files):
    spec = files / "s.yaml"
    spec.write_text(f"name: s\noutput_dir: out\nlanguages: [en]\ntests: ['{files / 't.yaml'}']\nmetrics: [weat]\n"
                    f"n_bootstrap: 100000000000\nmodels:\n  - ref: ok.vec\n", encoding="utf-8")
    code, out, err = _run(["run", str(spec), "--dry-run"])
    mem = stats._fmt_bytes(stats.physical_memory())
    assert code == 2 and "Traceback" not in err and not (files / "out").exists()
    assert err.strip().splitlines() == [
        f"audit: error: {spec}: metric weat on {files / 't.yaml'}: n_bootstrap=100,000,000,000: 100,000,000,000 "
        f"resamples of 16 items need at least 11.6 TiB of memory, more than this machine's {mem}; use at most "
        f"{stats.physical_memory() // (8 * 16):,}"]


@pytest.mark.unit
def test_a_bad_choice_in_a_sweep_spec_is_refused_at_plan_time(files):
    spec = files / "s.yaml"
    spec.write_text("name: s\noutput_dir: out\nlanguages: [en]\ntests: [weat1]\n"
                    "metrics: [{name: weat, params: {p_convention: strict}}]\nmodels:\n  - ref: ok.vec\n",
                    encoding="utf-8")
    code, out, err = _run(["run", str(spec), "--dry-run"])
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"audit: error: {spec}: metrics[0].params.p_convention: unknown value 'strict'; known: phipson_smyth, "
        "caliskan"]
