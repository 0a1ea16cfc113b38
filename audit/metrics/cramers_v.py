"""Cramér's V classifier method (Dusi, Arici, Gerevini, Putelli & Serina 2024).

Reference
---------
M. Dusi et al., "Discrimination Bias Detection Through Categorical Association in Pre-Trained
Language Models", IEEE Access 12 (2024), doi:10.1109/ACCESS.2024.3482010; code:
github.com/micheledusi/SupervisedBiasDetection.

Method
------
1. A linear classifier learns the *protected property* from the embeddings of its words
   (e.g. male vs female terms; K >= 2 classes).
2. It predicts a protected class for every word of the *stereotyped property* (e.g.
   occupations, each labelled with the protected class it is stereotypically associated with;
   M >= 2 classes).
3. The M x K contingency table (stereotype class x predicted protected class) is tested with
   Pearson's chi-square (:func:`scipy.stats.chi2_contingency`, ``correction=False``) and its
   strength measured by Cramér's V (:func:`scipy.stats.contingency.association`,
   ``method="cramer"``): ``V = sqrt(chi2 / (n (min(M, K') - 1)))``. V is 0 when predictions
   are independent of the stereotype class and 1 when they are a function of it.
4. Repeated over ``n_cases`` seeded test cases, each training on a random subset
   (``train_fraction`` of each protected class, drawn without replacement); reported as the
   mean and standard deviation (``ddof=0``) of V over the cases and the averaged table.

Random streams (:mod:`audit.stats`): the training subsets are drawn from
``Generator(PCG64(stream(seed, "subsets")))`` (child 4 of ``SeedSequence(seed)``; per case,
per protected class in order, ``choice(n_k, size, replace=False)``), and case ``c``'s
classifier gets ``random_state = classifier_seeds[c]`` from ``stream(seed, "classifier")``
(child 5; :func:`audit.stats.stream_seeds`). LinearSVC with ``dual=False`` and lbfgs
LogisticRegression are deterministic, so only the subsets make the cases differ.

Conventions
-----------
* Default classifier: ``"svm"`` = :class:`sklearn.svm.LinearSVC` (``penalty="l2"``,
  ``loss="squared_hinge"``, ``dual=False``), as in the authors' code;
  ``"logistic"`` = :class:`sklearn.linear_model.LogisticRegression` (lbfgs, ``max_iter=1000``).
  Both one-vs-rest for K > 2 (LinearSVC) / multinomial (LogisticRegression).
* Protected classes never predicted for any stereotyped word (empty columns) are dropped
  before the test (K' = number of predicted classes). When the classifier predicts a single
  class for every word (K' = 1) there is no association to measure: that case gets V = 0,
  chi2 = 0, p = 1 and is counted in ``degenerate_cases``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.errors import ParameterError
from audit.metrics.weat import as_vectors, check_same_dim
from audit.stats import check_seed
from audit.result import MetricOutput
from audit.stats import STREAMS, fresh_seed, stream, stream_seeds

__all__ = ["contingency_association", "cramers_v"]


def contingency_association(table: Any) -> tuple[float, float, float, bool]:
    """Cramér's V, chi-square statistic and p-value of an M x K table of counts.

    Empty rows/columns are dropped first; a table with fewer than 2 non-empty rows or columns
    gives ``(0.0, 0.0, 1.0, True)`` (the last item flags the degenerate case).
    """
    from scipy.stats import chi2_contingency  # local: see audit/multitest.py
    from scipy.stats.contingency import association

    t = np.asarray(table, dtype=np.int64)
    t = t[t.sum(axis=1) > 0][:, t.sum(axis=0) > 0]
    if t.shape[0] < 2 or t.shape[1] < 2:
        return 0.0, 0.0, 1.0, True
    res = chi2_contingency(t, correction=False)
    v = float(association(t, method="cramer", correction=False))
    return v, float(res.statistic), float(res.pvalue), False


def _make_classifier(kind: str, seed: int) -> Any:
    from sklearn.linear_model import LogisticRegression  # local: see audit/multitest.py
    from sklearn.svm import LinearSVC

    if kind == "svm":
        return LinearSVC(penalty="l2", loss="squared_hinge", dual=False, random_state=seed)
    return LogisticRegression(max_iter=1000, random_state=seed)


def cramers_v(
    protected: Sequence[Any],
    stereotyped: Sequence[Any],
    *,
    classifier: str = "svm",
    n_cases: int = 10,
    train_fraction: float = 0.8,
    seed: int | None = None,
) -> MetricOutput:
    """Cramér's V between stereotype classes and the protected class a linear probe predicts.

    Parameters
    ----------
    protected : list of K >= 2 array-like (n_k, dim)
        Word vectors of each protected class (e.g. male terms, female terms): training data.
    stereotyped : list of M >= 2 array-like (m_j, dim)
        Word vectors of each stereotype class (e.g. occupations stereotyped as male, as
        female): the words whose protected class is predicted.
    classifier : {"svm", "logistic"}, default="svm"
    n_cases : int, default=10
        Number of seeded test cases (random training subsets).
    train_fraction : float in (0, 1], default=0.8
        Fraction of each protected class used for training in a case (at least one word).
    seed : int or None
        Seed of the task: the subset draws and the classifiers use its independent streams
        ``subsets`` and ``classifier`` (module docstring).

    Returns
    -------
    MetricOutput
        ``value`` = mean V over the cases. ``fields``: ``cramers_v`` (mean), ``cramers_v_std``,
        ``v_per_case``, ``chi2_mean``, ``p_values``, ``contingency`` (M x K mean table, rows =
        stereotype classes, columns = protected classes), ``degenerate_cases``, ``classifier``,
        ``n_cases``, ``train_fraction``, ``seed``, ``classifier_seeds``, ``random_streams``.
        ``items``: one row per stereotyped word:
        ``set`` ("target<j>"), ``index``, ``predicted`` (most frequent predicted protected
        class, ties to the lower index) and ``share_class<k>`` (fraction of cases predicting
        class k).
    """
    if classifier not in ("svm", "logistic"):
        raise ParameterError(f"classifier must be 'svm' or 'logistic', got {classifier!r}")
    n_cases = schema.integer(n_cases, "n_cases", 1)
    train_fraction = schema.number(train_fraction, "train_fraction", 0.0, strict=True, maximum=1.0, inclusive=True)
    seed = check_seed(seed)
    P = _class_sets(protected, "protected")
    S = _class_sets(stereotyped, "stereotyped")
    check_same_dim(
        [(f"protected[{k}]", p) for k, p in enumerate(P)] + [(f"stereotyped[{j}]", s) for j, s in enumerate(S)]
    )

    if seed is None:
        seed = fresh_seed()
    rng = np.random.Generator(np.random.PCG64(stream(seed, "subsets")))
    classifier_seeds = stream_seeds(seed, "classifier", int(n_cases))
    K, M = len(P), len(S)
    S_all = np.concatenate(S)
    s_labels = np.concatenate([np.full(s.shape[0], j) for j, s in enumerate(S)])
    votes = np.zeros((S_all.shape[0], K), dtype=np.int64)
    tables, vs, chis, ps, degenerate = [], [], [], [], 0
    for case in range(int(n_cases)):
        Xs, ys = [], []
        for k, p in enumerate(P):
            n_train = max(1, int(round(float(train_fraction) * p.shape[0])))
            idx = rng.choice(p.shape[0], size=n_train, replace=False)
            Xs.append(p[idx])
            ys.append(np.full(n_train, k))
        clf = _make_classifier(classifier, classifier_seeds[case])
        clf.fit(np.concatenate(Xs), np.concatenate(ys))
        pred = clf.predict(S_all).astype(np.int64)
        votes[np.arange(pred.size), pred] += 1
        table = np.zeros((M, K), dtype=np.int64)
        np.add.at(table, (s_labels, pred), 1)
        v, chi2, p_value, degen = contingency_association(table)
        tables.append(table)
        vs.append(v)
        chis.append(chi2)
        ps.append(p_value)
        degenerate += int(degen)

    value = float(np.mean(vs))
    items = pd.DataFrame(
        {
            "set": [f"target{j}" for j, s in enumerate(S) for _ in range(s.shape[0])],
            "index": np.concatenate([np.arange(s.shape[0]) for s in S]),
            "predicted": votes.argmax(axis=1),
            **{f"share_class{k}": votes[:, k] / float(n_cases) for k in range(K)},
        }
    )
    fields = {
        "cramers_v": value,
        "cramers_v_std": float(np.std(vs)),
        "v_per_case": [float(v) for v in vs],
        "chi2_mean": float(np.mean(chis)),
        "p_values": [float(p) for p in ps],
        "contingency": np.mean(tables, axis=0).tolist(),
        "degenerate_cases": degenerate,
        "classifier": classifier,
        "n_cases": int(n_cases),
        "train_fraction": float(train_fraction),
        "seed": seed,
        "classifier_seeds": classifier_seeds,
        "random_streams": {k: STREAMS.index(k) for k in ("subsets", "classifier")},
    }
    return MetricOutput(value=value, fields=fields, items=items)


def _class_sets(sets: Any, name: str) -> list[np.ndarray]:
    if isinstance(sets, np.ndarray) or not isinstance(sets, Sequence) or len(sets) < 2:
        raise ParameterError(f"{name}: expected a list of at least 2 arrays of word vectors (one per class)")
    return [as_vectors(s, f"{name}[{i}]") for i, s in enumerate(sets)]
