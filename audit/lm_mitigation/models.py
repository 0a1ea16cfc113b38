"""Debiased variants of a loaded model: a fitted projection (INLP, SentenceDebias) where the
representations are read, Self-Debias inside the scoring operations and generation, and the saved variants a
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
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np

from audit.backends.batching import inference, pad_batch
from audit.backends.hf_embed import METHODS, default_method
from audit.backends.hf_scoring import _accepts, max_sequence_length, pad_token_id, split_verified
from audit.errors import DataError, ModelError
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

#: Per underlying model: whether the prompts' key/value caches reproduce the joint pass (checked once).
_PROMPT_CACHE_OK: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()

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
    (log-softmax of the logits at the scored positions) and the first-token / top-k reads of
    :mod:`audit.backends.hf_generate` see the self-debiased distribution; :meth:`generate` runs the
    rescaling at every decoding step (bias-bench's ``SelfDebiasingLogitsProcessor``).

    **Batched** (:meth:`forward`): the ``B`` rows of the caller's padded batch (their real tokens:
    the attention mask) and their ``k`` prompt-prefixed variants run as one right-padded batch of
    ``(1 + k) B`` rows (:func:`audit.backends.batching.pad_batch`), so real tokens keep the
    positions they have alone and padding is masked out: the same numbers as one unpadded pass per
    row and prompt (:func:`~.self_debias.causal_logprobs`, :func:`~.self_debias.masked_logprobs`)
    up to float32 rounding (tested: 5e-6 on log-probabilities, 1e-6 on probabilities). Causal LMs
    instead run the rows once and then once per prompt on the prompt's key/value cache (computed once,
    repeated for the batch), checked once per model against the joint pass. Causal variants: the prompt
    (tokenised alone, no special tokens) then the row; masked variants: ``tokenise(CLS + " " +
    prompt)`` then ``row[1:]`` (bias-bench's alignment), read at every position. Only the hidden
    states are kept; the LM head (the verified encoder/head split of
    :func:`audit.backends.hf_scoring.split_verified`, else the full logits) and the rescaling run
    on the positions the caller indexes (``logits[b, p]``), so memory stays ``(1 + k) B L H``
    rather than ``(1 + k) B L V``. Any other indexing materialises every real position (padding
    holds 0, never read). The forward takes no ``position_ids`` and exposes no base model, so the
    engine's key/value-cache and split-head shortcuts (which would bypass the rescaling) are not
    used; it accepts and ignores ``use_cache``.
    """

    def __init__(self, model: Any, tokenizer: Any, step: Any, kind: str):
        self._model, self._tok, self._step, self._kind = model, tokenizer, step, kind
        texts = [pr if kind == "causal" else f"{tokenizer.cls_token} {pr}" for pr in step.prefixes]
        self._prompts = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        # where token t of a row sits in its prompted variant (causal: after the prompt; masked:
        # the prompt replaces the CLS token)
        self._shifts = [len(p) if kind == "causal" else len(p) - 1 for p in self._prompts]
        self._pad = pad_token_id(tokenizer)
        self._limit = max_sequence_length(model, tokenizer)
        # the engine reads its length limit from this config: the model's own minus the longest prompt
        self.config = _room_for_prompts(model.config, self._limit - max(self._shifts, default=0))
        self._prompt_caches: dict[tuple[int, str], Any] = {}

    def parameters(self):
        return self._model.parameters()

    def get_output_embeddings(self):
        return self._model.get_output_embeddings()

    def _variants(self, input_ids: Any, attention_mask: Any) -> tuple[list[list[int]], list[list[int]]]:
        """The real tokens of each row and the ``(1 + k) B`` sequences run (rows, then each prompt's
        variants in row order, bias-bench's layout); a variant longer than the model accepts is a
        :class:`DataError`."""
        mask = attention_mask.bool() if attention_mask is not None else None
        rows = [(input_ids[r][mask[r]] if mask is not None else input_ids[r]).tolist()
                for r in range(input_ids.shape[0])]
        out = list(rows)
        for p in self._prompts:
            out += [p + row if self._kind == "causal" else p + row[1:] for row in rows]
        longest = max((len(s) for s in out), default=0)
        if longest > self._limit:
            raise DataError(f"Self-Debias: a sequence with its self-diagnosis prompt has {longest} tokens; the "
                            f"model accepts at most {self._limit}")
        return rows, out

    def _joint(self, seqs: list[list[int]], n: int, dev: Any) -> tuple[list[tuple[Any, int, int]], Any]:
        """Every variant in one right-padded forward pass: views ``(hidden, first row, shift)``."""
        padded = pad_batch(seqs, self._pad, "right")
        ids, att = padded.ids.to(dev), padded.mask.to(dev)
        split = split_verified(self._model, ids, att)
        if split is not None:
            encoder, head = split
            hidden = encoder(ids, att)
        else:
            hidden, head = self._model(input_ids=ids, attention_mask=att).logits, (lambda h: h)
        return [(hidden, 0, 0)] + [(hidden, (i + 1) * n, s) for i, s in enumerate(self._shifts)], head

    def _cached(self, rows: list[list[int]], dev: Any) -> tuple[list[tuple[Any, int, int]], Any] | None:
        """Causal LMs: the rows in one right-padded pass, then once more per prompt on the prompt's
        key/value cache (computed once, repeated for the batch; position ids continuing the prompt's),
        so the prompt's tokens are not re-run for every row; ``None`` when the model has no verified
        head split or base model taking a cache and position ids."""
        import torch

        base = getattr(self._model, getattr(self._model, "base_model_prefix", "") or "", None)
        if base is None or not _accepts(base.forward, "past_key_values") or not _accepts(base.forward, "position_ids"):
            return None
        padded = pad_batch(rows, self._pad, "right")
        ids, att = padded.ids.to(dev), padded.mask.to(dev)
        split = split_verified(self._model, ids, att)
        if split is None:
            return None
        encoder, head = split
        views = [(encoder(ids, att), 0, 0)]
        n, width = ids.shape
        for i, pid in enumerate(self._prompts):
            key = (i, str(dev))
            if key not in self._prompt_caches:
                one = torch.tensor([pid], device=dev)
                self._prompt_caches[key] = base(input_ids=one, use_cache=True).past_key_values
            cache = copy.deepcopy(self._prompt_caches[key])
            cache.batch_repeat_interleave(n)
            pos = (len(pid) + torch.arange(width, device=dev))[None, :].expand(n, width).clamp(max=self._limit - 1)
            full = torch.cat([torch.ones((n, len(pid)), dtype=att.dtype, device=dev), att], dim=1)
            views.append((base(input_ids=ids, attention_mask=full, position_ids=pos, past_key_values=cache,
                               use_cache=True).last_hidden_state, 0, 0))
        return views, head

    def forward(self, input_ids, attention_mask=None, **_ignored):
        import torch

        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        rows, seqs = self._variants(input_ids, mask)
        dev = input_ids.device
        tok_index = (mask.cumsum(1) - 1).clamp(min=0)
        real = mask.bool()
        with inference(no_grad=True):
            ok = _PROMPT_CACHE_OK.get(self._model) if self._kind == "causal" else False
            got = None
            if ok is not False:
                try:
                    got = self._cached(rows, dev)
                except torch.cuda.OutOfMemoryError:
                    raise  # the caller halves its batch (audit.backends.batching.run_batched)
                except (TypeError, ValueError, AttributeError, NotImplementedError, RuntimeError):
                    got = None  # a model that cannot run on a cache as done here: the joint pass
                if ok is None:  # checked once per model against the joint pass (same numbers up to rounding)
                    joint = _DebiasedLogits(self, *self._joint(seqs, len(rows), dev), tok_index, real, len(rows))
                    fine = got is not None and bool(torch.allclose(
                        _DebiasedLogits(self, *got, tok_index, real, len(rows))[:], joint[:], atol=1e-4, rtol=0))
                    _PROMPT_CACHE_OK[self._model] = fine
                    if not fine:
                        return _Logits(joint)
            if got is None:
                got = self._joint(seqs, len(rows), dev)
        return _Logits(_DebiasedLogits(self, *got, tok_index, real, len(rows)))

    __call__ = forward

    def generate(self, input_ids, attention_mask=None, logits_processor=None, **kwargs):
        """``model.generate`` with Self-Debias at every step, as bias-bench's
        ``GPT2Wrapper.generate_self_debiasing``: the ``B`` prompts and their ``k`` prompt-prefixed
        variants run as one left-padded batch of ``(1 + k) B`` rows through the model's own
        ``generate`` (KV cache, position ids from the attention mask) with a logits processor that
        replaces each row's next-token scores by ``log p~`` (:func:`~.self_debias.rescale` of the
        row and its variants; the caller's ``logits_processor`` then applied to the ``B`` rows) and
        gives every variant the row's scores, so all ``1 + k`` continue with the same token (and
        stop together at EOS). Returns ``input_ids`` (as passed) followed by the new tokens."""
        import torch
        from transformers import LogitsProcessorList

        if self._kind != "causal":
            raise ModelError("Self-Debias generation needs a causal LM")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        rows, seqs = self._variants(input_ids, mask)
        padded = pad_batch(seqs, self._pad, "left")
        dev = input_ids.device
        width = padded.ids.shape[1]
        proc = _StepRescaler(len(rows), self._step, list(logits_processor or []), width - input_ids.shape[1])
        out = self._model.generate(input_ids=padded.ids.to(dev), attention_mask=padded.mask.to(dev),
                                   logits_processor=LogitsProcessorList([proc]), **kwargs)
        return torch.cat([input_ids, out[: len(rows), width:].to(input_ids.device)], dim=1)


