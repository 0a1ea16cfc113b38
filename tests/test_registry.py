"""The metric registry: every consumer derives from the entries, and a new metric is one module (an
array-level function) plus one entry.

``test_a_new_metric_is_one_function_and_one_entry`` adds a toy metric the way
``docs/architecture.md`` describes (here the "module" is the function below and the entry is
registered in the test instead of being written into ``audit/registry.py``) and checks that the
command line, the runner, the planner and the tracker pick it up with no other change.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from audit import catalog, registry, runner
from audit.entries import MODEL_KINDS, Measurement, Metric
from audit.errors import ModelError, ParameterError
from audit.measure.words import ASSOCIATION
from audit.result import MetricOutput
from audit.suites import WordSet, WordTest


# ---------------------------------------------------------------- the toy metric's "module"


def centroid_gap(targets: list, attributes: list, *, scale: float = 1.0) -> MetricOutput:
    """Toy metric: ``scale * (cos(mean X, mean A) - cos(mean Y, mean A))`` on unit-normed rows."""

    def mean_unit(m):
        m = np.asarray(m, dtype=np.float64)
        m = m / np.linalg.norm(m, axis=1, keepdims=True)
        v = m.mean(axis=0)
        return v / np.linalg.norm(v)

    x, y, a = (mean_unit(s) for s in (targets[0], targets[1], attributes[0]))
    return MetricOutput(value=float(scale * (x @ a - y @ a)), fields={"scale": scale})


TOY = Metric(
    name="toy_centroid_gap", family=ASSOCIATION,
    analyse=lambda m, **p: centroid_gap(m.targets, m.attributes, **p), params={"scale": 1.0},
    headline="cos(mean X, mean A) - cos(mean Y, mean A)", reference="this test",
    n_targets=(2, 2), n_attributes=(1, None), kinds=("static",),  # an entry may narrow its family's kinds
)


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.name)
    assert TOY.name not in registry.names()


def _vectors_file(tmp_path, test: WordTest):
    rng = np.random.default_rng(3)
    words = sorted({w for s in (*test.targets, *test.attributes) for w in s.words})
    lines = [f"{len(words)} 8"] + [w + " " + " ".join(f"{v:.6f}" for v in rng.normal(size=8)) for w in words]
    p = tmp_path / "toy.vec"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


TEST = WordTest("toy", "en", (WordSet("X", ("a", "b", "c")), WordSet("Y", ("d", "e", "f"))),
                (WordSet("A", ("g", "h")), WordSet("B", ("i", "j"))))


@pytest.mark.unit
def test_a_new_metric_is_one_function_and_one_entry(toy, tmp_path):
    vec = _vectors_file(tmp_path, TEST)
    # runner: measured by its family, analysed by its entry, the task's parameters split by the registry
    res = runner.score(str(vec), TEST, toy.name, {"scale": 2.0, "casefold": True})
    lm = runner.load_model(str(vec))
    meas = runner.measure(lm, TEST, toy.name, {})
    assert res.value == pytest.approx(centroid_gap(meas.targets, meas.attributes, scale=2.0).value, abs=1e-12)
    assert res.metric == toy.name and res.params == {"scale": 2.0, "casefold": True}
    assert res.provenance["key"]
    # what a test supports, and the applicability rules, come from the entry
    assert toy.name in catalog.supported_metrics(TEST)
    assert registry.applies(toy.name, TEST, "mlm") == f"{toy.name} cannot run on a masked LM (needs static)"
    three = WordTest("t3", "en", (*TEST.targets, WordSet("Z", ("k",))), TEST.attributes)
    assert "needs exactly 2 target sets, got 3" in registry.applies(toy.name, three)
    with pytest.raises(ParameterError, match=r"does not accept parameter\(s\) bogus"):
        runner.score(lm, TEST, toy.name, {"bogus": 1})
    # the spec validator and the planner accept it and its parameters
    assert registry.accepted_params(toy.name) >= {"scale", "casefold", "max_missing"}
    from jobs.spec import parse_spec
    from jobs.plan import expand
    from jobs.tracker import embedding_method

    spec = parse_spec({"name": "toy", "models": [str(vec)], "tests": ["weat1"],
                       "metrics": [{"name": toy.name, "params": {"scale": 3.0}}]}, source="toy.yaml")
    plan = expand(spec)
    assert [t.metric for t in plan.tasks] == [toy.name] and plan.tasks[0].params == {"scale": 3.0}
    with pytest.raises(ParameterError, match=f"metric '{toy.name}' takes no parameter 'bogus'"):
        parse_spec({"name": "toy", "models": [str(vec)], "metrics": [{"name": toy.name, "params": {"bogus": 1}}]},
                   source="toy.yaml")
    # the tracker records how the numbers were obtained, from the entry's family
    assert embedding_method("static", toy.name, {}) == "lookup"


@pytest.mark.e2e
def test_the_cli_lists_the_registry():
    out = subprocess.run([sys.executable, "-m", "jobs.cli", "metrics", "--format", "json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["metric"] for r in rows] == list(registry.names())
    by = {r["metric"]: r for r in rows}
    assert by["seat"]["family"] == registry.get("seat").family.name
    assert set(by["crows_pairs"]["kinds"].split(", ")) == set(registry.get("crows_pairs").model_kinds)
    help_text = subprocess.run([sys.executable, "-m", "jobs.cli", "score", "--help"], capture_output=True,
                               text=True, timeout=120).stdout
    assert all(n in " ".join(help_text.split()) for n in registry.names())


@pytest.mark.unit
def test_every_entry_is_consistent():
    for name, e in registry.METRICS.items():
        assert e.name == name and e.headline and e.reference and e.items, name
        assert set(e.model_kinds) <= set(MODEL_KINDS)
        assert e.family.name in registry.FAMILIES and registry.FAMILIES[e.family.name] is e.family
        assert not set(e.family.params) & set(e.params), name
        for kind in e.model_kinds:
            assert isinstance(e.family.method(kind, {}), str) and e.result_name(kind)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(registry.get("weat"))
    with pytest.raises(ParameterError, match=r"unknown metric 'wet' \(did you mean 'weat'\?\)"):
        registry.get("wet")


@pytest.mark.unit
def test_kind_checks_name_the_model_and_what_is_needed():
    with pytest.raises(ModelError, match=r"metric 'seat' cannot run on model 'm' \(static word vectors\); it needs: "
                                         r"an encoder without LM head, a masked LM"):
        registry.check_kind("seat", "static", "m")
    assert registry.kind_reason("weat", "static") is None


@pytest.mark.unit
def test_split_params_and_seed():
    mp, ap = registry.split_params("weat", {"casefold": True, "ddof": 0})
    assert mp["casefold"] is True and mp["max_missing"] == 0.2 and ap == {"ddof": 0}
    rng = np.random.default_rng(0)
    X, Y, A, B = (rng.normal(size=(6, 5)) for _ in range(4))
    m = Measurement(family="association", targets=[X, Y], attributes=[A, B])
    a = registry.analyse(m, "weat", {"permutations": 50, "n_bootstrap": 20}, seed=7)
    b = registry.analyse(m, "weat", {"permutations": 50, "n_bootstrap": 20, "seed": 7}, seed=99)
    assert a.fields["p_value"] == b.fields["p_value"] and a.fields["ci"] == b.fields["ci"]  # the task's seed is passed


@pytest.mark.unit
def test_sentence_pair_tests_take_only_their_metrics():
    pairs = runner.load_test(pd.DataFrame({"sent_more": ["a b"], "sent_less": ["a c"], "stereo_antistereo": ["stereo"],
                                           "bias_type": ["x"], "pair_id": [0]}))
    assert registry.supported(pairs) == [n for n, e in registry.METRICS.items() if e.family.test_type == "pairs"]
    assert "runs on sentence-pair tests" in registry.applies("crows_pairs", TEST)
    assert "runs on word-set tests" in registry.applies("weat", pairs)


@pytest.mark.unit
def test_the_key_covers_the_requested_dtype():
    """A float32 and a bfloat16 run of one checkpoint are different tasks (their numbers differ);
    a model loaded with its defaults keeps the key it had before dtypes entered the key."""
    from audit.provenance import load_key, task_key

    base = dict(model_revision="r", model_ref="m", dataset_digest="d", metric="weat", params={}, seed=0)
    assert task_key(**base) == task_key(**base, load=load_key({})) == task_key(**base, load=load_key({"dtype": None}))
    keys = {task_key(**base, load=load_key({"dtype": d})) for d in ("bfloat16", "float32", "float16")}
    assert len(keys) == 3 and task_key(**base) not in keys
    from jobs.spec import parse_spec

    spec = parse_spec({"name": "x", "models": [{"ref": "org/m", "backend": "hf-causal", "dtype": "bfloat16",
                                                "device_map": "auto"}], "metrics": ["crows_pairs"]}, source="x.yaml")
    assert spec.models[0].options["device_map"] == "auto" and load_key(spec.models[0].options) == "dtype=bfloat16"
