"""HONEST measure step: the completions of each template's ``[M]`` slot (Nozza, Bianchi & Hovy 2021).
The score and its conventions are in :mod:`audit.metrics.honest`.

The completions come from the model interface: ``topk_fills`` on masked LMs (the ``k`` most
probable vocabulary tokens at the mask, ties by lower token id) and ``first_words`` on causal LMs
(the first word of ``k`` greedy or sampled continuations, seeded). Their conventions (mask token,
start token, what a word is, decoding, batching) are written once, in the Hugging Face engine
that implements them: :mod:`audit.backends.hf_generate`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from audit.backends.chat import CHAT_PARAMS, chat_handle, chat_info
from audit.backends.hf_generate import DECODINGS, check_k, first_word
from audit.datasets.honest import SLOT_MASK
from audit.entries import Family, Measurement, Metric
from audit.errors import ModelError, ParameterError
from audit.suites import CompletionTemplates

__all__ = ["DECODINGS", "TABLE_COLUMNS", "first_word", "distinct_templates", "honest_completions", "COMPLETIONS"]
#: Columns of the measurement table (one row per distinct masked template).
TABLE_COLUMNS = ("template", "identity", "groups", "number", "type", "lines", "prompt", "completions", "logprobs")

# --------------------------------------------------------------------------- the measure step


def distinct_templates(table: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct masked template, in first-occurrence order (the official evaluator
    scores each distinct ``template_masked`` once): ``groups`` lists every identity group the
    template is listed under, ``lines`` every line of the file."""
    rows = []
    for tpl, g in table.groupby("template", sort=False):
        rows.append({"template": tpl, "identity": g["identity"].iloc[0],
                     "groups": tuple(dict.fromkeys(g["group"])), "number": g["number"].iloc[0],
                     "type": g["type"].iloc[0], "lines": tuple(int(x) for x in g["line"])})
    return pd.DataFrame(rows, columns=["template", "identity", "groups", "number", "type", "lines"])


def causal_prompt(template: str) -> str:
    """The causal-LM prompt of a template: the text before ``[M]``, trailing white space removed."""
    return template.split(SLOT_MASK, 1)[0].rstrip()


def honest_completions(hf_model: Any, templates: pd.DataFrame, k: int, *, decoding: str = "greedy", seed: int = 0,
                       max_new_tokens: int = 8, batch_size: int | None = None) -> pd.DataFrame:
    """The measurement table (:data:`TABLE_COLUMNS`) of the distinct templates of ``templates``
    (a :class:`CompletionTemplates` table) on a masked or causal LM."""
    kind = getattr(hf_model, "kind", None)
    if kind not in ("mlm", "causal"):
        raise ModelError(f"model {getattr(hf_model, 'ref', hf_model)!r} is loaded as kind={kind!r}; HONEST needs a "
                         "masked LM (kind='mlm') or a causal LM (kind='causal')")
    t = distinct_templates(templates)
    if kind == "mlm":
        prompts = list(t["template"])
        words, lp = hf_model.topk_fills(prompts, k, slot=SLOT_MASK, batch_size=batch_size)
    else:
        prompts = [causal_prompt(x) for x in t["template"]]
        words, lp = hf_model.first_words(prompts, k, decoding=decoding, seed=seed, max_new_tokens=max_new_tokens,
                                         batch_size=batch_size)
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
    many as the largest ``k`` of the analysis asks."""
    k = _needed_k(ap)
    handle = chat_handle(model.handle, mp)
    table = honest_completions(handle, test.table, k, decoding=mp["decoding"], seed=mp["seed"],
                               max_new_tokens=mp["max_new_tokens"], batch_size=mp["batch_size"])
    method = "masked top-k" if model.kind == "mlm" else f"causal first word ({mp['decoding']})"
    return Measurement(family=COMPLETIONS.name, table=table,
                       info={"language": test.language, "kind": model.kind, "method": method, "top_k": k,
                             "decoding": mp["decoding"] if model.kind == "causal" else None,
                             "seed": mp["seed"] if model.kind == "causal" and mp["decoding"] == "sample" else None,
                             "n_template_rows": len(test.table), **chat_info(handle)})


def _method(kind: str, params: Mapping[str, Any]) -> str:
    return "masked-lm-top-k" if kind == "mlm" else f"causal-first-word-{params.get('decoding', 'greedy')}"


#: Completions of sentence templates: masked-LM top-k fillers or causal-LM first words.
COMPLETIONS = Family(
    name="completions",
    kinds=("mlm", "causal"),
    test_type="completion",
    measure=measure_honest,
    params={"batch_size": None, "decoding": "greedy", "seed": 0, "max_new_tokens": 8, **CHAT_PARAMS},
    method=_method,
    needs=lambda test: None,
    description="completions of the [M] slot of each template: the top-k tokens of a masked LM, the first "
                "word of a causal LM's continuation (greedy top-k branches or seeded samples)",
)
