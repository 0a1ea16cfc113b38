"""User-facing errors.

Every error raised for bad input is an :class:`AuditError` whose message names the culprit:
the file, the field, the word or the parameter. The command line prints the message alone
(no traceback) and exits with status 2; a sweep records it as the task's failure reason.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable

_COLOUR = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # a terminal's colour codes (Ray colours its task names)
_MARKS = re.compile(r"^[\s^~]+$")             # a traceback's ``^^^^`` lines under the source


class AuditError(Exception):
    """Base class of every error caused by the user's input or environment."""


class ParameterError(AuditError, ValueError):
    """A metric or command parameter is invalid (names the parameter and the value)."""


class DataError(AuditError, ValueError):
    """A test-definition, word-list, template or sentence file is malformed (names file and field)."""


class ModelError(AuditError):
    """A model cannot be loaded or cannot serve the request (names the model reference)."""


class CoverageError(AuditError):
    """Too many words of a word set are missing from the model's vocabulary (names the words)."""


class UnsafeModelError(ModelError):
    """A model would need pickle or remote code, and the spec does not allow it for that model."""


def one_line(e: BaseException | str) -> str:
    """An error message as the one line a command prints: its whitespace (a YAML parser's
    ``in "<unicode string>"`` continuation, a wrapped message) collapsed to single spaces. A
    Python traceback inside the message (Ray's ``ActorDiedError`` of a worker whose constructor
    raised carries the worker's) keeps only what is not a frame: its ``Traceback (most recent
    call last):`` header, its ``File "..."`` lines with the indented source under each and the
    ``^^^`` marker lines are dropped, so its last line, the exception raised, remains; terminal
    colour codes are dropped."""
    kept, frame = [], False
    for line in _COLOUR.sub("", str(e)).splitlines():
        s = line.strip()
        if not s or _MARKS.match(line) or s.startswith("Traceback (most recent call last)"):
            continue
        if s.startswith('File "'):
            frame = True
            continue
        if frame and line[:1].isspace():
            continue  # a frame's source line
        frame = False
        kept.append(s)
    return " ".join(" ".join(kept).split()) or type(e).__name__


def suggest(word: object, choices: Iterable[object], *, cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (:func:`difflib.get_close_matches`,
    ``cutoff`` 0.6 by default), else ``""``: appended to an "unknown ..." message; the one rule of
    every refusal of an unknown name (metric, backend, spec field, word of a template)."""
    near = difflib.get_close_matches(str(word), sorted(str(c) for c in choices), n=1, cutoff=cutoff)
    return f" (did you mean {near[0]!r}?)" if near else ""
