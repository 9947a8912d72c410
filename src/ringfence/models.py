"""Jobs as data: the stored spec, states and their groups. Pure data, no I/O."""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from ringfence.errors import PayloadError


def new_job_id() -> str:
    """16 characters, 80 random bits: short keys keep Redis small."""
    return base64.b32encode(os.urandom(10)).decode().lower()


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class JobSpec:
    """What is stored for a job in Redis. Only explicit overrides are stored; the task supplies defaults."""

    task: str
    args: dict[str, Any]
    enqueued_ms: float  # µs precision with the system clock, so start latency can be measured below 1 ms
    version: int = 1
    max_attempts: int | None = None
    timeout_ms: int | None = None
    expires_ms: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"t": self.task, "v": self.version, "e": self.enqueued_ms, "a": self.args}
        if self.max_attempts is not None:
            doc["m"] = self.max_attempts
        if self.timeout_ms is not None:
            doc["to"] = self.timeout_ms
        if self.expires_ms is not None:
            doc["x"] = self.expires_ms
        doc.update(self.extra)
        try:
            return orjson.dumps(doc)
        except TypeError as exc:
            raise PayloadError(_explain_unserialisable(self.task, self.args, exc)) from exc

    @classmethod
    def decode(cls, raw: bytes | str) -> JobSpec:
        doc = orjson.loads(raw)
        return cls(
            task=doc.pop("t"),
            version=doc.pop("v", 1),
            enqueued_ms=doc.pop("e"),
            args=doc.pop("a"),
            max_attempts=doc.pop("m", None),
            timeout_ms=doc.pop("to", None),
            expires_ms=doc.pop("x", None),
            extra=doc,
        )


def _explain_unserialisable(task: str, args: dict[str, Any], exc: Exception) -> str:
    for path, value in _walk(args, "payload"):
        try:
            orjson.dumps(value)
        except TypeError:
            return (
                f"task {task!r}: field {path} holds a {type(value).__name__}, which is not JSON; "
                "payloads are JSON only (pass ids and plain values, not objects)"
            )
    return f"task {task!r}: payload is not JSON-serialisable: {exc}"


def _walk(value: Any, path: str) -> list[tuple[str, Any]]:
    """Leaves first, so the error names the deepest offending field."""
    found: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return [(f"{path} key {key!r}", key)]
            found += _walk(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found += _walk(item, f"{path}[{i}]")
    return [*found, (path, value)]


@dataclass(slots=True)
class Fetched:
    """A job handed to a worker with its lease."""

    id: str
    queue: str
    raw: bytes
    attempt: int
    token: str
    started_ms: int
    spec: JobSpec | None = None


@dataclass(slots=True)
class DeadJob:
    """A dead-letter record."""

    id: str
    queue: str
    task: str
    args: dict[str, Any]
    reason: str
    error: str
    traceback: str
    attempts: int
    died_ms: int
    history: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            "task": self.task,
            "args": self.args,
            "reason": self.reason,
            "error": self.error,
            "traceback": self.traceback,
            "attempts": self.attempts,
            "died_ms": self.died_ms,
            "history": self.history,
        }
