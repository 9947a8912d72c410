"""The app of tests/test_partitions*.py's workers: queue "hot" in TEST_PARTITIONS partitions. Each start is
recorded (key, n, partition, attempt) in the Redis at TEST_RECORD_URL (the test's own single Redis, never a
cluster node: the per-master counts stay the queue's own)."""

from __future__ import annotations

import asyncio
import os

import redis

from ringfence import Permanent, RetryPolicy
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(retry=RetryPolicy(max_attempts=2, base_s=0.05, cap_s=0.1), fence=bool(os.environ.get("FENCE_URL")))
app.queue("hot", partitions=int(os.environ.get("TEST_PARTITIONS", "4")))
record = redis.Redis.from_url(os.environ.get("TEST_RECORD_URL") or os.environ["RINGFENCE_REDIS_URL"])


@app.task(name="keyed", queue="hot", partition_key="k:{key}")
async def keyed(ctx, key: str, n: int, fail: bool = False) -> None:
    record.rpush(f"{ns}:test:runs", f"{key} {n} {ctx.queue} {ctx.attempt} {ctx.id}")
    if fail:
        raise Permanent(f"job {n} of {key} fails")


@app.task(name="spread", queue="hot")
async def spread(ctx, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"- {n} {ctx.queue} {ctx.attempt} {ctx.id}")


@app.task(name="limited", queue="hot", concurrency_key="acct:{key}", concurrency_limit=1)
async def limited(ctx, key: str, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"{key} {n} {ctx.queue} {ctx.attempt} {ctx.id}")


@app.task(name="slow", queue="hot", max_attempts=3)
async def slow(ctx, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"- {n} {ctx.queue} {ctx.attempt} {ctx.id}")
    await asyncio.sleep(1.0)
    record.rpush(f"{ns}:test:done", f"{n} {ctx.queue} {ctx.attempt}")


@app.task(name="fenced", queue="hot", max_attempts=20)
def fenced(ctx, n: int) -> None:
    """Its effect (a push to the record Redis) is fenced in the SQL store: once per job, however often it runs."""
    record.rpush(f"{ns}:test:runs", f"- {n} {ctx.queue} {ctx.attempt} {ctx.id}")
    with ctx.fence(f"{ns}:job:{n}", "effect") as step:
        if not step.done:
            record.rpush(f"{ns}:test:effects", n)
