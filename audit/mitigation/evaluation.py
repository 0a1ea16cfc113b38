"""Measure what a mitigation changes with the audit's own WEAT (before/after tables).

Every number goes through the same steps as an audited task: the look-up policy of
:func:`audit.vocab.resolve_sets` (here with ``casefold=True`` so that the capitalised names of
WEAT 6 are found in uncased GloVe) and :func:`audit.metrics.weat.weat` (``ddof=1``). P-values come from a sampled permutation test
(``permutations`` partitions, ``seed``); no bootstrap interval (``n_bootstrap=0``).

Reading the table: the WEAT effect size is scale-free (difference of means over the pooled
standard deviation of the scores ``s(w, A, B)``). After Hard Debias equalises most attribute
pairs, the scores of WEAT 7/8 shrink to the residue of the pairs *not* equalised (``him`` /
``hers``), so ``d`` can stay sizeable or change sign although every association is tiny;
``mean_abs_s`` (mean |s(w, A, B)| over the target words) shows that scale.
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from audit.datasets import load_test
from audit.metrics.weat import weat
from audit.mitigation import METHODS, get_mitigation, load_definitions
from audit.mitigation.matrix import load_glove_6b_50d
from audit.suites import WordTest
from audit.vocab import resolve_sets, words_needed

__all__ = ["GENDER_TESTS", "CONTROL_TESTS", "weat_effect", "before_after", "mitigation_report", "format_table"]

#: WEAT 6 (male/female names x career/family), 7 (math/arts x male/female terms),
#: 8 (science/arts x male/female terms): Caliskan et al. (2017).
GENDER_TESTS = ("weat6", "weat7", "weat8")
#: WEAT 1 (flowers/insects x pleasant/unpleasant): no gender content, should change little.
CONTROL_TESTS = ("weat1",)


def _load(test: str | WordTest) -> WordTest:
    return test if isinstance(test, WordTest) else load_test(test)


def weat_effect(
    model: Any, test: str | WordTest, *, casefold: bool = True, permutations: int = 10000, seed: int = 0
) -> dict[str, Any]:
    """WEAT of ``model`` on ``test`` (look-up as an audited task, then :func:`weat`).

    Returns ``effect_size``, ``statistic``, ``p_value``, ``mean_abs_s`` and the per-set
    ``coverage`` (a :class:`~audit.errors.CoverageError` propagates when too many words miss).
    """
    t = _load(test)
    sets = [*t.targets, *t.attributes]
    resolved = resolve_sets(model, sets, casefold=casefold, test_name=t.name)
    X, Y, A, B = (r.vectors for r in resolved)
    out = weat(X, Y, A, B, permutations=permutations, n_bootstrap=0, seed=seed)
    scores = out.items["score"].to_numpy() if out.items is not None and "score" in out.items else np.array([np.nan])
    return {
        "effect_size": float(out.value),
        "statistic": float(out.fields["statistic"]),
        "p_value": float(out.fields["p_value"]),
        "mean_abs_s": float(np.mean(np.abs(scores))),
        "coverage": {s.name: r.coverage for s, r in zip(sets, resolved)},
    }


def before_after(
    original: Any,
    debiased: Mapping[str, Any],
    tests: Sequence[str | WordTest] = GENDER_TESTS + CONTROL_TESTS,
    **weat_params: Any,
) -> pd.DataFrame:
    """One row per (method, test): WEAT before (``original``) and after (each debiased model).

    Columns: ``method``, ``test``, ``kind`` (gender/control/other), ``effect_before``,
    ``effect_after``, ``abs_change`` (``|after| - |before|``), ``mean_abs_s_before``,
    ``mean_abs_s_after``, ``p_before``, ``p_after``.
    """
    loaded = [_load(t) for t in tests]
    before = {t.name: weat_effect(original, t, **weat_params) for t in loaded}
    rows = []
    for method, model in debiased.items():
        for t in loaded:
            b, a = before[t.name], weat_effect(model, t, **weat_params)
            rows.append({
                "method": method,
                "test": t.name,
                "kind": "gender" if t.name in GENDER_TESTS else "control" if t.name in CONTROL_TESTS else "other",
                "effect_before": b["effect_size"],
                "effect_after": a["effect_size"],
                "abs_change": abs(a["effect_size"]) - abs(b["effect_size"]),
                "mean_abs_s_before": b["mean_abs_s"],
                "mean_abs_s_after": a["mean_abs_s"],
                "p_before": b["p_value"],
                "p_after": a["p_value"],
            })
    return pd.DataFrame(rows)


def words_of_tests(tests: Iterable[str | WordTest], model: Any, *, casefold: bool = True) -> list[str]:
    """The vocabulary entries of ``model`` that the tests' words resolve to (for ``words=``)."""
    sets = [s for t in tests for s in (*_load(t).targets, *_load(t).attributes)]
    index = getattr(model, "index", None)
    cands = words_needed(sets, casefold=casefold)
    return sorted(w for w in cands if (w in index if index is not None else True))


def mitigation_report(
    methods: Sequence[str] | None = None,
    *,
    tests: Sequence[str] = GENDER_TESTS + CONTROL_TESTS,
    definitions: str = "en/gender",
    top: int | None = None,
    params: Mapping[str, Mapping[str, Any]] | None = None,
    seed: int = 0,
) -> tuple[pd.DataFrame, dict[str, float]]:
    """The README table: fit and transform each method on GloVe 6B 50d, WEAT before/after.

    ``top=None`` uses all 400000 words (``top=N``: the N most frequent words plus the words
    of the tests and of the definitions). RAN debiases only the tests' words, with
    neighbours searched in the whole model: each word's result is the one a full run gives.
    Returns the table and the fit+transform seconds per method.
    """
    methods = list(methods or METHODS)
    d = load_definitions(definitions)
    extra = {w.lower() for s in (*d.definitional_sets, *d.equalize_sets) for w in s} | set(d.specific_words)
    glove0 = load_glove_6b_50d(top=None)
    words_for_tests = words_of_tests(tests, glove0)
    glove = glove0 if top is None else load_glove_6b_50d(top=top, words=set(words_for_tests) | extra)
    debiased, seconds = {}, {}
    for name in methods:
        method = get_mitigation(name, **dict((params or {}).get(name, {})))
        t0 = time.perf_counter()
        method.fit(glove, d)
        words = words_for_tests if method.name == "repulsion_attraction_neutralization" else None
        debiased[method.name] = method.transform(glove, words=words)
        seconds[method.name] = time.perf_counter() - t0
    return before_after(glove, debiased, tests, seed=seed), seconds


def format_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A Markdown table: one row per method, ``before -> after`` effect sizes per test."""
    tests = list(dict.fromkeys(df["test"]))
    head = "| method | " + " | ".join(f"{t} d (before -> after)" for t in tests) + " |"
    sep = "| --- |" + " --- |" * len(tests)
    lines = [head, sep]
    for method, grp in df.groupby("method", sort=False):
        cells = []
        for t in tests:
            r = grp[grp["test"] == t]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            cells.append(f"{r.effect_before:.{digits}f} -> {r.effect_after:.{digits}f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
