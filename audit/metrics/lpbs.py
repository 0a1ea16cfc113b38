"""LPBS: log-probability bias score of a masked LM (Kurita, Vyas, Pareek, Black & Tsvetkov 2019,
"Measuring Bias in Contextualized Word Representations"), as in the BIAS Detection Framework
(BFH-AMI/BIAS, ``BiasDetection/metrics.py``, class ``LPBS``), with the differences listed below.

Definitions
-----------
For a template ``tau`` with placeholders ``TARGET`` and ``ATTRIBUTE`` (e.g. "TARGET likes
ATTRIBUTE."), a target word ``t`` and an attribute word ``a``, let ``s`` be ``tau`` with both
placeholders filled (words inserted as written, no re-casing). With ``T`` the token positions
of ``t`` in ``s`` and ``A`` those of ``a`` (found by character offsets):

* ``log p_tgt(t, a, tau)   = sum_{i in T} log P(s_i | s with T masked)``;
* ``log p_prior(t, a, tau) = sum_{i in T} log P(s_i | s with T and A masked)``;
* ``ILP(t, a, tau) = log p_tgt - log p_prior`` (the *increased log probability*).

A target split into several subtokens is masked as a whole (one mask token per subtoken, one
forward pass) and scored by the sum of its subtokens' log-probabilities; the attribute is masked
as a whole for the prior (one mask per subtoken, so the prior sentence has the same length and
positions as the target sentence).

Per attribute word ``a`` (Kurita's log bias score, averaged):
``score(a) = mean over cells (f, tau) of [ mean_{t in T1_f} ILP(t, a, tau)
- mean_{t in T2_f} ILP(t, a, tau) ]`` where a *cell* is a template ``tau`` of grammatical form
``f`` (``singular``/``plural``) and ``T1_f``/``T2_f`` are the forms ``f`` of the two target
sets. Every template weighs the same, whatever the number of target words of its form.

Effect size over attribute words (BIAS ``effect_size_log``):
``d = (mean_{a in A} score(a) - mean_{b in B} score(b)) / std_{A u B}(score)`` with the
population standard deviation (``ddof=0``, numpy's ``np.std`` as in the BIAS framework).

Sign: ``d > 0`` when the attribute words of A raise the probability of the first target set's
words (relative to the second's) more than those of B do.

p-value: permutation test over re-partitions of the attribute words A u B into groups of sizes
|A| and |B| (targets fixed), via :func:`audit.stats.permutation_test` on the scores (A first),
exact when feasible (``permutations="auto"``), **two-sided** by default (Kurita et al. report a
two-sided test; see :mod:`audit.stats` for the tie and p-value conventions).

Differences from the BIAS framework (deliberate)
------------------------------------------------
* BIAS replaces the target by a single ``[MASK]`` and multiplies the probabilities of all the
  target's subtokens *at that one position*; here the whole span is masked (Kurita et al.'s
  intent for multi-token words) and each subtoken is scored at its own position. Identical for
  single-token targets.
* BIAS uses only the singular templates and singular target forms (plural code commented out);
  here every form present in both the templates and the target sets is used
  (``forms=("singular",)`` reproduces BIAS). BIAS pairs the targets ``zip(T1, T2)``; with equal
  set sizes its mean of paired differences equals the difference of means used here.
* BIAS's p-value is one-sided (``test_stat > observed``, count started at 1, divided by the
  number of samples); here the two-sided exact/sampled test of :mod:`audit.stats`
  (``alternative="greater"`` gives the one-sided version with the standard conventions).
* BIAS's prior masks the attribute with one ``[MASK]`` whatever its length; here one per
  subtoken.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from audit.errors import DataError, ModelError, ParameterError
from audit.result import MetricOutput
from audit.stats import STREAMS, effect_size_bootstrap, fresh_seed, permutation_test, stream

__all__ = [
    "DEFAULT_TEMPLATES",
    "LPBSDesign",
    "lpbs_design",
    "lpbs_sentences",
    "lpbs_scores",
    "lpbs_attribute_scores",
    "lpbs_metric",
]

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
    """Target words per grammatical number for one target set, with the word-form convention
    of :mod:`audit.datasets` (``extra["forms"]``: word -> ``{"plural": str | [str, ...]}`` or
    ``{"number": "plural"}``; other keys ignored): singular = the set's words not marked
    plural; plural = in word order, the plural forms of the words and the words marked plural.
    Template forms other than singular/plural (a plain template list) take every word."""
    sing: list[str] = []
    plur: list[str] = []
    for w in words:
        info = forms.get(w) or {}
        if not isinstance(info, Mapping):
            raise DataError(f"{where}: forms of {w!r} must be a mapping (e.g. {{'plural': 'flowers'}})")
        if info.get("number") == "plural":
            plur.append(w)
            continue
        sing.append(w)
        p = info.get("plural")
        if p is not None:
            plur += list(_words(p, f"{where}: forms.{w}.plural"))
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
    design = _design_from_mapping(test, templates) if isinstance(test, Mapping) else \
        _design_from_wordtest(test, templates)
    if not design.cells():
        raise DataError(f"LPBS test {design.name!r}: no template form ({', '.join(design.templates)}) "
                        f"has target words in both target sets (forms: {sorted(design.targets[0])}, "
                        f"{sorted(design.targets[1])})")
    return design


def _design_from_mapping(test: Mapping[str, Any], templates: Any) -> LPBSDesign:
    """BIAS LPBS layout: targ1/targ2 = {singular: [...], plural: [...]} (or a plain list),
    attr1/attr2 = lists, templates = {singular: [...], plural: [...]}."""
    where = str(test.get("name", "LPBS test"))
    for k in ("targ1", "targ2", "attr1", "attr2"):
        if k not in test:
            raise DataError(f"{where}: field {k!r} is missing (LPBS layout: targ1, targ2, attr1, "
                            "attr2, templates)")
    if templates is not None:
        raw, source = templates, "given"
    elif "templates" in test:
        raw, source = test["templates"], "test"
    else:
        raw, source = DEFAULT_TEMPLATES, "default"
    tmpl = _templates(raw, f"{where}: templates")
    targets = []
    for k in ("targ1", "targ2"):
        v = test[k]
        if isinstance(v, Mapping):
            targets.append({str(f): _words(ws, f"{where}: {k}.{f}") for f, ws in v.items()})
        else:
            ws = _words(v, f"{where}: {k}")
            targets.append({f: ws for f in tmpl})
    attrs = tuple(_words(test[k], f"{where}: {k}") for k in ("attr1", "attr2"))
    return LPBSDesign(where, (targets[0], targets[1]), (attrs[0], attrs[1]), tmpl,
                      ("targ1", "targ2"), ("attr1", "attr2"), source)


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
        raw, source = (getattr(test, "templates", None) or {}).get("lpbs"), "test"
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


def _fill(template: str, target: str, attribute: str) -> tuple[str, tuple[int, int], tuple[int, int]]:
    """Sentence and the character spans of the target and the attribute in it."""
    parts: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    rest, pos = template, 0
    while rest:
        i_t, i_a = rest.find("TARGET"), rest.find("ATTRIBUTE")
        cands = [(i, k) for i, k in ((i_t, "TARGET"), (i_a, "ATTRIBUTE")) if i >= 0]
        if not cands:
            parts.append(rest)
            break
        i, key = min(cands)
        parts.append(rest[:i])
        pos += i
        word = target if key == "TARGET" else attribute
        spans[key] = (pos, pos + len(word))
        parts.append(word)
        pos += len(word)
        rest = rest[i + len(key):]
    return "".join(parts), spans["TARGET"], spans["ATTRIBUTE"]


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
                        s, ts, as_ = _fill(tmpl, t, a)
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
    from audit.lm_scoring import MaskedQuery, masked_token_logprobs, max_sequence_length, require_kind, token_spans

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


# --------------------------------------------------------------------------- analyse


def lpbs_attribute_scores(table: pd.DataFrame) -> pd.DataFrame:
    """Per-attribute log bias score ``score(a)`` (see the module docstring).

    Returns one row per attribute word, attribute set order then word order: ``attribute_set``
    (0 = A, 1 = B), ``attribute_set_name``, ``attribute``, ``score``, ``n_cells``.

    Raises
    ------
    DataError
        Missing columns, non-finite ILP (row named), a cell lacking one of the target sets
        for an attribute, not exactly two attribute and target sets.
    """
    need = ("target_set", "target", "form", "template", "attribute_set", "attribute", "ilp")
    missing = [c for c in need if c not in getattr(table, "columns", ())]
    if missing:
        raise DataError(f"LPBS table lacks column(s) {', '.join(missing)}")
    if len(table) == 0:
        raise DataError("LPBS table is empty")
    ilp = pd.to_numeric(table["ilp"], errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(ilp))
    if len(bad):
        r = table.iloc[bad[0]]
        raise DataError(f"LPBS table: ilp is not finite for target {r['target']!r}, attribute "
                        f"{r['attribute']!r}, template {r['template']!r}")
    if sorted(set(table["target_set"])) != [0, 1] or sorted(set(table["attribute_set"])) != [0, 1]:
        raise DataError("LPBS table: target_set and attribute_set must each take the values 0 and 1")
    t = table.assign(ilp=ilp)
    if "attribute_set_name" not in t.columns:
        t = t.assign(attribute_set_name=t["attribute_set"].map({0: "attribute0", 1: "attribute1"}))
    # mean ILP per (attribute, cell, target set), then difference per cell, then mean over cells
    keys = ["attribute_set", "attribute", "form", "template"]
    m = t.groupby(keys + ["target_set"], sort=False)["ilp"].mean().unstack("target_set")
    if m[[0, 1]].isna().any().any():
        k = m.index[m[[0, 1]].isna().any(axis=1)][0]
        raise DataError(f"LPBS table: attribute {k[1]!r}, template {k[3]!r} lacks one target set")
    diff = (m[0] - m[1]).rename("d").reset_index()
    agg = diff.groupby(["attribute_set", "attribute"], sort=False)["d"].agg(["mean", "size"])
    first = t.drop_duplicates(["attribute_set", "attribute"])[["attribute_set", "attribute_set_name", "attribute"]]
    out = first.merge(agg.reset_index(), on=["attribute_set", "attribute"], how="left")
    out = out.rename(columns={"mean": "score", "size": "n_cells"})
    out = out.sort_values("attribute_set", kind="stable").reset_index(drop=True)
    return out[["attribute_set", "attribute_set_name", "attribute", "score", "n_cells"]]


def lpbs_metric(table: pd.DataFrame, *, permutations: str | int = "auto", seed: int | None = None,
                alternative: str = "two-sided", n_bootstrap: int = 1000,
                confidence: float = 0.95) -> MetricOutput:
    """LPBS effect size, permutation p-value and bootstrap CI from the measurement table (pure
    analysis).

    Parameters
    ----------
    table : DataFrame from :func:`lpbs_scores` (columns ``target_set``, ``target``, ``form``,
        ``template``, ``attribute_set``, ``attribute``, ``ilp``).
    permutations : "auto", "exact" or int
        Passed to :func:`audit.stats.permutation_test` (auto: exact when feasible).
    seed : int, optional
        Seed of the task: the sampled permutations and the bootstrap draw from its
        independent streams ``permutation`` and ``bootstrap`` (children 0 and 1 of
        ``SeedSequence(seed)``, :func:`audit.stats.stream`); drawn from OS entropy and
        reported when None.
    alternative : {"two-sided", "greater", "less"}, default "two-sided".
    n_bootstrap : int, default 1000
        Resamples of the percentile bootstrap interval of ``d``; 0 disables it.
    confidence : float, default 0.95
        Level of the interval.

    The interval (``ci_method = "attributes"``) resamples the attribute words with
    replacement within A and within B, each keeping its ``score(a)``
    (:func:`audit.stats.effect_size_bootstrap`, ``ddof=0``): the target words and templates
    are held fixed, as in the permutation test, which re-partitions the attribute words.
    Resamples whose scores are all equal (``d`` undefined) are dropped and counted in
    ``ci_degenerate``.

    Returns
    -------
    MetricOutput
        ``value`` = effect size ``d``; ``fields``: ``effect_size``, ``statistic`` (mean_A -
        mean_B), ``mean_a``, ``mean_b``, ``std`` (ddof=0), ``ddof``, ``p_value``,
        ``permutation`` (method, alternative, n_partitions, n_extreme, seed: the task seed when
        sampled, else None), ``ci`` ([low, high] or None), ``ci_method``, ``ci_degenerate``,
        ``n_bootstrap``, ``confidence``, ``seed``, ``random_streams``, ``n_attributes``,
        ``n_cells``; ``items`` = per-attribute scores (``set`` = ``A``/``B``).

    Raises
    ------
    DataError
        See :func:`lpbs_attribute_scores`; all attribute scores equal (std 0: effect size
        undefined).
    ParameterError
        Bad ``permutations``/``alternative``/``seed``/``n_bootstrap``/``confidence``.
    """
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, (int, np.integer)) or n_bootstrap < 0:
        raise ParameterError(f"n_bootstrap must be an integer >= 0 (0 disables the CI), got {n_bootstrap!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating)) or not (
        0.0 < float(confidence) < 1.0
    ):
        raise ParameterError(f"confidence must be a number in (0, 1), got {confidence!r}")
    items = lpbs_attribute_scores(table)
    sa = items.loc[items["attribute_set"] == 0, "score"].to_numpy(dtype=np.float64)
    sb = items.loc[items["attribute_set"] == 1, "score"].to_numpy(dtype=np.float64)
    allv = np.concatenate([sa, sb])
    std = float(np.std(allv, ddof=0))
    mean_a, mean_b = float(sa.mean()), float(sb.mean())
    if not std > 1e-12 * (1.0 + float(np.abs(allv).max())):
        raise DataError("LPBS: every attribute word has the same score; the effect size is undefined "
                        f"(score {allv[0]!r})")
    d = (mean_a - mean_b) / std
    if seed is None:
        seed = fresh_seed()
    perm = permutation_test(allv, len(sa), alternative=alternative, permutations=permutations,
                            seed=stream(seed, "permutation"))
    ci, n_degenerate = None, 0
    if n_bootstrap > 0:
        ci, n_degenerate, _ = effect_size_bootstrap(
            sa, sb, ddof=0, n_resamples=int(n_bootstrap), confidence=float(confidence),
            seed=stream(seed, "bootstrap"),
        )
    items = items.assign(set=np.where(items["attribute_set"] == 0, "A", "B"))
    fields = {
        "effect_size": d,
        "statistic": mean_a - mean_b,
        "mean_a": mean_a,
        "mean_b": mean_b,
        "std": std,
        "ddof": 0,
        "p_value": float(perm.p_value),
        "permutation": {"method": perm.method, "alternative": perm.alternative,
                        "n_partitions": int(perm.n_partitions), "n_extreme": int(perm.n_extreme),
                        "seed": seed if perm.method == "sampled" else None},
        "ci": ci,
        "ci_method": "attributes" if n_bootstrap > 0 else None,
        "ci_degenerate": n_degenerate,
        "n_bootstrap": int(n_bootstrap),
        "confidence": float(confidence),
        "seed": seed,
        "random_streams": {k: STREAMS.index(k) for k in ("permutation", "bootstrap")},
        "n_attributes": [int(len(sa)), int(len(sb))],
        "n_cells": int(items["n_cells"].max()),
    }
    design = getattr(table, "attrs", {}).get("design")
    if design:
        fields["templates_source"] = design.get("templates_source")
    return MetricOutput(value=float(d) if math.isfinite(d) else math.nan, fields=fields, items=items)
