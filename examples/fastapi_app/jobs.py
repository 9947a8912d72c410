"""The jobs of the FastAPI example: one App, its tables, three tasks.

Redis from the environment (RINGFENCE_REDIS_URL, RINGFENCE_NAMESPACE); the shop's database (SHOP_DATABASE_URL,
default SQLite ./shop.db) holds the orders and ringfence's tables, so a charge and its fence commit together;
the worker runs them with ``ringfence worker --app fastapi_app.jobs:app`` and the outbox relay with
``ringfence relay --app fastapi_app.jobs:app``."""

from __future__ import annotations

import os

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, update

from ringfence import App
from ringfence.testing import FakeProvider

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.db")
app = App(fence_url=DATABASE_URL)  # redis_url and namespace from the environment
engine = create_engine(DATABASE_URL)

metadata = MetaData()
orders = Table("orders", metadata,
               Column("id", Integer, primary_key=True),
               Column("amount", Integer, nullable=False),
               Column("status", String(16), nullable=False, default="new"),
               Column("charge_id", String(64)))

psp = FakeProvider()  # stands in for the payment provider's SDK


@app.task(queue="critical")
def charge_order(ctx, order_id: int, amount: int) -> None:
    with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount},
                   provider_dedup=True, key_window_s=23 * 3600) as step:
        if step.done:
            return
        ref = step.effect(lambda: psp.charge(amount, idempotency_key=step.key))
        with step.complete(engine, result={"charge_id": ref}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=ref, status="paid"))


@app.task
def send_cancellation(ctx, order_id: int) -> None:
    print(f"mail: order {order_id} is cancelled")


@app.task(queue="low")
def send_contact_mail(ctx, email: str, message: str) -> None:
    print(f"mail to the team from {email}: {message[:60]}")
