"""Debiased variants of a loaded model: a fitted projection (INLP, SentenceDebias) where the
representations are read, Self-Debias inside the scoring operations, and the saved variants a
sweep builds (:func:`load_variant`).

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

import copy
import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from audit.backends.hf_embed import METHODS, default_method
from audit.backends.hf_scoring import max_sequence_length
from audit.errors import ModelError
from audit.lm_mitigation import TECHNIQUES
from audit.lm_mitigation.self_debias import rescale
from audit.lm_mitigation.steps import INLP, SelfDebias, SentenceDebias

__all__ = ["MANIFEST", "ProjectedModel", "SelfDebiasedModel", "debiased", "load_variant", "variant_revision"]

#: The manifest of a variant directory built by a sweep (:func:`load_variant`).
MANIFEST = "lm_mitigation.json"
#: The fitted projection of an INLP / SentenceDebias variant directory.
FITTED = "fitted.npy"


def variant_revision(base_revision: str, technique: str, fitted: Any, provenance: dict[str, Any]) -> str:
    """``<base revision>+<technique>:<16 hex>``: sha256 of the fitted array (float64 bytes; none for
    Self-Debias) and the step's provenance (sorted JSON: parameters, pairs and corpus digests), so the
    task keys of a variant change with anything that changes it."""
    prov = json.dumps(provenance, sort_keys=True, default=str).encode()
    raw = b"" if fitted is None else np.ascontiguousarray(fitted, dtype=np.float64).tobytes()
    return f"{base_revision}+{technique}:{hashlib.sha256(raw + prov).hexdigest()[:16]}"

_SCORING = ("loglikelihood", "loglikelihood_rolling", "pair_pll", "masked_scores", "topk_fills", "first_words")


class _Variant:
    """What every debiased variant of a loaded model records: the base model's load information and
    provenance, its own ref and revision, and the step's provenance (``self._handle``, ``self._step``,
    ``self.ref``, ``self.revision`` set by the subclass)."""

    def load_info(self) -> dict[str, str]:
        """The base model's load information plus ``mitigation``: the step's provenance (sorted
        JSON: technique, reference, parameters, pairs and corpus digests), recorded in every result."""
        out = dict(self._handle.load_info()) if callable(getattr(self._handle, "load_info", None)) else {}
        out["mitigation"] = json.dumps(self._step.provenance_, sort_keys=True, default=str)
        return out

    def provenance(self) -> dict[str, Any]:
        out = dict(self._handle.provenance())
        out.update({"model": self.ref, "revision": self.revision, "mitigation": self._step.provenance_})
        return out


class ProjectedModel(_Variant):
    """``handle`` with ``embed`` followed by ``step.transform`` (a fitted INLP or SentenceDebias)."""

    def __init__(self, handle: Any, step: Any):
        self._handle, self._step = handle, step
        fitted = getattr(step, "projection_", None)
        if fitted is None:
            fitted = getattr(step, "directions_", None)
        if fitted is None:
            raise ModelError(f"{getattr(step, 'name', step)!r} is not fitted; fit it before wrapping a model")
        self.revision = variant_revision(handle.revision, step.name, fitted, step.provenance_)
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


def debiased(model: Any, step: Any) -> Any:
    """A :class:`LoadedModel` whose representations ``step`` (fitted INLP / SentenceDebias) debiases."""
    h = ProjectedModel(model.handle, step)
    return dataclasses.replace(model, ref=h.ref, revision=h.revision, handle=h, cache={})


class SelfDebiasingLM:
    """A causal or masked LM module whose output ``logits`` are Self-Debias log-probabilities
    (:mod:`audit.lm_mitigation.self_debias`), so every scorer of :mod:`audit.backends.hf_scoring`
    (log-softmax of the logits at the scored positions) reads the self-debiased distribution.

    Each row of a padded batch is run alone, without padding (its real tokens: the attention
    mask), once plain and once per prompt. Causal rows: :func:`~.self_debias.causal_logprobs`
    (every position). Masked rows: bias-bench's masked-LM alignment (the prompt
    ``CLS + " " + prompt`` then ``ids[1:]``) applied at every position, which at a single mask is
    :func:`~.self_debias.masked_logprobs` exactly; with several masks (LPBS, pseudo-perplexity
    spans) each masked position is rescaled the same way. Padded positions hold 0 (never read).
    The forward takes no ``position_ids``/``use_cache`` and exposes no base model, so the engine's
    key/value-cache and split-head shortcuts (which would bypass the rescaling) are not used.
    """

    def __init__(self, model: Any, tokenizer: Any, step: Any, kind: str):
        self._model, self._tok, self._step, self._kind = model, tokenizer, step, kind
        self.config = _room_for_prompts(model, tokenizer, step.prefixes, kind)

    def parameters(self):
        return self._model.parameters()

    def forward(self, input_ids, attention_mask=None):
        import torch

        out = None
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        with torch.no_grad():
            for r in range(input_ids.shape[0]):
                pos = mask[r].nonzero().flatten()
                ids = input_ids[r, pos]
                regular = self._model(input_ids=ids.unsqueeze(0))["logits"][0]
                biased = []
                for pr in self._step.prefixes:
                    text = pr if self._kind == "causal" else f"{self._tok.cls_token} {pr}"
                    pid = torch.as_tensor(self._tok(text, add_special_tokens=False)["input_ids"], dtype=ids.dtype,
                                          device=ids.device)
                    if self._kind == "causal":
                        full = torch.cat([pid, ids]).unsqueeze(0)
                        biased.append(self._model(input_ids=full)["logits"][0, -len(ids):])
                    else:
                        full = torch.cat([pid, ids[1:]]).unsqueeze(0)
                        biased.append(self._model(input_ids=full)["logits"][0, len(pid) - 1: len(pid) - 1 + len(ids)])
                lp = rescale(regular.float(), [b.float() for b in biased], decay_constant=self._step.decay_constant,
                             epsilon=self._step.epsilon)
                if out is None:
                    out = torch.zeros((*input_ids.shape, lp.shape[-1]), dtype=lp.dtype, device=lp.device)
                out[r, pos] = lp
        return _Logits(out)

    __call__ = forward


def _room_for_prompts(model: Any, tokenizer: Any, prefixes: Any, kind: str) -> Any:
    """A copy of ``model.config`` whose position count makes the engine's limit
    (:func:`audit.backends.hf_scoring.max_sequence_length`) the model's own limit minus the longest
    prompt's tokens, so its length checks (inputs refused with a one-line
    :class:`~audit.errors.DataError`, BBQ's ``truncation: left``) leave room for the prompt the
    Self-Debias forward puts before each input (causal: the prompt; masked: ``CLS + " " + prompt``
    in place of the CLS token); the model itself keeps its config."""
    n = max((len(tokenizer(pr if kind == "causal" else f"{tokenizer.cls_token} {pr}",
                           add_special_tokens=False)["input_ids"]) - (kind != "causal") for pr in prefixes), default=0)
    cfg = copy.copy(model.config)
    target = max_sequence_length(model, tokenizer) - n
    attrs = [a for a in ("max_position_embeddings", "n_positions", "max_seq_len")
             if isinstance(getattr(cfg, a, None), int)] or ["max_position_embeddings"]
    for a in attrs:
        setattr(cfg, a, target)
    offset = target - max_sequence_length(SimpleNamespace(config=cfg), None)  # RoBERTa's position offset
    for a in attrs:
        setattr(cfg, a, target + offset)
    return cfg


class _Logits(dict):
    def __init__(self, logits):
        super().__init__(logits=logits)
        self.logits = logits


class SelfDebiasedModel(_Variant):
    """``handle`` (a Hugging Face masked or causal LM) whose scoring operations (log-likelihoods,
    masked scores, pseudo-log-likelihoods) read the Self-Debias distribution; generation and
    representations are refused with the reason (:data:`audit.lm_mitigation.TECHNIQUES`)."""

    #: ``max_length`` too: the scoring model's, which leaves room for the prompts (``_room_for_prompts``)
    _SCORING_OPS = ("loglikelihood", "loglikelihood_rolling", "pair_pll", "masked_scores", "max_length")

    def __init__(self, handle: Any, step: Any):
        if handle.kind not in ("mlm", "causal"):
            raise ModelError(f"model {handle.ref!r}: self_debias applies to masked and causal LMs, not {handle.kind}")
        self._handle, self._step = handle, step
        self.revision = variant_revision(handle.revision, step.name, None, step.provenance_)
        self.ref = f"{handle.ref}+{step.name}"
        self._scoring = dataclasses.replace(handle, model=SelfDebiasingLM(handle.model, handle.tokenizer, step,
                                                                          handle.kind))

    def __getattr__(self, name: str) -> Any:
        if name in self._SCORING_OPS:
            return getattr(self._scoring, name)
        if name in ("topk_fills", "first_words"):
            raise ModelError(f"model {self.ref!r}: {dict(TECHNIQUES['self_debias'].not_wired)['completions']}")
        if name == "embed":
            raise ModelError(f"model {self.ref!r}: self_debias changes the output distribution, not the "
                             "representations embed reads")
        return getattr(self._handle, name)


def load_variant(path: str, load: Callable[..., Any], **options: Any) -> Any:
    """Load a variant directory a sweep built (``lm_mitigation.json``: technique, parameters, the
    base model's local reference and load options, provenance; ``fitted.npy`` for a projection):
    the base model loaded with ``load`` (:func:`audit.runner.load_model`, which calls this for such
    a directory) and its options, wrapped by :class:`ProjectedModel` or :class:`SelfDebiasedModel`
    (a :class:`audit.runner.LoadedModel`). Its revision is the manifest's (:func:`variant_revision`,
    which the driver reads without loading); a mismatch (the base changed) is refused."""
    d = Path(path)
    man = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
    base = load(man["base_local_ref"], **{**man.get("base_options", {}), **options})
    tech = man["technique"]
    if tech == "self_debias":
        step = SelfDebias(**man["params"])
        step.provenance_ = man["provenance"]
        h: Any = SelfDebiasedModel(base.handle, step)
    else:
        step = {"inlp": INLP, "sentence_debias": SentenceDebias}[tech](**man["params"])
        setattr(step, "projection_" if tech == "inlp" else "directions_", np.load(d / FITTED))
        step.provenance_ = man["provenance"]
        h = ProjectedModel(base.handle, step)
    if h.revision != man["revision"]:
        raise ModelError(f"{d}: the base model or the fitted step changed since the variant was built "
                         f"(revision {h.revision} != {man['revision']}); re-run the sweep to rebuild it")
    return dataclasses.replace(base, ref=str(path), revision=h.revision, handle=h, cache={})
