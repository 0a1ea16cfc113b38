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
    a model loaded with its defaults keeps the key it had before dtypes entered the key, and the
    default is float32 on every device, so asking for it by any name is the same task; an alias
    is keyed by its canonical name; an unknown dtype is refused in one line."""
    from audit.errors import ParameterError
    from audit.provenance import load_key, task_key

    base = dict(model_revision="r", model_ref="m", dataset_digest="d", metric="weat", params={}, seed=0)
    assert task_key(**base) == task_key(**base, load=load_key({})) == task_key(**base, load=load_key({"dtype": None}))
    for d in ("float32", "fp32", "torch.float32"):
        assert task_key(**base, load=load_key({"dtype": d})) == task_key(**base)
    keys = {task_key(**base, load=load_key({"dtype": d})) for d in ("bfloat16", "float16")}
    assert len(keys) == 2 and task_key(**base) not in keys
    assert load_key({"dtype": "bf16"}) == load_key({"dtype": "bfloat16"}) == "dtype=bfloat16"
    assert load_key({"dtype": "half"}) == "dtype=float16"
    with pytest.raises(ParameterError, match=r"^dtype: unknown value 'auto'; known: float32, float16, bfloat16$"):
        load_key({"dtype": "auto"})
    from jobs.spec import parse_spec

    spec = parse_spec({"name": "x", "models": [{"ref": "org/m", "backend": "hf-causal", "dtype": "bfloat16",
                                                "device_map": "auto"}], "metrics": ["crows_pairs"]}, source="x.yaml")
    assert spec.models[0].options["device_map"] == "auto" and load_key(spec.models[0].options) == "dtype=bfloat16"


# ---------------------------------------------------------------- a new multiple-choice benchmark is two files

_TOY_READER = '''"""Toy four-option benchmark: the reader (one JSON object per line: context, options, stereo)."""
import json
from pathlib import Path

import pandas as pd

from audit.datasets.external import register_format
from audit.suites import OptionItems


def looks_like_toy(p: Path) -> bool:
    return p.suffix == ".jsonl" and p.read_text(encoding="utf-8").startswith('{"toy4"')


def read_toy(path, stub):
    rows = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    table = pd.DataFrame({"item": range(len(rows)), "context": [r["context"] for r in rows],
                          **{f"option{j}": [r["options"][j] for r in rows] for j in range(4)},
                          "gold": [r["stereo"] for r in rows], "category": [r["toy4"] for r in rows]})
    return OptionItems(name=stub.name, language=stub.language, table=table, source=str(path), n_options=4)


register_format("toy4", read_toy, "options", sniff=looks_like_toy)
'''

_TOY_ENTRY = '''"""Toy four-option benchmark: the metric entry (share of items whose top option is the stereotype)."""
import pandas as pd

from audit.compare import item_mean_comparer
from audit.entries import Metric
from audit.measure.options import OPTIONS
from audit.registry import register
from audit.result import MetricOutput


def stereo_choice_rate(table: pd.DataFrame) -> MetricOutput:
    s = table[[f"score{j}" for j in range(4)]].to_numpy()
    hit = (s.argmax(axis=1) == table["gold"].to_numpy()).astype(float)
    items = pd.DataFrame({"set": "items", "index": table["item"].to_numpy(), "hit": hit})
    return MetricOutput(value=float(hit.mean()), fields={"n_items": len(hit)}, items=items)


register(Metric(name="toy_mc4", family=OPTIONS, analyse=lambda m, **p: stereo_choice_rate(m.table), params={},
                headline="share of items whose highest-scoring option is the stereotyped one", reference="this test",
                items="one row per item: whether the stereotyped option won", comparer=item_mean_comparer("hit")))
'''

_TOY_ROWS = [
    {"toy4": "job", "context": "The nurse said that", "options": ["she", "he", "they", "it"], "stereo": 0},
    {"toy4": "job", "context": "The engineer said that", "options": ["she", "he", "they", "it"], "stereo": 1},
    {"toy4": "age", "context": "The old man was", "options": ["slow", "fast", "kind", "tall"], "stereo": 0},
    {"toy4": "age", "context": "The young girl was", "options": ["wise", "naive", "happy", "short"], "stereo": 1},
    {"toy4": "age", "context": "My grandmother is", "options": ["frail", "strong", "here", "late"], "stereo": 0},
]


@pytest.fixture
def toy_mc(tmp_path, monkeypatch):
    """The two files of a four-option benchmark in a tmp package, loaded as plugins (the environment
    carries them to Ray workers started afterwards), and its data file."""
    pkg = tmp_path / "plugins"
    pkg.mkdir()
    (pkg / "toy_mc_reader.py").write_text(_TOY_READER, encoding="utf-8")
    (pkg / "toy_mc_entry.py").write_text(_TOY_ENTRY, encoding="utf-8")
    data = tmp_path / "en" / "toy4.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in _TOY_ROWS), encoding="utf-8")
    monkeypatch.syspath_prepend(str(pkg))
    import os

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pkg), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(registry.PLUGINS_ENV, "toy_mc_reader,toy_mc_entry")
    registry.load_plugins()
    yield data
    from audit.datasets import external

    registry.unregister("toy_mc4")
    for table in (external.READERS, external.FORMAT_TYPES, external.SNIFFERS):
        table.pop("toy4", None)
    for mod in ("toy_mc_reader", "toy_mc_entry"):
        sys.modules.pop(mod, None)


def _expected_hits(model, rows) -> list[float]:
    """Each option scored on its own through the model interface: argmax == stereotyped option."""
    out = []
    for r in rows:
        sc, _ = model.handle.loglikelihood([(r["context"], " " + o) for o in r["options"]], batch_size=1)
        out.append(float(int(np.argmax(sc)) == r["stereo"]))
    return out


@pytest.mark.unit
def test_a_new_multiple_choice_benchmark_is_two_files(toy_mc, tmp_path, capsys):
    from audit import tiny_models
    from audit.cli import main as audit_main

    test = runner.load_test(str(toy_mc))
    assert type(test).__name__ == "OptionItems" and test.n_options == 4 and len(test.table) == 5
    assert registry.supported(test) == ["toy_mc4"]
    assert "toy_mc4 runs on scored-option tests, not on weat1" in registry.applies("toy_mc4", runner.load_test("weat1"))
    for kind in ("gpt2", "bert"):
        path = str(tiny_models.tiny_model_dir(kind))
        lm = runner.load_model(path)
        meas = runner.measure(lm, test, "toy_mc4", {})
        # the per-item, per-option score table: each score equals the option scored alone
        for i, r in enumerate(_TOY_ROWS):
            alone, n = lm.handle.loglikelihood([(r["context"], " " + o) for o in r["options"]], batch_size=1)
            got = meas.table.loc[i, [f"score{j}" for j in range(4)]].to_numpy(dtype=float)
            np.testing.assert_allclose(got, alone, rtol=0, atol=1e-4)
            assert meas.table.loc[i, [f"n_tokens{j}" for j in range(4)]].tolist() == list(n)
            assert meas.table.loc[i, "n_chars0"] == len(r["options"][0])
        assert list(meas.table["category"]) == [r["toy4"] for r in _TOY_ROWS]
        # `audit score` in-process
        assert audit_main(["score", "--model", path, "--test", str(toy_mc), "--metric", "toy_mc4",
                           "--format", "json"]) == 0
        res = json.loads(capsys.readouterr().out)
        hits = _expected_hits(lm, _TOY_ROWS)
        assert res["value"] == pytest.approx(np.mean(hits), abs=1e-12) and res["n_items"] == 5
    assert registry.comparer("toy_mc4") is registry.get("toy_mc4").comparer is not None
    # the planner
    from jobs.plan import expand
    from jobs.spec import parse_spec

    gpt2 = str(tiny_models.tiny_model_dir("gpt2"))
    spec = parse_spec({"name": "toy4", "models": [{"name": "tiny-gpt2", "ref": gpt2}, {"name": "glove",
                       "ref": "glove-6b-50d"}], "tests": [str(toy_mc), "weat1"], "metrics": ["toy_mc4", "weat"],
                       "output_dir": str(tmp_path / "out")}, source="toy4.yaml")
    plan = expand(spec)
    assert {(t.model, t.metric) for t in plan.tasks if t.metric == "toy_mc4"} == {("tiny-gpt2", "toy_mc4")}
    reasons = {(s.model, s.metric): s.reason for s in plan.skipped}
    assert "toy_mc4 cannot run on static word vectors" in reasons[("glove", "toy_mc4")]


@pytest.mark.ray
def test_the_toy_benchmark_runs_in_a_sweep(toy_mc, fresh_ray, tmp_path):
    """The plugin's entry and reader reach the Ray workers (``BIASAUDIT_PLUGINS``); the recorded
    value is the one of the options scored alone."""
    from audit import tiny_models
    from jobs.spec import parse_spec
    from jobs.sweep import run_sweep

    gpt2 = str(tiny_models.tiny_model_dir("gpt2"))
    spec = parse_spec({"name": "toy4", "seed": 0, "output_dir": str(tmp_path / "out"),
                       "models": [{"name": "tiny-gpt2", "ref": gpt2}], "tests": [str(toy_mc)],
                       "metrics": ["toy_mc4"],
                       "ray": {"num_cpus": 2, "object_store_memory": 200_000_000, "actor_num_cpus": 0.5}},
                      source="toy4.yaml")
    out = run_sweep(spec, progress=False)
    assert out.exit_code == 0 and out.ran == 1, out.results.to_dict("records")
    row = out.results.iloc[0]
    assert row.status == "finished" and row.metric == "toy_mc4"
    hits = _expected_hits(runner.load_model(gpt2), _TOY_ROWS)
    assert float(row.value) == pytest.approx(np.mean(hits), abs=1e-12)


# ---------------------------------------------------------------- a new engine is one module (with its row)

_TOY_ENGINE = '''"""Toy embedding engine: one module, its backend-table row registered on import."""
import hashlib

import numpy as np

from audit.backends.table import Backend, register_backend


class ToyEmbedder:
    kind, backend, dim, max_length, num_hidden_layers = "toyvec", "toy-engine", 8, 64, 1

    def __init__(self, ref, path):
        self.ref, self.path, self.revision = ref, path, "toy:" + path

    def embed(self, sentences, *, method=None, spans=None, layer=-1, batch_size=32, padding_side="right"):
        def vec(s):
            seed = int.from_bytes(hashlib.sha256(s.encode("utf-8")).digest()[:8], "little")
            return np.random.default_rng(seed).normal(size=self.dim)

        return np.stack([vec(s) for s in sentences]).astype(np.float32)


def load(ref, *, path, device=None, dtype=None):
    return ToyEmbedder(ref, path)


def probe(path):
    return "toy:" + path


register_backend(Backend("toy-engine", "toy", "toyvec", prefix="toy:", loader="toy_engine:load",
                         probe="toy_engine:probe", kind_name="a toy embedding model", operations=("embed",),
                         pooling="model"))
'''


@pytest.mark.unit
def test_a_new_engine_is_one_module_and_its_row(tmp_path, monkeypatch):
    from audit.backends import table
    from jobs.resolve import model_kind, probe_revision, resolve_ref

    (tmp_path / "toy_engine.py").write_text(_TOY_ENGINE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.load_plugins("toy_engine")
    try:
        # the planner tells the kind and the revision from the row, without loading
        assert model_kind("toy:abc") == "toyvec" and resolve_ref("toy:abc") == "toy:abc"
        assert probe_revision("toy:abc", "toyvec") == "toy:abc"
        # the families whose operations the row implements take the kind; the others name it
        assert "toyvec" in registry.get("seat").model_kinds and "toyvec" in registry.get("weat").model_kinds
        assert registry.kind_reason("lpbs", "toyvec") == "lpbs cannot run on a toy embedding model (needs mlm, causal)"
        lm = runner.load_model("toy:abc")
        assert (lm.kind, lm.backend, lm.revision) == ("toyvec", "toy-engine", "toy:abc")
        test = runner.load_test("weat7")
        meas = runner.measure(lm, test, "seat", {})
        from audit.measure.contextual import seat_sentences

        items = seat_sentences(test, "model")
        first = items[(items["role"] == "target") & (items["set_index"] == 0)]["sentence"].tolist()
        np.testing.assert_array_equal(meas.targets[0], lm.handle.embed(first).astype(np.float64))
        res = runner.score(lm, test, "seat", {"permutations": 200, "n_bootstrap": 20}, seed=0)
        assert np.isfinite(res.value) and registry.get("seat").family.method("toyvec", {}) == "model"
    finally:
        table.BACKENDS.pop("toy-engine", None)
        sys.modules.pop("toy_engine", None)
