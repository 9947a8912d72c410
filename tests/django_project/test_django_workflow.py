"""A workflow's enqueue_on_commit in the real Django test project on PostgreSQL: started through
transaction.on_commit once the atomic block commits (given the connection, no target, or ``using``), nothing on
rollback; outside any atomic() (autocommit) it starts at once, as Django runs on_commit callbacks then."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("django_project")


def started(wid: str) -> bool:
    from shop.jobs import app

    view = app.workflow(wid)
    return view is not None and app.broker.job_state("default", view.steps[0].job_id) == "pending"


def test_a_workflow_starts_after_the_atomic_block_commits_nothing_on_rollback() -> None:
    from django.db import connection, transaction
    from shop.jobs import app, charge_order, count_orders
    from shop.models import Order

    import ringfence

    with transaction.atomic():
        order = Order.objects.create(amount=100)
        flow = ringfence.chain(charge_order.s(order_id=order.pk), count_orders.s())
        given = flow.enqueue_on_commit(connection, business_id=f"order:{order.pk}")
        inside = flow.enqueue_on_commit()  # no target: Django's default database
        named = flow.enqueue_on_commit(using="default")
        assert not any(app.workflow(w) for w in (given, inside, named))
    assert all(started(w) for w in (given, inside, named))
    assert app.workflow(given).business_id == f"order:{order.pk}"

    with pytest.raises(RuntimeError), transaction.atomic():
        gone = ringfence.chain(count_orders.s()).enqueue_on_commit(connection)
        raise RuntimeError("the request fails")
    assert app.workflow(gone) is None

    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint rolled back drops it
                dropped = ringfence.chain(count_orders.s()).enqueue_on_commit()
                raise ValueError("inner step fails")
        except ValueError:
            pass
    assert app.workflow(dropped) is None
    assert started(ringfence.chain(count_orders.s()).enqueue_on_commit())  # autocommit: nothing to wait for
