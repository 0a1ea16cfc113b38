"""The watch spec: what to watch, which audit to run on it, where to submit it.

Validated with the vocabulary of :mod:`audit.schema` (the same rules, messages and error classes as
the sweep spec): the top level is :class:`WatchFields`, ``watch[i]`` :class:`EntryFields`; ``audit``,
``notify``, ``ray``, ``hub``, ``backoff`` and ``regression`` have their models; every error names the file
and the field.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Mapping

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from audit import registry, schema
from audit.errors import DataError, ParameterError
from audit.schema import Flag, Int, Num, NullDefaults, OneOf, Permutations, Refused, Section, Text, validate
from jobs.uris import resolve_tracking_uri, store_identity
from jobs.validators import (
    Ctx,
    expand_env,
    given,
    Name,
    location_overrides,
    mapping,
    named,
    non_empty,
    read_yaml,
    tracking,
)
from jobs.watch.backoff import Backoff

#: The runtime_env variable that carries a generated sweep spec (YAML) into the Ray job.
SPEC_ENV = "BIASAUDIT_SWEEP_SPEC"
#: What a submitted job runs unless the watch spec sets ``ray.entrypoint``.
DEFAULT_ENTRYPOINT = f"python -m jobs.watch --run-spec-env {SPEC_ENV} --no-progress"

_SOURCE_KEYS = ("repo", "author", "local")
_LAYOUTS = ("revisions", "digest")
_ORDERS = ("mtime", "name")


@dataclasses.dataclass(frozen=True)
class AuditTemplate:
    """The audit of a watched model: a sweep spec used as template, overrides, model fields."""

    spec: Path | None = None
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    model: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class WatchEntry:
    """One item of ``watch:``.

    kind:      ``repo`` (an exact hub id), ``author`` (hub listing, filtered by ``search``) or
               ``local`` (a directory of model folders, filtered by ``search``).
    target:    the hub id, the author, or the directory.
    revisions: how many newest revisions to audit (hub commits of ``branch``; local sub-folders).
    layout:    local only: ``revisions`` (``<model>/<revision>/``) or ``digest`` (the folder is
               the model; its revision is its content digest).
    order:     local ``revisions`` layout: newest by ``mtime`` (then name) or by ``name``.
    file:      local only: the model is this file inside the folder (static vectors).
    settle:    local only: ignore folders modified less than this many seconds ago.
    """

    kind: str
    target: str
    search: str | None = None
    limit: int = 50
    branch: str | None = None
    revisions: int = 1
    layout: str = "revisions"
    order: str = "mtime"
    file: str | None = None
    settle: float = 0.0
    audit: AuditTemplate = AuditTemplate()
    where: str = ""

    def describe(self) -> str:
        if self.kind == "author":
            return f"author {self.target}" + (f" search {self.search!r}" if self.search else "")
        if self.kind == "local":
            return f"local {self.target}" + (f" search {self.search!r}" if self.search else "")
        return f"repo {self.target}"


class RaySubmit(Section):
    """How sweeps are submitted (``ray:`` of the watch spec; a typed model of :mod:`audit.schema`).

    entrypoint_num_cpus/gpus: resources the sweep's *driver* reserves for the job's lifetime
             (Ray's default, and the advice, is none: the driver mostly waits for its model
             actors, and a reserved CPU is one an actor cannot get).
    max_jobs: at most this many of this watch's sweeps pending or running on the cluster at once
             (``None``: no limit); further new revisions wait for a later poll (``deferred``).
    """

    address: Text | None = None
    runtime_env: dict[str, Any] = {}
    entrypoint: Text = DEFAULT_ENTRYPOINT
    entrypoint_num_cpus: Num() | None = None
    entrypoint_num_gpus: Num() | None = None
    max_jobs: Int(1) | None = None


def _http_url(url: str) -> str:
    if not re.match(r"^https?://[^\s/]+", url):
        raise Refused(f"{url!r}: expected an http(s):// URL")
    return url


#: An ``http(s)://`` address with a host (``hub.endpoint``, ``notify.url``).
HttpUrl = Annotated[Text, AfterValidator(_http_url)]


def _blank_none(v: Any) -> Any:
    """A blank string (``${VAR:-}`` of an unset variable) reads as not given."""
    return None if isinstance(v, str) and not v.strip() else v


class HubFields(NullDefaults):
    """The ``hub:`` section: the Hub's address (default: ``huggingface_hub``'s; blank: not given),
    the branch whose commits are revisions, the seconds one request may take."""

    endpoint: Annotated[HttpUrl, AfterValidator(lambda url: url.rstrip("/"))] | None = None
    branch: Text = "main"
    timeout: Num(0.0, strict=True) = 15.0

    @field_validator("endpoint", mode="before")
    @classmethod
    def _blank(cls, v: Any) -> Any:
        return _blank_none(v)


class BackoffFields(NullDefaults):
    """The types and ranges of the ``backoff:`` section (its defaults: :class:`Backoff`)."""

    initial: Num() | None = None
    max: Num() | None = None
    max_interval: Num() | None = None
    factor: Num(1.0) | None = None
    jitter: Num(maximum=1.0) | None = None
    retries: Int(0) | None = None
    seed: Int(0) | None = None


def _a_command(command: str) -> str:
    try:
        if not shlex.split(command):
            raise ValueError("empty")
    except ValueError as e:
        raise Refused(f"{command!r}: cannot be split into a command ({e})") from None
    return command


def _not_given(d: Any) -> Any:
    """A section's null or blank (``${VAR:-}``) fields read as not given: their defaults."""
    return {k: x for k, x in d.items() if given(x)} if isinstance(d, Mapping) else d


