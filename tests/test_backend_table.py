"""One backend table and one architecture -> kind rule (audit/backends/table.py): the loader, the
spec validator, the planner and the watcher read the same rows and agree."""

from __future__ import annotations

import json

import pytest

from audit.backends import table
from audit.errors import ModelError
from audit.runner import load_model
from jobs import spec
from jobs.resolve import model_kind
from jobs.watch.sources import backend_hint


@pytest.mark.parametrize("archs, kind", [
    (["GPT2LMHeadModel", "BertForMaskedLM"], "causal"),   # the first head listed decides
    (["BertForMaskedLM", "GPT2LMHeadModel"], "mlm"),
    (["BertModel", "LlamaForCausalLM"], "causal"),         # an entry without a head does not decide
    (["RobertaForMaskedLM"], "mlm"),
    (["BertModel"], "encoder"),
    ([], "encoder"),
])
@pytest.mark.unit
def test_planner_loader_and_watcher_agree_on_the_kind(tmp_path, archs, kind):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": archs}))
    assert table.kind_from_architectures(archs) == kind
    assert table.infer_hf_kind(str(tmp_path)) == kind            # the loader (audit.runner.load_model)
    assert model_kind(str(tmp_path)) == kind                     # the planner
    hint = backend_hint({"architectures": archs}, None)          # the watcher's backend for a new repo
    if archs:
        assert hint == f"hf-{kind}" and table.kind_of_backend(hint) == kind
    else:
        assert hint is None


@pytest.mark.unit
def test_every_backend_name_is_one_row_with_one_kind():
    assert spec.BACKENDS == table.names()
    assert {table.kind_of_backend(n) for n in table.names()} == {"static", "encoder", "mlm", "causal", "sentence"}
    assert [table.backend_of_kind(k) for k in ("encoder", "mlm", "causal")] == ["hf-encoder", "hf-mlm", "hf-causal"]
    assert table.get("hf-foo") is None and table.kind_of_backend("hf-foo") is None
    for n in table.names():
        assert model_kind("anything", backend=n) == table.kind_of_backend(n)


@pytest.mark.unit
def test_load_model_refuses_an_unknown_backend_in_one_line():
    with pytest.raises(ModelError, match=r"^model 'x': unknown backend 'hf-foo'; known backends: static, fasttext"):
        load_model("x", backend="hf-foo")
