"""A loopback Hugging Face Hub for the test suite: ``huggingface_hub`` and Transformers talk to it
for real (``HF_ENDPOINT=http://127.0.0.1:<port>``).

What it serves (the shapes the installed ``huggingface_hub`` parses; see ``ModelInfo``,
``RepoFile``/``RepoFolder``, ``GitCommitInfo``, ``GitRefs`` in ``huggingface_hub.hf_api`` and the
error headers read by ``huggingface_hub.utils._http.hf_raise_for_status``):

=====================================================  ===========================================
``GET|HEAD /{repo}/resolve/{rev}/{path}``               the file at ``rev`` (branch, tag, commit);
                                                        ``ETag`` (git blob sha1, or sha256 for LFS
                                                        files, also as ``X-Linked-Etag``),
                                                        ``X-Repo-Commit``, ``Content-Length``,
                                                        ``X-Linked-Size`` for LFS, ``Range`` (206)
``GET /api/models/{repo}``                              model info at the default branch
``GET /api/models/{repo}/revision/{rev}``               model info at ``rev`` (``sha``, ``siblings``
                                                        and, with ``blobs=1``, sizes and LFS data)
``GET /api/models/{repo}/tree/{rev}[/{path}]``          tree listing (``recursive``), paginated
``GET /api/models/{repo}/commits/{rev}``                commit history, newest first, paginated
``GET /api/models/{repo}/refs``                         branches and tags
``GET /api/models?author=&search=&limit=``              model listing (``config``/``full`` honoured)
``GET /api/whoami-v2``                                  the token's user
=====================================================  ===========================================

Access rules (those of huggingface.co as seen by a client):

* a request with an ``Authorization: Bearer <token>`` header whose token is not registered
  (:meth:`LoopbackHub.add_token`) gets ``401`` + ``X-Error-Message: Invalid credentials in
  Authorization header`` (whatever the repository);
* an unknown repository, and a private one the caller cannot read, is ``401`` +
  ``X-Error-Code: RepoNotFound`` without a token and ``404`` + ``RepoNotFound`` with one;
* a gated repository shows its metadata to anyone, but its files answer ``401`` + ``GatedRepo``
  without a token and ``403`` + ``GatedRepo`` for a token whose user has not been granted access
  (:meth:`LoopbackHub.grant`, i.e. accepted the licence);
* an unknown revision is ``404`` + ``RevisionNotFound``; an unknown file ``404`` +
  ``EntryNotFound`` (with ``X-Repo-Commit``).

Repositories come from local folders (e.g. a ``save_pretrained`` directory) or from mappings of
file names to bytes; their content is copied into memory when committed, so later edits of the
folder change nothing. Commit ids are deterministic: ``sha1`` over the repository id, the parent
commit, the commit message and the tree (every file's name and git blob id), so the same history
gives the same ids in every run, and two repositories never share one. Branches move with
:meth:`LoopbackHub.commit` (a new commit on top) or :meth:`LoopbackHub.move_branch`.

Faults (:meth:`LoopbackHub.fail`): "the next ``times`` requests whose path matches ``pattern``
answer ``status``" (optionally with ``Retry-After``), or drop the connection without an answer
(``status="reset"``), or stall (``delay`` seconds before the answer). A throttle
(:attr:`LoopbackHub.throttle_bps`) caps the bytes per second of file bodies, shared by all
connections (a token bucket), for benchmarks. Every request is logged in
:attr:`LoopbackHub.requests` (method, path, status, bytes sent).

Pytest: the fixture ``hub`` (:func:`hub_fixture`) starts a server on a free port of 127.0.0.1
and points the process (environment, the already-imported ``huggingface_hub.constants`` and the
shared clients that captured an endpoint) at it with a private ``HF_HOME``/``HF_HUB_CACHE`` and
no token; :meth:`LoopbackHub.go_offline` switches to
``HF_HUB_OFFLINE=1``. :func:`variant_files` makes many distinct checkpoints out of one tiny model
(seeded noise on the weights). Import the fixture into a test module with
``from hub_server import hub_fixture  # noqa: F401`` and ask for ``hub``. Subprocesses inherit
the environment variables.

Command line (for manual runs, ``ray job submit`` tests and benchmarks)::

    python tests/hub_server.py ROOT [--port N] [--throttle BYTES_PER_S]

serves every ``ROOT/<org>/<name>/`` folder as the repository ``org/name`` (one commit on
``main``) and prints ``HF_ENDPOINT=http://127.0.0.1:<port>``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["LoopbackHub", "Fault", "HubRequest", "hub_fixture", "use_hub", "lfs_file", "variant_files",
           "serve_folder"]

#: Files stored in Git LFS on the real Hub (their ETag is the sha256 of the content).
_LFS_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".onnx", ".ot", ".pt", ".pth", ".ckpt",
                 ".gguf", ".tflite", ".npy", ".npz", ".model", ".tar", ".gz", ".zip")
_EPOCH = _dt.datetime(2025, 1, 1, tzinfo=_dt.timezone.utc)
_SHA = re.compile(r"^[0-9a-f]{40}$")
#: How often a test server's ``serve_forever`` looks for a stop (``shutdown`` waits for it; the
#: standard library's 0.5 s was half a second of every hub test's teardown).
STOP_POLL_S = 0.05


def serve_in_thread(server, name: str | None = None) -> threading.Thread:
    """A daemon thread (not started) that runs ``server.serve_forever``, looking for a stop every
    :data:`STOP_POLL_S`: every test HTTP server of the suite (the loopback hub, the watch fakes)."""
    return threading.Thread(target=server.serve_forever, kwargs={"poll_interval": STOP_POLL_S}, name=name,
                            daemon=True)


def lfs_file(path: str, size: int) -> bool:
    """Whether the Hub would store ``path`` in LFS: weights and archives, or anything > 10 MB."""
    return path.lower().endswith(_LFS_SUFFIXES) or size > 10 * 1024 * 1024


def _iso(t: _dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.000Z")


@dataclasses.dataclass(frozen=True)
class _Blob:
    data: bytes
    oid: str            # git blob sha1
    sha256: str
    lfs: bool

    @classmethod
    def of(cls, path: str, data: bytes) -> "_Blob":
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return cls(data, oid, hashlib.sha256(data).hexdigest(), lfs_file(path, len(data)))

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.oid


@dataclasses.dataclass(frozen=True)
class _Commit:
    sha: str
    parent: str | None
    files: Mapping[str, _Blob]
    title: str
    date: _dt.datetime
    author: str


@dataclasses.dataclass
class _Repo:
    id: str
    private: bool = False
    gated: bool = False
    pipeline_tag: str | None = None
    commits: dict[str, _Commit] = dataclasses.field(default_factory=dict)
    branches: dict[str, str] = dataclasses.field(default_factory=dict)
    tags: dict[str, str] = dataclasses.field(default_factory=dict)
    readers: set[str] = dataclasses.field(default_factory=set)   # users who may read (private) / accepted (gated)
    created: _dt.datetime = _EPOCH

    @property
    def author(self) -> str:
        return self.id.split("/")[0]


@dataclasses.dataclass
class Fault:
    """An injected failure: the next ``times`` requests (``None``: all) whose path (without the
    query) matches the regular expression ``pattern`` (``re.search``), and whose method is
    ``method`` (``None``: any), answer ``status`` with an optional ``Retry-After`` header, or, with
    ``status="reset"``, have their connection closed without an answer. ``delay`` seconds pass
    before the answer (a stalled hub). ``hits`` counts the requests it answered."""

    pattern: str
    status: int | str = 503
    times: int | None = 1
    method: str | None = None
    retry_after: int | str | None = None
    delay: float = 0.0
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        return re.search(self.pattern, path) is not None


@dataclasses.dataclass
class HubRequest:
    """One request as the hub saw it: method, path (with query), status answered (``0``: the
    connection was reset), bytes of body sent, the user of a valid token (``None``: anonymous).
    Logged before the answer leaves (``sent`` grows while the body is written), so a client
    that has its answer always finds its request in the log."""

    method: str
    path: str
    status: int
    sent: int
    user: str | None


class _Bucket:
    """A token bucket shared by all connections: ``take(n)`` sleeps so that at most ``rate``
    bytes per second leave the server (a burst of one chunk at most)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next_free = 0.0

    def take(self, n: int, rate: float | None) -> None:
        if not rate or rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + n / rate
            wait = self.next_free - now
        if wait > 0:
            time.sleep(wait)


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, dict(headers or {})


