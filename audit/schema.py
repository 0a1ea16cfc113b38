"""The validation vocabulary: typed models (pydantic v2) and the one error formatter.

Sweep specs (:mod:`jobs.spec`), watch specs (:mod:`jobs.watch.spec`), Ray options
(:class:`jobs.spec.RaySpec`) and metric parameters (:func:`audit.registry.check_params`) declare
their fields once, as pydantic models or annotated types built from the pieces below, and every
refusal reads the same: ONE line ``<file>: <field path>: <problem>`` (e.g.
``smoke.yaml: models[2].ray.batch_size: must be >= 1, got 0``), raised as

- :class:`~audit.errors.DataError` when the value is malformed: wrong type (a string where a number
  belongs, ``1.5`` where an integer belongs, ``yes`` where ``true`` belongs), NaN or infinity, an
  unknown or missing field;
- :class:`~audit.errors.ParameterError` when a value of the right type is not allowed: out of
  range, an unknown name (a validator raising :class:`Refused`).

The wordings (:func:`problem`): ``expected an integer, got 'x'``, ``expected a number, got 'x'``,
``expected a finite number, got nan``, ``expected true or false, got 'yes'``, ``expected a
non-empty string, got 3``, ``must be >= 1, got 0`` (``>``, ``<``, ``<=`` alike), ``unknown field
(did you mean 'x'?); allowed fields: ...``, ``missing required field``.

Pieces: :class:`Section` (the base of every model: unknown fields refused, no coercion, frozen;
:class:`NullDefaults`: one whose null fields take their defaults),
:func:`Int`, :func:`Num`, :data:`Flag`, :data:`Text`, :func:`OneOf`, :data:`Permutations` (annotated field
types),
:func:`plain` (NumPy scalars as Python values), :func:`integer`, :func:`number`, :func:`flag` and
:func:`choice` (a function's arguments, refused as :class:`~audit.errors.ParameterError`: ``<name>:
unknown value 'x' (did you mean 'y'?); known: a, b`` for a choice), :func:`arguments` (a class's or function's keyword
arguments against their model), :class:`Refused`
(raised by a validator for a value out of the allowed set), :func:`validate` (a mapping into a
model), :func:`check` (one value against a type), :func:`error_of` (a
:class:`pydantic.ValidationError` as the one-line :class:`~audit.errors.AuditError`).
"""

from __future__ import annotations

import functools
import numbers
from typing import Annotated, Any, Mapping, Sequence, get_args

import numpy as np
from pydantic import (
    AfterValidator, BeforeValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from audit.errors import AuditError, DataError, ParameterError, suggest


class Section(BaseModel):
    """Base of every typed model of a spec: unknown fields refused, no coercion (``"1"`` is not
    a number, ``1.0`` not an integer, ``"true"`` not a boolean), instances immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, validate_default=False)


class NullDefaults(Section):
    """A :class:`Section` whose null fields (``key:`` with no value, ``key: null``) take their
    defaults: the rule of the specs' sections (``ray:``, ``hub:``, a debiasing step ...)."""

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, d: Any) -> Any:
        return {k: x for k, x in d.items() if x is not None} if isinstance(d, Mapping) else d


class Refused(ValueError):
    """Raised by a model's validator for a value of the right type that is not allowed (an unknown
    name, a rule between fields): its message is the problem, reported as a ParameterError."""


