"""Place one order, as a web request would: python order.py AMOUNT"""

import sys

from myshop.db import engine
from myshop.views import place_order

with engine.begin() as conn:  # commits the order and its charge job together, or neither
    order_id, job_id = place_order(conn, amount=int(sys.argv[1]))
print(f"order {order_id} placed; its charge job {job_id} waits in the outbox")
