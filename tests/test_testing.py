"""ringfence.testing: the second-run check passes for fenced tasks and fails for unsafe ones."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, select

from ringfence import InDoubt
from ringfence.testing import FakeProvider, assert_second_run_empty, run_job
from support import database_url


@pytest.fixture(params=["sqlite", "postgresql"])
def fence_url(request, tmp_path) -> str:
    return database_url(request.param, tmp_path)


@pytest.fixture
def env(make_app, fence_url, namespace):
    """An app on ``fence_url``, a provider, and a ledger table (the app's local writes) of its own."""
    app = make_app(fence_url=fence_url)
    engine = app.fence_store.engine
    app.fence_store.create_all()
    md = MetaData()
    ledger = Table(f"ledger_{namespace}", md, Column("id", Integer, primary_key=True),
                   Column("order_id", Integer), Column("charge_id", String(64)))
    md.create_all(engine)
    yield app, FakeProvider(), engine, ledger
    md.drop_all(engine)
    engine.dispose()


def _effects(provider: FakeProvider, engine, ledger):
    def count() -> dict[str, int]:
        with engine.connect() as c:
            rows = c.execute(select(func.count()).select_from(ledger)).scalar_one()
        return {"charges": len(provider.charges), "rows": int(rows)}

    return count


def orders(provider: FakeProvider) -> list[tuple[int, int]]:
    """(order, amount) of each charge made, in order."""
    return [(c.order, c.amount) for c in provider.records()]


def _payload(base: int):
    return lambda n: {"order_id": base + n, "amount": 5}


def fenced_task(env, **step_options):
    app, provider, engine, ledger = env
    unique = uuid.uuid4().hex[:8]  # unique subjects: the PostgreSQL fence table is shared

    @app.task(name=f"charge_{unique}")
    def charge(ctx, order_id: int, amount: int) -> str:
        with ctx.fence(f"{unique}:order:{order_id}", "charge", params={"amount": amount}, **step_options) as step:
            if step.done:
                return step.result["charge_id"]
            ref = step.effect(lambda: provider.charge(amount, idempotency_key=step.key, order=order_id))
            with step.complete(engine, result={"charge_id": ref}) as conn:
                conn.execute(insert(ledger).values(order_id=order_id, charge_id=ref))
            return ref

    return charge


def test_fenced_task_passes(env) -> None:
    task = fenced_task(env, provider_dedup=True, key_window_s=3600)
    report = assert_second_run_empty(task, payload=_payload(1000), effects=_effects(*env[1:]))
    assert [s.outcome for s in report.scenarios] == ["one effect"] * 6, str(report)
    assert not report.parked and not report.failed
    assert orders(env[1]) == [(1000 + n, 5) for n in range(6)]  # one charge per payload


def test_one_liner_with_a_plain_count(env) -> None:
    provider = env[1]
    task = fenced_task(env, provider_dedup=True, key_window_s=3600)
    assert_second_run_empty(task, payload=lambda n: {"order_id": 1000 + n, "amount": 5},
                            effects=provider.records)  # a sized collection: one entry per charge


def test_without_dedup_an_in_doubt_kill_parks_and_is_reported(env) -> None:
    task = fenced_task(env)  # neither provider_dedup nor reconcile
    report = assert_second_run_empty(task, payload=_payload(2000), effects=_effects(*env[1:]))
    parked = {s.name for s in report.parked}
    assert parked == {"kill at after_calling, then reruns", "kill at after_effect, then reruns"}, str(report)
    assert len(env[1].charges) == 5  # clean + after_capture + after_effect + after_record + before_commit


def test_async_handler_passes(env) -> None:
    app, provider, engine, ledger = env

    @app.task(name=f"acharge_{uuid.uuid4().hex[:8]}")
    async def acharge(ctx, order_id: int, amount: int) -> None:
        async with ctx.fence(f"{ctx.task}:order:{order_id}", "charge", params={"amount": amount},
                             provider_dedup=True, key_window_s=3600) as step:
            if step.done:
                return
            ref = await step.effect(lambda: provider.charge(amount, idempotency_key=step.key, order=order_id))
            async with step.complete(engine) as conn:
                conn.execute(insert(ledger).values(order_id=order_id, charge_id=ref))

    report = assert_second_run_empty(acharge, payload=_payload(3000), effects=_effects(provider, engine, ledger))
    assert len(report.scenarios) == 6 and not report.failed


async def test_works_from_async_tests_too(env) -> None:
    task = fenced_task(env, provider_dedup=True, key_window_s=3600)
    report = assert_second_run_empty(task, payload=_payload(3500), effects=_effects(*env[1:]))
    assert not report.failed


def test_naive_task_fails(env) -> None:
    app, provider, engine, ledger = env

    @app.task(name=f"naive_{uuid.uuid4().hex[:8]}")
    def naive(ctx, order_id: int, amount: int) -> None:
        ref = provider.charge(amount, order=order_id)
        with engine.begin() as c:
            c.execute(insert(ledger).values(order_id=order_id, charge_id=ref))

    with pytest.raises(AssertionError) as failure:
        assert_second_run_empty(naive, payload=_payload(4000), effects=_effects(provider, engine, ledger))
    assert "clean run, then a rerun" in str(failure.value) and "charges=1" in str(failure.value)


def test_naive_task_that_checks_its_own_row_still_fails(env) -> None:
    app, provider, engine, ledger = env

    @app.task(name=f"checks_{uuid.uuid4().hex[:8]}")
    def checks(ctx, order_id: int, amount: int) -> None:
        with engine.connect() as c:
            if c.execute(select(ledger.c.id).where(ledger.c.order_id == order_id)).first():
                return
        ref = provider.charge(amount, order=order_id)
        with engine.begin() as c:
            c.execute(insert(ledger).values(order_id=order_id, charge_id=ref))

    with pytest.raises(AssertionError, match="no fault point was reached"):
        assert_second_run_empty(checks, payload=_payload(5000), effects=_effects(provider, engine, ledger))


def test_effect_outside_step_effect_fails(env) -> None:
    app, provider, engine, ledger = env
    unique = uuid.uuid4().hex[:8]

    @app.task(name=f"leaky_{unique}")
    def leaky(ctx, order_id: int, amount: int) -> None:
        with ctx.fence(f"{unique}:order:{order_id}", "charge", params={"amount": amount}) as step:
            if step.done:
                return
            ref = provider.charge(amount, order=order_id)  # not through step.effect: the fence cannot know
            with step.complete(engine) as conn:
                conn.execute(insert(ledger).values(order_id=order_id, charge_id=ref))

    with pytest.raises(AssertionError) as failure:
        assert_second_run_empty(leaky, payload=_payload(6000), effects=_effects(provider, engine, ledger))
    message = str(failure.value)
    assert "kill at before_commit" in message and "got charges=2,rows=1" in message, message


def test_run_job_runs_one_job_with_a_real_context(env) -> None:
    provider = env[1]
    task = fenced_task(env)
    ref = run_job(task, order_id=7, amount=5)
    assert ref == "ch_1" and orders(provider) == [(7, 5)]
    assert run_job(task, order_id=7, amount=5) == "ch_1"  # a second job for the same order: empty
    assert orders(provider) == [(7, 5)]


def test_run_job_propagates_the_handlers_error(env) -> None:
    app = env[0]

    @app.task(name=f"parked_{uuid.uuid4().hex[:8]}")
    def parked(ctx) -> None:
        raise InDoubt("nope")

    with pytest.raises(InDoubt):
        run_job(parked)
