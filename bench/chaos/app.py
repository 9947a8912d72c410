"""The app the chaos run's workers serve: ``ringfence worker --app bench.chaos.app:app``.

Each order is charged once through one of two providers (see ``provider.py``):

- ``chaos.charge_a`` (async handler): provider a deduplicates by key, so an in-doubt call is replayed
  with ``step.key`` (``provider_dedup=True``);
- ``chaos.charge_b`` (sync handler): provider b ignores keys, so an in-doubt call is settled by the
  reconcile hook, which looks the charge up by ``metadata.rf_key`` and adopts it.

``doomed=True`` SIGKILLs the worker right after the provider answered, on every attempt (a dead owner).
Every handler run that ends in an ack writes ``chaos_done`` (job id, order, outcome), so the driver
can tell an acked job from a lost one. Configuration comes from the environment the driver sets.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from typing import Any

from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, insert, update
from sqlalchemy.exc import IntegrityError

from bench.chaos.provider import Client
from ringfence import App
from ringfence.errors import FenceBusy
from ringfence.fence import NOT_HAPPENED
from ringfence.settings import RetryPolicy, WorkerSettings
from ringfence.tasks import JobContext

QUEUE = "chaos"
LEASE_S = float(os.environ.get("CHAOS_LEASE_S", "3"))
SETTINGS = WorkerSettings(lease_s=LEASE_S, heartbeat_s=LEASE_S / 4, recover_interval_s=0.5,
                          promote_interval_s=0.1, shutdown_timeout_s=3.0, server_ttl_s=LEASE_S + 1)
# Every kill orphans the jobs of a whole process: many attempts keep orders alive through the chaos.
RETRY = RetryPolicy(max_attempts=int(os.environ.get("CHAOS_MAX_ATTEMPTS", "25")), base_s=0.1, cap_s=1.0)
DOOMED_ATTEMPTS = 3
EFFECT_TIMEOUT_S = float(os.environ.get("CHAOS_EFFECT_TIMEOUT_S", "2"))
HOOK_DELAY_S = float(os.environ.get("CHAOS_HOOK_DELAY_S", "0"))

metadata = MetaData()
orders = Table("chaos_orders", metadata,
               Column("id", Integer, primary_key=True, autoincrement=False),
               Column("amount", Integer, nullable=False),
               Column("provider", String(1), nullable=False),
               Column("charge_id", String(64)))
# One row per (job, outcome): an attempt may record "duplicate" and a later attempt of the same job charge.
done = Table("chaos_done", metadata,
             Column("job_id", String(64), primary_key=True),
             Column("outcome", String(16), primary_key=True),
             Column("order_id", Integer, nullable=False))


def make_app(redis_url: str | None = None, namespace: str | None = None, fence_url: str | None = None) -> App:
    """The chaos app; without arguments, configured from the environment (the worker side)."""
    app = App(redis_url, namespace, environment="chaos", worker=SETTINGS, retry=RETRY, timeout_s=30.0,
              fence_url=fence_url)
    app.task(name="chaos.charge_a", queue=QUEUE)(charge_a)
    app.task(name="chaos.charge_b", queue=QUEUE)(charge_b)
    return app


@functools.cache
def provider() -> Client:
    tag = f"{os.environ.get('CHAOS_WORKER_TAG', '?')}:{os.getpid()}"
    return Client(os.environ["CHAOS_PROVIDER_URL"], EFFECT_TIMEOUT_S, worker=tag)


def engine() -> Engine:
    """The app's database, where its fences live: completion is one transaction with the order's update."""
    found: Engine = app.fence_store.engine
    return found


def _die_if(doomed: bool) -> None:
    if doomed:  # the provider answered; the fence has not recorded it: the worst moment to die
        os.kill(os.getpid(), signal.SIGKILL)


def _record(job_id: str, order_id: int, outcome: str, conn: Any = None) -> None:
    row = {"job_id": job_id, "order_id": order_id, "outcome": outcome}
    if conn is not None:
        conn.execute(insert(done).values(**row))
        return
    try:
        with engine().begin() as c:
            c.execute(insert(done).values(**row))
    except IntegrityError:
        pass  # an earlier run of this job wrote it, and its ack was lost


def _mark(conn: Any, ctx: JobContext, order_id: int, charge_id: str) -> None:
    conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=charge_id))
    _record(ctx.id, order_id, "charged", conn)


async def charge_a(ctx: JobContext, order_id: int, amount: int, doomed: bool = False) -> None:
    """Provider a dedups by key: an in-doubt call is replayed with the same key."""
    try:
        async with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount},
                             provider_dedup=True, key_window_s=3600) as step:
            if step.done:
                _record(ctx.id, order_id, "done")
                return

            def call() -> str:
                ref = provider().charge_a(order_id, amount, step.key)
                _die_if(doomed)
                return ref

            charge_id = await step.effect(call)
            async with step.complete(engine(), result={"charge_id": charge_id}) as conn:
                _mark(conn, ctx, order_id, charge_id)
    except FenceBusy:
        _record(ctx.id, order_id, "duplicate")
        raise


def find_b(key: str, request: Any) -> str | Any:
    """Reconcile hook of provider b: adopt the charge made with our key, else it did not happen."""
    time.sleep(HOOK_DELAY_S)  # a slow provider search: longer than the heartbeat when asked
    found = provider().find_b(key)
    return found if found is not None else NOT_HAPPENED


def charge_b(ctx: JobContext, order_id: int, amount: int, doomed: bool = False) -> None:
    """Provider b ignores keys: an in-doubt call is looked up by metadata and adopted."""
    try:
        with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount}, reconcile=find_b) as step:
            if step.done:
                _record(ctx.id, order_id, "done")
                return

            def call() -> str:
                ref = provider().charge_b(order_id, amount, step.key)
                _die_if(doomed)
                return ref

            charge_id = step.effect(call)
            with step.complete(engine(), result={"charge_id": charge_id}) as conn:
                _mark(conn, ctx, order_id, charge_id)
    except FenceBusy:
        _record(ctx.id, order_id, "duplicate")
        raise


app = make_app()