class _StepRescaler:
    """The logits processor of :meth:`SelfDebiasingLM.generate` (bias-bench's
    ``SelfDebiasingLogitsProcessor`` with the caller's processors applied after it on the regular
    rows, which see their own ``input_ids``: the prompt columns cut off)."""

    def __init__(self, n: int, step: Any, then: list, cut: int):
        self.n, self.step, self.then, self.cut = n, step, then, cut

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        n, k = self.n, len(self.step.prefixes)
        lp = rescale(scores[:n].float(), [scores[(i + 1) * n:(i + 2) * n].float() for i in range(k)],
                     decay_constant=self.step.decay_constant, epsilon=self.step.epsilon)
        for p in self.then:
            lp = p(input_ids[:n, self.cut:], lp)
        return lp.to(scores.dtype).repeat(1 + k, 1)


class _DebiasedLogits:
    """The lazy ``logits`` of :meth:`SelfDebiasingLM.forward`: ``x[b, p]`` (two index tensors)
    runs the head on row ``b``'s token at column ``p`` and on the same token in each prompted
    variant (``views``: ``(hidden, first row, shift)`` of the regular rows then of each prompt's),
    then :func:`~.self_debias.rescale`; other indexing materialises ``(B, L, V)``."""

    def __init__(self, lm: "SelfDebiasingLM", views: list, head: Any, tok_index: Any, real: Any, n: int):
        self._lm, self._views, self._head, self._tok, self._real, self._n = lm, views, head, tok_index, real, n
        self.device = views[0][0].device

    def rows(self, b: Any, p: Any) -> Any:
        dev = self.device
        b, t = b.to(dev), self._tok[b.to(self._tok.device), p.to(self._tok.device)].to(dev)
        with inference(no_grad=True):
            out = [self._head(h[r0 + b, t + s]).float() for h, r0, s in self._views]
            return rescale(out[0], out[1:], decay_constant=self._lm._step.decay_constant,
                           epsilon=self._lm._step.epsilon)

    def __getitem__(self, key: Any) -> Any:
        import torch

        if isinstance(key, tuple) and len(key) == 2 and all(torch.is_tensor(x) and x.dim() == 1 for x in key):
            return self.rows(*key)
        b, p = self._real.nonzero(as_tuple=True)
        vals = self.rows(b, p)
        full = torch.zeros((*self._real.shape, vals.shape[-1]), dtype=vals.dtype, device=vals.device)
        full[b.to(vals.device), p.to(vals.device)] = vals
        return full[key]


