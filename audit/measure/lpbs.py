"""LPBS measure step: the sentences of a test's LPBS design and their log-probabilities under a
masked LM (Kurita et al. 2019) or a causal LM (the autoregressive form below). Definitions,
conventions and the analysis (unchanged for both kinds) are in :mod:`audit.metrics.lpbs`.

Causal LMs (autoregressive form of the increased log probability)
-----------------------------------------------------------------
A causal LM conditions only on the text to the left, so the word that comes *later* in the
filled template is scored and the word that comes earlier is conditioned on. For a template
``tau`` filled with target ``t`` and attribute ``a`` into sentence ``s``, let ``w`` be the later
of the two words (the *scored* word, recorded in column ``scored``), ``v`` the earlier one (the
*conditioning* word), ``P_v`` the text of ``s`` before ``w`` and ``P_0`` the same text with ``v``
deleted (the neutral prior: the model is not told ``v``):

* ``logp_target = log P(w | P_v) = sum_{k} log P(w_k | P_v, w_<k)``,
* ``logp_prior  = log P(w | P_0)``,
* ``ilp = logp_target - logp_prior``,

from the model interface's ``loglikelihood`` (:func:`audit.backends.hf_scoring.continuation_loglik`:
start token first; the whitespace
before ``w`` belongs to the continuation, as in lm-evaluation-harness; everything after ``w`` is
ignored, a causal LM's probability of ``w`` does not depend on it). A multi-token word gets its
joint probability by the chain rule (each subtoken given the previous ones), where the masked
form scores each subtoken with the whole span masked.

Which side is conditioned on: templates where the target comes first (``TARGET is
ATTRIBUTE.``; most English, German, French and Turkish templates) score the *attribute* given
the target, ``log P(a | t) - log P(a)``; templates where the attribute comes first (``Bij het
woord ATTRIBUTE denk ik aan TARGET.``: Dutch, Italian, Norwegian, Icelandic) score the *target*
given the attribute, ``log P(t | a) - log P(t)``, which is Kurita et al.'s own direction. Both
estimate the same quantity, the pointwise mutual information of target and attribute in the
template, since ``log P(a | t) - log P(a) = log P(t | a) - log P(t)`` (Bayes' rule; Church &
Hanks 1990, "Word association norms, mutual information, and lexicography", Comput. Linguist.
16(1)), so the analysis -- per-attribute log bias score, effect size and permutation test of
:mod:`audit.metrics.lpbs` -- reads the table the same way for both kinds. The prior cancels in
the effect size: in attribute-scored cells it depends only on ``a`` and cancels in the
difference of the two target sets; in target-scored cells it depends only on ``t`` and shifts
every attribute's score by the same constant. It is kept so that ``ilp`` reads as Kurita's
increased log probability.

Deleting ``v``: the text before ``v`` keeps its words, the text between ``v`` and ``w`` follows
with one space between them (none before punctuation), e.g. ``"he is"`` -> ``"is"``, ``"Quando
sento la parola ciao, penso a"`` -> ``"Quando sento la parola, penso a"``; when nothing is left
the prior is the start token alone. References: Kurita, Vyas, Pareek, Black & Tsvetkov (2019),
"Measuring Bias in Contextualized Word Representations", GeBNLP; the autoregressive reading of
the log-probability bias score as in Nadeem, Bethke & Reddy (2021), "StereoSet", ACL (scoring a
causal LM's continuation given its context) and lm-evaluation-harness's continuation scoring.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from audit.backends.chat import CHAT_PARAMS, chat_handle, chat_info
from audit.backends.hf_scoring import check_start
from audit.datasets.bias import parse_bias_lpbs
from audit.datasets.templates import LPBS_USE, fill_lpbs, number_forms
from audit.entries import Family, Measurement, Metric
from audit.errors import DataError, ModelError, ParameterError
from audit.measure.options import CAUSAL_ONLY, START_TOKEN, start_info, start_token_of
from audit.measure.words import set_names
from audit.suites import WordTest

__all__ = ["DEFAULT_TEMPLATES", "TABLE_COLUMNS", "CAUSAL_COLUMNS", "LPBSDesign", "lpbs_design", "lpbs_sentences",
           "lpbs_scores", "causal_requests", "delete_span"]

#: Used only for English tests that define no LPBS templates (Kurita et al.'s template).
DEFAULT_TEMPLATES = {"singular": ("TARGET is ATTRIBUTE.",), "plural": ("TARGET are ATTRIBUTE.",)}

#: Columns of the measurement table (one row per target, attribute, template).
TABLE_COLUMNS = ("target_set", "target_set_name", "target", "form", "template", "attribute_set",
                 "attribute_set_name", "attribute", "sentence", "logp_target", "logp_prior", "ilp",
                 "n_target_tokens", "n_attribute_tokens")
#: Extra columns of the causal-LM table: which word was scored (``target``/``attribute``), the
#: number of scored tokens, and the conditioning and prior prefixes.
CAUSAL_COLUMNS = ("scored", "n_scored_tokens", "prefix", "prior_prefix")


@dataclasses.dataclass(frozen=True)
class LPBSDesign:
    """What LPBS needs from a test.

    targets:    two dicts form -> target words (``{"singular": (...), "plural": (...)}``).
    attributes: two tuples of attribute words (A, B).
    templates:  form -> templates with ``TARGET`` and ``ATTRIBUTE``.
    target_names / attribute_names: set names.
    """

    name: str
    targets: tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]
    attributes: tuple[tuple[str, ...], tuple[str, ...]]
    templates: dict[str, tuple[str, ...]]
    target_names: tuple[str, str] = ("target0", "target1")
    attribute_names: tuple[str, str] = ("attribute0", "attribute1")
    templates_source: str = "test"

    def cells(self, forms: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """``(form, template)`` pairs usable with both target sets, in definition order."""
        out = []
        for f, ts in self.templates.items():
            if forms is not None and f not in forms:
                continue
            if self.targets[0].get(f) and self.targets[1].get(f):
                out += [(f, t) for t in ts]
        return out


# --------------------------------------------------------------------------- design


def _words(x: Any, where: str) -> tuple[str, ...]:
    if isinstance(x, str):
        x = [x]
    if not isinstance(x, (list, tuple)) or not all(isinstance(w, str) and w.strip() for w in x):
        raise DataError(f"{where}: expected a list of non-empty words, got {x!r}")
    return tuple(w.strip() for w in x)


def _templates(raw: Any, where: str) -> dict[str, tuple[str, ...]]:
    if isinstance(raw, (list, tuple, str)):
        raw = {"any": raw}
    if not isinstance(raw, Mapping) or not raw:
        raise DataError(f"{where}: LPBS templates must be a list or a mapping form -> list, got {raw!r}")
    out = {}
    for form, ts in raw.items():
        ts = _words(ts, f"{where}[{form!r}]")
        for t in ts:
            if t.count("TARGET") != 1 or t.count("ATTRIBUTE") != 1:
                raise DataError(f"{where}[{form!r}]: template {t!r} must contain TARGET and ATTRIBUTE "
                                "exactly once each")
        out[str(form)] = ts
    return out


def _forms_of_set(words: tuple[str, ...], forms: Mapping[str, Any], template_forms: Sequence[str],
                  where: str) -> dict[str, tuple[str, ...]]:
    """Target words per template form for one target set: :func:`audit.datasets.number_forms`
    (duplicates dropped); template forms other than singular/plural (a plain template list)
    take every word."""
    by_number = number_forms(words, forms, where)
    sing, plur = by_number["singular"], by_number["plural"]
    out = {"singular": tuple(dict.fromkeys(sing)), "plural": tuple(dict.fromkeys(plur))}
    for f in template_forms:
        if f not in out:
            out[f] = tuple(dict.fromkeys(sing + plur))
    return {f: ws for f, ws in out.items() if ws}


def lpbs_design(test: Any, *, templates: Any = None) -> LPBSDesign:
    """Normalise a test definition for LPBS.

    Accepts an :class:`audit.suites.WordTest` or a mapping in the BIAS Detection Framework's
    LPBS layout (``targ1``/``targ2`` with ``singular``/``plural`` lists, ``attr1``/``attr2``,
    ``templates`` with ``singular``/``plural`` lists).

    For a ``WordTest``: templates from ``test.templates["lpbs"]`` (a mapping form -> list, or a
    plain list used with every target word); English tests without LPBS templates fall back to
    :data:`DEFAULT_TEMPLATES` (other languages: DataError). Target words per number follow
    :mod:`audit.datasets` (``extra["forms"]``, word -> ``{"plural": ...}`` or
    ``{"number": "plural"}``): a set's words are singular unless marked plural; its plural
    words are their plural forms (so the sentences are those of
    :func:`audit.datasets.lpbs_items`). ``templates`` overrides the test's templates (a mapping
    form -> list, or a plain list used with every target word).

    Raises
    ------
    DataError
        Not exactly two target and two attribute sets, empty sets, a template without exactly
        one TARGET and one ATTRIBUTE, no template form usable with both target sets.
    """
    if isinstance(test, Mapping):  # the BIAS layout, read by the one BIAS LPBS reader
        test = parse_bias_lpbs(test, name=str(test.get("name", "LPBS test")), language=str(test.get("language", "en")))
    design = _design_from_wordtest(test, templates)
    if not design.cells():
        raise DataError(f"LPBS test {design.name!r}: no template form ({', '.join(design.templates)}) "
                        f"has target words in both target sets (forms: {sorted(design.targets[0])}, "
                        f"{sorted(design.targets[1])})")
    return design


def _design_from_wordtest(test: Any, templates: Any) -> LPBSDesign:
    where = f"test {getattr(test, 'name', '?')!r}"
    ts, at = getattr(test, "targets", None), getattr(test, "attributes", None)
    if ts is None or at is None:
        raise ParameterError(f"LPBS needs a WordTest or an LPBS mapping, got {type(test).__name__}")
    if len(ts) != 2 or len(at) != 2:
        raise DataError(f"{where}: LPBS needs exactly 2 target and 2 attribute sets, "
                        f"got {len(ts)} and {len(at)}")
    if templates is not None:
        raw, source = templates, "given"
    else:
        raw, source = (getattr(test, "templates", None) or {}).get(LPBS_USE), "test"
    if raw is None:
        if getattr(test, "language", "en") != "en":
            raise DataError(f"{where}: no LPBS templates (templates.lpbs) for language "
                            f"{test.language!r}; add some to the test definition")
        raw, source = DEFAULT_TEMPLATES, "default"
    tmpl = _templates(raw, f"{where}: templates.lpbs")
    forms = (getattr(test, "extra", None) or {}).get("forms") or {}
    if not isinstance(forms, Mapping):
        raise DataError(f"{where}: extra field forms must be a mapping word -> forms")
    targets = tuple(_forms_of_set(_words(list(s.words), f"{where}: target set {s.name!r}"),
                                  forms, list(tmpl), where) for s in ts)
    attrs = tuple(_words(list(s.words), f"{where}: attribute set {s.name!r}") for s in at)
    return LPBSDesign(str(getattr(test, "name", "")), (targets[0], targets[1]), (attrs[0], attrs[1]),
                      tmpl, (ts[0].name, ts[1].name), (at[0].name, at[1].name), source)


def lpbs_sentences(design: LPBSDesign, *, forms: Sequence[str] | None = None) -> pd.DataFrame:
    """Every (target, attribute, template) combination with its filled sentence and the
    character spans of target and attribute (columns of :data:`TABLE_COLUMNS` up to
    ``sentence``, plus ``target_span`` and ``attribute_span``)."""
    rows = []
    for form, tmpl in design.cells(forms):
        for ti in (0, 1):
            for t in design.targets[ti][form]:
                for ai in (0, 1):
                    for a in design.attributes[ai]:
                        s, ts, as_ = fill_lpbs(tmpl, t, a)
                        rows.append((ti, design.target_names[ti], t, form, tmpl, ai,
                                     design.attribute_names[ai], a, s, ts, as_))
    return pd.DataFrame(rows, columns=[*TABLE_COLUMNS[:9], "target_span", "attribute_span"])


# --------------------------------------------------------------------------- measure


def delete_span(text: str, span: tuple[int, int]) -> str:
    """``text`` without the characters of ``span`` (a word), joined with one space (none before
    punctuation, nothing at the start): the neutral prior's prefix of causal LPBS."""
    left, right = text[: span[0]], text[span[1]:]
    if not left.strip():
        return right.lstrip()
    if not right.strip():
        return left.rstrip()
    if right[:1].isspace():
        return left.rstrip() + " " + right.lstrip()
    if not right[:1].isalnum():  # punctuation right after the word
        return left.rstrip() + right
    return left + right


