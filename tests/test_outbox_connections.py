"""Every kind of connection enqueue_in takes, on SQLite, PostgreSQL and MariaDB: an AsyncConnection and an
AsyncSession (``aenqueue_in``), a raw DB-API connection (sqlite3, psycopg, PyMySQL); rollback leaves nothing,
commit one row. (Django's ``connection`` inside ``transaction.atomic()``: tests/django_project.)"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import outbox_helpers
from outbox_helpers import rows
from ringfence import App
from support import async_url

db = outbox_helpers.db  # the fixture: SQLite, PostgreSQL and MariaDB


def _app(make_app) -> App:
    app = make_app()

    @app.task(queue="orders", name="charge")
    def charge(ctx, n: int) -> None: ...

    return app


def _payloads(engine: sa.Engine, namespace: str) -> list[Any]:
    return [orjson.loads(r["spec"])["a"]["n"] for r in rows(engine, namespace)]


async def test_an_async_connection_and_an_async_session(make_app, db, namespace) -> None:
    charge = _app(make_app).registry.get("charge")
    engine = create_async_engine(async_url(db.url))
    try:
        async with engine.connect() as conn:
            await conn.begin()
            await charge.aenqueue_in(conn, n=1)
            await conn.rollback()
            await conn.begin()
            await charge.aenqueue_in(conn, n=2)
            await conn.commit()
        async with AsyncSession(engine) as session:
            async with session.begin():
                await charge.aenqueue_in(session, n=3)
            with pytest.raises(RuntimeError):
                async with session.begin():
                    await charge.aenqueue_in(session, n=4)
                    raise RuntimeError("the app's transaction fails")
    finally:
        await engine.dispose()
    assert _payloads(db, namespace) == [2, 3]


async def test_the_sync_method_refuses_an_async_connection(make_app, db) -> None:
    charge = _app(make_app).registry.get("charge")
    engine = create_async_engine(async_url(db.url))
    try:
        async with engine.connect() as conn:
            with pytest.raises(TypeError, match="aenqueue_in"):
                charge.enqueue_in(conn, n=1)
    finally:
        await engine.dispose()


def _raw(engine: sa.Engine) -> Any:
    url = engine.url
    if engine.dialect.name == "sqlite":
        return sqlite3.connect(url.database)
    if engine.dialect.name == "postgresql":
        import psycopg

        return psycopg.connect(host=url.host, port=url.port, user=url.username, dbname=url.database)
    import pymysql

    return pymysql.connect(host=url.host, port=url.port, user=url.username, database=url.database)


def test_a_dbapi_connection(make_app, db, namespace) -> None:
    charge = _app(make_app).registry.get("charge")
    raw = _raw(db)
    try:
        charge.enqueue_in(raw, n=1)
        raw.rollback()
        charge.enqueue_in(raw, n=2)
        charge.enqueue_in(raw, n=3)
        raw.commit()
    finally:
        raw.close()
    assert _payloads(db, namespace) == [2, 3]


def test_something_else_is_refused_by_name(make_app) -> None:
    with pytest.raises(TypeError, match="cannot write through a str"):
        _app(make_app).registry.get("charge").enqueue_in("postgresql://", n=1)


def test_a_database_without_the_outbox_table_is_named_with_the_fix(make_app, tmp_path) -> None:
    from ringfence.errors import ConfigError

    charge = _app(make_app).registry.get("charge")
    engine = sa.create_engine(f"sqlite:///{tmp_path}/other.db")
    with engine.connect() as conn, pytest.raises(ConfigError, match=r"has no ringfence_outbox table.*outbox init"):
        charge.enqueue_in(conn, n=1)
    raw = sqlite3.connect(tmp_path / "other.db")
    with pytest.raises(ConfigError, match=r"sqlite3\.Connection passed has no ringfence_outbox table"):
        charge.enqueue_in(raw, n=1)
    raw.close()
