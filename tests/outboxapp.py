"""The app that real relay and worker processes in the outbox tests run. ``record`` logs each run in Redis."""

from __future__ import annotations

import os

import redis

from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
relay_s = os.environ.get("TEST_RELAY_S")
app = worker_app(relay_outbox_s=float(relay_s) if relay_s else None)
r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])


@app.task(queue="q1", name="record")
def record(ctx, n: int) -> None:
    r.rpush(f"{ns}:test:runs", f"{ctx.id} {ctx.queue} {n}")


@app.task(queue="q2", name="record2")
def record2(ctx, n: int) -> None:
    r.rpush(f"{ns}:test:runs", f"{ctx.id} {ctx.queue} {n}")
