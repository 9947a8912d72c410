"""What not to do: the same charge without a fence."""

import uuid

from sqlalchemy import update

from myshop.db import engine, orders
from myshop.jobs import app
from myshop.payments import charge


@app.task(queue="critical")
def charge_order_naive(ctx, order_id: int, amount: int) -> None:
    charge_id = charge(amount, idempotency_key=uuid.uuid4().hex)  # a new key on every run
    with engine.begin() as conn:
        conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=charge_id))
