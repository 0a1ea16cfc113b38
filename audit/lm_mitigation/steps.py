"""The LM debiasing techniques as fit/transform steps with their parameters and provenance.

Each step is fitted on a model (Hugging Face model + tokenizer), a corpus (sentences, one per
line of the user's file) and attribute pairs (:mod:`audit.lm_mitigation.pairs`), and records
``provenance_``: the technique, its reference, its parameters, the pairs (language, bias type,
provenance, digest), the corpus digest and what was fitted (so that a sweep can key a fitted
step on model revision + parameters + corpus digest and never refit).

* :class:`INLP` -- ``fit`` learns the projection ``P`` (:mod:`.inlp`); ``transform(hidden)``
  returns ``hidden P^T`` (applied to the last hidden state, where the representation is read);
* :class:`SentenceDebias` -- ``fit`` learns the bias direction (:mod:`.sentence_debias`);
  ``transform(hidden)`` projects it out;
* :class:`SelfDebias` -- nothing to fit; ``logprobs`` gives the rescaled distribution
  (:mod:`.self_debias`);
* :class:`CDA` -- ``transform(corpus)`` gives the two-sided augmented corpus (:mod:`.cda`), the
  training data of further pre-training.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
from typing import Annotated, Any, Sequence

import numpy as np

from pydantic import Field, ValidationInfo, field_validator

from audit.errors import ParameterError
from audit.schema import Flag, Int, Refused, Section, Text, arguments
from audit.lm_mitigation import TECHNIQUES
from audit.lm_mitigation.cda import augment_corpus
from audit.lm_mitigation.inlp import (
    apply_projection,
    attribute_sentences,
    gender_sentences,
    inlp_projection,
    labels_for,
    mean_last_hidden,
    split_dataset,
)
from audit.lm_mitigation.pairs import AttributePairs
from audit.lm_mitigation.self_debias import (
    DEBIASING_PREFIXES, Rescaling, causal_logprobs, masked_logprobs, prompts_for,
)
from audit.lm_mitigation.training import TrainParams
from audit.lm_mitigation.sentence_debias import bias_direction, counterfactual_examples, mean_pooled, project_out

__all__ = ["CDA", "INLP", "PARAMS", "SelfDebias", "SentenceDebias", "corpus_digest", "pairs_digest"]


def corpus_digest(sentences: Sequence[str]) -> str:
    """``sha256:`` of the sentences, newline-joined, UTF-8."""
    return "sha256:" + hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest()


def pairs_digest(pairs: AttributePairs) -> str:
    """``sha256:`` of the pairs (tab-joined words, one tuple per line)."""
    return "sha256:" + hashlib.sha256("\n".join("\t".join(p) for p in pairs.pairs).encode("utf-8")).hexdigest()


class _Step:
    name = ""
    #: the types and ranges of the keyword parameters (:mod:`audit.schema`), declared once: the
    #: constructor and a sweep spec's ``models[i].lm_mitigation[j].params`` check them
    Params: type[Section] = Section

    @classmethod
    def _param_names(cls) -> list[str]:
        return [p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind == p.KEYWORD_ONLY]

    def get_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._param_names()}

    def _set_params(self, **given: Any) -> None:
        """The constructor's parameters checked against :attr:`Params` (:func:`audit.schema.arguments`)
        and set as attributes."""
        for k, v in arguments(self.Params, given, self.name).items():
            setattr(self, k, v)

    def _provenance(self, pairs: AttributePairs, corpus: Sequence[str] | None, **fitted: Any) -> dict[str, Any]:
        t = TECHNIQUES[self.name]
        out = {"technique": self.name, "reference": t.reference, "params": self.get_params(),
               "pairs": {"language": pairs.language, "bias_type": pairs.bias_type, "n": len(pairs.pairs),
                         "digest": pairs_digest(pairs), **pairs.provenance}}
        if corpus is not None:
            out["corpus"] = {"digest": corpus_digest(corpus), "n_sentences": len(corpus)}
        out.update(fitted)
        return out

    def _need_fit(self, attr: str) -> Any:
        v = getattr(self, attr, None)
        if v is None:
            raise ParameterError(f"{self.name}: call fit before transform")
        return v


class INLP(_Step):
    """Iterative nullspace projection (bias-bench's settings: 80 classifiers; gender 3 classes, male /
    female / neutral sentences; other bias types 2 classes, sentences with an attribute word / neutral)."""

    name = "inlp"

    class Params(Section):
        n_classifiers: Int(1) = 80
        n_sentences: Int(1) = 10000
        seed: Int(0) = 0

    def __init__(self, *, n_classifiers: int = 80, n_sentences: int = 10000, seed: int = 0):
        self._set_params(n_classifiers=n_classifiers, n_sentences=n_sentences, seed=seed)
        self.projection_: np.ndarray | None = None

    def fit(self, model: Any, tokenizer: Any, corpus: Sequence[str], pairs: AttributePairs) -> INLP:
        gender = pairs.bias_type == "gender"
        if gender:
            if any(len(p) != 2 for p in pairs.pairs):
                raise ParameterError("inlp: gender pairs need two words each (male, female)")
            data = gender_sentences(corpus, pairs.pairs, n_sentences=self.n_sentences, seed=self.seed)
        else:  # bias-bench's race / religion data: sentences with any attribute word vs neutral ones
            data = attribute_sentences(corpus, pairs.words(), n_sentences=self.n_sentences, seed=self.seed)
        empty = [k for k, v in data.items() if not v]
        if empty:
            raise ParameterError(f"inlp: the corpus has no {', '.join(empty)} sentences (of 5+ tokens) for the "
                                 f"{pairs.language} {pairs.bias_type} pairs")
        X = np.concatenate([mean_last_hidden(model, tokenizer, data[k]) for k in data])
        y = labels_for([len(v) for v in data.values()], gender=gender)
        Xtr, Xdev, _, ytr, ydev, _ = split_dataset(X, y, seed=0)
        self.projection_, Ws, accs = inlp_projection(Xtr, ytr, Xdev, ydev, n_classifiers=self.n_classifiers)
        self.provenance_ = self._provenance(pairs, corpus, n_train={k: len(v) for k, v in data.items()},
                                            dev_accuracy_first=accs[0], dev_accuracy_last=accs[-1],
                                            rank_removed=int(round(X.shape[1] - np.trace(self.projection_))))
        return self

    def transform(self, hidden: np.ndarray) -> np.ndarray:
        return apply_projection(hidden, self._need_fit("projection_"))


class SentenceDebias(_Step):
    """SentenceDebias (bias-bench: first PCA component, batches of 32 padded to 128)."""

    name = "sentence_debias"

    class Params(Section):
        n_components: Int(1) = 1
        batch_size: Int(1) = 32
        max_length: Int(1) = 128
        drop_last: Flag = False

    def __init__(self, *, n_components: int = 1, batch_size: int = 32, max_length: int = 128,
                 drop_last: bool = False):
        self._set_params(n_components=n_components, batch_size=batch_size, max_length=max_length,
                         drop_last=drop_last)
        self.directions_: np.ndarray | None = None

    def fit(self, model: Any, tokenizer: Any, corpus: Sequence[str], pairs: AttributePairs) -> SentenceDebias:
        ex = counterfactual_examples(corpus, pairs)
        if not ex:
            raise ParameterError(f"sentence_debias: no corpus sentence contains a {pairs.language} {pairs.bias_type} "
                                 "attribute word")
        kw = {"batch_size": self.batch_size, "max_length": self.max_length, "drop_last": self.drop_last}
        k = len(ex[0])
        # pairs: side 1 stacked first, as bias-bench's gender subspace ("male_example" first); k > 2: in order
        order = [1, 0] if k == 2 else list(range(k))
        sides = [mean_pooled(model, tokenizer, [e[i] for e in ex], **kw) for i in order]
        a = sides[0]
        self.directions_ = bias_direction(*sides, n_components=self.n_components)
        self.provenance_ = self._provenance(pairs, corpus, n_examples=len(ex), n_encoded=len(a))
        return self

    def transform(self, hidden: np.ndarray) -> np.ndarray:
        return project_out(hidden, self._need_fit("directions_"))


class SelfDebias(_Step):
    """Self-Debias with bias-bench's CrowS-Pairs prompt of ``bias_type`` unless ``prefixes`` given."""

    name = "self_debias"

    class Params(Rescaling):
        prefixes: Annotated[tuple[Text, ...], Field(strict=False)] | None = None
        bias_type: Text = "gender"

        @field_validator("bias_type")
        @classmethod
        def _a_prompt(cls, v: str, info: ValidationInfo) -> str:
            if info.data.get("prefixes") is None and v not in DEBIASING_PREFIXES:
                raise Refused(f"no prompt for bias_type {v!r}; known: {', '.join(DEBIASING_PREFIXES)} "
                              "(or pass prefixes)")
            return v

    def __init__(self, *, bias_type: str = "gender", prefixes: Sequence[str] | None = None,
                 decay_constant: float = 50.0, epsilon: float = 0.01):
        self._set_params(prefixes=prefixes, bias_type=bias_type, decay_constant=decay_constant, epsilon=epsilon)
        self.prefixes = list(prefixes) if prefixes is not None else [DEBIASING_PREFIXES[self.bias_type]]
        self._given = prefixes is not None
        self.language_: str | None = None

    def for_language(self, language: str | None) -> "SelfDebias":
        """A copy whose prompts are for text in ``language``: the ``prefixes`` given, else the prompt
        of ``bias_type`` in that language (:func:`~.self_debias.prompts_for`: bias-bench's English one
        for ``en``, this project's translations for the other shipped languages; another language is
        a :class:`ParameterError` naming it)."""
        out = copy.copy(self)
        out.prefixes = list(self.prefixes) if self._given else prompts_for(self.bias_type, language)
        out.language_ = language
        return out

    def logprobs(self, model: Any, tokenizer: Any, input_ids: Sequence[int], *, kind: str):
        """Causal: ``(len(ids), V)`` next-token log-probabilities; mlm: ``(V,)`` at the mask."""
        f = {"causal": causal_logprobs, "mlm": masked_logprobs}.get(kind)
        if f is None:
            raise ParameterError(f"self_debias applies to causal and masked LMs, not kind={kind!r}")
        return f(model, tokenizer, input_ids, self.prefixes, decay_constant=self.decay_constant,
                 epsilon=self.epsilon)