class LoopbackHub:
    """A Hugging Face Hub on 127.0.0.1 serving in-memory repositories (see the module docstring).

    ``throttle_bps``: bytes per second of file bodies, all connections together (``None``: no cap).
    ``page_size``: entries per page of the paginated listings (tree, commits, models).
    """

    CHUNK = 64 * 1024

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, throttle_bps: float | None = None,
                 page_size: int = 1000):
        self.host, self.port = host, port
        self.throttle_bps = throttle_bps
        self.page_size = page_size
        self.lock = threading.RLock()
        self.repos: dict[str, _Repo] = {}
        self.tokens: dict[str, str] = {}           # token -> user
        self.faults: list[Fault] = []
        self.requests: list[HubRequest] = []
        self.unrouted: list[str] = []              # requests for endpoints this hub does not serve
        self._clock = 0
        self._bucket = _Bucket()
        self.cache: Path | None = None              # set by the pytest fixture: the private HF cache
        self._server: ThreadingHTTPServer | None = None
        self._conns: set = set()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the loopback hub is not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    url = endpoint

    def start(self) -> "LoopbackHub":
        if self._server is None:
            self._server = _Server((self.host, self.port), _make_handler(self))
            self._thread = serve_in_thread(self._server, "loopback-hub")
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every open (keep-alive) connection, so that no client keeps
        talking to this hub's handlers through a pooled connection (a later hub may get the same
        port)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "LoopbackHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ content
    def _tick(self) -> _dt.datetime:
        self._clock += 1
        return _EPOCH + _dt.timedelta(minutes=self._clock)

    @staticmethod
    def _read_files(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, _Blob]:
        if isinstance(source, Mapping):
            items = {}
            for name, v in source.items():
                if isinstance(v, os.PathLike):
                    data = Path(v).read_bytes()
                elif isinstance(v, str):
                    data = v.encode("utf-8")
                elif isinstance(v, (dict, list)):
                    data = json.dumps(v, indent=2, sort_keys=True).encode("utf-8")
                else:
                    data = bytes(v)
                items[str(name).replace(os.sep, "/")] = data
        else:
            root = Path(source)
            if not root.is_dir():
                raise FileNotFoundError(f"loopback hub: {root} is not a directory")
            items = {p.relative_to(root).as_posix(): p.read_bytes()
                     for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.relative_to(root).parts}
        return {name: _Blob.of(name, data) for name, data in sorted(items.items())}

    def _new_commit(self, repo: _Repo, files: Mapping[str, _Blob], parent: str | None, message: str,
                    author: str | None) -> str:
        tree = "\n".join(f"{name} {b.oid}" for name, b in sorted(files.items()))
        h = hashlib.sha1(f"repo {repo.id}\nparent {parent or ''}\nmessage {message}\n{tree}".encode("utf-8"))
        sha = h.hexdigest()
        if sha not in repo.commits:
            repo.commits[sha] = _Commit(sha, parent, dict(files), message, self._tick(), author or repo.author)
        return sha

    def add_repo(self, repo_id: str, source: str | os.PathLike | Mapping[str, Any] | None = None, *,
                 private: bool = False, gated: bool = False, branch: str = "main",
                 message: str = "initial commit", pipeline_tag: str | None = None) -> str:
        """Create ``repo_id`` (``org/name``) with one commit of ``source`` (a folder, or a mapping
        ``name -> bytes | str | dict (JSON) | Path``) on ``branch``; return the commit id."""
        if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*", repo_id):
            raise ValueError(f"loopback hub: bad repo id {repo_id!r}")
        with self.lock:
            if repo_id in self.repos:
                raise ValueError(f"loopback hub: {repo_id!r} exists")
            repo = _Repo(repo_id, private=private, gated=gated, pipeline_tag=pipeline_tag, created=self._tick())
            files = self._read_files(source) if source is not None else {}
            if ".gitattributes" not in files:
                attrs = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
                files[".gitattributes"] = _Blob.of(".gitattributes", attrs)
            sha = self._new_commit(repo, files, None, message, None)
            repo.branches[branch] = sha
            self.repos[repo_id] = repo
            return sha

    def add_repos(self, sources: Mapping[str, str | os.PathLike | Mapping[str, Any]], **kw) -> dict[str, str]:
        """:meth:`add_repo` for each ``repo_id -> source``; return ``repo_id -> commit``."""
        return {rid: self.add_repo(rid, src, **kw) for rid, src in sources.items()}

    def commit(self, repo_id: str, files: str | os.PathLike | Mapping[str, Any] | None = None, *,
               branch: str = "main", message: str | None = None, delete: Iterable[str] = (),
               replace: bool = False, author: str | None = None) -> str:
        """A new commit on ``branch`` (created from the default branch if new): the parent's files
        updated with ``files`` (all of them replaced with ``replace=True``), minus ``delete``.
        The branch moves to it; return its id."""
        with self.lock:
            repo = self._repo_or_raise(repo_id)
            parent = repo.branches.get(branch) or repo.branches.get("main")
            base = {} if replace or parent is None else dict(repo.commits[parent].files)
            if files is not None:
                base.update(self._read_files(files))
            for name in delete:
                base.pop(name, None)
            msg = message or f"update {branch} ({len(repo.commits) + 1})"
            sha = self._new_commit(repo, base, parent, msg, author)
            repo.branches[branch] = sha
            return sha

    def move_branch(self, repo_id: str, branch: str, to: str) -> str:
        """Point ``branch`` at ``to`` (a commit id, branch or tag of the same repository)."""
        with self.lock:
            repo = self._repo_or_raise(repo_id)
            sha = self._resolve(repo, to)
            if sha is None:
                raise KeyError(f"loopback hub: {repo_id}: unknown revision {to!r}")
            repo.branches[branch] = sha
            return sha

    def tag(self, repo_id: str, tag: str, rev: str = "main") -> str:
        with self.lock:
            repo = self._repo_or_raise(repo_id)
            sha = self._resolve(repo, rev)
            if sha is None:
                raise KeyError(f"loopback hub: {repo_id}: unknown revision {rev!r}")
            repo.tags[tag] = sha
            return sha

    def head(self, repo_id: str, branch: str = "main") -> str:
        """The commit ``branch`` points at."""
        return self.repos[repo_id].branches[branch]

    def history(self, repo_id: str, rev: str = "main") -> list[str]:
        """Commit ids reachable from ``rev``, newest first."""
        with self.lock:
            repo = self.repos[repo_id]
            out, sha = [], self._resolve(repo, rev)
            while sha is not None:
                out.append(sha)
                sha = repo.commits[sha].parent
            return out

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        with self.lock:
            repo = self.repos[repo_id]
            return {n: b.data for n, b in repo.commits[self._resolve(repo, rev)].files.items()}

    def remove_repo(self, repo_id: str) -> None:
        with self.lock:
            self.repos.pop(repo_id, None)

    def set_private(self, repo_id: str, private: bool = True) -> None:
        self.repos[repo_id].private = private

    def set_gated(self, repo_id: str, gated: bool = True) -> None:
        self.repos[repo_id].gated = gated

    # ------------------------------------------------------------------ access
    def add_token(self, token: str, user: str) -> None:
        """Register a valid token for ``user`` (who owns the repositories of the org ``user``)."""
        with self.lock:
            self.tokens[token] = user

    def grant(self, repo_id: str, user: str) -> None:
        """Let ``user`` read a private repository, or accept a gated one's licence."""
        with self.lock:
            self.repos[repo_id].readers.add(user)

    # ------------------------------------------------------------------ faults, log
    def fail(self, pattern: str, status: int | str = 503, times: int | None = 1, *, method: str | None = None,
             retry_after: int | str | None = None, delay: float = 0.0) -> Fault:
        """Inject a :class:`Fault` (see there); return it (its ``hits`` count the answers)."""
        f = Fault(pattern, status, times, method, retry_after, delay)
        with self.lock:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def count(self, pattern: str = "", method: str | None = None, status: int | None = None) -> int:
        """How many logged requests match ``pattern`` (``re.search`` on the path), method, status."""
        with self.lock:
            return sum(1 for r in self.requests if re.search(pattern, r.path)
                       and (method is None or r.method == method) and (status is None or r.status == status))

    def clear_log(self) -> None:
        with self.lock:
            self.requests.clear()

    @property
    def bytes_sent(self) -> int:
        with self.lock:
            return sum(r.sent for r in self.requests)

    # ------------------------------------------------------------------ pytest environment
    def go_offline(self, monkeypatch) -> None:
        """``HF_HUB_OFFLINE=1`` for this process (the constant too) and its subprocesses."""
        from huggingface_hub import constants

        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def go_online(self, monkeypatch) -> None:
        from huggingface_hub import constants

        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    # ------------------------------------------------------------------ internals used by the handler
    def _repo_or_raise(self, repo_id: str) -> _Repo:
        if repo_id not in self.repos:
            raise KeyError(f"loopback hub: unknown repo {repo_id!r}")
        return self.repos[repo_id]

    @staticmethod
    def _resolve(repo: _Repo, rev: str) -> str | None:
        if rev in repo.branches:
            return repo.branches[rev]
        if rev in repo.tags:
            return repo.tags[rev]
        for prefix, table in (("refs/heads/", repo.branches), ("refs/tags/", repo.tags)):
            if rev.startswith(prefix) and rev[len(prefix):] in table:
                return table[rev[len(prefix):]]
        if _SHA.match(rev) and rev in repo.commits:
            return rev
        if re.fullmatch(r"[0-9a-f]{7,39}", rev):  # a short commit id
            hits = [s for s in repo.commits if s.startswith(rev)]
            if len(hits) == 1:
                return hits[0]
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


