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
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

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
        if not params:
            raise ConfigError(f"task {task_name!r}: a handler takes the job context as its first argument")
        if model is not None and len(params) != 2:
            raise ConfigError(f"task {task_name!r}: with payload={model.__name__} the handler takes (ctx, payload)")
        self._params = {p.name: p for p in params[1:]}
        self._takes_any = any(p.kind is p.VAR_KEYWORD for p in params[1:])

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
        if self.model is not None:
            if isinstance(payload, self.model):
                return payload.model_dump(mode="json")
            if not isinstance(payload, dict):
                raise PayloadError(f"task {self.task!r}: pass {self.model.__name__} fields as keywords or an instance")
            try:
                return self.model.model_validate(payload).model_dump(mode="json")
            except ValidationError as exc:
                raise PayloadError(f"task {self.task!r} version {self.version}: {_explain(exc)}") from exc
        if not isinstance(payload, dict):
            raise PayloadError(f"task {self.task!r}: a payload is a dict of fields, got {type(payload).__name__}")
        self.check_fields(payload)
        return payload

    def check_fields(self, payload: dict[str, Any]) -> None:
        """For keyword payloads: no unknown field, no missing required one."""
        if not self._takes_any:
            unknown = sorted(set(payload) - set(self._params))
            if unknown:
                raise PayloadError(f"task {self.task!r}: unknown field(s) {', '.join(unknown)}; "
                                   f"it takes {', '.join(self._params) or 'no fields'}")
        missing = [n for n, p in self._params.items()
                   if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in payload]
        if missing:
            raise PayloadError(f"task {self.task!r}: missing required field(s) {', '.join(missing)}")

    # -- run ------------------------------------------------------------------------------------
    def decode(self, version: int, payload: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(args, kwargs) for the handler after ``ctx``. Raises PayloadTooNew or PayloadError."""
        if version > self.version:
            raise PayloadTooNew(f"task {self.task!r}: payload version {version} is newer than this worker's "
                                f"{self.version} (understood: {self.understood()})")
        data = self.upcast(version, payload)
        if self.model is not None:
            try:
                return (self.model.model_validate(data),), {}
            except ValidationError as exc:
                raise PayloadError(f"task {self.task!r}: payload version {version} (understood: "
                                   f"{self.understood()}): {_explain(exc)}") from exc
        try:
            self.check_fields(data)
        except PayloadError as exc:
            raise PayloadError(f"{exc} (payload version {version}, understood: {self.understood()})") from exc
        return (), data

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


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "(payload)"
        parts.append(f"field {loc}: {err['msg']}")
    return "; ".join(parts)


def _field_of(exc: Exception) -> str:
    return repr(exc.args[0]) if isinstance(exc, KeyError) and exc.args else "?"
