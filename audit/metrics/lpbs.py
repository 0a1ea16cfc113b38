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

import math

import numpy as np
import pandas as pd

from audit.errors import DataError
from audit.metrics.sets import check_set_sizes
from audit.result import MetricOutput
from audit.stats import (
    DEFAULT_P_CONVENTION,
    STREAMS,
    check_bootstrap,
    effect_size_bootstrap,
    fresh_seed,
    permutation_test,
    stream,
)

__all__ = ["lpbs_attribute_scores", "lpbs_metric"]

# --------------------------------------------------------------------------- analyse


def lpbs_attribute_scores(table: pd.DataFrame) -> pd.DataFrame:
    """Per-attribute log bias score ``score(a)`` (see the module docstring).

    Returns one row per attribute word, attribute set order then word order: ``attribute_set``
    (0 = A, 1 = B), ``attribute_set_name``, ``attribute``, ``score``, ``n_cells``.

    Raises
    ------
    DataError
        Missing columns, non-finite ILP (row named), a cell lacking one of the target sets
        for an attribute, not exactly two attribute and target sets, an attribute set with
        fewer than :data:`audit.metrics.sets.MIN_SET_SIZE` words (the permutation test and the
        bootstrap resample the attribute words; a target set may be one word, as Kurita et al.'s
        *he* / *she*).
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
    sets = [out[out["attribute_set"] == j] for j in (0, 1)]
    check_set_sizes([], [s["score"].to_numpy() for s in sets],
                    {f"attribute{j}": list(s["attribute"]) for j, s in enumerate(sets)},
                    {f"attribute{j}": str(s["attribute_set_name"].iloc[0]) for j, s in enumerate(sets)})
    return out[["attribute_set", "attribute_set_name", "attribute", "score", "n_cells"]]


def lpbs_metric(table: pd.DataFrame, *, permutations: str | int = "auto", seed: int | None = None,
                alternative: str = "two-sided", n_bootstrap: int = 1000,
                confidence: float = 0.95, p_convention: str = DEFAULT_P_CONVENTION) -> MetricOutput:
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
    p_convention : {"phipson_smyth", "caliskan"}, default "phipson_smyth"
        What the permutation test counts as extreme (:mod:`audit.stats`; the default counts
        the observed partition, so p is never 0).

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
        mean_B), ``mean_a``, ``mean_b``, ``std`` (ddof=0), ``ddof``, ``p_value``, ``p_method``,
        ``p_convention``, ``p_min`` (smallest attainable p), ``p_note``,
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
    check_bootstrap(n_bootstrap, confidence)
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
                            seed=stream(seed, "permutation"), p_convention=p_convention)
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
        "p_method": perm.method,
        "p_convention": perm.convention,
        "p_min": perm.p_min,
        "p_note": perm.note,
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
