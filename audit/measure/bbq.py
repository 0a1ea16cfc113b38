"""BBQ-family measure step: the score of each answer option of each item, as multiple choice
(Parrish et al. 2022; lm-evaluation-harness's ``bbq`` task). The analysis is in
:mod:`audit.metrics.bbq`.

Prompt and options
    The prompt of an item is ``prompt.format(context=..., question=...)``; the default is
    lm-evaluation-harness's for its language: ``"{context}\\n\\nQ: {question}\\nA:"`` (``bbq``,
    used for every language without its own), ``"Contexto: {context}\\nPregunta:
    {question}\\nRespuesta:"`` (``esbbq``), ``"Context: {context}\\nPregunta:
    {question}\\nResposta:"`` (``cabbq``). Each of the item's three answers is a continuation
    ``" " + answer`` (the harness's target delimiter), the answer text verbatim. Unlike the
    harness's English ``bbq`` task, which offers the two group answers plus ten English phrasings
    of "unknown", each item is scored on its own three answers (its own unknown phrasing), which
    works for every language.

Causal LMs
    ``log P(" " + answer | prompt)``: the sum of the log-probabilities of the answer's tokens,
    each given the prompt and the answer's earlier tokens (the causal-LM primitive
    ``loglikelihood`` of the model interface; Hugging Face:
    :func:`audit.backends.hf_scoring.continuation_loglik`, batched; its conventions: start token,
    tokenisation of the whole text, float64 sums).
Masked LMs
    The pseudo-log-likelihood of the answer given the prompt: the text ``prompt + " " + answer``
    is tokenised once (special tokens added); every token overlapping the answer's characters is
    masked in turn and ``log P(token | everything else)`` summed (Salazar et al. 2020, restricted
    to the answer; the model interface's ``loglikelihood`` on a masked LM, Hugging Face:
    :func:`audit.backends.hf_scoring.span_pll`, batched).

The predicted answer is the arg-max of the scores (the analysis step, optionally length-
normalised); the table keeps each option's raw score, its number of scored tokens and its length
in characters.

Protocols (``protocol``, recorded in the measurement's info and the result's key)
    ``item_options`` (default): the above: the item's three answers, the start token always first
    (``start="always"`` of :func:`audit.backends.hf_scoring.continuation_loglik`), the prompt
    parameter. Works for every language and every BBQ-family dataset.
    ``harness``: lm-evaluation-harness 0.4.13's request construction of its ``bbq`` (English),
    ``esbbq`` (Spanish) and ``cabbq`` (Catalan) tasks (:data:`HARNESS_TASKS`, by the test's
    language; other languages are refused): its ``doc_to_text`` prompt, its choices
    (:func:`harness_choices`: ``bbq`` the item's two group answers in item order plus the ten
    English "unknown" wordings of :data:`HARNESS_UNKNOWN`, the item's own unknown answer removed;
    ``esbbq``/``cabbq`` ``ans0``, ``ans1`` and nine wordings, the dataset's unknown answer being
    ``ans2``), the target delimiter ``" "``, and the harness's start-token rule (``start=
    "harness"``: a start token only where the tokenizer adds one). The prediction is the harness's
    ``argmax`` over all choices (first on ties), any "unknown" wording counting as the unknown
    answer; ``score{u}`` of the unknown option is then the best of the wordings' scores, and the
    table also keeps ``harness_choice`` (the arg-max index into the choices), ``unknown_scores``
    and ``unknown_choice`` (the best wording). The harness's own aggregation of that task is added
    by the analysis (:func:`audit.metrics.bbq.harness_scores`). Masked LMs are refused (the
    harness's tasks are causal).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.backends.chat import CHAT_PARAMS, chat_handle, chat_info
from audit.datasets.bbq import N_OPTIONS, select_items
from audit.entries import Measurement, Metric
from audit.errors import DataError, ModelError, ParameterError
from audit.measure.options import (START_TOKEN, KINDS, option_table, options_family, score_options, start_token_of,
                                   variant)
from audit.suites import MultipleChoice

__all__ = ["PROMPTS", "DEFAULT_PROMPT", "TABLE_COLUMNS", "TRUNCATIONS", "PROTOCOLS", "HARNESS_TASKS", "HARNESS_UNKNOWN",
           "default_prompt", "item_prompts", "option_requests", "fit_prompts", "harness_choices", "bbq_option_scores",
           "harness_option_scores", "CHOICES"]

DEFAULT_PROMPT = "{context}\n\nQ: {question}\nA:"
#: lm-evaluation-harness's prompts of the languages with their own BBQ task (``esbbq``, ``cabbq``).
PROMPTS = {"es": "Contexto: {context}\nPregunta: {question}\nRespuesta:",
           "ca": "Context: {context}\nPregunta: {question}\nResposta:"}
DELIMITER = " "

PROTOCOLS = ("item_options", "harness")
#: lm-evaluation-harness 0.4.13's BBQ task of each language it has one for.
HARNESS_TASKS = {"en": "bbq", "es": "esbbq", "ca": "cabbq"}
#: The "unknown" wordings each harness task adds to its choices (``lm_eval/tasks/bbq/utils.py``
#: ``UNKNOWN_RESPONSES``, HELM's list; ``esbbq``/``cabbq``: their ``_*_common_yaml`` ``doc_to_choice``).
HARNESS_UNKNOWN = {
    "bbq": ("Unknown", "Cannot answer", "Can't be determined", "Cannot be determined", "Can't answer", "Not known",
            "Not enough info", "Not enough information", "Not answerable", "Undetermined"),
    "esbbq": ("No hay suficiente información", "No hay información suficiente", "No lo sé", "No sé",
              "Falta información", "No se puede responder", "No se sabe", "No se puede saber",
              "No se puede determinar"),
    "cabbq": ("No hi ha prou informació", "No hi ha informació suficient", "No ho sé", "No sé", "Falta informació",
              "No es pot respondre", "No se sap", "No es pot saber", "No es pot determinar"),
}

#: Columns of the measurement table (one row per item).
TABLE_COLUMNS = ("item", "category", "subcategory", "question_polarity", "context_condition", "label", "unknown",
                 "target", "biased", *(f"score{i}" for i in range(N_OPTIONS)),
                 *(f"n_tokens{i}" for i in range(N_OPTIONS)), *(f"n_chars{i}" for i in range(N_OPTIONS)), "where")


def default_prompt(language: str) -> str:
    return PROMPTS.get(language, DEFAULT_PROMPT)


def item_prompts(table: pd.DataFrame, prompt: str) -> list[str]:
    """The prompt of each item (``prompt`` with ``{context}`` and ``{question}``)."""
    if not isinstance(prompt, str) or "{context}" not in prompt or "{question}" not in prompt:
        raise ParameterError(f"prompt: must be a string with {{context}} and {{question}}, got {prompt!r}")
    try:
        return [prompt.format(context=c, question=q) for c, q in zip(table["context"], table["question"])]
    except (KeyError, IndexError, ValueError) as e:
        raise ParameterError(f"prompt: {prompt!r} is not a valid template ({e})") from None


def option_requests(prompts: Sequence[str], table: pd.DataFrame) -> list[tuple[str, str]]:
    """``(prompt, " " + answer)`` for every item and option, item by item (option 0, 1, 2)."""
    answers = table[[f"ans{i}" for i in range(N_OPTIONS)]].itertuples(index=False)
    return [(p, DELIMITER + str(a)) for p, row in zip(prompts, answers) for a in row]


TRUNCATIONS = ("none", "left")


def fit_prompts(model: Any, prompts: Sequence[str], options: Sequence[Sequence[str]], *, limit: int | None = None
                ) -> tuple[list[str], np.ndarray]:
    """``truncation="left"``: each prompt with as many leading words cut as needed for its
    longest option to fit the model (``limit``, default ``model.max_length``, tokens as the model interface counts them,
    ``model.count_tokens``: special tokens or the start token included), and the number of words
    cut per prompt. A prompt that does not fit even with its context cut to one word is a
    :class:`DataError`."""
    limit = model.max_length if limit is None else limit

    def n_tokens(prompt: str, opts: Sequence[str]) -> int:
        return max(model.count_tokens([prompt + DELIMITER + str(o) for o in opts]))

    out, cut = [], np.zeros(len(prompts), dtype=np.int64)
    for i, (p, opts) in enumerate(zip(prompts, options)):
        if n_tokens(p, opts) <= limit:
            out.append(p)
            continue
        words = p.split(" ")
        lo, hi = 1, len(words) - 1  # smallest number of leading words to drop
        if n_tokens(" ".join(words[hi:]), opts) > limit:
            raise DataError(f"item {i}: the prompt does not fit the model's {limit} tokens even when cut to its last "
                            "word")
        while lo < hi:
            mid = (lo + hi) // 2
            if n_tokens(" ".join(words[mid:]), opts) <= limit:
                hi = mid
            else:
                lo = mid + 1
        out.append(" ".join(words[lo:]))
        cut[i] = lo
    return out, cut


def bbq_option_scores(hf_model: Any, table: pd.DataFrame, *, prompt: str, batch_size: int | None = None,
                      truncation: str = "none", start_token: str = START_TOKEN) -> pd.DataFrame:
    """The measurement table (:data:`TABLE_COLUMNS`, plus ``words_cut``) of the items of
    ``table`` (a :class:`MultipleChoice` table) on a masked or causal LM.

    ``truncation="none"`` (default): an item longer than the model accepts is a
    :class:`DataError`; ``"left"``: its prompt loses leading words until it fits (lm-evaluation-
    harness keeps the last tokens of an over-long causal input the same way), counted in
    ``words_cut``. ``start_token``: causal LMs' start-token rule (:mod:`audit.measure.options`)."""
    kind = getattr(hf_model, "kind", None)
    if kind not in KINDS:
        raise ModelError(f"model {getattr(hf_model, 'ref', hf_model)!r} is loaded as kind={kind!r}; BBQ needs a "
                         "masked LM (kind='mlm') or a causal LM (kind='causal')")
    schema.choice(truncation, "truncation", TRUNCATIONS)
    prompts = item_prompts(table, prompt)
    options = [list(o) for o in table[[f"ans{i}" for i in range(N_OPTIONS)]].itertuples(index=False)]
    cut = np.zeros(len(prompts), dtype=np.int64)
    if truncation == "left":
        prompts, cut = fit_prompts(hf_model, prompts, options)
    sc, nt = score_options(hf_model, prompts, options, delimiter=DELIMITER, batch_size=batch_size, what="BBQ",
                           start_token=start_token)
    sc, nt = sc.reshape(len(prompts), N_OPTIONS), nt.reshape(len(prompts), N_OPTIONS)
    meta = table[["item", "category", "subcategory", "question_polarity", "context_condition", "label", "unknown",
                  "target", "biased"]]
    out = option_table(meta, options, sc, nt)
    out["where"] = table["where"].to_numpy()
    out["words_cut"] = cut
    return out[[*TABLE_COLUMNS, "words_cut"]]


