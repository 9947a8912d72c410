"""What the web request does: write the order and its charge job in ONE transaction (the outbox)."""

from sqlalchemy import Connection, insert

from myshop.db import orders
from myshop.jobs import charge_order


def place_order(conn: Connection, amount: int) -> tuple[int, str]:
    order_id = conn.execute(insert(orders).values(amount=amount)).inserted_primary_key[0]
    job_id = charge_order.enqueue_in(conn, order_id=order_id, amount=amount)
    return order_id, job_id
