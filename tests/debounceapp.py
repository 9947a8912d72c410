"""The app of tests/test_debounce.py's real worker processes: a task that records each run in Redis."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from support import worker_app

app = worker_app()
_r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])
_ns = os.environ["RINGFENCE_NAMESPACE"]


@app.task(name="note")
def note(ctx: Any, key: str, token: str, sleep_ms: int = 0) -> None:
    """A second run of one id counts in ``test:twice``; ``test:ran`` maps id -> 'token start-time'."""
    if not _r.hsetnx(f"{_ns}:test:ran", ctx.id, f"{token} {time.time()}"):
        _r.incr(f"{_ns}:test:twice")
    time.sleep(sleep_ms / 1000)
