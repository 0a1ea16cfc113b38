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
import inspect
import json
from pathlib import Path
from typing import Any, Mapping

from audit.errors import AuditError
from audit.lm_mitigation import TECHNIQUES
from audit.lm_mitigation.pairs import derive_pairs
from audit.lm_mitigation.steps import INLP, SelfDebias, SentenceDebias, corpus_digest, pairs_digest
from jobs.lm_builders import TESTS_CORPUS, read_corpus
from jobs.validators import check_fields, mapping, plain_values, string

__all__ = ["KIND", "LMStep", "parse_lm_mitigation", "variant_fields", "TRAIN_PARAMS"]

#: The ``build.kind`` of a debiased LM variant (set by the parser, not written in specs).
KIND = "lm_mitigation"
_FIELDS = {"technique", "corpus", "language", "bias_type", "params", "name"}
#: Parameters of the trained techniques (jobs.lm_builders._TRAIN_PARAMS).
TRAIN_PARAMS = ("steps", "batch_size", "lr", "max_length", "seed")
_STEP_CLASSES = {"inlp": INLP, "sentence_debias": SentenceDebias, "self_debias": SelfDebias}


@dataclasses.dataclass(frozen=True)
class LMStep:
    """One ``models[i].lm_mitigation`` step (see the module docstring)."""

    technique: str
    name: str
    corpus: str | None = None
    language: str = "en"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    bias_type: str = "gender"


def _check_params(technique: str, params: dict[str, Any]) -> None:
    cls = _STEP_CLASSES.get(technique)
    if cls is None:
        unknown = sorted(set(params) - set(TRAIN_PARAMS))
        if unknown:
            raise AuditError(f"{technique}: unknown parameter(s) {unknown}; parameters: {list(TRAIN_PARAMS)}")
        return
    allowed = [p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind == p.KEYWORD_ONLY]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise AuditError(f"{technique}: unknown parameter(s) {unknown}; parameters: {allowed}")
    cls(**params)  # the step's own validation


def parse_lm_mitigation(ctx: Any, path: str, v: Any, model_name: str, *, name_re: Any,
                        source_dir: Path | None = None) -> tuple[LMStep, ...]:
    """``models[i].lm_mitigation``: one step (a mapping or a technique name) or a list of steps,
    each checked before anything runs (technique, fields, parameters, corpus file, language);
    ``name_re``: the spec's rule for derived model names."""
    items = v if isinstance(v, list) else [v]
    if not items:
        raise ctx.data(path, "expected an LM debiasing step or a non-empty list of steps")
    steps = []
    for j, item in enumerate(items):
        p = f"{path}[{j}]" if isinstance(v, list) else path
        d = mapping(ctx, p, {"technique": item} if isinstance(item, str) else item)
        check_fields(ctx, p, d, _FIELDS)
        if "technique" not in d:
            raise ctx.data(p, "missing required field 'technique'")
        tech = string(ctx, f"{p}.technique", d["technique"])
        if tech not in TECHNIQUES:
            raise ctx.param(f"{p}.technique",
                            f"unknown LM debiasing technique {tech!r}; known: {', '.join(TECHNIQUES)}")
        params = plain_values(ctx, f"{p}.params", d.get("params"))
        try:
            _check_params(tech, dict(params))
        except AuditError as e:
            raise ctx.param(f"{p}.params", str(e)) from None
        lang = string(ctx, f"{p}.language", d["language"]) if d.get("language") is not None else "en"
        bias_type = string(ctx, f"{p}.bias_type", d["bias_type"]) if d.get("bias_type") is not None else "gender"
        if tech == "self_debias" and d.get("bias_type") is not None:
            raise ctx.param(f"{p}.bias_type", "self_debias takes its bias type as params.bias_type (its prompt)")
        if tech != "self_debias":
            try:
                derive_pairs(lang, bias_type)
            except AuditError as e:
                raise ctx.param(f"{p}.bias_type" if bias_type != "gender" else f"{p}.language", str(e)) from None
        corpus = string(ctx, f"{p}.corpus", d["corpus"]) if d.get("corpus") is not None else None
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
        name = string(ctx, f"{p}.name", d["name"]) if d.get("name") is not None else f"{model_name}+{tech}"
        if not name_re.match(name):
            raise ctx.param(f"{p}.name", f"{name!r}: use letters, digits, '-', '_', '.' and '+' only")
        steps.append(LMStep(technique=tech, name=name, corpus=corpus, language=lang, params=params,
                            bias_type=bias_type))
    return tuple(steps)


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
