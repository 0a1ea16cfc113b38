"""Debiasing of static word embeddings, with a scikit-learn-style ``fit``/``transform``.

Five methods (each documents its reference, parameters and what it leaves untouched):

=================================== ==================================== =====================
registry name (alias)               class                                reference
=================================== ==================================== =====================
``hard_debias`` (``hd``)            :class:`HardDebias`                  Bolukbasi et al. 2016
``multiclass_hard_debias`` (``mhd``) :class:`MulticlassHardDebias`       Manzini et al. 2019
``double_hard_debias`` (``dhd``)    :class:`DoubleHardDebias`            Wang et al. 2020
``half_sibling_regression`` (``hsr``) :class:`HalfSiblingRegression`     Yang & Feng 2020
``repulsion_attraction_neutralization`` (``ran``) :class:`RepulsionAttractionNeutralization` Kumar et al. 2020
=================================== ==================================== =====================

Usage::

    from audit.mitigation import get_mitigation, load_glove_6b_50d
    glove = load_glove_6b_50d()
    hd = get_mitigation("hard_debias").fit(glove, "en/gender")
    debiased = hd.transform(glove)            # a new EmbeddingMatrix; glove is unchanged
    debiased.save_npy("glove_hd.npy")         # -> load_static("npy:glove_hd.npy,glove_hd.vocab.txt")

``fit(model, definitions)`` takes any static model that exposes its whole matrix
(:func:`as_matrix`) and a :class:`BiasDefinitions` or a registered name (``"en/gender"``:
Bolukbasi et al.'s lists, ``datasets/mitigation/en/gender.json``). ``transform(model,
words=None)`` returns an :class:`EmbeddingMatrix` (a ``WordVectors``, so the audit runs on it
directly) whose ``provenance`` records the method, parameters, definitions digest and source
model. :func:`apply_mitigation` does both in one call (what a sweep uses);
:func:`audit.mitigation.evaluation.before_after` measures WEAT before and after.
"""

from __future__ import annotations

from typing import Any, Iterable

from audit.errors import ParameterError
from audit.mitigation.base import Mitigation
from audit.mitigation.definitions import BiasDefinitions, list_definitions, load_definitions
from audit.mitigation.double_hard import DoubleHardDebias
from audit.mitigation.half_sibling import HalfSiblingRegression
from audit.mitigation.hard_debias import HardDebias, MulticlassHardDebias
from audit.mitigation.matrix import EmbeddingMatrix, SavedNpy, as_matrix, load_glove_6b_50d
from audit.mitigation.ran import RepulsionAttractionNeutralization

__all__ = [
    "BiasDefinitions",
    "DoubleHardDebias",
    "EmbeddingMatrix",
    "HalfSiblingRegression",
    "HardDebias",
    "METHODS",
    "Mitigation",
    "MulticlassHardDebias",
    "RepulsionAttractionNeutralization",
    "SavedNpy",
    "apply_mitigation",
    "as_matrix",
    "get_mitigation",
    "list_definitions",
    "load_definitions",
    "load_glove_6b_50d",
]

#: registry name -> class
METHODS: dict[str, type[Mitigation]] = {
    cls.name: cls
    for cls in (HardDebias, MulticlassHardDebias, DoubleHardDebias, HalfSiblingRegression,
                RepulsionAttractionNeutralization)
}
ALIASES = {"hd": "hard_debias", "mhd": "multiclass_hard_debias", "dhd": "double_hard_debias",
           "hsr": "half_sibling_regression", "ran": "repulsion_attraction_neutralization"}


def get_mitigation(name: str, **params: Any) -> Mitigation:
    """A new, unfitted method by registry name or alias, with constructor ``params``.

    Raises :class:`ParameterError` for an unknown name (listing the known ones) or an unknown
    or invalid parameter (naming it and the method's parameters).
    """
    if not isinstance(name, str):
        raise ParameterError(f"mitigation name must be a string, got {name!r}")
    key = ALIASES.get(name.lower().replace("-", "_"), name.lower().replace("-", "_"))
    if key not in METHODS:
        raise ParameterError(
            f"unknown mitigation {name!r}; known: {', '.join(METHODS)} (aliases: {', '.join(ALIASES)})"
        )
    cls = METHODS[key]
    allowed = cls._param_names()
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ParameterError(f"mitigation {key!r}: unknown parameter(s) {unknown}; parameters: {allowed}")
    return cls(**params)


def apply_mitigation(
    model: Any,
    name: str,
    definitions: BiasDefinitions | str = "en/gender",
    params: dict[str, Any] | None = None,
    words: Iterable[str] | None = None,
) -> tuple[EmbeddingMatrix, Mitigation]:
    """Fit method ``name`` on ``model`` and transform it: ``(debiased model, fitted method)``.

    ``model`` must expose its whole matrix (see :func:`as_matrix`; for a sweep: load the static
    model without a ``words=`` filter). The debiased model's ``provenance`` says what was done.
    """
    method = get_mitigation(name, **(params or {}))
    matrix = as_matrix(model)
    method.fit(matrix, definitions)
    return method.transform(matrix, words=words), method
