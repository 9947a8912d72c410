"""The app of the dashboard's browser tests: real workers run it, the dashboard process serves it."""

from __future__ import annotations

import os

import redis

from ringfence import Permanent, RetryPolicy
from ringfence.fence.provider import ProviderTable
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(fence=True, retry=RetryPolicy(max_attempts=2, base_s=0.1, cap_s=0.2))
r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])
# the provider's charges, as its callbacks were stored: what the reconcile page compares the fence rows with
app.reconcile_source("charge", ProviderTable("callbacks", "order_id", "charge_id", subject_prefix="order:"))


@app.task(name="noop")
def noop(ctx, n: int, card: str = "") -> None:
    r.rpush(f"{ns}:test:runs", ctx.id)


@app.task(name="flaky")
def flaky(ctx, n: int) -> None:
    """Dies (permanently) while its fail flag is set; runs once the flag is gone."""
    if r.exists(f"{ns}:test:fail"):
        raise Permanent(f"provider down for {n}")
    r.rpush(f"{ns}:test:runs", ctx.id)
