"""RND, RNSB, MAC, ECT and RIPA, with the conventions of WEFE 1.0.1.

WEFE: Badilla, P., Bravo-Marquez, F. & Pérez, J. (2020). WEFE: The Word Embeddings Fairness
Evaluation Framework. IJCAI 2020. Each function reproduces the headline number of the
corresponding ``wefe.metrics`` class (``normalize=False``, all words found) on the same vectors;
the tests cross-check them. Arrays are used as given (no normalisation, as WEFE's default).

WEFE's set roles ("templates"): RND, ECT and RIPA take two target sets and **one** attribute
set; MAC takes any number of each; RNSB any number of target sets and two attribute sets
(attribute set 0 = "positive", attribute set 1 = "negative"). How the registry maps a test
with several attribute sets onto the one-attribute-set metrics is documented in
:mod:`audit.metrics`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.errors import DataError, ParameterError
from audit.metrics.weat import as_vectors, check_same_dim, cosine_matrix
from audit.result import MetricOutput
from audit.stats import check_seed, fresh_seed, stream_seeds

__all__ = ["rnd", "rnsb", "mac", "ect", "ripa"]


def _two_targets_one_attribute(T0: Any, T1: Any, A: Any, *, nonzero: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    T0 = as_vectors(T0, "T0", nonzero=nonzero)
    T1 = as_vectors(T1, "T1", nonzero=nonzero)
    A = as_vectors(A, "A", nonzero=nonzero)
    check_same_dim([("T0", T0), ("T1", T1), ("A", A)])
    return T0, T1, A


def _attribute_items(A: np.ndarray, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    return pd.DataFrame({"set": ["attribute0"] * A.shape[0], "index": np.arange(A.shape[0]), **columns})


def _nonzero_mean(v: np.ndarray, name: str) -> np.ndarray:
    if not np.any(v != 0.0):
        raise DataError(f"{name}: the mean vector of the set is zero (cosine similarity undefined)")
    return v


# --------------------------------------------------------------------------------------------
# RND
# --------------------------------------------------------------------------------------------


def rnd(T0: Any, T1: Any, A: Any, *, distance: str = "euclidean") -> MetricOutput:
    """Relative Norm Distance (Garg, Schiebinger, Jurafsky & Zou 2018, PNAS), as in WEFE.

    With ``m_0``, ``m_1`` the mean vectors of the target sets, per attribute word ``a``:

    * ``distance="euclidean"`` (Garg et al.; WEFE ``distance="norm"``):
      ``r(a) = ||a - m_0|| - ||a - m_1||``; positive: ``a`` is closer to T1.
    * ``distance="cosine"`` (WEFE ``distance="cos"``, which uses the cosine *similarity*):
      ``r(a) = cos(a, m_0) - cos(a, m_1)``; positive: ``a`` is closer to T0.

    ``RND = mean_a r(a)`` (WEFE averages; Garg et al. sum over the attribute words).

    Returns
    -------
    MetricOutput
        ``value`` = RND; ``fields``: ``rnd``, ``distance``; ``items``: one row per attribute
        word (``set``, ``index``, ``distance`` = r(a)).
    """
    aliases = {"euclidean": "euclidean", "norm": "euclidean", "cosine": "cosine", "cos": "cosine"}
    if distance not in aliases:
        raise ParameterError(f"distance must be 'euclidean' or 'cosine', got {distance!r}")
    distance = aliases[distance]
    T0, T1, A = _two_targets_one_attribute(T0, T1, A, nonzero=distance == "cosine")
    m0, m1 = T0.mean(axis=0), T1.mean(axis=0)
    if distance == "euclidean":
        r = np.linalg.norm(A - m0, axis=1) - np.linalg.norm(A - m1, axis=1)
    else:
        m = np.stack([_nonzero_mean(m0, "T0"), _nonzero_mean(m1, "T1")])
        cos = cosine_matrix(A, m)
        r = cos[:, 0] - cos[:, 1]
    value = float(r.mean())
    return MetricOutput(
        value=value, fields={"rnd": value, "distance": distance}, items=_attribute_items(A, {"distance": r})
    )


# --------------------------------------------------------------------------------------------
# MAC
# --------------------------------------------------------------------------------------------


def mac(targets: Sequence[Any], attributes: Sequence[Any]) -> MetricOutput:
    """Mean Average Cosine distance (Manzini, Lim, Tsvetkov & Black 2019, NAACL), as in WEFE.

    ``MAC = mean over (t, A_j) of mean_{a in A_j} (1 - cos(t, a))`` for every target word
    ``t`` of every target set and every attribute set ``A_j`` (each (word, attribute set) pair
    weighs the same). In [0, 2]; 1 means orthogonal on average; smaller means the targets
    are closer to the attribute sets.

    Returns
    -------
    MetricOutput
        ``value`` = MAC; ``fields``: ``mac``; ``items``: one row per target word with
        ``set`` ("target<i>"), ``index`` and ``distance_attribute<j>`` (its mean cosine
        distance to attribute set j).
    """
    T = _sets(targets, "targets")
    A = _sets(attributes, "attributes")
    check_same_dim([(f"targets[{i}]", t) for i, t in enumerate(T)] + [(f"attributes[{j}]", a) for j, a in enumerate(A)])
    allt = np.concatenate(T)
    dist = np.stack([(1.0 - cosine_matrix(allt, a)).mean(axis=1) for a in A], axis=1)  # (n_t, n_A)
    value = float(dist.mean())
    items = pd.DataFrame(
        {
            "set": [f"target{i}" for i, t in enumerate(T) for _ in range(t.shape[0])],
            "index": np.concatenate([np.arange(t.shape[0]) for t in T]),
            **{f"distance_attribute{j}": dist[:, j] for j in range(len(A))},
        }
    )
    return MetricOutput(value=value, fields={"mac": value}, items=items)


def _sets(sets: Any, name: str, *, nonzero: bool = True) -> list[np.ndarray]:
    if isinstance(sets, np.ndarray) or not isinstance(sets, Sequence) or len(sets) == 0:
        raise ParameterError(f"{name}: expected a non-empty list of 2-D arrays (one per word set)")
    return [as_vectors(s, f"{name}[{i}]", nonzero=nonzero) for i, s in enumerate(sets)]


# --------------------------------------------------------------------------------------------
# ECT
# --------------------------------------------------------------------------------------------


def ect(T0: Any, T1: Any, A: Any) -> MetricOutput:
    """Embedding Coherence Test (Dev & Phillips 2019, AISTATS), as in WEFE.

    ``ECT = Spearman rho( [cos(a, m_0)]_a , [cos(a, m_1)]_a )`` with ``m_0``, ``m_1`` the mean
    vectors of the target sets, over the attribute words ``a`` (ties: average ranks, as
    :func:`scipy.stats.spearmanr`). In [-1, 1]; 1 means both target sets rank the attribute
    words alike (no bias); lower means more bias.

    Raises :class:`DataError` when ``A`` has fewer than 2 words or one list of similarities is
    constant (the correlation is undefined).

    Returns
    -------
    MetricOutput
        ``value`` = rho; ``fields``: ``ect``, ``p_value`` (scipy's two-sided test of rho = 0);
        ``items``: one row per attribute word with ``sim_target0``, ``sim_target1``.
    """
    T0, T1, A = _two_targets_one_attribute(T0, T1, A, nonzero=True)
    if A.shape[0] < 2:
        raise DataError(f"A: ECT needs at least 2 attribute words, got {A.shape[0]}")
    m = np.stack([_nonzero_mean(T0.mean(axis=0), "T0"), _nonzero_mean(T1.mean(axis=0), "T1")])
    sims = cosine_matrix(A, m)
    for j in range(2):
        if np.ptp(sims[:, j]) == 0.0:
            raise DataError(
                f"T{j}: every attribute word has the same similarity to this target set's mean "
                "vector; the ECT rank correlation is undefined"
            )
    from scipy.stats import spearmanr  # local: see audit/multitest.py

    res = spearmanr(sims[:, 0], sims[:, 1])
    value = float(res.statistic)
    return MetricOutput(
        value=value,
        fields={"ect": value, "p_value": float(res.pvalue)},
        items=_attribute_items(A, {"sim_target0": sims[:, 0], "sim_target1": sims[:, 1]}),
    )


# --------------------------------------------------------------------------------------------
# RIPA
# --------------------------------------------------------------------------------------------


def ripa(T0: Any, T1: Any, A: Any) -> MetricOutput:
    """Relational Inner Product Association (Ethayarajh, Duvenaud & Hirst 2019, ACL), as in WEFE.

    Row i of ``T0`` and row i of ``T1`` form a word pair (e.g. woman/man) with relation vector
    ``b_i = (x_i - y_i) / ||x_i - y_i||``. For each attribute word ``a`` (raw, un-normalised
    vector) ``RIPA_i(a) = a . b_i``; per word: mean and standard deviation (``ddof=0``) over the
    pairs; ``RIPA = mean_a mean_i RIPA_i(a)``. Positive: the attribute words lean towards T0.

    Raises :class:`DataError` when ``T0`` and ``T1`` differ in length (pairs) or a pair has
    identical vectors (no relation direction).

    Returns
    -------
    MetricOutput
        ``value`` = RIPA; ``fields``: ``ripa``, ``n_pairs``; ``items``: one row per attribute
        word with ``ripa`` (mean over pairs) and ``ripa_std``.
    """
    T0, T1, A = _two_targets_one_attribute(T0, T1, A, nonzero=False)
    if T0.shape[0] != T1.shape[0]:
        raise DataError(
            f"T1: RIPA pairs row i of T0 with row i of T1, so both need the same length; "
            f"got {T0.shape[0]} and {T1.shape[0]}"
        )
    diff = T0 - T1
    norms = np.linalg.norm(diff, axis=1)
    if np.any(norms == 0.0):
        bad = int(np.flatnonzero(norms == 0.0)[0])
        raise DataError(f"T0/T1: pair {bad} has identical vectors (no relation direction)")
    scores = A @ (diff / norms[:, None]).T  # (n_a, n_pairs)
    per_word = scores.mean(axis=1)
    value = float(per_word.mean())
    return MetricOutput(
        value=value,
        fields={"ripa": value, "n_pairs": int(T0.shape[0])},
        items=_attribute_items(A, {"ripa": per_word, "ripa_std": scores.std(axis=1)}),
    )


# --------------------------------------------------------------------------------------------
# RNSB
# --------------------------------------------------------------------------------------------




def _rnsb_iteration(
    X: np.ndarray, y: np.ndarray, targets_all: np.ndarray, *, holdout: bool, seed: int
) -> tuple[np.ndarray, float]:
    """One WEFE RNSB run: negative-class probabilities of the targets and the accuracy."""
    from sklearn.linear_model import LogisticRegression  # local: see audit/multitest.py
    from sklearn.model_selection import train_test_split

    clf = LogisticRegression(solver="liblinear", max_iter=10000, random_state=seed)
    if holdout:
        try:
            X_tr, X_te, y_tr, y_te = train_test_split(
                X, y, shuffle=True, random_state=seed, test_size=0.2, stratify=y
            )
        except ValueError as exc:
            raise ParameterError(
                f"holdout=True: cannot split the attribute words 80/20 with both sets in train and "
                f"test ({exc}); give more attribute words or pass holdout=False"
            ) from None
        clf.fit(X_tr, y_tr)
        accuracy = float(clf.score(X_te, y_te))
    else:
        clf.fit(X, y)
        accuracy = float(clf.score(X, y))
    neg = int(np.flatnonzero(clf.classes_ == -1)[0])
    return clf.predict_proba(targets_all)[:, neg], accuracy


def rnsb(
    targets: Sequence[Any],
    A0: Any,
    A1: Any,
    *,
    holdout: bool = True,
    n_iterations: int = 1,
    seed: int | None = None,
) -> MetricOutput:
    """Relative Negative Sentiment Bias (Sweeney & Najafian 2019, ACL), as in WEFE.

    A logistic regression (scikit-learn, ``solver="liblinear"``, ``max_iter=10000``,
    ``random_state`` = the iteration's seed) is trained on the attribute words, ``A0``
    labelled +1 ("positive") and ``A1`` labelled -1 ("negative"); with ``holdout=True`` on a
    stratified, shuffled 80 % split (``train_test_split(test_size=0.2, random_state=seed)``),
    the other 20 % giving the reported accuracy. Its probabilities of the negative class
    (A1) for all target words of all target sets are normalised to a distribution ``P`` and
    ``RNSB = KL(P || uniform) = sum_w P(w) ln(P(w) |W|)`` (natural log,
    :func:`scipy.stats.entropy`). 0 when every target word gets the same probability; larger
    means some targets are much more "negative" than others.

    ``n_iterations`` runs; the result is the mean of their KL divergences (WEFE), and the
    per-word probabilities are averaged. Iteration ``i`` uses the integer seed
    ``iteration_seeds[i]`` = word ``i`` of ``stream(seed, "classifier").generate_state(n,
    uint32)`` (:func:`audit.stats.stream_seeds`: child 5 of ``SeedSequence(seed)``) for both
    the split and the classifier, exactly as WEFE passes one ``random_state`` to both, so
    iteration ``i`` is WEFE's ``RNSB().run_query(..., random_state=iteration_seeds[i],
    holdout=holdout)``. (The former ``seed, seed + 1, ...`` made the runs of neighbouring
    seeds share iterations: seed 0's second run was seed 1's first.) With ``seed=None`` a seed
    is drawn from fresh entropy and reported in ``fields["seed"]`` so the run can be repeated.

    Returns
    -------
    MetricOutput
        ``value`` = RNSB; ``fields``: ``rnsb``, ``kl_per_iteration``, ``accuracy`` (mean),
        ``n_iterations``, ``holdout``, ``seed``, ``iteration_seeds``. ``items``: one row per target word
        (``set``, ``index``, ``negative_probability``, ``negative_share`` = its share of the
        summed mean probabilities).
    """
    T = _sets(targets, "targets", nonzero=False)
    A0 = as_vectors(A0, "A0")
    A1 = as_vectors(A1, "A1")
    check_same_dim([("A0", A0), ("A1", A1)] + [(f"targets[{i}]", t) for i, t in enumerate(T)])
    schema.flag(holdout, "holdout")
    n_iterations = schema.integer(n_iterations, "n_iterations", 1)
    seed = check_seed(seed)
    if seed is None:
        seed = fresh_seed()
    iteration_seeds = stream_seeds(seed, "classifier", int(n_iterations))

    X = np.concatenate([A0, A1])
    y = np.concatenate([np.ones(A0.shape[0]), -np.ones(A1.shape[0])])
    allt = np.concatenate(T)
    from scipy.stats import entropy  # local: see audit/multitest.py

    probs, kls, accs = [], [], []
    for it_seed in iteration_seeds:
        p, acc = _rnsb_iteration(X, y, allt, holdout=bool(holdout), seed=it_seed)
        dist = p / p.sum()
        kls.append(float(entropy(dist, np.full(dist.size, 1.0 / dist.size))))
        probs.append(p)
        accs.append(acc)
    mean_p = np.mean(probs, axis=0)
    value = float(np.mean(kls))
    items = pd.DataFrame(
        {
            "set": [f"target{i}" for i, t in enumerate(T) for _ in range(t.shape[0])],
            "index": np.concatenate([np.arange(t.shape[0]) for t in T]),
            "negative_probability": mean_p,
            "negative_share": mean_p / mean_p.sum(),
        }
    )
    fields = {
        "rnsb": value,
        "kl_per_iteration": kls,
        "accuracy": float(np.mean(accs)),
        "n_iterations": int(n_iterations),
        "holdout": bool(holdout),
        "seed": seed,
        "iteration_seeds": iteration_seeds,
    }
    return MetricOutput(value=value, fields=fields, items=items)
