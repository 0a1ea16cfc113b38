"""Debiasing of language models (encoders, masked and causal LMs), after bias-bench.

Reference implementation: bias-bench (Meade, Poole-Dayan & Reddy 2022, "An Empirical Survey of the
Effectiveness of Debiasing Techniques for Pre-trained Language Models", ACL; McGill-NLP/bias-bench
at 291426a). Each technique is written from the paper and bias-bench's code and cross-checked
against a transcription of that code (tests/bias_bench_ref.py, tests/test_lm_debias.py).

Pure functions (numpy / torch / scikit-learn; no Ray, no MLflow):

* :mod:`.pairs` -- per-language attribute-word pairs derived from the shipped tests, or read from
  a bias-bench-format file;
* :mod:`.cda` -- two-sided counterfactual data augmentation of a corpus;
* :mod:`.inlp` -- iterative nullspace projection of sentence representations;
* :mod:`.sentence_debias` -- the bias subspace of counterfactual sentence pairs, projected out;
* :mod:`.self_debias` -- decoding-time rescaling with self-diagnosis prompts.

:data:`TECHNIQUES` says which model kinds and measurement families each technique applies to, and
:func:`check_applicable` refuses the others with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from audit.errors import ParameterError
from audit.measure.bbq import CHOICES
from audit.measure.crows_pairs import PAIR_SCORES
from audit.measure.honest import COMPLETIONS
from audit.measure.lpbs import LPBS_SCORES
from audit.measure.perplexity import PERPLEXITY
from audit.measure.sentences import SEAT_SENTENCES
from audit.measure.words import ASSOCIATION

__all__ = ["Technique", "TECHNIQUES", "check_applicable", "family_reason", "kind_reason"]

#: Families that read representations (``embed``): a projection applies where they are read.
REPRESENTATION_FAMILIES = (ASSOCIATION.name, SEAT_SENTENCES.name)
#: Families that read the output distribution (scores, completions, LM ability).
SCORING_FAMILIES = (PAIR_SCORES.name, LPBS_SCORES.name, COMPLETIONS.name, CHOICES.name, PERPLEXITY.name)


@dataclass(frozen=True)
class Technique:
    """One LM debiasing technique: where it applies and what it costs."""

    name: str
    reference: str
    kinds: tuple[str, ...]
    families: tuple[str, ...]
    changes: str
    cost: str
    #: families the technique would change but the engine does not apply it to, with the reason
    not_wired: tuple[tuple[str, str], ...] = ()


TECHNIQUES: dict[str, Technique] = {t.name: t for t in (
    Technique("inlp", "Ravfogel et al. 2020 (ACL)", ("encoder", "mlm", "causal"), REPRESENTATION_FAMILIES,
              "representations: x -> P x at the last hidden layer",
              "forward passes over the corpus sentences + n_classifiers linear SVMs (d x d projection)"),
    Technique("sentence_debias", "Liang et al. 2020 (ACL)", ("encoder", "mlm", "causal"), REPRESENTATION_FAMILIES,
              "representations: the bias direction removed from the last hidden layer",
              "forward passes over the counterfactual pairs + one PCA"),
    Technique("self_debias", "Schick, Udupa & Schütze 2021 (TACL)", ("mlm", "causal"), SCORING_FAMILIES,
              "output distribution: next-token / masked-token probabilities rescaled at decoding",
              "the 1 + prompts variants of each batch (causal: on the prompt's shared key/value cache; "
              "masked: the prompted rows in the same padded pass); no fitting"),
    Technique("cda", "Zmigrod et al. 2019; Webster et al. 2020", ("mlm", "causal"),
              REPRESENTATION_FAMILIES + SCORING_FAMILIES,
              "weights: further pre-training on the two-sided counterfactually augmented corpus",
              "a training run (steps x batch forward+backward)"),
    Technique("dropout", "Webster et al. 2020", ("mlm", "causal"), REPRESENTATION_FAMILIES + SCORING_FAMILIES,
              "weights: further pre-training with increased dropout",
              "a training run (steps x batch forward+backward)"),
)}


def check_applicable(technique: str, kind: str, family: str) -> None:
    """Raise :class:`ParameterError` (one line, with the reason) unless ``technique`` applies to
    a model of ``kind`` measured by ``family``."""
    t = TECHNIQUES.get(technique)
    if t is None:
        raise ParameterError(f"unknown LM debiasing technique {technique!r}; known: {', '.join(TECHNIQUES)}")
    why = kind_reason(technique, kind) or family_reason(technique, family)
    if why is not None:
        raise ParameterError(why)


def kind_reason(technique: str, kind: str) -> str | None:
    """``None`` when ``technique`` (a known name) applies to models of ``kind``, else one line why."""
    t = TECHNIQUES[technique]
    if kind not in t.kinds:
        return (f"{technique} does not apply to {kind} models (it changes {t.changes.split(':')[0]}; "
                f"model kinds: {', '.join(t.kinds)})")
    return None


def family_reason(technique: str, family: str) -> str | None:
    """``None`` when ``technique`` (a known name) changes what ``family`` reads, else one line
    naming the technique, the family and the reason."""
    t = TECHNIQUES[technique]
    wired = dict(t.not_wired)
    if family in wired:
        return f"{technique} does not apply to the {family} family: {wired[family]}"
    if family not in t.families:
        what = t.changes.split(":")[0]
        return (f"{technique} does not apply to the {family} family: it changes {what}, "
                f"which {family} does not read (families: {', '.join(t.families)})")
    return None
