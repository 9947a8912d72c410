"""The app of tests/test_durable_settle.py's workers: ``paid`` waits for a replica to confirm its settling writes
(``durable_settle=True``), ``plain`` does not. Runs are recorded in the shared Redis (TEST_RECORD_URL), which no
failover touches; ``paid`` with n = -1 fails its first attempt (a retry), with n = -2 goes to dead-letter."""

from __future__ import annotations

import dataclasses
import os
import time

import redis

from ringfence import App, RetryPolicy
from support import FAST

ns = os.environ["RINGFENCE_NAMESPACE"]
app = App(namespace=ns, environment="test", replica_timeout_s=float(os.environ["TEST_REPLICA_TIMEOUT_S"]),
          worker=dataclasses.replace(FAST, lease_s=30.0), retry=RetryPolicy(max_attempts=3, base_s=0.1, cap_s=0.2))
record = redis.Redis.from_url(os.environ["TEST_RECORD_URL"])


def _record(ctx, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"{ctx.id} {n} {time.time()} {ctx.attempt}")


@app.task(name="paid", durable_settle=True, permanent=(ValueError,))
async def paid(ctx, n: int) -> None:
    _record(ctx, n)
    if n == -2:
        raise ValueError("refused at once: dead-letter")
    if n < 0 and ctx.attempt == 1:
        raise RuntimeError("first attempt fails")


@app.task(name="plain")
async def plain(ctx, n: int) -> None:
    _record(ctx, n)
