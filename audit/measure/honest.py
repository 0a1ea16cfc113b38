"""HONEST measure step: the completions of each template's ``[M]`` slot (Nozza, Bianchi & Hovy 2021).
The score and its conventions are in :mod:`audit.metrics.honest`.

Masked LMs: ``topk_fills`` (the ``k`` most probable vocabulary tokens at the mask, ties by lower
token id), the official HONEST rule for masked LMs (the fill-mask pipeline of the MilaNLProc/honest
notebook). Causal LMs follow a named ``protocol`` (measure parameter):

``first_word_greedy`` (default)
    ``first_words``: the first word of ``k`` continuations (``decoding="greedy"``: the ``k`` most
    probable first tokens, each continued greedily; ``decoding="sample"``: ``k`` seeded samples),
    at most ``max_new_tokens`` (default 8) tokens. One word per completion, scored by exact
    lemma match like a masked LM's fill. The default because it is deterministic (no sampling
    variance: HONEST@k of a model is one number, not one per seed), scores causal and masked LMs
    by the same one-word rule, and keeps every earlier result and ``audit.key`` valid.
``official``
    The sampled protocol of the official HONEST code for GPT-style models (MilaNLProc/honest, its
    GPT notebook: ``pipeline("text-generation")(prompt, max_length=len(prompt tokens) + 10,
    num_return_sequences=k)``, i.e. ``generate``'s sampling defaults of GPT-2: ``do_sample``,
    temperature 1, ``top_k=50``, ``top_p=1``): ``samples`` draws ``k`` continuations of
    ``max_new_tokens`` (default 10) tokens with ``temperature`` / ``top_k`` / ``top_p`` (defaults
    1.0 / 50 / 1.0), seeded by ``seed`` with one independent stream per template
    (:func:`audit.backends.hf_generate.causal_samples`). The completion is the notebook's slice
    ``generated_text[len(template.replace(" [M]", "")):]`` of prompt + continuation (it drops the
    continuation's first character, normally a space: the template's final ``.`` is counted in the
    slice). The metric then counts a completion as hurtful when ANY of its words is a HurtLex
    lemma (the evaluator's sentence mode; :mod:`audit.metrics.honest`). What differs from the
    notebook: the random numbers (our seeded inverse-CDF streams, not torch's global generator
    under ``set_seed(42)``), hence the samples, never the protocol.

Both causal protocols take ``start_token``: ``"always"`` (default) puts the start token first;
``"harness"`` only where the tokenizer adds one itself, which is what the notebook's pipeline
does (GPT-2: no start token). The protocol, its decoding parameters and seed are recorded in the
measurement (provenance) and, when given, in ``audit.key``. The conventions of the operations
(mask token, start token, what a word is, decoding, batching) are written once, in the Hugging
Face engine that implements them: :mod:`audit.backends.hf_generate`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from audit import schema
from audit.backends.chat import CHAT_PARAMS, chat_handle, chat_info
from audit.backends.hf_generate import DECODINGS, check_k, first_word
from audit.backends.hf_scoring import check_start
from audit.datasets.honest import SLOT_MASK
from audit.measure.options import CAUSAL_ONLY, START_TOKEN
from audit.entries import Family, Measurement, Metric
from audit.errors import ModelError, ParameterError
from audit.suites import CompletionTemplates

__all__ = ["DECODINGS", "PROTOCOLS", "PROTOCOL", "TABLE_COLUMNS", "first_word", "distinct_templates",
           "official_completion", "honest_completions", "COMPLETIONS"]
#: The causal-LM protocols (module docstring) and the default.
PROTOCOLS = ("first_word_greedy", "official")
PROTOCOL = "first_word_greedy"
#: The official protocol's decoding defaults (GPT-2's ``generate`` sampling defaults, 10 new tokens).
OFFICIAL_DEFAULTS = {"max_new_tokens": 10, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
#: The first-word protocol's continuation length.
FIRST_WORD_MAX_NEW_TOKENS = 8
#: Columns of the measurement table (one row per distinct masked template).
TABLE_COLUMNS = ("template", "identity", "groups", "number", "type", "lines", "prompt", "completions", "logprobs")

# --------------------------------------------------------------------------- the measure step


def distinct_templates(table: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct masked template, in first-occurrence order (the official evaluator
    scores each distinct ``template_masked`` once): ``identity``, ``number`` and ``type`` of its
    first line, ``groups`` every identity group the template is listed under (first-occurrence
    order), ``lines`` every line of the file; a row without a template is left out (as
    ``DataFrame.groupby`` does). One pass over the columns: the same frame as a ``groupby`` loop
    with a row built per group, 66 → 2 ms for the English templates."""
    by_template: dict[str, dict[str, Any]] = {}
    for tpl, identity, group, number, kind, line in zip(
            *(table[c].tolist() for c in ("template", "identity", "group", "number", "type", "line"))):
        if pd.isna(tpl):
            continue
        row = by_template.get(tpl)
        if row is None:
            row = by_template[tpl] = {"template": tpl, "identity": identity, "groups": {}, "number": number, "type": kind,
                               "lines": []}
        row["groups"].setdefault(group)
        row["lines"].append(int(line))
    return pd.DataFrame([{**r, "groups": tuple(r["groups"]), "lines": tuple(r["lines"])} for r in by_template.values()],
                        columns=["template", "identity", "groups", "number", "type", "lines"])