def harness_choices(table: pd.DataFrame, task: str) -> tuple[list[list[str]], list[list[int]]]:
    """lm-evaluation-harness's choices of each item for ``task`` (``bbq``, ``esbbq``, ``cabbq``;
    module docstring) and, per item, the item's option (0..2) each choice stands for.

    ``bbq`` (its ``utils.doc_to_choice``): ``[ans0, ans1, ans2]`` with the item's unknown answer
    removed, then :data:`HARNESS_UNKNOWN` ``["bbq"]``; the item's unknown answer must be one of
    those wordings (else the harness fails on the item). ``esbbq``/``cabbq``: ``[ans0, ans1]`` and
    the task's nine wordings; the item's unknown answer must be ``ans2``. A :class:`DataError`
    names the item otherwise."""
    if task not in HARNESS_UNKNOWN:
        raise ParameterError(f"protocol harness: no lm-evaluation-harness BBQ task {task!r}")
    unk = HARNESS_UNKNOWN[task]
    choices, owner = [], []
    for row in table[["item", "unknown", *(f"ans{i}" for i in range(N_OPTIONS))]].itertuples(index=False):
        answers, u = [str(row[2 + i]) for i in range(N_OPTIONS)], int(row.unknown)
        if task == "bbq":
            if answers[u] not in unk:
                raise DataError(f"item {row.item}: its unknown answer {answers[u]!r} is none of the harness bbq task's "
                                f"wordings ({', '.join(unk)}); protocol harness cannot score it")
            known = [i for i in range(N_OPTIONS) if i != u]
        else:
            if u != 2:
                raise DataError(f"item {row.item}: the harness {task} task takes ans2 as the unknown answer; "
                                f"this item's is ans{u}")
            known = [0, 1]
        choices.append([answers[i] for i in known] + list(unk))
        owner.append(known + [u] * len(unk))
    return choices, owner


