"""Structured logs: every line about a job carries its id, task, queue, attempt and fence key.

Example::

    from ringfence import logs

    logs.configure(json=True, level="INFO")        # one JSON object per line on stderr
    log = logs.job_logger(ctx)                     # or logs.job_logger(job_id=..., task=..., queue=..., attempt=...)
    log.warning("attempt failed: %s", err)         # {"ts": ..., "level": "WARNING", "job_id": ..., "task": ...}
    log.bind(fence_key="order:42/charge").info("captured")

Fields passed with ``extra={"job_id": ...}`` to any logger are kept too.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

import orjson

#: The fields a job's log lines carry, in this order.
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "fence_key")
#: Fields of other lines a JSON line carries when present (``summary``: a worker's counts per task, summary.py).
OTHER_FIELDS = ("summary",)
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(job_suffix)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC ISO-8601), level, logger, msg, the job fields and other fields
    present, and exc."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in (*JOB_FIELDS, *OTHER_FIELDS):
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    """The plain format, with the job fields appended as ``key=value`` when present."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        pairs = [f"{n}={getattr(record, n)}" for n in JOB_FIELDS if getattr(record, n, None) is not None]
        record.job_suffix = f" [{' '.join(pairs)}]" if pairs else ""
        return super().format(record)


def configure(json: bool = False, level: str | int = "INFO", stream: Any = None) -> logging.Handler:
    """Set the root logger's one handler: JSON lines or plain text, at ``level``. Returns the handler.

    The CLI group calls it with ``--log-json`` / ``RINGFENCE_LOG_JSON=1``; see :func:`cli_configure`.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


def cli_configure(log_level: str, log_json: bool | None = None) -> None:
    """What the ``ringfence`` group calls: ``log_json`` None reads ``RINGFENCE_LOG_JSON`` (1/true/yes)."""
    import os

    if log_json is None:
        log_json = os.environ.get("RINGFENCE_LOG_JSON", "").lower() in ("1", "true", "yes")
    configure(json=log_json, level=log_level)


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A LoggerAdapter that stamps a job's fields on every record (its own ``extra`` wins over the call's)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(kwargs.get("extra") or {}), **(self.extra or {})}
        return msg, kwargs

    def bind(self, **fields: Any) -> JobLogger:
        """A new adapter with more fields (e.g. ``fence_key`` once the handler enters a fence)."""
        return JobLogger(self.logger, {**(self.extra or {}), **fields})


def job_logger(ctx: Any = None, *, logger: logging.Logger | str = "ringfence.worker", **fields: Any) -> JobLogger:
    """A logger for one job: fields from a JobContext-like ``ctx`` (``id``, ``task``, ``queue``, ``attempt``,
    and ``fence_key`` if it has one) and/or given as keywords (``job_id=...``); None values are left out."""
    base: dict[str, Any] = {}
    if ctx is not None:
        base = {"job_id": getattr(ctx, "id", None), "task": getattr(ctx, "task", None),
                "queue": getattr(ctx, "queue", None), "attempt": getattr(ctx, "attempt", None),
                "fence_key": getattr(ctx, "fence_key", None)}
    base.update(fields)
    named = logging.getLogger(logger) if isinstance(logger, str) else logger
    return JobLogger(named, {k: v for k, v in base.items() if v is not None})
