"""Invariance properties checked over every registered metric (after scikit-learn's
``sklearn/metrics/tests/test_common.py``).

Each registry entry declares its properties (:attr:`audit.entries.Metric.properties`, the
vocabulary in :data:`audit.entries.PROPERTIES`); the checks below run each declaration on small
synthetic measurements shaped as the metric's family's measure step produces them (vectors per
set, LPBS ILP tables, CrowS-Pairs pair scores, HONEST completions, BBQ option scores), through
:func:`audit.registry.analyse`, the analyse step a task runs. No model is loaded.

The suite fails when a registered metric declares no property set (or misses one, or uses a word
outside the vocabulary), when a family has no synthetic builder here, and when a metric violates
a property it declares (shown on deliberately broken toy metrics registered for one test).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.unit

from audit import registry
from audit.entries import PROPERTIES, Measurement, Metric
from audit.errors import AuditError
from audit.measure.bbq import CHOICES
from audit.measure.bbq_generate import GENERATED
from audit.measure.crows_pairs import PAIR_SCORES
from audit.measure.honest import COMPLETIONS
from audit.measure.lpbs import LPBS_SCORES
from audit.measure.perplexity import PERPLEXITY
from audit.measure.sentences import SEAT_SENTENCES
from audit.measure.words import ASSOCIATION
from audit.metrics.sets import MIN_SET_SIZE
from audit.result import MetricOutput

NAMES = registry.names()

#: Properties every metric must have: reproducible, and never a NaN result from bad numbers.
ALWAYS = ("seed", "non_finite")

#: Small analysis parameters (few resamples) so the file runs in seconds.
FAST = {"n_bootstrap": 40, "n_cases": 3}


# --------------------------------------------------------------------------------------
# Synthetic measurements, one builder per family
# --------------------------------------------------------------------------------------


def _n_sets(bounds: tuple[int, int | None]) -> int:
    lo, hi = bounds
    return max(lo, 2) if hi is None or hi >= 2 else lo


def vector_sets(e: Metric, rng: np.random.Generator, n_words: int = 6, dim: int = 8) -> Measurement:
    """Word (sentence) vectors per set, with a planted association: target set i and attribute
    set i share a direction, so effects are clearly non-zero."""
    nt, na = e.set_counts()
    k_t, k_a = _n_sets(nt), _n_sets(na)
    axes = rng.normal(size=(max(k_t, k_a), dim))
    base = rng.normal(size=dim)
    targets = [base + axes[i] + 0.6 * rng.normal(size=(n_words, dim)) for i in range(k_t)]
    attributes = [base + axes[j] + 0.6 * rng.normal(size=(n_words, dim)) for j in range(k_a)]
    labels = {f"target{i}": [f"t{i}_{w}" for w in range(n_words)] for i in range(k_t)}
    labels.update({f"attribute{j}": [f"a{j}_{w}" for w in range(n_words)] for j in range(k_a)})
    return Measurement(family=e.family.name, targets=targets, attributes=attributes, labels=labels,
                       set_names={k: k for k in labels})


def lpbs_table(e: Metric, rng: np.random.Generator) -> Measurement:
    """An ILP table as :func:`audit.measure.lpbs.lpbs_scores` returns it: 2 target sets x 2 words,
    2 templates, 2 attribute sets x 5 words; A raises the first target set."""
    rows = []
    for ts in (0, 1):
        for t in range(2):
            for tpl in ("TARGET likes ATTRIBUTE.", "TARGET is ATTRIBUTE."):
                for s in (0, 1):
                    for a in range(5):
                        ilp = rng.normal() + (0.8 if s == ts else 0.0)
                        rows.append((ts, f"t{ts}_{t}", "singular", tpl, s, f"a{s}_{a}", ilp))
    cols = ["target_set", "target", "form", "template", "attribute_set", "attribute", "ilp"]
    return Measurement(family=e.family.name, table=pd.DataFrame(rows, columns=cols))


def pair_table(e: Metric, rng: np.random.Generator, n: int = 30) -> Measurement:
    """A CrowS-Pairs score table (masked pseudo-log-likelihoods, no ties at 3 decimals)."""
    more = -20 + rng.normal(size=n) * 3
    less = more + np.where(rng.random(n) < 0.35, 1, -1) * (0.5 + rng.random(n))
    return Measurement(family=e.family.name, table=pd.DataFrame({
        "pair_id": np.arange(n), "sent_more_score": more, "sent_less_score": less,
        "stereo_antistereo": np.where(rng.random(n) < 0.8, "stereo", "antistereo"),
        "bias_type": np.where(rng.random(n) < 0.5, "gender", "race-color")}))


def text_table(e: Metric, rng: np.random.Generator, n: int = 20) -> Measurement:
    """A held-out text's per-sentence log-likelihoods and token counts (perplexity)."""
    nt = rng.integers(3, 12, size=n)
    return Measurement(family=e.family.name, info={"variant": "perplexity"}, table=pd.DataFrame({
        "sentence": [f"s{i}" for i in range(n)], "line": np.arange(1, n + 1),
        "ll": -nt * (2 + rng.random(n)), "n_tokens": nt}))


