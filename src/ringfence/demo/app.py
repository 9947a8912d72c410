"""The app the demo's worker processes serve: ``ringfence worker --app ringfence.demo.app:app``.

Two handlers charge an order through the fake provider and store the charge id locally:

- ``charge_naive`` checks the order, calls the provider (with a random key per call, as SDKs
  do), then commits the charge id. A kill between the two charges the order twice.
- ``charge_fenced`` does the same inside a fence whose provider key is derived from the
  order, so the rerun after a kill is empty.

Configuration comes from the environment (set by ``ringfence demo``): ``RINGFENCE_REDIS_URL``,
``RINGFENCE_NAMESPACE``, ``RINGFENCE_FENCE_URL`` (the app's database, fences included) and
``RINGFENCE_DEMO_PROVIDER`` (the provider's URL). Importing this module starts nothing.
"""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, select, update

from ringfence import faults
from ringfence.app import App
from ringfence.demo.provider import ProviderClient
from ringfence.settings import RetryPolicy, WorkerSettings
from ringfence.tasks import JobContext

QUEUE = "orders"
# Short leases so a killed worker's jobs come back within seconds, not the default ~20 s.
SETTINGS = WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                          shutdown_timeout_s=2.0, server_ttl_s=3.0)
# Kills orphan attempts; many attempts and short backoff keep every order alive through the chaos.
RETRY = RetryPolicy(max_attempts=20, base_s=0.1, cap_s=0.5)

metadata = MetaData()
orders = Table("demo_orders", metadata,
               Column("id", Integer, primary_key=True, autoincrement=False),
               Column("amount", Integer, nullable=False),
               Column("charge_id", String(64)))


def make_app(redis_url: str | None = None, namespace: str | None = None, fence_url: str | None = None) -> App:
    """The demo app; without arguments, configured from the environment (the worker side)."""
    app = App(redis_url, namespace, environment="demo", worker=SETTINGS, retry=RETRY, timeout_s=30.0,
              fence_url=fence_url)
    app.task(name="demo.charge_naive", queue=QUEUE)(charge_naive)
    app.task(name="demo.charge_fenced", queue=QUEUE)(charge_fenced)
    return app


@functools.cache
def provider() -> ProviderClient:
    return ProviderClient(os.environ["RINGFENCE_DEMO_PROVIDER"])


def engine() -> Any:
    """The app's database: the same one its fences live in, so completion is one transaction."""
    return app.fence_store.engine


def charge_naive(ctx: JobContext, order_id: int, amount: int) -> None:
    """What most handlers look like: check, call, commit. Not safe against a kill after the call."""
    with engine().connect() as c:
        if c.execute(select(orders.c.charge_id).where(orders.c.id == order_id)).scalar() is not None:
            return  # already charged (only if the last run got as far as committing)
    charge_id = provider().charge(order_id, amount, idempotency_key=uuid.uuid4().hex)  # a new key per call
    faults.fault_point("after_effect")  # the provider answered 200; the commit has not happened yet
    with engine().begin() as c:
        c.execute(update(orders).where(orders.c.id == order_id).values(charge_id=charge_id))


def charge_fenced(ctx: JobContext, order_id: int, amount: int) -> None:
    """The same charge behind a fence: at most one provider charge per order, whatever gets killed."""
    # The provider dedups by our key, so an in-doubt call is replayed with it instead of being parked.
    with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount},
                   provider_dedup=True, key_window_s=3600) as step:
        if step.done:
            return
        charge_id = step.effect(lambda: provider().charge(order_id, amount, idempotency_key=step.key))
        with step.complete(engine(), result={"charge_id": charge_id}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=charge_id))


app = make_app()
