"""The backend table: every backend a model may name, with its engine, the model kind it gives,
how a reference is recognised without loading anything, and the one architecture -> kind rule.

Everything that needs to know about backends reads this table: the loader
(:func:`audit.runner.load_model`), the sweep-spec validator (``jobs/spec.py``: which names
``models[i].backend`` accepts), the planner (``jobs/resolve.py``: a model's kind without loading
it) and the watcher (``jobs/watch/sources.py``: the backend of a new Hub repository). A new engine
is one module plus one row here.

Architecture -> kind (:func:`kind_from_architectures`), the one rule: the **first** entry of a
config's ``architectures`` that names a head decides -- ``*ForMaskedLM`` -> ``mlm``;
``*ForCausalLM`` or ``*LMHeadModel`` -> ``causal``; no entry naming one of those heads ->
``encoder``. ``save_pretrained`` writes the class the model was saved as first, and that is the
class whose head the weights hold, so ``[GPT2LMHeadModel, BertForMaskedLM]`` is ``causal``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

from audit.errors import ModelError

__all__ = ["Backend", "BACKENDS", "ENGINES", "names", "get", "kind_of_backend", "backend_of_kind",
           "kind_from_architectures", "infer_hf_kind", "STATIC_FORMATS", "HF_KINDS"]


@dataclasses.dataclass(frozen=True)
class Backend:
    """One row of the backend table.

    name:   what a spec's ``backend:`` says (``hf-mlm``, ``fasttext``, ``static`` ...).
    engine: the module that loads it: ``static`` (:mod:`audit.backends.static`), ``hf``
            (:mod:`audit.backends.hf`) or ``st`` (:mod:`audit.backends.st`).
    kind:   the model kind it gives (``static``, ``encoder``, ``mlm``, ``causal``).
    format: for static backends, the format passed to :func:`audit.backends.static.load_static`
            (``None``: told from the reference).
    """

    name: str
    engine: str
    kind: str
    format: str | None = None


#: Static word-vector formats a spec may name (``static``: the format told from the reference).
STATIC_FORMATS = ("fasttext", "fasttext-bin", "fasttext-vec", "word2vec", "word2vec-text", "text", "word2vec-bin",
                  "glove", "npy", "spacy", "gensim", "gensim-kv", "glove-6b-50d", "wefe-test-model")
#: Hugging Face backend -> model kind (the Transformers auto class: :data:`audit.backends.hf.KINDS`).
HF_KINDS = {"hf-encoder": "encoder", "hf-mlm": "mlm", "hf-causal": "causal"}

BACKENDS: dict[str, Backend] = {
    "static": Backend("static", "static", "static"),
    **{f: Backend(f, "static", "static", f) for f in STATIC_FORMATS},
    **{n: Backend(n, "hf", k) for n, k in HF_KINDS.items()},
    "sentence-transformers": Backend("sentence-transformers", "st", "sentence"),
}
#: The engines, in the order a reference without ``backend:`` is tried: an ``st:`` reference
#: (:func:`audit.backends.st.is_st_ref`), a static file or short name, else a Hugging Face checkpoint.
ENGINES = ("st", "static", "hf")


def names() -> tuple[str, ...]:
    """Every backend name a model may give, in table order."""
    return tuple(BACKENDS)


def get(name: str) -> Backend | None:
    """The row of a backend name, ``None`` for an unknown one."""
    return BACKENDS.get(name)


def kind_of_backend(name: str | None) -> str | None:
    """The model kind a backend gives (``None`` for no or an unknown backend)."""
    row = BACKENDS.get(name) if name is not None else None
    return row.kind if row else None


def backend_of_kind(kind: str, engine: str = "hf") -> str | None:
    """The backend of ``engine`` that loads a model of ``kind`` (``mlm`` -> ``hf-mlm``), or ``None``."""
    for row in BACKENDS.values():
        if row.engine == engine and row.kind == kind:
            return row.name
    return None


def kind_from_architectures(archs: Sequence[str]) -> str:
    """``mlm``/``causal``/``encoder`` from a Hugging Face config's ``architectures`` list: the first
    entry naming a masked-LM or causal-LM head decides (module docstring)."""
    for a in archs:
        a = str(a)
        if a.endswith("ForMaskedLM"):
            return "mlm"
        if a.endswith("ForCausalLM") or a.endswith("LMHeadModel"):
            return "causal"
    return "encoder"


def infer_hf_kind(path_or_id: str) -> str:
    """The kind of a local checkpoint from its ``config.json`` (``encoder`` when there is none)."""
    cfg = Path(path_or_id) / "config.json"
    if not cfg.is_file():
        return "encoder"
    try:
        archs = json.loads(cfg.read_text(encoding="utf-8")).get("architectures") or []
    except ValueError as e:
        raise ModelError(f"{cfg}: config.json is not valid JSON ({e})") from None
    return kind_from_architectures(archs)
