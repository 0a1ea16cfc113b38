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
           "kind_from_architectures", "infer_hf_kind", "STATIC_FORMATS", "HF_KINDS", "BASE_KINDS", "model_kinds",
           "kind_names", "of_prefix", "strip_prefix", "load_with", "probe_with", "register_backend",
           "kinds_with", "pooling_of"]


@dataclasses.dataclass(frozen=True)
class Backend:
    """One row of the backend table.

    name:   what a spec's ``backend:`` says (``hf-mlm``, ``fasttext``, ``static`` ...).
    engine: the module that loads it: ``static`` (:mod:`audit.backends.static`), ``hf``
            (:mod:`audit.backends.hf`) or ``st`` (:mod:`audit.backends.st`).
    kind:   the model kind it gives (``static``, ``encoder``, ``mlm``, ``causal``, or a kind the
            row introduces: then ``kind_name`` says how messages name it).
    format: for static backends, the format passed to :func:`audit.backends.static.load_static`
            (``None``: told from the reference).
    prefix: a reference starting with it names this backend by itself (``st:``), stripped before
            loading; ``None``: only ``backend:`` names it.
    loader: ``"module:function"``, the engine's ``load(ref, *, path, device, dtype)`` returning a
            model of the interface (``kind``, ``backend``, ``revision``); ``None`` for the static
            and Hugging Face engines, which :func:`audit.runner.load_model` loads itself.
    kind_name: how messages name a model of a kind this row introduces (``a sentence-transformers
            embedding model``).
    probe:  ``"module:function"``, ``probe(ref) -> revision | None``: the revision the loader
            will report, computed without loading (``None``: known only after loading).
    operations: for a kind the row introduces, the model-interface operations its models
            implement (``embed``): every family whose ``uses`` they cover runs on the kind
            (:func:`kinds_with`), no family lists it.
    pooling: for a kind the row introduces, its one default pooling of sentences and words
            (:func:`audit.backends.hf_embed.default_method`).
    """

    name: str
    engine: str
    kind: str
    format: str | None = None
    prefix: str | None = None
    loader: str | None = None
    kind_name: str | None = None
    probe: str | None = None
    operations: tuple[str, ...] = ()
    pooling: str | None = None


#: Static word-vector formats a spec may name (``static``: the format told from the reference).
STATIC_FORMATS = ("fasttext", "fasttext-bin", "fasttext-vec", "word2vec", "word2vec-text", "text", "word2vec-bin",
                  "glove", "npy", "spacy", "gensim", "gensim-kv", "glove-6b-50d", "wefe-test-model")
#: Hugging Face backend -> model kind (the Transformers auto class: :data:`audit.backends.hf.KINDS`).
HF_KINDS = {"hf-encoder": "encoder", "hf-mlm": "mlm", "hf-causal": "causal"}

BACKENDS: dict[str, Backend] = {
    "static": Backend("static", "static", "static"),
    **{f: Backend(f, "static", "static", f) for f in STATIC_FORMATS},
    **{n: Backend(n, "hf", k) for n, k in HF_KINDS.items()},
    "sentence-transformers": Backend("sentence-transformers", "st", "sentence", prefix="st:",
                                     loader="audit.backends.st:load",
                                     kind_name="a sentence-transformers embedding model",
                                     probe="audit.backends.st:probe_revision", operations=("embed",),
                                     pooling="model"),
}
#: The engines, in the order a reference without ``backend:`` is tried: a row's ``prefix``
#: (:func:`of_prefix`: ``st:``), a static file or short name, else a Hugging Face checkpoint.
ENGINES = ("st", "static", "hf")


#: The model kinds of the built-in engines, with how messages name them; a row adds its own kind
#: (``kind_name``): :func:`model_kinds`, :func:`kind_names`.
BASE_KINDS = {"static": "static word vectors", "encoder": "an encoder without LM head", "mlm": "a masked LM",
              "causal": "a causal LM"}


def model_kinds() -> tuple[str, ...]:
    """Every model kind: the built-in engines' and those the table's rows introduce, in table order."""
    return tuple(dict.fromkeys([*BASE_KINDS, *(r.kind for r in BACKENDS.values())]))


def kind_names() -> dict[str, str]:
    """Model kind -> how messages name it ("cannot run on <a masked LM>")."""
    return {**BASE_KINDS, **{r.kind: r.kind_name for r in BACKENDS.values() if r.kind_name}}


def kinds_with(operations: Sequence[str]) -> tuple[str, ...]:
    """The kinds rows introduce whose models implement every one of ``operations`` (none for an
    empty list)."""
    if not operations:
        return ()
    want = set(operations)
    return tuple(dict.fromkeys(r.kind for r in BACKENDS.values() if r.operations and want <= set(r.operations)))


def pooling_of(kind: str) -> str | None:
    """The default pooling a row declares for its kind, ``None`` for the built-in kinds."""
    return next((r.pooling for r in BACKENDS.values() if r.kind == kind and r.pooling), None)


def register_backend(row: Backend) -> Backend:
    """Add a row (an engine module registering itself, or a plugin); a name registered twice with
    another row is a programming error."""
    old = BACKENDS.get(row.name)
    if old is not None and old != row:
        raise ValueError(f"backend {row.name!r} is registered twice")
    BACKENDS[row.name] = row
    return row


def of_prefix(ref: object) -> Backend | None:
    """The row whose ``prefix`` a reference starts with (``st:all-MiniLM-L6-v2``), or ``None``."""
    if not isinstance(ref, str):
        return None
    s = ref.strip()
    return next((r for r in BACKENDS.values() if r.prefix and s.startswith(r.prefix)), None)


def strip_prefix(ref: str, row: Backend) -> str:
    """The reference without the row's prefix."""
    s = ref.strip()
    return s[len(row.prefix):] if row.prefix and s.startswith(row.prefix) else s


def _function(row: Backend, spec: str | None, what: str):
    import importlib

    module, _, fn = (spec or "").partition(":")
    if not module or not fn:
        raise ModelError(f"backend {row.name!r} has no {what}")
    return getattr(importlib.import_module(module), fn)


def load_with(row: Backend, ref: str, **options: object) -> object:
    """Load ``ref`` with the row's ``loader`` (imported on first use)."""
    return _function(row, row.loader, "loader")(ref, **options)


def probe_with(row: Backend, ref: str) -> str | None:
    """The row's ``probe`` of ``ref`` (``None`` when the row has none)."""
    return _function(row, row.probe, "probe")(strip_prefix(ref, row)) if row.probe else None


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
