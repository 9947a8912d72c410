"""The app of tests/test_dashboard_tasks.py: task types with known run times and outcomes, run by real workers."""

from __future__ import annotations

import asyncio
import time

from ringfence import Permanent, RetryPolicy
from support import worker_app

app = worker_app(retry=RetryPolicy(max_attempts=1))


@app.task(name="quick")
def quick(ctx, n: int, **kw: object) -> int:
    return n


@app.task(name="slow")
def slow(ctx, n: int) -> None:
    time.sleep(0.3)


@app.task(name="broken")
def broken(ctx, n: int, **kw: object) -> None:
    raise Permanent(f"no provider for {n}")


@app.task(name="later", retry=RetryPolicy(max_attempts=3, base_s=3600, cap_s=3600))
def later(ctx, n: int, **kw: object) -> None:
    raise ConnectionError(f"provider unreachable for {n}")


@app.task(name="long")
async def long(ctx, n: int) -> None:
    await asyncio.sleep(120)
