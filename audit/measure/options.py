"""The scored-options family: one measure step for every benchmark whose item is a context, two or
more options, the gold (or stereotyped) option and per-option metadata (CrowS-Pairs: two options,
empty context; the BBQ family: three options; any :class:`audit.suites.OptionItems` test).

The step scores every option of every item through the model interface
(:class:`audit.backends.base.LanguageModel`) and returns a per-item, per-option score table; the
analyses are array-level functions on that table (:mod:`audit.metrics`).

Conventions (:func:`score_options`)
    *Non-empty context*: option ``o`` of an item with context ``c`` is the continuation
    ``delimiter + o`` of ``c`` (lm-evaluation-harness's ``multiple_choice`` output type, target
    delimiter ``" "``). Causal LMs: ``log P(delimiter + o | c)``, the sum of the log-probabilities
    of the option's tokens (``loglikelihood``); masked LMs: the pseudo-log-likelihood of the
    option's tokens, each masked in turn with the context visible (Salazar et al. 2020 restricted
    to the option; ``loglikelihood`` on a masked LM).

    *Empty context*: the options are whole sentences. Causal LMs: the sentence's log-likelihood
    given only the start token (``loglikelihood_rolling``; lm-evaluation-harness's
    ``crows_pairs``). Masked LMs, two options: Nangia et al. (2020)'s pseudo-log-likelihood, the
    tokens both sentences share masked one at a time, the pair ordered gold option first
    (``pair_pll``, as the CrowS-Pairs reference code orders it by ``stereo_antistereo``). Masked
    LMs with more than two options and an empty context are refused (no published convention).

    *Start token* (causal LMs, parameter ``start_token`` of every causal family):
    ``"always"`` (default) puts the start token (BOS, else EOS) first in every sequence;
    ``"harness"`` follows lm-evaluation-harness (``HFLM``): only where the tokenizer adds one
    itself (Llama, Mistral, Gemma: yes; GPT-2, Qwen2: no) or before an empty context, so
    whole-sentence options (CrowS-Pairs) get it under both rules
    (:func:`audit.backends.hf_scoring.prepends_start`). Masked LMs use their tokenizer's special
    tokens; the parameter changes nothing there.

    Scores are float64 sums (not length-normalised; an analysis may normalise by ``n_tokens`` or
    ``n_chars``); the requests are sent option-major (all first options, then all second options,
    ...), one call per step, so batching is the engine's.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.backends.chat import CHAT_PARAMS, chat_handle, chat_info
from audit.backends.hf_scoring import START_MODES, check_start
from audit.entries import Family, Measurement, Metric
from audit.errors import DataError, ModelError, ParameterError

__all__ = ["KINDS", "START_TOKENS", "START_TOKEN", "start_token_of", "start_info", "score_options",
           "option_table", "variant", "options_family", "measure_option_items", "OPTIONS"]

#: The model kinds the step scores on.
KINDS = ("mlm", "causal")
#: Values of the causal families' ``start_token`` parameter (module docstring), and its default.
START_TOKENS = START_MODES
START_TOKEN = "always"


def start_token_of(mp: Mapping[str, Any]) -> str:
    """The ``start_token`` measure parameter (default :data:`START_TOKEN`), checked:
    :class:`ParameterError` naming it when it is not one of :data:`START_TOKENS`."""
    return check_start(mp.get("start_token", START_TOKEN), "start_token")


def variant(kind: str) -> str:
    """How the options were scored on a model of ``kind`` (recorded with the measurement)."""
    return "causal_ll" if kind == "causal" else "masked_pll"


def _check_model(model: Any, what: str) -> str:
    kind = getattr(model, "kind", None)
    if kind not in KINDS:
        raise ModelError(f"model {getattr(model, 'ref', model)!r} is loaded as kind={kind!r}; {what} needs a "
                         "masked LM (kind='mlm') or a causal LM (kind='causal')")
    return kind


def score_options(model: Any, contexts: Sequence[str], options: Sequence[Sequence[str]], *,
                  gold: Sequence[int] | None = None, delimiter: str = " ", batch_size: int | None = None,
                  what: str = "scored options", start_token: str = START_TOKEN) -> tuple[np.ndarray, np.ndarray]:
    """Score option ``j`` of item ``i`` (``options[i][j]``) given ``contexts[i]``: ``(scores, n_tokens)``,
    float64 and int64 arrays of shape ``(n_items, n_options)`` (module docstring for the conventions).

    Every item has the same number of options (>= 2); the contexts are all empty (whole-sentence
    options) or all non-empty. ``gold`` (per item, the index of the gold or stereotyped option) orders
    the two sentences of a masked-LM pair (default: option 0 first). ``what`` names the benchmark in
    errors. ``start_token``: the causal start-token rule (module docstring)."""
    kind = _check_model(model, what)
    check_start(start_token, "start_token")
    causal_kw = {"start": start_token} if kind == "causal" else {}
    n = len(options)
    if len(contexts) != n:
        raise DataError(f"{what}: {len(contexts)} contexts for {n} items")
    if n == 0:  # no items: (0, 0) arrays
        return np.zeros((0, 0)), np.zeros((0, 0), dtype=np.int64)
    k = len(options[0])
    bad = next((i for i, o in enumerate(options) if len(o) != k), None)
    if k < 2 or bad is not None:
        raise DataError(f"{what}: every item needs the same number (>= 2) of options; item 0 has {k}"
                        + (f", item {bad} has {len(options[bad])}" if bad is not None else ""))
    opts = [[str(o) for o in row] for row in options]
    empty = [not str(c) for c in contexts]
    if any(empty) and not all(empty):
        raise DataError(f"{what}: item {empty.index(not empty[0])}: the contexts must be all empty (whole-"
                        "sentence options) or all non-empty")
    if not empty[0]:
        reqs = [(str(contexts[i]), delimiter + opts[i][j]) for i in range(n) for j in range(k)]
        sc, nt = model.loglikelihood(reqs, batch_size=batch_size, **causal_kw)
        return (np.asarray(sc, dtype=np.float64).reshape(n, k),
                np.asarray(nt).astype(np.int64).reshape(n, k))
    elif kind == "causal":
        sc, nt = model.loglikelihood_rolling([opts[i][j] for j in range(k) for i in range(n)], batch_size=batch_size,
                                             **causal_kw)
    elif k == 2:
        g = np.zeros(n, dtype=np.int64) if gold is None else np.asarray(gold, dtype=np.int64)
        if not np.isin(g, (0, 1)).all():
            raise DataError(f"{what}: the gold option of a two-option item must be 0 or 1")
        first = g == 0
        pairs = [(a, b) if f else (b, a) for (a, b), f in zip(opts, first)]
        pp = model.pair_pll(pairs, batch_size=batch_size)
        s1, s2 = pp[:, 0], pp[:, 1]
        sc = np.concatenate([np.where(first, s1, s2), np.where(first, s2, s1)])
        nt = np.concatenate([pp[:, 2], pp[:, 2]])
    else:
        raise ModelError(f"{what}: a masked LM scores whole-sentence options only in pairs (Nangia et al. 2020); "
                         f"these items have {k} options and no context")
    sc = np.asarray(sc, dtype=np.float64).reshape(k, n).T
    nt = np.asarray(nt).astype(np.int64).reshape(k, n).T
    return sc, nt


def option_table(meta: pd.DataFrame, options: Sequence[Sequence[str]], scores: np.ndarray,
                 n_tokens: np.ndarray) -> pd.DataFrame:
    """The per-item, per-option score table: ``meta``'s columns (the item's metadata), then
    ``score{j}``, ``n_tokens{j}``, ``n_chars{j}`` (the option's length in characters) per option."""
    out = meta.reset_index(drop=True).copy()
    k = scores.shape[1] if scores.ndim == 2 else 0
    for j in range(k):
        out[f"score{j}"] = scores[:, j]
    for j in range(k):
        out[f"n_tokens{j}"] = n_tokens[:, j]
    for j in range(k):
        out[f"n_chars{j}"] = [len(str(o[j])) for o in options]
    return out


# ---------------------------------------------------------------- the generic family of OptionItems tests


def measure_option_items(model, test, metric: Metric, mp: Mapping[str, Any], ap: Mapping[str, Any]) -> Measurement:
    """Scores of the options of an :class:`audit.suites.OptionItems` test (the first ``limit``
    items): its table's metadata columns, ``gold`` and the per-option scores."""
    t = test.table
    if not isinstance(mp["delimiter"], str):
        raise ParameterError(f"delimiter: must be a string, got {mp['delimiter']!r}")
    limit = mp["limit"]
    limit = None if limit is None else schema.integer(limit, "limit", 1)  # items
    k = int(test.n_options)
    cols = [f"option{j}" for j in range(k)]
    missing = [c for c in ("item", "context", *cols, "gold") if c not in t.columns]
    if missing:
        raise DataError(f"{test.source or test.name}: the test's table lacks column(s) {', '.join(missing)}")
    gold = pd.to_numeric(t["gold"], errors="coerce").to_numpy(dtype=float)
    bad = np.flatnonzero(~((gold >= 0) & (gold < k) & (gold == np.round(gold))))
    if bad.size:
        raise DataError(f"{test.source or test.name}: item {t['item'].iloc[bad[0]]}: field gold: must be an option "
                        f"index 0..{k - 1}, got {t['gold'].tolist()[bad[0]]!r}")
    if limit:
        t = t.head(limit)
    options = t[cols].astype(str).values.tolist()
    contexts = t["context"].fillna("").astype(str).tolist()
    handle = chat_handle(model.handle, mp, delimiter=mp["delimiter"])
    sc, nt = score_options(handle, contexts, options, gold=t["gold"].to_numpy(dtype=np.int64),
                           delimiter=mp["delimiter"], batch_size=mp["batch_size"], what=test.name,
                           start_token=start_token_of(mp))
    meta = t[[c for c in t.columns if c not in cols and c != "context"]]
    return Measurement(family=OPTIONS.name, table=option_table(meta, options, sc, nt),
                       info={"n_options": k, "variant": variant(model.kind), "language": test.language,
                             **start_info(model.kind, mp), **chat_info(handle)})


def start_info(kind: str, mp: Mapping[str, Any]) -> dict[str, str]:
    """The start-token rule as measurement info (recorded in provenance): causal LMs only; a chat
    template's rendered turns follow the harness's rule (:mod:`audit.backends.chat`)."""
    if kind != "causal":
        return {}
    return {"start_token": "harness" if mp.get("chat_template") else start_token_of(mp)}


#: Parameters only causal LMs use (the start-token rule), for :attr:`Family.ignored_by`.
CAUSAL_ONLY = {"start_token": ("mlm",)}


def options_family(name: str, test_type: str, measure: Callable[..., Measurement], params: Mapping[str, Any],
                   description: str, method: Callable[[str, Mapping[str, Any]], str] | None = None) -> Family:
    """A family on the scored-options step: masked and causal LMs, the method named after
    :func:`variant` unless ``method`` is given."""

    def _method(kind: str, p: Mapping[str, Any]) -> str:
        return "log-likelihood" if kind == "causal" else "pseudo-log-likelihood"

    return Family(name=name, kinds=KINDS, test_type=test_type, measure=measure, params=params,
                  method=method or _method, needs=lambda test: None, description=description,
                  ignored_by=CAUSAL_ONLY)


#: Scores of the options of any :class:`audit.suites.OptionItems` test.
OPTIONS = options_family(
    "scored_options", "options", measure_option_items,
    {"batch_size": None, "limit": None, "delimiter": " ", "start_token": START_TOKEN, **CHAT_PARAMS},
    "score of each option of each item given its context: log-likelihood (causal LMs) or pseudo-log-likelihood "
    "(masked LMs), audit.measure.options")

