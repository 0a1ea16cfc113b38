"""The validation vocabulary (audit/schema.py): one formatter and one wording for sweep specs,
watch specs, Ray options, metric parameters and function arguments; and the one padded-batch
helper of the model engines (audit/backends/batching.py)."""

from __future__ import annotations

import numpy as np
import pytest

from audit import registry, schema, stats
from audit.backends.batching import pad_batch, positions
from audit.errors import DataError, ParameterError
from jobs import pool
from jobs.spec import RaySpec, parse_spec
from jobs.watch.spec import parse_watch_spec

pytestmark = pytest.mark.unit


class _Model(schema.Section):
    batch_size: schema.Int(1) = 4
    rate: schema.Num(0.0, strict=True, maximum=1.0) = 0.5


class _Sweep(schema.Section):
    models: list[_Model] = []


def test_one_line_names_file_field_path_and_value():
    cases = [({"models": [{}, {}, {"batch_size": "x"}]}, DataError,
              "spec.yaml: models[2].batch_size: expected an integer, got 'x'"),
             ({"models": [{"batch_size": 0}]}, ParameterError, "spec.yaml: models[0].batch_size: must be >= 1, got 0"),
             ({"models": [{"rate": 1}]}, ParameterError, "spec.yaml: models[0].rate: must be < 1, got 1"),
             ({"models": [{"rate": float("nan")}]}, DataError,
              "spec.yaml: models[0].rate: expected a finite number, got nan"),
             ({"models": [{"batch_sise": 2}]}, DataError, "spec.yaml: models[0].batch_sise: unknown field "
              "(did you mean 'batch_size'?); allowed fields: batch_size, rate")]
    for data, cls, msg in cases:
        with pytest.raises(cls) as e:
            schema.validate(_Sweep, data, "spec.yaml")
        assert type(e.value) is cls and str(e.value) == msg
    assert schema.validate(_Sweep, {"models": [{"batch_size": np.int64(3).item()}]}).models[0].batch_size == 3


def _spec(ray):
    return {"name": "s", "models": ["glove-6b-50d"], "metrics": ["weat"], "ray": ray}


def test_the_same_refusal_reads_the_same_in_every_input():
    """batch_size 0 and 'x' as a sweep's Ray option, a watch's Ray option, a metric parameter and
    a statistics function's argument: the same words after the field's name."""
    zero, word = [], []
    for bad, out in ((0, zero), ("x", word)):
        for fn in (lambda: parse_spec(_spec({"batch_size": bad}), "s.yaml"),
                   lambda: parse_watch_spec({"name": "w", "watch": [{"repo": "a/b"}], "audit": {"spec": "s.yaml"},
                                             "ray": {"max_jobs": bad}}, "w.yaml"),
                   lambda: registry.check_params("weat", {"batch_size": bad}),
                   lambda: stats.check_bootstrap(bad if bad == "x" else -1, 0.95) if bad == "x"
                   else schema.integer(bad, "n", 1)):
            with pytest.raises((DataError, ParameterError)) as e:
                fn()
            out.append(str(e.value).rsplit(": ", 1)[-1])
    assert set(zero) == {"must be >= 1, got 0"}, zero
    assert set(word) == {"expected an integer, got 'x'"}, word


def test_ray_options_are_declared_once_and_validated_when_changed_in_code(tmp_path):
    assert pool.RAY_DEFAULTS == {k: getattr(RaySpec(), k) for k in pool.POOL_OPTIONS}
    spec = parse_spec(_spec({"max_workers": 2}), "s.yaml")
    assert pool.ray_option(spec, "max_workers") == 2 and pool.ray_option(spec, "prefetch") == 2
    s2 = pool.with_ray_options(spec, prefetch=0)
    assert (s2.ray.prefetch, s2.ray.max_workers, s2.ray.batch_size) == (0, 2, 4)
    with pytest.raises(ParameterError, match=r"^with_ray_options: ray\.max_workers: must be >= 1, got 0$"):
        pool.with_ray_options(spec, max_workers=0)
    with pytest.raises(ParameterError, match=r"ray\.actor_num_gpus: a model uses a fraction of one GPU or whole GPUs"):
        parse_spec(_spec({"actor_num_gpus": 1.5}), "s.yaml")


