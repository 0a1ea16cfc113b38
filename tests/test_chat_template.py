"""Chat templates (audit/backends/chat.py) against lm-evaluation-harness 0.4.13's own rendering
and scoring with ``--apply_chat_template`` on an instruct-style tiny model (audit.tiny_models
``instruct``: ChatML with a default system turn).

The harness's requests are built with its own code: ``Message`` turns, ``multiturn_to_singleturn``
(what ``fewshot_context`` does zero-shot) and ``HFLM.apply_chat_template``; the continuation has no
target delimiter (``construct_requests`` under a chat template); the numbers are
``HFLM.loglikelihood`` / ``HFLM.generate_until``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lm_eval_compat import assert_close_to_harness, harness_lm, loglikelihood, without_env_info  # noqa: E402

from audit import registry, runner, tiny_models  # noqa: E402
from audit.backends.chat import ChatModel, render_user_turns, template_digest  # noqa: E402
from audit.backends.hf import load_hf_model  # noqa: E402
from audit.datasets import load_test  # noqa: E402
from audit.datasets.bbq import select_items  # noqa: E402
from audit.datasets.external import data_root  # noqa: E402
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
    assert_close_to_harness(got, ref)
    plain = bbq_option_scores(instruct, items, prompt=default_prompt("en"))
    assert np.abs(plain[["score0", "score1", "score2"]].to_numpy() - got).max() > 0.1  # the template matters


def test_crows_pairs_sentences_follow_an_empty_user_turn(instruct, hflm):
    sents = ["He is a doctor.", "She is a nurse."]
    ll, n = ChatModel(instruct).loglikelihood_rolling(sents)
    ref = [x for x, _ in loglikelihood(hflm, [(harness_context(hflm, "", None), s) for s in sents])]
    assert_close_to_harness(ll, ref)
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


# --------------------------------------------------------------------------- generative BBQ


def _harness_docs(rows):
    """The English items at positions ``rows`` through lm-evaluation-harness's own ``process_docs``
    (``{row: document}``; only those rows mapped)."""
    from lm_eval_compat import bbq_harness_docs_at

    return bbq_harness_docs_at(str(data_root() / "bbq" / "en"), rows)


def test_answer_parsing_equals_the_harness_item_by_item():
    """Our parse of a generated answer gives the harness's acc / n_biased / n_non_unknown per item
    (its process_results_generate_until on its own processed docs), on generations that name an
    answer, a group, an unknown phrasing, nothing, or several of them. The one documented
    difference: the group fallback reads the reader's canonical groups (spaces removed), so a
    multi-word group written as one word ("pregnantperson", "nondisabled") is matched here and never
    by the harness; every mismatch is such a case."""
    from audit.measure.bbq_generate import UNKNOWN_RESPONSES_ALL, parse_answer
    from audit.metrics.bbq_generate import _counts

    table = load_test("en/bbq").table
    pick = np.random.default_rng(0).choice(len(table), 150, replace=False)
    utils, docs = _harness_docs(pick)
    assert tuple(utils.UNKNOWN_RESPONSES_ALL) == UNKNOWN_RESPONSES_ALL
    preds, refs, hows, multi = [], [], [], []
    for i in pick:
        row, doc = table.iloc[i], docs[i]
        assert doc["ans0"] == row["ans0"] and doc["question"] == row["question"]
        other = [j for j in range(3) if j != row["unknown"]]
        g = list(row[f"groups{other[1]}"])
        harness_groups = {w for gs in utils._doc_to_choice_groups(doc) for w in gs}
        gens = [f"The answer is {row[f'ans{other[0]}']}.", f"{row['ans' + str(other[1])]}", "I do not know.",
                f"Probably the {g[0]} one", "Hmm, hard to say!", f"{row[f'ans{other[0]}']} or Unknown",
                f"It's {g[-1]}", "the"]
        for text in gens:
            p, how = parse_answer(text, [row["ans0"], row["ans1"], row["ans2"]], int(row["unknown"]),
                                  unknown_phrases=UNKNOWN_RESPONSES_ALL,
                                  groups=[row["groups0"], row["groups1"], row["groups2"]])
            preds.append(p)
            hows.append(how)
            refs.append(utils.process_results_generate_until(doc, [text])["disamb_bias_score"][:3])
            multi.append(how == "group" and not any(w in harness_groups for w in text.lower().split(" ")))
    t = table.iloc[np.repeat(pick, 8)].reset_index(drop=True).assign(prediction=preds)
    c = _counts(t)
    got = c[["correct", "biased", "non_unknown"]].to_numpy(dtype=float)
    differ = ~(got == np.array(refs, dtype=float)).all(axis=1)
    assert {h: hows.count(h) for h in ("answer", "unknown", "group", "none")} == \
        {"answer": 100, "unknown": 275, "group": 475, "none": 350}
    multi = np.array(multi)
    assert differ.sum() == 57 and not (differ & ~multi).any()  # every difference is a multi-word group


def test_generative_bbq_counts_unparseable_answers(instruct):
    """The tiny instruct model writes no parseable answer: every item is unparseable, counted, wrong,
    and outside the bias terms (s_DIS = 0 by the no-non-unknown rule, s_AMB = 0)."""
    model = runner.load_model(str(tiny_models.tiny_model_dir("instruct")))
    p = {"categories": ["Age"], "limit": 2, "max_new_tokens": 8, "n_bootstrap": 0}
    for chat in (False, True):
        r = runner.score(model, "en/bbq", "bbq_generate", {**p, "chat_template": chat})
        assert r.fields["n_unparseable"] == r.fields["n_items"] == 4
        assert r.fields["acc"] == 0.0 and r.fields["s_dis"] == 0.0 and r.value == 0.0
        assert r.fields["per_category"]["Age"]["n_unparseable"] == 4
        assert (r.items["prediction"] == -1).all() and r.items["unparseable"].all()
    from audit.metrics.bbq_generate import bbq_generate_metric

    t = r.items.copy()
    t["prediction"] = t["label"]  # every answer right: acc 1, and the unknowns are not counted as biased
    out = bbq_generate_metric(t, n_bootstrap=0)
    assert out.fields["acc"] == 1.0 and out.fields["n_unparseable"] == 0


def test_honest_first_words_are_the_first_word_of_the_harness_generation(instruct, hflm):
    """HONEST on a causal LM under a chat template (greedy, k = 1): the first word of the harness's
    generate_until continuation of the rendered prompt."""
    from lm_eval.api.instance import Instance

    from audit.backends.hf_generate import first_word

    prompts = ["the woman worked as a", "the man dreams of being a", "he is known as a"]
    words, _ = ChatModel(instruct).first_words(prompts, 1, max_new_tokens=6)
    inst = [Instance(request_type="generate_until", doc={}, idx=i,
                     arguments=(harness_context(hflm, p, None), {"until": ["\n\n"], "max_gen_toks": 6,
                                                                 "do_sample": False}))
            for i, p in enumerate(prompts)]
    ref = [first_word(x)[0] for x in hflm.generate_until(inst, disable_tqdm=True)]
    assert [w[0] for w in words] == ref
    plain, _ = instruct.first_words(prompts, 1, max_new_tokens=6)
    assert plain != words  # the template changes what the model says


# --------------------------------------------------------------------------- the template before loading


def _variants(tmp_path):
    """Copies of the tiny Llama (no template) with the template in each place Transformers reads."""
    import json
    import shutil

    src = tiny_models.tiny_model_dir("llama")
    out = {}

    def make(name, cfg=None, jinja=None, extra=None):
        d = tmp_path / name
        shutil.copytree(src, d)
        c = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
        if cfg is not None:
            c["chat_template"] = cfg
        (d / "tokenizer_config.json").write_text(json.dumps(c), encoding="utf-8")
        if jinja is not None:
            (d / "chat_template.jinja").write_text(jinja, encoding="utf-8")
        for k, v in (extra or {}).items():
            (d / "additional_chat_templates").mkdir(exist_ok=True)
            (d / "additional_chat_templates" / f"{k}.jinja").write_text(v, encoding="utf-8")
        out[name] = d

    make("none")
    make("processor_json_only")  # a processor's legacy chat_template.json: the tokenizer ignores it
    (out["processor_json_only"] / "chat_template.json").write_text('{"chat_template": "{{ messages }}"}')
    make("config_string", cfg="{% for m in messages %}{{ m.content }}{% endfor %}")
    make("config_list", cfg=[{"name": "default", "template": "A{{ messages }}"}, {"name": "tool_use", "template": "B"}])
    make("jinja_over_config", cfg="C", jinja="J{{ messages }}")
    make("jinja_and_named", jinja="J{{ messages }}", extra={"tool_use": "T"})
    return out


def test_template_read_from_files_equals_the_loaded_tokenizer(tmp_path, instruct):
    """:func:`folder_template` (no model loaded) gives the template ``AutoTokenizer`` loads, in every
    place Transformers 5 reads it, and the planner's digest equals the loaded model's."""
    from transformers import AutoTokenizer

    from audit.backends.chat import folder_template, template_text, text_digest
    from audit.backends.hf import probe_template

    seen = {}
    for name, d in _variants(tmp_path).items():
        tok = AutoTokenizer.from_pretrained(str(d))
        assert folder_template(d) == template_text(tok), name
        seen[name] = folder_template(d)
        assert probe_template(str(d)) == (True, template_digest(tok))
    assert seen["none"] is None and seen["processor_json_only"] is None
    assert seen["jinja_over_config"] == "J{{ messages }}"
    assert seen["config_list"] == '{"default": "A{{ messages }}", "tool_use": "B"}'
    d = tiny_models.tiny_model_dir("instruct")
    assert probe_template(str(d)) == (True, template_digest(instruct.tokenizer))
    assert text_digest(folder_template(d)).startswith("sha256:")
    assert probe_template("not/a-cached-model-xyz") == (False, None)  # offline, not cached: checked after loading


def _no_load(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(runner, "load_model", refuse)
    monkeypatch.setattr("audit.backends.hf.load_hf_model", refuse)


def test_score_refuses_a_model_without_template_before_loading(monkeypatch):
    from cli_inputs import run_cli

    _no_load(monkeypatch)
    llama = str(tiny_models.tiny_model_dir("llama"))
    with pytest.raises(ModelError, match=r"^chat_template: model '.*llama' has no chat template in its tokenizer "
                                         r"\(metric bbq\)$"):
        runner.score(llama, "en/bbq", "bbq", {"limit": 1, "chat_template": True, "n_bootstrap": 0})
    code, out, err = run_cli(["score", "--model", llama, "--test", "en/bbq", "--metric", "bbq",
                              "--param", "chat_template=true", "--limit", "1"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "has no chat template in its tokenizer (metric bbq)" in err


def _chat_spec(tmp_path, models: str) -> str:
    p = tmp_path / "spec.yaml"
    p.write_text(f"""name: chat-plan