def causal_requests(sentence: str, target_span: tuple[int, int], attribute_span: tuple[int, int]
                    ) -> tuple[str, tuple[str, str], tuple[str, str]]:
    """``(scored, (prefix, continuation), (prior_prefix, continuation))`` of one LPBS sentence for
    a causal LM: the later word is scored given the text before it, and given that text with the
    earlier word deleted (:func:`delete_span`). The whitespace before the scored word is part of
    the continuation."""
    if target_span[0] < attribute_span[0]:
        scored, (a, b), cond = "attribute", attribute_span, target_span
    else:
        scored, (a, b), cond = "target", target_span, attribute_span
    before = sentence[:a]
    ws = before[len(before.rstrip()):]
    cont = ws + sentence[a:b]
    prefix = before[: len(before) - len(ws)]
    prior = delete_span(before, cond)
    prior = prior[: len(prior.rstrip())] if prior.strip() else ""
    return scored, (prefix, cont), (prior, cont)


def lpbs_scores(hf_model: Any, test: Any, *, batch_size: int | None = None,
                forms: Sequence[str] | None = None, templates: Any = None,
                start_token: str = START_TOKEN) -> pd.DataFrame:
    """Measure step: ``log p_tgt``, ``log p_prior`` and ILP of every (target, attribute,
    template) of the test, with a masked LM (Kurita et al.) or a causal LM (the autoregressive
    form of the module docstring).

    Parameters
    ----------
    hf_model : :class:`audit.backends.hf.HFModel` with ``kind`` ``"mlm"`` or ``"causal"``.
    test : WordTest or BIAS-layout mapping (see :func:`lpbs_design`).
    batch_size : sequences per forward pass (default: 128 on CPU, 512 on CUDA, halved on CUDA OOM).
    forms : optional subset of template forms to use (``("singular",)`` = BIAS framework).
    templates : optional templates overriding the test's.
    start_token : causal LMs' start-token rule, ``"always"`` (default) or ``"harness"``
        (:mod:`audit.measure.options`); masked LMs: no effect.

    Returns
    -------
    DataFrame with :data:`TABLE_COLUMNS` (causal LMs: plus :data:`CAUSAL_COLUMNS`);
    ``attrs["design"]`` holds the set names, template source and cells (and ``variant``:
    ``masked`` or ``causal``).

    Raises
    ------
    ModelError
        The model is neither a masked nor a causal LM.
    DataError
        Bad test definition; a sentence too long; a target or attribute mapping to no token,
        or target and attribute sharing a token.
    """

    check_start(start_token, "start_token")
    kind = getattr(hf_model, "kind", None)
    if kind not in ("mlm", "causal"):
        raise ModelError(f"model {getattr(hf_model, 'ref', hf_model)!r} is loaded as kind={kind!r}; "
                         "LPBS needs a masked LM (kind='mlm') or a causal LM (kind='causal')")
    design = lpbs_design(test, templates=templates)
    if forms is not None:
        forms = [forms] if isinstance(forms, str) else list(forms)
        unknown = [f for f in forms if f not in design.templates]
        if unknown:
            raise ParameterError(f"forms: {unknown} not among the test's template forms {list(design.templates)}")
        if not design.cells(forms):
            raise DataError(f"test {design.name!r}: no template of form(s) {forms} has targets in both sets")
    rows = lpbs_sentences(design, forms=forms)
    if kind == "causal":
        out = _causal_scores(hf_model, rows, batch_size, start_token)
    else:
        out = _masked_scores(hf_model, rows, batch_size)
    out.attrs["design"] = {"name": design.name, "target_names": list(design.target_names),
                           "attribute_names": list(design.attribute_names),
                           "templates_source": design.templates_source,
                           "templates": {f: list(t) for f, t in design.templates.items()},
                           "variant": "causal" if kind == "causal" else "masked"}
    return out