# ====================================================================== the request handler


def _model_info(hub: LoopbackHub, repo: _Repo, sha: str, *, blobs: bool = False, config: bool = True,
                full: bool = True) -> dict:
    c = repo.commits[sha]
    cfg: dict = {}
    if "config.json" in c.files:
        try:
            raw = json.loads(c.files["config.json"].data)
            cfg = {k: raw[k] for k in ("architectures", "model_type") if k in raw}
        except ValueError:
            cfg = {}
    archs = cfg.get("architectures") or []
    tag = repo.pipeline_tag
    if tag is None and archs:
        a = archs[0]
        tag = ("fill-mask" if a.endswith("ForMaskedLM") else
               "text-generation" if a.endswith(("ForCausalLM", "LMHeadModel")) else "feature-extraction")
    tags = ["transformers"] + ([cfg["model_type"]] if "model_type" in cfg else []) + \
        (["safetensors"] if any(n.endswith(".safetensors") for n in c.files) else []) + ([tag] if tag else [])
    info: dict[str, Any] = {
        "_id": hashlib.sha1(repo.id.encode()).hexdigest()[:24], "id": repo.id, "modelId": repo.id,
        "author": repo.author, "sha": sha, "lastModified": _iso(c.date), "createdAt": _iso(repo.created),
        "private": repo.private, "gated": "manual" if repo.gated else False, "disabled": False,
        "downloads": 0, "likes": 0, "library_name": "transformers", "tags": tags, "pipeline_tag": tag,
    }
    if config:
        info["config"] = cfg
    if full:
        sib = []
        for name, b in sorted(c.files.items()):
            s: dict[str, Any] = {"rfilename": name}
            if blobs:
                s.update(size=len(b.data), blobId=b.oid)
                if b.lfs:
                    s["lfs"] = {"sha256": b.sha256, "size": len(b.data), "pointerSize": 134}
            sib.append(s)
        info["siblings"] = sib
        info["spaces"] = []
        info["usedStorage"] = sum(len(b.data) for b in c.files.values())
    return info


