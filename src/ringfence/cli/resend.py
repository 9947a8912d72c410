"""What ``ringfence job resend`` reads: on-commit job records in log lines (text or ``--log-json``) or bare JSON,
every line checked before anything is sent, so a bad line never leaves a file half sent."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import orjson

from ringfence.app import App
from ringfence.errors import RingfenceError
from ringfence.oncommit import options_from_record
from ringfence.settings import check_name
from ringfence.tasks import EnqueueOptions, Task

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Checked:
    """One line's job, ready to send."""

    line: int
    job_id: str
    task: Task
    args: dict[str, Any]
    options: EnqueueOptions


@dataclass(frozen=True)
class Refused:
    line: int
    reason: str


def read(app: App, lines: Iterable[str]) -> tuple[list[Checked], list[Refused], list[str]]:
    """Every line checked: the jobs to send, the lines refused, and notes (a job named twice is sent once)."""
    jobs: dict[str, Checked] = {}
    refused: list[Refused] = []
    notes: list[str] = []
    for number, text in enumerate(lines, 1):
        try:
            record = _record(text)
            if record is None:
                continue
            job = _check(app, number, record)
        except (ValueError, TypeError, KeyError, RingfenceError) as exc:
            refused.append(Refused(number, _reason(exc)))
            continue
        first = jobs.get(job.job_id)
        if first is not None:
            notes.append(f"line {number}: {job.job_id}: the same job as line {first.line}, sent once")
            continue
        jobs[job.job_id] = job
    return list(jobs.values()), refused, notes


def _record(text: str) -> dict[str, Any] | None:
    """The job record a line holds; None for a line without one (another log line, a blank line)."""
    text = text.strip()
    if text.startswith("{"):
        doc = orjson.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if "task" in doc or not isinstance(doc.get("msg"), str):
            return doc  # a bare record (checked next)
        text = doc["msg"]  # a --log-json line: the record is in its message
    return _embedded(text)


def _embedded(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that names a task (a log message ends with the job's record)."""
    start = text.find("{")
    if start < 0:
        return None
    while start >= 0:
        try:
            found, _ = _DECODER.raw_decode(text, start)
        except ValueError:
            found = None
        if isinstance(found, dict) and "task" in found:
            return found
        start = text.find("{", start + 1)
    raise ValueError(f"no complete job record in {text[:100]!r}")


def _check(app: App, number: int, record: dict[str, Any]) -> Checked:
    """Everything enqueue checks without Redis: the id, the task, the payload, the options."""
    job_id, args = record.get("id"), record.get("args")
    if not isinstance(job_id, str) or not job_id:
        raise ValueError("the record has no job id")
    if not isinstance(args, dict):
        raise ValueError(f"job {job_id}: args must be a JSON object")
    options = record.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"job {job_id}: options must be a JSON object")
    if "run_at" in options:
        _iso_date(job_id, options["run_at"])
    task = app.resolve(str(record.get("task")))
    opts = replace(options_from_record(record), raise_on_duplicate=True)
    check_name("job id", job_id)
    task.codec.encode(args)
    app.client.check_options(task, opts)
    return Checked(number, job_id, task, args, opts)


def _iso_date(job_id: str, value: Any) -> None:
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"job {job_id}: run_at {value!r} is not an ISO-8601 date") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, orjson.JSONDecodeError):
        return f"not JSON ({exc})"
    if isinstance(exc, KeyError):
        return f"missing {exc}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
