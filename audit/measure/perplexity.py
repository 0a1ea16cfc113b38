"""Language-modelling ability on a held-out text: perplexity (causal LMs) and pseudo-perplexity
(masked LMs), reported beside the bias scores so that a debiasing that damages the model shows.

Formulas:

* causal LMs: ``PPL = exp(-sum_s ll(s) / sum_s n(s))`` with ``ll(s)`` the log-likelihood of
  sentence ``s`` given only the start token and ``n(s)`` its scored tokens
  (``LanguageModel.loglikelihood_rolling``: :func:`audit.backends.hf_scoring.causal_loglik`);
* masked LMs: ``PPPL = exp(-sum_s PLL(s) / sum_s n(s))`` (Salazar, Liang, Nguyen & Kirchhoff
  2020, "Masked Language Model Scoring", ACL), ``PLL(s)`` every token of ``s`` masked in turn
  (``LanguageModel.loglikelihood([("", s)])``: :func:`audit.backends.hf_scoring.span_pll`).

Natural logarithms; the token counts are the model's own, so values are comparable between a
model and its debiased variants (same tokenizer), not between tokenizers.

Documented difference from bias-bench (``experiments/perplexity.py``): bias-bench concatenates
WikiText-2 into one stream scored with a sliding window (``stride``); biasaudit scores the text
sentence by sentence (one per line), each from the start token, as the user's corpus is a list of
sentences. The text is a file, one sentence per line (UTF-8; blank lines skipped), read by the
``text`` format: a stub ``{name, language, format: text, data: ./file.txt}``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from audit.datasets.external import register_format
from audit.entries import Family, Measurement, Metric
from audit.errors import DataError, ModelError
from audit.result import MetricOutput
from audit.suites import HeldOutText

__all__ = ["FORMAT", "PERPLEXITY", "read_text", "held_out_text", "sentence_scores", "perplexity_metric"]

FORMAT = "text"
KINDS = ("mlm", "causal")


def held_out_text(sentences: list[str], *, name: str = "text", language: str = "en", source: str = "") -> HeldOutText:
    """A :class:`HeldOutText` from sentences (blank ones refused, naming the line)."""
    rows = []
    for i, s in enumerate(sentences, 1):
        if not isinstance(s, str) or not s.strip():
            raise DataError(f"{source or name}: line {i}: empty sentence")
        rows.append((s.strip(), i))
    if not rows:
        raise DataError(f"{source or name}: no sentences")
    return HeldOutText(name=name, language=language, table=pd.DataFrame(rows, columns=["sentence", "line"]),
                       source=source)


def read_text(path: Path, stub: Any) -> HeldOutText:
    """Reader of the ``text`` format: one sentence per line, UTF-8, blank lines skipped."""
    try:
        lines = Path(path).read_text(encoding=getattr(stub, "encoding", "") or "utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the held-out text: {e}") from None
    rows = [(s.strip(), i) for i, s in enumerate(lines, 1) if s.strip()]
    if not rows:
        raise DataError(f"{path}: the held-out text has no sentences")
    t = HeldOutText(name=stub.name, language=stub.language, table=pd.DataFrame(rows, columns=["sentence", "line"]),
                    provenance=getattr(stub, "provenance", ""), licence=getattr(stub, "licence", ""),
                    source=str(path))
    return t


def sentence_scores(handle: Any, sentences: list[str], *, batch_size: int | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(ll float64, n_tokens int64)`` per sentence: causal log-likelihood or masked PLL."""
    kind = getattr(handle, "kind", None)
    if kind == "causal":
        ll, n = handle.loglikelihood_rolling(sentences, batch_size=batch_size)
    elif kind == "mlm":
        ll, n = handle.loglikelihood([("", s) for s in sentences], batch_size=batch_size)
    else:
        raise ModelError(f"model {getattr(handle, 'ref', handle)!r} is loaded as kind={kind!r}; perplexity needs "
                         "a causal LM (kind='causal') or a masked LM (kind='mlm', pseudo-perplexity)")
    return np.asarray(ll, dtype=np.float64), np.asarray(n, dtype=np.int64)


def _measure(model, test: HeldOutText, metric: Metric, mp: Mapping[str, Any], ap: Mapping[str, Any]) -> Measurement:
    t = test.table
    if mp.get("limit"):
        t = t.head(int(mp["limit"]))
    ll, n = sentence_scores(model.handle, t["sentence"].tolist(), batch_size=mp.get("batch_size"))
    table = t.assign(ll=ll, n_tokens=n).reset_index(drop=True)
    kind = getattr(model.handle, "kind", "")
    return Measurement(family=PERPLEXITY.name, table=table,
                       info={"variant": "pseudo-perplexity" if kind == "mlm" else "perplexity"})


def perplexity_metric(table: pd.DataFrame, *, variant: str = "perplexity") -> MetricOutput:
    """``exp(-sum ll / sum n_tokens)`` over the sentences of ``table`` (module docstring); a
    non-finite log-likelihood or no scored token is refused (:class:`DataError`)."""
    ll = table["ll"].to_numpy(dtype=np.float64)
    n = table["n_tokens"].to_numpy(dtype=np.int64)
    if not np.isfinite(ll).all():
        bad = int(np.flatnonzero(~np.isfinite(ll))[0])
        raise DataError(f"perplexity: sentence {bad} has a non-finite log-likelihood ({ll[bad]})")
    total = int(n.sum())
    if total <= 0:
        raise DataError("perplexity: no scored tokens")
    nll = -float(ll.sum()) / total
    return MetricOutput(value=math.exp(nll), fields={"nll_per_token": nll, "n_tokens": total,
                                                      "n_sentences": int(len(ll)), "variant": variant},
                        items=table)


PERPLEXITY = Family(
    name="perplexity", kinds=KINDS, test_type="text", measure=_measure,
    params={"batch_size": None, "limit": None},
    method=lambda kind, p: "pseudo-perplexity" if kind == "mlm" else "perplexity",
    needs=lambda test: None,
    description="log-likelihood (causal LMs) or pseudo-log-likelihood (masked LMs) of each sentence of a held-out "
                "text",
)


register_format(FORMAT, read_text, "text")
