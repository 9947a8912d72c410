"""task.enqueue_on_commit in the real Django test project on PostgreSQL: through transaction.on_commit, given the
connection or called inside transaction.atomic(); nothing on rollback, a rolled-back inner atomic() drops its
jobs, and outside any atomic() (autocommit) the job leaves at once, as Django runs on_commit callbacks then."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("django_project")


def queued(job_id: str) -> bool:
    from shop.jobs import app

    return app.broker.job_state("default", job_id) == "pending"


def test_sent_after_the_atomic_block_commits_nothing_on_rollback() -> None:
    from django.db import connection, transaction
    from shop.jobs import charge_order
    from shop.models import Order

    with transaction.atomic():
        order = Order.objects.create(amount=100)
        inside = charge_order.enqueue_on_commit(order_id=order.pk)  # no target: Django's default database
        given = charge_order.enqueue_on_commit(connection, order_id=order.pk)
        named = charge_order.enqueue_on_commit(using="default", order_id=order.pk)
        assert not any(queued(j) for j in (inside, given, named))
    assert all(queued(j) for j in (inside, given, named))

    with pytest.raises(RuntimeError), transaction.atomic():
        gone = charge_order.enqueue_on_commit(connection, order_id=order.pk)
        raise RuntimeError("the request fails")
    assert not queued(gone)


def test_inner_atomic_rolled_back_drops_its_jobs() -> None:
    from django.db import transaction
    from shop.jobs import charge_order

    with transaction.atomic():
        kept = charge_order.enqueue_on_commit(order_id=1)
        try:
            with transaction.atomic():  # a savepoint
                dropped = charge_order.enqueue_on_commit(order_id=2)
                raise ValueError("inner step fails")
        except ValueError:
            pass
        with transaction.atomic():
            released = charge_order.enqueue_on_commit(order_id=3)
    assert queued(kept) and queued(released) and not queued(dropped)


def test_outside_atomic_the_job_leaves_at_once_and_payloads_are_checked_at_the_call() -> None:
    from shop.jobs import charge_order

    from ringfence import PayloadError

    assert queued(charge_order.enqueue_on_commit(order_id=4))  # autocommit: nothing to wait for
    with pytest.raises(PayloadError, match="order_id"):
        charge_order.enqueue_on_commit(order_id="four")
