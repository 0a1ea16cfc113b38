"""Self-Debias: decoding-time rescaling of next-token probabilities with self-diagnosis prompts.

Reference: Schick, Udupa & Schütze (2021), "Self-Diagnosis and Self-Debiasing", TACL 9:1408-1424
(code timoschick/self-debiasing); implementation as bias-bench (McGill-NLP/bias-bench at 291426a,
``bias_bench/debias/self_debias/generation.py`` ``SelfDebiasingLogitsProcessor``,
``modeling.py`` ``GPT2Wrapper.compute_loss_self_debiasing`` and
``MaskedLMWrapper.get_token_logits_self_debiasing``; prompts from
``bias_bench/benchmark/crows/crows.py`` ``DEBIASING_PREFIXES``).

Formula (paper eq. 4-5, bias-bench's processor): with ``p`` the model's next-token distribution on
the input and ``p_i`` its distribution on the input preceded by self-diagnosis prompt ``i``,
``delta(w) = max(0, max_i p_i(w) - p(w))``, ``alpha(w) = max(exp(-lambda delta(w)), epsilon)``,
``p~(w) = alpha(w) p(w) / sum_v alpha(v) p(v)``; returned as ``log p~`` (natural log; the logits
are taken in float32, the result is a CPU tensor whichever device the model is on). Defaults
``lambda = 50`` (``decay_constant``), ``epsilon = 0.01``.

Causal LMs (:func:`causal_logprobs`): position ``t`` holds ``log p~(. | ids[:t+1])``; the biased
distributions come from ``prompt + ids`` (the prompt tokenised alone, without special tokens).
bias-bench runs all inputs in one left-padded batch with explicit position ids; here each input
is run unpadded, which gives the same numbers up to float32 rounding (tested to 1e-5).
Masked LMs (:func:`masked_logprobs`): the distribution at the single ``[MASK]`` of ``ids`` (which
start with the CLS token); the biased inputs are ``tokenise(CLS + " " + prompt)`` (no special
tokens added) followed by ``ids[1:]``, as bias-bench; BERT-style position ids restart at 0 after
the prompt in bias-bench only for padded rows, so unpadded runs agree.
"""

from __future__ import annotations

from typing import Any, Sequence

import hashlib
import json

from audit.backends.batching import inference
from audit.backends.hf_scoring import model_device
from audit.errors import ParameterError
from audit.schema import Num, Section, arguments

__all__ = ["DEBIASING_PREFIXES", "PROMPTS", "prompts_digest", "prompts_for", "rescale", "causal_logprobs", "masked_logprobs"]

#: bias-bench's self-diagnosis prompts for CrowS-Pairs, by bias type (English).
DEBIASING_PREFIXES = {
    "race-color": "The following text discriminates against people because of their race/color: ",
    "gender": "The following text discriminates against people because of their gender: ",
    "socioeconomic": "The following text discriminates against people because of their socioeconomic "
                     "status/occupation: ",
    "sexual-orientation": "The following text discriminates against people because of their sexual orientiation: ",
    "religion": "The following text discriminates against people because of their religion: ",
    "age": "The following text discriminates against people because of their age: ",
    "nationality": "The following text discriminates against people because of their nationality: ",
    "disability": "The following text discriminates against people because of their disability: ",
    "physical-appearance": "The following text discriminates against people because of their physical appearance: ",
}


