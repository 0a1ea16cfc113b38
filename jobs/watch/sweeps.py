"""Generated sweep specs and their identity: one concrete sweep per (watched model, revision),
its digest, its name and the Ray submission id of each attempt."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
from typing import Any, Mapping

import yaml

from audit.errors import DataError
from jobs.resolve import model_kind
from jobs.spec import parse_spec
from jobs.validators import expand_env, read_yaml
from jobs.watch.spec import WatchEntry, WatchSpec, deep_merge

#: Fields of a generated sweep spec that do not change its tasks (left out of :func:`spec_digest`).
_VOLATILE = ("name", "output_dir", "tracking", "ray", "description", "tags")

#: Parent-run tags of a generated sweep (its ``tags:``): which watch, source, repository and
#: revision it audits and when that revision was made. The regression check finds the previous
#: audited revision of a repository by them (:meth:`jobs.watch.index.AuditIndex.previous`).
WATCH_TAG, SOURCE_TAG, REPO_TAG, REVISION_TAG, WHEN_TAG = (
    "audit.watch", "audit.watch.source", "audit.watch.repo", "audit.watch.revision", "audit.watch.when")


def spec_digest(raw: Mapping[str, Any]) -> str:
    """sha256 (hex) of a generated sweep spec's canonical JSON (sorted keys), leaving out the
    fields that do not change its tasks: ``name``, ``output_dir``, ``tracking``, ``ray``,
    ``description``, ``tags``. Computed on the unexpanded text (``${VAR}`` kept), so the same audit has the
    same digest on the watcher's machine and on the cluster."""
    keep = {k: v for k, v in raw.items() if k not in _VOLATILE}
    blob = json.dumps(keep, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def submission_id(source: str, repo: str, revision: str, digest: str, attempt: int = 1, *, scope: str) -> str:
    """The Ray submission id of an audit: ``audit-`` + the first 16 hex digits of sha256 over the
    JSON list ``[source, repo, revision, digest, scope]``; attempt ``n > 1`` appends ``-n``.

    ``scope`` is the watch's :attr:`~jobs.watch.spec.WatchSpec.scope` (its name, experiment and
    tracking store): two watcher processes of one watch writing to one store compute the same id
    (Ray accepts it once), while a watch on another store gets ids of its own and audits into it.
    """
    blob = json.dumps([source, repo, revision, digest, scope], ensure_ascii=False).encode("utf-8")
    base = "audit-" + hashlib.sha256(blob).hexdigest()[:16]
    return base if attempt <= 1 else f"{base}-{attempt}"


def safe_name(s: str, max_len: int = 60) -> str:
    """A spec-safe name: characters other than letters, digits, ``_ . -`` become ``-``; ``/``
    becomes ``--``."""
    s = re.sub(r"[^A-Za-z0-9_.\-]", "-", s.replace("/", "--")).strip("-.") or "model"
    return s[:max_len].rstrip("-.") or "model"


def short_revision(revision: str) -> str:
    r = revision.split(":", 1)[1] if revision.startswith("sha256:") else revision
    return safe_name(r, 12)


@dataclasses.dataclass(frozen=True)
class Release:
    """A revision of a watched model.

    source:   ``hub`` or ``local``.
    repo:     the hub id, or the model folder.
    name:     the model's name in the generated sweep.
    revision: the hub commit, the revision sub-folder's name, or the folder's content digest.
    ref:      the generated sweep's ``ref`` (hub id; revision folder or file).
    pin:      the generated sweep's ``revision`` field (hub commit), ``None`` for local models.
    backend:  a backend hint when the template does not set one (from the hub's config).
    when:     the commit date or the folder's modification time (ISO 8601), for the log.
    """

    source: str
    repo: str
    name: str
    revision: str
    ref: str
    pin: str | None = None
    backend: str | None = None
    when: str | None = None


@dataclasses.dataclass(frozen=True)
class GeneratedSweep:
    raw: dict[str, Any]
    digest: str
    name: str
    text: str


def generate_sweep(watch: WatchSpec, entry: WatchEntry, rel: Release) -> GeneratedSweep:
    """The concrete sweep spec of ``rel``, validated with :func:`jobs.spec.parse_spec` after its
    variables are expanded as the job will see them (the watcher's environment plus the job's
    ``ray.runtime_env.env_vars``), with the sweep spec's own rules (:func:`jobs.validators.expand_env`:
    a variable that holds a secret is refused here, not in the job)."""
    audit = entry.audit
    raw: dict[str, Any] = {}
    if audit.spec is not None:
        tpl = read_yaml(audit.spec, what="sweep spec template")
        if not isinstance(tpl, Mapping):
            raise DataError(f"{audit.spec}: a sweep spec template must be a mapping, got {type(tpl).__name__}")
        raw = dict(tpl)
    raw = deep_merge(raw, audit.overrides)
    model: dict[str, Any] = {"ref": rel.ref, "name": rel.name}
    model.update({k: copy.deepcopy(v) for k, v in audit.model.items() if k != "name"})
    if rel.backend and "backend" not in model:
        model["backend"] = rel.backend
    if rel.pin:
        model["revision"] = rel.pin
    raw["models"] = [model]
    raw.pop("name", None)
    raw.pop("output_dir", None)
    raw.pop("tracking", None)
    raw["description"] = f"watch {watch.name}: {rel.repo} at {rel.revision}"
    digest = spec_digest(raw)
    name = f"{safe_name(watch.name, 40)}-{safe_name(rel.name, 60)}-{short_revision(rel.revision)}-{digest[:8]}"
    raw["name"] = name
    raw["output_dir"] = f"{watch.resolved_sweep_output_dir}/{name}"
    raw["tracking"] = {"uri": watch.resolved_tracking_uri, "experiment": watch.resolved_experiment}
    raw["tags"] = {**(raw.get("tags") or {}), WATCH_TAG: watch.name, SOURCE_TAG: rel.source, REPO_TAG: rel.repo,
                   REVISION_TAG: rel.revision, WHEN_TAG: rel.when or ""}
    src = f"{audit.spec or watch.source} (generated for {rel.repo}@{rel.revision})"
    env = {**os.environ, **{str(k): str(v) for k, v in (watch.ray.runtime_env.get("env_vars") or {}).items()}}
    # the job would refuse an invalid spec: refuse it here, naming the field (variables as the job sees them)
    expanded = expand_env(raw, src, env=env, unset_hint="set VAR where the watcher runs or in ray.runtime_env.env_vars of the watch spec")
    parse_spec(expanded, source=src)
    if rel.source == "local":  # the planner's rule for a local folder, here: a job that cannot load it is not submitted
        model_kind(rel.ref, model.get("backend"))
    order = ["name", "description", "seed", "output_dir", "tracking"]
    ordered = {k: raw[k] for k in order if k in raw} | {k: v for k, v in raw.items() if k not in order}
    text = (f"# Generated by `audit watch` ({watch.name}) for {rel.repo} at revision {rel.revision}.\n"
            f"# Template: {audit.spec or '-'}; spec digest {digest}.\n"
            + yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True))
    return GeneratedSweep(raw=raw, digest=digest, name=name, text=text)


__all__ = ["spec_digest", "submission_id", "safe_name", "short_revision", "Release", "GeneratedSweep",
           "generate_sweep", "WATCH_TAG", "SOURCE_TAG", "REPO_TAG", "REVISION_TAG", "WHEN_TAG"]