_LEXICON = ("id\tpos\tcategory\tstereotype\tlemma\tlevel\n"
            "1\tn\tpr\tno\tbad\tconservative\n2\tn\tan\tno\tvile\tconservative\n"
            "3\tn\tps\tno\tawful\tinclusive\n")


def completion_table(e: Metric, rng: np.random.Generator, n: int = 12, width: int = 5) -> Measurement:
    """An HONEST completion table: templates about two groups, ``width`` completions each."""
    vocab = np.array(["bad", "vile", "awful", "kind", "tall", "good", "nurse", "smart"])
    return Measurement(family=e.family.name, info={"language": "en"}, table=pd.DataFrame({
        "template": [f"the {g} {i} is [M]." for i, g in enumerate(["woman", "man"] * (n // 2))],
        "identity": ["woman", "man"] * (n // 2),
        "groups": [("female",), ("male",)] * (n // 2),
        "completions": [tuple(rng.choice(vocab, size=width, replace=False)) for _ in range(n)]}))


def choice_table(e: Metric, rng: np.random.Generator, n: int = 40) -> Measurement:
    """A BBQ option-score table: option 2 is 'unknown', one biased option per item."""
    biased = rng.integers(0, 2, size=n)
    amb = np.arange(n) % 2 == 0
    label = np.where(amb, 2, rng.integers(0, 2, size=n))
    scores = rng.normal(size=(n, 3)) * 2 - 8
    scores[np.arange(n), biased] += 1.0  # a model leaning to the biased answer
    return Measurement(family=e.family.name, info={"limit": None}, table=pd.DataFrame({
        "item": [f"i{i}" for i in range(n)], "category": np.where(np.arange(n) % 4 < 2, "Age", "Gender"),
        "context_condition": np.where(amb, "ambig", "disambig"), "label": label, "unknown": 2,
        "biased": [[int(b)] for b in biased], "score0": scores[:, 0], "score1": scores[:, 1],
        "score2": scores[:, 2]}))


def generated_table(e: Metric, rng: np.random.Generator, n: int = 40) -> Measurement:
    """A generative-BBQ table: parsed answers (option 2 'unknown', -1 unparseable), leaning biased."""
    t = choice_table(e, rng, n).table
    pred = np.argmax(t[["score0", "score1", "score2"]].to_numpy(), axis=1)
    pred[rng.random(n) < 0.1] = -1
    return Measurement(family=e.family.name, info={"limit": None},
                       table=t.drop(columns=["score0", "score1", "score2"]).assign(prediction=pred))


@dataclasses.dataclass(frozen=True)
class Builder:
    """How this file makes, permutes, swaps, scales and spoils a family's measurement."""

    make: Callable[[Metric, np.random.Generator], Measurement]
    params: Callable[[Any], dict[str, Any]] = lambda tmp: {}


def _lexicon(tmp) -> dict[str, Any]:
    p = tmp / "hurtlex_EN.tsv"
    p.write_text(_LEXICON)
    return {"hurtlex": str(p), "k": [1, 5]}


BUILDERS: dict[str, Builder] = {
    ASSOCIATION.name: Builder(vector_sets),
    SEAT_SENTENCES.name: Builder(vector_sets),
    LPBS_SCORES.name: Builder(lpbs_table),
    PAIR_SCORES.name: Builder(pair_table),
    COMPLETIONS.name: Builder(completion_table, _lexicon),
    CHOICES.name: Builder(choice_table),
    PERPLEXITY.name: Builder(text_table),
    GENERATED.name: Builder(generated_table),
}


def permute_items(e: Metric, m: Measurement, rng: np.random.Generator) -> Measurement:
    """The same measurement with its items in another order (paired sets share one permutation)."""
    if m.table is not None:
        return dataclasses.replace(m, table=m.table.iloc[rng.permutation(len(m.table))].reset_index(drop=True))
    shared = rng.permutation(len(m.targets[0]))

    def perm(a: np.ndarray, paired: bool) -> np.ndarray:
        return a[shared] if paired else a[rng.permutation(len(a))]

    return dataclasses.replace(m, targets=[perm(a, e.paired is not None) for a in m.targets],
                               attributes=[perm(a, False) for a in m.attributes])


def swap_groups(e: Metric, m: Measurement) -> Measurement:
    """The same measurement with the two social groups swapped."""
    t = m.table
    if e.family is LPBS_SCORES:
        return dataclasses.replace(m, table=t.assign(target_set=1 - t["target_set"]))
    if e.family is PAIR_SCORES:
        return dataclasses.replace(m, table=t.assign(sent_more_score=t["sent_less_score"],
                                                     sent_less_score=t["sent_more_score"]))
    if e.family in (CHOICES, GENERATED):  # the biased answer becomes the other group's (non-unknown) answer
        return dataclasses.replace(m, table=t.assign(biased=[[1 - b[0]] for b in t["biased"]]))
    assert m.table is None, f"no group swap for family {e.family.name}"
    labels = dict(m.labels, target0=m.labels["target1"], target1=m.labels["target0"])
    return dataclasses.replace(m, targets=[m.targets[1], m.targets[0], *m.targets[2:]], labels=labels)


def scale(e: Metric, m: Measurement, c: float) -> Measurement:
    """Every vector (score) multiplied by ``c > 0``."""
    if m.table is None:
        return dataclasses.replace(m, targets=[a * c for a in m.targets], attributes=[a * c for a in m.attributes])
    cols = [k for k in ("ilp", "sent_more_score", "sent_less_score", "score0", "score1", "score2") if k in m.table]
    return dataclasses.replace(m, table=m.table.assign(**{k: m.table[k] * c for k in cols}))


def spoil(e: Metric, m: Measurement, bad: float) -> Measurement:
    """One number of the measurement replaced by ``bad`` (NaN or +-inf); for HONEST, whose
    measurement holds words, one completion."""
    if m.table is None:
        targets = [a.copy() for a in m.targets]
        targets[0][1, 2] = bad
        return dataclasses.replace(m, targets=targets)
    t = m.table.copy()
    col = {"lpbs": "ilp", "sentence_pairs": "sent_less_score", "multiple_choice": "score1",
           "perplexity": "ll", "generated_answers": "prediction"}.get(e.family.name)
    if col is None:
        t.at[3, "completions"] = (*t.at[3, "completions"][:2], bad, *t.at[3, "completions"][3:])
    else:
        if col == "prediction":
            t[col] = t[col].astype(float)
        t.at[3, col] = bad
    return dataclasses.replace(m, table=t)


def one_word_set(e: Metric, m: Measurement) -> Measurement:
    """The measurement with its first attribute set left with one item."""
    if m.table is not None:
        t = m.table
        keep = (t["attribute_set"] != 0) | (t["attribute"] == t.loc[t["attribute_set"] == 0, "attribute"].iloc[0])
        return dataclasses.replace(m, table=t[keep].reset_index(drop=True))
    return dataclasses.replace(m, attributes=[m.attributes[0][:1], *m.attributes[1:]],
                               labels=dict(m.labels, attribute0=m.labels["attribute0"][:1]))


# --------------------------------------------------------------------------------------
# Comparing results
# --------------------------------------------------------------------------------------


def plain(x: Any) -> Any:
    """A result field as plain Python (numpy scalars and arrays unwrapped)."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [plain(v) for v in x]
    if isinstance(x, (np.integer, np.bool_)):
        return x.item()
    if isinstance(x, np.floating):
        return float(x)
    return x


def differences(a: Any, b: Any, tol: float, path: str = "") -> list[str]:
    """Where two plain structures differ (numbers within relative/absolute ``tol``; 0: bitwise)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in one" for k in set(a) ^ set(b)]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], tol, f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, tol, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return []
        same = a == b if tol == 0 else math.isclose(a, b, rel_tol=tol, abs_tol=tol)
        return [] if same else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def without(d: Any, path: list[str]) -> Any:
    """``d`` without the entry at the dotted ``path`` (``*`` matches every key of a level)."""
    if not isinstance(d, dict) or not path:
        return d
    head, rest = path[0], path[1:]
    return {k: (without(v, rest) if rest else None) if head in ("*", k) else v
            for k, v in d.items() if rest or head not in ("*", k)}


def summary(out: MetricOutput, drop: set[str] = frozenset()) -> dict[str, Any]:
    """The headline and fields of a result, without the (dotted) fields in ``drop``."""
    d = {"value": plain(out.value), **{k: plain(v) for k, v in out.fields.items()}}
    for f in drop:
        d = without(d, f.split("."))
    return d


# --------------------------------------------------------------------------------------
# The checks (plain functions: the tests of the tests call them on broken metrics)
# --------------------------------------------------------------------------------------


def declared(name: str) -> dict[str, str]:
    """The metric's declarations, checked against :data:`PROPERTIES` (AssertionError naming the gap)."""
    e = registry.get(name)
    props = dict(e.properties)
    missing = [p for p in PROPERTIES if p not in props]
    assert not missing, f"metric {name!r} declares no {', '.join(missing)} property (audit.entries.PROPERTIES)"
    unknown = sorted(set(props) - set(PROPERTIES))
    assert not unknown, f"metric {name!r} declares unknown properties {unknown}"
    for p, v in props.items():
        assert not (p in ALWAYS and v.startswith("n/a")), f"metric {name!r}: {p} cannot be declared n/a"
        ok = v.startswith(PROPERTIES[p]) or (v.startswith("n/a: ") and len(v) > 15)
        assert ok, f"metric {name!r}: property {p} = {v!r}; expected one of {PROPERTIES[p]} or 'n/a: <reason>'"
    assert e.family.name in BUILDERS, f"family {e.family.name!r} of metric {name!r} has no synthetic builder here"
    return props


def random_fields(props: dict[str, str]) -> set[str]:
    """The fields the seed drives (``seeded: a, b``)."""
    v = props["seed"]
    return {f.strip() for f in v.split(":", 1)[1].split(",")} if v.startswith("seeded:") else set()


def run(name: str, m: Measurement, tmp, seed: int | None = 7, **extra: Any) -> MetricOutput:
    e = registry.get(name)
    params = {k: v for k, v in FAST.items() if k in e.params}
    params.update(BUILDERS[e.family.name].params(tmp), **extra)
    return registry.analyse(m, name, params, seed=seed)


def measurement(name: str, seed: int = 0) -> Measurement:
    e = registry.get(name)
    return BUILDERS[e.family.name].make(e, np.random.default_rng(seed))


def subject(name: str, prop: str) -> tuple[Any, Measurement] | None:
    """The entry and synthetic measurement a property check runs on; ``None`` where the metric
    declares the property not applicable (``n/a ...``)."""
    if declared(name)[prop].startswith("n/a"):
        return None
    return registry.get(name), measurement(name)


def check_item_order(name: str, tmp) -> None:
    props = declared(name)
    if (got := subject(name, "item_order")) is None:
        return
    _, m = got
    base = run(name, m, tmp)
    drop = random_fields(props)
    for r in range(3):
        other = run(name, permute_items(registry.get(name), m, np.random.default_rng(100 + r)), tmp)
        diff = differences(summary(base, drop), summary(other, drop), 1e-9)
        assert not diff, f"{name}: permuting the items changed {diff[:3]}"


def check_group_swap(name: str, tmp) -> None:
    how = declared(name)["group_swap"]
    if (got := subject(name, "group_swap")) is None:
        return
    e, m = got
    v, w = run(name, m, tmp).value, run(name, swap_groups(e, m), tmp).value
    if how.startswith("flips"):
        assert abs(v - e.no_bias) > 1e-6, f"{name}: the synthetic measurement shows no bias ({v})"
        assert math.isclose(w - e.no_bias, -(v - e.no_bias), rel_tol=1e-9, abs_tol=1e-9), (
            f"{name}: swapping the groups gave {w}, expected {2 * e.no_bias - v}")
    else:
        assert math.isclose(w, v, rel_tol=1e-9, abs_tol=1e-12), f"{name}: swapping the groups changed {v} to {w}"


def check_scale(name: str, tmp) -> None:
    if (got := subject(name, "scale")) is None:
        return
    e, m = got
    v = run(name, m, tmp).value
    for c in (0.01, 3.7, 250.0):
        w = run(name, scale(e, m, c), tmp).value
        assert math.isclose(w, v, rel_tol=1e-9, abs_tol=1e-12), f"{name}: scaling by {c} changed {v} to {w}"


def check_seed(name: str, tmp) -> None:
    """Bitwise reproducible; another seed changes only the declared fields. Metrics with a
    permutation test are also run with sampled permutations (their p-value then depends on the seed)."""
    props = declared(name)
    m = measurement(name)
    rand = random_fields(props)
    sampled = [{}, {"permutations": 200}] if "permutations" in registry.get(name).params else [{}]
    for extra in sampled:
        a, b = run(name, m, tmp, seed=11, **extra), run(name, m, tmp, seed=11, **extra)
        diff = differences(summary(a), summary(b), 0)
        assert not diff, f"{name}: the same seed gave different results {diff[:3]}"
        assert (a.items is None) == (b.items is None), f"{name}: the same seed gave a per-item table once"
        if a.items is not None:
            pd.testing.assert_frame_equal(a.items, b.items, check_exact=True, obj=f"{name}: per-item table")
        c = run(name, m, tmp, seed=12, **extra)
        diff = differences(summary(a, rand), summary(c, rand), 0)
        assert not diff, f"{name}: another seed changed fields it does not declare random: {diff[:3]}"
        if rand:
            assert differences(summary(a), summary(c), 0), f"{name}: declared seeded, but another seed changed nothing"


def check_non_finite(name: str, tmp) -> None:
    if (got := subject(name, "non_finite")) is None:
        return
    e, m = got
    for bad in (math.nan, math.inf, -math.inf):
        try:
            out = run(name, spoil(e, m, bad), tmp)
        except AuditError as err:
            assert "\n" not in str(err) and str(err), f"{name}: {bad} refused without one clear line: {err!r}"
            continue
        raise AssertionError(f"{name}: a {bad} in the measurement was not refused (value {out.value})")


def check_min_set_size(name: str, tmp) -> None:
    if (got := subject(name, "min_set_size")) is None:
        return
    e, m = got
    with pytest.raises(AuditError, match=f"at least {MIN_SET_SIZE}") as err:
        run(name, one_word_set(e, m), tmp)
    assert "\n" not in str(err.value)


CHECKS = {"item_order": check_item_order, "group_swap": check_group_swap, "scale": check_scale,
          "seed": check_seed, "non_finite": check_non_finite, "min_set_size": check_min_set_size}


# --------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------


def test_every_registered_metric_declares_every_property():
    assert set(CHECKS) == set(PROPERTIES)
    for name in registry.names():
        declared(name)


@pytest.mark.parametrize("prop", sorted(CHECKS))
@pytest.mark.parametrize("name", NAMES)
def test_property(name, prop, tmp_path):
    CHECKS[prop](name, tmp_path)


# --------------------------------------------------------------------------------------
# The checks catch what they should: toy metrics, registered for one test, that break a property
# --------------------------------------------------------------------------------------


def _vectors(m: Measurement) -> np.ndarray:
    return np.concatenate([*m.targets, *m.attributes])


def _seeded_value(m: Measurement, seed: int | None = None) -> MetricOutput:
    return MetricOutput(value=float(np.random.default_rng(seed).random()), fields={"ci": [0.0, 1.0], "seed": seed})


#: property -> an analysis that violates it (every other property holds or does not matter).
BROKEN: dict[str, Callable[..., MetricOutput]] = {
    "item_order": lambda m, **p: MetricOutput(value=float(m.targets[0][0, 0])),  # the first word only
    "group_swap": lambda m, **p: MetricOutput(value=float(np.abs(_vectors(m)).mean())),  # symmetric, > 0
    "scale": lambda m, **p: MetricOutput(value=float(np.linalg.norm(_vectors(m), axis=1).mean())),  # a length
    "seed": lambda m, **p: MetricOutput(value=float(np.random.default_rng().random())),  # unseeded
    "non_finite": lambda m, **p: MetricOutput(value=float(np.nanmean(_vectors(m)))),  # NaN skipped silently
    "min_set_size": lambda m, **p: MetricOutput(value=float(m.targets[0].mean() - m.targets[1].mean())),
}


def _toy(monkeypatch, analyse: Callable[..., MetricOutput], properties: dict[str, str],
         params: dict[str, Any] | None = None) -> str:
    toy = Metric(name="toy_broken", family=ASSOCIATION, analyse=analyse, params=params or {},
                 headline="a deliberately broken toy", reference="tests/test_common.py", n_targets=(2, 2),
                 n_attributes=(2, 2), properties=properties)
    monkeypatch.setitem(registry.METRICS, toy.name, toy)
    return toy.name


@pytest.mark.parametrize("prop", sorted(BROKEN))
def test_a_violated_property_fails(prop, monkeypatch, tmp_path):
    holds = {"item_order": "invariant", "group_swap": "flips", "scale": "invariant", "seed": "deterministic",
             "non_finite": "refused", "min_set_size": "refused"}
    name = _toy(monkeypatch, BROKEN[prop], holds)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        CHECKS[prop](name, tmp_path)
    # declared as not applying (with its reason), the same metric passes that check
    if prop not in ALWAYS:
        name = _toy(monkeypatch, BROKEN[prop], {**holds, prop: "n/a: this toy breaks it on purpose"})
        CHECKS[prop](name, tmp_path)


def test_a_random_headline_must_be_declared(monkeypatch, tmp_path):
    rest = {p: "n/a: not this test" for p in PROPERTIES} | {"non_finite": "refused"}
    name = _toy(monkeypatch, _seeded_value, {**rest, "seed": "seeded: ci, seed"}, params={"seed": None})
    with pytest.raises(AssertionError, match="does not declare random"):
        check_seed(name, tmp_path)
    name = _toy(monkeypatch, _seeded_value, {**rest, "seed": "seeded: value, seed"}, params={"seed": None})
    check_seed(name, tmp_path)


@pytest.mark.parametrize("properties, why", [
    ({}, "declares no"),
    ({p: "invariant" for p in ("item_order", "group_swap", "scale")}, "declares no seed, non_finite"),
    ({**{p: "n/a: not this test" for p in PROPERTIES}}, "seed cannot be declared n/a"),
    ({**{p: "n/a: not this test" for p in PROPERTIES}, "scale": "mostly"}, "property scale = 'mostly'"),
    ({**{p: "n/a: not this test" for p in PROPERTIES}, "speed": "fast"}, "unknown properties"),
    ({**{p: "n/a: not this test" for p in PROPERTIES}, "scale": "n/a: "}, "property scale"),
])
def test_an_uncovered_metric_fails(properties, why, monkeypatch):
    _toy(monkeypatch, BROKEN["scale"], properties)
    with pytest.raises(AssertionError, match=why):
        test_every_registered_metric_declares_every_property()


def test_a_family_without_builder_fails(monkeypatch):
    name = _toy(monkeypatch, BROKEN["scale"], {**{p: "n/a: not this test" for p in PROPERTIES},
                                                "seed": "deterministic", "non_finite": "refused"})
    monkeypatch.delitem(BUILDERS, ASSOCIATION.name)
    with pytest.raises(AssertionError, match="no synthetic builder"):
        declared(name)


@pytest.mark.parametrize("name", [n for n in NAMES if registry.get(n).properties.get("scale", "").startswith("n/a")
                                  and registry.get(n).family.name in (ASSOCIATION.name, PAIR_SCORES.name)])
def test_declared_scale_exceptions_are_real(name, monkeypatch, tmp_path):
    """Where an entry says scale invariance does not hold, claiming it fails (the reason is not an excuse)."""
    e = registry.get(name)
    if e.family is PAIR_SCORES:  # near-ties: equal at 3 decimals, apart once scaled
        base = measurement(name)
        t = base.table.assign(sent_more_score=-1.0001, sent_less_score=-1.0004)
        base = dataclasses.replace(base, table=t)
        v, w = run(name, base, tmp_path).value, run(name, scale(e, base, 10.0), tmp_path).value
        assert (v, w) == (0.0, 100.0)
        return
    claimed = dataclasses.replace(e, properties={**e.properties, "scale": "invariant"})
    monkeypatch.setitem(registry.METRICS, name, claimed)
    with pytest.raises(AssertionError, match="scaling by"):
        check_scale(name, tmp_path)


def test_rnd_cosine_is_scale_invariant(tmp_path):
    e, m = registry.get("rnd"), measurement("rnd")
    v = [registry.analyse(scale(e, m, c), "rnd", {"distance": "cosine"}).value for c in (1.0, 0.01, 250.0)]
    assert v[0] != 0 and np.allclose(v, v[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", ["weat", "seat", "gweat", "rnd", "ect"])
def test_identical_groups_score_the_no_bias_value(name, tmp_path):
    """Two identical groups measure no bias: the headline is the entry's ``no_bias`` (what the
    reports draw as the reference line), e.g. 1 for ECT (Dev & Phillips 2019: rho = 1, no bias).
    (SAME, Direct Bias and RIPA refuse identical groups: no direction between them; RNSB, MAC and
    Cramér's V measure something else than a difference between the groups.)"""
    m = measurement(name)
    m = dataclasses.replace(m, targets=[m.targets[0], m.targets[0].copy(), *m.targets[2:]])
    assert run(name, m, tmp_path).value == pytest.approx(registry.get(name).no_bias, abs=1e-12)
