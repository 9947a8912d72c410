"""Jobs as data, and the one home of the job wire format: the stored spec (``JobSpec``, its encoding and
decoding), a prepared job (``Prepared``), a fetched one (``Fetched``) and a dead one (``DeadJob``). No I/O."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from ringfence.errors import BadRecord, PayloadError

#: Wire format of a stored spec: key -> (field name, accepted types, required). ``a`` is written last so a
#: reader can decode the head of a large spec without its payload (see :func:`JobSpec.decode_head`).
_WIRE: dict[str, tuple[str, tuple[type, ...], bool]] = {
    "t": ("task", (str,), True),
    "v": ("version", (int,), False),
    "e": ("enqueued_ms", (int, float), True),
    "m": ("max_attempts", (int,), False),
    "to": ("timeout_ms", (int,), False),
    "x": ("expires_ms", (int, float), False),
    "a": ("args", (dict,), True),
}
_JSON_TYPE = {str: "a string", int: "an integer", float: "a number", dict: "an object", list: "a list",
              bool: "a boolean", type(None): "null"}


_B32 = "abcdefghijklmnopqrstuvwxyz234567"
_B32_OF_BYTE = bytes.maketrans(bytes(range(256)), (_B32 * 8).encode())  # a byte -> the character of its low 5 bits
_ID_BATCH = 256
_ids: list[str] = []  # generated ids not handed out yet: each is popped once (list.pop is atomic)
os.register_at_fork(after_in_child=_ids.clear)  # a forked child must never hand out its parent's next ids


def new_job_id() -> str:
    """16 characters, 80 random bits (lower-case base32, 5 random bits each): short keys keep Redis small.
    Drawn 256 at a time (one ``os.urandom``, one ``translate``): a sixth of the cost of one, on every enqueue."""
    while True:
        try:
            return _ids.pop()
        except IndexError:
            text = os.urandom(16 * _ID_BATCH).translate(_B32_OF_BYTE).decode()
            _ids.extend([text[i:i + 16] for i in range(0, 16 * _ID_BATCH, 16)])


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
        doc: dict[str, Any] = {"t": self.task, "v": self.version, "e": self.enqueued_ms}
        if self.max_attempts is not None:
            doc["m"] = self.max_attempts
        if self.timeout_ms is not None:
            doc["to"] = self.timeout_ms
        if self.expires_ms is not None:
            doc["x"] = self.expires_ms
        doc.update(self.extra)
        doc["a"] = self.args  # last: the head of the record holds everything but the payload
        try:
            return orjson.dumps(doc)
        except TypeError as exc:
            raise PayloadError(_explain_unserialisable(self.task, self.args, exc)) from exc

    @staticmethod
    def plain(task: str, args: dict[str, Any], enqueued_ms: float, version: int) -> bytes:
        """``JobSpec(task, args, enqueued_ms, version).encode()`` for a spec without options, without building one:
        a plain enqueue's bytes (client.py), the same record."""
        try:
            return orjson.dumps({"t": task, "v": version, "e": enqueued_ms, "a": args})
        except TypeError:
            return JobSpec(task=task, args=args, enqueued_ms=enqueued_ms, version=version).encode()  # names the field

    @classmethod
    def decode(cls, raw: bytes | str) -> JobSpec:
        """Decode a stored spec; :class:`BadRecord` names the field and the type of a value that breaks the
        wire format (a record written by hand, a bug, another program)."""
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRecord(f"spec is not valid JSON: {exc}") from exc
        return cls._from_doc(doc, need_args=True)

    @classmethod
    def decode_head(cls, head: bytes, size: int) -> JobSpec:
        """Decode the first bytes of a spec of ``size`` bytes: all of it when it fits, else every field but
        the payload (``args`` is then empty). Readers that count jobs never load whole payloads."""
        if len(head) >= size:
            return cls.decode(head)
        cut = head.find(b',"a":')
        if cut < 0:
            raise BadRecord(f"spec of {size} bytes has no payload field \"a\" in its first {len(head)} bytes")
        try:
            doc = orjson.loads(head[:cut] + b"}")
        except orjson.JSONDecodeError as exc:
            raise BadRecord(f"spec is not valid JSON: {exc}") from exc
        return cls._from_doc(doc, need_args=False)

    @classmethod
    def _from_doc(cls, doc: Any, need_args: bool) -> JobSpec:
        if not isinstance(doc, dict):
            raise BadRecord(f"spec is {_type_name(doc)}, expected a JSON object")
        values: dict[str, Any] = {}
        for key, (name, types, required) in _WIRE.items():
            if key not in doc:
                if required and (need_args or key != "a"):
                    raise BadRecord(f"spec field {key!r} ({name}) is missing")
                continue
            value = doc.pop(key)
            if value is None and not required:
                continue
            if isinstance(value, bool) or not isinstance(value, types):
                raise BadRecord(f"spec field {key!r} ({name}) holds {_type_name(value)} ({_short(value)}), "
                                f"expected {' or '.join(_JSON_TYPE[t] for t in types)}")
            values[name] = value
        return cls(task=values["task"], args=values.get("args", {}), enqueued_ms=values["enqueued_ms"],
                   version=values.get("version", 1), max_attempts=values.get("max_attempts"),
                   timeout_ms=values.get("timeout_ms"), expires_ms=values.get("expires_ms"), extra=doc)


