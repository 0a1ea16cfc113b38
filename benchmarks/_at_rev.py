"""One of the project's modules as it was at a git revision, imported beside today's (the
baseline of a benchmark's ``--vs REV``). The old module's own imports resolve to this tree, so
it must not need anything this tree has since removed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def module_at(rev: str, path: str, *, who: str) -> ModuleType:
    """The module at ``path`` (relative to the repository root, e.g. ``jobs/report.py``) as it was at
    git revision ``rev``, as a module of its own; ``who`` names the benchmark in the one-line error
    (an unknown revision or a path it lacks)."""
    r = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{who}: --vs {rev}: {r.stderr.strip() or 'git show failed'}")
    name = path.removesuffix(".py").replace("/", ".") + "_at_rev"  # one name per module, beside it
    file = Path(tempfile.mkdtemp()) / f"{name.rsplit('.', 1)[-1]}.py"
    file.write_text(r.stdout, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, file)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # where dataclasses and pickling look the module up
    spec.loader.exec_module(mod)
    return mod
