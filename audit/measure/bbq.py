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
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from audit.datasets.bbq import N_OPTIONS, select_items
from audit.entries import Measurement, Metric
from audit.errors import DataError, ModelError, ParameterError
from audit.measure.options import (START_TOKEN, KINDS, option_table, options_family, score_options, start_info,
                                   start_token_of, variant)
from audit.suites import MultipleChoice

__all__ = ["PROMPTS", "DEFAULT_PROMPT", "TABLE_COLUMNS", "TRUNCATIONS", "default_prompt", "item_prompts",
           "option_requests", "fit_prompts", "bbq_option_scores", "CHOICES"]

DEFAULT_PROMPT = "{context}\n\nQ: {question}\nA:"
#: lm-evaluation-harness's prompts of the languages with their own BBQ task (``esbbq``, ``cabbq``).
PROMPTS = {"es": "Contexto: {context}\nPregunta: {question}\nRespuesta:",
           "ca": "Context: {context}\nPregunta: {question}\nResposta:"}
DELIMITER = " "

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
    if truncation not in TRUNCATIONS:
        raise ParameterError(f"truncation: must be one of {', '.join(TRUNCATIONS)}, got {truncation!r}")
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


def measure_bbq(model, test: MultipleChoice, metric: Metric, mp: Mapping[str, Any],
                ap: Mapping[str, Any]) -> Measurement:
    """Option scores of the selected items (``categories``, ``limit`` per category)."""
    items = select_items(test.table, mp["categories"], mp["limit"])
    prompt = mp["prompt"] or default_prompt(test.language)
    table = bbq_option_scores(model.handle, items, prompt=prompt, batch_size=mp["batch_size"],
                              truncation=mp["truncation"], start_token=start_token_of(mp))
    return Measurement(family=CHOICES.name, table=table,
                       info={"language": test.language, "kind": model.kind, "prompt": prompt,
                             "truncation": mp["truncation"], "limit": mp["limit"],
                             "n_truncated": int((table["words_cut"] > 0).sum()),
                             "format": test.extra.get("format", ""),
                             "variant": variant(model.kind), **start_info(model.kind, mp)})


def _method(kind: str, params: Mapping[str, Any]) -> str:
    return "option-log-likelihood" if kind == "causal" else "option-pseudo-log-likelihood"


#: Scores of the answer options of multiple-choice items (the scored-options step, three options, the
#: prompt as context): causal log-likelihood or masked PLL.
CHOICES = options_family(
    "multiple_choice", "multiple_choice", measure_bbq,
    {"batch_size": None, "categories": None, "limit": None, "prompt": None, "truncation": "none",
     "start_token": START_TOKEN},
    "score of each answer option given the prompt: log-likelihood (causal LMs) or pseudo-log-likelihood of the "
    "answer's tokens (masked LMs)", method=_method,
)
