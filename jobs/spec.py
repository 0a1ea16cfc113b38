"""The sweep specification: a YAML file that describes models x languages x tests x metrics.

A spec is read with :func:`load_spec` (or :func:`parse_spec` for an already-parsed mapping) and
validated field by field: every error is an :class:`audit.errors.DataError` (malformed YAML, a
field of the wrong type, an unknown field) or :class:`audit.errors.ParameterError` (a value out of
range: unknown metric, backend or language, a negative count) whose message names the spec file and
the field path, e.g. ``smoke.yaml: models[1].backend: unknown backend 'hf-foo'``.

Fields (see ``docs/service.md`` for the full reference and examples)::

    name: smoke                       # required; letters, digits, '-', '_', '.'
    description: ...                  # optional free text
    seed: 0                           # seed of every random step (permutations, bootstraps)
    output_dir: out/smoke             # reports, MLflow store, built models (relative: to the CWD)
    tracking: {uri: null, experiment: null}   # default $MLFLOW_TRACKING_URI, else sqlite:///<output_dir>/mlflow.db;
                                      # biasaudit-<name> (--tracking-uri overrides; see jobs.uris)
    languages: [en, de]               # ISO 639-1 codes; default: every language of the models
    tests: [weat1, "de/cw*", crows_pairs]     # registered names or glob patterns; default ["*"]
    permutations: 10000               # default `permutations` of the metrics that take one
    n_bootstrap: 1000                 # default `n_bootstrap` of the metrics that take one
    metrics: [weat, {name: seat, params: {embedding: cls}, tests: [...]}]
    models:
      - ref: glove-6b-50d             # required; see docs/models.md, plus `minilm` / `pkg:<module>`
        name: glove                   # display name (default: derived from ref)
        languages: [en]               # languages the model covers (default: the spec's languages)
        backend, revision, dtype, device, allow_pickle, trust_remote_code, subword
        params: {casefold: true}      # task parameters for this model (look-up, embedding ...)
        build: {kind: fasttext, ...}  # build a tiny model on demand into <output_dir>/models/
        mitigation: {method: hard_debias, definitions: en/gender, params: {...}}   # or a list;
                                      # static models only: adds a debiased copy <name>+<method>
    ray: {address, num_cpus, object_store_memory, actor_num_cpus, actor_num_gpus,
          max_restarts, max_task_retries, batch_size, stats_num_cpus, exact_shards}
    multiple_comparisons:             # adjusted p-values in the reports (jobs.report, docs/statistics.md)
      family: [model, metric]         # the columns whose values define one family (default); [] = the sweep
      marks: holm                     # which p-value the significance marks read: holm (default), bh, raw
    tags: {team: nlp}                 # extra tags of the sweep's parent run (the watcher sets audit.watch.*)

Strings may use environment variables as ``${VAR}`` or ``${VAR:-default}`` (e.g. a data folder
that differs between a laptop and the cluster); an unset variable without default is an error
naming the field, and so is a variable that holds a secret (``HF_TOKEN``, ``*_PASSWORD`` ...)
anywhere but ``tracking.uri``.

Each entry is a typed model of :mod:`audit.schema` (the top level :class:`SpecFields`, ``models[i]``
:class:`ModelFields`, its ``build`` :class:`BuildSpec`, ``metrics[i]`` :class:`MetricFields`,
``ray`` :class:`RaySpec`, ``multiple_comparisons`` :class:`MultipleComparisons`), refused in the
vocabulary's one-line words; what is left to code are rules across entries (duplicate names) and
``mitigation`` (:func:`_mitigation`). YAML loading and variables are the shared ones of
:mod:`jobs.validators`, also used by the watch spec (:mod:`jobs.watch.spec`). ``read_yaml``,
``expand_env`` and ``default_tracking_uri`` are importable from here as before.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import (AfterValidator, BeforeValidator, Field, PlainValidator, ValidationInfo, field_validator,
                      model_validator)

from audit import registry, schema
from audit.backends import table as backend_table
from audit.errors import AuditError, DataError, ParameterError
from audit.provenance import DTYPE_NAMES
from audit.schema import Flag, Int, Num, NullDefaults, OneOf, Permutations, Refused, Section, Text, check, validate
from audit.mitigation import get_mitigation, load_definitions
from jobs.lm_spec import parse_lm_mitigation, variant_fields
from jobs.uris import default_tracking_uri, resolve_tracking_uri, tracking_uri_problem  # noqa: F401 (re-export)
from jobs.validators import (
    Ctx,
    DerivedName,
    Name,
    PlainValues,
    Strings,
    as_list,
    named,
    non_empty,
    expand_env,
    location_overrides,
    mapping,
    read_yaml,
    steps,
    suggest,
    tracking,
)

#: ISO 639-1 codes (the spec accepts any of them; a language without tests is dropped at planning).
ISO_639_1 = frozenset(
    """aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy
    da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu hy
    hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb lg li
    ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om or os pa
    pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss st su sv sw ta te tg th
    ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu""".split()
)

#: Backends a model may name: the backend table (:mod:`audit.backends.table`).
BACKENDS = backend_table.names()

#: Kinds of tiny models the spec can build on demand (``models[i].build.kind``).
BUILD_KINDS = ("fasttext", "bert", "roberta", "gpt2", "llama", "qwen2", "mistral", "instruct")
#: Build kinds that take a training ``language`` (one code; the causal kinds also a list: one
#: multilingual model).
_LANGUAGE_BUILDS = {"fasttext": False, "llama": True, "qwen2": True, "mistral": True}

#: ``models[i].mitigation[j].scope``: which words the method changes (``tests``: only the words
#: the model's tests need, e.g. for RAN, whose cost grows with the number of words debiased).
MITIGATION_SCOPES = ("all", "tests")
#: The ``build.kind`` of a debiased copy (set by the parser, not written in specs).
MITIGATION_KIND = "mitigation"
#: Columns of the results table a multiple-comparison family may group by.
FAMILY_COLUMNS = ("model", "metric", "language", "test", "params")
#: Which p-value the significance marks of the reports read.
MARKS = ("holm", "bh", "raw")
#: Fields that do not change a sweep's tasks (left out of :meth:`SweepSpec.sweep_id`).
_NOT_TASKS = ("output_dir", "tracking", "ray", "description", "multiple_comparisons", "tags")


# --------------------------------------------------------------------------------------
# Data classes
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model of a sweep.

    ref:     the reference as written in the spec (``minilm`` and ``pkg:<module>`` are resolved
             to a local path by :func:`jobs.resolve.resolve_ref` at load time; the spec's ``ref``
             is what results record as the model).
    name:    display name (unique in the spec); used in run names, tables and plots.
    options: keyword arguments of :func:`audit.runner.load_model` (backend, revision, dtype,
             device, allow_pickle, trust_remote_code, subword) that the spec set.
    params:  task parameters applied to every task of this model where the metric accepts them.
    build:   a tiny model to build before the sweep (``None`` for real models).
    tests:   test names or glob patterns this model is restricted to (``None``: every test the
             spec and metric select); e.g. a small vocabulary that covers only some tests.
    mitigation: the debiasing steps named for this (static) model; each adds a debiased copy
             right after it in :attr:`SweepSpec.models` (see :class:`MitigationStep`).
    run_tags, run_params: extra tags and params of every child run of this model (a debiased
             copy: ``audit.mitigation``, ``audit.base_model``, the method's parameters; its
             original: ``audit.mitigation=none``), so the MLflow UI can filter and compare them.
    """

    ref: str
    name: str
    languages: tuple[str, ...] | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    build: Mapping[str, Any] | None = None
    tests: tuple[str, ...] | None = None
    mitigation: tuple[MitigationStep, ...] = ()
    #: debiased variants of a language model (:mod:`jobs.lm_spec`), each added after it like ``mitigation``
    lm_mitigation: tuple[Any, ...] = ()
    run_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    run_params: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def backend(self) -> str | None:
        return self.options.get("backend")

    @property
    def mitigated_from(self) -> str | None:
        """The name of the original model when this is a debiased copy, else ``None``."""
        derived = (MITIGATION_KIND, "lm_mitigation")
        return self.build.get("base") if self.build and self.build.get("kind") in derived else None


