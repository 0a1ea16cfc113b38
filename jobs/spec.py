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

The checks themselves (YAML loading, variables, typed fields, suggestions) are the shared ones of
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
from typing import Any, Mapping

from audit import registry
from audit.backends import table as backend_table
from audit.errors import AuditError, ParameterError
from audit.mitigation import get_mitigation, load_definitions
from jobs.lm_spec import parse_lm_mitigation, variant_fields
from jobs.uris import default_tracking_uri, resolve_tracking_uri, tracking_uri_problem  # noqa: F401 (re-export)
from jobs.validators import (
    NAME_RE,
    Ctx,
    boolean,
    check_fields,
    expand_env,
    integer,
    location_overrides,
    mapping,
    number,
    plain_values,
    read_yaml,
    str_list,
    string,
    suggest,
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
BUILD_KINDS = ("fasttext", "bert", "roberta", "gpt2", "llama", "qwen2", "mistral")
#: Build kinds that take a training ``language`` (one code; the causal kinds also a list: one
#: multilingual model).
_LANGUAGE_BUILDS = {"fasttext": False, "llama": True, "qwen2": True, "mistral": True}

_TOP_FIELDS = {
    "name", "description", "seed", "output_dir", "tracking", "languages", "tests", "permutations",
    "n_bootstrap", "metrics", "models", "ray", "multiple_comparisons", "tags",
}
_MODEL_FIELDS = {
    "ref", "name", "languages", "backend", "revision", "dtype", "device", "device_map", "allow_pickle",
    "trust_remote_code", "subword", "params", "build", "tests", "mitigation", "lm_mitigation",
}
_MITIGATION_FIELDS = {"method", "definitions", "params", "name", "scope"}
#: ``models[i].mitigation[j].scope``: which words the method changes (``tests``: only the words
#: the model's tests need, e.g. for RAN, whose cost grows with the number of words debiased).
MITIGATION_SCOPES = ("all", "tests")
#: The ``build.kind`` of a debiased copy (set by the parser, not written in specs).
MITIGATION_KIND = "mitigation"
_DERIVED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-+]*$")
_METRIC_FIELDS = {"name", "params", "tests"}
_TRACKING_FIELDS = {"uri", "experiment"}
_RAY_FIELDS = {
    "address", "num_cpus", "object_store_memory", "actor_num_cpus", "actor_num_gpus",
    "max_restarts", "max_task_retries", "batch_size", "stats_num_cpus", "exact_shards",
    "pending_timeout_s", "reuse_workers", "max_workers", "prefetch", "prefetch_disk_mb",
}
_BUILD_FIELDS = {"kind", "dim", "epoch", "language", "seed"}
_MC_FIELDS = {"family", "marks"}
#: Columns of the results table a multiple-comparison family may group by.
FAMILY_COLUMNS = ("model", "metric", "language", "test", "params")
#: Which p-value the significance marks of the reports read.
MARKS = ("holm", "bh", "raw")
#: Fields that do not change a sweep's tasks (left out of :meth:`SweepSpec.sweep_id`).
_NOT_TASKS = ("output_dir", "tracking", "ray", "description", "multiple_comparisons", "tags")
_DTYPES = ("float32", "float16", "bfloat16", "auto")


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


