"""Versioned payloads: every stored payload carries its format version; a task reads its current version and,
through upcasters, every older one it declares.

    @app.task(version=2, payload=ChargeV2)
    async def charge(ctx, p: ChargeV2) -> None: ...

    @charge.upcaster(1)
    def v1_to_v2(old: dict) -> dict:
        return {**old, "currency": "EUR"}
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from typing import Any, NotRequired, Required, cast

import orjson
from pydantic import BaseModel, PydanticSchemaGenerationError, TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic needs this one below Python 3.12

from ringfence.errors import ConfigError, PayloadError, PayloadTooNew

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class PayloadCodec:
    """How one task encodes its payload at enqueue and decodes stored payloads of any version."""

    def __init__(self, task_name: str, fn: Callable[..., Any], version: int,
                 model: type[BaseModel] | None) -> None:
        if version < 1:
            raise ConfigError(f"task {task_name!r}: version={version} must be >= 1")
        if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ConfigError(f"task {task_name!r}: payload= must be a pydantic BaseModel class, got {model!r}")
        self.task = task_name
        self.version = version
        self.model = model
        self.upcasters: dict[int, Upcaster] = {}
        params = list(inspect.signature(fn).parameters.values())
        check_context_parameter(task_name, params)
        if model is not None and len(params) != 2:
            raise ConfigError(f"task {task_name!r}: with payload={model.__name__} the handler takes (ctx, payload)")
        self._params = {p.name: p for p in params[1:] if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        self._takes_any = any(p.kind is p.VAR_KEYWORD for p in params[1:])
        self._required = [n for n, p in self._params.items()
                          if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        # Plain handlers: the parameters after ctx, checked in pydantic's strict JSON mode (built once).
        self._adapter = None if model is not None else signature_adapter(task_name, fn, list(self._params.values()))
        self._plain = None if model is not None or self._takes_any else plain_fields(fn, self._params)
        # At run time the same check with the types pydantic returns unchanged (a float field's int becomes a
        # float there, so it takes the full check): a stored plain payload is then the handler's kwargs as they
        # are, without a JSON round trip through pydantic per job.
        self._exact = None if self._plain is None else {
            name: tuple(k for k in kinds if k is not int) if kinds == _SCALARS[float] else kinds
            for name, kinds in self._plain.items()}

    # -- declaration ----------------------------------------------------------------------------
    def add_upcaster(self, from_version: int, fn: Upcaster) -> None:
        if not 1 <= from_version < self.version:
            raise ConfigError(f"task {self.task!r}: an upcaster from version {from_version} must be below the "
                              f"current version {self.version}")
        self.upcasters[from_version] = fn

    def understood(self) -> list[int]:
        """Versions this code can read: the current one and each with an unbroken upcaster chain to it."""
        out = [self.version]
        for v in range(self.version - 1, 0, -1):
            if v not in self.upcasters:
                break
            out.append(v)
        return sorted(out)

    # -- enqueue --------------------------------------------------------------------------------
    def encode(self, payload: Any) -> dict[str, Any]:
        """The JSON-ready payload of the current version, validated; errors name the field."""
        if self._plain is not None and type(payload) is dict and self._plainly_valid(payload, self._plain):
            return payload
        if self.model is not None:
            if not isinstance(payload, self.model | dict):
                raise PayloadError(f"task {self.task!r}: pass {self.model.__name__} fields as keywords or an instance")
            try:
                instance = payload if isinstance(payload, self.model) else self.model.model_validate(payload)
            except ValidationError as exc:
                raise PayloadError(f"task {self.task!r} version {self.version}: {_explain(exc)}") from exc
            # The model declares its richer types and converts them; a non-finite float it would store as null.
            self._refuse(non_finite(model_dump(instance, "payload"), "payload"))
            return instance.model_dump(mode="json")
        if not isinstance(payload, dict):
            raise PayloadError(f"task {self.task!r}: a payload is a dict of fields, got {type(payload).__name__}")
        self._refuse(json_problem(payload, "payload"))
        self.check_fields(payload)
        self.validate(payload)
        return payload

    def _plainly_valid(self, payload: dict[str, Any], plain: dict[str, tuple[type, ...]] | None = None) -> bool:
        """True when every field is a declared one whose annotation is a plain scalar (or none) and whose value
        has exactly that type, and no required field is missing: what the checks below would accept, in a tenth
        of their time (every enqueue, and with ``_exact`` every run). False: those checks decide, and name what
        is wrong."""
        plain = plain if plain is not None else self._plain
        assert plain is not None
        for name, value in payload.items():
            kinds = plain.get(name)
            kind = type(value)
            if kinds is None or kind not in kinds:
                return False
            if kind is float:
                if value - value != 0.0:  # NaN or Infinity
                    return False
            elif kind is str:
                if not value.isascii():  # a lone surrogate cannot be encoded: let the checks below say so
                    return False
            elif kind is int and not _INT_RANGE[0] <= value < _INT_RANGE[1]:
                return False
        return len(payload) == len(plain) or all(n in payload for n in self._required)

    def _refuse(self, problem: str | None) -> None:
        if problem is not None:
            raise PayloadError(f"task {self.task!r}: {problem}")

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A plain handler's fields checked against its annotations (strict: no "5" or 5.0 for an int);
        returns them as the handler receives them."""
        if self._adapter is None:
            return payload
        declared = {k: v for k, v in payload.items() if k in self._params}
        try:
            checked: dict[str, Any] = self._adapter.validate_json(orjson.dumps(declared), strict=True)
        except ValidationError as exc:
            raise PayloadError(f"task {self.task!r}: {_explain(exc)}") from exc
        except orjson.JSONEncodeError as exc:
            raise PayloadError(f"task {self.task!r}: {json_problem(declared, 'payload') or exc}") from exc
        return {**payload, **checked}

    def check_fields(self, payload: dict[str, Any]) -> None:
        """For keyword payloads: no unknown field, no missing required one."""
        if not self._takes_any and not self._params.keys() >= payload.keys():
            unknown = sorted(set(payload) - set(self._params))
            if unknown:
                raise PayloadError(f"task {self.task!r}: unknown field(s) {', '.join(unknown)}; "
                                   f"it takes {', '.join(self._params) or 'no fields'}")
        missing = [n for n in self._required if n not in payload]
        if missing:
            raise PayloadError(f"task {self.task!r}: missing required field(s) {', '.join(missing)}")

    # -- run ------------------------------------------------------------------------------------
    def decode(self, version: int, payload: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(args, kwargs) for the handler after ``ctx``. Raises PayloadTooNew or PayloadError."""
        if version > self.version:
            raise PayloadTooNew(f"task {self.task!r}: payload version {version} is newer than this worker's "
                                f"{self.version} (understood: {self.understood()})")
        data = self.upcast(version, payload) if version != self.version else payload
        if self._exact is not None and type(data) is dict and self._plainly_valid(data, self._exact):
            return (), data  # what pydantic's strict check returns for these fields: the payload as it is
        if self.model is not None:
            try:
                return (self.model.model_validate(data),), {}
            except ValidationError as exc:
                raise PayloadError(f"task {self.task!r}: payload version {version} (understood: "
                                   f"{self.understood()}): {_explain(exc)}") from exc
        try:
            self.check_fields(data)
            return (), self.validate(data)
        except PayloadError as exc:
            raise PayloadError(f"{exc} (payload version {version}, understood: {self.understood()})") from exc

    def upcast(self, version: int, payload: dict[str, Any]) -> dict[str, Any]:
        data = payload
        for v in range(version, self.version):
            step = self.upcasters.get(v)
            if step is None:
                raise PayloadError(f"task {self.task!r}: payload version {version} cannot be read: no upcaster from "
                                   f"version {v} (understood: {self.understood()})")
            try:
                data = step(dict(data))
            except Exception as exc:
                raise PayloadError(f"task {self.task!r}: upcaster from version {v} failed on field "
                                   f"{_field_of(exc)}: {type(exc).__name__}: {exc}") from exc
        return data


CONTEXT_NAMES = ("ctx", "context", "_ctx", "_context")


def check_context_parameter(task: str, params: list[inspect.Parameter]) -> None:
    """The first parameter receives the job context: positional, and named ctx/context or annotated JobContext."""
    first = params[0] if params else None
    positional = first is not None and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
    annotation = "" if first is None or first.annotation is first.empty else first.annotation
    named = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if first is None or not positional or not (first.name in CONTEXT_NAMES or named.endswith("JobContext")):
        got = "no parameter" if first is None else f"parameter {first.name!r}"
        raise ConfigError(f"task {task!r}: the handler's first parameter receives the job context, got {got}; "
                          "name it ctx (or context) or annotate it JobContext")


def signature_adapter(task: str, fn: Callable[..., Any], params: list[inspect.Parameter]) -> TypeAdapter[Any]:
    """A TypeAdapter of a TypedDict of the handler's payload parameters (unannotated ones are Any)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a local or misspelt name in some annotation: resolve them one by one below
        hints = {}
    fields: dict[str, Any] = {}
    for p in params:
        annotation = hints.get(p.name, Any if p.annotation is p.empty else p.annotation)
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, getattr(fn, "__globals__", {}))
            except Exception as exc:
                raise ConfigError(f"task {task!r}: the annotation {annotation!r} of parameter {p.name!r} cannot be "
                                  f"resolved ({type(exc).__name__}: {exc}); import the type at module level") from exc
        fields[p.name] = Required[annotation] if p.default is p.empty else NotRequired[annotation]
    try:
        return TypeAdapter(TypedDict(f"{task}_payload", fields))  # type: ignore[operator]
    except (PydanticSchemaGenerationError, TypeError) as exc:
        raise ConfigError(f"task {task!r}: the handler's annotations cannot be checked as JSON ({exc}); use JSON "
                          "types or declare payload=Model") from exc


