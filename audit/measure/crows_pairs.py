"""CrowS-Pairs measure step: sentence scores of every pair with a masked LM (pseudo-log-likelihood)
or a causal LM (log-likelihood). Conventions: :mod:`audit.metrics.crows_pairs`."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from audit.datasets.crows_pairs import REQUIRED_COLUMNS, select_pairs
from audit.entries import Measurement, Metric
from audit.errors import DataError, ModelError
from audit.backends.chat import CHAT_PARAMS, chat_handle, chat_info
from audit.measure.options import (START_TOKEN, KINDS, options_family, score_options, start_info, start_token_of,
                                   variant)
from audit.suites import SentencePairs

__all__ = ["TABLE_COLUMNS", "crows_pairs_scores"]

#: Columns of the table returned by :func:`crows_pairs_scores` (the analysis input).
TABLE_COLUMNS = ("pair_id", "bias_type", "stereo_antistereo", "sent_more", "sent_less",
                 "sent_more_score", "sent_less_score", "n_tokens_more", "n_tokens_less", "variant")


def crows_pairs_scores(hf_model: Any, df: pd.DataFrame, *, batch_size: int | None = None,
                       start_token: str = START_TOKEN) -> pd.DataFrame:
    """Score every pair with a masked LM (``masked_pll``) or a causal LM (``causal_ll``): the
    scored-options step (:func:`audit.measure.options.score_options`) on items of two options
    (``sent_more``, ``sent_less``), an empty context and the stereotyped sentence as gold.

    Parameters
    ----------
    hf_model : a model of the interface (:class:`audit.backends.base.LanguageModel`), ``kind``
        ``"mlm"`` or ``"causal"``.
    df : pairs as returned by :func:`load_crows_pairs`.
    batch_size : sequences per forward pass (default: 128 on CPU, 512 on CUDA, halved on CUDA OOM).
    start_token : causal LMs' start-token rule (:mod:`audit.measure.options`); ``"always"`` and
        ``"harness"`` give the same numbers here (an empty context gets the start token under both).

    Returns
    -------
    DataFrame with :data:`TABLE_COLUMNS`: raw (unrounded) float64 sentence scores
    ``sent_more_score``/``sent_less_score``, the number of scored tokens per sentence, and
    ``variant``.
    """
    kind = getattr(hf_model, "kind", None)
    if kind not in KINDS:
        raise ModelError(f"model {getattr(hf_model, 'ref', hf_model)!r} is loaded as kind={kind!r}; "
                         "CrowS-Pairs needs a masked LM (kind='mlm') or a causal LM (kind='causal')")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise DataError(f"CrowS-Pairs table lacks column(s) {', '.join(missing)}")
    df = df.reset_index(drop=True)
    if "pair_id" not in df.columns:
        df = df.assign(pair_id=np.arange(len(df)))
    more = df["sent_more"].astype(str).tolist()
    less = df["sent_less"].astype(str).tolist()
    # two options, empty context; the stereotyped sentence (sent_more of a "stereo" pair, else sent_less) is gold
    gold = np.where((df["stereo_antistereo"] == "stereo").to_numpy(), 0, 1)
    sc, nt = score_options(hf_model, [""] * len(more), list(zip(more, less)), gold=gold, batch_size=batch_size,
                           what="CrowS-Pairs", start_token=start_token)
    sc, nt = sc.reshape(len(more), 2), nt.reshape(len(more), 2)
    more_sc, less_sc = sc[:, 0], sc[:, 1]
    n_more, n_less = nt[:, 0], nt[:, 1]
    return pd.DataFrame({
        "pair_id": df["pair_id"].to_numpy(),
        "bias_type": df["bias_type"].astype(str).to_numpy(),
        "stereo_antistereo": df["stereo_antistereo"].astype(str).to_numpy(),
        "sent_more": more,
        "sent_less": less,
        "sent_more_score": np.asarray(more_sc, dtype=np.float64),
        "sent_less_score": np.asarray(less_sc, dtype=np.float64),
        "n_tokens_more": np.asarray(n_more, dtype=np.int64),
        "n_tokens_less": np.asarray(n_less, dtype=np.int64),
        "variant": variant(kind),
    })


def measure_pairs(model, test: SentencePairs, metric: Metric, mp: Mapping[str, Any],
                  ap: Mapping[str, Any]) -> Measurement:
    """Sentence scores of the selected pairs (:func:`crows_pairs_scores`)."""
    df = select_pairs(test.table, mp["bias_types"] or None, mp["limit"] or None)
    handle = chat_handle(model.handle, mp)
    table = crows_pairs_scores(handle, df, batch_size=mp["batch_size"], start_token=start_token_of(mp))
    return Measurement(family=PAIR_SCORES.name, table=table, info={**start_info(model.kind, mp), **chat_info(handle)})


#: Per-sentence scores of sentence pairs (the scored-options step, two options and no context): masked-LM
#: pseudo-log-likelihood or causal log-likelihood.
PAIR_SCORES = options_family(
    "sentence_pairs", "pairs", measure_pairs,
    {"batch_size": None, "limit": None, "bias_types": None, "start_token": START_TOKEN, **CHAT_PARAMS},
    "score of each sentence of a pair: pseudo-log-likelihood (masked LMs, Salazar et al. 2020 as in Nangia et al. "
    "2020) or log-likelihood (causal LMs)",
)
