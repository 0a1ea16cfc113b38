"""MLflow tracking URIs: which one a sweep or a watcher uses, which ones are accepted, and how
one is printed.

One rule, one place: the sweep spec (:mod:`jobs.spec`), the watch spec (:mod:`jobs.watch`), the
tracker and the write-ahead log all use these functions.

Precedence of the tracking URI (:func:`resolve_tracking_uri`), highest first:

1. the command line's ``--tracking-uri`` (``audit run``, ``audit watch``, ``audit sync``; it
   replaces the spec's ``tracking.uri`` when the spec is loaded);
2. the spec's ``tracking.uri``;
3. the environment variable ``MLFLOW_TRACKING_URI`` (MLflow's own convention), read when the URI
   is resolved, i.e. in the process that runs the sweep (a Ray job: the job's environment);
4. ``sqlite:///<output_dir>/mlflow.db`` (:func:`default_tracking_uri`).

An empty value (``tracking.uri: ""`` after ``${MLFLOW_TRACKING_URI:-}``, or an empty variable)
counts as not set.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping

#: The environment variable MLflow reads for its tracking URI.
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"

#: Schemes of the tracking stores MLflow 3 accepts (the plain file store is refused by MLflow 3).
_TRACKING_SCHEME_RE = re.compile(r"^(sqlite|postgresql|mysql|mssql|https?|databricks)(\+\w+)?:")


def redact_uri(uri: str) -> str:
    """A URI safe to print or log: user, password or token in ``scheme://user:secret@host``
    become ``***`` (``http://u:p@h:5000`` -> ``http://***@h:5000``); query strings are dropped."""
    s = re.sub(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@", r"\1***@", str(uri))
    return s.split("?", 1)[0]


def default_tracking_uri(output_dir: str | os.PathLike) -> str:
    """The SQLite MLflow store of an output directory (the file store is refused by MLflow 3)."""
    return "sqlite:///" + str((Path(output_dir) / "mlflow.db").resolve())


def resolve_tracking_uri(spec_uri: str | None, output_dir: str | os.PathLike,
                         env: Mapping[str, str] | None = None) -> str:
    """The tracking URI a sweep or watcher uses: ``spec_uri`` (the spec's ``tracking.uri``, or
    the ``--tracking-uri`` flag that replaced it), else ``$MLFLOW_TRACKING_URI`` from ``env``
    (default :data:`os.environ`), else :func:`default_tracking_uri` of ``output_dir``."""
    if spec_uri:
        return spec_uri
    from_env = (os.environ if env is None else env).get(TRACKING_URI_ENV, "").strip()
    return from_env or default_tracking_uri(output_dir)


def tracking_uri_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a tracking store (one clause to put after the field name), or
    ``None`` when its scheme is one MLflow 3 accepts."""
    if _TRACKING_SCHEME_RE.match(uri):
        return None
    return (f"{redact_uri(uri)!r}: use sqlite:///path/to/mlflow.db, a database URI or an http(s):// MLflow "
            "server (the file store is not supported by MLflow 3)")


def store_identity(uri: str) -> str:
    """The tracking store a URI names, without its credentials or query: two URIs that differ
    only there name the same store (used in the watcher's submission ids)."""
    s = re.sub(r"^([a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@]*@", r"\1", str(uri))
    return s.split("?", 1)[0].rstrip("/")


__all__ = ["TRACKING_URI_ENV", "redact_uri", "default_tracking_uri", "resolve_tracking_uri",
           "tracking_uri_problem", "store_identity"]