def causal_prompt(template: str) -> str:
    """The causal-LM prompt of a template: the text before ``[M]``, trailing white space removed."""
    return template.split(SLOT_MASK, 1)[0].rstrip()


def official_completion(template: str, prompt: str, continuation: str) -> str:
    """The official notebook's completion: ``generated_text[len(template.replace(" [M]", "")):]``
    with ``generated_text = prompt + continuation`` (module docstring)."""
    return (prompt + continuation)[len(template.replace(" " + SLOT_MASK, "")):]


def generation_params(protocol: str, mp: Mapping[str, Any]) -> dict[str, Any]:
    """The decoding parameters of a causal protocol from the measure parameters, defaults filled
    and parameters of the other protocol refused (:class:`ParameterError` naming them)."""
    schema.choice(protocol, "protocol", PROTOCOLS)
    start = check_start(mp.get("start_token", START_TOKEN), "start_token")
    if protocol == "official":
        if mp.get("decoding") not in (None, "greedy"):
            raise ParameterError("decoding: applies to protocol first_word_greedy only; protocol official samples "
                                 "(temperature, top_k, top_p)")
        out = {k: (mp.get(k) if mp.get(k) is not None else v) for k, v in OFFICIAL_DEFAULTS.items()}
        return {**out, "seed": mp.get("seed", 0), "start_token": start}
    extra = [k for k in ("temperature", "top_k", "top_p") if mp.get(k) is not None]
    if extra:
        raise ParameterError(f"{extra[0]}: applies to protocol official only (protocol first_word_greedy takes "
                             "decoding, seed, max_new_tokens)")
    decoding = mp.get("decoding") or "greedy"
    schema.choice(decoding, "decoding", DECODINGS)
    mnt = mp.get("max_new_tokens")
    return {"decoding": decoding, "seed": mp.get("seed", 0),
            "max_new_tokens": FIRST_WORD_MAX_NEW_TOKENS if mnt is None else mnt, "start_token": start}


def honest_completions(hf_model: Any, templates: pd.DataFrame, k: int, *, decoding: str = "greedy", seed: int = 0,
                       max_new_tokens: int | None = None, batch_size: int | None = None,
                       protocol: str = PROTOCOL, start_token: str = START_TOKEN, temperature: float | None = None,
                       top_k: int | None = None, top_p: float | None = None) -> pd.DataFrame:
    """The measurement table (:data:`TABLE_COLUMNS`) of the distinct templates of ``templates``
    (a :class:`CompletionTemplates` table) on a masked or causal LM. Causal LMs follow
    ``protocol`` (module docstring); under ``official`` the completions are the sliced sampled
    texts and ``logprobs`` are empty (sampling has no per-completion score here)."""
    kind = getattr(hf_model, "kind", None)
    if kind not in ("mlm", "causal"):
        raise ModelError(f"model {getattr(hf_model, 'ref', hf_model)!r} is loaded as kind={kind!r}; HONEST needs a "
                         "masked LM (kind='mlm') or a causal LM (kind='causal')")
    gp = generation_params(protocol, {"decoding": decoding, "seed": seed, "max_new_tokens": max_new_tokens,
                                      "start_token": start_token, "temperature": temperature, "top_k": top_k,
                                      "top_p": top_p})
    t = distinct_templates(templates)
    if kind == "mlm":
        prompts = list(t["template"])
        words, lp = hf_model.topk_fills(prompts, k, slot=SLOT_MASK, batch_size=batch_size)
    elif protocol == "official":
        prompts = [causal_prompt(x) for x in t["template"]]
        texts = hf_model.samples(prompts, k, seed=gp["seed"], max_new_tokens=gp["max_new_tokens"],
                                 temperature=gp["temperature"], top_k=gp["top_k"], top_p=gp["top_p"],
                                 batch_size=batch_size, start=gp["start_token"])
        words = [[official_completion(tpl, p, c) for c in row] for tpl, p, row in zip(t["template"], prompts, texts)]
        lp = [() for _ in words]
    else:
        prompts = [causal_prompt(x) for x in t["template"]]
        kw = {} if gp["start_token"] == START_TOKEN else {"start": gp["start_token"]}
        words, lp = hf_model.first_words(prompts, k, decoding=gp["decoding"], seed=gp["seed"],
                                         max_new_tokens=gp["max_new_tokens"], batch_size=batch_size, **kw)
    t["prompt"] = prompts
    t["completions"] = [tuple(w) for w in words]
    t["logprobs"] = [tuple(float(x) for x in row) for row in lp]
    return t[list(TABLE_COLUMNS)]


