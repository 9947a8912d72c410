"""What one fenced step costs on the wire (PostgreSQL, MariaDB), counted as ``python -m bench --only fence`` counts
it (libpq's protocol trace / PyMySQL's commands), and the rules of a step captured already ``calling``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from bench.fence_bench import store_targets, summarize, transactions, wire_trace
from fence_helpers import Backend, OwnerFactory, Provider

from ringfence import faults
from ringfence.errors import FencedOut
from ringfence.fence import Fences, FenceState, FenceStore
from support import kill_at

DEDUP = {"provider_dedup": True, "key_window_s": 3600}


def one_job(store: FenceStore, owner: Any, subject: str, provider: Provider, **opts: Any) -> None:
    with Fences(store, owner).open(subject, "charge", params={"amount": 5}, **opts) as step:
        if step.done:
            return
        ref = step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        with step.complete(store.engine, result={"ref": ref}):
            pass


@pytest.mark.parametrize(("opts", "trips", "xacts"), [(DEDUP, 3, 3), ({}, 4, 4)], ids=["dedup", "strict"])
def test_round_trips_and_transactions_of_one_fenced_step(url_store: FenceStore, subject: str, provider: Provider,
                                                         make_owner: OwnerFactory, opts: dict[str, Any],
                                                         trips: int, xacts: int) -> None:
    one_job(url_store, make_owner(), f"{subject}-warm", provider, **opts)  # connect, warm the caches
    with wire_trace(*store_targets(url_store)) as fresh:
        one_job(url_store, make_owner(), subject, provider, **opts)
    with wire_trace(*store_targets(url_store)) as rerun:
        one_job(url_store, make_owner(), subject, provider, **opts)
    assert len(fresh) <= trips and transactions(fresh) <= xacts, summarize(fresh)
    assert len(rerun) <= 1 and transactions(rerun) <= 1, summarize(rerun)
    row = url_store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and provider.effects == 2  # warm-up + this one


def test_a_dedup_step_is_captured_calling_and_a_failed_block_puts_it_back(
        backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    with pytest.raises(ValueError), Fences(backend.store, make_owner()).open(subject, "charge", params={"a": 1},
                                                                             **DEDUP):
        row = backend.store.get(subject, "charge")
        assert row is not None and row.state is FenceState.CALLING and row.request == '{"a":1}'
        raise ValueError("bad input before the effect")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and row.request is None and not row.lease_live


def test_a_dedup_step_without_an_effect_completes(backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    with Fences(backend.store, make_owner()).open(subject, "charge", params={"a": 1}, **DEDUP) as step:
        assert not step.done
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED


def test_a_dedup_step_stores_the_request_its_effect_names(backend: Backend, subject: str, provider: Provider,
                                                          make_owner: OwnerFactory) -> None:
    with Fences(backend.store, make_owner()).open(subject, "charge", params={"a": 1}, **DEDUP) as step:
        step.effect(lambda: provider.charge(5, idempotency_key=step.key), request={"amount": 5})
        assert step.request == {"amount": 5}
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.request_value == {"amount": 5}


def test_a_dedup_step_killed_before_its_call_is_replayed_with_the_same_key(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """Killed right after the capture (already calling): the rerun finds calling with no reference and replays
    with the same key, as the in-doubt rule says; the provider sees one effect."""
    with pytest.raises(faults.SimulatedKill), kill_at("after_capture"):
        one_job(backend.store, make_owner(), subject, provider, **DEDUP)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CALLING and provider.calls == []
    one_job(backend.store, make_owner(), subject, provider, **DEDUP)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2 and provider.effects == 1


def test_a_strict_step_killed_after_capture_is_still_taken_over(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """Without provider_dedup the capture stays ``claimed``: a kill before the call is a safe takeover."""
    with pytest.raises(faults.SimulatedKill), faults.inject(
            lambda name: (_ for _ in ()).throw(faults.SimulatedKill(name)) if name == "after_capture" else None):
        one_job(backend.store, make_owner(), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED
    one_job(backend.store, make_owner(), subject, provider)
    assert provider.effects == 1


def test_a_settling_run_never_captures_calling(backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    from dataclasses import replace

    from ringfence.errors import SettleOnly

    owner = replace(make_owner(), settle_only=True)
    with pytest.raises(SettleOnly), Fences(backend.store, owner).open(subject, "charge", params={"a": 1},
                                                                      **DEDUP) as step:
        assert backend.store.get(subject, "charge").state is FenceState.CLAIMED  # type: ignore[union-attr]
        step.effect(lambda: "never")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and not row.lease_live


async def test_an_async_fence_runs_its_statements_on_the_loop(url_store: FenceStore, subject: str,
                                                              provider: Provider, make_owner: OwnerFactory,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A store built from a psycopg URL opens an AsyncEngine of the same URL: capture, calling, record and the
    auto-completion of an ``async with`` fence with an ``async def`` effect use no thread at all (neither the
    thread hop, offloop.HOP, nor the loop's executor is asked). Another loop keeps the thread path."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from ringfence.offloop import HOP

    if url_store.engine.dialect.name != "postgresql":
        pytest.skip("the async engine path is psycopg's")

    class Counting(ThreadPoolExecutor):
        submitted = 0

        def submit(self, *args: Any, **kwargs: Any) -> Any:
            Counting.submitted += 1
            return super().submit(*args, **kwargs)

    hop = HOP.run

    async def counted_hop(fn: Any, *args: Any) -> Any:
        Counting.submitted += 1
        return await hop(fn, *args)

    monkeypatch.setattr(HOP, "run", counted_hop)
    loop = asyncio.get_running_loop()
    loop.set_default_executor(Counting(max_workers=2))
    key: list[str] = []

    async def charge() -> str:
        return provider.charge(5, idempotency_key=key[0])

    async def job(s: str, **opts: Any) -> None:
        async with Fences(url_store, make_owner()).open(s, "charge", params={"amount": 5}, **opts) as step:
            key[:] = [step.key]
            await step.effect(charge)

    await job(f"{subject}-warm")  # opens the AsyncEngine (its first connection)
    Counting.submitted = 0
    await job(subject)
    await job(f"{subject}-2", **DEDUP)
    await job(subject)  # a rerun: done
    assert Counting.submitted == 0
    assert url_store.async_store() is not None
    for s in (subject, f"{subject}-2"):
        row = url_store.get(s, "charge")
        assert row is not None and row.state is FenceState.COMPLETED and row.reference is not None
    assert provider.effects == 3

    other = subject + "-other-loop"

    def on_another_loop() -> None:
        async def run() -> None:
            assert url_store.async_store() is None  # bound to the test's loop: the thread path
            await job(other)
        asyncio.run(run())

    await asyncio.to_thread(on_another_loop)
    row = url_store.get(other, "charge")
    assert row is not None and row.state is FenceState.COMPLETED
    astore = url_store.async_store()
    assert astore is not None
    await astore.aclose()


def test_a_completion_on_the_fence_engine_sends_its_update_before_the_first_statement(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """``step.complete(engine)`` on the fence's own engine sends the UPDATE right before the block's first
    statement (also one sent with ``exec_driver_sql``), on the same connection: a zombie's statement is never
    sent, and the rows commit together."""
    import sqlalchemy as sa

    orders, engine = backend.orders, backend.store.engine
    insert = f"INSERT INTO {orders.name} (id, charge_id) VALUES ('{subject}', 'ch_raw')"
    with Fences(backend.store, make_owner()).open(subject, "charge") as step:
        step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        with step.complete(engine) as conn:
            conn.exec_driver_sql(insert)
    row = backend.store.get(subject, "charge")
    with engine.connect() as c:
        charged = c.execute(sa.select(orders.c.charge_id).where(orders.c.id == subject)).scalars().all()
    assert row is not None and row.state is FenceState.COMPLETED and charged == ["ch_raw"]

    other = f"{subject}-z"
    sent: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine, "after_cursor_execute", note)
    try:
        with pytest.raises(FencedOut), Fences(backend.store, make_owner()).open(other, "charge") as old, \
                Fences(backend.store, make_owner()).open(other, "charge"), \
                old.complete(engine) as conn:  # the second open took it over: epoch 2
            conn.execute(orders.insert().values(id=other, charge_id="never"))
    finally:
        sa.event.remove(engine, "after_cursor_execute", note)
    assert not any(orders.name in s for s in sent)  # the zombie's INSERT never went out
    row = backend.store.get(other, "charge")
    assert row is not None and row.epoch == 2


async def test_an_async_fence_rides_out_its_connections_being_killed(backend: Backend, subject: str,
                                                                     provider: Provider,
                                                                     make_owner: OwnerFactory) -> None:
    """The pooled connections of the store's AsyncEngine are terminated between two fences: the next fence's
    statements find them dead, are retried on fresh connections, and the step completes once."""
    import uuid

    import sqlalchemy as sa

    if backend.name != "postgresql":
        pytest.skip("the async engine path is psycopg's")
    app_name = f"rf-async-{uuid.uuid4().hex[:8]}"
    store = FenceStore(f"{backend.url}?application_name={app_name}", table_name=backend.store.table.name)
    admin = sa.create_engine(backend.url, isolation_level="AUTOCOMMIT")

    async def job(s: str) -> None:
        async with Fences(store, make_owner()).open(s, "charge", params={"amount": 5}) as step:
            await step.effect(lambda: provider.charge(5, idempotency_key=step.key))

    try:
        await job(f"{subject}-warm")
        astore = store.async_store()
        assert astore is not None
        with admin.connect() as c:
            killed = c.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                       "WHERE application_name = :a"), {"a": app_name}).fetchall()
        assert killed
        await job(subject)
        row = store.get(subject, "charge")
        assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 1 and provider.effects == 2
        await astore.aclose()
    finally:
        store.engine.dispose()
        admin.dispose()


def test_the_kept_driver_connections_are_closed_with_the_store_engine(url_store: FenceStore, subject: str,
                                                                     provider: Provider,
                                                                     make_owner: OwnerFactory) -> None:
    """The fence's own statements ran on driver connections the store keeps (opened by an autocommit engine of
    its own); disposing the store's engine closes them and that engine's pool."""
    direct = url_store.direct
    assert direct is not None and direct.engine is not url_store.engine
    one_job(url_store, make_owner(), subject, provider)
    kept = list(direct._idle)
    assert kept and all(not c.broken for c in kept)
    url_store.engine.dispose()
    assert not direct._idle and direct.engine.pool.checkedin() == 0


def test_more_statements_at_once_than_a_pool_holds_never_wait(url_store: FenceStore, subject: str) -> None:
    """The kept connections stay checked out of their engine: 20 statements at once (more than 5 + 10) each get a
    connection at once, at most MAX_IDLE stay kept afterwards, and the store's reads still get theirs."""
    from ringfence.fence.kept_connections import MAX_IDLE

    direct = url_store.direct
    assert direct is not None

    def nested(depth: int) -> int:
        return direct.run(lambda conn: conn.execute(url_store.stmts.get, {"w_subject": subject, "w_step": "x"})
                          and (depth if depth == 20 else nested(depth + 1)))

    assert nested(1) == 20
    assert len(direct._idle) == MAX_IDLE
    assert url_store.list_steps(subject=subject) == [] and url_store.get(subject, "x") is None


