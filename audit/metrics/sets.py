"""How a test's target and attribute sets map onto each association metric (array level).

Every metric takes numpy arrays of word vectors (one 2-D array per word set, rows = words)
and returns a :class:`audit.result.MetricOutput`. Per-item tables identify rows by ``set``
(``"X"``/``"Y"``/``"A"``/``"B"`` for WEAT; ``"target<i>"`` / ``"attribute<j>"`` otherwise) and
``index`` (row within that set); the runner adds the words.

Each ``<metric>_sets(targets, attributes, **params)`` takes the lists of arrays of a
:class:`audit.suites.WordTest` (one 2-D array per set, in order) and calls the metric's own
function; :func:`audit.registry.run_metric` checks the set counts and parameter names first.

Roles follow WEFE (Badilla et al. 2020): the **target sets are the social groups** (female /
male terms, names, nationalities) and the attribute sets hold the words whose association
with the groups is measured (career / family, occupations, pleasant / unpleasant). SAME,
Direct Bias and Cramér's V take a ``groups`` parameter: ``"targets"`` (default, the WEFE
roles) or ``"attributes"`` for tests written the other way round (e.g. WEAT 7/8, whose
attribute sets are the male / female terms); ``n_targets``/``n_attributes`` of their specs
describe the default roles and swap with ``groups="attributes"``. How a test with target sets
X, Y and attribute sets A, B maps onto each metric, and what the sign of the headline means:

============  =============================================================================
weat          X, Y targets; A, B attributes. d > 0: X closer to A (and/or Y to B) than the
              other way round.
same          group directions from the target sets (X vs Y: a_X - a_Y); the words of all
              attribute sets are scored (items labelled ``attribute<j>``). Headline >= 0
              (magnitude); signed per-word b(t) > 0: the word is closer to X.
gweat         target set i matched with attribute set i (equal numbers; the formula is
              symmetric in the two roles). > 0: groups lean towards their matching sets.
direct_bias   target sets = paired defining sets (row i of every set forms a tuple, equal
              lengths: she/he, woman/man); the words of all attribute sets are the neutral
              words. Headline in [0, 1]; per-word ``cos`` > 0 leans to X.
rnd           WEFE template (2 targets, 1 attribute set): targets X, Y; the attribute set is
              the union of all attribute sets (per-set values in ``rnd_per_attribute``).
              Euclidean: > 0 means the attribute words are closer to Y; ``distance="cosine"``:
              > 0 means closer to X (WEFE's conventions).
ect           as rnd (union of attribute sets; per set in ``ect_per_attribute``, None where
              undefined for that set alone). 1 = no bias; lower = more bias.
ripa          as rnd; X, Y must be paired (equal lengths). > 0: attribute words lean to X.
mac           all target sets x all attribute sets. In [0, 2]; lower = closer.
rnsb          all target sets; A = "positive" (label +1), B = "negative" (label -1). >= 0;
              0 = every target word equally "negative".
cramers_v     the classifier learns the protected classes = the target sets and predicts a
              class for every attribute word, whose stereotype class is its attribute set.
              In [0, 1]; 0 = no association.
============  =============================================================================
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from audit.errors import DataError, ParameterError
from audit.metrics.cramers_v import cramers_v
from audit.metrics.same import direct_bias, gweat, same
from audit.metrics.weat import as_vectors, weat, weat_scores
from audit.metrics.wefe_family import ect, mac, ripa, rnd, rnsb
from audit.result import MetricOutput
from audit.stats import DEFAULT_P_CONVENTION, sharded_exact_p_value, shards_worthwhile


def weat_sets(targets: list, attributes: list, **params: Any) -> MetricOutput:
    return weat(targets[0], targets[1], attributes[0], attributes[1], **params)


def union_attributes(
    fn: Callable[..., MetricOutput], field: str, targets: list, attributes: list, **params: Any
) -> MetricOutput:
    """Run a WEFE (2 targets, 1 attribute set) metric on the union of the attribute sets.

    Items are relabelled to their own attribute set; the metric on each attribute set alone
    is reported in ``fields[field]`` (None where it is undefined for that set alone).
    """
    arrays = [as_vectors(a, f"attributes[{j}]") for j, a in enumerate(attributes)]
    dims = {a.shape[1] for a in arrays}
    if len(dims) > 1:
        raise DataError(f"attributes: the attribute sets have different vector dimensions {sorted(dims)}")
    out = fn(targets[0], targets[1], np.concatenate(arrays), **params)
    if len(arrays) > 1:
        per_set: list[float | None] = []
        for a in arrays:
            try:
                per_set.append(fn(targets[0], targets[1], a, **params).value)
            except DataError:
                per_set.append(None)
        out.fields[field] = per_set
    else:
        out.fields[field] = [out.value]
    if out.items is not None:
        sizes = [a.shape[0] for a in arrays]
        owner = np.repeat(np.arange(len(arrays)), sizes)
        local = np.concatenate([np.arange(n) for n in sizes])
        items = out.items.copy()
        rows = items["index"].to_numpy()
        items["set"] = [f"attribute{j}" for j in owner[rows]]
        items["index"] = local[rows]
        out.items = items
    return out


def with_roles(fn: Callable[..., MetricOutput], targets: list, attributes: list, groups: str,
               **params: Any) -> MetricOutput:
    """Call a WEFE-template ``fn(group_sets, scored_sets, **params)`` (its "targets" are the social
    groups) with the side ``groups`` names as the groups; when that is the test's attribute side,
    the per-item labels are swapped back to the test's roles (``attribute<j>`` <-> ``target<j>``)."""
    if groups not in ("targets", "attributes"):
        raise ParameterError(f"groups must be 'targets' or 'attributes', got {groups!r}")
    if groups == "targets":
        return fn(targets, attributes, **params)
    out = fn(attributes, targets, **params)
    if out.items is not None and "set" in out.items.columns:
        swap = {"target": "attribute", "attribute": "target"}
        out.items = out.items.assign(set=[
            next((swap[k] + s[len(k):] for k in swap if str(s).startswith(k)), s) for s in out.items["set"]])
    return out