class CDA(_Step):
    """Two-sided counterfactual augmentation of a corpus (bias-bench's word list and loop; tuples of
    three words or more: one drawn counterfactual per text, ``seed``)."""

    name = "cda"

    class Params(Section):
        punctuation: Flag = True
        keep_unmatched: Flag = False
        lower: Flag = False
        seed: Int(0) = 0

    def __init__(self, *, punctuation: bool = True, keep_unmatched: bool = False, lower: bool = False,
                 seed: int = 0):
        self._set_params(punctuation=punctuation, keep_unmatched=keep_unmatched, lower=lower, seed=seed)

    def transform(self, corpus: Sequence[str], pairs: AttributePairs) -> list[str]:
        out = augment_corpus(corpus, pairs, punctuation=self.punctuation, keep_unmatched=self.keep_unmatched,
                             lower=self.lower, seed=self.seed)
        self.provenance_ = self._provenance(pairs, corpus, augmented={"digest": corpus_digest(out),
                                                                      "n_sentences": len(out)})
        return out


#: The parameters a sweep spec's ``models[i].lm_mitigation`` step takes, by technique: the fitted
#: and decoding-time steps' own :attr:`_Step.Params`; the trained techniques (``cda``, ``dropout``)
#: take further pre-training's (:class:`audit.lm_mitigation.training.TrainParams`).
PARAMS: dict[str, type[Section]] = {"inlp": INLP.Params, "sentence_debias": SentenceDebias.Params,
                                    "self_debias": SelfDebias.Params, "cda": TrainParams, "dropout": TrainParams}
