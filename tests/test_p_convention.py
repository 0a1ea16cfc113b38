"""The p-value convention is part of every permutation metric's audit.key: results computed
under the old strict count get new keys (a resumed sweep recomputes them), and the convention
named explicitly gives the same key as the default."""

from __future__ import annotations

import pytest

from audit import registry
from audit.provenance import task_key


def _key(metric, params):
    return task_key(model_revision="r", model_ref="m", dataset_digest="d", metric=metric,
                    params=registry.key_params(metric, params), seed=0, version="v")


@pytest.mark.unit
def test_convention_enters_the_key_of_permutation_metrics_only():
    for metric in ("weat", "seat", "lpbs"):
        default = _key(metric, {"permutations": 200})
        assert default == _key(metric, {"permutations": 200, "p_convention": "phipson_smyth"})
        assert default != _key(metric, {"permutations": 200, "p_convention": "caliskan"})
        # the key before the convention existed (params without it) is not reused
        old = task_key(model_revision="r", model_ref="m", dataset_digest="d", metric=metric,
                       params={"permutations": 200}, seed=0, version="v")
        assert default != old
    assert registry.key_params("rnd", {"distance": "cosine"}) == {"distance": "cosine"}