def _token_counts(model: Any, rows: pd.DataFrame) -> tuple[list[int], list[int]]:
    """Tokens of the target and of the attribute in each sentence (by character offsets);
    :class:`DataError` when they share a token."""
    n_t, n_a = [], []
    for s, ts, as_ in zip(rows["sentence"], rows["target_span"], rows["attribute_span"]):
        tpos, apos = model.token_positions(s, [ts, as_])
        if set(tpos) & set(apos):
            raise DataError(f"LPBS sentence {s!r}: target and attribute share a token; "
                            "separate them in the template")
        n_t.append(len(tpos))
        n_a.append(len(apos))
    return n_t, n_a


def _causal_scores(hf_model: Any, rows: pd.DataFrame, batch_size: int | None,
                   start_token: str = START_TOKEN) -> pd.DataFrame:
    """Causal-LM columns of the LPBS table (module docstring): one target and one prior request
    per sentence, scored in one batched :func:`continuation_loglik` call."""
    n_t, n_a = _token_counts(hf_model, rows)
    scored, reqs, prefixes, priors = [], [], [], []
    for s, ts, as_ in zip(rows["sentence"], rows["target_span"], rows["attribute_span"]):
        side, req, prior = causal_requests(s, tuple(ts), tuple(as_))
        scored.append(side)
        reqs += [req, prior]
        prefixes.append(req[0])
        priors.append(prior[0])
    try:
        ll, n = hf_model.loglikelihood(reqs, batch_size=batch_size, start=start_token)
    except DataError as e:
        raise DataError(f"LPBS: {e}") from None
    out = rows.drop(columns=["target_span", "attribute_span"]).copy()
    out["logp_target"] = ll[0::2]
    out["logp_prior"] = ll[1::2]
    out["ilp"] = ll[0::2] - ll[1::2]
    out["n_target_tokens"] = np.array(n_t, dtype=np.int64)
    out["n_attribute_tokens"] = np.array(n_a, dtype=np.int64)
    out["scored"] = scored
    out["n_scored_tokens"] = n[0::2]
    out["prefix"] = prefixes
    out["prior_prefix"] = priors
    return out


