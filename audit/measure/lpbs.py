"""LPBS measure step: the sentences of a test's LPBS design and their masked-LM
log-probabilities (Kurita et al. 2019). Definitions, conventions and the analysis are in
:mod:`audit.metrics.lpbs`."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from audit.datasets.bias import parse_bias_lpbs
from audit.datasets.templates import LPBS_USE, fill_lpbs, number_forms
from audit.entries import Family, Measurement, Metric
from audit.errors import DataError, ModelError, ParameterError
from audit.measure.lm_scoring import MaskedQuery, masked_token_logprobs, max_sequence_length, require_kind, token_spans
from audit.measure.words import set_names
from audit.suites import WordTest

__all__ = ["DEFAULT_TEMPLATES", "TABLE_COLUMNS", "LPBSDesign", "lpbs_design", "lpbs_sentences", "lpbs_scores"]

#: Used only for English tests that define no LPBS templates (Kurita et al.'s template).
DEFAULT_TEMPLATES = {"singular": ("TARGET is ATTRIBUTE.",), "plural": ("TARGET are ATTRIBUTE.",)}

#: Columns of the measurement table (one row per target, attribute, template).
TABLE_COLUMNS = ("target_set", "target_set_name", "target", "form", "template", "attribute_set",
                 "attribute_set_name", "attribute", "sentence", "logp_target", "logp_prior", "ilp",
                 "n_target_tokens", "n_attribute_tokens")


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


def lpbs_scores(hf_model: Any, test: Any, *, batch_size: int | None = None,
                forms: Sequence[str] | None = None, templates: Any = None) -> pd.DataFrame:
    """Measure step: ``log p_tgt``, ``log p_prior`` and ILP of every (target, attribute,
    template) of the test, with a masked LM.

    Parameters
    ----------
    hf_model : :class:`audit.backends.hf.HFModel` with ``kind == "mlm"``.
    test : WordTest or BIAS-layout mapping (see :func:`lpbs_design`).
    batch_size : sequences per forward pass (default: 128 on CPU, 512 on CUDA, halved on CUDA OOM).
    forms : optional subset of template forms to use (``("singular",)`` = BIAS framework).
    templates : optional templates overriding the test's.

    Returns
    -------
    DataFrame with :data:`TABLE_COLUMNS`; ``attrs["design"]`` holds the set names, template
    source and cells.

    Raises
    ------
    ModelError
        The model is not a masked LM.
    DataError
        Bad test definition; a sentence too long; a target or attribute mapping to no token,
        or target and attribute sharing a token.
    """

    require_kind(hf_model, "mlm", "LPBS")
    design = lpbs_design(test, templates=templates)
    if forms is not None:
        forms = [forms] if isinstance(forms, str) else list(forms)
        unknown = [f for f in forms if f not in design.templates]
        if unknown:
            raise ParameterError(f"forms: {unknown} not among the test's template forms {list(design.templates)}")
        if not design.cells(forms):
            raise DataError(f"test {design.name!r}: no template of form(s) {forms} has targets in both sets")
    rows = lpbs_sentences(design, forms=forms)
    tok, model = hf_model.tokenizer, hf_model.model
    mask_id = getattr(tok, "mask_token_id", None)
    if not isinstance(mask_id, int):
        raise ModelError(f"model {getattr(hf_model, 'ref', '?')!r}: tokenizer has no mask token")
    limit = max_sequence_length(model, tok)
    queries = []
    n_t, n_a = [], []
    for s, ts, as_ in zip(rows["sentence"], rows["target_span"], rows["attribute_span"]):
        ids, (tpos, apos) = token_spans(tok, s, [ts, as_])
        if len(ids) > limit:
            raise DataError(f"LPBS sentence {s!r} has {len(ids)} tokens; the model accepts at most {limit}")
        if set(tpos) & set(apos):
            raise DataError(f"LPBS sentence {s!r}: target and attribute share a token; "
                            "separate them in the template")
        tgt = [ids[p] for p in tpos]
        m1 = list(ids)
        for p in tpos:
            m1[p] = mask_id
        m2 = list(m1)
        for p in apos:
            m2[p] = mask_id
        queries.append(MaskedQuery(tuple(m1), tuple(tpos), tuple(tgt)))
        queries.append(MaskedQuery(tuple(m2), tuple(tpos), tuple(tgt)))
        n_t.append(len(tpos))
        n_a.append(len(apos))
    lp = masked_token_logprobs(model, tok, queries, batch_size=batch_size, device=hf_model.device)
    lt = np.array([float(v.sum()) for v in lp[0::2]], dtype=np.float64)
    lpr = np.array([float(v.sum()) for v in lp[1::2]], dtype=np.float64)
    out = rows.drop(columns=["target_span", "attribute_span"]).copy()
    out["logp_target"] = lt
    out["logp_prior"] = lpr
    out["ilp"] = lt - lpr
    out["n_target_tokens"] = np.array(n_t, dtype=np.int64)
    out["n_attribute_tokens"] = np.array(n_a, dtype=np.int64)
    out.attrs["design"] = {"name": design.name, "target_names": list(design.target_names),
                           "attribute_names": list(design.attribute_names),
                           "templates_source": design.templates_source,
                           "templates": {f: list(t) for f, t in design.templates.items()}}
    return out


def measure_lpbs(model, test, metric: Metric, mp: Mapping[str, Any], ap: Mapping[str, Any]) -> Measurement:
    """The LPBS table of a test (:func:`lpbs_scores`)."""
    table = lpbs_scores(model.handle, test, batch_size=mp["batch_size"], forms=mp["forms"])
    return Measurement(family=LPBS_SCORES.name, table=table, set_names=set_names(test))


def _needs_lpbs(test: WordTest) -> str | None:
    has_words = all(s.words for s in (*test.targets, *test.attributes))
    return None if (test.templates.get(LPBS_USE) and has_words) else f"test {test.name} has no LPBS templates"


#: Masked-LM log-probabilities of target words in LPBS templates.
LPBS_SCORES = Family(
    name="lpbs",
    kinds=("mlm",),
    test_type="words",
    measure=measure_lpbs,
    params={"batch_size": None, "forms": None},
    method=lambda kind, params: "masked-lm-probability",
    needs=_needs_lpbs,
    description="log P(target | template with target masked) minus the prior with the attribute "
                "masked too (Kurita et al. 2019)",
)
