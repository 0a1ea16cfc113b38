"""Validation of YAML specs, shared by the sweep spec (:mod:`jobs.spec`) and the watch spec
(:mod:`jobs.watch.spec`): one rule, one place. The specs' entries (``models[i]``, ``build``,
``metrics[i]``, ``watch[i]``, the sweep's top level) and sections (``ray:``, ``backoff:`` ...) are
typed models of :mod:`audit.schema`'s vocabulary (pydantic types, one error formatter); the
field types they share (:data:`Name`, :data:`DerivedName`, :data:`Strings`, :data:`PlainValues`)
and the reader of step lists (:func:`steps`) are declared here. No field is checked by hand.

Every check raises an :class:`audit.errors.AuditError` whose message is one line,
``<file>: <field path>: <problem>``:

- :class:`~audit.errors.DataError` for what is malformed: YAML syntax, duplicate keys, bytes that
  are not UTF-8, a value of the wrong type (a string where a number belongs, NaN or infinity
  where a number belongs), an unknown field, a missing field, an environment variable that is not
  set or that holds a secret;
- :class:`~audit.errors.ParameterError` for a value of the right type that is not allowed: out of
  range, an unknown name.

The pieces (all public):

``Ctx(source, default)``                 formats the errors of one file: ``ctx.data(path, msg)``,
                                          ``ctx.param(path, msg)``
``read_yaml(path, what=)``                YAML with line/column in errors and duplicate keys refused
``expand_env(data, source, env=, ...)``   ``${VAR}`` / ``${VAR:-default}`` in every string
``is_secret_name(name)``                  the names ``expand_env`` refuses to interpolate
``suggest(word, choices)``                `` (did you mean 'x'?)`` or ``""``
``Name`` ``DerivedName`` ``Strings``      field types (:mod:`audit.schema` pieces) of both specs' models
``PlainValues``                           (names, derived names, lists of strings, plain JSON values)
``mapping`` ``given``                     a mapping with string keys; a value that is set and not blank
``steps(ctx, path, v, model, key, what)`` a step or a list of steps, each validated as ``model``
``first_line(exc)``                       the first line of an exception's message (:func:`audit.retry.first_line`)
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Mapping

import yaml
from pydantic import AfterValidator, BeforeValidator, Field

from audit import schema
from audit.errors import DataError, ParameterError, suggest  # noqa: F401 (suggest: re-exported)
from audit.retry import first_line  # noqa: F401 (re-exported: one rule, audit.retry)
from jobs.uris import tracking_uri_problem

# --------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------


class Ctx:
    """Formats the errors of one spec file as ``<file>: <field path>: <problem>``.

    source:  the file name (or ``$VAR``, or a description of a generated spec).
    default: what to call the file when ``source`` is empty.
    """

    def __init__(self, source: str, default: str = "<spec>"):
        self.source = source or default

    def _msg(self, path: str, msg: str) -> str:
        return f"{self.source}: {path}: {msg}" if path else f"{self.source}: {msg}"

    def data(self, path: str, msg: str) -> DataError:
        """A malformed field (wrong type, unknown or missing field)."""
        return DataError(self._msg(path, msg))

    def param(self, path: str, msg: str) -> ParameterError:
        """A field whose value is not allowed (out of range, unknown name)."""
        return ParameterError(self._msg(path, msg))


# --------------------------------------------------------------------------------------
# YAML with line numbers and duplicate-key detection
# --------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate mapping keys (PyYAML silently keeps the last)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    loader.flatten_mapping(node)
    out = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in out:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text; malformed YAML and duplicate keys raise :class:`DataError` naming
    ``source``, the line and the column."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        what = e.problem or e.context or str(e)
        raise DataError(f"{source}: malformed YAML at {where}: {what}") from None
    except yaml.YAMLError as e:
        raise DataError(f"{source}: malformed YAML: {e}") from None


def read_yaml(path: str | os.PathLike, *, what: str = "spec file") -> Any:
    """Parse a YAML file; a missing file, a directory, non-UTF-8 bytes, malformed YAML and
    duplicate keys raise :class:`DataError` naming the file (and the line and column)."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise DataError(f"{p}: is a directory, not a {what}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                        "save the file as UTF-8") from None
    return parse_yaml(text, str(p))


# --------------------------------------------------------------------------------------
# Environment variables
# --------------------------------------------------------------------------------------

