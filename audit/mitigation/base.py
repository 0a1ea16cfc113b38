"""Shared pieces of the mitigation methods: the estimator base class and small pure functions
on arrays (row normalisation, projection removal).

The bias subspace (PCA of the defining sets, each centred on its own mean) has one
implementation, :func:`audit.metrics.same.bias_subspace`, re-exported here for the methods:
``bias_subspace(groups, n_components)`` with ``groups`` the defining sets (one 2-D array per
set, row 0 = the first group's word; the methods pass unit-length rows) returns at most
``min(n_components, n_rows, dim)`` orthonormal components, each oriented towards the first
word of the sets (with the shipped ``en/gender`` lists, female first, towards *female*), and
their explained variance ratios; the methods check the rank themselves."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Iterable, Sequence

import numpy as np

from audit import schema
from audit.errors import CoverageError, ParameterError
from audit.metrics.same import bias_subspace
from audit.mitigation.definitions import BiasDefinitions, load_definitions, resolve_word
from audit.mitigation.matrix import EmbeddingMatrix, as_matrix

__all__ = [
    "Mitigation",
    "bias_subspace",
    "normalize_rows",
    "resolve_sets",
    "scope_mask",
]

# --------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------


def normalize_rows(X: np.ndarray) -> np.ndarray:
    """``X`` (float64 copy) with every row scaled to unit L2 norm; all-zero rows stay zero."""
    X = np.array(X, dtype=np.float64)
    n = np.linalg.norm(X, axis=1, keepdims=True)
    np.divide(X, n, out=X, where=n > 0)
    return X



# --------------------------------------------------------------------------------------
# Estimator base class
# --------------------------------------------------------------------------------------


class Mitigation:
    """scikit-learn-style base: parameters in ``__init__``, fitted attributes end with ``_``.

    ``fit(model, definitions)`` learns from a model and a :class:`BiasDefinitions` (or a
    registered name such as ``"en/gender"``) and returns ``self``; ``transform(model,
    words=None)`` returns a new :class:`EmbeddingMatrix` and never mutates ``model``.
    """

    #: registry name (see :func:`audit.mitigation.get_mitigation`)
    name: str = ""
    #: short citation of the method
    reference: str = ""
    #: the types and ranges of the constructor's parameters (:mod:`audit.schema`), declared once:
    #: :meth:`_validate_params` and a sweep spec's ``models[i].mitigation[j].params`` read them
    Params: type[schema.Section] = schema.Section

    # -- parameters ------------------------------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p.name for p in sig.parameters.values() if p.name != "self" and p.kind == p.KEYWORD_ONLY]

    def get_params(self) -> dict[str, Any]:
        """The constructor parameters (as in scikit-learn)."""
        return {k: getattr(self, k) for k in self._param_names()}

    def _init_params(self, **given: Any) -> None:
        """The constructor's parameters checked against :attr:`Params` and set as attributes."""
        for k, v in given.items():
            setattr(self, k, v)
        self._validate_params()

    def set_params(self, **params: Any) -> Mitigation:
        """Change constructor parameters; an invalid value raises and leaves the method unchanged."""
        names = self._param_names()
        unknown = [k for k in params if k not in names]
        if unknown:
            raise ParameterError(f"{type(self).__name__}: unknown parameter(s) {unknown}; parameters: {names}")
        old = self.get_params()
        for k, v in params.items():
            setattr(self, k, v)
        try:
            self._validate_params()
        except ParameterError:
            for k, v in old.items():
                setattr(self, k, v)
            raise
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _validate_params(self) -> None:
        """The parameters checked against :attr:`Params` (:func:`audit.schema.arguments`: a
        :class:`ParameterError` such as ``HardDebias: n_components: must be >= 1, got 0``)."""
        for k, v in schema.arguments(self.Params, self.get_params(), type(self).__name__).items():
            setattr(self, k, v)

    # -- API -------------------------------------------------------------------------------
    def fit(self, model: Any, definitions: BiasDefinitions | str) -> Mitigation:  # pragma: no cover
        raise NotImplementedError

    def transform(self, model: Any, words: Iterable[str] | None = None) -> EmbeddingMatrix:  # pragma: no cover
        raise NotImplementedError

    def fit_transform(
        self, model: Any, definitions: BiasDefinitions | str, words: Iterable[str] | None = None
    ) -> EmbeddingMatrix:
        """``fit(model, definitions).transform(model, words)``."""
        return self.fit(model, definitions).transform(model, words=words)

    # -- helpers for subclasses ---------------------------------------------------------
    def _start_fit(self, model: Any, definitions: BiasDefinitions | str) -> tuple[EmbeddingMatrix, BiasDefinitions]:
        self._validate_params()
        m = as_matrix(model)
        d = load_definitions(definitions)
        self.definitions_ = d
        self.fitted_on_ = {"ref": m.ref, "revision": m.revision, "n_words": len(m), "dim": m.dim}
        return m, d

    def _check_fitted(self, *attrs: str) -> None:
        for a in attrs:
            if not hasattr(self, a):
                raise ParameterError(
                    f"{type(self).__name__} is not fitted: call fit(model, definitions) before transform"
                )

    def _check_dim(self, m: EmbeddingMatrix) -> None:
        if m.dim != self.fitted_on_["dim"]:
            raise ParameterError(
                f"{type(self).__name__}: model {m.ref!r} has dimension {m.dim} but the method was fitted on "
                f"{self.fitted_on_['ref']!r} with dimension {self.fitted_on_['dim']}"
            )

    def _result(self, m: EmbeddingMatrix, vectors: np.ndarray, extra: dict[str, Any] | None = None) -> EmbeddingMatrix:
        prov = {
            "mitigation": self.name,
            "reference": self.reference,
            "params": _jsonable_params(self.get_params()),
            "definitions": self.definitions_.describe(),
            "fitted_on": dict(self.fitted_on_),
            "source": {"ref": m.ref, "revision": m.revision, "backend": m.backend},
            **(extra or {}),
        }
        return m.with_vectors(vectors, ref=f"{m.ref}+{self.name}", provenance=prov)


