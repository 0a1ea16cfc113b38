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
    with pytest.raises(ParameterError, match="padding_side: 'top'"):
        pad_batch(seqs, 0, "top")
