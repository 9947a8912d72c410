"""A user's App as production runs it: Redis and the fence database from the environment."""

import os

from ringfence import App, RetryPolicy
from ringfence.testing import FakeProvider

app = App(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), namespace="shop",
          fence_url=os.environ.get("SHOP_DATABASE_URL"),
          retry=RetryPolicy(max_attempts=3, base_s=60, cap_s=600, jitter=False))
psp = FakeProvider()
seen: list[tuple[str, int, int]] = []  # (what, value, attempt)


@app.task
def charge(ctx, order_id: int, amount: int) -> None:
    with ctx.fence(f"order:{order_id}", "charge", provider_dedup=True, key_window_s=3600) as step:
        if step.done:
            return
        step.effect(lambda: psp.charge(amount, idempotency_key=step.key, order=order_id))


@app.task
def send_receipt(ctx, order_id: int, email: str) -> None:
    seen.append(("receipt", order_id, ctx.attempt))


@app.task
def flaky(ctx, n: int) -> None:
    seen.append(("flaky", n, ctx.attempt))
    if ctx.attempt < 3:
        raise ConnectionError("the mail server hung up")


@app.task(max_attempts=2)
def broken(ctx, n: int) -> None:
    raise LookupError(f"no order {n}")


@app.periodic("0 * * * *")
def hourly(ctx) -> None:
    seen.append(("hourly", ctx.enqueued_ms, ctx.attempt))
