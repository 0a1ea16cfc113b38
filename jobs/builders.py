"""Tiny local models built on demand for smoke sweeps (``models[i].build`` in a spec).

The driver calls :func:`build_models` before planning keys: each model with a ``build`` block
is written once into ``<output_dir>/models/<name>/`` (atomically: built in a temporary sibling,
then renamed) together with ``build.json`` (its build parameters); it is rebuilt only when those
parameters change. Builds are deterministic (fixed seeds, one thread), so a rebuilt model has
the same content digest and the same task keys.

Kinds:

- ``fasttext``: a skip-gram fastText model (``model.bin``) trained on the tiny corpus of
  ``audit/tiny_models.py`` (sentences made of the English WEAT/LPBS/CrowS-Pairs vocabulary);
  ``dim`` (default 16), ``epoch`` (default 5); one thread and fastText's fixed internal seed
  make it deterministic; ``bucket`` is kept small (20000) so the file stays around 2 MB. Words
  outside its vocabulary get subword vectors. With ``language: xx`` it is trained instead on
  the small text :func:`audit.datasets.corpus_from_tests` builds from that language's shipped
  word lists and templates (``seed``, default 0), so every test word is in its vocabulary
  (``jobs/specs/smoke-languages.yaml``: one such model per language).
- ``bert``, ``roberta``, ``gpt2``: the tiny Hugging Face checkpoints of ``audit/tiny_models.py``
  (hidden 32, 2 layers, trained for a few seeded steps), saved with safetensors.
- ``llama``, ``qwen2``, ``mistral``: tiny decoder-only models of those families
  (:func:`audit.tiny_models.build_tiny_causal`: byte-level BPE, the family's BOS/pad
  conventions). With ``language: xx`` or ``language: [xx, yy, ...]`` the tokenizer and model are
  trained on the English tiny corpus plus the text :func:`audit.datasets.corpus_from_tests`
  builds from those languages' shipped tests (one multilingual model for a list).

- ``mitigation`` (set by the spec parser for ``models[i].mitigation``, never written by hand): a
  debiased copy of a static model, see :func:`build_mitigated`.

The Hugging Face builders live in :mod:`audit.tiny_models` (package code, shared with the test
suite), so smoke sweeps run from an installed wheel as from a checkout. A Hugging Face kind
without ``language`` is copied from that module's machine cache
(:func:`audit.tiny_models.tiny_model_dir`: built there once per machine by the same builder,
identical bytes), so a second sweep, or the test suite's many sweeps, do not train it again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from audit import tiny_models
from audit.backends.static import content_digest
from audit.datasets import corpus_from_tests
from audit.errors import AuditError, ModelError
from audit.mitigation import apply_mitigation, as_matrix, load_definitions
from audit.provenance import code_version
from audit.runner import load_model
from jobs.built import is_built, original, write_built
from jobs.lm_builders import build_lm_variant
from jobs.resolve import (
    MATRIX_FILE,
    built_path,
    probe_revision,
)

_FASTTEXT_DEFAULTS = {"dim": 16, "epoch": 5}

#: Debiased matrices up to this size (bytes of ``vectors.npy`` + vocabulary) are copied into the
#: reports (and so logged on the parent run as artifacts); larger ones (GloVe 6B 50d: 400000 x 50
#: float32 = 80 MB) are logged as a pointer only: ``mitigation.json`` with path and digest.
ARTIFACT_MAX_BYTES = 32 * 2**20

VOCAB_FILE = "vectors.vocab.txt"
MANIFEST_FILE = "mitigation.json"



def _build_fasttext(out: Path, params: dict[str, Any]) -> None:
    import fasttext

    lang = params.get("language")
    if lang:
        # A small text built from the shipped tests' word lists and templates of that language
        # (audit.datasets.corpus_from_tests), so every test word is in the vocabulary.

        corpus = corpus_from_tests([lang], seed=int(params.get("seed", 0)))[lang]
    else:
        corpus = tiny_models.tiny_corpus()
    p = {**_FASTTEXT_DEFAULTS, **{k: v for k, v in params.items() if k in _FASTTEXT_DEFAULTS}}
    txt = out / "corpus.txt"
    txt.write_text("\n".join(corpus) + "\n", encoding="utf-8")
    model = fasttext.train_unsupervised(
        str(txt), model="skipgram", dim=int(p["dim"]), epoch=int(p["epoch"]), minCount=1,
        bucket=20000, thread=1, verbose=0,
    )
    model.save_model(str(out / "model.bin"))
    txt.unlink()


def _build_hf(kind: str, out: Path, params: dict[str, Any] | None = None) -> None:
    """A tiny Hugging Face model of ``kind`` into ``out``: the model
    :func:`audit.tiny_models.tiny_model_dir` keeps (the same builder, deterministic: identical
    bytes), copied from that machine cache, so it is built once per machine, not once per sweep.
    A causal family (llama, qwen2, mistral) with ``language`` is the one trained on those
    languages' text too."""
    lang = (params or {}).get("language")
    langs = ([lang] if isinstance(lang, str) else list(lang)) if lang else None
    shutil.copytree(tiny_models.tiny_model_dir(kind, languages=langs), out, dirs_exist_ok=True)