def _tree(repo: _Repo, sha: str, path: str, recursive: bool) -> list[dict]:
    files = repo.commits[sha].files
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    if prefix and not any(n.startswith(prefix) for n in files):
        raise _HubError(404, f"Entry not found: {path}", "EntryNotFound")
    out: dict[str, dict] = {}
    for name, b in sorted(files.items()):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        parts = rest.split("/")
        for i in range(1, len(parts)):  # folders on the way
            folder = prefix + "/".join(parts[:i])
            if (recursive or i == 1) and folder not in out:
                out[folder] = {"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0,
                               "path": folder}
        if recursive or len(parts) == 1:
            e: dict[str, Any] = {"type": "file", "oid": b.oid, "size": len(b.data), "path": name}
            if b.lfs:
                e["lfs"] = {"oid": b.sha256, "size": len(b.data), "pointerSize": 134}
            out[name] = e
    return [out[k] for k in sorted(out)]


def _make_handler(hub: LoopbackHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "loopback-hub/1"

        def log_message(self, *args):  # quiet
            pass

        def setup(self):
            super().setup()
            with hub.lock:
                hub._conns.add(self.connection)

        def finish(self):
            try:
                super().finish()
            finally:
                with hub.lock:
                    hub._conns.discard(self.connection)

        # -------------------------------------------------------------- plumbing
        def _log(self, status: int, sent: int, user: str | None) -> HubRequest:
            rec = HubRequest(self.command, self.path, status, sent, user)
            with hub.lock:
                hub.requests.append(rec)
            return rec

        def _send(self, status: int, body: bytes, headers: Mapping[str, str], user: str | None,
                  *, throttle: bool = False) -> None:
            rec = self._log(status, 0, user)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            sent = 0
            if self.command != "HEAD" and body:
                try:
                    for i in range(0, len(body), hub.CHUNK):
                        chunk = body[i:i + hub.CHUNK]
                        if throttle:
                            hub._bucket.take(len(chunk), hub.throttle_bps)
                        self.wfile.write(chunk)
                        sent += len(chunk)
                        rec.sent = sent
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        def _json(self, status: int, obj: Any, user: str | None, headers: Mapping[str, str] | None = None) -> None:
            body = json.dumps(obj).encode("utf-8")
            self._send(status, body, {"Content-Type": "application/json; charset=utf-8", **(headers or {})}, user)

        def _error(self, e: _HubError, user: str | None) -> None:
            headers = {"X-Error-Message": e.message, **e.headers}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._json(e.status, {"error": e.message}, user, headers)

        def _fault(self) -> bool:
            path = urllib.parse.urlsplit(self.path).path
            with hub.lock:
                f = next((f for f in hub.faults if f.matches(self.command, path)), None)
                if f is not None:
                    f.hits += 1
            if f is None:
                return False
            if f.delay:
                time.sleep(f.delay)
            if f.status == "reset":
                self._log(0, 0, None)
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return True
            if f.status in (None, "", 0):
                return False  # a pure delay
            status = int(f.status)
            phrase = {429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
                      503: "Service Unavailable", 504: "Gateway Timeout"}.get(status, "Error")
            headers = {"Retry-After": str(f.retry_after)} if f.retry_after is not None else {}
            self._json(status, {"error": phrase}, None, headers)
            return True

        def _user(self) -> str | None:
            auth = self.headers.get("Authorization") or ""
            if not auth:
                return None
            token = auth.split(" ", 1)[1].strip() if " " in auth else auth.strip()
            with hub.lock:
                user = hub.tokens.get(token)
            if user is None:
                raise _HubError(401, "Invalid credentials in Authorization header")
            return user

        def _repo(self, repo_id: str, user: str | None, *, files: bool) -> _Repo:
            with hub.lock:
                repo = hub.repos.get(repo_id)
            visible = repo is not None and (not repo.private or user in repo.readers or user == repo.author)
            if not visible:
                # the Hub does not tell a missing repository from a private one
                raise _HubError(401 if user is None else 404, "Repository not found", "RepoNotFound")
            if files and repo.gated and not (user in repo.readers or user == repo.author):
                if user is None:
                    raise _HubError(401, f"Access to model {repo_id} is restricted. You must have access to it "
                                         "and be authenticated to access it. Please log in.", "GatedRepo")
                raise _HubError(403, f"Access to model {repo_id} is restricted and you are not in the authorized "
                                     f"list. Visit {hub.endpoint}/{repo_id} to ask for access.", "GatedRepo")
            return repo

        @staticmethod
        def _rev(repo: _Repo, rev: str) -> str:
            with hub.lock:
                sha = hub._resolve(repo, rev)
            if sha is None:
                raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
            return sha

        def _paged(self, items: list, query: dict, user: str | None, limit: int | None = None) -> None:
            start = int(query.get("cursor", ["0"])[0] or 0)
            size = hub.page_size
            total = len(items) if limit is None else min(len(items), limit)
            page = items[start:min(total, start + size)]
            headers = {}
            if start + size < total:
                q = {k: v[0] for k, v in query.items()}
                q["cursor"] = str(start + size)
                split = urllib.parse.urlsplit(self.path)
                headers["Link"] = f'<{hub.endpoint}{split.path}?{urllib.parse.urlencode(q)}>; rel="next"'
            self._json(200, page, user, headers)

        # -------------------------------------------------------------- routes
        def do_HEAD(self):  # noqa: N802
            self._dispatch()

        def do_GET(self):  # noqa: N802
            self._dispatch()

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            self._dispatch()

        def _dispatch(self) -> None:
            if self._fault():
                return
            user = None
            try:
                user = self._user()
                split = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(split.query)
                parts = [urllib.parse.unquote(p) for p in split.path.split("/") if p]
                if parts[:2] == ["api", "models"] and self.command in ("GET", "HEAD"):
                    return self._api_models(parts[2:], query, user)
                if parts[:2] == ["api", "whoami-v2"]:
                    if user is None:
                        raise _HubError(401, "Invalid credentials in Authorization header")
                    return self._json(200, {"type": "user", "name": user, "auth": {"type": "access_token"}}, user)
                if len(parts) >= 5 and parts[2] == "resolve" and self.command in ("GET", "HEAD"):
                    return self._resolve_file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), user)
                self._no_route()
            except _HubError as e:
                self._error(e, user)

        def _no_route(self):
            with hub.lock:
                hub.unrouted.append(f"{self.command} {self.path}")
            raise _HubError(404, f"no route for {self.command} {urllib.parse.urlsplit(self.path).path}")

        def _api_models(self, rest: list[str], query: dict, user: str | None) -> None:
            if not rest:  # listing
                author = query.get("author", [None])[0]
                search = (query.get("search", [""])[0] or "").lower()
                limit = int(query["limit"][0]) if "limit" in query else None
                with hub.lock:
                    repos = [r for _, r in sorted(hub.repos.items())
                             if (author is None or r.author == author) and search in r.id.lower()
                             and (not r.private or user in r.readers or user == r.author)]
                    full = "full" in query
                    items = [_model_info(hub, r, r.branches.get("main") or next(iter(r.branches.values())),
                                         config="config" in query or full, full=full) for r in repos]
                return self._paged(items, query, user, limit)
            if len(rest) < 2:
                self._no_route()
            repo_id, tail = "/".join(rest[:2]), rest[2:]
            repo = self._repo(repo_id, user, files=False)
            if not tail or (tail[0] == "revision" and len(tail) == 2):
                sha = self._rev(repo, tail[1] if tail else "main")
                return self._json(200, _model_info(hub, repo, sha, blobs="blobs" in query), user)
            if tail[0] == "tree" and len(tail) >= 2:
                sha = self._rev(repo, tail[1])
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                with hub.lock:
                    entries = _tree(repo, sha, "/".join(tail[2:]), recursive)
                return self._paged(entries, query, user)
            if tail[0] == "commits" and len(tail) == 2:
                sha = self._rev(repo, tail[1])
                out = []
                with hub.lock:
                    while sha is not None:
                        c = repo.commits[sha]
                        out.append({"id": c.sha, "title": c.title, "message": "", "date": _iso(c.date),
                                    "authors": [{"user": c.author}]})
                        sha = c.parent
                return self._paged(out, query, user)
            if tail == ["refs"]:
                with hub.lock:
                    return self._json(200, {
                        "branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": s}
                                     for b, s in sorted(repo.branches.items())],
                        "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": s}
                                 for t, s in sorted(repo.tags.items())],
                        "converts": []}, user)
            self._no_route()

        def _resolve_file(self, repo_id: str, rev: str, path: str, user: str | None) -> None:
            repo = self._repo(repo_id, user, files=True)
            sha = self._rev(repo, rev)
            with hub.lock:
                blob = repo.commits[sha].files.get(path)
            if blob is None:
                raise _HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": sha})
            size = len(blob.data)
            headers = {"Content-Type": "application/octet-stream", "X-Repo-Commit": sha,
                       "ETag": f'"{blob.etag}"', "Accept-Ranges": "bytes", "Content-Length": str(size)}
            if blob.lfs:
                headers["X-Linked-Etag"] = f'"{blob.sha256}"'
                headers["X-Linked-Size"] = str(size)
            body, status = blob.data, 200
            rng = self.headers.get("Range")
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
            if m and self.command == "GET":
                start = int(m.group(1))
                end = int(m.group(2)) if m.group(2) else size - 1
                if start >= size:
                    return self._send(416, b"", {"Content-Range": f"bytes */{size}", "Content-Length": "0"}, user)
                body, status = blob.data[start:end + 1], 206
                headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{size}"
                headers["Content-Length"] = str(len(body))
            self._send(status, body, headers, user, throttle=True)

    return Handler