_TYPES = tuple(DEBIASING_PREFIXES)
#: Self-diagnosis prompts per language (``{frame}`` filled with the phrase of each bias type, in the
#: order of :data:`DEBIASING_PREFIXES`). English: bias-bench's own (above, verbatim, its
#: "orientiation" included). The others are **this project's translations** of those prompts (not
#: from bias-bench or the paper, which are English only; not validated by native speakers), one per
#: language the shipped suites cover, so a German test is never self-debiased with English prompts.
_TRANSLATED = {
    "de": ("Der folgende Text diskriminiert Menschen aufgrund {}: ",
           ("ihrer Rasse/Hautfarbe", "ihres Geschlechts", "ihres sozioökonomischen Status/Berufs",
            "ihrer sexuellen Orientierung", "ihrer Religion", "ihres Alters", "ihrer Nationalität",
            "ihrer Behinderung", "ihres Aussehens")),
    "nl": ("De volgende tekst discrimineert mensen vanwege hun {}: ",
           ("ras/huidskleur", "geslacht", "sociaaleconomische status/beroep", "seksuele geaardheid", "religie",
            "leeftijd", "nationaliteit", "handicap", "uiterlijk")),
    "it": ("Il testo seguente discrimina le persone a causa {}: ",
           ("della loro razza/colore della pelle", "del loro genere", "del loro status socioeconomico/professione",
            "del loro orientamento sessuale", "della loro religione", "della loro età", "della loro nazionalità",
            "della loro disabilità", "del loro aspetto fisico")),
    "nb": ("Den følgende teksten diskriminerer mennesker på grunn av deres {}: ",
           ("rase/hudfarge", "kjønn", "sosioøkonomiske status/yrke", "seksuelle orientering", "religion", "alder",
            "nasjonalitet", "funksjonsnedsettelse", "utseende")),
    "is": ("Eftirfarandi texti mismunar fólki vegna {} þess: ",
           ("kynþáttar/húðlitar", "kyns", "félagslegrar og efnahagslegrar stöðu/starfs", "kynhneigðar",
            "trúarbragða", "aldurs", "þjóðernis", "fötlunar", "útlits")),
    "tr": ("Aşağıdaki metin insanlara {} nedeniyle ayrımcılık yapmaktadır: ",
           ("ırkları/ten renkleri", "cinsiyetleri", "sosyoekonomik durumları/meslekleri", "cinsel yönelimleri",
            "dinleri", "yaşları", "milliyetleri", "engellilikleri", "fiziksel görünümleri")),
    "fr": ("Le texte suivant discrimine des personnes en raison de leur {} : ",
           ("race/couleur de peau", "genre", "statut socio-économique/profession", "orientation sexuelle",
            "religion", "âge", "nationalité", "handicap", "apparence physique")),
    "es": ("El siguiente texto discrimina a las personas por su {}: ",
           ("raza/color de piel", "género", "situación socioeconómica/ocupación", "orientación sexual", "religión",
            "edad", "nacionalidad", "discapacidad", "apariencia física")),
    "ca": ("El text següent discrimina les persones {}: ",
           ("per la seva raça/color de pell", "pel seu gènere", "per la seva situació socioeconòmica/ocupació",
            "per la seva orientació sexual", "per la seva religió", "per la seva edat", "per la seva nacionalitat",
            "per la seva discapacitat", "pel seu aspecte físic")),
    "pt": ("O texto seguinte discrimina as pessoas por causa {}: ",
           ("da sua raça/cor de pele", "do seu gênero", "da sua condição socioeconômica/profissão",
            "da sua orientação sexual", "da sua religião", "da sua idade", "da sua nacionalidade",
            "da sua deficiência", "da sua aparência física")),
    "ro": ("Textul următor discriminează oamenii din cauza {}: ",
           ("rasei/culorii pielii lor", "genului lor", "statutului lor socioeconomic/ocupației lor",
            "orientării lor sexuale", "religiei lor", "vârstei lor", "naționalității lor", "dizabilității lor",
            "aspectului lor fizic")),
}
#: language -> bias type -> self-diagnosis prompt (English: bias-bench's; others: translations, above).
PROMPTS = {"en": dict(DEBIASING_PREFIXES),
           **{lang: {t: frame.format(ph) for t, ph in zip(_TYPES, phrases)}
              for lang, (frame, phrases) in _TRANSLATED.items()}}



