"""The layering rules of docs/architecture.md, checked on the source (ast, no import of the code):

1. ``audit/`` (the pure core) imports nothing of ``jobs``, ``actors``, ``ray`` or ``mlflow``, at
   module level or inside functions;
2. no import cycles among the project's modules (imports anywhere in a module count);
3. the project's own modules are imported at module top: a function-level import is allowed only
   for heavy third-party packages;
4. no registered metric name is spelled as a string literal outside the registry, its own
   modules (``audit/*/<name>.py``) and the tests;
5. the measure families (``audit/measure/``) reach models only through the model interface
   (:class:`audit.backends.base.LanguageModel`): they import no torch or transformers and never
   read a ``.model`` or ``.tokenizer`` attribute.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("audit", "actors", "jobs")
FORBIDDEN_IN_CORE = ("jobs", "actors", "ray", "mlflow")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(path: Path, root: Path = ROOT) -> list[tuple[str, bool, int]]:
    """(imported module, at module level?, line) for every import of a file; ``from x import y``
    counts as ``x.y`` when that is a module of the project, else ``x``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    # statements under a module-level `if TYPE_CHECKING:` or try/except count as module level
    for n in tree.body:
        if isinstance(n, (ast.If, ast.Try)):
            for sub in ast.walk(n):
                top.add(id(sub))
    pkg_parts = list(path.relative_to(root).with_suffix("").parts)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.name, id(node) in top, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                full = f"{mod}.{a.name}"
                out.append((full if full in MODULES else mod, id(node) in top, node.lineno))
    return out


def _project(mod: str) -> str | None:
    """The project module an import refers to (the longest known prefix), or None."""
    parts = mod.split(".")
    while parts:
        name = ".".join(parts)
        if name in MODULES:
            return name
        parts.pop()
    return None


def test_core_imports_no_service_layer():
    bad = []
    for name, path in MODULES.items():
        if not name.startswith("audit"):
            continue
        for mod, _, line in _imports(path):
            if mod.split(".")[0] in FORBIDDEN_IN_CORE:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        for mod, _, _ in _imports(path):
            target = _project(mod)
            if target and target != name and not name.startswith(target + "."):
                g[name].add(target)
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(MODULES):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_project_modules_imported_at_module_top():
    bad = []
    for name, path in MODULES.items():
        for mod, at_top, line in _imports(path):
            if not at_top and _project(mod):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod} inside a function")
    assert not bad, f"{len(bad)} function-level imports of project modules:\n" + "\n".join(bad)


#: Constants of a data format whose value happens to be a metric's name: the native format's
#: template uses (``templates.seat``, ``templates.lpbs``), defined once.
FORMAT_VOCABULARY = {("audit/datasets/templates.py", "SEAT_USE"), ("audit/datasets/templates.py", "LPBS_USE")}


def _string_constants(path: Path) -> list[tuple[str, int]]:
    """String literals of a module, docstrings, ``__all__`` and format-vocabulary constants left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set()
    rel = str(path.relative_to(ROOT))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "__all__" or (rel, name) in FORMAT_VOCABULARY:
                skip.update(id(n) for n in ast.walk(node.value))
    return [(n.value, n.lineno) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


def _defines(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def metric_literals_outside_their_modules() -> list[str]:
    """Every string literal equal to a registered metric name (or a name results record) in a
    project module other than the registry and the metric's own modules: the files named after
    it and the module defining its array-level function of the same name."""
    from audit import registry

    recorded = {v: n for n, e in registry.METRICS.items() for v in e.result_names.values()}
    names = set(registry.names()) | set(recorded)
    found = []
    for name, path in MODULES.items():
        if name == "audit.registry":
            continue
        own = {path.stem} | _defines(path)
        for value, line in _string_constants(path):
            if value in names and value not in own and recorded.get(value) not in own:
                found.append(f"{path.relative_to(ROOT)}:{line}: {value!r}")
    return found


def test_no_metric_name_literals_outside_their_modules():
    found = metric_literals_outside_their_modules()
    assert not found, f"{len(found)} metric names spelled outside their modules:\n" + "\n".join(found)


@pytest.mark.parametrize("rule", ["audit", "cycle"])
def test_the_checks_catch_violations(tmp_path, monkeypatch, rule):
    """The checks are not vacuous: a planted violation is reported."""
    pkg = tmp_path / "audit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    if rule == "audit":
        (pkg / "a.py").write_text("def f():\n    import ray\n")
        assert any(m == "ray" and not top for m, top, _ in _imports(pkg / "a.py", tmp_path))
    else:
        g = {"audit.a": {"audit.b"}, "audit.b": {"audit.a"}, "audit.c": {"audit.a"}}
        monkeypatch.setattr(__import__(__name__), "MODULES", {"audit.a": 1, "audit.b": 1, "audit.c": 1})
        assert _cycles(g) == [["audit.a", "audit.b"]]


ENGINE_PACKAGES = ("torch", "transformers", "sentence_transformers", "vllm")


def interface_violations(path: Path) -> list[str]:
    """Imports of an engine package and ``.model``/``.tokenizer`` reads in a measure module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = [f"{path.name}:{line}: imports {mod}" for mod, _, line in _imports(path, path.parent)
           if mod.split(".")[0] in ENGINE_PACKAGES]
    out += [f"{path.name}:{n.lineno}: reads .{n.attr}" for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and n.attr in ("model", "tokenizer")]
    return out


def test_measure_families_use_only_the_model_interface():
    found = [v for p in sorted((ROOT / "audit" / "measure").glob("*.py")) for v in interface_violations(p)]
    assert not found, "measure families bypass the model interface:\n" + "\n".join(found)


def test_the_interface_check_catches_violations(tmp_path):
    (tmp_path / "m.py").write_text("def f(m):\n    import torch\n    return m.tokenizer(m.handle.model)\n")
    assert interface_violations(tmp_path / "m.py") == ["m.py:2: imports torch", "m.py:3: reads .tokenizer",
                                                       "m.py:3: reads .model"]


def _all_undefined(path: Path) -> list[str]:
    """Names a module lists in ``__all__`` that it does not define or import at top level (a
    ``from module import *`` of it would fail)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined, exported = set(), []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                defined |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                if isinstance(t, ast.Name) and t.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                    exported += [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    if path.name == "__init__.py":  # a package's __all__ may name its submodules
        defined |= {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
    return [n for n in exported if n not in defined]


def test_every_name_in___all___exists():
    bad = [f"{mod}: {', '.join(names)}" for mod, p in MODULES.items() if (names := _all_undefined(p))]
    assert not bad, "names in __all__ that the module does not define:\n" + "\n".join(bad)


def test_the___all___check_catches_a_missing_name(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('from x import a\n__all__ = ["a", "f", "gone"]\n\ndef f():\n    pass\n')
    assert _all_undefined(p) == ["gone"]


#: The wordings of hand-written refusals that :mod:`audit.schema` words once (``choice``, ``integer``,
#: ``number``): a choice, a count, a bounded fraction (issue 19, "one validation vocabulary").
HAND_WORDED = re.compile(
    r"(raise (ParameterError|DataError|argparse\.ArgumentTypeError)\(|print\()f?[\"'][^\"']*"
    r"(must be one of|is not one of|must hold one of|must be a positive integer|must be a non-negative|"
    r"must be a number in|must be a finite number|must be (>=|<=|>|<|in \() |expected a (positive|non-negative) )"
    r"|raise (ParameterError|DataError)\(f[\"'][a-z_]+=\{")  # ``seed={seed!r}: expected ...``


def hand_worded_refusals(path: Path) -> list[str]:
    """Lines of ``path`` that raise a ParameterError in a wording :mod:`audit.schema` owns."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.relative_to(path.parents[1])
    return [f"{where}:{n}" for n, line in
            enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if HAND_WORDED.search(line)]


def test_choices_and_counts_are_refused_in_the_schemas_words(tmp_path):
    """Every function argument that is a choice, a count or a bounded number is refused by
    :func:`audit.schema.choice`/``integer``/``number`` (one wording: ``<name>: unknown value 'x'
    (did you mean 'y'?); known: a, b``, ``<name>: must be >= 1, got 0``), not by a sentence of its
    own, the command line's flags included (``--n-bootstrap: must be >= 0, got -1``, printed or raised).
    The rule catches planted ones."""
    files = [p for d in ("audit", "jobs") for p in sorted((ROOT / d).rglob("*.py"))]
    found = [hit for p in files for hit in hand_worded_refusals(p)]
    assert not found, "refusals worded by hand, not by audit.schema:\n" + "\n".join(found)
    bad = tmp_path / "audit" / "x.py"
    bad.parent.mkdir()
    bad.write_text('def f(k):\n    raise ParameterError(f"k: must be one of a, b, got {k!r}")\n'
                   '    print(f"audit: error: --max-polls must be >= 1, got {k}", file=sys.stderr)\n'
                   '    raise ParameterError(f"seed={k!r}: expected a non-negative integer")\n'
                   '    raise ParameterError(f"k: must be >= 1, got {k}")  # the words of audit.schema.integer, by hand\n', encoding="utf-8")
    assert hand_worded_refusals(bad) == ["audit/x.py:2", "audit/x.py:3", "audit/x.py:4", "audit/x.py:5"]
