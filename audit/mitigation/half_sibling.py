"""Half-Sibling Regression (Yang & Feng 2020)."""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from audit.errors import CoverageError
from audit.mitigation.base import Mitigation, scope_mask
from audit.schema import Num, Section
from audit.mitigation.definitions import BiasDefinitions, resolve_word
from audit.mitigation.matrix import EmbeddingMatrix, as_matrix

__all__ = ["HalfSiblingRegression", "ridge_hat_matrix"]

_CHUNK = 65536


def ridge_hat_matrix(Vd: np.ndarray, alpha: float) -> np.ndarray:
    """The (dim, dim) matrix ``H = Vd (Vd^T Vd + alpha I)^-1 Vd^T`` for ``Vd`` of shape (dim, n_d).

    Each non-definitional vector ``v`` is regressed (ridge, no intercept) on the columns of
    ``Vd``: coefficients ``w = (Vd^T Vd + alpha I)^-1 Vd^T v`` and prediction ``Vd w = H v``.
    Computed from the thin SVD ``Vd = U S W^T`` as ``U diag(s^2 / (s^2 + alpha)) U^T``, which
    equals the normal-equations form and stays well conditioned when ``n_d > dim``.
    """
    U, s, _ = np.linalg.svd(Vd, full_matrices=False)
    shrink = s**2 / (s**2 + alpha)
    return (U * shrink) @ U.T


class HalfSiblingRegression(Mitigation):
    """Half-Sibling Regression: subtract the part of each vector predicted by the gender words.

    Yang & Feng (2020), "A Causal Inference Method for Reducing Gender Bias in Word Embedding
    Relations", AAAI 34, 9434-9441 (reference code github.com/KunkunYang/GenderBiasHSR; method
    of Schölkopf et al. 2016, PNAS 113(27)). With ``V_d`` the (dim, n_d) matrix of the
    *gender-definition* word vectors (the definitions' ``specific_words`` found in the model)
    and ``V_n`` the other words, ridge regression predicts ``G = V_d W`` with
    ``W = (V_d^T V_d + alpha I)^-1 V_d^T V_n`` and the debiased vectors are ``V_n - G``.
    ``G = H V_n`` with the (dim, dim) hat matrix :func:`ridge_hat_matrix`, so the transform is
    one matrix product per word instead of WEFE's (n_d, n_words) weight matrix.

    Parameters
    ----------
    alpha : float, default 60
        Ridge penalty (the paper's and WEFE's default).

    Attributes
    ----------
    hat_matrix_ : ndarray of shape (dim, dim)
    definitional_words_ : the specific words used as regressors (vocabulary spelling; each
        word as written, else its lower-case form). Fewer than two found -> CoverageError.

    Left untouched: the definitional words themselves (and, when ``words`` is given, every
    word not listed). Vectors are used as stored (no normalisation, as in the reference code
    and WEFE); the output is not renormalised.
    """

    name = "half_sibling_regression"
    reference = "Yang & Feng (2020), AAAI"

    class Params(Section):
        alpha: Num(0.0) = 60.0

    def __init__(self, *, alpha: float = 60.0) -> None:
        self._init_params(alpha=alpha)

    def fit(self, model: Any, definitions: BiasDefinitions | str) -> HalfSiblingRegression:
        """Compute the hat matrix of the ridge regression on the definitional word vectors."""
        m, d = self._start_fit(model, definitions)
        found: list[str] = []
        for w in d.specific_words:
            r = resolve_word(w, m.index)
            if r is not None and r not in found:
                found.append(r)
        if len(found) < 2:
            raise CoverageError(
                f"HalfSiblingRegression: only {len(found)} of the {len(d.specific_words)} specific words of "
                f"{d.name!r} are in model {m.ref!r}; need at least 2"
            )
        Vd = np.asarray(m.vectors[m.rows(found)], dtype=np.float64).T
        self.hat_matrix_ = ridge_hat_matrix(Vd, float(self.alpha))
        self.definitional_words_ = found
        return self

    def transform(self, model: Any, words: Iterable[str] | None = None) -> EmbeddingMatrix:
        """Subtract the predicted gender information from ``words`` (default: all
        non-definitional words)."""
        self._check_fitted("hat_matrix_")
        m = as_matrix(model)
        self._check_dim(m)
        mask = scope_mask(m, words, set())
        for w in self.definitional_words_:
            i = m.index.get(w)
            if i is not None:
                mask[i] = False
        out = np.array(m.vectors, dtype=np.float32)
        H = self.hat_matrix_
        for start in range(0, len(m), _CHUNK):
            sel = np.flatnonzero(mask[start : start + _CHUNK]) + start
            if sel.size:
                X = np.asarray(m.vectors[sel], dtype=np.float64)
                out[sel] = (X - X @ H).astype(np.float32)
        return self._result(m, out, {"n_transformed": int(mask.sum()), "n_regressors": len(self.definitional_words_)})