def _room_for_prompts(config: Any, target: int) -> Any:
    """A copy of ``config`` whose position count makes the engine's limit
    (:func:`audit.backends.hf_scoring.max_sequence_length`) ``target``: the model's own limit minus
    the tokens the longest prompt adds (:attr:`SelfDebiasingLM._shifts`), so its length checks
    (inputs refused with a one-line :class:`~audit.errors.DataError`, BBQ's ``truncation: left``)
    leave room for the prompt the
    Self-Debias forward puts before each input (causal: the prompt; masked: ``CLS + " " + prompt``
    in place of the CLS token); the model itself keeps its config."""
    cfg = copy.copy(config)
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
    masked scores, pseudo-log-likelihoods) and completions (top-k fills, first words, sampled and
    greedy generation) read the Self-Debias distribution (:class:`SelfDebiasingLM`);
    representations are refused with the reason (:data:`audit.lm_mitigation.TECHNIQUES`)."""

    #: ``max_length`` too: the scoring model's, which leaves room for the prompts (``_room_for_prompts``)
    _SCORING_OPS = ("loglikelihood", "loglikelihood_rolling", "pair_pll", "masked_scores", "topk_fills",
                    "first_words", "samples", "generate_until", "max_length")

    def __init__(self, handle: Any, step: Any):
        if handle.kind not in ("mlm", "causal"):
            raise ModelError(f"model {handle.ref!r}: self_debias applies to masked and causal LMs, not {handle.kind}")
        self._handle, self._step = handle, step
        self.revision = variant_revision(handle.revision, step.name, None, step.provenance_)
        self.ref = f"{handle.ref}+{step.name}"
        self._scoring = dataclasses.replace(handle, model=SelfDebiasingLM(handle.model, handle.tokenizer, step,
                                                                          handle.kind))

    def for_language(self, language: str | None) -> "SelfDebiasedModel":
        """This variant with the self-diagnosis prompts for text in ``language``
        (:meth:`audit.lm_mitigation.steps.SelfDebias.for_language`; a language without prompts is a
        :class:`ParameterError` naming it). :func:`audit.runner.measure` calls it with the test's
        language, so a German test is self-debiased with German prompts, recorded in the result's
        provenance (``self_debias_prompts``, :meth:`measure_info`)."""
        return SelfDebiasedModel(self._handle, self._step.for_language(language))

    def measure_info(self) -> dict[str, Any]:
        """What :func:`audit.runner.measure` records in the measurement (and the result's provenance):
        ``self_debias_prompts``, the prompts this view runs with."""
        return {"self_debias_prompts": list(self._step.prefixes)}

    def __getattr__(self, name: str) -> Any:
        if name in self._SCORING_OPS:
            return getattr(self._scoring, name)
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
