"""The measure step of the word-association metrics: one vector per word of a test.

Static models look the words up (:func:`audit.vocab.resolve_sets`: normalisation, multi-word
means, coverage, the missing-word threshold). Hugging Face models embed each word in context
(:class:`audit.measure.contextual.ContextualWordVectors`): by default the mean, over the word's
SEAT template sentences of its language, of the word's pooled subtoken states (Dusi et al. 2024,
"Discrimination bias detection through categorical association in pre-trained language
models", IEEE Access; ``word_context="templates"``), or the bare ``<special> word <special>``
input (``word_context="bare"``). The same holds for encoders, masked LMs and causal LMs
(decoder hidden states; the pooling conventions for decoders are in
:mod:`audit.measure.contextual`). The vectors of one test are computed once per loaded model and
reused by every metric of that test (``LoadedModel.cache``).
"""

from __future__ import annotations

from typing import Any, Mapping

from audit.entries import Family, Measurement, Metric
from audit.errors import DataError, ParameterError
from audit.measure.contextual import ContextualWordVectors, default_method
from audit.suites import WordTest
from audit.vocab import resolve_sets, words_needed

__all__ = ["ASSOCIATION", "WORD_CONTEXTS", "set_names", "measure_words"]

#: How a transformer embeds a word for the word metrics.
WORD_CONTEXTS = ("templates", "bare")


def set_names(test: WordTest) -> dict[str, str]:
    """Set label (``target0``, ``attribute1``, ...) -> the test's set name."""
    out = {f"target{i}": s.name for i, s in enumerate(test.targets)}
    out.update({f"attribute{i}": s.name for i, s in enumerate(test.attributes)})
    return out


def _by_name(sets, values) -> dict[str, Any]:
    """Values keyed by set name (a repeated name gets ``_2``, ``_3``, ...)."""
    out: dict[str, Any] = {}
    for s, v in zip(sets, values):
        key, n = s.name, 2
        while key in out:
            key = f"{s.name}_{n}"
            n += 1
        out[key] = v
    return out


def _drop_unpaired(sets, resolved, dropped: dict[str, list[str]]) -> None:
    """Keep only the positions whose entries were found in *every* set of a paired role.

    Paired sets (she/he, woman/man) are aligned by position; when one word of a pair is missing
    from the vocabulary the whole pair is dropped (its partner is reported in ``dropped``), so
    that the remaining rows stay aligned. Sets of unequal length never get here:
    :func:`measure_words` refuses them, naming the sets.
    """
    if len({len(s.words) for s in sets}) != 1:
        return
    found = [set(r.words) for r in resolved]
    keep = [i for i in range(len(sets[0].words)) if all(s.words[i] in f for s, f in zip(sets, found))]
    for s, r in zip(sets, resolved):
        pos = {w: j for j, w in enumerate(r.words)}
        rows = [pos[s.words[i]] for i in keep]
        lost = [w for w in r.words if w not in {s.words[i] for i in keep}]
        if lost:
            dropped[s.name] = lost
        r.words = [r.words[j] for j in rows]
        r.vectors = r.vectors[rows]


def paired_role(metric: Metric, analysis_params: Mapping[str, Any], test: WordTest) -> str | None:
    """The side whose sets pair up row by row: the protected-group side (the task's ``groups``
    parameter, else the test's) for ``paired="groups"``."""
    if metric.paired == "groups":
        return str(analysis_params.get("groups") or test.groups)
    return metric.paired


def _contextual_word_vectors(model, test: WordTest, mp: Mapping[str, Any]) -> ContextualWordVectors:
    """Word vectors of a transformer for one test, cached on the loaded model so that the
    metrics of the same test embed each word's sentences once."""
    context = mp["word_context"]
    if context not in WORD_CONTEXTS:
        raise ParameterError(f"word_context must be 'templates' or 'bare', got {context!r}")
    method = mp["embedding"] or default_method(model.kind, "word")
    key = ("words", test.digest(), context, method, mp["layer"])
    wv = model.cache.get(key)
    if wv is None:
        try:
            wv = ContextualWordVectors(
                model.handle, method=method, layer=mp["layer"],
                test=test if context == "templates" else None, batch_size=mp["batch_size"],
            )
        except DataError as e:
            raise DataError(f"{e} (or embed the bare words: parameter word_context='bare')") from None
        model.cache[key] = wv
    return wv


