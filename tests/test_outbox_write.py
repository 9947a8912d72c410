"""task.enqueue_in writes the job in the caller's transaction: a rollback leaves no row, a commit one row with
the job's options; the payload is checked exactly as task.enqueue checks it, before anything is written."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import sqlalchemy as sa
from pydantic import BaseModel

import outbox_helpers
from outbox_helpers import rows
from ringfence import App
from ringfence.errors import ConfigError, PayloadError

db = outbox_helpers.db  # the fixture: SQLite, PostgreSQL and MariaDB


class Order(BaseModel):
    order_id: int


def _app(make_app, db_engine: sa.Engine) -> App:
    app = make_app(fence_url=str(db_engine.url.render_as_string(hide_password=False)))

    @app.task(queue="orders", name="charge")
    def charge(ctx, order_id: int) -> None: ...

    @app.task(queue="mail", payload=Order, name="receipt")
    def receipt(ctx, payload: Order) -> None: ...

    return app


def test_a_rolled_back_transaction_leaves_no_row_and_a_committed_one_leaves_one(make_app, db, namespace) -> None:
    app = _app(make_app, db)
    charge = app.registry.get("charge")
    with db.connect() as conn:
        conn.begin()
        charge.enqueue_in(conn, order_id=1)
        conn.rollback()
    assert rows(db, namespace) == []
    with db.begin() as conn:
        job_id = charge.enqueue_in(conn, order_id=2)
    [row] = rows(db, namespace)
    assert row["job_id"] == job_id and row["queue"] == "orders" and row["task"] == "charge"
    assert orjson.loads(row["spec"])["a"] == {"order_id": 2} and row["run_at_ms"] is None


def test_a_session_and_options_are_stored(make_app, db, namespace) -> None:
    from sqlalchemy.orm import Session

    app = _app(make_app, db)
    charge = app.registry.get("charge")
    at = datetime.now(UTC) + timedelta(hours=1)
    with Session(db) as session, session.begin():
        charge.with_options(queue="vip", run_at=at, max_attempts=3, unique_for=60,
                            unique_key="order:{order_id}", job_id="order-7").enqueue_in(session, order_id=7)
    [row] = rows(db, namespace)
    spec = orjson.loads(row["spec"])
    assert (row["job_id"], row["queue"], row["run_at_ms"], row["unique_key"]) == (
        "order-7", "vip", int(at.timestamp() * 1000), "order:7")
    assert spec["m"] == 3 and row["unique_until_ms"] == row["run_at_ms"] + 60_000


def test_a_payload_model_instance_is_accepted(make_app, db, namespace) -> None:
    app = _app(make_app, db)
    with db.begin() as conn:
        app.registry.get("receipt").enqueue_in(conn, Order(order_id=9))
    [row] = rows(db, namespace)
    assert orjson.loads(row["spec"])["a"] == {"order_id": 9}


def test_bad_input_raises_what_enqueue_raises_and_writes_nothing(make_app, db, namespace) -> None:
    app = _app(make_app, db)
    charge = app.registry.get("charge")
    cases = [(charge, {"order_id": "x"}), (charge, {"nope": 1}),
             (charge.with_options(delay_s=3600, run_at=datetime.now(UTC)), {"order_id": 1}),
             (charge.with_options(max_attempts=0), {"order_id": 1})]
    for target, payload in cases:
        with pytest.raises((PayloadError, ConfigError)) as direct:
            target.enqueue(**payload)  # the Redis path
        with db.begin() as conn, pytest.raises(type(direct.value)) as written:
            target.enqueue_in(conn, **payload)
        assert str(written.value) == str(direct.value)
    assert rows(db, namespace) == []


def test_raise_on_duplicate_is_refused_in_a_transaction(make_app, db) -> None:
    app = _app(make_app, db)
    with db.begin() as conn, pytest.raises(ConfigError, match="raise_on_duplicate"):
        app.registry.get("charge").with_options(raise_on_duplicate=True).enqueue_in(conn, order_id=1)


def test_a_dbapi_connection(make_app, tmp_path, namespace) -> None:
    from ringfence.outbox import create_outbox

    path = tmp_path / "raw.db"
    create_outbox(sa.create_engine(f"sqlite:///{path}"))
    app = make_app()

    @app.task()
    def ping(ctx, n: int) -> None: ...

    raw = sqlite3.connect(path)
    ping.enqueue_in(raw, n=1)
    raw.rollback()
    job_id = ping.enqueue_in(raw, n=2)
    raw.commit()
    found = raw.execute("SELECT job_id, spec FROM ringfence_outbox WHERE namespace = ?", (namespace,)).fetchall()
    assert [(j, orjson.loads(s)["a"]) for j, s in found] == [(job_id, {"n": 2})]
    raw.close()