class Notify(Section):
    """What the watcher does when it finds a regression (``regression.notify``) or an audit fails
    (``notify``, else ``regression.notify``); a typed model of :mod:`audit.schema` (null or blank
    fields read as not given). The JSON's ``event`` tells which: ``bias_regression``,
    ``audit_failed``, ``audit_gave_up``, ``audit_not_submitted``.

    command: run (split like a shell line with :func:`shlex.split`, no shell) with the
             regression's JSON on its standard input and ``AUDIT_REGRESSION_JSON`` naming a file
             holding the same; a non-zero exit status is an ``error`` decision.
    url:     an ``http(s)://`` address that gets the JSON as an HTTP POST
             (``Content-Type: application/json``); a status >= 400 or no answer within
             ``timeout`` seconds is an ``error`` decision.
    """

    command: Annotated[Text, AfterValidator(_a_command)] | None = None
    url: HttpUrl | None = None
    timeout: Num(0.0, strict=True) = 10.0

    @model_validator(mode="before")
    @classmethod
    def _blank(cls, d: Any) -> Any:
        return _not_given(d)

    @model_validator(mode="after")
    def _something(self) -> Notify:
        if self.command is None and self.url is None:
            raise DataError("give a `command`, a `url` or both")
        return self


def _comparable(m: str) -> str:
    """A registered metric that offers a paired comparison (:func:`audit.registry.comparer`)."""
    try:
        comp = registry.comparer(m)
    except ParameterError as e:
        raise Refused(str(e)) from None
    if comp is None:
        raise Refused(f"{m} offers no paired comparison; comparable: "
                      + ", ".join(n for n in registry.names() if registry.comparer(n) is not None))
    return m


