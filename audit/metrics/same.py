"""SAME, generalised WEAT and Direct Bias: cosine scores against attribute-group directions.

References
----------
* SAME: Schröder, S., Schulz, A., Kenneweg, P., Feldhans, R., Hinder, F. & Hammer, B. (2021).
  Evaluating Metrics for Bias in Word Embeddings. arXiv:2111.07864 (SAME for several groups:
  eqs. 14-16; boundedness in [0, 1]: Theorem 2); and Schröder, Schulz & Hammer, "The SAME
  score: Improved cosine based measure for semantic bias", IJCNN 2024 (arXiv:2203.14603).
  Reference implementation: HammerLabML/EmbeddingBiasScores, ``geometrical_bias/same.py``.
* Generalised WEAT: Swinger, N., De-Arteaga, M., Heffernan, N. T., Leiserson, M. D. M. &
  Kalai, A. T. (2019). What are the biases in my word embedding? AIES 2019; implemented as in
  HammerLabML/EmbeddingBiasScores ``geometrical_bias/generalized_weat.py``.
* Direct Bias: Bolukbasi, T., Chang, K.-W., Zou, J., Saligrama, V. & Kalai, A. (2016). Man is
  to computer programmer as woman is to homemaker? Debiasing word embeddings. NeurIPS 2016
  (bias direction by PCA of centred defining sets, as in ``debiaswe/we.py:doPCA``).

All three take *target* words (the words whose bias is measured, e.g. occupations) and two or
more *attribute* groups (the protected groups' defining words, e.g. male / female terms).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from audit import schema
from audit.errors import DataError, ParameterError
from audit.metrics.weat import as_vectors, check_same_dim, unit_rows
from audit.result import MetricOutput

__all__ = [
    "SAME_COMBINE",
    "same_directions",
    "same_scores",
    "same",
    "gweat",
    "bias_subspace",
    "paired_defining_sets",
    "direct_bias",
]

#: A difference of group means (of unit vectors) with norm <= _ZERO_TOL is zero; a Gram-Schmidt
#: residual <= max(_ZERO_TOL, _RANK_TOL * ||d_j||) means a linearly dependent direction.
_ZERO_TOL = 1e-12
_RANK_TOL = 1e-10


def _vector_sets(sets: Any, name: str, *, minimum: int, nonzero: bool = True) -> list[np.ndarray]:
    """Validate a sequence of 2-D word-vector arrays named ``name[0]``, ``name[1]``, ..."""
    if isinstance(sets, np.ndarray) or not isinstance(sets, Sequence):
        raise ParameterError(f"{name}: expected a list of 2-D arrays (one per word set), got {type(sets).__name__}")
    if len(sets) < minimum:
        raise ParameterError(f"{name}: needs at least {minimum} word sets, got {len(sets)}")
    return [as_vectors(s, f"{name}[{i}]", nonzero=nonzero) for i, s in enumerate(sets)]


def _check_dim(targets: list[np.ndarray], dim: int) -> None:
    for i, t in enumerate(targets):
        if t.shape[1] != dim:
            raise DataError(f"targets[{i}]: vector dimension {t.shape[1]} differs from the attributes' ({dim})")


def _items_frame(targets: list[np.ndarray], columns: dict[str, np.ndarray]) -> pd.DataFrame:
    data: dict[str, Any] = {
        "set": [f"target{i}" for i, t in enumerate(targets) for _ in range(t.shape[0])],
        "index": np.concatenate([np.arange(t.shape[0]) for t in targets]),
    }
    data.update(columns)
    return pd.DataFrame(data)


# --------------------------------------------------------------------------------------------
# SAME
# --------------------------------------------------------------------------------------------


def same_directions(attributes: Sequence[Any]) -> np.ndarray:
    """Orthonormal bias directions ``U`` (shape (J-1, dim)) of J >= 2 attribute groups.

    ``a_j = mean_{a in A_j} a / ||a||`` (mean of the unit vectors, not re-normalised, as in the
    reference implementation); the raw directions are ``d_j = a_0 - a_j`` (j = 1..J-1), made
    orthonormal by Gram-Schmidt in that order (computed with a QR decomposition whose signs are
    fixed so that ``u_j . d_j > 0``). For J = 2, ``U[0] = (a_0 - a_1) / ||a_0 - a_1||``.

    Raises :class:`DataError` when a direction is zero or linearly dependent on the previous
    ones (two groups with the same mean, or J - 1 > dim).
    """
    groups = _vector_sets(attributes, "attributes", minimum=2)
    check_same_dim([(f"attributes[{j}]", g) for j, g in enumerate(groups)])
    means = np.stack([unit_rows(g).mean(axis=0) for g in groups])
    d = (means[0] - means[1:]).T  # (dim, J-1)
    if d.shape[1] > d.shape[0]:
        raise DataError(
            f"attributes: {len(groups)} groups need {d.shape[1]} independent directions but the "
            f"vectors have dimension {d.shape[0]}"
        )
    q, r = np.linalg.qr(d)
    diag = np.diag(r)
    norms = np.linalg.norm(d, axis=0)
    for j in range(d.shape[1]):
        # means of unit vectors have norm <= 1, so an absolute tolerance is meaningful
        if norms[j] <= _ZERO_TOL or abs(diag[j]) <= max(_ZERO_TOL, _RANK_TOL * norms[j]):
            raise DataError(
                f"attributes[{j + 1}]: the mean direction of this group relative to attributes[0] "
                "is zero or a combination of the previous groups' directions (SAME undefined)"
            )
    return (q * np.sign(diag)).T


def same_scores(T: Any, U: np.ndarray) -> np.ndarray:
    """Components ``cos(t, u_j)`` of each row of ``T`` along the orthonormal directions ``U``.

    Returns an array of shape (len(T), len(U)).
    """
    T = as_vectors(T, "T", nonzero=True)
    if T.shape[1] != U.shape[1]:
        raise DataError(f"T: vector dimension {T.shape[1]} differs from the attributes' ({U.shape[1]})")
    return unit_rows(T) @ U.T


#: How SAME combines the per-direction cosines of a target when J > 2 (only the paper's norm).
SAME_COMBINE = ("norm",)


def same(targets: Sequence[Any], attributes: Sequence[Any], *, combine: str = "norm") -> MetricOutput:
    """SAME score (Scoring Association Means of word Embeddings; Schröder et al.).

    With ``a_j`` the mean of attribute group j's unit vectors (j = 0..J-1, not re-normalised),
    the bias directions ``d_j = a_0 - a_j`` (j = 1..J-1) are made orthonormal by Gram-Schmidt
    in that order (:func:`same_directions`), giving ``u_1..u_{J-1}``. The per-target score is
    the length of the vector of its cosines with the bias directions (Schröder et al. 2021,
    eqs. 14-16)::

        b(t) = || ( cos(t, u_1), ..., cos(t, u_{J-1}) ) ||_2

    which is the cosine between ``t`` and the bias subspace ``span(d_1..d_{J-1})`` (the length
    of the projection of ``t / ||t||`` onto it). Hence ``b(t)`` is in [0, 1] (their Theorem 2),
    0 exactly when ``t`` is orthogonal to every ``a_0 - a_j``, 1 exactly when ``t`` lies in the
    subspace, and independent of the order of the groups and of the choice of orthonormal
    basis. ``SAME = mean_t b(t)`` over all target words.

    Binary case (J = 2): ``b(t) = |cos(t, a_0 - a_1)|``. The signed ``cos(t, a_0 - a_1)`` is
    reported per word (positive: ``t`` is closer to group 0, e.g. A / male), with
    ``skew = mean_t cos`` and ``stereotype = std_t cos`` (``ddof=0``), the paper's
    decomposition into a systematic shift and a spread.

    ``combine`` accepts only ``"norm"`` (the definition above). The former ``"sum"``
    (``sum_j |cos(t, u_j)|``, up to ``sqrt(J-1)``: 1.414 for a target in the plane of three
    group means, where the paper gives 1.0) is removed: it is neither the paper's score nor
    the reference code's, whose ``individual_bias`` (EmbeddingBiasScores@ef1c49f) weights the
    components j >= 2 by the norm of the un-normalised Gram-Schmidt residual.

    Parameters
    ----------
    targets : list of array-like (n_i, dim)
        One or more target sets; SAME is over their union, with per-set values in fields.
    attributes : list of array-like (m_j, dim)
        Two or more attribute groups.
    combine : {"norm"}
        How the components are combined when J > 2 (recorded in the fields).

    Returns
    -------
    MetricOutput
        ``value`` = SAME. ``fields``: ``same``, ``per_set`` (SAME of each target set), ``n_groups``,
        ``combine`` (None for J = 2), and for J = 2 ``skew`` and ``stereotype`` (for J > 2
        ``skew`` is the list of mean components). ``items``: ``set`` ("target<i>"), ``index``,
        ``score`` (signed cosine for J = 2, ``b(t)`` otherwise), ``bias`` (``b(t)``, what is
        averaged) and, for J > 2, ``component<j>`` = ``cos(t, u_j)``.
    """
    if combine not in SAME_COMBINE:
        why = (
            " ('sum' was removed: it is not the SAME score of Schröder et al., which is the norm "
            "of the cosines with the bias directions, in [0, 1])" if combine == "sum" else ""
        )
        raise ParameterError(f"combine must be 'norm', got {combine!r}{why}")
    T = _vector_sets(targets, "targets", minimum=1)
    U = same_directions(attributes)
    _check_dim(T, U.shape[1])
    comps = [unit_rows(t) @ U.T for t in T]  # each (n_i, J-1)
    c = np.concatenate(comps)
    n_groups = U.shape[0] + 1
    if n_groups == 2:
        signed = c[:, 0]
        bias = np.abs(signed)
    else:
        bias = np.sqrt((c**2).sum(axis=1))
        signed = bias
    bounds = np.cumsum([0] + [t.shape[0] for t in T])
    per_set = [float(bias[bounds[i] : bounds[i + 1]].mean()) for i in range(len(T))]
    value = float(bias.mean())
    fields: dict[str, Any] = {
        "same": value,
        "per_set": per_set,
        "n_groups": n_groups,
        "combine": combine if n_groups > 2 else None,
    }
    columns: dict[str, np.ndarray] = {"score": signed, "bias": bias}
    if n_groups == 2:
        fields["skew"] = float(signed.mean())
        fields["stereotype"] = float(signed.std())
    else:
        fields["skew"] = [float(v) for v in c.mean(axis=0)]
        for j in range(c.shape[1]):
            columns[f"component{j + 1}"] = c[:, j]
    return MetricOutput(value=value, fields=fields, items=_items_frame(T, columns))


# --------------------------------------------------------------------------------------------
# Generalised WEAT
# --------------------------------------------------------------------------------------------


def gweat(targets: Sequence[Any], attributes: Sequence[Any]) -> MetricOutput:
    """Generalised WEAT for J >= 2 groups (Swinger et al. 2019).

    With all vectors scaled to unit length, ``mu(S)`` the mean of a set, ``mu_A`` the mean of
    the J attribute-group means and ``mu_X`` the mean of the J target-group means::

        gWEAT = sum_i < mu(X_i) - mu_X , mu(A_i) - mu_A >
              = sum_i mean_{x in X_i} < x, mu(A_i) - mu_A >     (the mu_X terms cancel)

    so the per-word score reported in ``items`` is ``s(x) = <x, mu(A_i) - mu_A>`` for ``x`` in
    ``X_i``. Target set i is matched with attribute set i. Positive: target sets lean towards
    their matching attribute sets. For J = 2 it equals
    ``<mu(X_0) - mu(X_1), mu(A_0) - mu(A_1)> / 2``.

    Returns
    -------
    MetricOutput
        ``value`` = gWEAT. ``fields``: ``gweat``, ``per_group`` (the J terms), ``n_groups``.
        ``items``: ``set``, ``index``, ``score`` (s(x) towards the word's own group),
        ``max_score`` (max over groups of ``<x, mu(A_j) - mu_A>``, the reference
        implementation's individual bias).
    """
    T = _vector_sets(targets, "targets", minimum=2)
    A = _vector_sets(attributes, "attributes", minimum=2)
    if len(T) != len(A):
        raise ParameterError(
            f"gweat needs as many target sets as attribute sets (set i matches set i), "
            f"got {len(T)} target and {len(A)} attribute sets"
        )
    check_same_dim([(f"targets[{i}]", t) for i, t in enumerate(T)] + [(f"attributes[{j}]", a) for j, a in enumerate(A)])
    mu_a = np.stack([unit_rows(a).mean(axis=0) for a in A])
    delta = mu_a - mu_a.mean(axis=0)  # (J, dim)
    proj = [unit_rows(t) @ delta.T for t in T]  # (n_i, J)
    own = [p[:, i] for i, p in enumerate(proj)]
    per_group = [float(o.mean()) for o in own]
    value = float(np.sum(per_group))
    items = _items_frame(
        T, {"score": np.concatenate(own), "max_score": np.concatenate([p.max(axis=1) for p in proj])}
    )
    return MetricOutput(
        value=value, fields={"gweat": value, "per_group": per_group, "n_groups": len(T)}, items=items
    )


# --------------------------------------------------------------------------------------------
# Direct Bias
# --------------------------------------------------------------------------------------------


def bias_subspace(
    defining_sets: Sequence[Any],
    k: int = 1,
    *,
    normalize: bool = False,
    require_rank: bool = False,
    name: str = "defining_sets",
) -> tuple[np.ndarray, np.ndarray]:
    """Bias subspace from defining sets: the one implementation (Direct Bias and the
    mitigation methods, :mod:`audit.mitigation`, both use it).

    Bolukbasi et al. (2016, Sec. 6 "Identify gender subspace"; ``debiaswe/we.py:doPCA``) and
    Manzini et al. (2019, Eq. 1): each defining set ``D_i`` (e.g. ``(she, he)``, or ``(jew,
    christian, muslim)``) is centred on its own mean, the centred vectors ``w - mean(D_i)``
    of all sets are stacked, and their first principal components span the subspace
    (:class:`sklearn.decomposition.PCA`, ``svd_solver="full"``; the stacked rows already have
    zero mean, so its own centring changes nothing).

    Conventions
    -----------
    * ``defining_sets``: a sequence of 2-D arrays, one per defining set, rows = its words;
      sets may differ in size. Row 0 of a set is its word of the *first* group (e.g. the
      female word when the groups are female, male).
    * ``normalize=True`` scales every defining vector to unit length first (Bolukbasi et al.
      work with unit-length embeddings; the mitigation methods normalise before calling);
      ``False`` uses them as given (the EmbeddingBiasScores code).
    * Orientation: each component ``g`` is flipped so that ``mean_i (D_i[0] - mean(D_i)) . g
      >= 0``, i.e. it points towards the first group's words (for pairs, equivalently
      ``mean_i (D_i[0] - D_i[1]) . g >= 0``); exact ties keep the PCA sign.
    * At most ``min(k, n_rows, dim)`` components are returned. With ``require_rank=True`` a
      :class:`DataError` is raised when the centred vectors span fewer than ``k`` dimensions;
      otherwise the caller checks ``explained_variance_ratio`` (components beyond the rank
      carry a ratio of ~0).

    Returns
    -------
    G : ndarray (k', dim), orthonormal rows.
    explained_variance_ratio : ndarray (k',).
    """
    if isinstance(defining_sets, np.ndarray) or not isinstance(defining_sets, Sequence) or not defining_sets:
        raise ParameterError(f"{name}: expected a non-empty list of 2-D arrays (one per defining set)")
    k = schema.integer(k, "k", 1)  # the number of bias components
    sets = [as_vectors(d, f"{name}[{i}]", nonzero=normalize) for i, d in enumerate(defining_sets)]
    check_same_dim([(f"{name}[{i}]", d) for i, d in enumerate(sets)])
    if normalize:
        sets = [unit_rows(d) for d in sets]
    rows = np.concatenate([d - d.mean(axis=0, keepdims=True) for d in sets], axis=0)
    if require_rank:
        rank = int(np.linalg.matrix_rank(rows))
        if rank < k:
            raise DataError(
                f"{name}: the centred defining sets span {rank} dimension(s); cannot take k={k} "
                "bias components (are the defining sets' words identical?)"
            )
    n_comp = int(min(k, rows.shape[0], rows.shape[1]))
    from sklearn.decomposition import PCA  # local: see audit/multitest.py

    pca = PCA(n_components=n_comp, svd_solver="full").fit(rows)
    G = np.array(pca.components_, dtype=np.float64)
    firsts = np.stack([d[0] - d.mean(axis=0) for d in sets])
    G[firsts.mean(axis=0) @ G.T < 0] *= -1.0
    return G, np.asarray(pca.explained_variance_ratio_, dtype=np.float64)


def paired_defining_sets(attributes: Sequence[Any], *, nonzero: bool = True) -> list[np.ndarray]:
    """The defining sets of a test written as J paired word sets of equal length (row i of
    every set forms defining set i, e.g. she/he, woman/man): ``[stack(S_0[i], ..., S_{J-1}[i])]``,
    so row j of each defining set is group j's word (:func:`bias_subspace`'s convention)."""
    sets = _vector_sets(attributes, "attributes", minimum=2, nonzero=nonzero)
    check_same_dim([(f"attributes[{j}]", s) for j, s in enumerate(sets)])
    n = sets[0].shape[0]
    for j, s in enumerate(sets[1:], start=1):
        if s.shape[0] != n:
            raise DataError(
                f"attributes[{j}]: Direct Bias needs paired defining sets of equal length "
                f"(row i of each set forms a tuple); got {s.shape[0]} words, attributes[0] has {n}"
            )
    stack = np.stack(sets, axis=1)  # (n, J, dim)
    return [stack[i] for i in range(n)]


def direct_bias(
    targets: Sequence[Any], attributes: Sequence[Any], *, c: float = 1.0, k: int = 1, normalize: bool = True
) -> MetricOutput:
    """Direct Bias (Bolukbasi et al. 2016): ``DB_c = mean_{w in N} |cos(w, g)|^c``.

    ``g`` is the first principal component of the centred, paired defining sets
    (:func:`paired_defining_sets`, :func:`bias_subspace` with ``require_rank=True``; oriented
    towards ``attributes[0]``); ``N`` is the union of the target sets (the gender-neutral words).
    ``c`` (strictness, default 1) must be >= 0. With ``k > 1`` components the per-word
    quantity is the norm of the projection of the unit word vector on the k-dimensional
    subspace, ``||G w / ||w|| ||`` (the cosine between ``w`` and the subspace), so
    ``DB_c`` stays in [0, 1]; for ``k = 1`` this is ``|cos(w, g)|``. (The EmbeddingBiasScores
    reference code sums ``|cos(w, g_i)|`` over components instead.) ``DB`` is 1 for words on
    the bias direction and 0 for words orthogonal to it.

    Returns
    -------
    MetricOutput
        ``value`` = DB_c. ``fields``: ``direct_bias``, ``per_set`` (DB_c of each target set), ``c``, ``k``,
        ``explained_variance_ratio``, ``normalize``. ``items``: ``set``, ``index``, ``cos``
        (signed cosine with the first component; positive leans to defining set 0),
        ``projection`` (norm of the projection, = |cos| for k = 1), ``bias`` (``projection**c``).
    """
    schema.number(c, "c (strictness)", 0.0)
    k = schema.integer(k, "k", 1)  # the number of bias components
    T = _vector_sets(targets, "targets", minimum=1)
    G, evr = bias_subspace(
        paired_defining_sets(attributes, nonzero=normalize), k, normalize=normalize, require_rank=True,
        name="attributes",
    )
    _check_dim(T, G.shape[1])
    proj = np.concatenate([unit_rows(t) @ G.T for t in T])  # (n, k)
    norm = np.clip(np.sqrt((proj**2).sum(axis=1)), 0.0, 1.0)
    bias = norm ** float(c)
    bounds = np.cumsum([0] + [t.shape[0] for t in T])
    per_set = [float(bias[bounds[i] : bounds[i + 1]].mean()) for i in range(len(T))]
    value = float(bias.mean())
    items = _items_frame(T, {"cos": proj[:, 0], "projection": norm, "bias": bias})
    fields = {
        "direct_bias": value,
        "per_set": per_set,
        "c": float(c),
        "k": int(k),
        "explained_variance_ratio": [float(v) for v in evr],
        "normalize": bool(normalize),
    }
    return MetricOutput(value=value, fields=fields, items=items)