@dataclasses.dataclass(frozen=True)
class MitigationStep:
    """One debiasing step of a static model (``models[i].mitigation`` in a spec).

    method:      registry name of :func:`audit.mitigation.get_mitigation` (aliases resolved:
                 ``hd`` -> ``hard_debias``).
    definitions: a registered definitions name (``en/gender``) or a JSON file.
    params:      constructor parameters of the method (validated when the spec is read).
    name:        the debiased copy's model name (default ``<model>+<method>``).
    scope:       ``all`` (every word of the model) or ``tests`` (only the words the model's
                 tests need: RAN on all 400k GloVe words takes about an hour).
    """

    method: str
    name: str
    definitions: str = "en/gender"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    scope: str = "all"


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """A metric of a sweep with its parameters and, optionally, its own test patterns."""

    name: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    tests: tuple[str, ...] | None = None


class RaySpec(NullDefaults):
    """How the sweep uses Ray (the ``ray:`` section; each field declared here once, validated by
    :func:`audit.schema.validate`; :mod:`jobs.pool` reads the same fields).

    address:            ``None``: an embedded local Ray (or the job's cluster inside
                        ``ray job submit``); ``auto`` or ``ray://...`` / ``host:port`` to connect.
    num_cpus:           CPUs of the embedded local Ray (``None``: all of the machine's).
    object_store_memory: bytes of the embedded local Ray's object store.
    actor_num_cpus:     CPUs each model actor reserves (fractions allowed).
    actor_num_gpus:     ``"auto"`` (1 GPU per Hugging Face model when the cluster has GPUs, else 0)
                        or a number; a fraction such as 0.25 packs four models on one GPU. Static
                        models never reserve a GPU.
    max_restarts:       how often a dead model actor is restarted (its model reloaded).
    max_task_retries:   how often a request to a dead actor is re-sent after the restart.
    batch_size:         tasks per measure request and per statistics task.
    stats_num_cpus:     CPUs each statistics task reserves.
    exact_shards:       split an exact permutation test over this many statistics tasks when it
                        has more than 10**9 partitions (1: never split).
    pending_timeout_s:  work that waits longer than this for resources, with no progress, fails
                        naming the pending demand; the sweep exits with status 4 (stuck).
    reuse_workers:      long-lived model workers serve one model after another, releasing each
                        completely (``jobs/pool.py``); ``false``: a fresh process per model.
    max_workers:        bound of that pool (``None``: as many as the cluster's CPUs/GPUs hold while
                        one statistics task can still run).
    prefetch:           Hub snapshots downloaded ahead of the workers (0: off).
    prefetch_disk_mb:   disk those prefetched snapshots may take together.
    """

    address: Text | None = None
    num_cpus: Num(0.0, strict=True) | None = None
    object_store_memory: Int(78_643_200) = 200_000_000
    actor_num_cpus: Num() = 1.0
    actor_num_gpus: float | str = "auto"
    max_restarts: Int(-1) = 3
    max_task_retries: Int(-1) = 3
    batch_size: Int(1) = 4
    stats_num_cpus: Num() = 1.0
    exact_shards: Int(1) = 1
    pending_timeout_s: Num(0.0, strict=True) = 600.0
    reuse_workers: Flag = True
    max_workers: Int(1) | None = None
    prefetch: Int(0) = 2
    prefetch_disk_mb: Num(0.0, strict=True) = 4096.0

    @field_validator("actor_num_gpus", mode="plain")
    @classmethod
    def _gpus(cls, g: Any) -> float | str:
        if g == "auto":
            return g
        g = check(Num(), g)
        if g > 1 and g != int(g):
            raise Refused(f"a model uses a fraction of one GPU or whole GPUs, got {g}")
        return g


