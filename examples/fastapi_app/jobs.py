"""The jobs of the FastAPI example: one App, its tables, three tasks.

Redis from the environment (RINGFENCE_REDIS_URL, RINGFENCE_NAMESPACE); the shop's database (SHOP_DATABASE_URL,
default SQLite ./shop.db) holds the orders and ringfence's tables, so a charge and its fence commit together;
the fake payment provider keeps its ledger in SHOP_PSP_DB (default ./psp.db). The worker runs them with
``ringfence worker --app fastapi_app.jobs:app``, the outbox relay with ``ringfence relay --app fastapi_app.jobs:app``.
An order goes new -> charging (claimed by its charge job) -> paid, or new -> cancelled; never both."""

from __future__ import annotations

import os

from sqlalchemy import CheckConstraint, Column, Integer, MetaData, String, Table, create_engine, update

from ringfence import App
from ringfence.testing import FakeProvider

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.db")
app = App(fence_url=DATABASE_URL)  # redis_url and namespace from the environment
engine = create_engine(DATABASE_URL)

metadata = MetaData()
orders = Table("orders", metadata,
               Column("id", Integer, primary_key=True),
               Column("amount", Integer, CheckConstraint("amount > 0"), nullable=False),  # cents
               Column("status", String(16), nullable=False, default="new"),  # new, charging, paid, cancelled
               Column("charge_id", String(64)))

psp = FakeProvider(os.environ.get("SHOP_PSP_DB", "psp.db"))  # stands in for the payment provider's SDK


def claim_for_charge(order_id: int) -> bool:
    """Move the order to ``charging`` unless it was cancelled or paid meanwhile. Cancelling changes only a ``new``
    order, so the database decides which of the two wins; a rerun finds its own ``charging`` and goes on."""
    with engine.begin() as conn:
        claimed = conn.execute(update(orders).where(orders.c.id == order_id, orders.c.status.in_(["new", "charging"]))
                               .values(status="charging"))
    return claimed.rowcount == 1


@app.task(queue="critical")
def charge_order(ctx, order_id: int, amount: int) -> None:
    if not claim_for_charge(order_id):
        return  # cancelled before the charge started (or already paid): nothing to charge
    with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount},
                   provider_dedup=True, key_window_s=23 * 3600) as step:
        if step.done:
            return
        ref = step.effect(lambda: psp.charge(amount, idempotency_key=step.key))
        with step.complete(engine, result={"charge_id": ref}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id, orders.c.status == "charging")
                         .values(charge_id=ref, status="paid"))


@app.task
def send_cancellation(ctx, order_id: int) -> None:
    print(f"mail: order {order_id} is cancelled")


@app.task(queue="low")
def send_contact_mail(ctx, email: str, message: str) -> None:
    print(f"mail to the team from {email}: {message[:60]}")