@dataclasses.dataclass(frozen=True)
class RaySpec:
    """How the sweep uses Ray.

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

    address: str | None = None
    num_cpus: float | None = None
    object_store_memory: int = 200_000_000
    actor_num_cpus: float = 1.0
    actor_num_gpus: float | str = "auto"
    max_restarts: int = 3
    max_task_retries: int = 3
    batch_size: int = 4
    stats_num_cpus: float = 1.0
    exact_shards: int = 1
    pending_timeout_s: float = 600.0
    reuse_workers: bool = True
    max_workers: int | None = None
    prefetch: int = 2
    prefetch_disk_mb: float = 4096.0


@dataclasses.dataclass(frozen=True)
class MultipleComparisons:
    """How the reports adjust p-values for multiple comparisons (``multiple_comparisons:``).

    family: the results-table columns whose values define one family (:data:`FAMILY_COLUMNS`;
            default ``("model", "metric")``: all tests of one model and metric in the sweep;
            ``()``: the whole sweep is one family). Both Holm and Benjamini-Hochberg adjusted
            p-values are computed for every family (:mod:`audit.multitest`).
    marks:  the p-value the significance marks of LaTeX tables, heat maps and the summary read:
            ``holm`` (default), ``bh`` or ``raw`` (uncorrected).
    """

    family: tuple[str, ...] = ("model", "metric")
    marks: str = "holm"


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
# Validation (the typed checkers are the shared ones of jobs.validators)
# --------------------------------------------------------------------------------------


def _languages(ctx: Ctx, path: str, v: Any) -> tuple[str, ...]:
    langs = str_list(ctx, path, v)
    for i, lang in enumerate(langs):
        if lang not in ISO_639_1:
            raise ctx.param(f"{path}[{i}]", f"unknown language {lang!r}{suggest(lang, ISO_639_1)}; use an ISO 639-1 code such as en, de, fr")
    if len(set(langs)) != len(langs):
        raise ctx.param(path, f"duplicate language in {list(langs)}")
    return langs


def _permutations(ctx: Ctx, path: str, v: Any) -> int | str:
    if isinstance(v, str):
        if v not in ("exact", "auto"):
            raise ctx.param(path, f"expected exact, auto or a positive integer, got {v!r}")
        return v
    return integer(ctx, path, v, minimum=1)


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


def _model(ctx: Ctx, i: int, v: Any) -> ModelSpec:
    path = f"models[{i}]"
    if isinstance(v, str):
        v = {"ref": v}
    d = mapping(ctx, path, v)
    check_fields(ctx, path, d, _MODEL_FIELDS)
    build = None
    if d.get("build") is not None:
        build = mapping(ctx, f"{path}.build", d["build"])
        check_fields(ctx, f"{path}.build", build, _BUILD_FIELDS)
        kind = string(ctx, f"{path}.build.kind", build.get("kind"))
        if kind not in BUILD_KINDS:
            raise ctx.param(f"{path}.build.kind", f"unknown kind {kind!r}{suggest(kind, BUILD_KINDS)}; known: {', '.join(BUILD_KINDS)}")
        for k in ("dim", "epoch"):
            if k in build:
                integer(ctx, f"{path}.build.{k}", build[k], minimum=1)
        if "seed" in build:
            integer(ctx, f"{path}.build.seed", build["seed"], minimum=0)
        if "language" in build:
            if kind not in _LANGUAGE_BUILDS:
                raise ctx.param(f"{path}.build.language", "a training language applies to fastText, llama, qwen2 "
                                                          "and mistral builds only")
            many = isinstance(build["language"], (list, tuple))
            if many and not _LANGUAGE_BUILDS[kind]:
                raise ctx.param(f"{path}.build.language", "a fastText build takes one language")
            _languages(ctx, f"{path}.build.language", list(build["language"]) if many else [build["language"]])
    if "ref" not in d and build is None:
        raise ctx.data(path, "missing required field 'ref'")
    ref = string(ctx, f"{path}.ref", d["ref"]) if "ref" in d else None
    name = string(ctx, f"{path}.name", d["name"]) if "name" in d else None
    if ref is None:  # a built model: its ref is the built file, named after the model
        if name is None:
            raise ctx.data(path, "a model with 'build' and no 'ref' needs a 'name'")
        ref = f"built:{name}"
    name = name or default_model_name(ref)
    if not NAME_RE.match(name):
        raise ctx.param(f"{path}.name", f"{name!r}: use letters, digits, '-', '_' and '.' only")
    options: dict[str, Any] = {}
    if d.get("backend") is not None:
        b = string(ctx, f"{path}.backend", d["backend"])
        if b not in BACKENDS:
            raise ctx.param(f"{path}.backend", f"unknown backend {b!r}{suggest(b, BACKENDS)}; known backends: {', '.join(BACKENDS)}")
        options["backend"] = b
    for k in ("revision", "device"):
        if d.get(k) is not None:
            options[k] = string(ctx, f"{path}.{k}", str(d[k]) if isinstance(d[k], (int, float)) and not isinstance(d[k], bool) else d[k])
    if d.get("dtype") is not None:
        dt = string(ctx, f"{path}.dtype", d["dtype"])
        if dt not in _DTYPES:
            raise ctx.param(f"{path}.dtype", f"unknown dtype {dt!r}; known: {', '.join(_DTYPES)}")
        options["dtype"] = dt
    if d.get("device_map") is not None:  # models larger than one GPU (needs accelerate): docs/causal.md
        dm = d["device_map"]
        if isinstance(dm, str):
            dm = string(ctx, f"{path}.device_map", dm)
        elif isinstance(dm, dict):
            dm = {str(k): v for k, v in dm.items()}
        else:
            raise ctx.param(f"{path}.device_map", f"expected 'auto', 'balanced', ... or a mapping module -> device, got {dm!r}")
        options["device_map"] = dm
    for k in ("allow_pickle", "trust_remote_code", "subword"):
        if k in d:
            options[k] = boolean(ctx, f"{path}.{k}", d[k])
    if options.get("revision") and backend_table.kind_of_backend(options.get("backend")) == "static":
        raise ctx.param(f"{path}.revision", "a revision applies to Hugging Face checkpoints only (static models are identified by their content digest)")
    langs = _languages(ctx, f"{path}.languages", d["languages"]) if d.get("languages") is not None else None
    tests = str_list(ctx, f"{path}.tests", d["tests"]) if d.get("tests") is not None else None
    steps: tuple[MitigationStep, ...] = ()
    if d.get("mitigation") is not None:
        steps = _mitigation(ctx, f"{path}.mitigation", d["mitigation"], name)
        not_static = backend_table.kind_of_backend(options.get("backend")) not in (None, "static")
        if not_static or (build is not None and build["kind"] != "fasttext"):
            what = options.get("backend") or f"build kind {build['kind']}"  # type: ignore[index]
            raise ctx.param(f"{path}.mitigation", f"model {name!r} is not static word vectors ({what}); "
                            "debiasing applies to static embeddings only")
    lm_steps = ()
    if d.get("lm_mitigation") is not None:
        lm_steps = parse_lm_mitigation(ctx, f"{path}.lm_mitigation", d["lm_mitigation"], name,
                                       name_re=_DERIVED_NAME_RE)
    return ModelSpec(
        ref=ref, name=name, languages=langs, options=options,
        params=plain_values(ctx, f"{path}.params", d.get("params")), build=build, tests=tests, mitigation=steps,
        lm_mitigation=lm_steps,
    )


def _mitigation(ctx: Ctx, path: str, v: Any, model_name: str) -> tuple[MitigationStep, ...]:
    """``models[i].mitigation``: one step (a mapping or a method name) or a list of steps.

    Each step is checked here, before anything runs: the method and its parameters through
    :func:`audit.mitigation.get_mitigation` and ``set_params`` (their own validation), the
    definitions through :func:`audit.mitigation.load_definitions`.
    """
    items = v if isinstance(v, list) else [v]
    if not items:
        raise ctx.data(path, "expected a mitigation step or a non-empty list of steps")
    steps = []
    for j, item in enumerate(items):
        p = f"{path}[{j}]" if isinstance(v, list) else path
        if isinstance(item, str):
            item = {"method": item}
        d = mapping(ctx, p, item)
        check_fields(ctx, p, d, _MITIGATION_FIELDS)
        if "method" not in d:
            raise ctx.data(p, "missing required field 'method'")
        method_name = string(ctx, f"{p}.method", d["method"])
        params = plain_values(ctx, f"{p}.params", d.get("params"))
        try:
            method = get_mitigation(method_name)
        except AuditError as e:
            raise ctx.param(f"{p}.method", str(e)) from None
        try:
            method.set_params(**params)
        except AuditError as e:
            raise ctx.param(f"{p}.params", str(e)) from None
        defs = string(ctx, f"{p}.definitions", d["definitions"]) if d.get("definitions") is not None else "en/gender"
        try:
            load_definitions(defs)
        except AuditError as e:
            raise ctx.param(f"{p}.definitions", str(e)) from None
        scope = string(ctx, f"{p}.scope", d["scope"]) if d.get("scope") is not None else "all"
        if scope not in MITIGATION_SCOPES:
            raise ctx.param(f"{p}.scope", f"unknown scope {scope!r}; known: {', '.join(MITIGATION_SCOPES)}")
        name = string(ctx, f"{p}.name", d["name"]) if d.get("name") is not None else f"{model_name}+{method.name}"
        if not _DERIVED_NAME_RE.match(name):
            raise ctx.param(f"{p}.name", f"{name!r}: use letters, digits, '-', '_', '.' and '+' only")
        steps.append(MitigationStep(method=method.name, name=name, definitions=defs, params=params, scope=scope))
    return tuple(steps)


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


def _metric(ctx: Ctx, i: int, v: Any, known: tuple[str, ...]) -> MetricSpec:
    path = f"metrics[{i}]"
    if isinstance(v, str):
        v = {"name": v}
    d = mapping(ctx, path, v)
    check_fields(ctx, path, d, _METRIC_FIELDS)
    if "name" not in d:
        raise ctx.data(path, "missing required field 'name'")
    name = string(ctx, f"{path}.name", d["name"])
    if name not in known:
        raise ctx.param(f"{path}.name", f"unknown metric {name!r}{suggest(name, known)}; known metrics: {', '.join(known)}")
    params = plain_values(ctx, f"{path}.params", d.get("params"))
    if "seed" in params:
        raise ctx.param(f"{path}.params.seed", "set the seed once at the top of the spec (`seed:`)")
    if "permutations" in params:
        _permutations(ctx, f"{path}.params.permutations", params["permutations"])
    bad = [k for k in params if k not in registry.accepted_params(name)]
    if bad:
        raise ctx.param(f"{path}.params.{bad[0]}", f"metric {name!r} takes no parameter {bad[0]!r}")
    for k, v in params.items():
        try:
            registry.check_params(name, {k: v})
        except ParameterError as e:
            raise ctx.param(f"{path}.params.{k}", str(e)) from None
    tests = str_list(ctx, f"{path}.tests", d["tests"]) if d.get("tests") is not None else None
    return MetricSpec(name=name, params=params, tests=tests)


def _ray(ctx: Ctx, v: Any) -> RaySpec:
    if v is None:
        return RaySpec()
    d = mapping(ctx, "ray", v)
    check_fields(ctx, "ray", d, _RAY_FIELDS)
    kw: dict[str, Any] = {}
    if d.get("address") is not None:
        kw["address"] = string(ctx, "ray.address", d["address"])
    if d.get("num_cpus") is not None:
        kw["num_cpus"] = number(ctx, "ray.num_cpus", d["num_cpus"], strict=True)
    if d.get("object_store_memory") is not None:
        kw["object_store_memory"] = integer(ctx, "ray.object_store_memory", d["object_store_memory"], minimum=78_643_200)
    if d.get("actor_num_cpus") is not None:
        kw["actor_num_cpus"] = number(ctx, "ray.actor_num_cpus", d["actor_num_cpus"])
    if d.get("stats_num_cpus") is not None:
        kw["stats_num_cpus"] = number(ctx, "ray.stats_num_cpus", d["stats_num_cpus"])
    if d.get("actor_num_gpus") is not None:
        g = d["actor_num_gpus"]
        if g != "auto":
            g = number(ctx, "ray.actor_num_gpus", g)
            if g > 1 and g != int(g):
                raise ctx.param("ray.actor_num_gpus", f"a model uses a fraction of one GPU or whole GPUs, got {g}")
        kw["actor_num_gpus"] = g
    for k, lo in (("max_restarts", -1), ("max_task_retries", -1), ("batch_size", 1), ("exact_shards", 1),
                  ("max_workers", 1), ("prefetch", 0)):
        if d.get(k) is not None:
            kw[k] = integer(ctx, f"ray.{k}", d[k], minimum=lo)
    for k in ("pending_timeout_s", "prefetch_disk_mb"):
        if d.get(k) is not None:
            kw[k] = number(ctx, f"ray.{k}", d[k], strict=True)
    if d.get("reuse_workers") is not None:
        kw["reuse_workers"] = boolean(ctx, "ray.reuse_workers", d["reuse_workers"])
    return RaySpec(**kw)


def _multiple_comparisons(ctx: Ctx, v: Any) -> MultipleComparisons:
    d = mapping(ctx, "multiple_comparisons", v, _MC_FIELDS)
    family: tuple[str, ...] = MultipleComparisons.family
    if d.get("family") is not None:
        if not isinstance(d["family"], list):
            raise ctx.data("multiple_comparisons.family", f"expected a list of column names, got {d['family']!r}")
        family = tuple(string(ctx, f"multiple_comparisons.family[{i}]", c) for i, c in enumerate(d["family"]))
        for i, c in enumerate(family):
            if c not in FAMILY_COLUMNS:
                raise ctx.param(f"multiple_comparisons.family[{i}]", f"unknown column {c!r}{suggest(c, FAMILY_COLUMNS)}; "
                                f"known: {', '.join(FAMILY_COLUMNS)}")
        if len(set(family)) != len(family):
            raise ctx.param("multiple_comparisons.family", f"duplicate column in {list(family)}")
    marks = string(ctx, "multiple_comparisons.marks", d["marks"]) if d.get("marks") is not None else "holm"
    if marks not in MARKS:
        raise ctx.param("multiple_comparisons.marks", f"unknown marks {marks!r}{suggest(marks, MARKS)}; "
                        f"known: {', '.join(MARKS)}")
    return MultipleComparisons(family=family, marks=marks)


def _tags(ctx: Ctx, v: Any) -> dict[str, str]:
    d = mapping(ctx, "tags", v)
    out = {}
    for k, x in d.items():
        if isinstance(x, bool) or not isinstance(x, (str, int, float)):
            raise ctx.data(f"tags.{k}", f"expected a string or a number, got {x!r}")
        if k.startswith("audit.") and k != "audit.watch" and not k.startswith("audit.watch."):
            raise ctx.param(f"tags.{k}", "tags starting with 'audit.' are set by biasaudit")
        out[k] = str(x)
    return out


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
    check_fields(ctx, "", d, _TOP_FIELDS)
    if "name" not in d:
        raise ctx.data("name", "missing required field")
    name = string(ctx, "name", d["name"])
    if not NAME_RE.match(name):
        raise ctx.param("name", f"{name!r}: use letters, digits, '-', '_' and '.' only")
    if "models" not in d:
        raise ctx.data("models", "missing required field")
    if not isinstance(d["models"], list) or not d["models"]:
        raise ctx.data("models", f"expected a non-empty list of models, got {d['models']!r}")
    models = tuple(_model(ctx, i, m) for i, m in enumerate(d["models"]))
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
    if "metrics" not in d:
        raise ctx.data("metrics", "missing required field")
    if not isinstance(d["metrics"], list) or not d["metrics"]:
        raise ctx.data("metrics", f"expected a non-empty list of metrics, got {d['metrics']!r}")
    metrics = tuple(_metric(ctx, i, m, registry.names()) for i, m in enumerate(d["metrics"]))
    mseen: dict[tuple, int] = {}
    for i, m in enumerate(metrics):
        k = (m.name, json.dumps(dict(m.params), sort_keys=True), m.tests)
        if k in mseen:
            raise ctx.param(f"metrics[{i}]", f"same metric and parameters as metrics[{mseen[k]}]")
        mseen[k] = i
    tests = str_list(ctx, "tests", d["tests"]) if d.get("tests") is not None else ("*",)
    languages = _languages(ctx, "languages", d["languages"]) if d.get("languages") is not None else None
    seed = integer(ctx, "seed", d["seed"], minimum=0) if d.get("seed") is not None else 0
    perms = _permutations(ctx, "permutations", d["permutations"]) if d.get("permutations") is not None else None
    nboot = integer(ctx, "n_bootstrap", d["n_bootstrap"], minimum=0) if d.get("n_bootstrap") is not None else None
    out = Path(string(ctx, "output_dir", d["output_dir"])) if d.get("output_dir") is not None else Path("out") / name
    if base_dir is not None and not out.is_absolute():
        out = base_dir / out
    uri = experiment = None
    if d.get("tracking") is not None:
        t = mapping(ctx, "tracking", d["tracking"])
        check_fields(ctx, "tracking", t, _TRACKING_FIELDS)
        uri = string(ctx, "tracking.uri", t.get("uri"), allow_none=True)
        experiment = string(ctx, "tracking.experiment", t.get("experiment"), allow_none=True)
        if uri and tracking_uri_problem(uri):
            raise ctx.param("tracking.uri", tracking_uri_problem(uri))
    description = d.get("description") or ""
    if not isinstance(description, str):
        raise ctx.data("description", f"expected text, got {description!r}")
    mc = _multiple_comparisons(ctx, d["multiple_comparisons"]) if d.get("multiple_comparisons") is not None \
        else MultipleComparisons()
    return SweepSpec(
        name=name, models=models, metrics=metrics, tests=tests, languages=languages, seed=seed,
        permutations=perms, n_bootstrap=nboot, output_dir=out, tracking_uri=uri, experiment=experiment,
        ray=_ray(ctx, d.get("ray")), description=description, source=source, raw=copy.deepcopy(d),
        multiple_comparisons=mc, tags=_tags(ctx, d["tags"]) if d.get("tags") is not None else {},
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
