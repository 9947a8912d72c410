import pytest
from myshop.db import engine, orders
from myshop.jobs import charge_order
from myshop.payments import psp
from myshop.views import place_order
from sqlalchemy import MetaData, func, insert, select

from ringfence.outbox import outbox_table
from ringfence.testing import assert_second_run_empty


def new_order(amount: int) -> int:
    with engine.begin() as conn:
        return conn.execute(insert(orders).values(amount=amount)).inserted_primary_key[0]


def test_the_second_charge_is_empty() -> None:
    report = assert_second_run_empty(
        charge_order,
        payload=lambda n: {"order_id": new_order(1999), "amount": 1999},  # a fresh order per scenario
        effects=lambda: psp.effects,  # real charges, one per distinct idempotency key
    )
    print(report)


def test_an_order_and_its_charge_job_commit_together() -> None:
    outbox = outbox_table(MetaData())

    def jobs_waiting() -> int:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(outbox)).scalar_one()

    before = jobs_waiting()
    with engine.begin() as conn:
        place_order(conn, amount=1999)
    assert jobs_waiting() == before + 1
    with pytest.raises(RuntimeError), engine.begin() as conn:
        place_order(conn, amount=1999)
        raise RuntimeError("the request fails after the order was written")
    assert jobs_waiting() == before + 1  # rolled back: no order, no job


def test_a_placed_order_is_charged_when_its_job_runs(ringfence_worker) -> None:
    with engine.begin() as conn:
        order_id, _ = place_order(conn, amount=1999)
    ringfence_worker.drain()  # relays the outbox row to Redis and runs the job, as relay and worker do
    with engine.connect() as conn:
        charge_id = conn.execute(select(orders.c.charge_id).where(orders.c.id == order_id)).scalar_one()
    assert charge_id in psp.charges  # the provider made that charge
