"""The app of tests/test_dashboard_truth.py: real workers run it, so each queue state holds a job the way a
worker left it (a retry after a ConnectionError, a second attempt running, a stored result, a dead job)."""

from __future__ import annotations

import asyncio

from ringfence import Permanent, RetryPolicy
from support import worker_app

app = worker_app(retry=RetryPolicy(max_attempts=3, base_s=0.1, cap_s=0.2))


@app.task(name="unreachable", retry=RetryPolicy(max_attempts=3, base_s=3600, cap_s=3600))
def unreachable(ctx, n: int, api_key: str = "") -> None:
    """Waits an hour in retry after its first attempt."""
    raise ConnectionError(f"provider unreachable for order {n}")


@app.task(name="second_try")
async def second_try(ctx, n: int) -> None:
    """Fails its first attempt, then runs (long) on its second."""
    if ctx.attempt == 1:
        raise ConnectionError(f"first try of {n} cut off")
    await asyncio.sleep(120)


@app.task(name="quote", store_result=True)
def quote(ctx, n: int, card_number: str = "") -> dict[str, int]:
    return {"n": n}


@app.task(name="doomed")
def doomed(ctx, n: int) -> None:
    raise Permanent(f"order {n} refused by the provider")