def measure_words(model, test: WordTest, metric: Metric, mp: Mapping[str, Any],
                  ap: Mapping[str, Any]) -> Measurement:
    """One vector per word of every set of ``test`` (see the module docstring)."""
    wv = model.handle if model.kind == "static" else _contextual_word_vectors(model, test, mp)
    paired = paired_role(metric, ap, test)
    sets = [*test.targets, *test.attributes]
    if paired:
        group = test.targets if paired == "targets" else test.attributes
        if len({len(s.words) for s in group}) > 1:
            sizes = ", ".join(f"{s.name!r} has {len(s.words)}" for s in group)
            raise DataError(f"test {test.name!r}: the paired {paired[:-1]} sets need equal lengths "
                            f"(entry i of each set forms a pair); {sizes}")
    resolved = resolve_sets(
        wv, sets, casefold=mp["casefold"], strip_accents=mp["strip_accents"],
        max_missing=mp["max_missing"], test_name=test.name,
    )
    nt = len(test.targets)
    dropped: dict[str, list[str]] = {}
    if paired == "targets":
        _drop_unpaired(list(test.targets), resolved[:nt], dropped)
    elif paired == "attributes":
        _drop_unpaired(list(test.attributes), resolved[nt:], dropped)
    labels = {f"target{i}": list(r.words) for i, r in enumerate(resolved[:nt])}
    labels.update({f"attribute{i}": list(r.words) for i, r in enumerate(resolved[nt:])})
    return Measurement(
        family=ASSOCIATION.name,
        targets=[r.vectors for r in resolved[:nt]],
        attributes=[r.vectors for r in resolved[nt:]],
        labels=labels,
        set_names=set_names(test),
        coverage=_by_name(sets, [r.coverage for r in resolved]),
        missing=_by_name(sets, [list(r.missing) for r in resolved]),
        subword=_by_name(sets, [list(r.subword) for r in resolved]),
        unpaired=dropped,
        info={"groups": test.groups, "groups_reason": test.groups_reason,
              "coverage_vocabulary": _by_name(sets, [r.vocabulary_coverage for r in resolved])},
    )


def _needs_words(test: WordTest) -> str | None:
    empty = [s.name for s in (*test.targets, *test.attributes) if not s.words]
    return f"test {test.name}: set(s) {', '.join(empty)} have no words (sentence sets only)" if empty else None


def _words(test: WordTest, mp: Mapping[str, Any]) -> set[str]:
    return words_needed([*test.targets, *test.attributes], casefold=bool(mp.get("casefold")),
                        strip_accents=bool(mp.get("strip_accents")))


def _method(kind: str, params: Mapping[str, Any]) -> str:
    if params.get("embedding"):
        return str(params["embedding"])
    return "lookup" if kind == "static" else default_method(kind, "word")


#: Word-association metrics: one vector per word (static look-up or contextual, see above).
ASSOCIATION = Family(
    name="association",
    kinds=("static", "encoder", "mlm", "causal"),
    # a static model's look-up: no embedding method, layer, batches or template contexts
    ignored_by={k: ("static",) for k in ("embedding", "layer", "batch_size", "word_context")},
    uses=("embed",),
    test_type="words",
    measure=measure_words,
    params={
        "casefold": False,
        "strip_accents": False,
        "max_missing": 0.2,
        "embedding": None,  # cls | target_first | target_pooled | mean | weighted_mean | last (transformers)
        "layer": -1,
        "batch_size": None,
        "word_context": "templates",
    },
    method=_method,
    needs=_needs_words,
    words=_words,
    description="one vector per word: static look-up, or the word's contextual embedding averaged "
                "over its language's SEAT templates (Dusi et al. 2024)",
)
