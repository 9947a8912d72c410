"""A worker app for the database-storm test: 30 orders charged through a strict fence (no provider dedup,
no reconcile hook) while the test kills this app's database connections.

The provider is ringfence.testing's FakeProvider on a file ($FENCE_PROVIDER_DB), outside the database under
attack; it ignores keys (every call is a charge, kept with its key), so a double effect is visible. On MariaDB
every connection this app opens records its id in Redis: the test kills only those.
"""

from __future__ import annotations

import os
import time

import redis
from sqlalchemy import Column, Integer, MetaData, String, Table, event, update

from ringfence import RetryPolicy
from ringfence.testing import FakeProvider
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(fence=True, retry=RetryPolicy(max_attempts=5, base_s=0.1, cap_s=0.5))
md = MetaData()
orders = Table(f"storm_orders_{ns}", md, Column("id", Integer, primary_key=True, autoincrement=False),
               Column("charge_id", String(64)))
provider = FakeProvider(os.environ["FENCE_PROVIDER_DB"], honours_keys=False)
ids = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])
CONN_IDS = f"{ns}:test:conn_ids"  # MariaDB connection ids this app opened
EFFECT_S = float(os.environ.get("STORM_EFFECT_S", "1.0"))


def engine():
    return app.fence_store.engine


def _record_connection_id(dbapi_conn, record) -> None:
    ids.sadd(CONN_IDS, dbapi_conn.thread_id())


if engine().dialect.name in ("mysql", "mariadb"):
    # The fence's own statements run on a pool of their own (autocommit): both pools are attacked.
    for pooled in {engine(), app.fence_store.auto}:
        event.listen(pooled, "connect", _record_connection_id)


def provider_charge(key: str, order_id: int) -> str:
    ref = provider.charge(0, key, order=order_id)
    time.sleep(EFFECT_S)  # in flight while connections die
    return ref


@app.task
def charge(ctx, order_id: int) -> None:
    with ctx.fence(f"{ns}:order:{order_id}", "charge", params={"order": order_id}) as step:
        if step.done:
            return
        ref = step.effect(lambda: provider_charge(step.key, order_id))
        with step.complete(engine(), result={"charge_id": ref}) as conn:
            conn.execute(update(orders).where(orders.c.id == order_id).values(charge_id=ref))
