"""The app of tests/test_cluster_pace.py's workers: each start is recorded (id, queue, attempt, time) in the
shared Redis (TEST_RECORD_URL), which no node kill touches."""

from __future__ import annotations

import os
import time

import redis

from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(lease_s=6.0, heartbeat_s=2.0)  # the idle fallback timer (heartbeat_s) well above a wake-up
record = redis.Redis.from_url(os.environ["TEST_RECORD_URL"])


@app.task(name="stamp")
async def stamp(ctx, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"{ctx.id} {ctx.queue} {ctx.attempt} {time.time()}")
