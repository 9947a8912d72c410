"""A workflow started in the caller's transaction: ``enqueue_on_commit`` starts it once the transaction commits
(PostgreSQL, a real worker process), never after a rollback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import ringfence
from support import database_url
from test_workflow import Served, runs, serve, settled


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The app and one real worker process, shared by this module's tests."""
    yield from serve(redis_url, tmp_path_factory)


def test_a_workflow_starts_once_its_transaction_commits_and_never_after_a_rollback(served: Served,
                                                                                     tmp_path: Path) -> None:
    wf = served.wf
    engine = create_engine(database_url("postgresql", tmp_path))
    try:
        with Session(engine) as s, s.begin():
            s.execute(text("select 1"))
            wid = ringfence.chain(wf.add.s(x=1), wf.add.s(x=2)).enqueue_on_commit(s, business_id="order:1")
            assert wf.app.workflow(wid) is None  # not before the commit
        view = settled(wf, wid)
        assert ([st.result for st in view.steps], view.business_id) == ([1, 3], "order:1")

        with pytest.raises(RuntimeError), Session(engine) as s, s.begin():
            s.execute(text("select 1"))
            rolled = ringfence.chord([wf.add.s(x=1)], wf.total.s()).enqueue_on_commit(s)
            raise RuntimeError("roll back")
        time.sleep(1.0)  # a start sent by mistake would have run its first step by now (the one above: ms)
        assert wf.app.workflow(rolled) is None and runs(served.dir, f"{rolled}.0") == 0
    finally:
        engine.dispose()


def test_enqueue_on_commit_refuses_what_is_not_a_transaction(served: Served) -> None:
    with pytest.raises(ringfence.ConfigError, match="str is not a SQLAlchemy Session"):
        ringfence.chain(served.wf.add.s(x=1)).enqueue_on_commit("conn")


def test_a_workflow_written_to_the_outbox_starts_once_the_relay_sends_it(served: Served, tmp_path: Path) -> None:
    from ringfence.outbox.relay import Relay
    from ringfence.outbox.schema import create_outbox

    wf = served.wf
    engine = create_engine(database_url("postgresql", tmp_path))
    try:
        create_outbox(engine)
        with engine.begin() as conn:
            wid = ringfence.chain(wf.add.s(x=1), wf.add.s(x=2)).enqueue_in(conn, business_id="order:2")
        with engine.connect() as conn:
            conn.begin()
            rolled = ringfence.chain(wf.add.s(x=5)).enqueue_in(conn)
            conn.rollback()
        assert wf.app.workflow(wid) is None  # nothing reaches Redis before the relay
        relay = Relay(wf.app, engine=engine)
        relay.run(once=True)
        view = settled(wf, wid)
        assert ([st.result for st in view.steps], view.business_id) == ([1, 3], "order:2")
        assert [runs(served.dir, st.job_id) for st in view.steps] == [1, 1]
        relay.run(once=True)
        assert wf.app.workflow(rolled) is None and runs(served.dir, f"{rolled}.0") == 0
    finally:
        engine.dispose()