def build_model(output_dir: str | Path, name: str, build: dict[str, Any]) -> Path:
    """Build one model if missing (or built with other parameters); return its reference path."""
    kind = build["kind"]
    target_dir = built_path(output_dir, name)
    record = json.dumps(dict(build), sort_keys=True)
    if not is_built(target_dir, record):
        write_built(target_dir, record, lambda tmp: _build_fasttext(tmp, dict(build)) if kind == "fasttext"
                    else _build_hf(kind, tmp, dict(build)))
    return built_path(output_dir, name, kind)


def build_models(spec, plan) -> dict[str, Path]:
    """Build every model of the spec that has a ``build`` block, in spec order (an original
    before its debiased copies); name -> path. ``plan`` is the spec's expanded plan
    (:func:`jobs.plan.expand`, which needs no built model): debiased copies restricted to the
    tests' words (``scope: tests``) read the words from it."""
    out = {}
    for m in spec.models:
        if m.build and m.build.get("kind") == "mitigation":
            out[m.name] = build_mitigated(spec, m, plan)
        elif m.build and m.build.get("kind") == "lm_mitigation":  # a debiased LM variant (jobs.lm_spec)
            out[m.name] = build_lm_variant(spec, m)
        elif m.build:
            out[m.name] = build_model(spec.output_dir, m.name, dict(m.build))
    return out


# --------------------------------------------------------------------------------------
# Debiased copies (models[i].mitigation)
# --------------------------------------------------------------------------------------


def _scope_words(plan, base_name: str) -> list[str]:
    """The words the original model's tasks look up (``scope: tests``): the union over its
    tasks of the words each needs with its look-up parameters (:meth:`jobs.plan.Plan.words_for_model`)."""
    return sorted(plan.words_for_model(base_name))


def mitigation_record(spec, model, plan) -> dict[str, Any]:
    """What identifies a debiased copy: the original's reference and *resolved* revision, the
    method, its parameters, the definitions (name and content digest), the scope (with a
    digest of the words for ``scope: tests``) and the code version. The copy is rebuilt only
    when this changes, so a resumed sweep reuses the same file and the same task keys."""
    import hashlib

    b, base, local, kind = original(spec, model)
    if kind != "static":
        raise ModelError(f"model {base.name!r} is a {kind} model; debiasing ({b['method']}) needs static word vectors")
    defs = load_definitions(b["definitions"])
    rec = {
        "kind": "mitigation", "model": model.name, "base": base.name, "base_ref": base.ref, "base_local_ref": local,
        "base_revision": probe_revision(local, "static", dict(base.options)), "method": b["method"],
        "params": b["params"], "definitions": b["definitions"], "definitions_digest": defs.digest(),
        "scope": b["scope"], "code_version": code_version(),
    }
    if b["scope"] == "tests":
        words = _scope_words(plan, base.name)
        rec["words_digest"] = "sha256:" + hashlib.sha256("\n".join(words).encode("utf-8")).hexdigest()
        rec["n_words_scope"] = len(words)
    return rec


