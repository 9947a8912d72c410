"""docs/migrating.md's ringfence column, run: each way to define, enqueue, delay, retry, wait for a result and
schedule that the table names works as written (real Redis)."""

from __future__ import annotations

import datetime
from typing import Any

import orjson
import pytest

from ringfence import App, Permanent, ResultTimeout, RetryLater, RetryPolicy


class CardDeclined(Exception):
    pass


@pytest.fixture
def app(make_app: Any) -> App:
    return make_app()


def test_define_and_enqueue_every_way_the_table_shows(app: App) -> None:
    @app.task
    def add(ctx: Any, x: int, y: int) -> int:
        return x + y

    @app.task(queue="critical", max_attempts=5, retry=RetryPolicy(5, 2, 300), permanent=(CardDeclined,),
              retry_delay=lambda attempt, exc: 10.0)
    def charge(ctx: Any, order_id: int) -> None:
        if order_id < 0:
            raise Permanent("no such order")
        raise RetryLater("the provider asked us to wait", delay_s=10)

    b = app.broker
    assert b.job_state("default", add.enqueue(x=2, y=2)) == "pending"
    assert b.job_state("critical", add.with_options(queue="critical").enqueue(x=2, y=2)) == "pending"
    assert b.job_state("default", add.with_options(delay_s=60).enqueue(x=2, y=2)) == "scheduled"
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    assert b.job_state("default", add.with_options(run_at=when).enqueue(x=2, y=2)) == "scheduled"
    assert add.with_options(job_id="x").enqueue(x=2, y=2) == "x"
    first = add.with_options(unique_for=60, unique_key="add:{x}").enqueue(x=7, y=1)
    again = add.with_options(unique_for=60, unique_key="add:{x}").enqueue(x=7, y=2)
    assert again == first  # a second enqueue while the first holds the key returns its id
    by_position = add.enqueue(2, 3)  # values by position bind to the fields in order, stored by name
    assert orjson.loads(b.job_spec("default", by_position)).get("a") == {"x": 2, "y": 3}
    assert charge.options.retry.max_attempts == 5


async def test_async_enqueue(app: App) -> None:
    @app.task
    async def add(ctx: Any, x: int, y: int) -> int:
        return x + y

    assert app.broker.job_state("default", await add.aenqueue(x=2, y=2)) == "pending"


def test_results_are_opt_in_and_waited_for_with_a_timeout(app: App) -> None:
    @app.task(store_result=True, result_ttl_s=3600)
    def add(ctx: Any, x: int, y: int) -> int:
        return x + y

    job_id = add.enqueue(x=2, y=2)
    with pytest.raises(ResultTimeout):
        app.result(job_id, timeout=0.2)  # no worker ran it yet


def test_periodic_registers_a_cron_task(app: App) -> None:
    @app.periodic("*/5 * * * *")
    def cleanup(ctx: Any) -> None: ...

    assert [p.task for p in app.periodics] == [cleanup]


async def test_workflows_as_the_table_shows(app: App) -> None:
    import ringfence
    from ringfence.worker.worker import Worker
    from support import drive

    @app.task
    def add(ctx: Any, x: int, y: int) -> int:
        return x + y

    @app.task
    def mul(ctx: Any, y: int, previous: int) -> int:
        return previous * y

    @app.task
    def tsum(ctx: Any, previous: list[int]) -> int:
        return sum(previous)

    @app.task(store_result=True)
    def b(ctx: Any, x: int) -> int:
        return x

    chained = ringfence.chain(add.s(x=2, y=2), mul.s(y=4)).enqueue()
    grouped = ringfence.group([add.s(x=i, y=i) for i in range(10)]).enqueue()
    chorded = ringfence.chord([add.s(x=i, y=i) for i in range(10)], tsum.s()).enqueue()
    wids = (chained, grouped, chorded)
    a_job = add.enqueue(x=1, y=1)
    b_job = b.with_options(depends_on=[a_job]).enqueue(x=7)
    assert app.broker.job_state(add.options.queue, b_job) == "waiting"

    def done() -> bool:
        return (all((v := app.workflow(w)) is not None and v.state == "done" for w in wids)
                and app.broker.job_state(add.options.queue, b_job) is None)

    await drive(Worker(app, concurrency=8), done)
    last = {w: app.workflow(w).steps[-1].result for w in wids}  # type: ignore[union-attr]
    assert last == {chained: 16, grouped: 18, chorded: 90}
    assert app.result(b_job, timeout=5) == 7
    assert [s.result for s in app.workflow(grouped).steps] == [2 * i for i in range(10)]  # type: ignore[union-attr]