def test_metric_parameters_take_numpy_scalars_and_refuse_nan():
    registry.check_params("weat", {"n_bootstrap": np.int64(5), "confidence": np.float64(0.9),
                                   "casefold": np.bool_(True)})
    with pytest.raises(ParameterError,
                       match=r"^parameter confidence of metric 'weat': expected a finite number, got nan$"):
        registry.check_params("weat", {"confidence": np.float64("nan")})
    with pytest.raises(ParameterError, match=r"^parameter permutations of metric 'weat': must be >= 1, got 0$"):
        registry.check_params("weat", {"permutations": 0})
    assert stats.check_bootstrap(np.int64(10), 0.9) == (10, 0.9)
    with pytest.raises(ParameterError, match=r"^confidence: must be < 1, got 1\.0$"):
        stats.check_bootstrap(10, 1.0)


def test_pad_batch_right_and_left():
    seqs = [[5, 6, 7], [8], [9, 10]]
    r = pad_batch(seqs, 0)
    assert r.ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert r.mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]] and r.offsets.tolist() == [0, 0, 0]
    left = pad_batch(seqs, -1, "left")
    assert left.ids.tolist() == [[5, 6, 7], [-1, -1, 8], [-1, 9, 10]]
    assert left.offsets.tolist() == [0, 2, 1] and left.lengths.tolist() == [3, 1, 2]
    assert positions(left.mask).tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    assert (left.real == left.mask.numpy().astype(bool)).all()
    with pytest.raises(ParameterError, match=r"^padding_side: unknown value 'top'; known: right, left$"):
        pad_batch(seqs, 0, "top")


def _sweep(model=None, metric="weat", **top):
    m = model if model and "build" in model else {"ref": "glove-6b-50d", "name": "g2", **(model or {})}
    return {"name": "s", "models": ["glove-6b-50d", m], "metrics": [metric], **top}


def _watch(entry):
    return {"name": "w", "audit": {"spec": "s.yaml"}, "watch": ["org/model", entry]}


def _refusal(fn):
    with pytest.raises((DataError, ParameterError)) as e:
        fn()
    return type(e.value).__name__, str(e.value)


BUILD = {"name": "tiny", "build": {"kind": "fasttext"}}
LOCAL = {"local": "/models"}


def _mit(**step):
    """A sweep whose models[1] has the static debiasing step ``step``."""
    return _sweep({"mitigation": {"method": "hd", **step}})


def _lm(**step):
    """A sweep whose models[1] has the LM debiasing step ``step``."""
    return _sweep({"lm_mitigation": {"technique": "inlp", "corpus": "tests", **step}})
#: (what, [(the input, the line it is refused with)]): the same bad value in models[i], models[i].build,
#: metrics[i], watch[i] and the top level reads the same after its field path.
SAME_WORDS = [
    ("an integer written as a word", [
        (lambda: parse_spec(_sweep({**BUILD, "build": {"kind": "fasttext", "dim": "x"}}), "s.yaml"),
         ("DataError", "s.yaml: models[1].build.dim: expected an integer, got 'x'")),
        (lambda: parse_watch_spec(_watch({**LOCAL, "revisions": "x"}), "w.yaml"),
         ("DataError", "w.yaml: watch[1].revisions: expected an integer, got 'x'")),
        (lambda: parse_watch_spec({**_watch("a/b"), "max_attempts": "x"}, "w.yaml"),
         ("DataError", "w.yaml: max_attempts: expected an integer, got 'x'")),
        (lambda: parse_spec(_sweep(seed="x"), "s.yaml"), ("DataError", "s.yaml: seed: expected an integer, got 'x'")),
        (lambda: parse_spec(_lm(technique="cda", params={"steps": "x"}), "s.yaml"),
         ("DataError", "s.yaml: models[1].lm_mitigation.params.steps: expected an integer, got 'x'")),
        (lambda: parse_spec(_mit(method="dhd", params={"n_init": "x"}), "s.yaml"),
         ("DataError", "s.yaml: models[1].mitigation.params.n_init: expected an integer, got 'x'"))]),
    ("a count below its minimum", [
        (lambda: parse_spec(_sweep({**BUILD, "build": {"kind": "fasttext", "epoch": 0}}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].build.epoch: must be >= 1, got 0")),
        (lambda: parse_watch_spec(_watch({"author": "org", "limit": 0}), "w.yaml"),
         ("ParameterError", "w.yaml: watch[1].limit: must be >= 1, got 0")),
        (lambda: parse_spec(_mit(params={"n_components": 0}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].mitigation.params.n_components: must be >= 1, got 0")),
        (lambda: parse_spec(_lm(params={"n_classifiers": 0}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].lm_mitigation.params.n_classifiers: must be >= 1, got 0"))]),
    ("a flag written as yes", [
        (lambda: parse_spec(_sweep({"subword": "yes"}), "s.yaml"),
         ("DataError", "s.yaml: models[1].subword: expected true or false, got 'yes'")),
        (lambda: parse_spec(_mit(params={"case_variants": "yes"}), "s.yaml"),
         ("DataError", "s.yaml: models[1].mitigation.params.case_variants: expected true or false, got 'yes'")),
        (lambda: parse_spec(_lm(technique="sentence_debias", params={"drop_last": "yes"}), "s.yaml"),
         ("DataError", "s.yaml: models[1].lm_mitigation.params.drop_last: expected true or false, got 'yes'"))]),
    ("an empty string", [
        (lambda: parse_spec(_sweep({"ref": ""}), "s.yaml"),
         ("DataError", "s.yaml: models[1].ref: expected a non-empty string, got ''")),
        (lambda: parse_spec(_sweep(metric={"name": "weat", "tests": ["weat1", ""]}), "s.yaml"),
         ("DataError", "s.yaml: metrics[0].tests[1]: expected a non-empty string, got ''")),
        (lambda: parse_watch_spec(_watch({"author": ""}), "w.yaml"),
         ("DataError", "w.yaml: watch[1].author: expected a non-empty string, got ''")),
        (lambda: parse_spec(_mit(definitions=""), "s.yaml"),
         ("DataError", "s.yaml: models[1].mitigation.definitions: expected a non-empty string, got ''")),
        (lambda: parse_spec(_lm(language=""), "s.yaml"),
         ("DataError", "s.yaml: models[1].lm_mitigation.language: expected a non-empty string, got ''")),
        (lambda: parse_watch_spec({**_watch("a/b"), "audit": {"spec": ""}}, "w.yaml"),
         ("DataError", "w.yaml: audit.spec: expected a non-empty string, got ''"))]),
    ("a required field left out", [
        (lambda: parse_spec(_sweep({**BUILD, "build": {"dim": 8}}), "s.yaml"),
         ("DataError", "s.yaml: models[1].build.kind: missing required field")),
        (lambda: parse_spec(_sweep(metric={"params": {}}), "s.yaml"),
         ("DataError", "s.yaml: metrics[0].name: missing required field")),
        (lambda: parse_spec({"models": ["glove-6b-50d"], "metrics": ["weat"]}, "s.yaml"),
         ("DataError", "s.yaml: name: missing required field")),
        (lambda: parse_spec(_sweep({"mitigation": [{"params": {}}]}), "s.yaml"),
         ("DataError", "s.yaml: models[1].mitigation[0].method: missing required field")),
        (lambda: parse_spec(_sweep({"lm_mitigation": {"corpus": "tests"}}), "s.yaml"),
         ("DataError", "s.yaml: models[1].lm_mitigation.technique: missing required field"))]),
    ("a name out of a closed set, near a known one", [
        (lambda: parse_spec(_sweep({"dtype": "float31"}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].dtype: unknown dtype 'float31' (did you mean 'float32'?); "
                            "known: float32, float16, bfloat16")),
        (lambda: parse_watch_spec(_watch({**LOCAL, "order": "nmae"}), "w.yaml"),
         ("ParameterError", "w.yaml: watch[1].order: unknown order 'nmae' (did you mean 'name'?); known: mtime, name")),
        (lambda: parse_watch_spec(_watch({**LOCAL, "layout": 3}), "w.yaml"),
         ("DataError", "w.yaml: watch[1].layout: expected a non-empty string, got 3")),
        (lambda: parse_spec(_mit(scope="tets"), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].mitigation.scope: unknown scope 'tets' (did you mean 'tests'?); "
                            "known: all, tests")),
        (lambda: parse_spec(_lm(technique="inpl"), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].lm_mitigation.technique: unknown LM debiasing technique 'inpl' "
                            "(did you mean 'inlp'?); known: inlp, sentence_debias, self_debias, cda, dropout")),
        (lambda: parse_spec(_mit(method="ran", params={"neutralization": "cosin"}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].mitigation.params.neutralization: unknown neutralization 'cosin' "
                            "(did you mean 'cosine'?); known: cosine, dot"))]),
    ("a language that is no ISO 639-1 code", [
        (lambda: parse_spec(_sweep({"languages": ["en", "xx"]}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].languages[1]: unknown language 'xx'; use an ISO 639-1 code such as "
                            "en, de, fr")),
        (lambda: parse_spec(_sweep({**BUILD, "build": {"kind": "llama", "language": ["en", "xx"]}}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].build.language[1]: unknown language 'xx'; use an ISO 639-1 code "
                            "such as en, de, fr"))]),
    ("a finite number that is NaN", [
        (lambda: parse_watch_spec(_watch({**LOCAL, "settle": float("nan")}), "w.yaml"),
         ("DataError", "w.yaml: watch[1].settle: expected a finite number, got nan")),
        (lambda: parse_watch_spec({**_watch("a/b"), "notify": {"url": "http://h/x", "timeout": float("nan")}},
                                  "w.yaml"),
         ("DataError", "w.yaml: notify.timeout: expected a finite number, got nan")),
        (lambda: parse_spec(_mit(method="hsr", params={"alpha": float("nan")}), "s.yaml"),
         ("DataError", "s.yaml: models[1].mitigation.params.alpha: expected a finite number, got nan")),
        (lambda: parse_spec(_lm(technique="self_debias", params={"epsilon": float("nan")}), "s.yaml"),
         ("DataError", "s.yaml: models[1].lm_mitigation.params.epsilon: expected a finite number, got nan"))]),
    ("a number below its minimum", [
        (lambda: parse_watch_spec({**_watch("a/b"), "notify": {"url": "http://h/x", "timeout": 0}}, "w.yaml"),
         ("ParameterError", "w.yaml: notify.timeout: must be > 0, got 0")),
        (lambda: parse_spec(_lm(technique="dropout", params={"lr": 0}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].lm_mitigation.params.lr: must be > 0, got 0")),
        (lambda: parse_spec(_mit(method="ran", params={"learning_rate": 0}), "s.yaml"),
         ("ParameterError", "s.yaml: models[1].mitigation.params.learning_rate: must be > 0, got 0"))]),
    ("a key biasaudit or the watcher sets", [
        (lambda: parse_spec(_sweep(tags={"audit.model": "x"}), "s.yaml"),
         ("ParameterError", "s.yaml: tags.audit.model: tags starting with 'audit.' are set by biasaudit")),
        (lambda: parse_watch_spec({**_watch("a/b"), "audit": {"spec": "s.yaml", "model": {"ref": "x"}}}, "w.yaml"),
         ("ParameterError", "w.yaml: audit.model.ref: is set by the watcher for each watched model"))]),
]


@pytest.mark.parametrize("what,cases", SAME_WORDS, ids=[w for w, _ in SAME_WORDS])
def test_models_build_metrics_and_watch_entries_refuse_in_the_same_words(what, cases):
    got = [_refusal(fn) for fn, _ in cases]
    assert got == [want for _, want in cases]
    if not what.startswith(("a name out of", "a key")):  # the same value, the same class and words after the field path
        assert len({(cls, line.split(": ", 2)[-1]) for cls, line in got}) == 1, got


def test_unknown_fields_read_the_same_in_models_build_metrics_watch_and_the_top_level():
    from audit.lm_mitigation.steps import INLP
    from audit.mitigation import HardDebias
    from jobs.lm_spec import LMStepFields
    from jobs.spec import BuildSpec, MetricFields, MitigationFields, ModelFields, SpecFields
    from jobs.watch.spec import AuditFields, EntryFields, Notify, WatchFields

    cases = [(lambda: parse_spec(_sweep({"batch_size": 2}), "s.yaml"), "s.yaml: models[1].batch_size", ModelFields),
             (lambda: parse_spec(_sweep({**BUILD, "build": {"kind": "fasttext", "dimm": 8}}), "s.yaml"),
              "s.yaml: models[1].build.dimm", BuildSpec),
             (lambda: parse_spec(_sweep(metric={"name": "weat", "param": {}}), "s.yaml"), "s.yaml: metrics[0].param",
              MetricFields),
             (lambda: parse_spec(_sweep(seeed=1), "s.yaml"), "s.yaml: seeed", SpecFields),
             (lambda: parse_watch_spec(_watch({"repo": "a/b", "limt": 1}), "w.yaml"), "w.yaml: watch[1].limt",
              EntryFields),
             (lambda: parse_watch_spec({**_watch("a/b"), "intervall": 60}, "w.yaml"), "w.yaml: intervall", WatchFields),
             (lambda: parse_spec(_mit(scop="all"), "s.yaml"), "s.yaml: models[1].mitigation.scop", MitigationFields),
             (lambda: parse_spec(_mit(params={"n_component": 2}), "s.yaml"),
              "s.yaml: models[1].mitigation.params.n_component", HardDebias.Params),
             (lambda: parse_spec(_lm(corpuss="x"), "s.yaml"), "s.yaml: models[1].lm_mitigation.corpuss", LMStepFields),
             (lambda: parse_spec(_lm(params={"n_clasifiers": 2}), "s.yaml"),
              "s.yaml: models[1].lm_mitigation.params.n_clasifiers", INLP.Params),
             (lambda: parse_watch_spec({**_watch("a/b"), "notify": {"url": "http://h/x", "timeot": 3}}, "w.yaml"),
              "w.yaml: notify.timeot", Notify),
             (lambda: parse_watch_spec(_watch({"repo": "a/b", "audit": {"spek": "s.yaml"}}), "w.yaml"),
              "w.yaml: watch[1].audit.spek", AuditFields)]
    for fn, where, model in cases:
        cls, line = _refusal(fn)
        assert cls == "DataError" and line.startswith(f"{where}: unknown field")
        assert line.endswith("; allowed fields: " + ", ".join(sorted(model.model_fields))), line
    assert "(did you mean 'dim'?)" in _refusal(cases[1][0])[1] and "(did you mean 'seed'?)" in _refusal(cases[3][0])[1]
    assert "(did you mean 'limit'?)" in _refusal(cases[4][0])[1]
    assert "(did you mean 'interval'?)" in _refusal(cases[5][0])[1]
    assert "(did you mean 'n_components'?)" in _refusal(cases[7][0])[1]
    assert "(did you mean 'timeout'?)" in _refusal(cases[10][0])[1]


def test_a_technique_declares_its_parameters_once():
    """Each debiasing method's and LM technique's ``Params`` model holds exactly the constructor's
    keyword parameters with the same defaults (the signature is the Python API, the model their
    types and ranges); the trained techniques' model is further_pretrain's."""
    import inspect

    from audit.lm_mitigation import TECHNIQUES
    from audit.lm_mitigation.steps import CDA, INLP, PARAMS, SelfDebias, SentenceDebias
    from audit.lm_mitigation.training import TrainParams, further_pretrain
    from audit.mitigation import METHODS

    def defaults(fn):
        return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind == p.KEYWORD_ONLY}

    owners = [(cls.__init__, cls.Params) for cls in [*METHODS.values(), CDA]]
    owners += [(further_pretrain, TrainParams)]
    owners += [(cls.__init__, cls.Params) for cls in (INLP, SentenceDebias, SelfDebias)]
    assert len(owners) == len(METHODS) + 5 and set(PARAMS) == set(TECHNIQUES)
    for fn, model in owners:
        declared = {k: f.default for k, f in model.model_fields.items()}
        given = defaults(fn)
        if fn is further_pretrain:
            given = {k: v for k, v in given.items() if k in declared}  # kind, mlm_probability: not spec parameters
        assert given == declared, (fn.__qualname__, given, declared)


def test_a_whole_float_for_a_count_is_that_integer_where_a_function_uses_it():
    """A function argument checked by :func:`audit.schema.integer` is used as the integer it returns:
    ``2.0`` for a count is 2 (as in specs and ``--param``), not a float passed on to ``range``."""
    from audit.backends import batching, hf_generate
    from audit.datasets.bbq import select_items
    from audit.runner import load_test

    assert schema.integer(2.0, "limit", 1) == 2 and type(schema.integer(2.0, "limit", 1)) is int
    n = hf_generate._check_generation(2.0, 0, False)
    assert n == 2 and type(n) is int
    assert type(batching.check_batch_size(np.int64(4))) is int and batching.check_batch_size(None) is None
    table = load_test("en/bbq").table
    assert select_items(table, None, 2.0).equals(select_items(table, None, 2))
    with pytest.raises(ParameterError, match=r"^limit: expected an integer, got 2\.5$"):
        select_items(table, None, 2.5)


def test_an_integer_check_does_not_depend_on_what_was_checked_before():
    """:func:`audit.schema.integer` gives the same answer whatever it checked earlier in the process.
    Its whole-float rule had been cached on the values, and ``True == 1.0``: after a ``1.0`` a
    ``True`` passed as the integer 1 (``n_bootstrap: true`` as one resample), after a ``True`` a
    ``1.0`` was refused as ``got True``, and a list raised ``TypeError: unhashable type``."""
    for first, then in ((1.0, True), (True, 1.0), (1, True), (True, 1)):
        for v in (first, then):
            if isinstance(v, bool):
                with pytest.raises(ParameterError, match=r"^n: expected an integer, got True$"):
                    schema.integer(v, "n")
            else:
                got = schema.integer(v, "n")
                assert got == 1 and type(got) is int, (first, then, got)
    for bad in ([1], {"a": 1}, {1}):
        with pytest.raises(ParameterError, match=r"^n: expected an integer, got "):
            schema.integer(bad, "n", 0)
    spec = {"name": "s", "models": [{"name": "a", "ref": "m.vec"}], "tests": ["weat1"], "metrics": ["weat"]}
    for bad, shown in (([1], r"\[1\]"), (True, "True")):
        with pytest.raises(DataError, match=rf"^s\.yaml: permutations: expected an integer, got {shown}$"):
            parse_spec({**spec, "permutations": bad}, source="s.yaml")


def test_one_validator_per_integer_type_however_often_it_is_checked():
    """``Int(m)`` is one type per ``m`` (as ``Num`` and ``OneOf``), so checking a value builds no new
    validator: built per call, each :func:`audit.schema.integer` had made a ``TypeAdapter`` (0.16 ms)
    and kept it for the life of the process (23,000 of them in one run of the unit tier)."""
    assert schema.Int(0) is schema.Int(0) and schema.Int(1) is not schema.Int(0)
    assert schema.Num(0.0, strict=True) is schema.Num(0.0, strict=True)
    before = schema._adapter.cache_info().currsize
    for i in range(500):
        assert schema.integer(i, "n", 0) == i
        schema.number(i / 7, "x", 0.0)
    assert schema._adapter.cache_info().currsize - before <= 2