def harness_option_scores(hf_model: Any, table: pd.DataFrame, *, task: str, batch_size: int | None = None,
                          truncation: str = "none") -> pd.DataFrame:
    """The measurement table of protocol ``harness`` (module docstring): :data:`TABLE_COLUMNS`
    plus ``words_cut``, ``harness_choice``, ``unknown_scores``, ``unknown_choice``."""
    if getattr(hf_model, "kind", None) != "causal":
        ref, kind = getattr(hf_model, "ref", hf_model), getattr(hf_model, "kind", None)
        raise ModelError(f"protocol harness: lm-evaluation-harness's {task} task scores causal LMs; model {ref!r} is "
                         f"loaded as kind={kind!r}")
    schema.choice(truncation, "truncation", TRUNCATIONS)
    prompts = item_prompts(table, default_prompt({v: k for k, v in HARNESS_TASKS.items()}[task]))
    choices, owner = harness_choices(table, task)
    cut = np.zeros(len(prompts), dtype=np.int64)
    if truncation == "left":
        prompts, cut = fit_prompts(hf_model, prompts, choices)
    sc, nt = score_options(hf_model, prompts, choices, delimiter=DELIMITER, batch_size=batch_size, what="BBQ",
                           start_token="harness")
    n, k = sc.shape
    best = np.argmax(sc, axis=1)  # the harness: np.argmax over the choices' log-likelihoods
    own = np.asarray(owner, dtype=np.int64)
    scores = np.full((n, N_OPTIONS), -np.inf)
    ntok = np.zeros((n, N_OPTIONS), dtype=np.int64)
    n_unk = len(HARNESS_UNKNOWN[task])
    first_unk = k - n_unk
    for j in range(first_unk):  # the two group answers
        scores[np.arange(n), own[:, j]] = sc[:, j]
        ntok[np.arange(n), own[:, j]] = nt[:, j]
    ub = first_unk + np.argmax(sc[:, first_unk:], axis=1)
    u = own[:, first_unk]
    scores[np.arange(n), u] = sc[np.arange(n), ub]
    ntok[np.arange(n), u] = nt[np.arange(n), ub]
    meta = table[["item", "category", "subcategory", "question_polarity", "context_condition", "label", "unknown",
                  "target", "biased"]]
    opts3 = []
    for i, c in enumerate(choices):
        o = [""] * N_OPTIONS
        for j in range(first_unk):
            o[own[i, j]] = c[j]
        o[u[i]] = c[ub[i]]
        opts3.append(o)
    out = option_table(meta, opts3, scores, ntok)
    out["where"] = table["where"].to_numpy()
    out["words_cut"] = cut
    out = out[[*TABLE_COLUMNS, "words_cut"]].copy()
    out["harness_choice"] = best.astype(np.int64)
    out["harness_prediction"] = own[np.arange(n), best]
    out["unknown_scores"] = [list(map(float, r)) for r in sc[:, first_unk:]]
    out["unknown_choice"] = [c[b] for c, b in zip(choices, ub)]
    if "question_type" in table.columns:
        out["question_type"] = table["question_type"].to_numpy()
    return out