def _integral(v: Any) -> Any:
    """``1e5`` written for a count is the integer 100000 (a float with no fraction, as the command
    line's ``--param n_bootstrap=1e5`` parses); any other value is left for the strict check.

    Not cached: a cache keyed on the values took ``True`` and ``1.0`` for one key (they are
    equal), so after a ``1.0`` had been checked a ``True`` passed as the integer 1, after a
    ``True`` a ``1.0`` was refused as ``got True``, and a list raised ``TypeError: unhashable``."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


@functools.lru_cache(maxsize=None)
def Int(minimum: int | None = None) -> Any:  # noqa: N802 (a type constructor)
    """An integer (not a bool; a float with no fraction, ``1e5``, is that integer), at least ``minimum``.

    Cached like :func:`Num` and :func:`OneOf`: the same ``minimum`` gives the same type, so
    :func:`check` builds its validator once per type (built per call, each :func:`integer` cost
    a new ``TypeAdapter``, 0.16 ms, and every one of them stayed in :func:`_adapter`'s cache)."""
    return Annotated[int, BeforeValidator(_integral), Field(strict=True, ge=minimum)]


@functools.lru_cache(maxsize=None)
def Num(minimum: float | None = 0.0, *, strict: bool = False, maximum: float | None = None,  # noqa: N802
        inclusive: bool = False) -> Any:
    """A finite number (an int or a float, not a bool), ``>= minimum`` (``> minimum`` with
    ``strict``), ``< maximum`` when given (``<= maximum`` with ``inclusive``)."""
    lo = {"gt": minimum} if strict else {"ge": minimum}
    hi = {"le": maximum} if inclusive else {"lt": maximum}
    return Annotated[float, Field(strict=True, allow_inf_nan=False, **lo, **hi)]


@functools.lru_cache(maxsize=None)
def OneOf(what: str, choices: tuple[str, ...]) -> Any:  # noqa: N802 (a type constructor)
    """A non-empty string among ``choices``; another is refused as ``unknown <what> 'x' (did you
    mean 'y'?); known: a, b``."""
    def known(v: str) -> str:
        if v not in choices:
            raise Refused(f"unknown {what} {v!r}{suggest(v, choices)}; known: {', '.join(choices)}")
        return v

    return Annotated[Text, AfterValidator(known)]


def plain(value: Any) -> Any:
    """A NumPy scalar as the Python value it holds (``np.int64(3)`` -> ``3``), anything else as is:
    parameters computed with NumPy validate as the same numbers written in a spec."""
    return value.item() if isinstance(value, np.generic) else value


def _permutations(value: Any) -> int | str:
    if value in ("exact", "auto"):
        return value
    if isinstance(value, str):
        raise Refused(f"expected exact, auto or a positive integer, got {value!r}")
    return check(Int(1), plain(value))


#: ``permutations``: ``exact``, ``auto`` or a number of random partitions (>= 1).
Permutations = Annotated[Any, PlainValidator(_permutations)]


#: ``true`` or ``false``.
Flag = StrictBool
#: A non-empty string, stripped.
Text = Annotated[str, StringConstraints(strict=True, strip_whitespace=True, min_length=1)]


def _bound(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


_RANGES = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than": ("<", "lt"),
           "less_than_equal": ("<=", "le")}


def problem(err: Mapping[str, Any], model: type[BaseModel] | None = None) -> tuple[type[AuditError], str]:
    """The error class and the wording of one pydantic error (:mod:`audit.schema`'s vocabulary)."""
    kind, got, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind in _RANGES:
        op, key = _RANGES[kind]
        return ParameterError, f"must be {op} {_bound(ctx[key])}, got {got!r}"
    if kind == "value_error" and isinstance(ctx.get("error"), Refused):
        return ParameterError, str(ctx["error"])
    if kind == "value_error" and isinstance(ctx.get("error"), AuditError):  # a nested check's own words
        loc = err.get("loc") or ()
        return type(ctx["error"]), unnamed(str(ctx["error"]), str(loc[-1])) if loc else str(ctx["error"])
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return DataError, f"expected an integer, got {got!r}"
    if kind == "finite_number":
        return DataError, f"expected a finite number, got {got!r}"
    if kind in ("float_type", "float_parsing"):
        return DataError, f"expected a number, got {got!r}"
    if kind in ("bool_type", "bool_parsing"):
        return DataError, f"expected true or false, got {got!r}"
    if kind in ("string_type", "string_too_short"):
        return DataError, f"expected a non-empty string, got {got!r}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return DataError, f"expected a mapping, got {type(got).__name__} {got!r}"
    if kind == "missing":
        return DataError, "missing required field"
    if kind == "extra_forbidden":
        inner = _model_at(model, tuple(err["loc"][:-1]))
        allowed = sorted(inner.model_fields) if inner is not None else []
        field = str(err["loc"][-1])
        return DataError, f"unknown field{suggest(field, allowed)}; allowed fields: {', '.join(allowed)}"
    if kind == "value_error":
        return DataError, str(ctx.get("error", err.get("msg")))
    return DataError, f"{err.get('msg', 'invalid')}, got {got!r}"


def unnamed(message: str, name: str) -> str:
    """``message`` of a check of the argument ``name`` without its leading ``<name>: ``, for a
    caller that puts it after a field path ending with that name (``params.alternative: unknown
    value ...``, not ``params.alternative: alternative: unknown value ...``)."""
    head = f"{name}: "
    return message[len(head):] if message.startswith(head) else message


def _model_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that holds the field at ``loc`` (through lists, optionals and nested models)."""
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        todo, model = [field.annotation], None
        while todo and model is None:
            tp = todo.pop()
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                model = tp
            else:
                todo.extend(get_args(tp))
    return model


def field_path(prefix: str, loc: tuple[Any, ...]) -> str:
    """``prefix`` and a pydantic location as a spec's field path: ``models[2].batch_size``."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def error_of(exc: ValidationError, source: str = "", path: str = "",
             model: type[BaseModel] | None = None) -> AuditError:
    """A :class:`pydantic.ValidationError` as ONE line ``<source>: <field path>: <problem>`` (its
    first error: the spec is fixed one field at a time), a DataError or a ParameterError."""
    err = exc.errors(include_url=False)[0]
    # pydantic's own location parts (a validator's, a literal's, "[key]" of a mapping's key) are no field names
    loc = tuple(p for p in err["loc"]
                if not (isinstance(p, str) and (p.startswith(("function-", "literal[")) or p == "[key]")))
    cls, msg = problem(err, model)
    where = field_path(path, loc)
    head = ": ".join(s for s in (source, where) if s)
    return cls(f"{head}: {msg}" if head else msg)


