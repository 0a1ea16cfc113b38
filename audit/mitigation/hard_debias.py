"""Hard Debias (Bolukbasi et al. 2016) and Multiclass Hard Debias (Manzini et al. 2019)."""

from __future__ import annotations

import warnings
from typing import Any, Iterable

import numpy as np

from audit.errors import ParameterError
from audit.mitigation.base import (
    Mitigation,
    bias_subspace,
    normalize_rows,
    resolve_sets,
    scope_mask,
)
from audit.schema import Flag, Int, Section
from audit.mitigation.definitions import BiasDefinitions, resolve_word
from audit.mitigation.matrix import EmbeddingMatrix, as_matrix

__all__ = ["HardDebias", "MulticlassHardDebias", "neutralize_rows", "equalize_pair", "equalize_set"]

_CHUNK = 65536


def neutralize_rows(V: np.ndarray, mask: np.ndarray, B: np.ndarray) -> None:
    """In place: for the rows selected by ``mask``, remove the projection on the orthonormal
    rows of ``B`` and rescale to unit norm (rows that become zero stay zero). Chunked."""
    B = np.atleast_2d(B)
    for start in range(0, V.shape[0], _CHUNK):
        sel = np.flatnonzero(mask[start : start + _CHUNK]) + start
        if sel.size == 0:
            continue
        X = V[sel]
        X -= (X @ B.T) @ B
        n = np.linalg.norm(X, axis=1, keepdims=True)
        np.divide(X, n, out=X, where=n > 0)
        V[sel] = X


