"""Print the orders and what the provider charged: python orders.py"""

from myshop.db import engine, orders
from myshop.payments import psp
from sqlalchemy import select

with engine.connect() as conn:
    for order in conn.execute(select(orders).order_by(orders.c.id)):
        print(f"order {order.id}: {order.amount} cents, charge {order.charge_id or 'not yet'}")
print(f"the provider charged {psp.effects} time(s)")