class MultipleComparisons(NullDefaults):
    """How the reports adjust p-values for multiple comparisons (``multiple_comparisons:``).

    family: the results-table columns whose values define one family (:data:`FAMILY_COLUMNS`;
            default ``("model", "metric")``: all tests of one model and metric in the sweep;
            ``()``: the whole sweep is one family). Both Holm and Benjamini-Hochberg adjusted
            p-values are computed for every family (:mod:`audit.multitest`).
    marks:  the p-value the significance marks of LaTeX tables, heat maps and the summary read:
            ``holm`` (default), ``bh`` or ``raw`` (uncorrected).
    """

    family: Annotated[tuple[OneOf("column", FAMILY_COLUMNS), ...], Field(strict=False)] = ("model", "metric")
    marks: OneOf("marks", MARKS) = "holm"

    @field_validator("family", mode="before")
    @classmethod
    def _a_list(cls, v: Any) -> Any:
        if not isinstance(v, (list, tuple)):
            raise DataError(f"expected a list of column names, got {v!r}")
        return v

    @field_validator("family")
    @classmethod
    def _distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise Refused(f"duplicate column in {list(v)}")
        return v


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """A validated sweep specification (see the module docstring for the fields)."""

    name: str
    models: tuple[ModelSpec, ...]
    metrics: tuple[MetricSpec, ...]
    tests: tuple[str, ...] = ("*",)
    languages: tuple[str, ...] | None = None
    seed: int = 0
    permutations: int | str | None = None
    n_bootstrap: int | None = None
    output_dir: Path = Path("out")
    tracking_uri: str | None = None
    experiment: str | None = None
    ray: RaySpec = RaySpec()
    description: str = ""
    source: str = ""
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    multiple_comparisons: MultipleComparisons = MultipleComparisons()
    tags: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def resolved_tracking_uri(self) -> str:
        """The MLflow tracking URI (:func:`jobs.uris.resolve_tracking_uri`): ``--tracking-uri``
        (which replaced ``tracking_uri`` at load), else the spec's ``tracking.uri``, else
        ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<output_dir>/mlflow.db``."""
        return resolve_tracking_uri(self.tracking_uri, self.output_dir)

    @property
    def resolved_experiment(self) -> str:
        return self.experiment or f"biasaudit-{self.name}"

    def sweep_id(self) -> str:
        """A hex digest of what defines the sweep's tasks (models, tests, metrics, languages,
        seed, statistics defaults), not where it runs or writes nor how it is reported (output_dir,
        tracking, ray, description, multiple_comparisons, tags): the same spec resumes the same
        parent run wherever its output goes."""
        keep = {k: v for k, v in self.raw.items() if k not in _NOT_TASKS}
        blob = json.dumps(keep, sort_keys=True, default=str, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


# --------------------------------------------------------------------------------------
# Validation (typed models of audit.schema; shared field types from jobs.validators)
# --------------------------------------------------------------------------------------


def default_model_name(ref: str) -> str:
    """A display name from a reference: file stem, package name, or hub id without ``@rev``."""
    r = ref.split("@", 1)[0]
    for prefix in ("pkg:", "spacy:", "hf:"):
        if r.startswith(prefix):
            r = r[len(prefix):]
    if ":" in r and not r.startswith("/"):
        r = r.split(":", 1)[1]
    p = Path(r)
    name = p.name
    for suf in (".gz", ".bin", ".vec", ".txt", ".npy", ".kv", ".model"):
        if name.endswith(suf):
            name = name[: -len(suf)]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", name).strip("-.") or "model"
    return name


def _iso_639_1(lang: str) -> str:
    if lang not in ISO_639_1:
        raise Refused(f"unknown language {lang!r}{suggest(lang, ISO_639_1)}; use an ISO 639-1 code such as en, de, fr")
    return lang


def _distinct(langs: tuple[str, ...]) -> tuple[str, ...]:
    if len(set(langs)) != len(langs):
        raise Refused(f"duplicate language in {list(langs)}")
    return langs


#: ISO 639-1 codes (a single code is a list of one), none twice.
Languages = Annotated[tuple[Annotated[Text, AfterValidator(_iso_639_1)], ...], BeforeValidator(as_list),
                      Field(strict=False), AfterValidator(_distinct)]


def _known_backend(b: str) -> str:
    if b not in BACKENDS:
        raise Refused(f"unknown backend {b!r}{suggest(b, BACKENDS)}; known backends: {', '.join(BACKENDS)}")
    return b


def _known_metric(name: str) -> str:
    known = registry.names()
    if name not in known:
        raise Refused(f"unknown metric {name!r}{suggest(name, known)}; known metrics: {', '.join(known)}")
    return name


def _as_text(v: Any) -> Any:
    """A revision or a device written as a number (``revision: 2``, ``device: 0``) is its text."""
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


#: A revision or a device: a non-empty string (a number is read as its text).
Label = Annotated[Text, BeforeValidator(_as_text)]


class BuildSpec(Section):
    """``models[i].build``: a tiny model built on demand into ``<output_dir>/models/``
    (:mod:`jobs.builders`). ``kind`` one of :data:`BUILD_KINDS`; ``dim``, ``epoch`` >= 1; ``seed``
    >= 0; ``language``: the training language of fastText (one code) and the causal kinds (a code
    or a list: one multilingual model)."""

    kind: OneOf("kind", BUILD_KINDS)
    dim: Int(1) = None
    epoch: Int(1) = None
    seed: Int(0) = None
    language: Languages = None

    @field_validator("language", mode="before")
    @classmethod
    def _training_language(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is not None and kind not in _LANGUAGE_BUILDS:
            raise Refused("a training language applies to fastText, llama, qwen2 and mistral builds only")
        if kind is not None and isinstance(v, (list, tuple)) and not _LANGUAGE_BUILDS[kind]:
            raise Refused("a fastText build takes one language")
        return v


class ModelFields(Section):
    """The fields of one ``models[i]`` entry (see :class:`ModelSpec` for what each becomes; a
    string is ``{ref: <string>}``). ``mitigation`` is checked by :func:`_mitigation`."""

    build: BuildSpec | None = None
    ref: Text = None
    name: Name = None
    backend: Annotated[Text, AfterValidator(_known_backend)] | None = None
    revision: Label | None = None
    device: Label | None = None
    dtype: OneOf("dtype", DTYPE_NAMES) | None = None
    device_map: Any = None
    allow_pickle: Flag = None
    trust_remote_code: Flag = None
    subword: Flag = None
    languages: Languages | None = None
    tests: Strings | None = None
    mitigation: Any = None
    lm_mitigation: Any = None
    params: PlainValues | None = None

    @field_validator("revision")
    @classmethod
    def _hub_only(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v and backend_table.kind_of_backend(info.data.get("backend")) == "static":
            raise Refused("a revision applies to Hugging Face checkpoints only (static models are identified by "
                          "their content digest)")
        return v

    @field_validator("device_map", mode="plain")
    @classmethod
    def _device_map(cls, v: Any) -> Any:  # models larger than one GPU (needs accelerate): docs/causal.md
        if v is None or isinstance(v, str):
            return v if v is None else check(Text, v)
        if isinstance(v, Mapping):
            return {str(k): x for k, x in v.items()}
        raise Refused(f"expected 'auto', 'balanced', ... or a mapping module -> device, got {v!r}")

    @model_validator(mode="after")
    def _a_ref(self) -> ModelFields:
        if self.ref is None and self.build is None:
            raise DataError("missing required field 'ref'")
        if self.ref is None and self.name is None:
            raise DataError("a model with 'build' and no 'ref' needs a 'name'")
        return self


def _known_method(name: str) -> str:
    try:
        return get_mitigation(name).name
    except AuditError as e:
        raise Refused(str(e)) from None


class MitigationFields(NullDefaults):
    """One step of ``models[i].mitigation`` (see :class:`MitigationStep`; a string is
    ``{method: <string>}``); ``params`` are then checked against the method's own model
    (:attr:`audit.mitigation.Mitigation.Params`) by :func:`_mitigation`."""

    method: Annotated[Text, AfterValidator(_known_method)]
    definitions: Text = "en/gender"
    params: PlainValues | None = None
    name: DerivedName | None = None
    scope: OneOf("scope", MITIGATION_SCOPES) = "all"


class MetricFields(Section):
    """One ``metrics[i]`` entry (a string is ``{name: <string>}``); its parameters are checked
    against the metric's own model (:func:`audit.registry.check_params`) by :func:`_metric`."""

    name: Annotated[Text, AfterValidator(_known_metric)]
    params: PlainValues | None = None
    tests: Strings | None = None


def _tag_name(k: str) -> str:
    if k.startswith("audit.") and k != "audit.watch" and not k.startswith("audit.watch."):
        raise Refused("tags starting with 'audit.' are set by biasaudit")
    return k


def _tag_value(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, (str, int, float)):
        raise DataError(f"expected a string or a number, got {x!r}")
    return str(x)


#: ``tags:``: extra tags of the sweep's parent run, name -> a string or a number (kept as its
#: text); names starting with ``audit.`` are biasaudit's, but for ``audit.watch.*`` (the watcher's).
Tags = dict[Annotated[str, AfterValidator(_tag_name)], Annotated[Any, PlainValidator(_tag_value)]]


class SpecFields(Section):
    """The top level of a sweep spec (the module docstring lists the fields): ``ray``
    :class:`RaySpec`, ``multiple_comparisons`` :class:`MultipleComparisons`, ``tags`` :data:`Tags`;
    ``tracking`` is read by :func:`jobs.validators.tracking`."""

    name: Name
    description: Annotated[str, Field(strict=True)] | None = None
    seed: Int(0) | None = None
    output_dir: Text | None = None
    tracking: Any = None
    models: Annotated[tuple[Annotated[ModelFields, named("ref")], ...], non_empty("models"), Field(strict=False)]
    metrics: Annotated[tuple[Annotated[MetricFields, named("name")], ...], non_empty("metrics"),
                       Field(strict=False)]
    tests: Strings | None = None
    languages: Languages | None = None
    permutations: Permutations | None = None
    n_bootstrap: Int(0) | None = None
    ray: RaySpec | None = None
    multiple_comparisons: MultipleComparisons | None = None
    tags: Tags | None = None


def _model(ctx: Ctx, i: int, f: ModelFields, raw: Any) -> ModelSpec:
    """``models[i]`` (validated as ``f``; ``raw`` as written) as a :class:`ModelSpec`."""
    path = f"models[{i}]"
    build = dict(raw["build"]) if f.build is not None else None
    ref = f.ref or f"built:{f.name}"  # a built model without ref: its ref is the built file, named after the model
    name = check(Name, f.name or default_model_name(ref), ctx.source, f"{path}.name")
    options = {k: getattr(f, k) for k in ("backend", "revision", "device", "dtype", "device_map", "allow_pickle",
                                          "trust_remote_code", "subword") if getattr(f, k) is not None}
    mit_steps: tuple[MitigationStep, ...] = ()
    if f.mitigation is not None:
        mit_steps = _mitigation(ctx, f"{path}.mitigation", f.mitigation, name)
        not_static = backend_table.kind_of_backend(options.get("backend")) not in (None, "static")
        if not_static or (build is not None and build["kind"] != "fasttext"):
            what = options.get("backend") or f"build kind {build['kind']}"  # type: ignore[index]
            raise ctx.param(f"{path}.mitigation", f"model {name!r} is not static word vectors ({what}); "
                            "debiasing applies to static embeddings only")
    lm_steps = ()
    if f.lm_mitigation is not None:
        lm_steps = parse_lm_mitigation(ctx, f"{path}.lm_mitigation", f.lm_mitigation, name)
    return ModelSpec(
        ref=ref, name=name, languages=f.languages, options=options,
        params=dict(f.params or {}), build=build, tests=f.tests, mitigation=mit_steps, lm_mitigation=lm_steps,
    )


def _mitigation(ctx: Ctx, path: str, v: Any, model_name: str) -> tuple[MitigationStep, ...]:
    """``models[i].mitigation``: one step (a mapping or a method name) or a list of steps, each a
    :class:`MitigationFields`; its ``params`` validated against the method's own
    :attr:`audit.mitigation.Mitigation.Params` and its definitions loaded
    (:func:`audit.mitigation.load_definitions`) before anything runs."""
    out = []
    for p, f in steps(ctx, path, v, MitigationFields, "method", "a mitigation step"):
        params = dict(f.params or {})
        method = get_mitigation(f.method)
        validate(type(method).Params, params, ctx.source, f"{p}.params")
        try:
            load_definitions(f.definitions)
        except AuditError as e:
            raise ctx.param(f"{p}.definitions", str(e)) from None
        out.append(MitigationStep(method=method.name, name=f.name or f"{model_name}+{method.name}",
                                  definitions=f.definitions, params=params, scope=f.scope))
    return tuple(out)


def mitigated_model(base: ModelSpec, step: MitigationStep) -> ModelSpec:
    """The model spec of a debiased copy of ``base``: built by :mod:`jobs.builders` into
    ``<output_dir>/models/<step.name>/`` (reference ``built:<step.name>``), with the original's
    languages, task parameters and tests, and the tags that link it to the original."""
    build = {"kind": MITIGATION_KIND, "base": base.name, "method": step.method, "definitions": step.definitions,
             "params": dict(step.params), "scope": step.scope}
    tags = {"audit.mitigation": step.method, "audit.base_model": base.name,
            "audit.mitigation.definitions": step.definitions, "audit.mitigation.scope": step.scope}
    params = {"mitigation": step.method, "base_model": base.name, "mitigation.definitions": step.definitions,
              "mitigation.scope": step.scope}
    for k, x in sorted(step.params.items()):
        val = json.dumps(x, sort_keys=True)
        tags[f"audit.mitigation.param.{k}"] = val
        params[f"mitigation.param.{k}"] = val
    return ModelSpec(ref=f"built:{step.name}", name=step.name, languages=base.languages, options={},
                     params=dict(base.params), build=build, tests=base.tests, run_tags=tags, run_params=params)


def _expand_mitigation(models: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
    """Each model followed by its debiased copies; the original gets ``audit.mitigation=none``."""
    out: list[ModelSpec] = []
    for m in models:
        if not m.mitigation and not m.lm_mitigation:
            out.append(m)
            continue
        if m.lm_mitigation:
            tags = {"audit.lm_mitigation": "none", "audit.base_model": m.name, **m.run_tags}
            params = {"lm_mitigation": "none", "base_model": m.name, **m.run_params}
            out.append(dataclasses.replace(m, run_tags=tags, run_params=params))
            out.extend(ModelSpec(**variant_fields(m, s)) for s in m.lm_mitigation)
            continue
        tags = {"audit.mitigation": "none", "audit.base_model": m.name, **m.run_tags}
        params = {"mitigation": "none", "base_model": m.name, **m.run_params}
        out.append(dataclasses.replace(m, run_tags=tags, run_params=params))
        out.extend(mitigated_model(m, s) for s in m.mitigation)
    return tuple(out)


def _metric(ctx: Ctx, i: int, f: MetricFields) -> MetricSpec:
    """``metrics[i]`` (validated as ``f``): its parameters checked as the metric's model words it."""
    path = f"metrics[{i}]"
    name, params = f.name, dict(f.params or {})
    if "seed" in params:
        raise ctx.param(f"{path}.params.seed", "set the seed once at the top of the spec (`seed:`)")
    if "permutations" in params:
        check(Permutations, params["permutations"], ctx.source, f"{path}.params.permutations")
    bad = [k for k in params if k not in registry.accepted_params(name)]
    if bad:
        raise ctx.param(f"{path}.params.{bad[0]}", f"metric {name!r} takes no parameter {bad[0]!r}")
    for k, v in params.items():
        try:
            registry.check_params(name, {k: v})
        except ParameterError as e:
            raise ctx.param(f"{path}.params.{k}", schema.unnamed(str(e), k)) from None
    return MetricSpec(name=name, params=params, tests=f.tests)


def parse_spec(data: Any, source: str = "", *, base_dir: Path | None = None) -> SweepSpec:
    """Validate a parsed spec mapping and return a :class:`SweepSpec`.

    source:   the file name used in error messages.
    base_dir: unused for paths (relative paths are relative to the current directory, which is
              the working directory of a ``ray job submit`` job); kept for callers that want to
              anchor ``output_dir`` elsewhere.
    """
    ctx = Ctx(source)
    if data is None:
        raise ctx.data("", "the spec is empty")
    d = mapping(ctx, "", expand_env(data, source))
    f = validate(SpecFields, d, ctx.source)
    name = f.name
    models = tuple(_model(ctx, i, m, d["models"][i]) for i, m in enumerate(f.models))
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        if m.name in seen:
            raise ctx.param(f"models[{i}].name", f"duplicate model name {m.name!r} (also models[{seen[m.name]}]); give one a distinct `name:`")
        seen[m.name] = i
    for i, m in enumerate(models):
        for j, st in enumerate(m.mitigation):
            if st.name in seen:
                other = seen[st.name]
                where = f"models[{other}]" if isinstance(other, int) else other
                raise ctx.param(f"models[{i}].mitigation[{j}].name" if len(m.mitigation) > 1 else f"models[{i}].mitigation",
                                f"duplicate model name {st.name!r} (also {where}); give the step a distinct `name:`")
            seen[st.name] = f"models[{i}].mitigation[{j}]"  # type: ignore[assignment]
        for j, st in enumerate(m.lm_mitigation):
            if st.name in seen:
                raise ctx.param(f"models[{i}].lm_mitigation[{j}].name",
                                f"duplicate model name {st.name!r}; give the step a distinct `name:`")
            seen[st.name] = f"models[{i}].lm_mitigation[{j}]"  # type: ignore[assignment]
    models = _expand_mitigation(models)
    metrics = tuple(_metric(ctx, i, m) for i, m in enumerate(f.metrics))
    mseen: dict[tuple, int] = {}
    for i, m in enumerate(metrics):
        k = (m.name, json.dumps(dict(m.params), sort_keys=True), m.tests)
        if k in mseen:
            raise ctx.param(f"metrics[{i}]", f"same metric and parameters as metrics[{mseen[k]}]")
        mseen[k] = i
    out = Path(f.output_dir) if f.output_dir is not None else Path("out") / name
    if base_dir is not None and not out.is_absolute():
        out = base_dir / out
    uri = experiment = None
    if f.tracking is not None:
        t = tracking(ctx, f.tracking)
        uri, experiment = t.uri, t.experiment
    return SweepSpec(
        name=name, models=models, metrics=metrics, tests=f.tests or ("*",), languages=f.languages,
        seed=f.seed if f.seed is not None else 0, permutations=f.permutations, n_bootstrap=f.n_bootstrap,
        output_dir=out, tracking_uri=uri, experiment=experiment, ray=f.ray or RaySpec(),
        description=f.description or "", source=source, raw=copy.deepcopy(d),
        multiple_comparisons=f.multiple_comparisons or MultipleComparisons(), tags=dict(f.tags or {}),
    )


#: The specs shipped with the package (``jobs/specs/*.yaml``, package data of the wheel).
PACKAGED_SPECS = Path(__file__).resolve().parent / "specs"


def find_spec_file(path: str | Path) -> Path:
    """The spec file ``path`` names: the file itself when it exists, else a packaged spec of that
    name (``smoke``, ``smoke.yaml`` or ``jobs/specs/smoke.yaml`` from any working directory, also
    from an installed wheel), else the path as given (reading it then names it as missing)."""
    p = Path(path)
    if p.exists():
        return p
    for name in (p.name, p.name + ".yaml"):
        packaged = PACKAGED_SPECS / name
        if packaged.is_file() and (p.parent == Path(".") or p.parent.parts[-2:] == ("jobs", "specs")):
            return packaged
    return p


def load_spec(path: str | Path, *, output_dir: str | Path | None = None, tracking_uri: str | None = None) -> SweepSpec:
    """Read and validate a spec file (:func:`find_spec_file`: a path, or a packaged spec's name);
    ``output_dir``/``tracking_uri`` (the command line's ``--output-dir``/``--tracking-uri``)
    override the spec's."""
    p = find_spec_file(path)
    spec = parse_spec(read_yaml(p), source=str(p))
    changes: dict[str, Any] = location_overrides(output_dir, tracking_uri)
    return dataclasses.replace(spec, **changes) if changes else spec