def _jsonable_params(p: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in p.items():
        if isinstance(v, (np.integer, np.floating)):
            v = v.item()
        elif isinstance(v, tuple):
            v = list(v)
        out[k] = v
    return out


# --------------------------------------------------------------------------------------
# Validation helpers
# --------------------------------------------------------------------------------------


def resolve_sets(
    owner: str, m: EmbeddingMatrix, sets: Sequence[Sequence[str]], field: str, *, min_sets: int
) -> tuple[list[tuple[str, ...]], list[str]]:
    """Resolve every word of each set (:func:`resolve_word`); sets with a missing word are
    dropped with a warning. Fewer than ``min_sets`` complete sets -> :class:`CoverageError`."""
    idx = m.index
    kept: list[tuple[str, ...]] = []
    missing: list[str] = []
    for s in sets:
        r = [resolve_word(w, idx) for w in s]
        if any(x is None for x in r):
            missing.extend(w for w, x in zip(s, r) if x is None)
            continue
        kept.append(tuple(r))  # type: ignore[arg-type]
    if len(kept) < min_sets:
        raise CoverageError(
            f"{owner}: only {len(kept)} of the {len(sets)} {field} are complete in model {m.ref!r} "
            f"(need {min_sets}); missing words: {missing[:30]}"
        )
    if missing:
        warnings.warn(f"{owner}: {field} with words missing from {m.ref!r} were skipped: {missing[:30]}", stacklevel=3)
    return kept, missing


def scope_mask(m: EmbeddingMatrix, words: Iterable[str] | None, excluded: set[str]) -> np.ndarray:
    """Boolean row mask of the words a transform changes.

    The default scope is every word whose lower-case form is not in ``excluded`` (already
    lower-cased: the definitions' protected words). ``words`` restricts it to the listed words
    that are present (protected words stay excluded, so a restricted run changes each listed
    word exactly as a full run would). A ``str`` is rejected (it would be read as letters).
    """
    mask = np.fromiter((w.lower() not in excluded for w in m.words), dtype=bool, count=len(m))
    if words is None:
        return mask
    if isinstance(words, (str, bytes)):
        raise ParameterError("words must be a list of words or None, not a single string")
    keep = np.zeros(len(m), dtype=bool)
    idx = m.index
    for w in words:
        if not isinstance(w, str):
            raise ParameterError(f"words: every entry must be a string, got {w!r}")
        i = idx.get(w)
        if i is not None:
            keep[i] = True
    return mask & keep