def validate(model: type[BaseModel], data: Any, source: str = "", path: str = "") -> Any:
    """``data`` (a mapping; ``None``: every default) as an instance of ``model``; a refusal is
    raised as :func:`error_of` words it, naming ``source`` and the field path under ``path``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        head = ": ".join(s for s in (source, path) if s)
        raise DataError(f"{head}: expected a mapping, got {type(data).__name__} {data!r}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        head = ": ".join(s for s in (source, path) if s)
        raise DataError(f"{head}: keys must be strings, got {bad[0]!r}")
    try:
        return model.model_validate(dict(data))
    except ValidationError as e:
        raise error_of(e, source, path, model) from None


@functools.lru_cache(maxsize=None)
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


def check(tp: Any, value: Any, source: str = "", path: str = "") -> Any:
    """``value`` validated against the annotated type ``tp`` (:func:`Int`, :func:`Num`,
    :data:`Flag`, :data:`Text` ...), refused as :func:`error_of` words it."""
    try:
        return _adapter(tp).validate_python(plain(value))
    except ValidationError as e:
        raise error_of(e, source, path) from None


def choice(value: Any, name: str, choices: Sequence[Any], *, error: type[AuditError] = ParameterError) -> Any:
    """A choice-valued argument ``name`` of a function (``alternative``, ``ci_method``,
    ``padding_side`` ...): ``value`` when it is one of ``choices``, else a :class:`ParameterError`
    in one wording everywhere: ``<name>: unknown value 'x' (did you mean 'y'?); known: a, b``.
    A data file's field (``error=DataError``) is refused in the same words, ``name`` being where
    it is (``x.jsonl: line 2: field context_condition``)."""
    try:
        if value in choices:
            return value
    except TypeError:  # an unhashable or incomparable value is not a choice
        pass
    raise error(f"{name}: unknown value {value!r}{suggest(str(value), [str(c) for c in choices])}; "
                f"known: {', '.join(map(str, choices))}")


def flag(value: Any, name: str) -> bool:
    """A ``True``/``False`` argument ``name`` of a function (NumPy booleans accepted); a refusal is
    a :class:`ParameterError`, as for :func:`integer`."""
    try:
        return check(Flag, value, path=name)
    except DataError as e:
        raise ParameterError(str(e)) from None


def integer(value: Any, name: str, minimum: int | None = None) -> int:
    """An integer argument ``name`` of a function (``n_bootstrap``, ``permutations``), at least
    ``minimum``: :func:`check` with :func:`Int` (NumPy integers accepted); a function's argument is
    a parameter, so every refusal is a :class:`ParameterError` (in the same words)."""
    try:
        return check(Int(minimum), value, path=name)
    except DataError as e:
        raise ParameterError(str(e)) from None


def is_exact_integer(value: Any) -> bool:
    """Whether ``value`` is already an integer: a Python or NumPy integer, not a ``bool`` (nor
    NumPy's) and not a whole float such as ``2.0``. The one test of :func:`exact_integer` and of
    the checks that word their own refusals (``audit.stats``: a group size, ``ddof``, a shard)."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, numbers.Integral)


def exact_integer(value: Any, name: str, minimum: int | None = None, *, what: str = "an integer",
                  shown: str | None = None) -> int:
    """An argument that must already be an integer (a seed, a thread count: a ``bool`` and a whole
    float such as ``2.0`` are refused, where :func:`integer` takes ``2.0`` for 2; NumPy integers
    accepted), at least ``minimum``, as the int it holds; refused in :func:`integer`'s words
    (``<name>: expected <what>, got 1.5``, ``<name>: must be >= 0, got -1``), the value written as
    ``shown`` where given (a one-line form of a value whose repr has several)."""
    if not is_exact_integer(value):
        raise ParameterError(f"{name}: expected {what}, got {shown if shown is not None else repr(value)}")
    return integer(int(value), name, minimum)


def number(value: Any, name: str, minimum: float | None = 0.0, *, strict: bool = False,
           maximum: float | None = None, inclusive: bool = False) -> float:
    """A finite real argument ``name`` of a function (``confidence``), as :func:`Num` bounds it;
    every refusal a :class:`ParameterError`, as for :func:`integer`."""
    try:
        return float(check(Num(minimum, strict=strict, maximum=maximum, inclusive=inclusive), value, path=name))
    except DataError as e:
        raise ParameterError(str(e)) from None


def arguments(model: type[BaseModel], values: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """The keyword arguments ``values`` of ``owner`` (a class or a function: ``HardDebias``,
    ``inlp``) validated against ``model`` (its parameters, each declared once there), every refusal
    a :class:`ParameterError` worded as :func:`error_of` words it (``HardDebias: n_components: must
    be >= 1, got 0``). Returned as written (an int given for a number stays that int, a list stays a
    list: provenance and digests record what was given), except NumPy scalars (their Python value)
    and a count written as a float with no fraction (``1e5``: the integer)."""
    given = {k: plain(v) for k, v in values.items()}
    try:
        checked = validate(model, given, owner)
    except DataError as e:
        raise ParameterError(str(e)) from None
    out = {}
    for k, v in given.items():
        typed = getattr(checked, k)
        out[k] = typed if isinstance(typed, int) and not isinstance(typed, bool) and isinstance(v, float) else v
    return out


__all__ = ["Section", "NullDefaults", "Refused", "Int", "Num", "Flag", "Text", "OneOf", "Permutations", "plain",
           "problem",
           "field_path", "error_of", "validate", "check", "choice", "flag", "integer", "number", "arguments",
           "unnamed"]
