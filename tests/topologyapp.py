"""The app workers run in the cluster and Sentinel tests: the Redis under test comes from RINGFENCE_REDIS_URL
(any form); runs are recorded in the shared Redis (TEST_RECORD_URL), which no failover touches."""

from __future__ import annotations

import os
import time

import redis

from ringfence import App, RetryPolicy, WorkerSettings

ns = os.environ["RINGFENCE_NAMESPACE"]
app = App(namespace=ns, environment="test",
          worker=WorkerSettings(lease_s=3.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                                shutdown_timeout_s=3.0, server_ttl_s=3.0),
          retry=RetryPolicy(max_attempts=5, base_s=0.1, cap_s=0.5))
record = redis.Redis.from_url(os.environ["TEST_RECORD_URL"])


@app.task(name="noop")
async def noop(ctx, n: int) -> None:
    record.rpush(f"{ns}:test:runs", f"{ctx.id} {n} {time.time()}")


@app.task(name="padded")
async def padded(ctx, n: int, pad: str) -> None:
    record.rpush(f"{ns}:test:runs", f"{ctx.id} {n} {time.time()}")