def _type_name(value: Any) -> str:
    return _JSON_TYPE.get(type(value), f"a {type(value).__name__}")


def _short(value: Any) -> str:
    text = orjson.dumps(value).decode() if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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


class Prepared(NamedTuple):
    """One validated, encoded job, ready for the enqueue script (client.py) or the outbox row (outbox/write.py)."""

    queue: str
    id: str
    spec: bytes          # JobSpec.encode()
    run_at_ms: int       # 0: now
    unique_key: str      # "": not unique
    hold_until_ms: int   # the unique key's hold end (0 when not unique)


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
    malformed: str = ""  # why the stored record could not be read (shown, deletable, not replayable)
    source: str = "redis"  # redis, or sql: only in the failed-jobs table (Redis lost it)

    @classmethod
    def decode(cls, queue: str, job_id: str, raw: bytes) -> DeadJob:
        """A dead record as a DeadJob; one that cannot be read comes back marked ``malformed`` (with what could
        be read), so every reader lists it and ``dead delete`` can remove it."""
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            try:  # a spec with invalid UTF-8 is copied into its dead record as is: read the rest around it
                record = orjson.loads(raw.decode(errors="replace"))
            except orjson.JSONDecodeError:
                record = None
            found = record if isinstance(record, dict) else {}
            return cls._malformed(queue, job_id, found, f"dead record: {exc}")
        if not isinstance(record, dict):
            why = f"dead record is {type(record).__name__}, expected a JSON object"
            return cls._malformed(queue, job_id, {}, why)
        try:
            spec = JobSpec.decode(record["spec"]) if isinstance(record.get("spec"), str) else None
            if spec is None:
                raise BadRecord("dead record has no spec string")
            history = orjson.loads(record["history"]) if record.get("history") else []
            return cls(
                id=job_id, queue=queue, task=str(record.get("task", spec.task)), args=spec.args,
                reason=str(record.get("reason", "")), error=str(record.get("error", "")),
                traceback=str(record.get("traceback", "")), attempts=int(record.get("attempts", 0)),
                died_ms=int(record.get("died_ms", 0)), history=history if isinstance(history, list) else [],
            )
        except (orjson.JSONDecodeError, BadRecord, TypeError, ValueError) as exc:
            return cls._malformed(queue, job_id, record, str(exc))

    @classmethod
    def _malformed(cls, queue: str, job_id: str, record: dict[str, Any], why: str) -> DeadJob:
        def num(name: str) -> int:
            try:
                return int(record.get(name, 0))
            except (TypeError, ValueError):
                return 0

        return cls(id=job_id, queue=queue, task=str(record.get("task", "?")), args={},
                   reason=str(record.get("reason", "malformed")), error=str(record.get("error", "")),
                   traceback="", attempts=num("attempts"), died_ms=num("died_ms"), history=[], malformed=why)

    @staticmethod
    def spec_of(raw: bytes) -> dict[str, Any] | None:
        """The job spec inside a dead record (what a replay sends again); None when the record cannot give one."""
        try:
            spec = orjson.loads(orjson.loads(raw)["spec"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        return spec if isinstance(spec, dict) else None

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"source": self.source}
        if self.malformed:
            extra["malformed"] = self.malformed
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
            **extra,
        }
