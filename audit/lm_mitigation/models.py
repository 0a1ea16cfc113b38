"""A model whose representations are debiased by a fitted projection (INLP, SentenceDebias).

bias-bench applies the projection with a forward hook on the base model's ``last_hidden_state``
(every token's vector). Every pooling of the Hugging Face engine (``cls``, ``mean``,
``weighted_mean``, ``last``, ``target_first``, ``target_pooled``: :mod:`audit.backends.hf_embed`)
is a weighted average of the last layer's token vectors, and both projections are linear, so
projecting the pooled vector equals pooling the projected token vectors: :class:`ProjectedModel`
projects the output of ``embed`` (layer ``-1`` only; another layer or the sentence-transformers
``model`` pooling is refused, naming why). Scoring operations are refused: a projection does not
apply to the families that read the output distribution (:data:`audit.lm_mitigation.TECHNIQUES`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from audit.backends.hf_embed import METHODS, default_method
from audit.errors import ModelError
from audit.runner import LoadedModel

__all__ = ["ProjectedModel", "debiased"]

_SCORING = ("loglikelihood", "loglikelihood_rolling", "pair_pll", "masked_scores", "topk_fills", "first_words")


class ProjectedModel:
    """``handle`` with ``embed`` followed by ``step.transform`` (a fitted INLP or SentenceDebias)."""

    def __init__(self, handle: Any, step: Any):
        self._handle, self._step = handle, step
        fitted = getattr(step, "projection_", None)
        if fitted is None:
            fitted = getattr(step, "directions_", None)
        if fitted is None:
            raise ModelError(f"{getattr(step, 'name', step)!r} is not fitted; fit it before wrapping a model")
        prov = json.dumps(step.provenance_, sort_keys=True, default=str)
        digest = hashlib.sha256(np.ascontiguousarray(fitted, dtype=np.float64).tobytes() + prov.encode()).hexdigest()
        self.revision = f"{handle.revision}+{step.name}:{digest[:16]}"
        self.ref = f"{handle.ref}+{step.name}"

    def __getattr__(self, name: str) -> Any:
        if name in _SCORING:
            raise ModelError(f"model {self.ref!r}: {self._step.name} debiases representations; {name} reads the "
                             "output distribution, which it does not change")
        return getattr(self._handle, name)

    def embed(self, sentences, *, method=None, spans=None, layer=-1, batch_size=32, padding_side="right"):
        m = method or default_method(self._handle.kind, "word" if spans is not None else "sentence")
        if layer != -1:
            raise ModelError(f"model {self.ref!r}: {self._step.name} is fitted on the last layer; layer={layer} "
                             "is not debiased")
        if m not in METHODS:
            raise ModelError(f"model {self.ref!r}: pooling {m!r} is not a weighted average of the last layer, so the "
                             f"projection cannot be applied after it (poolings: {', '.join(METHODS)})")
        out = self._handle.embed(sentences, method=method, spans=spans, layer=layer, batch_size=batch_size,
                                 padding_side=padding_side)
        return np.asarray(self._step.transform(np.asarray(out, dtype=np.float64)), dtype=np.float32)

    def provenance(self) -> dict[str, Any]:
        out = dict(self._handle.provenance())
        out.update({"model": self.ref, "revision": self.revision, "mitigation": self._step.provenance_})
        return out


def debiased(model: LoadedModel, step: Any) -> LoadedModel:
    """A :class:`LoadedModel` whose representations ``step`` (fitted INLP / SentenceDebias) debiases."""
    h = ProjectedModel(model.handle, step)
    return dataclasses.replace(model, ref=h.ref, revision=h.revision, handle=h, cache={})
