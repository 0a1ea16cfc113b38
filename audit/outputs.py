"""Output paths checked before any work: one rule for every command that writes (``audit score
--items``, a sweep's ``output_dir``, the watcher's directories).

:func:`output_dir_problem` and :func:`output_file_problem` only look (a dry run uses them);
:func:`ensure_output_dir` also creates the directory and writes a probe file in it, so a path
that looks fine but cannot be written (``/proc/...``, a read-only mount, a full disk) is refused
before a model loads, with one line naming the path, instead of a traceback after the work.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

from audit.errors import ParameterError


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q.parent != q:
        q = q.parent
    return q


def output_dir_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot become a writable directory (without creating anything), or ``None``:
    it, or the nearest of its ancestors that exists, is not a directory or is not writable."""
    p = Path(path).expanduser()
    q = _nearest_existing(p)
    if not q.is_dir():
        return f"{p} is not a directory" if q == p else f"{q} is a file, so {p} cannot be a directory under it"
    if not os.access(q, os.W_OK | os.X_OK):
        return f"{q} is not writable" + (f" (so {p} cannot be created)" if q != p else "")
    return None


def output_file_problem(path: str | os.PathLike, suffixes: Sequence[str] = ()) -> str | None:
    """Why a file cannot be written at ``path`` (without creating anything), or ``None``: a
    name without one of ``suffixes``, a directory there, an existing file that is not
    writable, or a folder that cannot be made or written (:func:`output_dir_problem`)."""
    p = Path(path).expanduser()
    if suffixes and p.suffix.lower() not in suffixes:
        return f"{p}: use a file name ending in {' or '.join(suffixes)}"
    if p.is_dir():
        return f"{p} is a directory; give a file name"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{p} exists and is not writable"
    return output_dir_problem(p.parent)


def ensure_output_dir(path: str | os.PathLike, what: str) -> Path:
    """Create ``path`` (with its parents) and write and remove a probe file in it; a
    :class:`ParameterError` naming ``what`` and the path when that fails."""
    p = Path(path).expanduser()
    problem = output_dir_problem(p)
    if problem is None:
        try:
            p.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=p, prefix=".write-probe-"):
                pass
        except OSError as e:
            problem = f"{p} cannot be written: {e.strerror or type(e).__name__}"
    if problem:
        raise ParameterError(f"{what}: {problem}")
    return p


def check_output_file(path: str | os.PathLike, what: str, suffixes: Sequence[str] = ()) -> Path:
    """:func:`output_file_problem` as a :class:`ParameterError` naming ``what``; creates the
    file's folder (and probes it, :func:`ensure_output_dir`) so that the later write cannot fail
    on the folder."""
    problem = output_file_problem(path, suffixes)
    if problem:
        raise ParameterError(f"{what}: {problem}")
    p = Path(path).expanduser()
    ensure_output_dir(p.parent, what)
    return p


__all__ = ["output_dir_problem", "output_file_problem", "ensure_output_dir", "check_output_file", "write_text_atomic",
           "write_atomic", "cache_dir", "private_folder"]


def cache_dir() -> Path:
    """Where biasaudit keeps what it computed between processes (listings' sizes, parsed data
    files, the migrated MLflow schema): ``$BIASAUDIT_CACHE``, default ``$XDG_CACHE_HOME/biasaudit``
    (``~/.cache/biasaudit``)."""
    env = os.environ.get("BIASAUDIT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "biasaudit"


def private_folder(root: str | os.PathLike) -> bool:
    """Whether ``root`` can hold what only this user may have written (built models, pickled
    tables): created here (mode 0755, parents as needed) if missing, else a real folder (not a
    link) owned by this user and writable by nobody else."""
    root = Path(root)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        root.mkdir(mode=0o755, exist_ok=False)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = root.lstat()
    except OSError:
        return False
    others_write = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not others_write


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so that a reader in any process sees the old content or
    the whole new one, never a half-written file (:func:`write_atomic`, as ``Path.write_text``
    would write it)."""
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_atomic(path: str | os.PathLike, fill: Callable[[Path], Any]) -> Path:
    """``fill(tmp)`` writes a file at ``tmp``, a temporary path in the directory of ``path``
    (unique per process and thread), which then replaces ``path`` (:func:`os.replace`): a reader in
    any process sees the old file or the whole new one. The parent directory is created.
    ``OSError`` (and whatever ``fill`` raises) propagates; the temporary file is removed on failure."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fill(tmp)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    return p
