"""Chat templates (audit/backends/chat.py) against lm-evaluation-harness 0.4.13's own rendering
and scoring with ``--apply_chat_template`` on an instruct-style tiny model (audit.tiny_models
``instruct``: ChatML with a default system turn).

The harness's requests are built with its own code: ``Message`` turns, ``multiturn_to_singleturn``
(what ``fewshot_context`` does zero-shot) and ``HFLM.apply_chat_template``; the continuation has no
target delimiter (``construct_requests`` under a chat template); the numbers are
``HFLM.loglikelihood`` / ``HFLM.generate_until``."""

from __future__ import annotations

import numpy as np
import pytest

from lm_eval_compat import harness_lm, loglikelihood  # noqa: E402

from audit import registry, runner, tiny_models  # noqa: E402
from audit.backends.chat import ChatModel, render_user_turns, template_digest  # noqa: E402
from audit.backends.hf import load_hf_model  # noqa: E402
from audit.datasets import load_test  # noqa: E402
from audit.datasets.bbq import select_items  # noqa: E402
from audit.errors import ModelError, ParameterError  # noqa: E402
from audit.measure.bbq import bbq_option_scores, default_prompt, item_prompts  # noqa: E402

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]  # tests/conftest.py

SYSTEM = "Answer with one of the options."


@pytest.fixture(scope="module")
def instruct():
    return load_hf_model(tiny_models.tiny_model_dir("instruct"), kind="causal")


@pytest.fixture(scope="module")
def hflm(instruct):
    return harness_lm(instruct.model, instruct.tokenizer, batch_size=4)


@pytest.fixture(scope="module")
def items():
    return select_items(load_test("en/bbq").table, ["Age"], 3)


def harness_context(lm, text: str, system: str | None) -> str:
    """lm-eval's zero-shot context under --apply_chat_template (Task.fewshot_context)."""
    from lm_eval.api.utils import Message, multiturn_to_singleturn

    msgs = ([Message("system", system)] if system else []) + [Message("user", text, " ")]
    return lm.apply_chat_template(multiturn_to_singleturn(msgs), add_generation_prompt=True)


@pytest.mark.parametrize("system", [None, SYSTEM])
def test_rendering_equals_the_harness_and_the_tokenizer(instruct, hflm, system):
    texts = ["Q: who was late?\nA:", "", "Der Arzt"]
    ours = render_user_turns(instruct.tokenizer, texts, system_instruction=system)
    assert ours == [harness_context(hflm, t, system) for t in texts]
    head = [{"role": "system", "content": system}] if system else []
    direct = [instruct.tokenizer.apply_chat_template(head + [{"role": "user", "content": t}], tokenize=False,
                                                     add_generation_prompt=True) for t in texts]
    assert ours == direct
    default_system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert ours[0].startswith(default_system) == (system is None)
    assert ours[0].endswith("<|im_start|>user\nQ: who was late?\nA:<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("system", [None, SYSTEM])
def test_bbq_option_scores_equal_the_harness(instruct, hflm, items, system):
    prompts = item_prompts(items, default_prompt("en"))
    ours = bbq_option_scores(ChatModel(instruct, system_instruction=system), items, prompt=default_prompt("en"))
    reqs = [(harness_context(hflm, p, system), str(a)) for p, (_, row) in zip(prompts, items.iterrows())
            for a in (row["ans0"], row["ans1"], row["ans2"])]
    ref = np.array([ll for ll, _ in loglikelihood(hflm, reqs)]).reshape(len(items), 3)
    got = ours[["score0", "score1", "score2"]].to_numpy()
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-4)
    plain = bbq_option_scores(instruct, items, prompt=default_prompt("en"))
    assert np.abs(plain[["score0", "score1", "score2"]].to_numpy() - got).max() > 0.1  # the template matters


def test_crows_pairs_sentences_follow_an_empty_user_turn(instruct, hflm):
    sents = ["He is a doctor.", "She is a nurse."]
    ll, n = ChatModel(instruct).loglikelihood_rolling(sents)
    ref = [x for x, _ in loglikelihood(hflm, [(harness_context(hflm, "", None), s) for s in sents])]
    np.testing.assert_allclose(ll, ref, rtol=0, atol=2e-4)
    # the rendered context ends with "assistant\n": the newline moves to the continuation (harness rule)
    assert list(n) == [len(instruct.tokenizer("\n" + s, add_special_tokens=False)["input_ids"]) for s in sents]


def test_generation_continues_the_assistant_turn_as_the_harness(instruct, hflm):
    from lm_eval.api.instance import Instance

    prompts = ["The woman worked as a", "Q: who was late?\nA:"]
    ours = ChatModel(instruct, system_instruction=SYSTEM).generate_until(prompts, until=["\n\n"], max_new_tokens=10)
    inst = [Instance(request_type="generate_until", doc={}, idx=i,
                     arguments=(harness_context(hflm, p, SYSTEM), {"until": ["\n\n"], "max_gen_toks": 10,
                                                                   "do_sample": False}))
            for i, p in enumerate(prompts)]
    assert ours == hflm.generate_until(inst, disable_tqdm=True)


def test_off_by_default_and_recorded_when_on(instruct):
    model = runner.load_model(str(tiny_models.tiny_model_dir("instruct")))
    base = {"categories": ["Age"], "limit": 2, "n_bootstrap": 0}
    off = runner.score(model, "en/bbq", "bbq", base)
    off2 = runner.score(model, "en/bbq", "bbq", {**base, "chat_template": False})
    on = runner.score(model, "en/bbq", "bbq", {**base, "chat_template": True, "system_instruction": SYSTEM})
    assert "chat_template" not in registry.key_params("bbq", base)
    assert off.items["score0"].tolist() == off2.items["score0"].tolist()
    assert "chat_template_digest" not in off.provenance
    assert on.provenance["chat_template"] == "applied"
    assert on.provenance["chat_template_digest"] == template_digest(instruct.tokenizer)
    assert on.provenance["system_instruction"] == SYSTEM
    assert len({off.provenance["key"], off2.provenance["key"], on.provenance["key"]}) == 3
    assert not np.allclose(off.items["score0"], on.items["score0"])


def test_refusals_are_one_line(instruct):
    llama = runner.load_model(str(tiny_models.tiny_model_dir("llama")))
    with pytest.raises(ModelError, match=r"^chat_template: model .* has no chat template in its tokenizer$"):
        runner.score(llama, "en/bbq", "bbq", {"limit": 1, "chat_template": True, "n_bootstrap": 0})
    bert = runner.load_model(str(tiny_models.tiny_model_dir("bert")))
    with pytest.raises(ModelError, match="a chat template needs a causal LM"):
        runner.score(bert, "de/bbq", "bbq", {"limit": 1, "chat_template": True, "n_bootstrap": 0})
    with pytest.raises(ParameterError, match="system_instruction: given without chat_template: true"):
        runner.score(llama, "en/bbq", "bbq", {"limit": 1, "system_instruction": "x", "n_bootstrap": 0})
    with pytest.raises(ParameterError, match="parameter chat_template of metric .bbq.: expected true or false"):
        runner.score(llama, "en/bbq", "bbq", {"limit": 1, "chat_template": "yes", "n_bootstrap": 0})
