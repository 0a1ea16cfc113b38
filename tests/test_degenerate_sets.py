"""A word set left with fewer than two words after look-up is refused, for every metric on
word sets, with one line naming the set and the words found (``audit score``: exit 2)."""

from __future__ import annotations


import numpy as np
import pytest

from audit import registry
from audit.errors import DataError
from audit.metrics.sets import check_set_sizes
from cli_inputs import TEST, run_cli, write_vectors

TEST = TEST.replace("name: small", "name: tiny")
WORDS = "rose tulip daisy lily ant wasp flea moth love peace joy hate war pain".split()


_run = run_cli


@pytest.fixture
def files(tmp_path, monkeypatch):
    write_vectors(tmp_path / "ok.vec", WORDS)
    # one flower only: the other three are not in the test, so look-up keeps one word
    (tmp_path / "one.yaml").write_text(TEST.replace("[rose, tulip, daisy, lily]", "[rose]"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.unit
@pytest.mark.parametrize("metric", ["weat", "rnd", "ect", "mac", "gweat", "same"])
def test_score_refuses_a_one_word_set(files, metric):
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "one.yaml", "--metric", metric,
                           "--n-bootstrap", "0"] if metric == "weat" else
                          ["score", "--model", "ok.vec", "--test", "one.yaml", "--metric", metric])
    assert code == 2 and out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [
        "audit: error: word set 'flowers' (target0) has 1 item after look-up (rose); every set needs at "
        "least 2 (a one-word set has no spread: the effect size, p-value and interval are degenerate)"]


@pytest.mark.unit
def test_two_words_per_set_still_run(files):
    (files / "two.yaml").write_text(TEST.replace("[rose, tulip, daisy, lily]", "[rose, tulip]"))
    code, out, err = _run(["score", "--model", "ok.vec", "--test", "two.yaml", "--metric", "weat",
                           "--n-bootstrap", "0"])
    assert code == 0, err


@pytest.mark.unit
def test_every_set_metric_refuses_arrays_with_one_row():
    rng = np.random.default_rng(1)
    one, many = rng.normal(size=(1, 5)), rng.normal(size=(4, 5))
    for name in ("weat", "seat", "rnd", "ect", "ripa", "mac", "gweat", "same", "direct_bias", "rnsb", "cramers_v"):
        with pytest.raises(DataError, match=r"word set attribute1 has 1 item after look-up"):
            registry.run_metric(name, [many, many.copy()], [many + 1, one])


@pytest.mark.unit
def test_check_names_every_degenerate_set_and_the_words_found():
    with pytest.raises(DataError) as e:
        check_set_sizes([np.ones((1, 3)), np.ones((3, 3))], [np.zeros((0, 3)), np.ones((2, 3))],
                        labels={"target0": ["he"]}, set_names={"target0": "male", "attribute0": "career"})
    assert str(e.value).startswith("word set 'male' (target0) has 1 item after look-up (he); "
                                   "word set 'career' (attribute0) has 0 items after look-up; every set needs")


@pytest.mark.ray
def test_a_sweep_fails_only_the_degenerate_task_with_the_reason(tmp_path, local_ray):
    """In a sweep the task whose set keeps one word fails with the one-line reason; the
    other tasks finish."""
    from jobs.spec import load_spec
    from jobs.sweep import run_sweep

    one = tmp_path / "one.yaml"
    one.write_text(TEST.replace("[rose, tulip, daisy, lily]", "[rose]").replace("name: tiny", "name: one"))
    write_vectors(tmp_path / "ok.vec", WORDS)
    two = tmp_path / "two.yaml"
    two.write_text(TEST.replace("name: tiny", "name: two"))
    spec_text = f"""
name: degenerate
seed: 0
output_dir: {tmp_path / 'out'}
permutations: 300
n_bootstrap: 50
languages: [en]
tests: ["{one}", "{two}"]
metrics: [weat]
models:
  - ref: "{tmp_path / 'ok.vec'}"
    name: ok
ray: {{batch_size: 1, actor_num_cpus: 0.5, stats_num_cpus: 1, max_restarts: 2, max_task_retries: 3}}
"""
    (tmp_path / "s.yaml").write_text(spec_text)
    out = run_sweep(load_spec(tmp_path / "s.yaml"), progress=False)
    df = out.results.set_index("test")
    assert out.exit_code == 1 and len(df) == 2
    assert df.loc["en/one", "status"] == "failed" and df.loc["en/two", "status"] == "finished"
    assert "word set 'flowers' (target0) has 1 item after look-up (rose); every set needs at least 2" in \
        df.loc["en/one", "error"]