def _needed_k(ap: Mapping[str, Any]) -> int:
    ks = ap.get("k", (1, 5, 20))
    ks = [ks] if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool) else list(ks or [])
    if not ks:
        raise ParameterError("k: give at least one number of completions (e.g. [1, 5, 20])")
    return max(check_k(x) for x in ks)


def measure_honest(model, test: CompletionTemplates, metric: Metric, mp: Mapping[str, Any],
                   ap: Mapping[str, Any]) -> Measurement:
    """The completions of every distinct template of the test (:func:`honest_completions`), as
    many as the largest ``k`` of the analysis asks, with the protocol and its decoding
    parameters as info (recorded in provenance)."""
    k = _needed_k(ap)
    protocol = mp["protocol"]
    gp = generation_params(protocol, mp)
    handle = chat_handle(model.handle, mp)
    table = honest_completions(handle, test.table, k, decoding=mp["decoding"], seed=mp["seed"],
                               max_new_tokens=mp["max_new_tokens"], batch_size=mp["batch_size"], protocol=protocol,
                               start_token=gp["start_token"], temperature=mp["temperature"], top_k=mp["top_k"],
                               top_p=mp["top_p"])
    causal = model.kind == "causal"
    info: dict[str, Any] = {"language": test.language, "kind": model.kind,
                            "method": _info_method(model.kind, protocol, mp),
                            "top_k": k, "n_template_rows": len(test.table), **chat_info(handle)}
    if causal:
        sampled = protocol == "official" or gp["decoding"] == "sample"
        info.update({"decoding": gp.get("decoding", "sample"), "seed": gp["seed"] if sampled else None,
                     "protocol": protocol, "start_token": "harness" if handle is not model.handle else gp["start_token"],
                     "generation": {kk: v for kk, v in gp.items() if kk != "start_token"},
                     "completion_rule": "any_word" if protocol == "official" else "word"})
    else:
        info.update({"decoding": None, "seed": None, "protocol": "masked_top_k", "completion_rule": "word"})
    return Measurement(family=COMPLETIONS.name, table=table, info=info)


def _info_method(kind: str, protocol: str, mp: Mapping[str, Any]) -> str:
    if kind == "mlm":
        return "masked top-k"
    return "causal official (sampled, any word)" if protocol == "official" else f"causal first word ({mp['decoding']})"


def _method(kind: str, params: Mapping[str, Any]) -> str:
    if kind == "mlm":
        return "masked-lm-top-k"
    if params.get("protocol", PROTOCOL) == "official":
        return "causal-official-sampled-any-word"
    return f"causal-first-word-{params.get('decoding') or 'greedy'}"


#: Completions of sentence templates: masked-LM top-k fillers or causal-LM first words.
COMPLETIONS = Family(
    name="completions",
    kinds=("mlm", "causal"),
    test_type="completion",
    measure=measure_honest,
    params={"batch_size": None, "protocol": PROTOCOL, "decoding": "greedy", "seed": 0, "max_new_tokens": None,
            "start_token": START_TOKEN, "temperature": None, "top_k": None, "top_p": None, **CHAT_PARAMS},
    ignored_by=CAUSAL_ONLY,
    method=_method,
    needs=lambda test: None,
    description="completions of the [M] slot of each template: the top-k tokens of a masked LM; a causal LM's "
                "first word of k continuations (protocol first_word_greedy) or k sampled ten-token continuations "
                "(protocol official, the HONEST code's GPT protocol)",
)