def equalize_pair(a: np.ndarray, b: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bolukbasi et al. (2016) equalise step for one pair of unit vectors and a unit direction.

    ``y = drop((a + b) / 2, g)``, ``z = sqrt(1 - |y|^2)`` (clipped at 0), ``z`` takes the sign
    of ``(a - b) . g``; returns ``(z g + y, -z g + y)``: unit vectors that differ only along
    ``g`` and therefore have the same inner product with every vector orthogonal to ``g``.
    """
    mid = (a + b) / 2.0
    y = mid - (mid @ g) * g
    z = float(np.sqrt(max(0.0, 1.0 - float(y @ y))))
    if (a - b) @ g < 0:
        z = -z
    return z * g + y, -z * g + y


def equalize_set(E: np.ndarray, B: np.ndarray) -> np.ndarray | None:
    """Manzini et al. (2019, Sec. 3) equalise step for the unit rows ``E`` of one set.

    ``mu = mean(E)``, ``nu = mu - mu_B`` (``x_B`` is the projection on the subspace ``B``),
    each ``w`` becomes ``nu + sqrt(1 - |nu|^2) (w_B - mu_B) / |w_B - mu_B|``. Returns ``None``
    when some member has ``w_B == mu_B`` (no direction to move it along).
    """
    B = np.atleast_2d(B)
    mu = E.mean(axis=0)
    mu_b = (mu @ B.T) @ B
    nu = mu - mu_b
    Eb = (E @ B.T) @ B
    diff = Eb - mu_b
    n = np.linalg.norm(diff, axis=1, keepdims=True)
    if np.any(n <= 1e-12):
        return None
    scale = float(np.sqrt(max(0.0, 1.0 - float(nu @ nu))))
    return nu + scale * diff / n


class HardDebias(Mitigation):
    """Hard Debias: neutralise and equalise along the bias direction.

    Bolukbasi, Chang, Zou, Saligrama & Kalai (2016), "Man is to Computer Programmer as Woman is
    to Homemaker? Debiasing Word Embeddings", NeurIPS; reference code ``debiaswe/debias.py``
    (github.com/tolga-b/debiaswe), which this follows step by step:

    1. ``fit``: all vectors are taken at unit norm; the bias direction ``g`` is the first
       principal component of the definitional pairs, each centred on its own mean
       (:func:`~audit.mitigation.base.bias_subspace`; orientation: towards the first word of
       each pair).
    2. ``transform``: every vector is normalised; the *neutral* words lose their component on
       ``g`` and are renormalised; every equalise pair present (with ``case_variants``: its
       lower-case, Title-case and UPPER-case forms, as debiaswe) is replaced by
       :func:`equalize_pair` of the current vectors; finally all vectors are renormalised.

    Parameters
    ----------
    n_components : int, default 10
        Principal components computed on the definitional pairs (debiaswe's ``doPCA``); only
        the first is used, the others are reported in ``explained_variance_ratio_``.
    case_variants : bool, default True
        Also equalise the Title/UPPER-case forms of the equalise pairs.

    Attributes
    ----------
    bias_direction_ : ndarray of shape (dim,)
    components_, explained_variance_ratio_ : the PCA of the centred definitional pairs
    definitional_sets_ : the pairs used (vocabulary spelling); pairs with a missing word are
        skipped with a warning, fewer than two complete pairs raise :class:`CoverageError`.
    equalize_candidates_ : the pairs ``transform`` equalises when both words are present.
    protected_ : lower-cased ``specific_words`` and equalise-set words (:func:`protected_words`).

    Neutral words and what is left untouched
    ----------------------------------------
    ``transform(model, words=None)`` neutralises every word whose lower-case form is neither a
    gender-specific word (``specific_words``) nor in an equalise pair; ``words`` restricts that
    to the listed words (protected ones are still left alone). Words outside the scope keep
    their direction (they are only rescaled to unit norm), except the equalise pairs, which
    are always equalised (as in debiaswe and WEFE). The output has unit-norm rows.

    Differences from WEFE 1.0.1 ``HardDebias``: WEFE equalises with the pair vectors taken at
    ``fit`` time (before neutralisation), debiaswe and we with the current ones; the two agree
    because equalise words are never neutralised here (with ``ignore`` = our protected words
    WEFE gives the same vectors to 2e-7 on all of GloVe 6B 50d). WEFE only finds definitional
    words spelled exactly as in the vocabulary; we also try the lower-case form.
    """

    name = "hard_debias"
    reference = "Bolukbasi et al. (2016), NeurIPS"

    class Params(Section):
        n_components: Int(1) = 10
        case_variants: Flag = True

    def __init__(self, *, n_components: int = 10, case_variants: bool = True) -> None:
        self._init_params(n_components=n_components, case_variants=case_variants)

    def fit(self, model: Any, definitions: BiasDefinitions | str) -> HardDebias:
        """Learn the bias direction from the definitional pairs of ``definitions``."""
        m, d = self._start_fit(model, definitions)
        self._fit_direction(m.vectors, m.index, m.ref, d)
        return self

    def _fit_direction(self, vectors: np.ndarray, index: dict[str, int], ref: str, d: BiasDefinitions) -> None:
        holder = _Vocab(index, ref)
        pairs, _ = resolve_sets(type(self).__name__, holder, d.definitional_sets, "definitional sets", min_sets=2)
        groups = [normalize_rows(vectors[[index[w] for w in p]]) for p in pairs]
        comps, evr = bias_subspace(groups, self.n_components)
        self.components_ = comps
        self.explained_variance_ratio_ = evr
        self.bias_direction_ = comps[0]
        self.definitional_sets_ = pairs
        self.protected_ = protected_words(d)
        self.equalize_candidates_ = _equalize_candidates(d.equalize_sets, self.case_variants)

    def transform(self, model: Any, words: Iterable[str] | None = None) -> EmbeddingMatrix:
        """Neutralise ``words`` (default: all but the gender-specific words), equalise the pairs."""
        self._check_fitted("bias_direction_")
        m = as_matrix(model)
        self._check_dim(m)
        V = normalize_rows(m.vectors)
        mask = scope_mask(m, words, self.protected_)
        equalized = hard_debias_arrays(V, mask, self.bias_direction_, self.equalize_candidates_, m.index)
        return self._result(m, V.astype(np.float32), {"n_neutralized": int(mask.sum()), "n_equalized_pairs": equalized})


def hard_debias_arrays(
    V: np.ndarray, mask: np.ndarray, g: np.ndarray, candidates: list[tuple[str, str]], index: dict[str, int]
) -> int:
    """In place on unit rows ``V``: neutralise ``mask`` rows along ``g``, equalise the candidate
    pairs present, renormalise everything. Returns the number of pairs equalised."""
    neutralize_rows(V, mask, g)
    n_eq = 0
    for a, b in candidates:
        ia, ib = index.get(a), index.get(b)
        if ia is None or ib is None or ia == ib:
            continue
        V[ia], V[ib] = equalize_pair(V[ia], V[ib], g)
        n_eq += 1
    n = np.linalg.norm(V, axis=1, keepdims=True)
    np.divide(V, n, out=V, where=n > 0)
    return n_eq


def protected_words(d: BiasDefinitions) -> set[str]:
    """Lower-cased words never neutralised by default: the specific words and the words of
    the equalise sets (debiaswe's 1441-word list contains its equalise words; the shipped
    218-word seed list lacks ``granny``, and a neutralised pair member would lose the gender
    component that fixes its side when the pair is equalised)."""
    return {w.lower() for w in d.specific_words} | {w.lower() for s in d.equalize_sets for w in s}


def _equalize_candidates(sets: tuple[tuple[str, ...], ...], case_variants: bool) -> list[tuple[str, str]]:
    """debiaswe's candidate pairs: each equalise pair in lower, Title and UPPER case (first
    occurrence order, duplicates removed), or the pairs as written."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for s in sets:
        if len(s) != 2:
            continue
        a, b = s
        if case_variants:
            variants = [(a.lower(), b.lower()), (a.title(), b.title()), (a.upper(), b.upper())]
        else:
            variants = [(a, b)]
        for p in variants:
            if p not in seen:
                seen.add(p)
                out.append(p)
    return out


class _Vocab:
    """Minimal stand-in with ``index`` and ``ref`` for :func:`resolve_sets`."""

    def __init__(self, index: dict[str, int], ref: str) -> None:
        self.index = index
        self.ref = ref


class MulticlassHardDebias(Mitigation):
    """Multiclass Hard Debias: Hard Debias with a k-dimensional subspace and sets of any size.

    Manzini, Chong, Black & Tsvetkov (2019), "Black is to Criminal as Caucasian is to Police:
    Detecting and Removing Multiclass Bias in Word Embeddings", NAACL; reference code
    ``Debiasing/biasOps.py`` (github.com/TManzini/DebiasMulticlassWordEmbedding):

    1. ``fit``: the bias subspace ``B`` is spanned by the first ``n_components`` principal
       components of the definitional sets (unit vectors), each centred on its own mean.
    2. ``transform``: every vector is normalised; neutral words lose their projection on ``B``
       and are renormalised; every equalise set (default: the definitional sets, as in the
       reference code) with at least two words present is replaced by :func:`equalize_set`
       of the current vectors.

    Parameters
    ----------
    n_components : int, default 1
        ``k``, the dimension of the bias subspace (the reference code's ``-k``, default 1).
        For a criterion with ``c`` classes at most ``c - 1`` directions separate them.

    Attributes
    ----------
    subspace_ : ndarray of shape (k, dim), orthonormal rows
    explained_variance_ratio_, definitional_sets_, equalize_sets_ (vocabulary spelling)
    protected_ : lower-cased specific, equalise-set and definitional words (never
        neutralised; WEFE 1.0.1 also skips the definitional words).

    Left untouched: the specific, definitional and equalise-set words keep their direction (they are
    rescaled to unit norm), and so does every word not listed in ``words`` when it is given;
    equalise sets are always equalised. Unlike
    Hard Debias no case variants are added. Difference from WEFE 1.0.1: WEFE equalises the
    vectors read at ``fit`` time, the reference code and we the neutralised ones.
    """

    name = "multiclass_hard_debias"
    reference = "Manzini et al. (2019), NAACL"

    class Params(Section):
        n_components: Int(1) = 1

    def __init__(self, *, n_components: int = 1) -> None:
        self._init_params(n_components=n_components)

    def fit(self, model: Any, definitions: BiasDefinitions | str) -> MulticlassHardDebias:
        """Learn the k-dimensional bias subspace from the definitional sets."""
        m, d = self._start_fit(model, definitions)
        sets, _ = resolve_sets(type(self).__name__, m, d.definitional_sets, "definitional sets", min_sets=2)
        groups = [normalize_rows(m.vectors[m.rows(s)]) for s in sets]
        comps, evr = bias_subspace(groups, max(self.n_components, 1))
        rank = int(np.sum(evr > 1e-10))
        if rank < self.n_components:
            raise ParameterError(
                f"MulticlassHardDebias: n_components={self.n_components} but the definitional sets span "
                f"only {rank} dimensions"
            )
        self.subspace_ = comps[: self.n_components]
        self.explained_variance_ratio_ = evr[: self.n_components]
        self.definitional_sets_ = sets
        self.equalize_sets_ = list(d.equalize_sets or d.definitional_sets)
        self.protected_ = protected_words(d) | {w.lower() for s in sets for w in s}
        return self

    def transform(self, model: Any, words: Iterable[str] | None = None) -> EmbeddingMatrix:
        """Neutralise ``words`` (default: all but specific and definitional words), equalise."""
        self._check_fitted("subspace_")
        m = as_matrix(model)
        self._check_dim(m)
        V = normalize_rows(m.vectors)
        mask = scope_mask(m, words, self.protected_)
        neutralize_rows(V, mask, self.subspace_)
        n_eq = 0
        skipped = []
        for s in self.equalize_sets_:
            rows = []
            for w in s:
                r = resolve_word(w, m.index)
                if r is not None and m.index[r] not in rows:
                    rows.append(m.index[r])
            if len(rows) < 2:
                continue
            new = equalize_set(V[rows], self.subspace_)
            if new is None:
                skipped.append(list(s))
                continue
            V[rows] = new
            n_eq += 1
        if skipped:
            warnings.warn(f"MulticlassHardDebias: sets not equalised (a member lies at the set mean "
                          f"inside the subspace): {skipped[:10]}", stacklevel=2)
        return self._result(m, V.astype(np.float32), {"n_neutralized": int(mask.sum()), "n_equalized_sets": n_eq})
