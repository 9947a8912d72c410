"""complete(db): the fence's completion and the application's writes commit in ONE transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fence_helpers import Backend, OwnerFactory, Provider
from sqlalchemy.orm import Session

from ringfence.errors import FencedOut
from ringfence.fence import Fences, FenceState, create_all, ddl
from support import async_url

SYNC_KINDS = ["engine", "connection", "session", "dbapi"]


def raw_connection(b: Backend) -> Any:
    url = sa.make_url(b.url)
    if b.name == "sqlite":
        return sqlite3.connect(url.database or "", timeout=30)
    if b.name == "postgresql":
        import psycopg

        return psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    import pymysql

    return pymysql.connect(host=url.host, port=url.port or 3306, user=url.username, database=url.database)


@pytest.fixture
def db(backend: Backend, request: pytest.FixtureRequest) -> Iterator[Any]:
    kind = request.param
    if kind == "engine":
        yield backend.engine
    elif kind == "connection":
        with backend.engine.connect() as conn:
            yield conn
    elif kind == "session":
        with Session(backend.engine) as session:
            yield session
    else:
        conn = raw_connection(backend)
        try:
            yield conn
        finally:
            conn.close()


def write_order(b: Backend, conn: Any, order_id: str, charge_id: str) -> None:
    """The application's own write, through whatever complete() yielded."""
    if hasattr(conn, "cursor") and not isinstance(conn, sa.Connection | Session):
        mark = "?" if b.name == "sqlite" else "%s"
        cur = conn.cursor()
        cur.execute(f"INSERT INTO {b.orders.name} (id, charge_id) VALUES ({mark}, {mark})", (order_id, charge_id))
        cur.close()
    else:
        conn.execute(b.orders.insert().values(id=order_id, charge_id=charge_id))


def orders_for(b: Backend, subject: str) -> list[str]:
    with b.engine.connect() as conn:
        return list(conn.execute(sa.select(b.orders.c.charge_id).where(b.orders.c.id == subject)).scalars())


@pytest.mark.parametrize("db", SYNC_KINDS, indirect=True)
def test_sync_completion_commits_both(backend: Backend, db: Any, subject: str, provider: Provider,
                                      make_owner: OwnerFactory) -> None:
    with Fences(backend.store, make_owner()).open(subject, "charge", params={"amount": 1}) as step:
        ref = step.effect(lambda: provider.charge(1, idempotency_key=step.key))
        with step.complete(db, result={"charge_id": ref}) as conn:
            write_order(backend, conn, subject, ref)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.result_value == {"charge_id": ref}
    assert orders_for(backend, subject) == [ref]


@pytest.mark.parametrize("db", SYNC_KINDS, indirect=True)
def test_sync_completion_rolls_back_both(backend: Backend, db: Any, subject: str, provider: Provider,
                                         make_owner: OwnerFactory) -> None:
    with pytest.raises(RuntimeError), \
            Fences(backend.store, make_owner()).open(subject, "charge", params={"amount": 1}) as step:
        ref = step.effect(lambda: provider.charge(1, idempotency_key=step.key))
        with step.complete(db, result={"charge_id": ref}) as conn:
            write_order(backend, conn, subject, ref)
            raise RuntimeError("local write failed")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.EFFECTED and row.completed_at is None
    assert orders_for(backend, subject) == []


@pytest.mark.parametrize("db", SYNC_KINDS, indirect=True)
def test_stale_epoch_rolls_back_the_callers_write(backend: Backend, db: Any, subject: str,
                                                  make_owner: OwnerFactory) -> None:
    def zombie_completes(old: Any) -> None:
        with pytest.raises(FencedOut), old.complete(db) as conn:
            write_order(backend, conn, subject, "never")

    fences = Fences(backend.store, make_owner()), Fences(backend.store, make_owner())
    with pytest.raises(FencedOut), fences[0].open(subject, "charge") as old, \
            fences[1].open(subject, "charge"):  # a takeover: epoch 2
        zombie_completes(old)
    assert orders_for(backend, subject) == []
    row = backend.store.get(subject, "charge")
    assert row is not None and row.epoch == 2


@pytest.mark.parametrize("kind", ["engine", "connection", "session"])
async def test_async_handler_and_completion(backend: Backend, kind: str, subject: str, provider: Provider,
                                            make_owner: OwnerFactory) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(async_url(backend.url))

    async def charge_async() -> str:
        return provider.charge(7, idempotency_key=step.key)

    try:
        async with Fences(backend.store, make_owner()).open(subject, "charge", params={"n": 7}) as step:
            ref = await step.effect(charge_async)
            if kind == "engine":
                async with step.complete(engine, result={"ref": ref}) as conn:
                    await conn.execute(backend.orders.insert().values(id=subject, charge_id=ref))
            elif kind == "connection":
                async with engine.connect() as aconn, step.complete(aconn, result={"ref": ref}) as conn:
                    await conn.execute(backend.orders.insert().values(id=subject, charge_id=ref))
            else:
                async with AsyncSession(engine) as session, step.complete(session, result={"ref": ref}) as s:
                    await s.execute(backend.orders.insert().values(id=subject, charge_id=ref))
        async with Fences(backend.store, make_owner()).open(subject, "charge", params={"n": 7}) as again:
            assert again.done and again.result == {"ref": ref}
    finally:
        await engine.dispose()
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED
    assert orders_for(backend, subject) == [ref] and len(provider.calls) == 1


def test_clean_exit_without_complete_auto_completes(backend: Backend, subject: str, provider: Provider,
                                                    make_owner: OwnerFactory) -> None:
    with Fences(backend.store, make_owner()).open(subject, "email") as step:
        assert step.effect(lambda: None) == ""  # an effect without a reference
    row = backend.store.get(subject, "email")
    assert row is not None and row.state is FenceState.COMPLETED and row.reference == ""


def test_prune_respects_retention(backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    import time

    with Fences(backend.store, make_owner()).open(subject, "cache", retention_s=0.2):
        pass
    with Fences(backend.store, make_owner()).open(subject, "charge"):  # money: kept forever
        pass
    time.sleep(0.4)
    assert backend.store.prune() >= 1
    assert backend.store.get(subject, "cache") is None
    kept = backend.store.get(subject, "charge")
    assert kept is not None and kept.retention_s is None
    assert [r.step for r in backend.store.list_steps(subject=subject)] == ["charge"]


def test_create_all_is_idempotent_and_ddl_names_the_tables(backend: Backend) -> None:
    md = create_all(backend.engine, table_name=backend.store.table.name,
                    failed_jobs_name=f"{backend.store.table.name}_failed")
    try:
        assert set(md.tables) == {backend.store.table.name, f"{backend.store.table.name}_failed"}
        dialect = "mysql" if backend.name == "mariadb" else backend.name
        text = ddl(dialect, table_name="fences_x")
        assert "CREATE TABLE fences_x" in text and "uq_fences_x_key" in text
        assert "CREATE TABLE ringfence_failed_jobs" in text
    finally:
        md.tables[f"{backend.store.table.name}_failed"].drop(backend.engine)