ENV_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: Variable names that hold credentials: never interpolated into a spec (its values are logged
#: and stored with every sweep), except into :data:`SECRET_OK_FIELDS`.
_SECRET_RE = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?|API_?KEY|PRIVATE_?KEY)(_|$)", re.IGNORECASE)
#: Fields into which a secret may be interpolated: ``tracking.uri`` (a database password), which
#: is only ever printed redacted (:func:`jobs.uris.redact_uri`).
SECRET_OK_FIELDS = frozenset({"tracking.uri"})


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential (``HF_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``, ``OPENAI_API_KEY`` ...)."""
    return bool(_SECRET_RE.search(name))


def expand_env(data: Any, source: str = "", path: str = "", *, env: Mapping[str, str] | None = None,
               unset_hint: str = "write ${VAR:-default} for a default") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of a parsed spec.

    env:        the variables (default :data:`os.environ`; the watcher passes its own plus the
                job's ``runtime_env.env_vars``).
    unset_hint: the advice after "environment variable VAR is not set" (``VAR`` is replaced by
                the variable's name).

    ``${VAR:-default}`` takes the default when ``VAR`` is unset or empty; ``${VAR}`` of an unset
    variable is a :class:`DataError` naming the field; a variable whose name looks like a secret
    (:func:`is_secret_name`) is a :class:`DataError` wherever it appears, except in
    :data:`SECRET_OK_FIELDS` (whether set or not: the spec must not depend on it).
    """
    values = os.environ if env is None else env
    if isinstance(data, Mapping):
        return {k: expand_env(v, source, f"{path}.{k}" if path else str(k), env=values, unset_hint=unset_hint)
                for k, v in data.items()}
    if isinstance(data, list):
        return [expand_env(v, source, f"{path}[{i}]", env=values, unset_hint=unset_hint) for i, v in enumerate(data)]
    if isinstance(data, str) and "${" in data:
        def sub(m: re.Match) -> str:
            var = m.group(1)
            if is_secret_name(var) and path not in SECRET_OK_FIELDS:
                raise Ctx(source).data(path, f"${{{var}}} looks like a secret; specs and their values are stored "
                                             "with every sweep, so secrets cannot be interpolated (hub tokens are "
                                             "read from HF_TOKEN by the libraries that need them)")
            val = values.get(var)
            if val is None or (val == "" and m.group(2) is not None):
                if m.group(2) is None:
                    raise Ctx(source).data(path, f"environment variable {var} is not set "
                                                 f"({unset_hint.replace('VAR', var)})")
                return m.group(2)
            return val

        return ENV_VAR_RE.sub(sub, data)
    return data


# --------------------------------------------------------------------------------------
# Typed fields
# --------------------------------------------------------------------------------------

#: Names of specs and models: letters, digits, ``-``, ``_``, ``.``, not starting with ``-``/``.``.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def mapping(ctx: Ctx, path: str, v: Any) -> dict[str, Any]:
    """A mapping with string keys (a copy): a spec's top level and the sections read before
    their model (their null or blank values dropped first)."""
    if not isinstance(v, Mapping):
        raise ctx.data(path, f"expected a mapping, got {type(v).__name__} {v!r}")
    for k in v:
        if not isinstance(k, str):
            raise ctx.data(path, f"keys must be strings, got {k!r}")
    return dict(v)


def given(v: Any) -> bool:
    """Set and not empty: ``None`` and blank strings (``${VAR:-}`` of an unset variable) read as
    not given."""
    return v is not None and not (isinstance(v, str) and not v.strip())


def _named(pattern: re.Pattern, allowed: str) -> Any:
    """A name type: a non-empty string matching ``pattern``, refused as ``'x': use <allowed> only``."""
    def check(s: str) -> str:
        if not pattern.match(s):
            raise schema.Refused(f"{s!r}: use {allowed} only")
        return s
    return Annotated[schema.Text, AfterValidator(check)]


#: A name of a spec or a model (:data:`NAME_RE`): letters, digits, ``-``, ``_`` and ``.``.
Name = _named(NAME_RE, "letters, digits, '-', '_' and '.'")

#: Names of debiased copies and variants (``glove+hard_debias``): a model name, ``+`` allowed.
DERIVED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-+]*$")
#: The name of a debiased copy (``models[i].mitigation[j].name``) or variant
#: (``models[i].lm_mitigation[j].name``): :data:`DERIVED_NAME_RE`.
DerivedName = _named(DERIVED_NAME_RE, "letters, digits, '-', '_', '.' and '+'")


def as_list(v: Any) -> Any:
    """A single string as a list of one; anything but a non-empty list refused (:data:`Strings`)."""
    if isinstance(v, str):
        return [v]
    if not isinstance(v, (list, tuple)) or not v:
        raise DataError(f"expected a non-empty list of strings, got {v!r}")
    return v


#: A non-empty list of non-empty strings (a single string is a list of one), as a tuple.
Strings = Annotated[tuple[schema.Text, ...], BeforeValidator(as_list), Field(strict=False)]


def _plain(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):  # as a typed number field words it
        raise DataError(f"expected a finite number, got {x!r}")
    try:
        json.dumps(x, allow_nan=False)
    except (TypeError, ValueError):
        raise DataError(f"value {x!r} is not a plain number, string, list or mapping") from None
    return x


#: A mapping whose values are plain JSON (finite numbers, strings, lists, mappings): the
#: parameters of metrics, models and mitigation methods.
PlainValues = dict[str, Annotated[Any, AfterValidator(_plain)]]


def non_empty(what: str) -> Any:
    """A field's check (a :class:`pydantic.BeforeValidator`) that it holds a non-empty list
    (``models``, ``metrics``, ``watch``), refused as ``expected a non-empty list of <what>, got x``."""
    def a_list(v: Any) -> Any:
        if not isinstance(v, list) or not v:
            raise DataError(f"expected a non-empty list of {what}, got {v!r}")
        return v
    return BeforeValidator(a_list)


def named(key: str) -> Any:
    """A list item's reading (a :class:`pydantic.BeforeValidator`): a string ``s`` is ``{key: s}``
    (``models: [glove]``, ``watch: [org/model]``)."""
    return BeforeValidator(lambda v: {key: v} if isinstance(v, str) else v)


def steps(ctx: Ctx, path: str, v: Any, model: type[schema.Section], key: str,
          what: str) -> list[tuple[str, Any]]:
    """A list field of steps that may also be written as one step, or a step as its ``key``'s
    value (``mitigation: hd``, ``lm_mitigation: [inlp, {technique: cda, ...}]``): each step
    validated as ``model``, with its field path (``path[j]`` in a list, ``path`` alone);
    an empty list is refused as ``expected <what> or a non-empty list of steps``."""
    items = v if isinstance(v, list) else [v]
    if not items:
        raise ctx.data(path, f"expected {what} or a non-empty list of steps")
    out = []
    for j, item in enumerate(items):
        p = f"{path}[{j}]" if isinstance(v, list) else path
        out.append((p, schema.validate(model, {key: item} if isinstance(item, str) else item, ctx.source, p)))
    return out


__all__ = ["Ctx", "suggest", "first_line", "parse_yaml", "read_yaml", "ENV_VAR_RE", "SECRET_OK_FIELDS",
           "is_secret_name", "expand_env", "NAME_RE", "mapping", "given", "Tracking", "tracking", "Name", "Strings",
           "PlainValues", "as_list", "non_empty", "named", "DERIVED_NAME_RE", "DerivedName", "steps"]


def _known_store(uri: str | None) -> str | None:
    problem = tracking_uri_problem(uri) if uri else None
    if problem:
        raise schema.Refused(problem)
    return uri


class Tracking(schema.Section):
    """The ``tracking:`` section of sweep and watch specs (blank values read as not given)."""

    uri: Annotated[schema.Text, AfterValidator(_known_store)] | None = None
    experiment: schema.Text | None = None


def tracking(ctx: Ctx, v: Any) -> Tracking:
    """``tracking:`` (``None``: the defaults) as a :class:`Tracking`, refused in the vocabulary's words."""
    d = {k: x for k, x in mapping(ctx, "tracking", v).items() if given(x)} if v is not None else {}
    return schema.validate(Tracking, d, ctx.source, "tracking")


def location_overrides(output_dir: Any = None, tracking_uri: str | None = None) -> dict[str, Any]:
    """The fields a command line's ``--output-dir`` and ``--tracking-uri`` set on a sweep or watch
    spec (an unsupported tracking URI is refused, naming the option)."""
    changes: dict[str, Any] = {}
    if output_dir is not None:
        changes["output_dir"] = Path(output_dir)
    if tracking_uri is not None:
        problem = tracking_uri_problem(tracking_uri)
        if problem:
            raise ParameterError(f"--tracking-uri: {problem}")
        changes["tracking_uri"] = tracking_uri
    return changes
