"""The App and the fenced charge."""

import os

from sqlalchemy import update

from myshop.db import DATABASE_URL, engine, orders
from myshop.payments import charge
from ringfence import App

app = App(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), fence_url=DATABASE_URL)


@app.task(queue="critical")
def charge_order(ctx, order_id: int, amount: int) -> None:
    with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount},
                   provider_dedup=True, key_window_s=23 * 3600) as step:
        if step.done:                     # a rerun of a finished charge: nothing to do
            return
        charge_id = step.effect(lambda: charge(amount, idempotency_key=step.key))
        with step.complete(engine, result={"charge_id": charge_id}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=charge_id))
