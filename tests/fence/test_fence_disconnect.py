"""Each fence write survives its database connection being killed (PostgreSQL ``pg_terminate_backend``,
MariaDB ``KILL``), at two moments:

- ``before``: right before the write's statement is sent (the pooled connection died while idle);
- ``after``: the write committed, then the connection died before its COMMIT was answered.

Either way the write runs again on a fresh connection and the protocol ends where it would have without
the kill: a repeated INSERT or conditional UPDATE that finds its own earlier write counts it as done.
Only connections this test's engine opened are killed. Every case runs on a store given an Engine (SQLAlchemy's
execution path, hooked by its ``before_cursor_execute`` event) and on a store built from the URL, whose single
statements go out on driver connections it keeps (``fence/kept_connections.py``, hooked by its ``hooks``).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fence_helpers import Backend, OwnerFactory, Provider
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ringfence.errors import FenceStoreError, InDoubt
from ringfence.fence import NOT_HAPPENED, Fences, FenceState, FenceStore, Owner
from ringfence.fence.dbretry import is_disconnect, make_engine
from support import DATABASES, async_url


class Killer:
    """Kills the connection that runs the n-th write on the fence table (once), before it or after its commit."""

    def __init__(self, engine: sa.Engine, admin: sa.Engine, table: str, app_name: str, direct: Any = None) -> None:
        self.admin, self.table, self.app_name = admin, table, app_name
        self.dialect = engine.dialect.name
        self.n, self.mode, self.seen, self.target = 0, "", 0, table
        self.kind: str | None = None  # count only writes of this kind
        self.writes: list[str] = []  # every write seen since arming, by kind (a failed assertion shows them)
        self.fired: str | None = None  # which write was hit
        self._after_commit = False
        sa.event.listen(engine, "before_cursor_execute", self._before)
        sa.event.listen(engine, "commit", self._commit)
        if direct is not None:  # the store's kept driver connections: the same hook, at the driver
            direct.hooks.append(self._before_direct)

    def arm(self, n: int, mode: str, table: str | None = None, kind: str | None = None) -> None:
        """Fire at the n-th write (of ``kind`` only, when given: a write retried for a reason of its own, seen
        once in CI at a fresh engine's first capture, does not shift the count)."""
        self.n, self.mode, self.seen, self.fired, self._after_commit = n, mode, 0, None, False
        self.target, self.kind, self.writes = table or self.table, kind, []

    def _before(self, conn: sa.Connection, cursor: Any, statement: str, params: Any, context: Any,
                *args: Any) -> None:
        # by name, whatever the paramstyle
        if self._hit(statement, context.compiled_parameters[0]):
            self._fire(conn.connection.dbapi_connection, statement, params)

    def _before_direct(self, dbapi: Any, statement: str, params: Any) -> None:
        """A statement on a kept driver connection (always autocommit)."""
        if self._hit(statement, params):
            self._fire(dbapi, statement, params, autocommit=True)

    def _hit(self, statement: str, named: Any) -> bool:
        if not is_write(statement) or self.target not in statement:
            return False
        kind = write_kind(statement, named) if self.target == self.table else statement.split(None, 1)[0]
        self.writes.append(kind)
        if self.fired or (self.kind is not None and kind != self.kind):
            return False
        self.seen += 1
        if self.seen != self.n:
            return False
        self.fired = kind
        return True

    def _fire(self, dbapi: Any, statement: str, params: Any, autocommit: bool = False) -> None:
        if self.mode == "before":
            self.kill(dbapi)
        elif autocommit or outside_transaction(dbapi):  # a write in autocommit: no COMMIT to wait for
            dbapi.cursor().execute(statement, params)  # the write is now durable ...
            self.kill(dbapi)  # ... and the answer to the very same statement never arrives
        else:
            self._after_commit = True

    def _commit(self, conn: sa.Connection) -> None:
        if not self._after_commit:
            return
        self._after_commit = False
        dbapi = conn.connection.dbapi_connection
        dbapi.commit()  # the write is now durable ...
        if self.dialect == "postgresql":  # ... and SQLAlchemy's own COMMIT must reach the server
            dbapi.cursor().execute("SELECT 1")
        self.kill(dbapi)  # ... whose answer never arrives

    def kill(self, dbapi: Any) -> None:
        dbapi = getattr(dbapi, "driver_connection", dbapi)  # an asyncio driver's own connection
        with self.admin.connect() as c:
            if self.dialect == "postgresql":
                pid = dbapi.info.backend_pid
                c.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE pid = :pid AND application_name = :app"), {"pid": pid, "app": self.app_name})
                gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = :id"
            else:
                pid = dbapi.thread_id()
                c.execute(sa.text(f"KILL {int(pid)}"))
                gone = "SELECT count(*) FROM information_schema.processlist WHERE id = :id"
            deadline = time.monotonic() + 5
            while c.execute(sa.text(gone), {"id": pid}).scalar() and time.monotonic() < deadline:
                time.sleep(0.01)


def outside_transaction(dbapi: Any) -> bool:
    """An autocommit connection with no explicit transaction open (psycopg: the completion switches the flag on
    and sends its own BEGIN, so the flag alone does not say it)."""
    if getattr(dbapi, "autocommit", False) is not True:
        return False
    info = getattr(dbapi, "info", None)
    return info is None or info.transaction_status == 0  # psycopg: idle


def is_write(statement: str) -> bool:
    """An INSERT (alone, or PostgreSQL's capture: ``WITH ins AS (INSERT ...) SELECT ...``) or an UPDATE."""
    return "INSERT INTO" in statement or statement.lstrip().startswith("UPDATE")


def write_kind(statement: str, params: Any) -> str:
    """Which fence write a statement is: capture, takeover, or the state it writes (else "lease")."""
    if "INSERT INTO" in statement:
        return "capture"
    if "epoch + " in statement:
        return "takeover"
    return str(params.get("state") or "lease")  # the SET value; the WHERE's is ``state_1``


@pytest.fixture(params=["engine", "url"])
def rig(backend: Backend, request: pytest.FixtureRequest,
        caplog: pytest.LogCaptureFixture) -> Iterator[tuple[FenceStore, Killer]]:
    """A store given an Engine, or built from the URL (its single statements on kept driver connections)."""
    if backend.name == "sqlite":
        pytest.skip("SQLite has no connection to kill")
    caplog.set_level(logging.DEBUG, logger="ringfence.fence")  # a failure shows each retry and the error behind it
    app_name = f"rf-disc-{uuid.uuid4().hex[:8]}"
    pg = backend.name == "postgresql"
    admin = sa.create_engine(backend.url, isolation_level="AUTOCOMMIT")
    if request.param == "engine":
        engine = make_engine(backend.url, connect_args={"application_name": app_name} if pg else {})  # no pre-ping
        store = FenceStore(engine, table_name=backend.store.table.name)
    else:
        store = FenceStore(backend.url + (f"?application_name={app_name}" if pg else ""),
                           table_name=backend.store.table.name)
        engine = store.engine
        assert store.direct is not None
    try:
        yield store, Killer(engine, admin, store.table.name, app_name, store.direct)
    finally:
        engine.dispose()
        admin.dispose()


def orders_of(backend: Backend, subject: str) -> list[str]:
    with backend.engine.connect() as conn:
        return list(conn.execute(sa.select(backend.orders.c.charge_id).where(backend.orders.c.id == subject)).scalars())


def charge(backend: Backend, store: FenceStore, owner: Owner, subject: str, provider: Provider, **opts: Any) -> str:
    with Fences(store, owner).open(subject, "charge", params={"amount": 5}, **opts) as step:
        ref = step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        with step.complete(store.engine, result={"ref": ref}) as conn:
            conn.execute(backend.orders.insert().values(id=subject, charge_id=ref))
    return ref


def died_calling(store: FenceStore, owner: Owner, subject: str, provider: Provider, **opts: Any) -> None:
    """A first attempt that called the provider and died before recording the answer."""

    def crash() -> str:
        provider.charge(5, idempotency_key=step.key)
        raise ConnectionResetError("the process died after the call")

    with pytest.raises(ConnectionResetError), Fences(store, owner).open(
            subject, "charge", params={"amount": 5}, **opts) as step:
        step.effect(crash)


def auto_complete(store: FenceStore, owner: Owner, subject: str, provider: Provider, **opts: Any) -> None:
    with Fences(store, owner).open(subject, "charge", params={"amount": 5}, **opts) as step:
        step.effect(lambda: provider.charge(5, idempotency_key=step.key))


MODES = ["before", "after"]


def cases(writes: list[str], skip: tuple[str, str] | None = None) -> list[Any]:
    """(n, name, mode) for each write of a flow, in the order the flow makes them."""
    return [pytest.param(n, name, mode, id=f"{n}-{name}-{mode}") for n, name in enumerate(writes, 1)
            for mode in MODES if (name, mode) != skip]


# Fresh step; the completion UPDATE is the first statement of the caller's Engine transaction.
@pytest.mark.parametrize(("write", "name", "mode"), cases(["capture", "calling", "effected", "completed"]))
def test_fresh_step_survives_a_kill_at_each_write(backend: Backend, rig: Any, subject: str, provider: Provider,
                                                  make_owner: OwnerFactory, write: int, name: str, mode: str) -> None:
    store, killer = rig
    killer.arm(write, mode)
    ref = charge(backend, store, make_owner(), subject, provider)
    assert killer.fired == name
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 1 and row.reference == ref
    assert orders_of(backend, subject) == [ref] and len(provider.calls) == 1


@pytest.mark.parametrize("kind", ["engine", "session"])
def test_a_lost_commit_answer_of_the_callers_completion_is_confirmed_by_the_fence_row(
        backend: Backend, rig: Any, subject: str, provider: Provider, make_owner: OwnerFactory, kind: str) -> None:
    """The caller's transaction (fence UPDATE + its writes) committed, the answer was lost: the fence reads its
    row on a fresh connection, finds it completed at its epoch, and the handler goes on as if nothing happened."""
    store, killer = rig
    with Fences(store, make_owner()).open(subject, "charge", params={"amount": 5}) as step:
        ref = step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        killer.arm(1, "after")
        if kind == "engine":
            with step.complete(store.engine, result={"ref": ref}) as conn:
                conn.execute(backend.orders.insert().values(id=subject, charge_id=ref))
        else:
            with Session(store.engine) as session, step.complete(session, result={"ref": ref}) as s:
                s.execute(backend.orders.insert().values(id=subject, charge_id=ref))
                s.flush()
    assert killer.fired == "completed"
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.result_value == {"ref": ref}
    assert orders_of(backend, subject) == [ref] and len(provider.calls) == 1


def test_a_connection_dying_inside_the_callers_block_fails_the_attempt_and_the_rerun_completes(
        backend: Backend, rig: Any, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """The fence cannot replay the caller's block: the error reaches the handler, both writes rolled back;
    the job's next attempt takes the step over at ``effected`` and completes it without a second call."""
    store, killer = rig
    killer.arm(1, "before", table=backend.orders.name)
    with pytest.raises(sa.exc.DBAPIError) as err:
        charge(backend, store, make_owner(), subject, provider)
    assert err.value.connection_invalidated and killer.fired == "INSERT"
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.EFFECTED and orders_of(backend, subject) == []
    ref = charge(backend, store, make_owner(), subject, provider)  # the job's retry
    assert orders_of(backend, subject) == [ref] and len(provider.calls) == 1
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2


async def test_async_engine_completion_survives_a_dead_pooled_connection(
        backend: Backend, rig: Any, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """``async with step.complete(async_engine)``: the fence's UPDATE opens the transaction, so a dead
    connection there is replaced before any write of the caller's."""
    from sqlalchemy.ext.asyncio import create_async_engine

    store, killer = rig
    url = async_url(backend.url)
    args = {"application_name": killer.app_name} if backend.name == "postgresql" else {}
    aengine = create_async_engine(url, connect_args=args)
    akiller = Killer(aengine.sync_engine, killer.admin, store.table.name, killer.app_name)
    try:
        async with Fences(store, make_owner()).open(subject, "charge", params={"amount": 5}) as step:
            ref = await step.effect(lambda: provider.charge(5, idempotency_key=step.key))
            akiller.arm(1, "before")
            async with step.complete(aengine, result={"ref": ref}) as conn:
                await conn.execute(backend.orders.insert().values(id=subject, charge_id=ref))
    finally:
        await aengine.dispose()
    assert akiller.fired == "completed"
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and orders_of(backend, subject) == [ref]


# Takeover of a step left calling (its capture INSERT finds the row first); reconcile says NOT_HAPPENED;
# a clean exit auto-completes.
@pytest.mark.parametrize(("write", "name", "mode"),
                         cases(["capture", "takeover", "claimed", "calling", "effected", "completed"]))
def test_takeover_and_reconcile_survive_a_kill_at_each_write(backend: Backend, rig: Any, subject: str,
                                                             provider: Provider, make_owner: OwnerFactory,
                                                             write: int, name: str, mode: str) -> None:
    store, killer = rig
    died_calling(store, make_owner(), subject, provider)
    killer.arm(write, mode)
    auto_complete(store, make_owner(), subject, provider, reconcile=lambda key, request: NOT_HAPPENED)
    assert killer.fired == name
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2
    assert len(provider.calls) == 2  # the crashed call, then the one reconcile declared safe


# Reconcile cannot tell: the step is parked in doubt, never FencedOut.
@pytest.mark.parametrize(("write", "name", "mode"), cases(["capture", "takeover", "in_doubt"]))
def test_parking_survives_a_kill_at_each_write(backend: Backend, rig: Any, subject: str, provider: Provider,
                                               make_owner: OwnerFactory, write: int, name: str, mode: str) -> None:
    store, killer = rig
    died_calling(store, make_owner(), subject, provider)
    killer.arm(write, mode)
    with pytest.raises(InDoubt):
        auto_complete(store, make_owner(), subject, provider, reconcile=lambda key, request: None)
    assert killer.fired == name
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.IN_DOUBT and row.epoch == 2 and len(provider.calls) == 1


# Replay with the same key inside the provider's window: the lease is renewed ("lease") before the call.
@pytest.mark.parametrize(("write", "name", "mode"), cases(["capture", "takeover", "lease", "effected", "completed"]))
def test_replay_survives_a_kill_at_each_write(backend: Backend, rig: Any, subject: str, provider: Provider,
                                              make_owner: OwnerFactory, write: int, name: str, mode: str) -> None:
    store, killer = rig
    opts = {"provider_dedup": True, "key_window_s": 3600}
    died_calling(store, make_owner(), subject, provider, **opts)
    killer.arm(write, mode)
    auto_complete(store, make_owner(), subject, provider, **opts)
    assert killer.fired == name
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2
    assert provider.effects == 1  # the provider deduplicated the replay by its key


# A claimed step whose block fails: its lease ends at once (release, the second write).
@pytest.mark.parametrize("mode", MODES)
def test_release_survives_a_kill(backend: Backend, rig: Any, subject: str, make_owner: OwnerFactory,
                                 mode: str) -> None:
    store, killer = rig
    killer.arm(1, mode, kind="lease")
    with pytest.raises(ValueError), Fences(store, make_owner()).open(subject, "charge"):
        raise ValueError("bad input, nothing called")
    assert killer.fired == "lease", killer.writes
    assert killer.writes[0] == "capture" and killer.writes.count("lease") == 2, killer.writes  # killed, then again
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and not row.lease_live


def test_retries_are_bounded_then_the_error_surfaces(backend: Backend, rig: Any, subject: str,
                                                     make_owner: OwnerFactory) -> None:
    """A database that stays gone: the write gives up after its budget and raises FenceStoreError, the driver's
    error as its cause."""
    from ringfence.fence.dbretry import DbRetry

    store, killer = rig
    store.retry = DbRetry(attempts=3, base_s=0.01, cap_s=0.02)
    kills: list[Callable[[], None]] = []

    def kill_every_write(conn: sa.Connection, cursor: Any, statement: str, *args: Any) -> None:
        if "INSERT INTO" in statement and store.table.name in statement:
            kills.append(lambda: None)
            killer.kill(conn.connection.dbapi_connection)

    def kill_every_direct_write(dbapi: Any, statement: str, params: Any) -> None:
        if "INSERT INTO" in statement and store.table.name in statement:
            kills.append(lambda: None)
            killer.kill(dbapi)

    sa.event.listen(store.engine, "before_cursor_execute", kill_every_write)
    if store.direct is not None:
        store.direct.hooks.append(kill_every_direct_write)
    with pytest.raises(FenceStoreError) as err, Fences(store, make_owner()).open(subject, "charge"):
        pass
    cause = err.value.__cause__
    assert isinstance(cause, DBAPIError) and cause.connection_invalidated and len(kills) == 3
    sa.event.remove(store.engine, "before_cursor_execute", kill_every_write)
    assert store.get(subject, "charge") is None


def test_a_kept_completion_connection_that_died_is_replaced(backend: Backend, rig: Any, subject: str,
                                                            provider: Provider, make_owner: OwnerFactory) -> None:
    """A connection an unused ``step.complete(engine)`` left kept (lazy.py) dies while idle: the next completion
    that writes finds it dead at the fence's UPDATE and runs on a fresh one, once."""
    from ringfence.fence.lazy import _spares

    store, killer = rig
    with Fences(store, make_owner()).open(f"{subject}-warm", "charge") as step:
        step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        with step.complete(store.engine):
            pass  # sends nothing: its connection is kept
    kept = list(_spares[store.engine].conns)
    assert kept
    for conn in kept:
        killer.kill(conn.connection.dbapi_connection)
    ref = charge(backend, store, make_owner(), subject, provider)
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.reference == ref
    assert orders_of(backend, subject) == [ref] and len(provider.calls) == 2


def test_a_socket_closed_under_psycopg_counts_as_a_disconnect() -> None:
    """psycopg says "connection socket closed" when the socket is gone under it. Not counted as a disconnect, the
    connection went to a ROLLBACK that psycopg refuses ("another command is already in progress"), and the fence
    write failed instead of running again on a new connection (seen once in CI, at the 'effected' write)."""
    url = DATABASES["postgresql"]
    assert url is not None
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
            os.close(conn.connection.driver_connection.pgconn.socket)  # type: ignore[union-attr]
            with pytest.raises(DBAPIError) as caught:
                conn.execute(sa.text("SELECT 1"))
            assert "connection socket closed" in str(caught.value.orig) and is_disconnect(caught.value)
        with engine.connect() as conn:  # the pool replaced it
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()
