"""Payload contracts: frozen sample payloads, one per task and version, that the current code must still read.

Workflow: ``ringfence contracts freeze --app myapp:app`` on every release writes the samples of the current
versions into ``tests/contracts/<task>/v<N>.json`` (existing files are never overwritten: old samples are kept
forever); your test suite calls ``assert_contracts(app)`` so a change that breaks an old payload fails CI.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, create_model

from ringfence.app import App
from ringfence.errors import PayloadError
from ringfence.tasks import Task

DEFAULT_DIR = Path("tests/contracts")


def payload_model(task: Task) -> type[BaseModel]:
    """The task's payload model, or one built from its handler's keyword parameters."""
    if task.codec.model is not None:
        return task.codec.model
    fields: dict[str, Any] = {}
    for p in list(inspect.signature(task.fn).parameters.values())[1:]:
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        annotation = Any if p.annotation is p.empty else p.annotation
        fields[p.name] = (annotation, ... if p.default is p.empty else p.default)
    return create_model(f"{task.name}_payload", **fields)


def sample(task: Task) -> dict[str, Any]:
    """A payload of the task's current version: its ``example`` if declared, else one built from the schema."""
    if task.example is not None:
        return task.codec.encode(task.example)
    schema = payload_model(task).model_json_schema()
    return task.codec.encode(_from_schema(schema, schema.get("$defs", {})))


_STRING_FORMATS = {"date-time": "2024-01-01T00:00:00Z", "date": "2024-01-01", "time": "00:00:00",
                   "uuid": "00000000-0000-0000-0000-000000000000", "email": "user@example.com",
                   "uri": "https://example.com/", "duration": "PT1S"}


def _from_schema(s: dict[str, Any], defs: dict[str, Any]) -> Any:  # noqa: C901 - one branch per JSON type
    if "$ref" in s:
        return _from_schema(defs[s["$ref"].rsplit("/", 1)[-1]], defs)
    if "default" in s:
        return s["default"]
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return s["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in s:
            options = [o for o in s[key] if o.get("type") != "null"] or s[key]
            return _from_schema(options[0], defs)
    kind = s.get("type")
    if kind == "object" or "properties" in s:
        return {name: _from_schema(sub, defs) for name, sub in s.get("properties", {}).items()}
    if kind == "array":
        return [_from_schema(s.get("items", {}), defs)] * max(1, int(s.get("minItems", 1)))
    if kind == "string":
        return _STRING_FORMATS.get(s.get("format", ""), "x" * max(1, int(s.get("minLength", 1))))
    if kind == "integer":
        return int(max(s.get("minimum", 1), s.get("exclusiveMinimum", 0) + 1))
    if kind == "number":
        return float(max(s.get("minimum", 1.0), s.get("exclusiveMinimum", 0.0) + 1.0))
    if kind == "boolean":
        return True
    return None


def _path(folder: Path, task: str, version: int) -> Path:
    return folder / task / f"v{version}.json"


def freeze(app: App, folder: Path = DEFAULT_DIR, *, force: bool = False) -> list[Path]:
    """Write the sample of each task's current version; returns the files written. Old versions' files stay."""
    written = []
    for name, task in sorted(app.registry.tasks.items()):
        path = _path(folder, name, task.version)
        if path.exists() and not force:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"task": name, "version": task.version, "payload": sample(task)}
        path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
        written.append(path)
    return written


def check(app: App, folder: Path = DEFAULT_DIR) -> tuple[int, list[str]]:
    """Decode every frozen sample with the current code: (samples checked, problems found)."""
    problems: list[str] = []
    files = sorted(folder.glob("*/v*.json"))
    for path in files:
        doc = orjson.loads(path.read_bytes())
        task = app.registry.get(doc["task"])
        if task is None:
            problems.append(f"{path}: task {doc['task']!r} is gone, but jobs of it may still be queued")
            continue
        try:
            task.codec.decode(int(doc["version"]), doc["payload"])
        except PayloadError as exc:
            problems.append(f"{path}: {exc}")
    return len(files), problems


def assert_contracts(app: App, folder: Path | str = DEFAULT_DIR) -> int:
    """For your test suite: every frozen sample still decodes and validates. Returns how many were checked."""
    checked, problems = check(app, Path(folder))
    if problems:
        raise AssertionError("payload contracts broken:\n  " + "\n  ".join(problems))
    return checked
