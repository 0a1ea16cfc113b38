"""Ordering of names as people read them."""

from __future__ import annotations

import re

_DIGITS_RE = re.compile(r"(\d+)")


def natural_key(name: object) -> list[int | str]:
    """A sort key that orders the digit runs of a name by value: ``weat2`` < ``weat10``,
    ``de/cw9`` < ``de/cw10`` (``sorted(names, key=natural_key)``). Text parts compare as
    strings (case-sensitive); ``name`` is converted with ``str``."""
    return [int(p) if p.isdigit() else p for p in _DIGITS_RE.split(str(name))]


__all__ = ["natural_key"]
