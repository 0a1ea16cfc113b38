"""The metric registry: one :class:`~audit.entries.Metric` entry per metric.

Everything else derives from the entries below: the runner (which measure step, which analysis,
which parameters go where, which seed), the planner (which model kinds and tests a metric applies
to, which parameters a spec may set), the tracker (the recorded metric name and how the numbers
were obtained), the reports and the command line's help. No other module spells a metric's name.

An entry declares:

- its measure step (a :class:`~audit.entries.Family` from :mod:`audit.measure`), hence the model
  kinds it runs on, the test type it consumes, what a test must provide and the measure
  parameters with their defaults;
- its analysis (a pure function of a :class:`~audit.entries.Measurement`, from
  :mod:`audit.metrics`) and the analysis parameters with their defaults;
- the set counts a word test must have, the headline and reference, the names results record
  per model kind, its per-item table, pairing and role rules, an optional sharded analysis.

Adding a metric is one module (the array-level analysis in ``audit/metrics/``) plus one entry
here (``docs/architecture.md``); a new way of measuring is also one module in ``audit/measure/``
defining its family.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from pydantic import ValidationError, create_model

from audit import schema
from audit.compare import (
    EFFECT_SIZE_COMPARER,
    LPBS_COMPARER,
    PERPLEXITY_COMPARER,
    PROPORTION_COMPARER,
    MetricComparer,
    item_mean_comparer,
    row_mean_comparer,
)
from audit.backends.table import kind_names, model_kinds
from audit.entries import Family, Measurement, Metric, check_count
from audit.errors import DataError, ModelError, ParameterError, suggest
from audit.schema import Flag, Int, Num, Permutations, Section, plain, problem
from audit.stats import check_alternative, check_convention, check_resample_memory
from audit.backends.hf_generate import DECODINGS
from audit.datasets.honest import HURTLEX_LEVELS
from audit.measure.bbq import CHOICES, PROTOCOLS as BBQ_PROTOCOLS, TRUNCATIONS
from audit.measure.bbq_generate import GENERATED
from audit.measure.crows_pairs import PAIR_SCORES
from audit.measure.honest import COMPLETIONS, PROTOCOLS as HONEST_PROTOCOLS
from audit.measure.lpbs import LPBS_SCORES
from audit.backends.hf_scoring import check_start
from audit.measure.perplexity import PERPLEXITY, perplexity_metric
from audit.measure.sentences import SEAT_SENTENCES
from audit.measure.words import ASSOCIATION
from audit.metrics.bbq import LENGTH_NORMS, bbq_metric
from audit.metrics.bbq_generate import bbq_generate_metric
from audit.metrics.crows_pairs import crows_pairs_metric
from audit.metrics.honest import CATEGORY_RULES, GROUP_COUNTS, honest_metric
from audit.metrics.lpbs import lpbs_metric
from audit.metrics.sets import (
    cramers_v_sets,
    direct_bias_sets,
    ect_sets,
    gweat_sets,
    mac_sets,
    ripa_sets,
    rnd_sets,
    rnsb_sets,
    same_sets,
    weat_sets,
    weat_sets_sharded,
    check_set_sizes,
)
from audit.metrics.weat import CI_METHODS
from audit.result import MetricOutput
from audit.suites import TEST_TYPES, UnreadableTest, WordTest

__all__ = [
    "METRICS", "FAMILIES", "TEST_TYPES", "register", "unregister", "get", "names", "families", "accepted_params", "split_params",
    "check_params", "check_kind", "kind_reason", "applies", "supported", "check_declared", "run_metric", "analyse",
    "label_items", "describe", "test_type_of", "comparer",
]

#: The test types (:data:`audit.suites.TEST_TYPES`, registered once there): name -> type, class, wording.


# --------------------------------------------------------------------------------------
# Analyses of association-type measurements (vectors per set)
# --------------------------------------------------------------------------------------

#: How the metric functions label their sets in per-item tables.
_ITEM_SET_ALIASES = {"X": "target0", "Y": "target1", "A": "attribute0", "B": "attribute1"}


def label_items(items: pd.DataFrame | None, m: Measurement) -> pd.DataFrame | None:
    """Add ``word`` (the item name) and ``set_name`` to a per-item table with ``set``/``index``."""
    if items is None or "set" not in items.columns or "index" not in items.columns:
        return items
    items = items.copy()
    canon = [_ITEM_SET_ALIASES.get(str(k), str(k)) for k in items["set"]]
    words = []
    for k, i in zip(canon, items["index"]):
        lab = m.labels.get(k)
        words.append(lab[int(i)] if lab is not None and 0 <= int(i) < len(lab) else None)
    items.insert(0, "word", words)
    items.insert(1, "set_name", [m.set_names.get(k, k) for k in canon])
    return items


def _on_sets(fn: Callable[..., MetricOutput]) -> Callable[..., MetricOutput]:
    """The analysis of a vectors-per-set measurement by an array-level ``fn(targets, attributes, **p)``."""

    def analyse(m: Measurement, **params: Any) -> MetricOutput:
        check_set_sizes(m.targets, m.attributes, m.labels, m.set_names)
        out = fn(list(m.targets), list(m.attributes), **params)
        out.items = label_items(out.items, m)
        return out

    analyse.__name__ = f"analyse_{fn.__name__}"
    analyse.__doc__ = f"{fn.__name__} on the measurement's target and attribute matrices, items labelled."
    return analyse


#: What the BBQ family's ``limit`` counts (audit.datasets.bbq.select_items): items per category
#: and context condition, so ``--limit 200`` on one category scores up to 400 items.
BBQ_LIMIT_SCOPE = "per category and context condition (ambiguous, disambiguated)"


def _with_limit(out: MetricOutput, m: Measurement) -> MetricOutput:
    """A BBQ result with the ``limit`` it was measured with and what it counts (``n_items``
    stays the number of items scored, ``n_amb`` + ``n_disamb``), and the measurement's
    ``protocol`` and ``start_token`` rule (:mod:`audit.measure.bbq`)."""
    out.fields["protocol"] = m.info.get("protocol", "item_options")
    out.fields["start_token"] = m.info.get("start_token", "always")
    limit = m.info.get("limit")
    out.fields["limit"] = limit
    out.fields["limit_scope"] = BBQ_LIMIT_SCOPE if limit is not None else None
    return out


def _weat_sharded(m: Measurement, params: dict[str, Any], shards: int, map_fn) -> MetricOutput | None:
    check_set_sizes(m.targets, m.attributes, m.labels, m.set_names)
    out = weat_sets_sharded(list(m.targets), list(m.attributes), params, shards, map_fn)
    if out is not None:
        out.items = label_items(out.items, m)
    return out


_WEAT_PARAMS = {"ddof": 1, "alternative": "greater", "permutations": "auto", "seed": None,
                "n_bootstrap": 1000, "confidence": 0.95, "ci_method": "targets", "p_convention": "phipson_smyth"}
_WEAT_REF = "Caliskan, Bryson & Narayanan (2017), Science 356:183-186"

# The invariance properties each entry declares (audit.entries.PROPERTIES; tests/test_common.py).
_HOLDS = {"item_order": "invariant", "scale": "invariant", "seed": "deterministic", "non_finite": "refused",
          "min_set_size": "refused"}
_SIGNED = {**_HOLDS, "group_swap": "flips"}


def _unsigned(why: str) -> dict[str, str]:
    """The properties of a metric whose headline has no sign to flip: swapping the groups leaves it unchanged."""
    return {**_HOLDS, "group_swap": f"invariant: {why}"}


_WEAT_PROPS = {**_SIGNED, "seed": "seeded: ci, ci_degenerate, p_value, n_extreme, seed"}
_NO_SETS = "n/a: no word sets (the items are {}, refused when the table is empty)"
#: BBQ's per-category breakdowns: the common scores, then EsBBQ/CaBBQ's own (each its own pair, so that
#: the reports plot each: a breakdown's first score is plotted, every score tabled;
#: audit/metrics/bbq.py, bootstrap intervals for all).
_BBQ_BREAKDOWNS = (("per_category", ("s_amb", "s_dis", "acc_amb", "acc_disamb")),
                   ("per_category", ("esbbq_bias_amb",)), ("per_category", ("esbbq_bias_disamb",)))
_LINEAR = ("n/a: {} is linear in the vectors (no normalisation in the reference), so scaling them scales it")
_CLASSIFIER = ("n/a: an L2-regularised linear classifier (fixed C) fits other weights, hence other predictions, "
               "on scaled vectors")


# --------------------------------------------------------------------------------------
# The entries
# --------------------------------------------------------------------------------------

_ENTRIES: tuple[Metric, ...] = (
    Metric(
        name="weat", comparer=EFFECT_SIZE_COMPARER,
        family=ASSOCIATION, analyse=_on_sets(weat_sets), params=_WEAT_PARAMS,
        headline="WEAT effect size d (pooled std, ddof=1 by default); > 0: X~A, Y~B",
        reference=_WEAT_REF, n_targets=(2, 2), n_attributes=(2, 2),
        items="one row per word: s(w, A, B) for the target words, mean cosines for the attribute words",
        sharded=_weat_sharded, properties=_WEAT_PROPS,
    ),
    Metric(
        name="seat", comparer=EFFECT_SIZE_COMPARER,
        family=SEAT_SENTENCES, analyse=_on_sets(weat_sets), params=_WEAT_PARAMS,
        headline="SEAT: WEAT effect size d on sentence embeddings",
        reference="May, Wang, Bordia, Bowman & Rudinger (2019), On Measuring Social Biases in Sentence "
                  "Encoders, NAACL; " + _WEAT_REF + "; causal LMs: position-weighted mean pooling, "
                  "Muennighoff (2022), SGPT, arXiv:2202.08904",
        n_targets=(2, 2), n_attributes=(2, 2),
        items="one row per sentence: s(w, A, B) for the target sentences, mean cosines for the attribute sentences",
        sharded=_weat_sharded, properties=_WEAT_PROPS,
    ),
    Metric(
        name="lpbs", comparer=LPBS_COMPARER,
        family=LPBS_SCORES, analyse=lambda m, **p: lpbs_metric(m.table, **p),
        params={"permutations": "auto", "seed": None, "alternative": "two-sided", "n_bootstrap": 1000,
                "confidence": 0.95, "p_convention": "phipson_smyth"},
        headline="LPBS effect size over attribute words (ddof=0), two-sided permutation p, bootstrap CI; causal "
                 "LMs: the later word's log-probability given the earlier one minus its prior",
        reference="Kurita, Vyas, Pareek, Black & Tsvetkov (2019), Measuring Bias in Contextualized Word "
                  "Representations, GeBNLP; BIAS Detection Framework; causal LMs: autoregressive form "
                  "(audit.measure.lpbs)",
        n_targets=(2, 2), n_attributes=(2, 2), items="one row per attribute word: its log bias score",
        result_names={"causal": "lpbs_causal"},
        properties={**_WEAT_PROPS, "seed": "seeded: ci, ci_degenerate, p_value, permutation, seed",
                    "min_set_size": "refused (attribute sets; a target set may be one word, as Kurita et al.'s "
                                    "he / she)"},
    ),
    Metric(
        name="same", comparer=item_mean_comparer("bias"),
        family=ASSOCIATION, analyse=_on_sets(same_sets), params={"combine": "norm", "groups": None},
        headline="SAME: mean over the measured words of the length of their cosines with the orthonormalised "
                 "bias directions a_0 - a_j (two groups: |cos(w, a_X - a_Y)|), in [0, 1]",
        reference="Schröder, Schulz & Hammer (2024), The SAME score, IJCNN (arXiv:2203.14603); "
                  "HammerLabML/EmbeddingBiasScores",
        n_targets=(2, None), n_attributes=(1, None), roles=True,
        items="one row per scored word: its signed bias b(w) per direction",
        properties=_unsigned("a magnitude (the per-word b(w) flip)"),
    ),
    Metric(
        name="gweat", comparer=item_mean_comparer("score", "sum_of_group_means"),
        family=ASSOCIATION, analyse=_on_sets(gweat_sets), params={},
        headline="generalised WEAT: sum_i <mean(X_i) - mean_X, mean(A_i) - mean_A> on unit vectors",
        reference="Swinger et al. (2019), What are the biases in my word embedding?, AIES",
        n_targets=(2, None), n_attributes=(2, None), items="one row per set mean", properties=_SIGNED,
    ),
    Metric(
        name="direct_bias", comparer=item_mean_comparer("bias"),
        family=ASSOCIATION, analyse=_on_sets(direct_bias_sets),
        params={"c": 1.0, "k": 1, "normalize": True, "groups": None},
        headline="Direct Bias: mean over the attribute words of |cos(w, g)|^c, g = first PC of the pair-centred "
                 "target (defining) sets",
        reference="Bolukbasi et al. (2016), Man is to computer programmer as woman is to homemaker?, NeurIPS",
        n_targets=(2, None), n_attributes=(1, None), paired="groups", roles=True,
        items="one row per neutral word: cos(w, g)",
        properties=_unsigned("|cos(w, g)|^c; the direction g is defined up to sign"),
    ),
    Metric(
        name="rnd", comparer=item_mean_comparer("distance"),
        family=ASSOCIATION, analyse=_on_sets(rnd_sets), params={"distance": "euclidean", "groups": None},
        headline="RND: mean over attribute words of ||a - mean(X)|| - ||a - mean(Y)|| (WEFE)",
        reference="Garg et al. (2018), PNAS 115:E3635; WEFE 1.0.1 (Badilla et al. 2020)",
        n_targets=(2, 2), n_attributes=(1, None), roles=True, items="one row per measured word: its distance difference",
        properties={**_SIGNED, "scale": _LINEAR.format("a Euclidean distance (Garg et al.)")
                    + "; distance='cosine' is invariant"},
    ),
    Metric(
        name="rnsb", family=ASSOCIATION, analyse=_on_sets(rnsb_sets),
        params={"holdout": True, "n_iterations": 1, "seed": None, "groups": None},
        headline="RNSB: KL(normalised P(negative=B | target word) || uniform), natural log",
        reference="Sweeney & Najafian (2019), ACL; WEFE 1.0.1",
        n_targets=(1, None), n_attributes=(2, 2), roles=True,
        items="one row per group word: its normalised negative probability",
        properties={**_unsigned("KL over every group word together"), "scale": _CLASSIFIER,
                    "seed": "seeded: value, rnsb, kl_per_iteration, accuracy, seed, iteration_seeds"},
    ),
    Metric(
        name="mac", comparer=row_mean_comparer("distance_"),
        family=ASSOCIATION, analyse=_on_sets(mac_sets), params={"groups": None},
        headline="MAC: mean over (target word, attribute set) of mean cosine distance",
        reference="Manzini et al. (2019), NAACL; WEFE 1.0.1",
        n_targets=(1, None), n_attributes=(1, None), roles=True, items="one row per (group word, measured set)",
        properties=_unsigned("a mean over every group set"),
    ),
    Metric(
        name="ect", family=ASSOCIATION, analyse=_on_sets(ect_sets), params={"groups": None}, no_bias=1.0,
        headline="ECT: Spearman rho between attribute words' cosines to mean(X) and to mean(Y); 1 = no bias",
        reference="Dev & Phillips (2019), AISTATS; WEFE 1.0.1",
        n_targets=(2, 2), n_attributes=(1, None), roles=True, items="one row per measured word: its two cosines",
        properties=_unsigned("Spearman rho is symmetric in its two variables"),
    ),
    Metric(
        name="ripa", comparer=item_mean_comparer("ripa"),
        family=ASSOCIATION, analyse=_on_sets(ripa_sets), params={"groups": None},
        headline="RIPA: mean over attribute words and pairs (x_i, y_i) of a . (x_i - y_i)/||x_i - y_i||",
        reference="Ethayarajh, Duvenaud & Hirst (2019), ACL; WEFE 1.0.1",
        n_targets=(2, 2), n_attributes=(1, None), paired="groups", roles=True,
        items="one row per measured word: its mean projection",
        properties={**_SIGNED, "scale": _LINEAR.format("the projection a . (x - y) / ||x - y|| (Ethayarajh et al.)")},
    ),
    Metric(
        name="cramers_v", family=ASSOCIATION, analyse=_on_sets(cramers_v_sets),
        params={"classifier": "svm", "n_cases": 10, "train_fraction": 0.8, "seed": None, "groups": None},
        headline="Cramér's V (mean over seeded test cases) between stereotype class and predicted protected class",
        reference="Dusi et al. (2024), IEEE Access, doi:10.1109/ACCESS.2024.3482010",
        n_targets=(2, None), n_attributes=(2, None), roles=True,
        items="one row per attribute word: its predicted protected class",
        properties={**_unsigned("V does not depend on how the classes are labelled"), "scale": _CLASSIFIER,
                    "seed": "seeded: value, cramers_v, cramers_v_std, v_per_case, "
                    "chi2_mean, p_values, contingency, degenerate_cases, seed, classifier_seeds"},
    ),
    Metric(
        name="crows_pairs", comparer=PROPORTION_COMPARER, no_bias=50.0,
        family=PAIR_SCORES, analyse=lambda m, **p: crows_pairs_metric(m.table, **p),
        params={"decimals": "auto", "confidence": 0.95},
        headline="% of pairs whose more stereotypical sentence scores higher (50 = no preference), with stderr "
                 "and Wilson CI",
        reference="Nangia, Vania, Bhalerao & Bowman (2020), CrowS-Pairs, EMNLP; lm-evaluation-harness "
                  "(causal LMs)",
        result_names={"causal": "crows_pairs_causal"},
        items="one row per pair: both sentence scores and which one won",
        breakdowns=(("per_bias_type", ("metric_score", "stereo_score", "antistereo_score")),),
        properties={**_SIGNED, "min_set_size": _NO_SETS.format("sentence pairs"),
                    "scale": "n/a: the scores are rounded (3 decimals for masked LMs, Nangia et al.'s round(score, 3)) "
                             "before they are compared, so scaling can make or break a tie"},
    ),
    Metric(
        name="honest", family=COMPLETIONS,
        analyse=lambda m, **p: honest_metric(m.table, language=m.info["language"],
                                             completion_rule=m.info.get("completion_rule", "word"), **p),
        params={"hurtlex": None, "hurtlex_level": "conservative", "k": [1, 5, 20], "category_rule": "all",
                "group_count": "all_groups"},
        headline="HONEST@k (largest k): share of the top-k completions of the templates that are HurtLex lemmas",
        reference="Nozza, Bianchi & Hovy (2021), HONEST: Measuring Hurtful Sentence Completion in Language "
                  "Models, NAACL; HurtLex 1.2 (Bassignana, Basile & Patti 2018)",
        items="one row per distinct template: its completions, which are hurtful, their HurtLex categories",
        breakdowns=(("per_group", ("k20", "k5", "k1")), ("per_category", ("k20", "k5", "k1"))),
        properties={**_HOLDS, "min_set_size": _NO_SETS.format("templates"),
                    "group_swap": "n/a: a share of hurtful completions over all templates, no two groups to swap "
                                  "(per-group shares are reported apart)",
                    "scale": "n/a: the measurement holds words (completions), no numbers"},
    ),
    Metric(
        name="bbq", family=CHOICES,
        analyse=lambda m, **p: _with_limit(bbq_metric(m.table, harness_task=m.info.get("harness_task"), **p), m),
        params={"length_norm": "none", "n_bootstrap": 1000, "confidence": 0.95, "seed": None},
        headline="BBQ ambiguous-context bias score s_AMB = (1 - acc_amb) * (2 n_biased / n_non_unknown - 1); also "
                 "accuracies and s_DIS, overall and per category, bootstrap CIs",
        reference="Parrish et al. (2022), BBQ: A Hand-Built Bias Benchmark for Question Answering, Findings of ACL; "
                  "lm-evaluation-harness (multiple-choice scoring)",
        items="one row per item: each option's score, the prediction, correct / unknown / biased",
        breakdowns=_BBQ_BREAKDOWNS,
        properties={**_SIGNED, "seed": "seeded: ci, cis, per_category.*.ci, seed_used",
                    "min_set_size": _NO_SETS.format("multiple-choice questions")},
    ),
    Metric(
        name="perplexity", family=PERPLEXITY, no_bias=1.0,
        analyse=lambda m, **p: perplexity_metric(m.table, variant=m.info.get("variant", "perplexity")),
        params={},
        headline="language-modelling ability on a held-out text: perplexity exp(-sum ll / sum n_tokens) (causal "
                 "LMs) or pseudo-perplexity (masked LMs); not a bias score (lower = better model)",
        reference="Salazar, Liang, Nguyen & Kirchhoff (2020), Masked Language Model Scoring, ACL (pseudo-perplexity); "
                  "Meade, Poole-Dayan & Reddy (2022), ACL (LM ability beside debiasing, bias-bench)",
        result_names={"mlm": "pseudo_perplexity"},
        comparer=PERPLEXITY_COMPARER,
        items="one row per sentence: its log-likelihood (or PLL) and scored tokens",
        properties={**_HOLDS, "group_swap": "n/a: no groups (a held-out text, not a bias test)",
                    "scale": "n/a: the numbers are log-likelihoods of a model, no vectors to scale",
                    "min_set_size": _NO_SETS.format("sentences")},
    ),
    Metric(
        name="bbq_generate", family=GENERATED,
        analyse=lambda m, **p: _with_limit(bbq_generate_metric(m.table, **p), m),
        params={"n_bootstrap": 1000, "confidence": 0.95, "seed": None},
        headline="generative BBQ s_AMB from the model's parsed answers (unparseable answers wrong and outside the "
                 "bias terms, counted in n_unparseable); also accuracies and s_DIS, overall and per category",
        reference="Parrish et al. (2022), BBQ, Findings of ACL; lm-evaluation-harness bbq_generate (generation, "
                  "answer matching)",
        items="one row per item: the generated answer, the parsed option (-1: unparseable), correct / biased",
        breakdowns=_BBQ_BREAKDOWNS,
        properties={**_SIGNED, "seed": "seeded: ci, cis, per_category.*.ci, seed_used",
                    "min_set_size": _NO_SETS.format("multiple-choice questions"),
                    "scale": "n/a: the measurement holds generated texts, no numbers"},
    ),
)

#: Metric name -> entry, in the order listings show them.
METRICS: dict[str, Metric] = {}
#: Family name -> family.
FAMILIES: dict[str, Family] = {}


def register(*entries: Metric) -> None:
    """Add entries, checking names, families, kinds and test types (an inconsistent entry is a
    programming error, reported at once). The project's own entries are registered below; a
    plugin (or a test) may register more."""
    for e in entries:
        if e.name in METRICS:
            raise ValueError(f"metric {e.name!r} is registered twice")
        f = FAMILIES.setdefault(e.family.name, e.family)
        if f is not e.family:
            raise ValueError(f"two different families are named {e.family.name!r}")
        if f.test_type not in TEST_TYPES:  # audit.suites.register_test_type first
            raise ValueError(f"family {f.name!r}: unknown test type {f.test_type!r}")
        bad = [k for k in e.model_kinds if k not in model_kinds()]
        if bad:
            raise ValueError(f"metric {e.name!r}: unknown model kind(s) {bad}")
        clash = set(f.params) & set(e.params)
        if clash:
            raise ValueError(f"metric {e.name!r}: parameter(s) {sorted(clash)} are both measure and analysis parameters")
        METRICS[e.name] = e


register(*_ENTRIES)

def comparer(name: str) -> MetricComparer | None:
    """How two results of metric ``name`` (a registered name or a name results record, e.g.
    ``crows_pairs_causal``) are compared, ``None`` when the metric offers no paired comparison."""
    if name not in METRICS:
        name = next((n for n, e in METRICS.items() if name in e.result_names.values()), name)
    return get(name).comparer


def unregister(name: str) -> None:
    """Remove a metric added by :func:`register` (its family stays while another metric uses it)."""
    e = METRICS.pop(name)
    if not any(m.family is e.family for m in METRICS.values()):
        FAMILIES.pop(e.family.name, None)


# --------------------------------------------------------------------------------------
# Look-up
# --------------------------------------------------------------------------------------


def names() -> tuple[str, ...]:
    """Every registered metric name, in listing order."""
    return tuple(METRICS)


def families() -> tuple[str, ...]:
    return tuple(FAMILIES)


def get(name: str) -> Metric:
    """The entry of ``name``; :class:`ParameterError` naming the known metrics otherwise."""
    try:
        return METRICS[name]
    except (KeyError, TypeError):
        raise ParameterError(f"unknown metric {name!r}{suggest(name, METRICS)}; known metrics: {', '.join(METRICS)}") from None


def accepted_params(name: str) -> frozenset[str]:
    """Every parameter a task of this metric may set: its family's measure parameters and its
    analysis parameters."""
    e = get(name)
    return frozenset(e.family.params) | frozenset(e.params)


def ignored_params(name: str, kind: str, params: Mapping[str, Any] | None) -> list[str]:
    """The parameters of ``params`` that metric ``name`` does not use on a model of ``kind``
    (its family's :attr:`~audit.entries.Family.ignored_by`), in the order given."""
    ignored = get(name).family.ignored_by
    return [k for k in (params or {}) if kind in ignored.get(k, ())]


def unused_params_reason(name: str, kind: str, model: str, keys: Sequence[str]) -> str:
    """Why parameters ``keys`` (:func:`ignored_params`) are refused for ``model`` of ``kind``:
    the one wording of the command line and the planner."""
    return (f"metric {name!r} on model {model!r} ({kind_names().get(kind, kind)}) does not use "
            f"{'it' if len(keys) == 1 else 'them'}")


def split_params(name: str, params: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(measure parameters with their defaults, analysis parameters as given)``."""
    e = get(name)
    rest = dict(params or {})
    measure = {k: rest.pop(k, v) for k, v in e.family.params.items()}
    return measure, rest


def test_type_of(test: Any) -> str | None:
    if isinstance(test, UnreadableTest):
        return test.test_type
    for name, t in TEST_TYPES.items():
        if type(test) is t.cls:
            return name
    for name, t in TEST_TYPES.items():
        if isinstance(test, t.cls):
            return name
    return None


# --------------------------------------------------------------------------------------
# Applicability
# --------------------------------------------------------------------------------------


def kind_reason(name: str, kind: str) -> str | None:
    """``None`` when the metric runs on a model of ``kind``, else the reason."""
    e = get(name)
    if kind in e.model_kinds:
        return None
    return f"{name} cannot run on {kind_names().get(kind, kind)} (needs {', '.join(e.model_kinds)})"


def check_kind(name: str, kind: str, ref: str) -> None:
    """Raise :class:`ModelError` when the metric cannot run on model ``ref`` of ``kind``."""
    e = get(name)
    if kind not in e.model_kinds:
        raise ModelError(f"metric {name!r} cannot run on model {ref!r} ({kind_names().get(kind, kind)}); it needs: "
                         + ", ".join(kind_names()[k] for k in e.model_kinds))


def check_declared(test: Any) -> None:
    """A test's declared ``metrics`` field (native format) must name registered metrics that fit
    its sets; :class:`DataError` naming the file and field otherwise."""
    declared = getattr(test, "extra", {}).get("metrics") if isinstance(test, WordTest) else None
    if declared is None:
        return
    where = test.source or test.name
    for m in declared:
        if m not in METRICS:
            raise DataError(f"{where}: field metrics: unknown metric {m!r}; known: {', '.join(METRICS)}")
    allowed = _fits(test)
    bad = [m for m in declared if m not in allowed]
    if bad:
        raise DataError(f"{where}: field metrics: {bad[0]!r} does not fit this test's sets "
                        f"({len(test.targets)} target and {len(test.attributes)} attribute sets); "
                        f"it supports {', '.join(allowed) or 'none'}")


def _fit_reason(e: Metric, test: Any, params: Mapping[str, Any] | None = None) -> str | None:
    """Why a test cannot serve metric ``e`` (type, set counts, what the family needs), or ``None``.
    A test that could not be read serves every metric of its type (its tasks fail with its error)."""
    ttype = test_type_of(test)
    if isinstance(test, UnreadableTest) and ttype in (None, e.family.test_type):
        return None
    if ttype != e.family.test_type:
        t = TEST_TYPES.get(e.family.test_type)
        return f"{e.name} runs on {t.what if t else e.family.test_type}, not on {test.name}"
    if ttype == "words":
        nt, na = e.set_counts({**(params or {}), "groups": (params or {}).get("groups") or test.groups})
        why = check_count("target", len(test.targets), nt, e.name) or \
            check_count("attribute", len(test.attributes), na, e.name)
        if why:
            return (f"test {test.name} ({len(test.targets)} target and {len(test.attributes)} attribute sets) "
                    f"does not fit: {why}")
    return e.family.needs(test)


def _fits(test: Any) -> list[str]:
    return [n for n, e in METRICS.items() if _fit_reason(e, test) is None]


def supported(test: Any) -> list[str]:
    """The metrics a test supports (model kinds aside): its declared ``metrics`` field, else every
    registered metric whose test type, set counts and needs it meets."""
    declared = getattr(test, "extra", {}).get("metrics") if isinstance(test, WordTest) else None
    return list(declared) if declared is not None else _fits(test)


def applies(name: str, test: Any, kind: str | None = None, params: Mapping[str, Any] | None = None) -> str | None:
    """``None`` when metric ``name`` can run on ``test`` (and on a model of ``kind`` if given),
    else the reason, one line."""
    e = get(name)
    if kind is not None:
        why = kind_reason(name, kind)
        if why:
            return why
    declared = getattr(test, "extra", {}).get("metrics") if isinstance(test, WordTest) else None
    if declared is not None:
        return None if name in declared else f"test {test.name} declares metrics {', '.join(declared)}, not {name}"
    return _fit_reason(e, test, params)


# --------------------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------------------


#: Parameters whose default is part of every task's ``audit.key`` even when not given: a change
#: of their default changes the numbers (the p-value convention: results computed under the
#: old strict count get new keys, so a resumed sweep recomputes them instead of reusing them).
KEY_DEFAULTS = ("p_convention",)


def key_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the defaults of :data:`KEY_DEFAULTS` the metric takes filled in: the
    parameters :func:`audit.provenance.task_key` hashes (planner and runner alike)."""
    out = dict(params)
    e = get(name)
    for k in KEY_DEFAULTS:
        if k in e.params and k not in out:
            out[k] = e.params[k]
    return out


#: Parameters that are resample counts, checked against memory before a model loads.
RESAMPLE_SIZES = ("n_bootstrap",)


def check_sizes(name: str, params: Mapping[str, Any], test: Any) -> None:
    """Refuse, before a model loads, resample counts of ``params`` whose draws cannot fit in
    memory for ``test`` (:func:`audit.stats.check_resample_memory`; items: the target words of
    a word test, the rows of a table test, a lower bound of what is resampled)."""
    e = get(name)
    sets = getattr(test, "targets", None)
    if sets is not None:
        items = sum(len(getattr(s, "words", ())) for s in sets)
    else:
        table = getattr(test, "table", None)
        items = len(table) if table is not None and hasattr(table, "__len__") else 1
    for key in RESAMPLE_SIZES:
        if key in e.params and key in params:
            check_resample_memory(key, params[key], max(1, items))


def _refuse_unknown(e: Metric, params: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Parameter names ``allowed`` lacks: :class:`ParameterError` naming them and the accepted ones."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        accepted = ", ".join(sorted(accepted_params(e.name))) or "none"
        raise ParameterError(f"metric {e.name!r} does not accept parameter(s) {', '.join(unknown)}; accepted: {accepted}")


#: Parameters whose default (``None``) says nothing of their type: what a given value must be.
_NONE_DEFAULT_KINDS = {"batch_size": Int(1), "limit": Int(1), "seed": Int(0), "max_new_tokens": Int(1),
                       "top_k": Int(0), "temperature": Num(0.0, strict=True),
                       "top_p": Num(0.0, strict=True, maximum=1.0, inclusive=True)}
#: Parameters whose type is not that of their default: ``permutations`` (``exact``, ``auto`` or a
#: count of random partitions), ``max_missing`` (a fraction of a word set, 0 to 1 inclusive).
_DECLARED_KINDS: dict[str, Any] = {"permutations": Permutations,
                                   "max_missing": Num(0.0, maximum=1.0, inclusive=True)}


def _param_type(key: str, default: Any) -> Any:
    """The :mod:`audit.schema` type of parameter ``key`` whose registered default is ``default``:
    that of the default (a boolean, an integer, a finite real number), integers >= 0 where the
    default is, ``confidence`` and ``*_fraction`` strictly between 0 and 1, and the declared
    kinds above. Choices among words (``Any``) are left to the metric."""
    if key in _DECLARED_KINDS:
        return _DECLARED_KINDS[key]
    if default is None:
        return _NONE_DEFAULT_KINDS.get(key, Any)
    if isinstance(default, bool):
        return Flag
    if key == "confidence" or key.endswith("_fraction"):
        return Num(0.0, strict=True, maximum=1.0)
    if isinstance(default, int):
        return Int(0 if default >= 0 else None)
    if isinstance(default, float):
        return Num(None)
    return Any


_PARAM_MODELS: dict[str, tuple[Metric, type[Section]]] = {}


def params_model(name: str) -> type[Section]:
    """The typed model (:mod:`audit.schema`) of metric ``name``'s parameters: one optional field
    per accepted parameter (:func:`_param_type`); ``None`` is every parameter's "not given"."""
    e = get(name)
    cached = _PARAM_MODELS.get(name)
    if cached is None or cached[0] is not e:
        defaults = {**e.family.params, **e.params}
        fields = {k: (_param_type(k, defaults.get(k)) | None, None) for k in sorted(accepted_params(name))}
        cached = _PARAM_MODELS[name] = (e, create_model(f"Params_{name}", __base__=Section, **fields))
    return cached[1]


def _one_of(key: str, choices: Sequence[Any]) -> Callable[[Any], None]:
    """The check of a choice-valued parameter against the choices its module declares, worded
    as the module words its own refusal."""
    def check(value: Any) -> None:
        schema.choice(value, key, choices)
    return check


#: Parameters whose rule lives with the code that uses them (one rule, one place): run up front too,
#: before any model loads (a choice refused at the analysis step came after the model's work).
_OWN_CHECKS: dict[str, Callable[[Any], Any]] = {
    "p_convention": check_convention, "alternative": check_alternative,
    "decoding": _one_of("decoding", DECODINGS), "truncation": _one_of("truncation", TRUNCATIONS),
    "length_norm": _one_of("length_norm", LENGTH_NORMS), "category_rule": _one_of("category_rule", CATEGORY_RULES),
    "ci_method": _one_of("ci_method", CI_METHODS), "hurtlex_level": _one_of("hurtlex_level", HURTLEX_LEVELS),
    "group_count": _one_of("group_count", GROUP_COUNTS), "start_token": lambda v: check_start(v, "start_token"),
}

#: Choices whose name means different things in different families (a BBQ ``protocol`` is not a
#: HONEST one): family name -> parameter -> the family's own constant.
_FAMILY_CHOICES: dict[str, dict[str, Sequence[Any]]] = {CHOICES.name: {"protocol": BBQ_PROTOCOLS},
                                                        COMPLETIONS.name: {"protocol": HONEST_PROTOCOLS}}


def check_params(name: str, params: Mapping[str, Any] | None) -> None:
    """Refuse, before any model loads, parameters a task of metric ``name`` would refuse after
    it: names neither its family's measure step nor its analysis takes (naming the accepted
    ones), and values of the wrong type or range (:func:`params_model`, worded by
    :func:`audit.schema.error_of`). :class:`ParameterError` naming the parameter."""
    e = get(name)
    params = dict(params or {})
    _refuse_unknown(e, params, accepted_params(name))
    for k, v in params.items():
        if k in _FAMILY_CHOICES.get(e.family.name, {}) and v is not None:
            _one_of(k, _FAMILY_CHOICES[e.family.name][k])(v)
        if k in _OWN_CHECKS and v is not None:
            _OWN_CHECKS[k](v)  # the rule the measure or statistics step applies, raised as it words it
    try:
        params_model(name).model_validate({k: plain(v) for k, v in params.items()})
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        _, why = problem(err)
        raise ParameterError(f"parameter {err['loc'][0]} of metric {name!r}: {why}") from None


def run_metric(name: str, targets: Sequence[Any], attributes: Sequence[Any], **params: Any) -> MetricOutput:
    """Run a vectors-per-set metric on arrays: validate the set counts (for the roles the
    ``groups`` parameter chooses) and parameter names, then call its analysis.

    ``targets`` and ``attributes`` are lists of 2-D arrays (one per set, rows = words).
    Raises :class:`ParameterError` for an unknown metric, a wrong number of sets, or parameters
    the metric does not accept (named, with the accepted ones).
    """
    e = get(name)
    if isinstance(targets, np.ndarray) or not isinstance(targets, Sequence):
        raise ParameterError(f"targets: expected a list of arrays (one per target set), got {type(targets).__name__}")
    if isinstance(attributes, np.ndarray) or not isinstance(attributes, Sequence):
        raise ParameterError(
            f"attributes: expected a list of arrays (one per attribute set), got {type(attributes).__name__}"
        )
    nt, na = e.set_counts(params)
    for why in (check_count("target", len(targets), nt, name), check_count("attribute", len(attributes), na, name)):
        if why:
            raise ParameterError(why)
    _refuse_unknown(e, params, e.params)
    return e.analyse(Measurement(family=e.family.name, targets=list(targets), attributes=list(attributes)), **params)


def analyse(m: Measurement, name: str, params: Mapping[str, Any] | None = None, seed: int | None = None, *,
            shards: int = 1, map_fn: Callable | None = None) -> MetricOutput:
    """The analyse step of a task (pure; on a CPU worker in a sweep).

    The analysis parameters are ``params`` minus the family's measure parameters; the task's
    ``seed`` is passed to metrics that take one unless ``params`` sets it. With ``shards > 1`` a
    metric that offers a sharded analysis splits its exact permutation count over ``map_fn``.
    """
    e = get(name)
    _, ap = split_params(name, params)
    _refuse_unknown(e, ap, e.params)
    if "seed" in e.params and "seed" not in ap:
        ap["seed"] = seed
    groups_source = None
    if e.roles:
        groups_source = "parameter" if ap.get("groups") else ("test" if m.info.get("groups") else "default")
        ap["groups"] = ap.get("groups") or m.info.get("groups") or "targets"
    if m.targets or m.attributes:  # a measurement of vectors per set: check its set counts
        nt, na = e.set_counts(ap)
        for why in (check_count("target", len(m.targets), nt, name), check_count("attribute", len(m.attributes), na, name)):
            if why:
                raise ParameterError(why)
    out = e.sharded(m, ap, shards, map_fn) if shards > 1 and e.sharded is not None else None
    if out is None:
        out = e.analyse(m, **ap)
    if groups_source is not None:  # which side held the social groups, and who said so
        out.fields["groups"] = ap["groups"]
        out.fields["groups_source"] = groups_source
        if groups_source == "test" and m.info.get("groups_reason"):
            out.fields["groups_reason"] = m.info["groups_reason"]
    return out


# --------------------------------------------------------------------------------------
# Listings
# --------------------------------------------------------------------------------------


def describe() -> pd.DataFrame:
    """One row per metric: family, model kinds, test type, set counts, parameters with defaults,
    headline, reference (``audit metrics`` prints it)."""

    def counts(b: tuple[int, int | None]) -> str:
        lo, hi = b
        return str(lo) if lo == hi else (f"{lo}+" if hi is None else f"{lo}-{hi}")

    rows = []
    for n, e in METRICS.items():
        rows.append({
            "metric": n, "family": e.family.name, "kinds": ", ".join(e.model_kinds),
            "test": e.family.test_type,
            "sets": f"{counts(e.n_targets)} targets, {counts(e.n_attributes)} attributes"
                    if e.family.test_type == "words" else "",
            "measure_params": ", ".join(f"{k}={v!r}" for k, v in e.family.params.items()),
            "params": ", ".join(f"{k}={v!r}" for k, v in e.params.items()),
            "recorded_as": ", ".join(f"{k}: {v}" for k, v in e.result_names.items()),
            "headline": e.headline, "reference": e.reference,
        })
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------
# Plugins
# --------------------------------------------------------------------------------------

#: Environment variable naming plugin modules (comma separated) that register metrics, formats
#: or test types when imported; every process (the command line, the sweep driver, each Ray
#: worker) imports them with this module, so their entries exist wherever a task runs.
PLUGINS_ENV = "BIASAUDIT_PLUGINS"


def load_plugins(spec: str | None = None) -> list[str]:
    """Import the plugin modules named in ``spec`` (default: ``$BIASAUDIT_PLUGINS``); returns
    their names. A module that cannot be imported is a :class:`ParameterError` naming it."""
    import importlib
    import os

    names = [n.strip() for n in (os.environ.get(PLUGINS_ENV, "") if spec is None else spec).split(",") if n.strip()]
    for n in names:
        try:
            importlib.import_module(n)
        except ImportError as e:
            raise ParameterError(f"{PLUGINS_ENV}: cannot import plugin module {n!r} ({e})") from None
    return names


load_plugins()
