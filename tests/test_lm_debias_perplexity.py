"""LM ability beside bias: perplexity (causal) and pseudo-perplexity (masked) as a registered metric."""

from __future__ import annotations

import math

import pytest

from audit import registry, runner, tiny_models
from audit.errors import DataError
from audit.measure.perplexity import perplexity_metric

pytestmark = pytest.mark.unit

TEXT = ["the man said that he would call his sister tomorrow .",
        "",
        "the weather was cold and the roads were icy .",
        "her mother told the man about his new job ."]


@pytest.fixture
def text_stub(tmp_path):
    (tmp_path / "heldout.txt").write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    stub = tmp_path / "heldout.yaml"
    stub.write_text("name: heldout\nlanguage: en\nformat: text\ndata: ./heldout.txt\n", encoding="utf-8")
    return stub


def _direct_causal(path, sentences):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    ll, n = 0.0, 0
    for s in sentences:
        ids = torch.tensor([[start] + tok(s, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids)["logits"][0, :-1].double(), -1)
        ll += float(lp[torch.arange(ids.shape[1] - 1), ids[0, 1:]].sum())
        n += ids.shape[1] - 1
    return math.exp(-ll / n), n


def _direct_pseudo(path, sentences):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    ll, n = 0.0, 0
    for s in sentences:
        ids = tok(s)["input_ids"]
        for i in range(1, len(ids) - 1):  # every token but [CLS] / [SEP]
            x = torch.tensor([ids[:i] + [tok.mask_token_id] + ids[i + 1:]])
            with torch.no_grad():
                lp = torch.log_softmax(model(x)["logits"][0, i].double(), -1)
            ll += float(lp[ids[i]])
            n += 1
    return math.exp(-ll / n), n


def test_perplexity_of_a_causal_lm_on_a_held_out_text(text_stub):
    path = str(tiny_models.tiny_model_dir("gpt2"))
    r = runner.score(path, str(text_stub), "perplexity")
    ppl, n = _direct_causal(path, [s for s in TEXT if s])
    assert r.metric == "perplexity" and r.fields["variant"] == "perplexity"
    assert r.fields["n_tokens"] == n and r.fields["n_sentences"] == 3
    assert abs(r.value - ppl) / ppl < 1e-5
    assert 1.0 < r.value < 5000  # a trained tiny model: far better than uniform over its vocabulary
    assert list(r.items["line"]) == [1, 3, 4]


def test_pseudo_perplexity_of_a_masked_lm(text_stub):
    path = str(tiny_models.tiny_model_dir("bert"))
    r = runner.score(path, str(text_stub), "perplexity")
    pppl, n = _direct_pseudo(path, [s for s in TEXT if s])
    assert r.metric == "pseudo_perplexity" and r.fields["variant"] == "pseudo-perplexity"
    assert r.fields["n_tokens"] == n
    assert abs(r.value - pppl) / pppl < 1e-5


def test_perplexity_refuses_bad_input(tmp_path):
    import pandas as pd
    t = pd.DataFrame({"ll": [-3.0, float("nan")], "n_tokens": [2, 3]})
    with pytest.raises(DataError, match="sentence 1 has a non-finite log-likelihood"):
        perplexity_metric(t)
    assert perplexity_metric(pd.DataFrame({"ll": [-2.0, -4.0], "n_tokens": [1, 2]})).value == pytest.approx(math.exp(2))
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "s.yaml").write_text("name: s\nlanguage: en\nformat: text\ndata: ./empty.txt\n")
    with pytest.raises(DataError, match="empty.txt: the held-out text has no sentences"):
        runner.score(str(tiny_models.tiny_model_dir("bert")), str(tmp_path / "s.yaml"), "perplexity")
    assert registry.get("perplexity").model_kinds == ("mlm", "causal")