def rnd_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return with_roles(lambda g, s, **p: union_attributes(rnd, "rnd_per_attribute", g, s, **p),
                      targets, attributes, groups, **params)


def ect_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return with_roles(lambda g, s, **p: union_attributes(ect, "ect_per_attribute", g, s, **p),
                      targets, attributes, groups, **params)


def ripa_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return with_roles(lambda g, s, **p: union_attributes(ripa, "ripa_per_attribute", g, s, **p),
                      targets, attributes, groups, **params)


def rnsb_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return with_roles(lambda g, s, **p: rnsb(g, s[0], s[1], **p), targets, attributes, groups, **params)


def by_groups(
    fn: Callable[..., MetricOutput], targets: list, attributes: list, groups: str, **params: Any
) -> MetricOutput:
    """Call ``fn(group_sets, scored_sets, **params)`` with the roles ``groups`` names, and label
    the per-item rows (the scored words, ``target<i>`` in ``fn``'s output) with their role in
    the test."""
    if groups not in ("targets", "attributes"):
        raise ParameterError(f"groups must be 'targets' or 'attributes', got {groups!r}")
    if groups == "attributes":
        return fn(attributes, targets, **params)
    out = fn(targets, attributes, **params)
    if out.items is not None:
        out.items = out.items.assign(set=[s.replace("target", "attribute") for s in out.items["set"]])
    return out


#: Fewest items (words, sentences) a set may keep after look-up: with one word per set the
#: spread within a group is undefined, a permutation test has nothing to permute within the
#: set and a bootstrap redraws the same word (d = 1.414, p = 0, CI [1.414, 1.414] before).
MIN_SET_SIZE = 2


def check_set_sizes(targets: list, attributes: list, labels: dict[str, list[str]] | None = None,
                    set_names: dict[str, str] | None = None) -> None:
    """Refuse, with one line, a measurement whose target or attribute set kept fewer than
    :data:`MIN_SET_SIZE` items after look-up, for every metric on word or sentence sets.

    ``labels``/``set_names`` (a :class:`audit.entries.Measurement`'s) name the set and the
    words found; without them the set is named by its label (``target0``, ``attribute1``).
    Raises :class:`~audit.errors.DataError`: ``word set 'female' (target0) has 1 item after
    look-up (she); every set needs at least 2``.
    """
    labels, set_names = labels or {}, set_names or {}
    bad = []
    for role, arrays in (("target", targets), ("attribute", attributes)):
        for i, a in enumerate(arrays):
            n = int(np.shape(a)[0]) if np.ndim(a) >= 1 else 0
            if n >= MIN_SET_SIZE:
                continue
            label = f"{role}{i}"
            name = set_names.get(label)
            found = labels.get(label) or []
            what = f"{name!r} ({label})" if name else label
            words = f" ({', '.join(map(str, found))})" if found else ""
            bad.append(f"word set {what} has {n} item{'s' if n != 1 else ''} after look-up{words}")
    if bad:
        raise DataError("; ".join(bad) + f"; every set needs at least {MIN_SET_SIZE} "
                        "(a one-word set has no spread: the effect size, p-value and interval are degenerate)")


def same_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return by_groups(lambda g, s, **p: same(s, g, **p), targets, attributes, groups, **params)


def direct_bias_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return by_groups(lambda g, s, **p: direct_bias(s, g, **p), targets, attributes, groups, **params)


def cramers_v_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return by_groups(cramers_v, targets, attributes, groups, **params)


def gweat_sets(targets: list, attributes: list, **params: Any) -> MetricOutput:
    return gweat(targets, attributes, **params)


def mac_sets(targets: list, attributes: list, *, groups: str = "targets", **params: Any) -> MetricOutput:
    return with_roles(lambda g, s, **p: mac(g, s, **p), targets, attributes, groups, **params)


def weat_sets_sharded(targets: list, attributes: list, params: dict[str, Any], shards: int,
                      map_fn: Callable | None = None) -> MetricOutput | None:
    """WEAT with its exact permutation p-value counted in ``shards`` pieces
    (:func:`audit.stats.sharded_exact_p_value`, ``map_fn`` the parallel map), or ``None`` when
    splitting does not pay (:func:`audit.stats.shards_worthwhile`). The other fields (effect
    size, bootstrap CI with the given seed) come from :func:`weat` run without its own test."""
    if len(targets) != 2 or len(attributes) != 2:
        return None
    (X, Y), (A, B) = targets, attributes
    n_x, n_y = len(X), len(Y)
    if not shards_worthwhile(n_x + n_y, n_x, params.get("permutations", "auto"), shards):
        return None
    scores = np.concatenate([weat_scores(X, A, B), weat_scores(Y, A, B)])
    test = sharded_exact_p_value(scores, n_x, params.get("alternative", "greater"), shards, map_fn,
                                 p_convention=params.get("p_convention", DEFAULT_P_CONVENTION))
    out = weat_sets(targets, attributes, **{**params, "permutations": 1})
    out.fields.update(test)
    return out