def test_the_first_fenced_step_on_a_new_store_prepares_in_the_same_round_trips(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """On psycopg each kept statement is prepared on its connection the first time it runs, its Parse in the
    execution's round trip: the very first step of a new store costs what a later one does, and the next one
    sends no SQL at all (Bind/Execute of the prepared statements)."""
    if backend.name != "postgresql":
        pytest.skip("prepared by pgwire on psycopg only")
    store = FenceStore(backend.url, table_name=backend.store.table.name)
    try:
        with wire_trace(*store_targets(store)) as first:
            one_job(store, make_owner(), subject, provider)
        with wire_trace(*store_targets(store)) as second:
            one_job(store, make_owner(), f"{subject}-2", provider)
        assert len(first) == 4 and transactions(first) == 4, summarize(first)
        assert second == ["(prepared)"] * 4, summarize(second)
    finally:
        store.engine.dispose()


def test_a_kept_statement_takes_the_cursor_for_what_it_cannot_send_as_text(url_store: FenceStore,
                                                                           subject: str) -> None:
    """A parameter libpq would cut (a NUL) goes through psycopg's cursor, which refuses it; the same
    statement then runs prepared again."""
    from sqlalchemy.exc import DBAPIError

    if url_store.engine.dialect.name != "postgresql":
        pytest.skip("prepared by pgwire on psycopg only")
    direct = url_store.direct
    assert direct is not None
    get = url_store.stmts.get
    with pytest.raises(DBAPIError):
        direct.run(lambda conn: conn.execute(get, {"w_subject": "a\x00b", "w_step": "x"}))
    assert url_store.get(subject, "x") is None


def test_an_unused_completion_connection_is_kept_for_the_next_one(url_store: FenceStore, subject: str,
                                                                  provider: Provider,
                                                                  make_owner: OwnerFactory) -> None:
    """``step.complete(engine)`` whose block sent nothing leaves its connection checked out for the next
    completion (no pool checkout per job); disposing the engine closes it."""
    import sqlalchemy as sa

    from ringfence.fence.lazy import SPARE, _spares

    one_job(url_store, make_owner(), f"{subject}-warm", provider)
    checkouts: list[Any] = []

    def counted(*args: Any) -> None:
        checkouts.append(args)

    sa.event.listen(url_store.engine, "checkout", counted)
    try:
        for n in range(3):
            one_job(url_store, make_owner(), f"{subject}-{n}", provider)
    finally:
        sa.event.remove(url_store.engine, "checkout", counted)
    assert checkouts == []
    spares = _spares[url_store.engine]
    assert 1 <= len(spares.conns) <= SPARE
    kept = list(spares.conns)
    url_store.engine.dispose()
    assert not spares.conns and all(c.closed for c in kept)


async def test_an_async_completion_of_the_store_engine_creates_no_async_generator(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """``async with step.complete(engine)`` of the store's own engine on the loop (the path of every async fenced
    job) is plain classes: no async generator is created for the completion (four nested ones cost more CPU than
    its own Python). A block that writes still completes in one transaction with its write."""
    import sys

    import sqlalchemy as sa

    if backend.name != "postgresql":
        pytest.skip("the store's statements run on the loop with psycopg only")
    store = FenceStore(backend.url, table_name=backend.store.table.name)
    orders = backend.orders
    made: list[Any] = []
    old = sys.get_asyncgen_hooks()

    def firstiter(agen: Any) -> None:
        made.append(agen)
        if old.firstiter is not None:
            old.firstiter(agen)

    async def job(s: str, write: bool) -> None:
        async with Fences(store, make_owner()).open(s, "charge", params={"amount": 5}) as step:
            ref = await step.effect(lambda: provider.charge(5, idempotency_key=step.key))
            sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=old.finalizer)
            try:
                async with step.complete(store.engine, result={"ref": ref}) as conn:
                    if write:
                        conn.execute(orders.insert().values(id=s, charge_id=ref))
            finally:
                sys.set_asyncgen_hooks(*old)

    try:
        await job(f"{subject}-warm", False)  # keeps its completion connection for the next one
        await job(subject, False)
        await job(f"{subject}-w", True)
        assert made == []
        for s in (subject, f"{subject}-w"):
            row = store.get(s, "charge")
            assert row is not None and row.state is FenceState.COMPLETED
        with store.engine.connect() as c:
            assert c.execute(sa.select(orders.c.charge_id).where(orders.c.id == f"{subject}-w")).scalar()
        astore = store.async_store()
        assert astore is not None
        await astore.aclose()
    finally:
        store.engine.dispose()


class _Counted:
    """``remove_reader`` of the running loop, counted per file descriptor (the loop's own method still runs)."""

    def __init__(self, loop: Any) -> None:
        self.loop, self.removed = loop, []
        self.real = loop.remove_reader
        loop.remove_reader = self.remove

    def remove(self, fd: int) -> bool:
        self.removed.append(fd)
        return bool(self.real(fd))

    def close(self) -> None:
        del self.loop.remove_reader


@pytest.fixture
async def pg_url_store(url_store: FenceStore) -> Any:
    if url_store.engine.dialect.name != "postgresql":
        pytest.skip("pgwire's async statements are psycopg's")
    yield url_store
    astore = url_store.async_store()
    if astore is not None:
        await astore.aclose()


async def async_job(store: FenceStore, owner: Any, subject: str, provider: Provider) -> None:
    async with Fences(store, owner).open(subject, "charge", params={"amount": 5}) as step:
        ref = await step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        async with step.complete(store.engine, result={"ref": ref}):
            pass


async def test_an_async_kept_connection_keeps_its_reader_between_statements(
        pg_url_store: FenceStore, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """The statements on the loop (capture, completion) leave the socket's reader registered: no reader is
    removed over three fenced jobs, and each completes."""
    await async_job(pg_url_store, make_owner(), f"{subject}-warm", provider)
    counted = _Counted(asyncio.get_running_loop())
    try:
        for i in range(3):
            await async_job(pg_url_store, make_owner(), f"{subject}-{i}", provider)
    finally:
        counted.close()
    assert counted.removed == []
    for i in range(3):
        row = pg_url_store.get(f"{subject}-{i}", "charge")
        assert row is not None and row.state is FenceState.COMPLETED


async def test_a_watched_idle_connection_the_server_ends_stops_being_watched(
        pg_url_store: FenceStore, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """The server ends a kept connection while it sits idle with its reader registered: the reader wakes with
    nobody waiting, finds the connection gone and is removed (no loop spinning on a closed socket); the next job
    runs on a fresh connection."""
    import sqlalchemy as sa

    await async_job(pg_url_store, make_owner(), f"{subject}-warm", provider)
    astore = pg_url_store.async_store()
    assert astore is not None
    kept = list(astore.direct._idle)
    assert kept and all(c.wire is not None and c.wire.watching is not None for c in kept)
    counted = _Counted(asyncio.get_running_loop())
    admin = sa.create_engine(pg_url_store.engine.url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            for conn in kept:
                c.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": conn.raw.info.backend_pid})
        for _ in range(100):
            await asyncio.sleep(0.01)
            if all(c.wire.watching is None for c in kept):
                break
        assert all(c.wire.watching is None for c in kept)
        assert sorted(counted.removed) == sorted(c.wire.fd for c in kept)
    finally:
        counted.close()
        admin.dispose()
    await async_job(pg_url_store, make_owner(), subject, provider)
    row = pg_url_store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 1


async def test_the_cursor_path_on_a_watched_async_connection_then_the_prepared_path_again(
        pg_url_store: FenceStore, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """psycopg's own wait (a parameter pgwire cannot send) replaces and removes the reader pgwire keeps: the next
    prepared statement registers it again and does not wait forever."""
    from sqlalchemy.exc import DBAPIError

    await async_job(pg_url_store, make_owner(), f"{subject}-warm", provider)
    astore = pg_url_store.async_store()
    assert astore is not None
    get = pg_url_store.stmts.get
    with pytest.raises(DBAPIError):
        await astore.direct.run(lambda conn: conn.execute(get, {"w_subject": "a\x00b", "w_step": "x"}))
    async with asyncio.timeout(10):
        await async_job(pg_url_store, make_owner(), subject, provider)
    row = pg_url_store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED


def test_a_sync_completion_of_the_store_engine_runs_one_generator(backend: Backend, subject: str,
                                                                  provider: Provider,
                                                                  make_owner: OwnerFactory) -> None:
    """``with step.complete(engine)`` of the store's own engine: the lazy completion is its one generator (the
    step's, the dispatch's and the error-naming wrappers are plain calls), and the step completes."""
    import inspect
    import sys

    store = backend.store
    gens: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if event == "call" and code.co_flags & inspect.CO_GENERATOR and "ringfence" in code.co_filename:
            gens.append(code.co_name)

    with Fences(store, make_owner()).open(subject, "charge", params={"amount": 5}) as step:
        ref = step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        sys.setprofile(profile)
        try:
            with step.complete(store.engine, result={"ref": ref}):
                pass
        finally:
            sys.setprofile(None)
    assert "lazy_completion" in gens and not {"complete", "sync_completion", "naming_databases"} & set(gens), gens
    row = store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED
