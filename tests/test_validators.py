"""The shared spec validators (jobs/validators.py), tracking URIs (jobs/uris.py), natural order
(audit/naming.py), and the import rules of the spec and watch modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from audit import schema
from audit.errors import DataError, ParameterError
from audit.naming import natural_key
from jobs import validators as V
from jobs.uris import default_tracking_uri, redact_uri, resolve_tracking_uri, store_identity, tracking_uri_problem

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def test_shared_field_types_name_file_and_field_and_pick_the_error_class():
    ctx = V.Ctx("w.yaml")
    with pytest.raises(DataError, match=r"^<spec>: expected a mapping, got list \[1\]$"):
        V.mapping(V.Ctx(""), "", [1])
    with pytest.raises(DataError, match=r"^w\.yaml: x: keys must be strings, got 1$"):
        V.mapping(ctx, "x", {1: "a"})
    with pytest.raises(ParameterError, match=r"^w\.yaml: name: 'a b': use letters, digits, '-', '_' and '\.' only$"):
        schema.check(V.Name, "a b", "w.yaml", "name")
    with pytest.raises(ParameterError,
                       match=r"^w\.yaml: name: 'a b': use letters, digits, '-', '_', '\.' and '\+' only$"):
        schema.check(V.DerivedName, "a b", "w.yaml", "name")
    assert schema.check(V.DerivedName, "glove+hd") == "glove+hd"
    assert schema.check(V.Strings, "weat1") == ("weat1",)
    assert not V.given("  ") and not V.given(None) and V.given(0)
    with pytest.raises(DataError, match=r"^w\.yaml: p\.k: expected a finite number, got nan$"):
        schema.check(V.PlainValues, {"k": float("nan")}, "w.yaml", "p")
    with pytest.raises(DataError, match=r"p\.k: value \[inf\] is not a plain number"):
        schema.check(V.PlainValues, {"k": [float("inf")]}, "w.yaml", "p")
    assert V.suggest("waet", ["weat", "seat"]) == " (did you mean 'weat'?)" and V.suggest("zzz", ["weat"]) == ""


def test_read_yaml_refuses_duplicates_and_names_the_file(tmp_path):
    p = tmp_path / "w.yaml"
    p.write_text("a: 1\nb:\n  c: 2\n  c: 3\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"w\.yaml: malformed YAML at line 4, column 3: duplicate key 'c'"):
        V.read_yaml(p)
    with pytest.raises(DataError, match=r"nope\.yaml: watch spec not found"):
        V.read_yaml(tmp_path / "nope.yaml", what="watch spec")
    with pytest.raises(DataError, match=r"^\$X: malformed YAML at line 1"):
        V.parse_yaml("a: [1", "$X")


def test_expand_env_takes_an_environment_and_never_interpolates_secrets():
    env = {"DATA": "/d", "EMPTY": "", "HF_TOKEN": "hf_x", "DB_PASSWORD": "pw"}
    data = {"a": "${DATA}/x", "b": ["${EMPTY:-dflt}", "${UNSET:-u}"], "tracking": {"uri": "postgresql://u:${DB_PASSWORD}@h/db"}}
    assert V.expand_env(data, "s.yaml", env=env) == {"a": "/d/x", "b": ["dflt", "u"],
                                                     "tracking": {"uri": "postgresql://u:pw@h/db"}}
    for var in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "DB_PASSWORD", "MY_CREDENTIALS"):
        assert V.is_secret_name(var)
        with pytest.raises(DataError, match=rf"^s\.yaml: a\.b: \$\{{{var}\}} looks like a secret"):
            V.expand_env({"a": {"b": f"${{{var}:-x}}"}}, "s.yaml", env=env)
    assert not V.is_secret_name("TOKENIZERS_PARALLELISM") and not V.is_secret_name("BIASAUDIT_DATA")
    with pytest.raises(DataError, match=r"^s\.yaml: a: environment variable NOPE is not set \(set NOPE somewhere\)$"):
        V.expand_env({"a": "${NOPE}"}, "s.yaml", env=env, unset_hint="set VAR somewhere")


def test_tracking_uris_redacted_resolved_and_checked(tmp_path):
    assert redact_uri("http://u:p@h:5000/x?token=1") == "http://***@h:5000/x"
    assert redact_uri("sqlite:////a/b.db") == "sqlite:////a/b.db"
    assert store_identity("postgresql://u:p@db:5432/m?sslmode=require") == "postgresql://db:5432/m"
    assert store_identity("http://h:5000/") == store_identity("http://h:5000")
    d = default_tracking_uri(tmp_path)
    assert d == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert resolve_tracking_uri(None, tmp_path, env={}) == d
    assert resolve_tracking_uri(None, tmp_path, env={"MLFLOW_TRACKING_URI": " "}) == d
    assert resolve_tracking_uri(None, tmp_path, env={"MLFLOW_TRACKING_URI": "http://e"}) == "http://e"
    assert resolve_tracking_uri("http://s", tmp_path, env={"MLFLOW_TRACKING_URI": "http://e"}) == "http://s"
    assert tracking_uri_problem("postgresql+psycopg2://u:p@h/db") is None
    assert tracking_uri_problem("file:///u:secret@x").startswith("'file:///u:secret@x': use sqlite:///")
    assert "secret" not in tracking_uri_problem("s3://u:secret@bucket/x")


def test_natural_key_orders_digit_runs_by_value():
    names = ["weat10", "weat2", "de/cw10", "weat1", "de/cw9", "seat", 7]
    assert sorted(map(str, names), key=natural_key) == ["7", "de/cw9", "de/cw10", "seat", "weat1", "weat2", "weat10"]
    assert natural_key("a01b") == ["a", 1, "b"]


# --------------------------------------------------------------------------------------
# Import rules of the modules owned here (the project-wide check is the integrator's)
# --------------------------------------------------------------------------------------

_MODULES = sorted([REPO / "jobs" / "spec.py", REPO / "jobs" / "validators.py", REPO / "jobs" / "uris.py",
                   REPO / "audit" / "naming.py", *(REPO / "jobs" / "watch").glob("*.py")])
_PROJECT = ("audit", "jobs", "actors")
_LAZY_OK = ("ray", "mlflow", "torch", "transformers", "huggingface_hub")


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node, a.name, [a.name]
        elif isinstance(node, ast.ImportFrom):
            yield node, node.module or "", [a.name for a in node.names]


@pytest.mark.parametrize("path", _MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_project_imports_at_module_top_lazy_only_for_heavy_packages(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    for node, module, names in _imports(tree):
        root = module.split(".")[0]
        if id(node) not in top:
            assert root in _LAZY_OK, f"{path.name}:{node.lineno}: function-level import of {module}"
        if root in _PROJECT:
            assert not any(n.startswith("_") for n in names), f"{path.name}:{node.lineno}: private name from {module}"
        if path.name == "spec.py" and path.parent.name == "jobs":
            assert module != "jobs.plan" and not (module == "jobs" and "plan" in names), "jobs.spec imports jobs.plan"


def test_python_m_jobs_watch_and_audit_watch_share_main():
    import jobs.watch as W
    from jobs.watch.cli import main

    assert W.main is main and (REPO / "jobs" / "watch" / "__main__.py").is_file()
    assert not (REPO / "jobs" / "watch.py").exists()


def test_one_copy_of_each_shared_rule():
    """The spec and watch modules define none of the shared validators, tracking-URI helpers or
    the natural sort key themselves (they drifted when they did)."""
    import jobs.uris

    shared = set(V.__all__) | set(jobs.uris.__all__) | {"natural_key", "_natural", "_expand_vars", "_close",
                                                        "_num", "_number", "_str", "_int", "_mapping", "_params"}
    for path in _MODULES:
        if path.name in ("validators.py", "uris.py", "naming.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & shared, f"{path.relative_to(REPO)} defines {sorted(defined & shared)}"
