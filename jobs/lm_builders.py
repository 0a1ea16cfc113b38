"""Checkpoints of language models debiased by further pre-training (CDA, Dropout).

:func:`build_lm_debiased` trains a copy of a Hugging Face model directory on the user's corpus
(plain text, one sentence per line) with :func:`audit.lm_mitigation.training.further_pretrain`
(CDA: on the two-sided augmented corpus of :class:`audit.lm_mitigation.steps.CDA`; Dropout: on the
corpus itself, with :func:`audit.lm_mitigation.training.set_dropout`) and writes it to
``<output_dir>/models/<name>/`` atomically (trained in a temporary sibling, then renamed), with:

- ``build.json``: the key -- technique, parameters, the base model's content digest
  (:func:`audit.backends.hf.dir_digest`), the corpus digest and the attribute pairs' digest. A
  re-run with the same key returns the existing checkpoint without training; any change retrains.
- ``mitigation.json``: the same plus the step's provenance, the training losses and the device it
  trained on (the model's ``device`` option, else CUDA when available, as for every model load:
  :func:`audit.backends.hf.pick_device`; not part of the key).

A sweep spec names these (and the projection / Self-Debias variants) in ``models[i].lm_mitigation``
(:mod:`jobs.lm_spec`); the driver builds them with :func:`build_lm_variant` before planning keys.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from audit.backends.hf import dir_digest, pick_device
from audit.datasets import corpus_from_tests
from audit.errors import DataError, ParameterError
from audit.outputs import write_text_atomic
from audit.lm_mitigation import TECHNIQUES
from audit.lm_mitigation.models import FITTED, MANIFEST, variant_revision
from audit.lm_mitigation.pairs import derive_pairs
from audit.lm_mitigation.self_debias import prompts_digest
from audit.lm_mitigation.steps import CDA, INLP, SelfDebias, SentenceDebias, corpus_digest, pairs_digest
from audit.lm_mitigation.training import TrainParams, further_pretrain, set_dropout
from audit.schema import arguments
from audit.runner import load_model
from jobs.built import is_built, original, write_built
from jobs.lm_spec import TESTS_CORPUS, read_corpus
from jobs.resolve import probe_revision

#: ``TESTS_CORPUS`` and ``read_corpus`` live in :mod:`jobs.lm_spec` (the spec reads the corpus for
#: its digest without importing the builders); importable from here as before.
__all__ = ["TESTS_CORPUS", "TRAINED_TECHNIQUES", "build_lm_debiased", "build_lm_variant", "read_corpus"]

TRAINED_TECHNIQUES = ("cda", "dropout")


def build_lm_debiased(output_dir: str | os.PathLike, name: str, base: str | os.PathLike, *, kind: str,
                      technique: str, corpus: str | os.PathLike, language: str = "en",
                      params: dict[str, Any] | None = None, bias_type: str = "gender",
                      device: str | None = None) -> Path:
    """Train (or find) the debiased checkpoint; returns its directory (module docstring). ``device``:
    where it trains (``None``: CUDA when available, else the CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    if technique not in TRAINED_TECHNIQUES:
        raise ParameterError(f"technique {technique!r} is not trained; trained techniques: "
                             f"{', '.join(TRAINED_TECHNIQUES)}")
    p = {**TrainParams().model_dump(), **arguments(TrainParams, params or {}, technique)}
    lines = read_corpus(corpus)
    pairs = derive_pairs(language, bias_type)
    record = {"kind": "lm_mitigation", "technique": technique, "model_kind": kind, "params": p,
              "base": str(base), "base_revision": dir_digest(base), "corpus": str(corpus),
              "corpus_digest": corpus_digest(lines),
              "pairs": ({"language": language, "digest": pairs_digest(pairs)}
                        | ({"bias_type": bias_type} if bias_type != "gender" else {})) if technique == "cda" else None}
    text = json.dumps(record, sort_keys=True)
    target = Path(output_dir) / "models" / name
    if is_built(target, text):
        return target
    dev = pick_device(device)

    def train(tmp: Path) -> None:
        config = AutoConfig.from_pretrained(base, local_files_only=True)
        dropout = set_dropout(config) if technique == "dropout" else {}
        cls = AutoModelForMaskedLM if kind == "mlm" else AutoModelForCausalLM
        model = cls.from_pretrained(base, config=config, local_files_only=True).to(dev)
        tok = AutoTokenizer.from_pretrained(base, local_files_only=True)
        prov: dict[str, Any] = {"dropout": dropout}
        sentences = lines
        if technique == "cda":
            step = CDA()
            sentences = step.transform(lines, pairs)
            prov = step.provenance_
            if not sentences:
                raise DataError(f"{corpus}: no sentence contains a {language} {bias_type} attribute word; "
                                "CDA has nothing to train on")
        losses = further_pretrain(model, tok, sentences, kind=kind, **p)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        out = {**record, "provenance": prov, "losses": losses, "device": str(dev)}
        (tmp / "mitigation.json").write_text(json.dumps(out, indent=1, sort_keys=True, default=str), encoding="utf-8")

    write_built(target, text, train)
    return target


# --------------------------------------------------------------------------------------
# Variants of a sweep spec (models[i].lm_mitigation, jobs.lm_spec)
# --------------------------------------------------------------------------------------


def _variant_corpus(spec, build: dict[str, Any]) -> tuple[list[str], str]:
    """The step's corpus sentences and the path of its file (``tests``: the text built from the
    language's shipped tests, written once to ``<output_dir>/corpora/tests-<language>.txt``)."""
    if build["corpus"] != TESTS_CORPUS:
        return read_corpus(build["corpus"]), build["corpus"]
    lang = build["language"]
    lines = corpus_from_tests([lang], seed=0)[lang]
    path = Path(spec.output_dir) / "corpora" / f"tests-{lang}.txt"
    text = "\n".join(lines) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        write_text_atomic(path, text)
    return lines, str(path)


def build_lm_variant(spec, model) -> Path:
    """Build (or find) the variant ``model`` (a :func:`jobs.lm_spec.variant_model`) into
    ``<output_dir>/models/<name>/``; return that directory (module docstrings of this module and
    :mod:`jobs.lm_spec`). Projections are fitted on the original loaded with its options; the
    directory is rebuilt only when the original's revision, the technique, its parameters, the
    corpus or the pairs change (``build.json``)."""
    b, base, local, kind = original(spec, model)
    tech = b["technique"]
    if tech in TRAINED_TECHNIQUES:
        if not Path(local).is_dir():
            raise ParameterError(f"model {base.name!r}: {tech} further pre-trains a local checkpoint folder; "
                                 f"{base.ref!r} is not one")
        _, corpus_path = _variant_corpus(spec, b)
        return build_lm_debiased(spec.output_dir, model.name, local, kind=kind, technique=tech, corpus=corpus_path,
                                 language=b["language"], params=b["params"], bias_type=b.get("bias_type", "gender"),
                                 device=base.options.get("device"))
    lines, corpus_path = _variant_corpus(spec, b) if b["corpus"] is not None else (None, None)
    pairs = derive_pairs(b["language"], b.get("bias_type", "gender")) if tech != "self_debias" else None
    options = {k: v for k, v in base.options.items() if k in ("backend", "revision", "dtype", "device",
                                                               "trust_remote_code", "allow_pickle")}
    record = {"kind": "lm_mitigation", "technique": tech, "params": b["params"], "base": base.name,
              "base_local_ref": local, "base_options": options,
              "base_revision": probe_revision(local, kind, dict(base.options)),
              "corpus_digest": corpus_digest(lines) if lines is not None else None,
              "pairs_digest": pairs_digest(pairs) if pairs is not None else None, "language": b["language"]}
    if b.get("bias_type", "gender") != "gender":
        record["bias_type"] = b["bias_type"]
    if tech == "self_debias":  # the prompts per language (audit.lm_mitigation.self_debias.PROMPTS)
        record["prompts_digest"] = prompts_digest()
    text = json.dumps(record, sort_keys=True, default=str)
    target = Path(spec.output_dir).resolve() / "models" / model.name
    if record["base_revision"] is not None and is_built(target, text):
        return target

    def fit(tmp: Path) -> None:
        t0 = time.perf_counter()
        loaded = load_model(local, **options)
        h = loaded.handle
        fitted = None
        if tech == "self_debias":
            step: Any = SelfDebias(**b["params"])
            prov = {"technique": tech, "reference": TECHNIQUES[tech].reference, "params": step.get_params(),
                    "prompts_digest": record["prompts_digest"]}
        else:
            step = {"inlp": INLP, "sentence_debias": SentenceDebias}[tech](**b["params"])
            step.fit(h.model, h.tokenizer, lines, pairs)
            fitted = step.projection_ if tech == "inlp" else step.directions_
            np.save(tmp / FITTED, np.asarray(fitted, dtype=np.float64))
            prov = json.loads(json.dumps(step.provenance_, sort_keys=True, default=str))
        manifest = {**record, "corpus": corpus_path, "provenance": prov, "fit_seconds": time.perf_counter() - t0,
                    "revision": variant_revision(loaded.revision, tech, fitted, prov)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str), encoding="utf-8")

    write_built(target, text, fit)
    return target