class RegressionSpec(NullDefaults):
    """Regression detection between audited revisions (``regression:`` of the watch spec;
    :mod:`jobs.watch.regression`; a typed model of :mod:`audit.schema`).

    metrics:      the metrics compared (default: every metric of the audit that offers a paired
                  comparison, :func:`audit.registry.comparer`).
    tests:        the tests compared (default: all the two audits share).
    min_increase: smallest increase of the bias magnitude (|effect size| for WEAT) that counts.
    alpha:        level of the adjusted p-value (``adjust``: ``holm`` or ``bh``, over the
                  compared tests of each metric).
    baseline:     a pinned baseline revision (of every watched repository), compared too.
    previous:     compare with the previous audited revision of the repository (default true).
    n_bootstrap, permutations, seed: of each comparison (:mod:`audit.compare`).
    notify:       :class:`Notify` (``None``: no notification).
    """

    metrics: Annotated[tuple[Annotated[Text, AfterValidator(_comparable)], ...], Field(strict=False)] | None = None
    tests: Annotated[tuple[Text, ...], Field(strict=False)] | None = None
    min_increase: Num() = 0.0
    alpha: Num(0.0, strict=True, maximum=1.0, inclusive=True) = 0.05
    adjust: OneOf("adjustment", ("holm", "bh")) = "holm"
    baseline: Text | None = None
    previous: Flag = True
    n_bootstrap: Int(0) = 1000
    permutations: Permutations = "auto"
    seed: Int(0) = 0
    notify: Notify | None = None

    @field_validator("metrics", "tests", mode="before")
    @classmethod
    def _a_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("baseline", mode="before")
    @classmethod
    def _revision(cls, v: Any) -> Any:  # a number is its text, a blank string not given
        return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else _blank_none(v)

    @field_validator("previous")
    @classmethod
    def _something_to_compare(cls, v: bool, info: ValidationInfo) -> bool:
        if not v and info.data.get("baseline") is None:
            raise Refused("false needs a `baseline` revision: nothing to compare with")
        return v


@dataclasses.dataclass(frozen=True)
class WatchSpec:
    """A validated watch spec (see :mod:`jobs.watch` for the fields)."""

    name: str
    entries: tuple[WatchEntry, ...]
    output_dir: Path
    interval: float = 3600.0
    max_attempts: int = 2
    backoff: Backoff = Backoff()
    tracking_uri: str | None = None
    experiment: str | None = None
    sweep_output_dir: str | None = None
    hub_endpoint: str | None = None
    hub_branch: str = "main"
    hub_timeout: float = 15.0
    ray: RaySubmit = RaySubmit()
    description: str = ""
    source: str = ""
    regression: RegressionSpec | None = None
    notify: Notify | None = None

    @property
    def alerts(self) -> Notify | None:
        """Where failed audits are announced (``notify:``, else ``regression.notify``): a job that
        failed, an audit given up, an audit that cannot be submitted."""
        return self.notify or (self.regression.notify if self.regression is not None else None)

    @property
    def resolved_tracking_uri(self) -> str:
        """The tracking URI the watcher reads and every generated sweep writes to
        (:func:`jobs.uris.resolve_tracking_uri`): ``--tracking-uri``, else ``tracking.uri``, else
        ``$MLFLOW_TRACKING_URI`` where the watcher runs, else ``sqlite:///<output_dir>/mlflow.db``."""
        return resolve_tracking_uri(self.tracking_uri, self.output_dir)

    @property
    def resolved_experiment(self) -> str:
        return self.experiment or f"biasaudit-watch-{self.name}"

    @property
    def resolved_sweep_output_dir(self) -> str:
        return self.sweep_output_dir or str((self.output_dir / "sweeps").resolve())

    @property
    def scope(self) -> str:
        """Where this watch's audits land: its name, experiment and tracking store (without
        credentials), as JSON. Part of every submission id (:func:`jobs.watch.sweeps.submission_id`),
        so two watcher processes of one watch on one store submit an audit once, and watches on
        separate stores each get their own."""
        return json.dumps([self.name, self.resolved_experiment, store_identity(self.resolved_tracking_uri)],
                          ensure_ascii=False)


def _set_by_watcher(key: str) -> str:
    if key in ("ref", "revision", "build"):
        raise Refused("is set by the watcher for each watched model")
    return key


#: ``audit.model`` / ``watch[i].model``: fields of the generated sweep's model entry (checked
#: with that spec), except those the watcher sets for each watched model.
ModelOverrides = dict[Annotated[str, AfterValidator(_set_by_watcher)], Any]


class AuditFields(NullDefaults):
    """The ``audit:`` section (top level and ``watch[i].audit``; see :class:`AuditTemplate`;
    null fields read as not given)."""

    spec: Text | None = None
    overrides: dict[str, Any] | None = None
    model: ModelOverrides | None = None


