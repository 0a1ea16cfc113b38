"""Where new revisions come from: a Hugging Face hub (:class:`HubSource`) or a directory of
model folders (:class:`LocalSource`)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from audit.backends import table as backend_table
from audit.backends.hf import dir_digest
from audit.backends.static import content_digest
from audit.errors import AuditError, ModelError
from audit.retry import first_line, http_status, transient_reason
from jobs.resolve import model_kind, probe_revision
from jobs.watch.backoff import SourceUnavailable
from jobs.watch.spec import WatchEntry
from jobs.watch.sweeps import Release, safe_name


class Source(Protocol):
    def repos(self, entry: WatchEntry) -> list[str]: ...

    def releases(self, repo: str, entry: WatchEntry) -> list[Release]: ...


def iso_time(ts: float | _dt.datetime | None) -> str | None:
    """An ISO 8601 time (UTC for a POSIX timestamp), ``None`` for ``None``."""
    if ts is None:
        return None
    if isinstance(ts, _dt.datetime):
        return ts.isoformat()
    return _dt.datetime.fromtimestamp(ts, tz=_dt.timezone.utc).isoformat(timespec="seconds")


_BACKEND_OF_PIPELINE = {"fill-mask": "hf-mlm", "text-generation": "hf-causal", "feature-extraction": "hf-encoder",
                        "sentence-similarity": "hf-encoder"}


def backend_hint(config: Mapping[str, Any] | None, pipeline_tag: str | None) -> str | None:
    """``hf-mlm``/``hf-causal``/``hf-encoder`` from a hub config's ``architectures`` (else the
    pipeline tag), ``None`` when neither tells."""
    archs = [str(a) for a in ((config or {}).get("architectures") or [])]
    if archs:  # the planner's and the loader's one rule (audit.backends.table.kind_from_architectures)
        return backend_table.backend_of_kind(backend_table.kind_from_architectures(archs))
    return _BACKEND_OF_PIPELINE.get(pipeline_tag or "")


class HubSource:
    """Model repositories on a Hugging Face hub (``huggingface_hub.HfApi``).

    endpoint: the hub URL; default ``$HF_ENDPOINT`` read *now* (not when ``huggingface_hub``
              was imported), else ``https://huggingface.co``.
    """

    def __init__(self, endpoint: str | None = None, *, timeout: float = 15.0, token: str | bool | None = None):
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.timeout = timeout
        self.token = token

    def _api(self):
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token)

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run a hub call; transient failures become :class:`SourceUnavailable`, permanent ones
        :class:`audit.errors.ModelError` naming ``what``."""
        from huggingface_hub import constants
        from huggingface_hub.errors import (
            HfHubHTTPError,
            HFValidationError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        if constants.HF_HUB_OFFLINE:
            raise ModelError(f"{what}: HF_HUB_OFFLINE is set; the hub source needs the network "
                             "(unset it, or watch a `local:` directory)")
        try:
            return fn()
        except OfflineModeIsEnabled as e:
            raise ModelError(f"{what}: {e}") from None
        except RevisionNotFoundError as e:
            raise ModelError(f"{what}: revision not found ({first_line(e)})") from None
        except RepositoryNotFoundError as e:
            raise ModelError(f"{what}: repository not found, or gated/private without access ({first_line(e)})") from None
        except HFValidationError as e:
            raise ModelError(f"{what}: {first_line(e)}") from None
        except Exception as e:  # noqa: BLE001 - transient or not: audit.retry's one rule decides
            reason = transient_reason(e)  # 408/425/429/5xx, connection and timeout errors
            code = http_status(e)
            if reason is not None:
                raise SourceUnavailable(f"{what}: {reason}" + (f" ({first_line(e)})" if code is not None else "")) from e
            if isinstance(e, HfHubHTTPError):
                raise ModelError(f"{what}: HTTP {code} ({first_line(e)})") from None
            if isinstance(e, OSError):  # a permanent one (permission denied, no such file)
                raise ModelError(f"{what}: {type(e).__name__}: {first_line(e)}") from None
            raise

    def repos(self, entry: WatchEntry) -> list[str]:
        if entry.kind == "repo":
            return [entry.target]
        what = f"hub listing of {entry.describe()}"
        infos = self._call(what, lambda: list(self._api().list_models(author=entry.target, search=entry.search,
                                                                      limit=entry.limit)))
        return sorted({i.id for i in infos})

    def releases(self, repo: str, entry: WatchEntry) -> list[Release]:
        branch = entry.branch or "main"
        what = f"hub repository {repo!r} (branch {branch})"
        api = self._api()
        info = self._call(what, lambda: api.model_info(repo, revision=branch, timeout=self.timeout))
        hint = backend_hint(getattr(info, "config", None), getattr(info, "pipeline_tag", None))
        name = safe_name(repo)
        if entry.revisions <= 1:
            if not info.sha:
                raise SourceUnavailable(f"{what}: the hub answered without a commit hash")
            return [Release("hub", repo, name, info.sha, repo, pin=info.sha, backend=hint,
                            when=iso_time(info.last_modified))]
        commits = self._call(f"{what} commits", lambda: api.list_repo_commits(repo, revision=branch))
        return [Release("hub", repo, name, c.commit_id, repo, pin=c.commit_id, backend=hint, when=iso_time(c.created_at))
                for c in commits[: entry.revisions]]


class LocalSource:
    """Model folders in a directory (no hub needed).

    ``layout: revisions``: ``<root>/<model>/<revision>/`` -- each sub-folder is a revision (its
    name is the revision); the newest ``revisions`` by modification time (then name), or by name.
    ``layout: digest``: ``<root>/<model>/`` is the model, updated in place; its revision is the
    content digest the backend will report (:func:`jobs.resolve.probe_revision`).
    The sweep's ``ref`` is the folder, or ``<folder>/<file>`` with ``file:``. Folders whose
    newest entry changed less than ``settle`` seconds ago are skipped (still being copied).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.unsettled: list[tuple[str, float]] = []

    def repos(self, entry: WatchEntry) -> list[str]:
        root = Path(entry.target).expanduser()
        if not root.is_dir():
            raise ModelError(f"{entry.where}.local: {root} is not a directory")
        out = []
        for p in sorted(root.iterdir()):
            if not p.is_dir() or p.name.startswith("."):
                continue
            if entry.search and entry.search.lower() not in p.name.lower():
                continue
            out.append(str(p.resolve()))
        return out[: entry.limit]

    def _age(self, p: Path) -> float:
        newest = p.stat().st_mtime
        for q in p.rglob("*"):
            with contextlib.suppress(OSError):
                newest = max(newest, q.stat().st_mtime)
        return self.clock() - newest

    def _ref(self, folder: Path, entry: WatchEntry) -> Path:
        ref = folder / entry.file if entry.file else folder
        if not ref.exists():
            raise ModelError(f"{entry.where}.file: {ref} does not exist")
        return ref

    def releases(self, repo: str, entry: WatchEntry) -> list[Release]:
        folder = Path(repo)
        name = safe_name(folder.name)
        self.unsettled = []
        if entry.layout == "digest":
            age = self._age(folder)
            if age < entry.settle:
                self.unsettled.append((str(folder), age))
                return []
            ref = self._ref(folder, entry)
            rev = local_revision(ref, entry.audit.model.get("backend"))
            return [Release("local", str(folder), name, rev, str(ref), when=iso_time(folder.stat().st_mtime))]
        subs = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
        if entry.order == "name":
            subs.sort(key=lambda p: p.name, reverse=True)
        else:
            subs.sort(key=lambda p: (p.stat().st_mtime, p.name), reverse=True)
        out = []
        for sub in subs:
            age = self._age(sub)
            if age < entry.settle:
                self.unsettled.append((str(sub), age))
                continue
            out.append(Release("local", str(folder), name, sub.name, str(self._ref(sub, entry)),
                               when=iso_time(sub.stat().st_mtime)))
            if len(out) == entry.revisions:
                break
        return out


def local_revision(ref: Path, backend: str | None = None) -> str:
    """The revision the backends report for a local model (``sha256:...``): the planner's probe
    (:func:`jobs.resolve.probe_revision`), else the directory digest of
    :func:`audit.backends.hf.dir_digest` / the file digest of ``static.content_digest``."""
    try:
        kind = model_kind(str(ref), backend)
        rev = probe_revision(str(ref), kind, {"backend": backend} if backend else {})
    except AuditError:
        rev = None
    if rev:
        return rev
    if ref.is_dir():
        return dir_digest(ref)
    return content_digest([ref])


__all__ = ["Source", "HubSource", "LocalSource", "local_revision", "backend_hint", "iso_time"]