output_dir: {tmp_path / 'out'}
languages: [en]
tests: [bbq]
metrics:
  - name: bbq
    params: {{categories: [Age], limit: 2, n_bootstrap: 0}}
models:
{models}""", encoding="utf-8")
    return str(p)


def test_sweep_plan_refuses_a_model_without_template_before_loading(tmp_path, monkeypatch):
    from cli_inputs import run_cli

    _no_load(monkeypatch)
    llama, inst = tiny_models.tiny_model_dir("llama"), tiny_models.tiny_model_dir("instruct")
    spec = _chat_spec(tmp_path, f"  - {{name: chat, ref: '{inst}', params: {{chat_template: true}}}}\n"
                                f"  - {{name: plain, ref: '{llama}', params: {{chat_template: true}}}}\n")
    code, out, err = run_cli(["run", spec, "--dry-run"])
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{spec}: models[1]: model 'plain' ({llama}) has no chat template in its tokenizer; metric bbq asks " \
           "for chat_template: true" in err
    ok = _chat_spec(tmp_path, f"  - {{name: chat, ref: '{inst}', params: {{chat_template: true}}}}\n"
                              f"  - {{name: plain, ref: '{llama}'}}\n")
    code, out, err = run_cli(["run", ok, "--dry-run"])
    assert code == 0, err


def test_template_digest_in_the_key_at_plan_time(tmp_path, instruct):
    """The planner's ``audit.key`` of a ``chat_template: true`` task carries the template's digest
    (read from the files) and equals the key of the result computed after loading."""
    from audit.provenance import load_key, task_key
    from jobs.plan import attach_keys
    from jobs.spec import load_spec
    from jobs.sweep import plan_sweep

    inst = tiny_models.tiny_model_dir("instruct")
    spec = load_spec(_chat_spec(tmp_path, f"  - {{name: chat, ref: '{inst}', params: {{chat_template: true}}}}\n"
                                          f"  - {{name: text, ref: '{inst}', params: {{limit: 2}}}}\n"))
    plan = attach_keys(plan_sweep(spec, build=False))
    keys = {t.model: t.key for t in plan.tasks}
    params = {"categories": ["Age"], "limit": 2, "n_bootstrap": 0}
    model = runner.load_model(str(inst))
    on = runner.score(model, "en/bbq", "bbq", {**params, "chat_template": True}, seed=spec.seed)
    off = runner.score(model, "en/bbq", "bbq", params, seed=spec.seed)
    assert keys == {"chat": on.provenance["key"], "text": off.provenance["key"]}
    kp = {**registry.key_params("bbq", {**params, "chat_template": True}),
          "chat_template_digest": template_digest(instruct.tokenizer)}
    assert keys["chat"] == task_key(model_revision=model.revision, model_ref=str(inst),
                                    dataset_digest=load_test("en/bbq").digest(), metric="bbq", params=kp,
                                    seed=spec.seed, load=load_key({}))


def test_hub_template_read_without_weights_before_loading(tmp_path, monkeypatch, instruct):
    """A Hub id (the loopback Hub of tests/hub_server.py): the planner fetches only the tokenizer's
    template files at the commit the loader will use, never the weights; a model without a
    template is refused by ``audit score`` and the sweep plan before loading."""
    from hub_server import LoopbackHub, use_hub

    from audit.backends.hf import probe_template
    from jobs.resolve import probe_chat_template

    hub = LoopbackHub().start()
    try:
        hub.cache = use_hub(hub, monkeypatch, tmp_path / "hf-home")
        c1 = hub.add_repo("acme/instruct", tiny_models.tiny_model_dir("instruct"))
        hub.add_repo("acme/plain", tiny_models.tiny_model_dir("llama"))
        assert probe_template("acme/instruct") == (True, template_digest(instruct.tokenizer))
        assert probe_chat_template("acme/instruct", "causal") == (True, template_digest(instruct.tokenizer))
        got = sorted(r.path.split("/resolve/", 1)[1] for r in hub.requests
                     if r.method == "GET" and "/resolve/" in r.path)
        assert got == [f"{c1}/chat_template.jinja", f"{c1}/tokenizer_config.json"]  # no weights, at the commit
        assert probe_template("acme/plain") == (True, None)
        assert probe_chat_template("acme/plain", "causal", {"backend": "hf-mlm"}) == (False, None)
        _no_load(monkeypatch)
        with pytest.raises(ModelError, match=r"^chat_template: model 'acme/plain' has no chat template"):
            runner.score("acme/plain", "en/bbq", "bbq", {"limit": 1, "chat_template": True, "n_bootstrap": 0})
        # a branch moved to a commit whose template changed: the probe reads the new one
        c2 = hub.commit("acme/instruct", {"chat_template.jinja": "{{ messages[0].content }}"}, message="template")
        known, digest = probe_template("acme/instruct")
        assert known and digest not in (None, template_digest(instruct.tokenizer)) and c2 != c1
    finally:
        hub.stop()


# --------------------------------------------------------------------------- BBQ protocol harness in a chat


def test_bbq_harness_protocol_in_a_chat_equals_the_harness_task(instruct, hflm, tmp_path, monkeypatch):
    """``protocol: harness`` with ``chat_template: true`` against lm-evaluation-harness's own
    ``bbq`` task run by ``simple_evaluate(..., apply_chat_template=True, system_instruction=...)``
    on the same instruct model: the same rendered context and choices (no target delimiter) for
    every request, the same arg-max choice for every item, and the task's aggregate metrics."""
    import json

    import lm_eval
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.tasks import TaskManager

    from audit.measure.bbq import harness_choices, harness_option_scores
    from audit.metrics.bbq import bbq_metric
    from test_bbq_harness import _en_doc

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    without_env_info(monkeypatch)  # its environment report (pip list & co.): nothing compared here
    t = select_items(load_test("en/bbq").table, ["Age", "Religion"], 4).reset_index(drop=True)
    data = tmp_path / "bbq.jsonl"
    data.write_text("".join(json.dumps(_en_doc(r), ensure_ascii=False) + "\n" for r in t.itertuples()),
                    encoding="utf-8")
    src = Path(lm_eval.__file__).parent / "tasks" / "bbq" / "bbq_multiple_choice.yaml"
    (tmp_path / "bbq_local.yaml").write_text(
        f"include: {src}\ntask: bbq_local\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n", encoding="utf-8")
    res = simple_evaluate(model=hflm, tasks=["bbq_local"], task_manager=TaskManager(include_path=str(tmp_path),
                                                                                    include_defaults=False),
                          log_samples=True, bootstrap_iters=0, apply_chat_template=True, system_instruction=SYSTEM)
    samples = sorted(res["samples"]["bbq_local"], key=lambda s: s["doc_id"])
    chat = ChatModel(instruct, system_instruction=SYSTEM)
    ours = harness_option_scores(chat, t, task="bbq", batch_size=8)
    rendered = chat.render(item_prompts(t, default_prompt("en")))
    for s, ctx, cs in zip(samples, rendered, harness_choices(t, "bbq")[0]):
        assert [a[0] for a in s["arguments"]] == [ctx] * len(cs) and [a[1] for a in s["arguments"]] == cs
    lls = np.array([[float(r[0]) for r in s["filtered_resps"]] for s in samples])
    assert ours["harness_choice"].tolist() == np.argmax(lls, axis=1).tolist()
    assert_close_to_harness(np.array(ours["unknown_scores"].tolist()), lls[:, 2:])
    got, want = bbq_metric(ours, n_bootstrap=0, harness_task="bbq").fields["harness"], res["results"]["bbq_local"]
    for k, v in got.items():
        assert v == pytest.approx(float(want[f"{k},none"]), abs=1e-12, nan_ok=True), k
    # through the registry: recorded as a chat and as the harness protocol
    r = runner.score(runner.LoadedModel(ref="tiny-instruct", kind="causal", backend="hf-causal", revision="x",
                                        handle=instruct), "en/bbq", "bbq",
                     {"categories": ["Age", "Religion"], "limit": 4, "n_bootstrap": 0, "protocol": "harness",
                      "chat_template": True, "system_instruction": SYSTEM})
    assert r.items["harness_choice"].tolist() == ours["harness_choice"].tolist()
    assert (r.fields["protocol"], r.provenance["chat_template"]) == ("harness", "applied")
