"""Checkpoints of language models debiased by further pre-training (CDA, Dropout).

:func:`build_lm_debiased` trains a copy of a Hugging Face model directory on the user's corpus
(plain text, one sentence per line) with :func:`audit.lm_mitigation.training.further_pretrain`
(CDA: on the two-sided augmented corpus of :class:`audit.lm_mitigation.steps.CDA`; Dropout: on the
corpus itself, with :func:`audit.lm_mitigation.training.set_dropout`) and writes it to
``<output_dir>/models/<name>/`` atomically (trained in a temporary sibling, then renamed), with:

- ``build.json``: the key -- technique, parameters, the base model's content digest
  (:func:`audit.backends.hf.dir_digest`), the corpus digest and the attribute pairs' digest. A
  re-run with the same key returns the existing checkpoint without training; any change retrains.
- ``mitigation.json``: the same plus the step's provenance and the training losses.

Not yet wired into sweep specs (``models[i].mitigation`` accepts the static methods only); the
sweep step will call this function from a Ray task, on the GPU when there is one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from audit.backends.hf import dir_digest
from audit.errors import DataError, ParameterError
from audit.lm_mitigation.pairs import derive_pairs
from audit.lm_mitigation.steps import CDA, corpus_digest, pairs_digest
from audit.lm_mitigation.training import further_pretrain, set_dropout

__all__ = ["TRAINED_TECHNIQUES", "build_lm_debiased", "read_corpus"]

TRAINED_TECHNIQUES = ("cda", "dropout")
_TRAIN_PARAMS = {"steps": 100, "batch_size": 8, "lr": 5e-5, "max_length": 128, "seed": 0}


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


def build_lm_debiased(output_dir: str | os.PathLike, name: str, base: str | os.PathLike, *, kind: str,
                      technique: str, corpus: str | os.PathLike, language: str = "en",
                      params: dict[str, Any] | None = None) -> Path:
    """Train (or find) the debiased checkpoint; returns its directory (module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    if technique not in TRAINED_TECHNIQUES:
        raise ParameterError(f"technique {technique!r} is not trained; trained techniques: "
                             f"{', '.join(TRAINED_TECHNIQUES)}")
    unknown = sorted(set(params or {}) - set(_TRAIN_PARAMS))
    if unknown:
        raise ParameterError(f"{technique}: unknown parameter(s) {unknown}; parameters: {sorted(_TRAIN_PARAMS)}")
    p = {**_TRAIN_PARAMS, **(params or {})}
    lines = read_corpus(corpus)
    pairs = derive_pairs(language)
    record = {"kind": "lm_mitigation", "technique": technique, "model_kind": kind, "params": p,
              "base": str(base), "base_revision": dir_digest(base), "corpus": str(corpus),
              "corpus_digest": corpus_digest(lines),
              "pairs": {"language": language, "digest": pairs_digest(pairs)} if technique == "cda" else None}
    text = json.dumps(record, sort_keys=True)
    target = Path(output_dir) / "models" / name
    if (target / "build.json").is_file() and (target / "build.json").read_text(encoding="utf-8") == text:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        config = AutoConfig.from_pretrained(base, local_files_only=True)
        dropout = set_dropout(config) if technique == "dropout" else {}
        cls = AutoModelForMaskedLM if kind == "mlm" else AutoModelForCausalLM
        model = cls.from_pretrained(base, config=config, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(base, local_files_only=True)
        prov: dict[str, Any] = {"dropout": dropout}
        if technique == "cda":
            step = CDA()
            lines = step.transform(lines, pairs)
            prov = step.provenance_
            if not lines:
                raise DataError(f"{corpus}: no sentence contains a {language} attribute word; "
                                "CDA has nothing to train on")
        losses = further_pretrain(model, tok, lines, kind=kind, **p)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "mitigation.json").write_text(json.dumps({**record, "provenance": prov, "losses": losses},
                                                        indent=1, sort_keys=True, default=str), encoding="utf-8")
        (tmp / "build.json").write_text(text, encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