def build_mitigated(spec, model, plan) -> Path:
    """Build the debiased copy ``model`` (a :func:`jobs.spec.mitigated_model`) if missing or
    built from something else; return the path of its ``vectors.npy``.

    Loads the original whole (:func:`audit.runner.load_model` without a word filter, with the
    original's load options), fits the method on the whole matrix with the definitions
    (:func:`audit.mitigation.apply_mitigation`), transforms every word (``scope: all``) or the
    words the tests need (``scope: tests``), and writes into ``<output_dir>/models/<name>/``
    (atomically, like the tiny models): ``vectors.npy`` + ``vectors.vocab.txt``
    (:meth:`EmbeddingMatrix.save_npy`), ``mitigation.json`` (the manifest: original, method,
    parameters, definitions digest, the debiased model's provenance, its revision = the
    content digest :func:`audit.backends.static.load_static` reports, file sizes, fit seconds)
    and ``build.json`` (:func:`mitigation_record`). If the original's revision cannot be probed
    without loading it, the copy is rebuilt on every run (the methods are deterministic, so the
    rebuilt files, their revision and the task keys stay the same).

    Raises the method's :class:`~audit.errors.AuditError` (unknown words, coverage of the
    definitions, a look-up-only model) prefixed with the model and the step.
    """
    import time

    b = dict(model.build)
    where = f"model {model.name!r} ({b['method']} of {b['base']!r})"
    try:
        rec = mitigation_record(spec, model, plan)
    except AuditError as e:
        raise type(e)(f"{where}: {e}") from None
    target_dir = built_path(spec.output_dir, model.name)
    text = json.dumps(rec, sort_keys=True)
    if rec["base_revision"] is not None and is_built(target_dir, text) \
            and (target_dir / MATRIX_FILE).is_file() and (target_dir / VOCAB_FILE).is_file():
        return target_dir / MATRIX_FILE
    base = spec.model(b["base"])

    def fill(tmp: Path) -> None:
        try:
            loaded = load_model(rec["base_local_ref"], **dict(base.options))
            matrix = as_matrix(loaded.handle)
            words = _scope_words(plan, base.name) if b["scope"] == "tests" else None
            t0 = time.perf_counter()
            debiased, method = apply_mitigation(matrix, b["method"], load_definitions(b["definitions"]),
                                                dict(b["params"]), words=words)
            fit_seconds = time.perf_counter() - t0
        except AuditError as e:
            raise type(e)(f"{where}: {e}") from None
        saved = debiased.save_npy(tmp / MATRIX_FILE, tmp / VOCAB_FILE)
        revision = content_digest([saved.matrix, saved.vocab])  # what load_static will report
        size = saved.matrix.stat().st_size + saved.vocab.stat().st_size
        manifest = {
            "model": model.name, "base_model": base.name, "base_ref": base.ref,
            "base_revision": rec["base_revision"] or loaded.revision, "method": method.name,
            "reference": method.reference, "params": dict(b["params"]), "all_params": method.get_params(),
            "definitions": b["definitions"], "definitions_digest": rec["definitions_digest"], "scope": b["scope"],
            "n_words_changed": None if words is None else len(words),
            "matrix": str(target_dir / MATRIX_FILE), "vocab": str(target_dir / VOCAB_FILE),
            "ref": f"npy:{target_dir / MATRIX_FILE},{target_dir / VOCAB_FILE}", "revision": revision,
            "bytes": size, "n_words": len(debiased), "dim": debiased.dim, "fit_transform_seconds": fit_seconds,
            "provenance": debiased.provenance,
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str), encoding="utf-8")

    write_built(target_dir, text, fill)
    return target_dir / MATRIX_FILE
