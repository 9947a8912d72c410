"""A worker app whose job charges an order through a fenced step. The provider is ringfence.testing's
FakeProvider on a file ($FENCE_PROVIDER_DB) shared by the test and every worker process, so a charge made by a
SIGKILLed worker is counted; it honours the idempotency key the way a real provider does."""

from __future__ import annotations

import os

from sqlalchemy import Column, Integer, MetaData, String, Table, update

from ringfence import RetryPolicy
from ringfence.testing import FakeProvider, LostAnswer
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(fence=True, retry=RetryPolicy(max_attempts=5, base_s=0.1, cap_s=0.3))
md = MetaData()
orders = Table(f"orders_{ns}", md, Column("id", Integer, primary_key=True, autoincrement=False),
               Column("charge_id", String(64)))
provider = FakeProvider(os.environ["FENCE_PROVIDER_DB"])


def engine():
    return app.fence_store.engine


def _charge(ctx, order_id: int, amount: int, dedup: bool = True, **step_options) -> None:
    """The fenced charge. ``dedup=False``: the provider ignores keys (it keeps them as metadata)."""
    with ctx.fence(f"{ns}:order:{order_id}", "charge", params={"amount": amount}, **step_options) as step:
        if step.done:
            return
        ref = step.effect(lambda: provider.charge(amount, step.key, order=order_id, dedup=dedup))
        with step.complete(engine(), result={"charge_id": ref}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=ref))


async def _acharge(ctx, order_id: int, amount: int, dedup: bool = True, **step_options) -> None:
    """The same fenced charge from an async handler."""
    async with ctx.fence(f"{ns}:order:{order_id}", "charge", params={"amount": amount}, **step_options) as step:
        if step.done:
            return
        ref = await step.effect(lambda: provider.charge(amount, step.key, order=order_id, dedup=dedup))
        async with step.complete(engine(), result={"charge_id": ref}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=ref))


@app.task
def charge_dedup(ctx, order_id: int, amount: int) -> None:
    """The provider dedups by the forwarded key: an in-doubt call may be replayed with it."""
    _charge(ctx, order_id, amount, provider_dedup=True, key_window_s=3600)


@app.task
def charge_strict(ctx, order_id: int, amount: int) -> None:
    """No dedup declared and no reconcile hook: an in-doubt call parks the job."""
    _charge(ctx, order_id, amount)


@app.task
async def charge_async(ctx, order_id: int, amount: int) -> None:
    await _acharge(ctx, order_id, amount, provider_dedup=True, key_window_s=3600)


def find_charge(key: str, request: dict) -> str | None:
    """The reconcile hook: look the charge up at the provider by the key it was sent with."""
    from ringfence.fence import NOT_HAPPENED

    found = provider.lookup(key)
    return found if found is not None else NOT_HAPPENED  # type: ignore[return-value]


@app.task
def charge_hooked(ctx, order_id: int, amount: int) -> None:
    """The provider ignores keys; an in-doubt call is settled by the reconcile hook."""
    _charge(ctx, order_id, amount, dedup=False, reconcile=find_charge)


@app.task
def charge_then_fail(ctx, order_id: int, amount: int, mode: str) -> None:
    """Handler bugs that leave a step past capture behind: ``swallow`` catches the effect's error outside the
    fence and returns (the job is acked, the step stays calling); ``permanent`` gives up after the effect."""
    from ringfence.errors import Permanent

    try:
        with ctx.fence(f"{ns}:order:{order_id}", "charge", params={"amount": amount}) as step:
            if mode == "swallow":  # answered, then the answer was lost: the provider committed the charge
                step.effect(lambda: provider.charge(amount, step.key, order=order_id, fault="lost"))
            step.effect(lambda: provider.charge(amount, step.key, order=order_id))
            raise Permanent("the order was cancelled meanwhile")
    except LostAnswer:
        return


def slow_find_charge(key: str, request: dict) -> str | None:
    """A reconcile hook slower than the heartbeat (``HOOK_S``, 1.3 s by default)."""
    import time

    time.sleep(float(os.environ.get("HOOK_S", "1.3")))
    return find_charge(key, request)


@app.task
async def charge_slow_hook_async(ctx, order_id: int, amount: int) -> None:
    """Async handler, provider ignoring keys, a slow sync reconcile hook."""
    await _acharge(ctx, order_id, amount, dedup=False, reconcile=slow_find_charge)


@app.task
def charge_slow_hook_sync(ctx, order_id: int, amount: int) -> None:
    """Sync handler, provider ignoring keys, a slow reconcile hook."""
    _charge(ctx, order_id, amount, dedup=False, reconcile=slow_find_charge)