def _audit(f: AuditFields, base: AuditTemplate | None = None) -> AuditTemplate:
    """``base`` (the top level's template) with the fields of ``f`` (``overrides`` merged)."""
    base = base or AuditTemplate()
    return AuditTemplate(spec=Path(f.spec) if f.spec is not None else base.spec,
                         overrides=deep_merge(base.overrides, f.overrides or {}),
                         model={**base.model, **(f.model or {})})


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``over``: mappings merge recursively, anything else (lists included)
    is replaced (deep copies; neither argument changes)."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _hub_id(repo: str) -> str:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as e:
        raise Refused(f"{repo!r} is not a hub repository id: {str(e).splitlines()[0]}") from None
    return repo


def _inside(file: str) -> str:
    if Path(file).is_absolute() or ".." in Path(file).parts:
        raise Refused(f"{file!r}: give a file name inside the model folder")
    return file


class EntryFields(Section):
    """The fields of one ``watch[i]`` entry (see :class:`WatchEntry`; a string is ``{repo: <string>}``):
    exactly one of ``repo``, ``author``, ``local``; the fields that apply to another kind of entry
    refused, naming the field."""

    repo: Annotated[Text, AfterValidator(_hub_id)] | None = None
    author: Text | None = None
    local: Text | None = None
    search: Text | None = None
    limit: Int(1) | None = None
    branch: Text | None = None
    layout: OneOf("layout", _LAYOUTS) | None = None
    revisions: Int(1) | None = None
    order: OneOf("order", _ORDERS) | None = None
    file: Annotated[Text, AfterValidator(_inside)] | None = None
    settle: Num() | None = None
    audit: AuditFields | None = None
    model: ModelOverrides | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, d: Any) -> Any:
        kinds = [k for k in _SOURCE_KEYS if isinstance(d, Mapping) and d.get(k) is not None]
        if isinstance(d, Mapping) and len(kinds) != 1:
            raise DataError(f"give exactly one of {', '.join(_SOURCE_KEYS)} (got {kinds or 'none'})")
        return d

    @field_validator("search", "limit", "branch", "layout", "order", "file", "settle", mode="before")
    @classmethod
    def _applies(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None:
            return v
        if info.field_name in ("search", "limit") and info.data.get("repo") is not None:
            raise Refused("applies to `author` and `local` entries, not to an exact `repo`")
        if info.field_name == "branch" and info.data.get("local") is not None:
            raise Refused("applies to hub entries only")
        if info.field_name in ("layout", "order", "file", "settle") and info.data.get("local") is None:
            raise Refused("applies to `local` entries only")
        return v

    @field_validator("revisions")
    @classmethod
    def _one_digest(cls, v: int | None, info: ValidationInfo) -> int | None:
        if info.data.get("layout") == "digest" and v not in (None, 1):
            raise Refused("a `digest` layout has one revision (the folder's current content)")
        return v


def _entry(ctx: Ctx, i: int, f: EntryFields, default: AuditTemplate, hub_branch: str) -> WatchEntry:
    """``watch[i]`` (validated as ``f``) as a :class:`WatchEntry` with its audit template."""
    path = f"watch[{i}]"
    kind = next(k for k in _SOURCE_KEYS if getattr(f, k) is not None)
    audit = _audit(f.audit, default) if f.audit is not None else default
    if f.model is not None:
        audit = dataclasses.replace(audit, model={**audit.model, **f.model})
    if audit.spec is None and not audit.overrides:
        raise ctx.data(f"{path}.audit", "no audit to run: set `audit.spec` (a sweep spec template) at the top or here")
    return WatchEntry(kind=kind, target=getattr(f, kind), search=f.search, limit=f.limit or 50,
                      branch=f.branch or (hub_branch if kind != "local" else None), revisions=f.revisions or 1,
                      layout=f.layout or "revisions", order=f.order or "mtime", file=f.file,
                      settle=float(f.settle) if f.settle is not None else 0.0, audit=audit, where=path)


class WatchFields(Section):
    """The top level of a watch spec (:mod:`jobs.watch` lists the fields); ``watch[i]`` is
    :class:`EntryFields`, ``audit`` :class:`AuditFields`, ``notify`` :class:`Notify`, ``backoff``
    :class:`BackoffFields`, ``hub`` :class:`HubFields`, ``regression`` :class:`RegressionSpec`;
    ``tracking`` and ``ray`` are read by their own functions (blank values, a variable the watcher sets)."""

    name: Name
    description: Annotated[str, Field(strict=True)] | None = None
    output_dir: Text | None = None
    interval: Num(0.0, strict=True) | None = None
    max_attempts: Int(1) | None = None
    backoff: BackoffFields | None = None
    tracking: Any = None
    sweep_output_dir: Text | None = None
    hub: HubFields | None = None
    ray: Any = None
    audit: AuditFields | None = None
    watch: Annotated[tuple[Annotated[EntryFields, named("repo")], ...], non_empty("repositories or folders"),
                     Field(strict=False)]
    regression: RegressionSpec | None = None
    notify: Notify | None = None


def _ray(ctx: Ctx, v: Any) -> RaySubmit:
    r = {k: x for k, x in mapping(ctx, "ray", v).items() if x is not None and (k != "address" or given(x))}
    env = r.get("runtime_env")
    if isinstance(env, Mapping) and isinstance(env.get("env_vars"), Mapping) and SPEC_ENV in env["env_vars"]:
        raise ctx.param(f"ray.runtime_env.env_vars.{SPEC_ENV}", "is set by the watcher (the generated sweep spec)")
    return validate(RaySubmit, r, ctx.source, "ray")


def parse_watch_spec(data: Any, source: str = "") -> WatchSpec:
    """Validate a parsed watch spec (environment variables already expanded); errors name the
    file and the field."""
    ctx = Ctx(source, "<watch spec>")
    if data is None:
        raise ctx.data("", "the watch spec is empty")
    d = {k: (None if k == "sweep_output_dir" and not given(x) else x) for k, x in mapping(ctx, "", data).items()}
    f = validate(WatchFields, d, ctx.source)
    backoff = Backoff(**f.backoff.model_dump(exclude_none=True)) if f.backoff is not None else Backoff()
    uri = experiment = None
    if f.tracking is not None:
        t = tracking(ctx, f.tracking)
        uri, experiment = t.uri, t.experiment
    hub = f.hub or HubFields()
    ray = _ray(ctx, f.ray) if f.ray is not None else RaySubmit()
    default = _audit(f.audit) if f.audit is not None else AuditTemplate()
    entries = tuple(_entry(ctx, i, e, default, hub.branch) for i, e in enumerate(f.watch))
    return WatchSpec(name=f.name, entries=entries,
                     output_dir=Path(f.output_dir) if f.output_dir is not None else Path("out") / "watch" / f.name,
                     interval=float(f.interval) if f.interval is not None else 3600.0,
                     max_attempts=f.max_attempts if f.max_attempts is not None else 2,
                     backoff=backoff, tracking_uri=uri, experiment=experiment, sweep_output_dir=f.sweep_output_dir,
                     hub_endpoint=hub.endpoint, hub_branch=hub.branch, hub_timeout=hub.timeout, ray=ray,
                     description=f.description or "", source=source, regression=f.regression, notify=f.notify)


def load_watch_spec(path: str | os.PathLike, *, output_dir: str | os.PathLike | None = None,
                    tracking_uri: str | None = None, address: str | None = None,
                    interval: float | None = None) -> WatchSpec:
    """Read and validate a watch spec file (its ``${VAR}`` expanded from this process's
    environment); the keyword arguments (the command line's options) override its fields."""
    p = Path(path)
    spec = parse_watch_spec(expand_env(read_yaml(p, what="watch spec"), str(p)), source=str(p))
    changes: dict[str, Any] = location_overrides(output_dir, tracking_uri)
    if interval is not None:
        changes["interval"] = schema.number(interval, "--interval", 0.0, strict=True)
    if address is not None:
        changes["ray"] = spec.ray.model_copy(update={"address": address})
    return dataclasses.replace(spec, **changes) if changes else spec


__all__ = ["SPEC_ENV", "DEFAULT_ENTRYPOINT", "AuditTemplate", "WatchEntry", "RaySubmit", "WatchSpec", "Notify",
           "RegressionSpec", "EntryFields", "WatchFields",
           "deep_merge", "parse_watch_spec", "load_watch_spec"]
