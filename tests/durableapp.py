"""A worker app with a fence database (so dead jobs get failed_jobs rows) and a task that always dies."""

from __future__ import annotations

import os

from ringfence import App, Permanent, RetryPolicy, WorkerSettings

app = App(
    namespace=os.environ["RINGFENCE_NAMESPACE"],
    environment="test",
    fence_url=os.environ["FENCE_URL"],
    worker=WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                          shutdown_timeout_s=3.0, server_ttl_s=3.0),
    retry=RetryPolicy(max_attempts=2, base_s=0.1, cap_s=0.2),
)


@app.task(name="doomed")
async def doomed(ctx, n: int) -> None:
    raise Permanent(f"job {n} cannot succeed")
