"""The app workers run in the cluster and Sentinel tests: the Redis under test comes from RINGFENCE_REDIS_URL
(any form); runs are recorded in the shared Redis (TEST_RECORD_URL), which no failover touches."""

from __future__ import annotations

import os
import time

import redis

from ringfence import RetryPolicy
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(lease_s=3.0, retry=RetryPolicy(max_attempts=5, base_s=0.1, cap_s=0.5))
record = redis.Redis.from_url(os.environ["TEST_RECORD_URL"])


@app.task(name="noop")
async def noop(ctx, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"{ctx.id} {n} {time.time()} {ctx.attempt}")


@app.task(name="padded")
async def padded(ctx, n: int, pad: str) -> None:
    record.rpush(f"{ns}:test:runs", f"{ctx.id} {n} {time.time()}")
