"""The app of tests/test_recycle.py's worker processes: a handler that leaks memory and marks each run in Redis
with the process image that ran it (``BOOT``: new at every start, an exec of the same process id included)."""

from __future__ import annotations

import os
import time
import uuid

import redis

from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(lease_s=6.0)  # a loaded CI machine must not lapse a lease: a rerun here would be a recycling bug
r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])
BOOT = uuid.uuid4().hex[:8]
LEAKED: list[bytearray] = []


@app.task
def leak(ctx, n: int, mb: int, seconds: float = 0.0) -> None:
    LEAKED.append(bytearray(b"\1") * (mb * 2**20))  # written, so resident
    time.sleep(seconds)
    r.rpush(f"{ns}:test:runs", f"{ctx.id} {n} {BOOT} {os.getpid()} {ctx.attempt}")