def _masked_scores(hf_model: Any, rows: pd.DataFrame, batch_size: int | None) -> pd.DataFrame:
    """Masked-LM columns of the LPBS table (Kurita et al.; :mod:`audit.metrics.lpbs`)."""
    n_t, n_a = _token_counts(hf_model, rows)
    reqs = []
    for s, ts, as_ in zip(rows["sentence"], rows["target_span"], rows["attribute_span"]):
        reqs += [(s, tuple(ts), ()), (s, tuple(ts), (tuple(as_),))]
    try:
        lp = hf_model.masked_scores(reqs, batch_size=batch_size)
    except DataError as e:
        raise DataError(f"LPBS {e}") from None
    lt = np.array([float(v.sum()) for v in lp[0::2]], dtype=np.float64)
    lpr = np.array([float(v.sum()) for v in lp[1::2]], dtype=np.float64)
    out = rows.drop(columns=["target_span", "attribute_span"]).copy()
    out["logp_target"] = lt
    out["logp_prior"] = lpr
    out["ilp"] = lt - lpr
    out["n_target_tokens"] = np.array(n_t, dtype=np.int64)
    out["n_attribute_tokens"] = np.array(n_a, dtype=np.int64)
    return out


def measure_lpbs(model, test, metric: Metric, mp: Mapping[str, Any], ap: Mapping[str, Any]) -> Measurement:
    """The LPBS table of a test (:func:`lpbs_scores`)."""
    handle = chat_handle(model.handle, mp)
    table = lpbs_scores(handle, test, batch_size=mp["batch_size"], forms=mp["forms"],
                        start_token=start_token_of(mp))
    return Measurement(family=LPBS_SCORES.name, table=table, set_names=set_names(test),
                       info={**start_info(model.kind, mp), **chat_info(handle)})


def _needs_lpbs(test: WordTest) -> str | None:
    has_words = all(s.words for s in (*test.targets, *test.attributes))
    return None if (test.templates.get(LPBS_USE) and has_words) else f"test {test.name} has no LPBS templates"


def _method(kind: str, params: Mapping[str, Any]) -> str:
    return "causal-lm-continuation-probability" if kind == "causal" else "masked-lm-probability"


#: Log-probabilities of words in LPBS templates: masked LMs (Kurita et al.) and causal LMs
#: (the later word given the earlier one, against the prior without it; module docstring).
LPBS_SCORES = Family(
    name="lpbs",
    kinds=("mlm", "causal"),
    test_type="words",
    measure=measure_lpbs,
    params={"batch_size": None, "forms": None, "start_token": START_TOKEN, **CHAT_PARAMS},
    ignored_by=CAUSAL_ONLY,
    method=_method,
    needs=_needs_lpbs,
    description="masked LMs: log P(target | template with target masked) minus the prior with the "
                "attribute masked too (Kurita et al. 2019); causal LMs: log P(later word | text "
                "before it) minus the same with the earlier word deleted",
)
