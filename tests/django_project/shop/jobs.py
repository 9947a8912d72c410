"""The test project's jobs: an App from settings.RINGFENCE and a charge fenced with Django's connection."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connection, transaction

from ringfence import WorkerSettings
from ringfence.contrib.django import make_app
from shop.models import Order

app = make_app(worker=WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                                     shutdown_timeout_s=3.0, server_ttl_s=3.0))


class FakePSP:
    """A payment provider that dedups by idempotency key; its charges live in Redis so that a test and a worker
    process count the same ones (one hash field per real charge)."""

    def __init__(self) -> None:
        self.r = redis.Redis.from_url(settings.RINGFENCE["REDIS_URL"])
        self.key = f"{settings.RINGFENCE['NAMESPACE']}:test:psp"

    def charge(self, amount: int, idempotency_key: str) -> str:
        ref = f"ch_{idempotency_key[:12]}"
        self.r.hsetnx(self.key, idempotency_key, ref)  # a known key: the first answer, no new charge
        return str(self.r.hget(self.key, idempotency_key).decode())

    def count(self) -> int:
        return int(self.r.hlen(self.key))


psp = FakePSP()


@app.task
def charge_order(ctx, order_id: int) -> None:
    order = Order.objects.get(pk=order_id)
    with ctx.fence(f"order:{order_id}", "charge", params={"amount": order.amount},
                   provider_dedup=True, key_window_s=3600) as step:
        if step.done:
            return
        ref = step.effect(lambda: psp.charge(order.amount, idempotency_key=step.key))
        with transaction.atomic():  # the caller's transaction: complete() nests as a savepoint in it
            with step.complete(connection, result={"charge_id": ref}):
                Order.objects.filter(pk=order_id).update(charge_id=ref)
            after_complete(order_id)


def after_complete(order_id: int) -> None:
    """A hook for the tests: code that runs after complete() but inside the caller's atomic()."""


@app.task
def charge_strict(ctx, order_id: int) -> None:
    """No provider dedup, no reconcile hook: a crash after 'calling' parks the step in doubt for a person."""
    with ctx.fence(f"order:{order_id}", "charge_strict", params={}) as step:
        if step.done:
            return
        ref = step.effect(lambda: psp.charge(1, idempotency_key=step.key))
        with step.complete(connection, result={"charge_id": ref}):
            Order.objects.filter(pk=order_id).update(charge_id=ref)


@app.task
def count_orders(ctx) -> int:
    """A job that only reads through the ORM (the tests of connection handling)."""
    return Order.objects.count()