def variant_files(folder: str | os.PathLike, seed: int, scale: float = 0.02) -> dict[str, bytes]:
    """The files of a ``save_pretrained`` folder with its weights perturbed, for many distinct
    checkpoints from one tiny model: every floating-point tensor of ``model.safetensors`` plus
    ``scale * N(0, 1)`` noise from ``numpy.random.default_rng(seed)`` (tensors in sorted name
    order; the file's metadata kept). Same seed, same bytes."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save

    root = Path(folder)
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    rng = np.random.default_rng(seed)
    with safe_open(str(root / "model.safetensors"), framework="numpy") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in sorted(f.keys())}
    for k, t in tensors.items():
        if np.issubdtype(t.dtype, np.floating):
            tensors[k] = (t + scale * rng.standard_normal(t.shape)).astype(t.dtype)
    files["model.safetensors"] = save(tensors, metadata=meta)
    return files


# ====================================================================== pytest glue


def use_hub(hub: LoopbackHub, monkeypatch, home: str | os.PathLike) -> Path:
    """Point this process and its children at ``hub``: ``HF_ENDPOINT``, a private ``HF_HOME``
    (``home``) and ``HF_HUB_CACHE`` (``home/hub``), no token, online, no telemetry, progress bars
    off; ``huggingface_hub.constants`` (read at import time) patched to match. Returns the cache."""
    from huggingface_hub import constants

    home = Path(home)
    cache = home / "hub"
    cache.mkdir(parents=True, exist_ok=True)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(cache),
           "HF_XET_CACHE": str(home / "xet"), "HF_ASSETS_CACHE": str(home / "assets"),
           "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_XET": "1",
           "HF_HUB_DISABLE_UPDATE_CHECK": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
              "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_OIDC_ID_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    patch = {"ENDPOINT": hub.endpoint,
             "HUGGINGFACE_CO_URL_TEMPLATE": hub.endpoint + "/{repo_id}/resolve/{revision}/{filename}",
             "HF_HOME": str(home), "HF_HUB_CACHE": str(cache), "HUGGINGFACE_HUB_CACHE": str(cache),
             "HF_ASSETS_CACHE": str(home / "assets"), "HF_XET_CACHE": str(home / "xet"),
             "HF_TOKEN_PATH": str(home / "token"), "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
             "HF_HUB_OFFLINE": False, "HF_HUB_DISABLE_TELEMETRY": True, "HF_HUB_DISABLE_XET": True}
    for k, v in patch.items():
        if hasattr(constants, k):
            monkeypatch.setattr(constants, k, v)
    if hasattr(constants, "HF_URL_HOSTS"):
        monkeypatch.setattr(constants, "HF_URL_HOSTS", frozenset(constants.HF_URL_HOSTS | {hub.host}))
    # shared clients that captured the endpoint when they were created: huggingface_hub's
    # module-level ``api`` (behind list_repo_tree(), model_info() ...) and Transformers' ``hf_api()``
    from huggingface_hub import hf_api

    monkeypatch.setattr(hf_api.api, "endpoint", hub.endpoint)
    t_hub = sys.modules.get("transformers.utils.hub")
    if t_hub is not None and hasattr(t_hub, "_hf_api"):
        monkeypatch.setattr(t_hub, "_hf_api", None)
    return cache


try:
    import pytest
except ImportError:  # pragma: no cover - the command line does not need pytest
    pytest = None

if pytest is not None:
    @pytest.fixture(name="hub")
    def hub_fixture(tmp_path, monkeypatch):
        """A started :class:`LoopbackHub` with this process pointed at it (see :func:`use_hub`);
        ``hub.cache`` is the private Hugging Face cache."""
        h = LoopbackHub().start()
        try:
            h.cache = use_hub(h, monkeypatch, tmp_path / "hf-home")
            yield h
        finally:
            h.stop()
            _close_client_sessions()


def _close_client_sessions() -> None:
    """Drop ``huggingface_hub``'s pooled connections (they point at a stopped hub)."""
    try:
        from huggingface_hub.utils import _http

        _http.close_session()
    except (ImportError, AttributeError):  # pragma: no cover - other huggingface_hub versions
        pass


# ====================================================================== command line


def serve_folder(root: str | os.PathLike, **kw) -> LoopbackHub:
    """A started hub serving every ``root/<org>/<name>/`` folder as repository ``org/name``."""
    h = LoopbackHub(**kw)
    for org in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        for repo in sorted(p for p in org.iterdir() if p.is_dir()):
            h.add_repo(f"{org.name}/{repo.name}", repo)
    return h.start()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Serve ROOT/<org>/<name>/ folders as a loopback Hugging Face Hub.")
    ap.add_argument("root")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--throttle", type=float, default=None, help="bytes per second for file bodies")
    a = ap.parse_args(argv)
    h = serve_folder(a.root, port=a.port, throttle_bps=a.throttle)
    print(f"HF_ENDPOINT={h.endpoint}  ({len(h.repos)} repositories)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        h.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
