"""JSON log lines carry the job's fields; the adapter stamps them."""

from __future__ import annotations

import io
import logging
from types import SimpleNamespace

import orjson

from ringfence import logs


def test_job_logger_lines_are_json_with_the_job_fields() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure(json=True, level="INFO", stream=out)
        ctx = SimpleNamespace(id="j1", task="billing.charge", queue="critical", attempt=2)
        log = logs.job_logger(ctx, logger="ringfence.test")
        log.warning("attempt failed: %s", "timeout")
        log.bind(fence_key="order:42/charge").info("captured", extra={"job_id": "ignored"})
        logging.getLogger("ringfence.test").info("plain", extra={"queue": "low"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    first, second, third = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("level", "logger", "msg", "job_id", "task", "queue", "attempt")} == {
        "level": "WARNING", "logger": "ringfence.test", "msg": "attempt failed: timeout", "job_id": "j1",
        "task": "billing.charge", "queue": "critical", "attempt": 2}
    assert "fence_key" not in first and first["ts"].endswith("+00:00")
    assert second["fence_key"] == "order:42/charge" and second["job_id"] == "j1"
    assert third["queue"] == "low" and "job_id" not in third