_INT_RANGE = (-(2**63), 2**64)  # what JSON (orjson) stores exactly

# Annotation -> the value types pydantic's strict JSON mode accepts for it as they are (an int for a float too).
_SCALARS: dict[Any, tuple[type, ...]] = {str: (str,), int: (int,), float: (float, int), bool: (bool,),
                                         Any: (str, int, float, bool, type(None))}


def plain_fields(fn: Callable[..., Any], params: dict[str, inspect.Parameter]) -> dict[str, tuple[type, ...]] | None:
    """Field -> accepted value types, when every payload parameter is annotated str, int, float, bool, Any or
    not at all (``PayloadCodec._plainly_valid``); None otherwise (pydantic checks every payload)."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)  # Annotated[str, Field(...)] is not plain
        out = {name: _SCALARS.get(hints.get(name, Any)) for name, p in params.items()
               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    except Exception:  # an unresolvable or unhashable annotation
        return None
    if len(out) != len(params) or None in out.values():
        return None
    return cast(dict[str, tuple[type, ...]], out)


#: Lists and dicts nested deeper than this are refused in payloads and results: orjson stops at 254 levels, Python's
#: recursion near 1,000, and a stored job wraps its payload in two more.
MAX_DEPTH = 200


def _too_deep(path: str) -> str:
    shown = path if len(path) <= 60 else path[:60] + "..."
    return f"field {shown} is nested more than {MAX_DEPTH} levels deep (lists and dicts); the limit is {MAX_DEPTH}"


def json_problem(value: Any, path: str, depth: int = 0) -> str | None:
    """Why ``value`` is not plain JSON, naming the field (``payload.items[2]``); None when it is.

    Only dict (str keys), list, tuple, str, int, float (finite), bool and None, nested at most ``MAX_DEPTH``
    levels: anything else would be converted silently (datetime, UUID, dataclass, enum) or stored as something
    else (NaN and Infinity as null)."""
    kind = type(value)
    if value is None or kind in (str, bool):
        return None
    if kind is int:
        inside = _INT_RANGE[0] <= value < _INT_RANGE[1]
        return None if inside else f"field {path}={value} is outside JSON's 64-bit range"
    if kind is float:
        return None if math.isfinite(value) else f"field {path}={value!r}: NaN and Infinity are not JSON"
    if kind in (dict, list, tuple) and depth >= MAX_DEPTH:
        return _too_deep(path)
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str:
                return f"field {path} has a key {k!r} ({type(k).__name__}); JSON keys are strings"
            problem = json_problem(v, _join(path, k), depth + 1)
            if problem:
                return problem
        return None
    if kind in (list, tuple):
        for i, v in enumerate(value):
            problem = json_problem(v, f"{path}[{i}]", depth + 1)
            if problem:
                return problem
        return None
    return (f"field {path} holds a {kind.__name__}, which is not JSON; pass plain values (str, int, float, bool, "
            "None, lists, dicts) or declare a payload model (payload=Model) that converts it")


def non_finite(value: Any, path: str, depth: int = 0) -> str | None:
    """The first NaN or Infinity in a dumped payload model, naming the field (or a part nested too deep)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"field {path}={value!r}: NaN and Infinity are not JSON"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    if items and depth >= MAX_DEPTH:
        return _too_deep(path)
    for k, v in items:
        problem = non_finite(v, _join(path, k) if isinstance(value, dict) else f"{path}[{k}]", depth + 1)
        if problem:
            return problem
    return None


def model_dump(model: BaseModel, path: str) -> Any:
    """``model.model_dump()``; pydantic's own depth limit (a ValueError) becomes the PayloadError of a value nested
    too deep."""
    try:
        return model.model_dump()
    except ValueError as exc:
        raise PayloadError(f"{_too_deep(path)} ({exc})") from exc


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "(payload)"
        got = f" (got {err['input']!r})" if err["type"] != "missing" and "input" in err else ""
        parts.append(f"field {loc}: {err['msg']}{got}")
    return "; ".join(parts)


def _field_of(exc: Exception) -> str:
    return repr(exc.args[0]) if isinstance(exc, KeyError) and exc.args else "?"
