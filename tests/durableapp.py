"""A worker app with a fence database (so dead jobs get failed_jobs rows) and a task that always dies."""

from __future__ import annotations

from ringfence import Permanent, RetryPolicy
from support import worker_app

app = worker_app(fence=True, retry=RetryPolicy(max_attempts=2, base_s=0.1, cap_s=0.2))


@app.task(name="doomed")
async def doomed(ctx, n: int) -> None:
    raise Permanent(f"job {n} cannot succeed")
