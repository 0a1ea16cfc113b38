"""``models[i].lm_mitigation`` in a sweep spec: debiased variants of a language model, audited
side by side with it (docs/mitigation.md, "Debiasing language models in a sweep").

Each step names a technique of :data:`audit.lm_mitigation.TECHNIQUES` and adds a model
``<model>+<technique>`` (or ``name:``) right after the original, with reference
``built:<name>``: before the tasks run, :func:`jobs.lm_builders.build_lm_variant` fits or
trains it into ``<output_dir>/models/<name>/``:

- ``inlp``, ``sentence_debias``: the projection fitted on the original with the corpus and the
  language's attribute pairs, saved as ``fitted.npy`` + ``lm_mitigation.json``; loaded as the
  original with the projection applied where the representations are read (SEAT, word metrics);
- ``self_debias``: nothing to fit (``lm_mitigation.json`` only); loaded as the original whose
  scoring operations (CrowS-Pairs, LPBS, BBQ, perplexity) read the self-debiased distribution;
- ``cda``, ``dropout``: a further-pre-trained checkpoint (:func:`jobs.lm_builders.build_lm_debiased`)
  audited like any model.

Step fields: ``technique`` (required), ``corpus`` (a text file, one sentence per line, or
``tests``: the small text :func:`audit.datasets.corpus_from_tests` builds from the language's
shipped tests; required by every technique but ``self_debias``), ``language`` (of the attribute
pairs, default ``en``), ``bias_type`` (of the attribute pairs, :data:`audit.lm_mitigation.pairs.BIAS_TYPES`,
default ``gender``; not for ``self_debias``, whose prompt is ``params.bias_type``), ``params`` (the
technique's parameters), ``name``.

The metrics whose family a technique does not change are dropped for its variant at plan time,
each with one line naming technique, family and reason (:func:`audit.lm_mitigation.family_reason`);
a technique that does not apply to the original's kind refuses the spec.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

from audit.errors import AuditError, DataError
from audit.lm_mitigation import TECHNIQUES
from audit.lm_mitigation.pairs import derive_pairs
from audit.lm_mitigation.steps import PARAMS, corpus_digest, pairs_digest
from audit.lm_mitigation.training import TrainParams
from audit.schema import NullDefaults, OneOf, Text, validate
from jobs.validators import DerivedName, PlainValues, steps

__all__ = ["KIND", "LMStep", "LMStepFields", "parse_lm_mitigation", "variant_fields", "TRAIN_PARAMS", "TESTS_CORPUS",
           "read_corpus"]

#: ``corpus: tests`` in a spec step: the text built from the language's shipped tests.
TESTS_CORPUS = "tests"

def read_corpus(path: str | os.PathLike) -> list[str]:
    """The user's corpus: UTF-8 text, one sentence per line, blank lines skipped."""
    p = Path(path)
    try:
        lines = [s.strip() for s in p.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{p}: cannot read the corpus: {e}") from None
    lines = [s for s in lines if s]
    if not lines:
        raise DataError(f"{p}: the corpus has no sentences")
    return lines


#: The ``build.kind`` of a debiased LM variant (set by the parser, not written in specs).
KIND = "lm_mitigation"
#: Parameters of the trained techniques (:class:`audit.lm_mitigation.training.TrainParams`).
TRAIN_PARAMS = tuple(TrainParams.model_fields)


@dataclasses.dataclass(frozen=True)
class LMStep:
    """One ``models[i].lm_mitigation`` step (see the module docstring)."""

    technique: str
    name: str
    corpus: str | None = None
    language: str = "en"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    bias_type: str = "gender"


class LMStepFields(NullDefaults):
    """One step of ``models[i].lm_mitigation`` (see :class:`LMStep`; a string is
    ``{technique: <string>}``; a null field takes its default); ``params`` are then checked
    against the technique's own model (:data:`audit.lm_mitigation.steps.PARAMS`), the corpus file
    and the language's pairs by :func:`parse_lm_mitigation`."""

    technique: OneOf("LM debiasing technique", tuple(TECHNIQUES))
    corpus: Text | None = None
    language: Text = "en"
    bias_type: Text | None = None
    params: PlainValues | None = None
    name: DerivedName | None = None


def parse_lm_mitigation(ctx: Any, path: str, v: Any, model_name: str, *,
                        source_dir: Path | None = None) -> tuple[LMStep, ...]:
    """``models[i].lm_mitigation``: one step (a mapping or a technique name) or a list of steps,
    each a :class:`LMStepFields` checked before anything runs (technique, fields, parameters,
    corpus file, language)."""
    out = []
    for p, f in steps(ctx, path, v, LMStepFields, "technique", "an LM debiasing step"):
        tech, lang, corpus, params = f.technique, f.language, f.corpus, dict(f.params or {})
        validate(PARAMS[tech], params, ctx.source, f"{p}.params")
        if tech == "self_debias" and f.bias_type is not None:
            raise ctx.param(f"{p}.bias_type", "self_debias takes its bias type as params.bias_type (its prompt)")
        bias_type = f.bias_type or "gender"
        if tech != "self_debias":
            try:
                derive_pairs(lang, bias_type)
            except AuditError as e:
                raise ctx.param(f"{p}.bias_type" if bias_type != "gender" else f"{p}.language", str(e)) from None
        if corpus is None and tech != "self_debias":
            raise ctx.data(f"{p}.corpus", f"{tech} is fitted on a corpus: give a text file (one sentence per line) "
                           f"or '{TESTS_CORPUS}'")
        if corpus is not None and corpus != TESTS_CORPUS:
            cp = Path(corpus).expanduser()
            if not cp.is_absolute() and source_dir is not None:
                cp = source_dir / cp
            if not cp.is_file():
                raise ctx.param(f"{p}.corpus", f"{corpus}: no such file")
            corpus = str(cp.resolve())
        out.append(LMStep(technique=tech, name=f.name or f"{model_name}+{tech}", corpus=corpus, language=lang,
                          params=params, bias_type=bias_type))
    return tuple(out)


def variant_fields(base: Any, step: LMStep) -> dict[str, Any]:
    """The :class:`jobs.spec.ModelSpec` fields of a variant of ``base`` (reference
    ``built:<name>``): the original's languages, parameters, tests and load options, and the
    tags that link it to the original (technique, parameters, language, corpus and pairs digests)."""
    build = {"kind": KIND, "base": base.name, "technique": step.technique, "corpus": step.corpus,
             "language": step.language, "params": dict(step.params)}
    if step.bias_type != "gender":  # the default stays out of build (and so out of existing keys)
        build["bias_type"] = step.bias_type
    tags = {"audit.lm_mitigation": step.technique, "audit.base_model": base.name,
            "audit.lm_mitigation.language": step.language, "audit.lm_mitigation.corpus": str(step.corpus)}
    params = {"lm_mitigation": step.technique, "base_model": base.name, "lm_mitigation.language": step.language}
    if step.corpus is not None and step.corpus != TESTS_CORPUS:
        tags["audit.lm_mitigation.corpus_digest"] = params["lm_mitigation.corpus_digest"] = \
            corpus_digest(read_corpus(step.corpus))
    if step.technique != "self_debias":
        tags["audit.lm_mitigation.bias_type"] = params["lm_mitigation.bias_type"] = step.bias_type
        tags["audit.lm_mitigation.pairs_digest"] = params["lm_mitigation.pairs_digest"] = \
            pairs_digest(derive_pairs(step.language, step.bias_type))
    for k, x in sorted(step.params.items()):
        tags[f"audit.lm_mitigation.param.{k}"] = params[f"lm_mitigation.param.{k}"] = json.dumps(x, sort_keys=True)
    options = {k: v for k, v in base.options.items() if k in ("dtype", "device")}
    return dict(ref=f"built:{step.name}", name=step.name, languages=base.languages, options=options,
                params=dict(base.params), build=build, tests=base.tests, run_tags=tags, run_params=params)