def measure_bbq(model, test: MultipleChoice, metric: Metric, mp: Mapping[str, Any],
                ap: Mapping[str, Any]) -> Measurement:
    """Option scores of the selected items (``categories``, ``limit`` per category), by
    ``protocol`` (module docstring)."""
    protocol = mp.get("protocol", "item_options")
    schema.choice(protocol, "protocol", PROTOCOLS)
    items = select_items(test.table, mp["categories"], mp["limit"])
    task = None
    handle = chat_handle(model.handle, mp)
    if protocol == "harness":
        task = HARNESS_TASKS.get(test.language)
        if task is None:
            raise ParameterError(f"protocol: harness: lm-evaluation-harness has BBQ tasks for "
                                 f"{', '.join(f'{k} ({v})' for k, v in HARNESS_TASKS.items())} only; this test's "
                                 f"language is {test.language!r}")
        if mp["prompt"] is not None:
            raise ParameterError("prompt: protocol harness uses the harness task's own prompt; leave prompt unset")
        prompt = default_prompt(test.language)
        table = harness_option_scores(handle, items, task=task, batch_size=mp["batch_size"],
                                      truncation=mp["truncation"])
    else:
        prompt = mp["prompt"] or default_prompt(test.language)
        table = bbq_option_scores(handle, items, prompt=prompt, batch_size=mp["batch_size"],
                                  truncation=mp["truncation"], start_token=start_token_of(mp))
        if "question_type" in items.columns:
            table["question_type"] = items["question_type"].to_numpy()
    return Measurement(family=CHOICES.name, table=table,
                       info={"language": test.language, "kind": model.kind, "prompt": prompt,
                             "truncation": mp["truncation"], "limit": mp["limit"],
                             "n_truncated": int((table["words_cut"] > 0).sum()),
                             "format": test.extra.get("format", ""),
                             "variant": variant(model.kind), "protocol": protocol, "harness_task": task,
                             "start_token": ("harness" if protocol == "harness" or handle is not model.handle else
                                             start_token_of(mp) if model.kind == "causal" else "n/a"),
                             **chat_info(handle)})


def _method(kind: str, params: Mapping[str, Any]) -> str:
    return "option-log-likelihood" if kind == "causal" else "option-pseudo-log-likelihood"


#: Scores of the answer options of multiple-choice items (the scored-options step, three options, the
#: prompt as context): causal log-likelihood or masked PLL.
CHOICES = options_family(
    "multiple_choice", "multiple_choice", measure_bbq,
    {"batch_size": None, "categories": None, "limit": None, "prompt": None, "truncation": "none",
     "protocol": "item_options", "start_token": START_TOKEN, **CHAT_PARAMS},
    "score of each answer option given the prompt: log-likelihood (causal LMs) or pseudo-log-likelihood of the "
    "answer's tokens (masked LMs)", method=_method,
)
