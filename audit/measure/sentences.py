"""The measure step of SEAT (May, Wang, Bordia, Bowman & Rudinger 2019, "On Measuring Social
Biases in Sentence Encoders", NAACL): one embedding per sentence of every set of a test, from the
test's own sentence sets or its words filled into its language's bleached templates.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from audit.datasets.templates import has_seat_templates
from audit.entries import Family, Measurement, Metric
from audit.measure.contextual import default_method, seat_vectors
from audit.measure.words import set_names
from audit.suites import WordTest

__all__ = ["SEAT_SENTENCES", "measure_sentences"]


def measure_sentences(model, test: WordTest, metric: Metric, mp: Mapping[str, Any],
                      ap: Mapping[str, Any]) -> Measurement:
    """Sentence vectors per set (float64), labelled by their sentences."""
    targets, attributes, items = seat_vectors(
        model.handle, test, method=mp["embedding"] or default_method(model.kind, "sentence"), layer=mp["layer"],
        batch_size=mp["batch_size"],
    )
    labels = {}
    for role, sets, mats in (("target", test.targets, targets), ("attribute", test.attributes, attributes)):
        for i, (s, mat) in enumerate(zip(sets, mats)):
            labels[f"{role}{i}"] = [f"{s.name}#{j}" for j in range(len(mat))]
    for key, grp in items.groupby("set", sort=False):
        if str(key) in labels and len(grp) == len(labels[str(key)]):
            labels[str(key)] = list(grp["sentence"])
    return Measurement(
        family=SEAT_SENTENCES.name,
        targets=[np.asarray(t, dtype=np.float64) for t in targets],
        attributes=[np.asarray(a, dtype=np.float64) for a in attributes],
        labels=labels,
        set_names=set_names(test),
        coverage={s.name: 1.0 for s in (*test.targets, *test.attributes)},
    )


def _needs_sentences(test: WordTest) -> str | None:
    has_words = all(s.words for s in (*test.targets, *test.attributes))
    if test.sentences or (has_words and has_seat_templates(test)):
        return None
    return f"test {test.name} has no SEAT sentences and no words to fill templates with"


def _method(kind: str, params: Mapping[str, Any]) -> str:
    return str(params.get("embedding") or default_method(kind, "sentence"))


#: Sentence embeddings of an encoder, a masked LM, a causal LM or a sentence-transformers model
#: (SEAT). Default pooling per kind: ``cls`` (encoders, masked LMs; May et al. 2019),
#: ``weighted_mean`` (causal LMs; SGPT, Muennighoff 2022), ``model`` (sentence-transformers: the
#: model's configured modules): :mod:`audit.backends.hf_embed`, :mod:`audit.backends.st`.
SEAT_SENTENCES = Family(
    name="sentences",
    kinds=("encoder", "mlm", "causal"),
    uses=("embed",),
    test_type="words",
    measure=measure_sentences,
    params={"embedding": None, "layer": -1, "batch_size": None},
    method=_method,
    needs=_needs_sentences,
    description="one embedding per sentence (the test's sentence sets, or its words in the "
                "language's bleached SEAT templates); cls on encoders, position-weighted mean on "
                "decoders",
)
