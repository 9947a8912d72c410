"""task.enqueue_on_commit against real databases (PostgreSQL, SQLite) and Redis: sent after the outer commit,
never on rollback, savepoints honoured, async sessions, and a Redis lost at commit time (counted, logged, kept,
sent when it returns)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, exc, insert, select, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from ringfence import App, PayloadError, oncommit
from ringfence.fence.aftercommit import kept
from support import FAST, async_url, database_url, wait_until
from topology import HAVE_REDIS, Servers, free_port

DBS = ["postgresql", "sqlite"]


class Receipt(BaseModel):
    order_id: int


@pytest.fixture(params=DBS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Table]]:
    url = database_url(request.param, tmp_path)
    meta = MetaData()
    table = Table(f"oc_{uuid.uuid4().hex[:10]}", meta, Column("id", Integer, primary_key=True),
                  Column("note", String(40)))
    engine = create_engine(url)
    meta.create_all(engine)
    yield url, table
    meta.drop_all(engine)
    engine.dispose()


@pytest.fixture
def app(make_app: Callable[..., App]) -> App:
    return make_app()


def tasks(app: App) -> tuple[Any, Any]:
    @app.task(name="receipt")
    def receipt(ctx: Any, order_id: int) -> None: ...

    @app.task(name="typed", payload=Receipt)
    def typed(ctx: Any, p: Receipt) -> None: ...

    return receipt, typed


def state(app: App, job_id: str) -> str | None:
    return app.broker.job_state("default", job_id)


def test_session_commit_sends_after_the_commit_and_rollback_sends_nothing(app: App, db: tuple[str, Table]) -> None:
    url, table = db
    receipt, typed = tasks(app)
    engine = create_engine(url)
    with Session(engine) as s:
        s.execute(insert(table).values(id=1, note="order"))
        first = receipt.enqueue_on_commit(s, order_id=1)
        second = typed.enqueue_on_commit(s, Receipt(order_id=2))  # the payload-instance form
        assert state(app, first) is None and state(app, second) is None  # not before the commit
        assert kept(s) == 2
        s.commit()
    assert state(app, first) == "pending" and state(app, second) == "pending"
    assert app.broker.job_spec("default", second) is not None
    with Session(engine) as s:
        s.execute(insert(table).values(id=2, note="rolled back"))
        gone = receipt.enqueue_on_commit(s, order_id=2)
        s.rollback()
        s.commit()  # a later commit of the same session does not send what the rollback dropped
    closed = Session(engine)
    never = receipt.enqueue_on_commit(closed, order_id=3)
    closed.close()  # closing with the transaction open rolls it back
    assert state(app, gone) is None and state(app, never) is None
    assert app.on_commit.registry.get_sample_value("ringfence_on_commit_sent_total", {"task": "receipt"}) == 1
    engine.dispose()


def test_session_savepoints(app: App, db: tuple[str, Table]) -> None:
    url, _ = db
    receipt, _ = tasks(app)
    engine = create_engine(url)
    with Session(engine) as s, s.begin():
        outer = receipt.enqueue_on_commit(s, order_id=1)
        with s.begin_nested():
            released = receipt.enqueue_on_commit(s, order_id=2)
            with s.begin_nested():
                inner_released = receipt.enqueue_on_commit(s, order_id=3)
        sp = s.begin_nested()
        dropped = receipt.enqueue_on_commit(s, order_id=4)
        with s.begin_nested():
            in_dropped = receipt.enqueue_on_commit(s, order_id=5)  # released into a savepoint that rolls back
        sp.rollback()
        after = receipt.enqueue_on_commit(s, order_id=6)
        assert all(state(app, j) is None for j in (outer, released, inner_released, after))
    assert [state(app, j) for j in (outer, released, inner_released, after)] == ["pending"] * 4
    assert state(app, dropped) is None and state(app, in_dropped) is None
    with Session(engine) as s, s.begin_nested():  # a savepoint released, then the outer transaction rolled back
        lost = receipt.enqueue_on_commit(s, order_id=7)
        s.begin_nested().commit()
    s.rollback()
    assert state(app, lost) is None
    engine.dispose()


def test_core_connection_commit_rollback_and_savepoints(app: App, db: tuple[str, Table]) -> None:
    url, table = db
    receipt, _ = tasks(app)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(table).values(id=1, note="a"))
        sent = receipt.enqueue_on_commit(conn, order_id=1)
        with conn.begin_nested():
            released = receipt.enqueue_on_commit(conn, order_id=2)
        nested = conn.begin_nested()
        dropped = receipt.enqueue_on_commit(conn, order_id=3)
        nested.rollback()
        assert state(app, sent) is None
    assert state(app, sent) == "pending" and state(app, released) == "pending" and state(app, dropped) is None
    with engine.connect() as conn:
        conn.execute(insert(table).values(id=2, note="b"))
        gone = receipt.enqueue_on_commit(conn, order_id=4)
        conn.rollback()
        later = receipt.enqueue_on_commit(conn, order_id=5)  # begins the connection's next transaction
        conn.commit()
    assert state(app, gone) is None and state(app, later) == "pending"
    with engine.connect() as conn:
        assert conn.execute(select(table.c.id).order_by(table.c.id)).scalars().all() == [1]  # the commit happened
    engine.dispose()


def test_payload_is_checked_at_the_call(app: App, db: tuple[str, Table]) -> None:
    url, _ = db
    receipt, _ = tasks(app)
    engine = create_engine(url)
    with Session(engine) as s:
        with pytest.raises(PayloadError, match="order_id"):
            receipt.enqueue_on_commit(s, order_id="not an int")
        with pytest.raises(PayloadError, match="unknown field"):
            receipt.enqueue_on_commit(s, order_id=1, extra=2)
        assert kept(s) == 0
        s.commit()
    engine.dispose()


def test_a_failed_commit_raises_sqlalchemy_error_and_sends_nothing(app: App, tmp_path: Path) -> None:
    """A deferred constraint fails at COMMIT (PostgreSQL): the Session and the Core Connection both raise
    SQLAlchemy's IntegrityError, and no job leaves."""
    url = database_url("postgresql", tmp_path)
    receipt, _ = tasks(app)
    name = f"oc_{uuid.uuid4().hex[:10]}"
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TABLE {name} (id int, CONSTRAINT {name}_u UNIQUE (id) DEFERRABLE "
                             "INITIALLY DEFERRED)")
    try:
        with Session(engine) as s:
            s.execute(text(f"INSERT INTO {name} VALUES (1), (1)"))  # legal until the commit checks it
            via_session = receipt.enqueue_on_commit(s, order_id=1)
            with pytest.raises(exc.IntegrityError):
                s.commit()
        with engine.connect() as conn:
            conn.execute(text(f"INSERT INTO {name} VALUES (2), (2)"))
            via_conn = receipt.enqueue_on_commit(conn, order_id=2)
            with pytest.raises(exc.IntegrityError):
                conn.commit()
        assert state(app, via_session) is None and state(app, via_conn) is None
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {name}")).scalar() == 0
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE {name}")
        engine.dispose()