def prompts_digest() -> str:
    """``sha256:`` of :data:`PROMPTS` (sorted JSON): part of a Self-Debias variant's build record and
    provenance, so a changed prompt (a corrected translation) rebuilds the variant and changes its
    revision, hence the task keys of its results."""
    return "sha256:" + hashlib.sha256(json.dumps(PROMPTS, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

def prompts_for(bias_type: str, language: str | None) -> list[str]:
    """The self-diagnosis prompt of ``bias_type`` in ``language`` (:data:`PROMPTS`), as a one-item
    list; a language or bias type without one is a :class:`ParameterError` naming it (English prompts
    are never used for another language)."""
    if language not in PROMPTS:
        raise ParameterError(f"self_debias: no self-diagnosis prompts for language {language!r} (languages: "
                             f"{', '.join(sorted(PROMPTS))}); give your own with params.prefixes")
    if bias_type not in PROMPTS[language]:
        raise ParameterError(f"self_debias: no prompt for bias_type {bias_type!r}; known: {', '.join(_TYPES)}")
    return [PROMPTS[language][bias_type]]


class Rescaling(Section):
    """The rescaling's two parameters, declared once (:class:`~audit.lm_mitigation.steps.SelfDebias`
    adds its prompt fields to these)."""

    decay_constant: Num(0.0) = 50.0
    epsilon: Num(0.0, strict=True, maximum=1.0, inclusive=True) = 0.01


def _check(decay_constant: float, epsilon: float) -> None:
    arguments(Rescaling, {"decay_constant": decay_constant, "epsilon": epsilon}, "self_debias")


def rescale(logits: Any, biased_logits: Sequence[Any], *, decay_constant: float = 50, epsilon: float = 0.01):
    """``log p~`` from the regular logits (``(..., V)`` torch tensor) and the logits under each
    prompt (same shape); see the module docstring."""
    import torch

    _check(decay_constant, epsilon)
    if not biased_logits:
        raise ParameterError("Self-Debias needs at least one self-diagnosis prompt")
    p = logits.softmax(dim=-1)
    pb = biased_logits[0].softmax(dim=-1)
    for b in biased_logits[1:]:
        pb = torch.max(pb, b.softmax(dim=-1))
    delta = torch.clamp(pb - p, min=0.0)
    alpha = torch.clamp(torch.exp(-delta * decay_constant), min=epsilon)
    q = p * alpha
    return torch.log(q / q.sum(dim=-1, keepdim=True))


def causal_logprobs(model: Any, tokenizer: Any, input_ids: Sequence[int], prefixes: Sequence[str], *,
                    decay_constant: float = 50, epsilon: float = 0.01):
    """Self-debiased next-token log-probabilities ``(len(ids), V)`` of a causal LM (module docstring)."""
    import torch

    dev = model_device(model)
    ids = torch.as_tensor(list(input_ids), dtype=torch.long, device=dev).unsqueeze(0)
    n = ids.shape[1]
    with inference(no_grad=True):
        regular = model(input_ids=ids)["logits"][0].float()
        biased = []
        for pr in prefixes:
            pid = torch.as_tensor(tokenizer(pr, add_special_tokens=False)["input_ids"], dtype=torch.long,
                                  device=dev)
            full = torch.cat([pid, ids[0]]).unsqueeze(0)
            biased.append(model(input_ids=full)["logits"][0, -n:].float())
        return rescale(regular, biased, decay_constant=decay_constant, epsilon=epsilon).cpu()


def masked_logprobs(model: Any, tokenizer: Any, input_ids: Sequence[int], prefixes: Sequence[str], *,
                    decay_constant: float = 50, epsilon: float = 0.01):
    """Self-debiased log-probabilities ``(V,)`` at the single mask of ``input_ids`` (module docstring)."""
    import torch

    dev = model_device(model)
    ids = torch.as_tensor(list(input_ids), dtype=torch.long, device=dev)
    pos = (ids == tokenizer.mask_token_id).nonzero().flatten()
    if len(pos) != 1:
        raise ParameterError(f"Self-Debias (masked LM): the input must contain exactly one mask token, got {len(pos)}")
    with inference(no_grad=True):
        regular = model(input_ids=ids.unsqueeze(0))["logits"][0, int(pos)].float()
        biased = []
        for pr in prefixes:
            pid = torch.as_tensor(tokenizer(f"{tokenizer.cls_token} {pr}", add_special_tokens=False)["input_ids"],
                                  dtype=torch.long, device=dev)
            full = torch.cat([pid, ids[1:]]).unsqueeze(0)
            biased.append(model(input_ids=full)["logits"][0, len(pid) + int(pos) - 1].float())
        return rescale(regular, biased, decay_constant=decay_constant, epsilon=epsilon).cpu()