def test_past_the_memory_cap_a_job_is_in_the_log_line_only_and_counted(
        tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(oncommit, "MAX_KEPT", 1)
    app = App(f"redis://127.0.0.1:{free_port()}/0", namespace, worker=FAST)
    app.on_commit.retry_for_s = 0.1
    receipt, _ = tasks(app)
    engine = create_engine(database_url("sqlite", tmp_path))
    with caplog.at_level(logging.ERROR, logger="ringfence.oncommit"), Session(engine) as s:
        first, second = receipt.enqueue_on_commit(s, order_id=1), receipt.enqueue_on_commit(s, order_id=2)
        s.commit()
    assert [r["id"] for r in app.on_commit.unsent()] == [first]
    assert app.on_commit.registry.get_sample_value("ringfence_on_commit_dropped_total", {"task": "receipt"}) == 1
    assert any(second in r.getMessage() for r in caplog.records)
    app.close()
    engine.dispose()


async def test_async_session_with_redis_unreachable_keeps_the_job(tmp_path: Path, namespace: str) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    app = App(f"redis://127.0.0.1:{free_port()}/0", namespace, worker=FAST)
    app.on_commit.retry_for_s = 0.1
    receipt, _ = tasks(app)
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/a.db")
    async with AsyncSession(engine) as s:
        job_id = receipt.enqueue_on_commit(s, order_id=5)
        await s.commit()  # returns: the commit happened, the failed send is kept
    assert [r["id"] for r in app.on_commit.unsent()] == [job_id]
    assert app.on_commit.registry.get_sample_value("ringfence_on_commit_unsent_total", {"task": "receipt"}) == 1
    await engine.dispose()
    app.close()


async def test_async_session_and_connection(app: App, db: tuple[str, Table], tmp_path: Path) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    url, table = db
    receipt, _ = tasks(app)
    engine = create_async_engine(async_url(url))
    async with AsyncSession(engine) as s:
        await s.execute(insert(table).values(id=1, note="a"))
        sent = receipt.enqueue_on_commit(s, order_id=1)
        nested = await s.begin_nested()
        dropped = receipt.enqueue_on_commit(s, order_id=2)
        await nested.rollback()
        assert state(app, sent) is None
        await s.commit()
    assert state(app, sent) == "pending" and state(app, dropped) is None
    async with AsyncSession(engine) as s:
        gone = receipt.enqueue_on_commit(s, order_id=3)
        await s.rollback()
    async with engine.connect() as conn:
        via_conn = receipt.enqueue_on_commit(conn, order_id=4)
        await conn.execute(insert(table).values(id=2, note="b"))
        await conn.commit()
    assert state(app, gone) is None and state(app, via_conn) == "pending"
    await engine.dispose()
    await app.broker.aclose()


@pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server")
def test_redis_lost_at_commit_is_counted_logged_kept_and_sent_when_it_returns(
        db: tuple[str, Table], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url, table = db
    port = free_port()
    servers = Servers(tmp_path)
    servers.start(port)
    app = App(f"redis://127.0.0.1:{port}/0", "oc", worker=FAST)
    app.on_commit.retry_for_s = 60.0
    receipt, _ = tasks(app)
    engine = create_engine(url)
    try:
        app.broker.sync.ping()
        servers.kill(port)  # Redis goes away between the request's start and its commit
        with caplog.at_level(logging.ERROR, logger="ringfence.oncommit"), Session(engine) as s:
            s.execute(insert(table).values(id=1, note="paid"))
            job_id = receipt.enqueue_on_commit(s, order_id=1)
            s.commit()  # the commit itself succeeds: the order is stored
        with engine.connect() as conn:
            assert conn.execute(select(table.c.id)).scalars().all() == [1]
        counter = app.on_commit.registry.get_sample_value("ringfence_on_commit_unsent_total", {"task": "receipt"})
        assert counter == 1
        assert app.on_commit.unsent() == [{"id": job_id, "task": "receipt", "args": {"order_id": 1}, "options": {}}]
        line = next(r.getMessage() for r in caplog.records if job_id in r.getMessage())
        assert orjson.loads(line[line.index("{"):]) == app.on_commit.unsent()[0]  # the whole job, to recover it
        with caplog.at_level(logging.WARNING, logger="ringfence.oncommit"):
            servers.start(port)  # Redis is back: the retry thread sends the kept job
            wait_until(lambda: app.broker.job_state("default", job_id) == "pending", timeout=30)
            wait_until(lambda: app.on_commit.unsent() == [])
        assert any(f"job {job_id} sent after all" in r.getMessage() for r in caplog.records)
        assert app.on_commit.registry.get_sample_value("ringfence_on_commit_kept") == 0
    finally:
        app.close()
        servers.stop()
        engine.dispose()


RESEND_APP = """
import os
from ringfence import App

app = App(os.environ["RINGFENCE_REDIS_URL"], os.environ["RINGFENCE_NAMESPACE"])

@app.task(name="receipt")
def receipt(ctx, order_id: int) -> None: ...
"""


def test_closed_port_at_commit_keeps_the_job_for_resend_and_the_cli_sends_it_from_the_log(
        tmp_path: Path, redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    url = database_url("sqlite", tmp_path)
    app = App(f"redis://127.0.0.1:{free_port()}/0", namespace, worker=FAST)  # nothing listens there
    app.on_commit.retry_for_s = 0.2  # the thread gives up fast: what is left is the operator's
    receipt, _ = tasks(app)
    engine = create_engine(url)
    with caplog.at_level(logging.ERROR, logger="ringfence.oncommit"), Session(engine) as s:
        job_id = receipt.with_options(delay_s=30).enqueue_on_commit(s, order_id=9)
        other = receipt.enqueue_on_commit(s, order_id=10)
        s.commit()
    assert [r["id"] for r in app.on_commit.unsent()] == [job_id, other]
    assert app.on_commit.unsent()[0]["options"] == {"delay_s": 30}
    assert app.on_commit.resend() == (0, 2)
    log_file = tmp_path / "app.log"
    log_file.write_text("".join(r.getMessage() + "\n" for r in caplog.records if "not sent (" in r.getMessage()))
    (tmp_path / "resendapp.py").write_text(RESEND_APP)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
           "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "ringfence.cli", "job", "resend", "--app", "resendapp:app", str(log_file)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "2 sent, 0 queued already"
    live = App(redis_url, namespace)
    assert live.broker.job_state("default", job_id) == "scheduled" and live.broker.job_state("default", other)
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)  # a second run sends nothing
    assert again.stdout.splitlines()[-1] == "0 sent, 2 queued already"
    live.close()
    app.close()
    engine.dispose()
