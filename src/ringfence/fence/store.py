"""The SQL fence store: one conditional statement per transition.

Every write after capture is ``WHERE subject=? AND step=? AND epoch=?``; a rowcount of 0
means another run took the fence over (or a person resolved it) and raises ``FencedOut``.
Every time is the database's (``db_now``), never the worker's.

Example::

    store = FenceStore("postgresql+psycopg://app@db/app")
    store.create_all()
    for row in store.list_steps(state="in_doubt"):
        print(row.subject, row.step, row.provider_key)
    store.resolve("order:42", "charge", happened=True, reference="ch_123")
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    MetaData,
    Update,
    and_,
    case,
    delete,
    event,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ..errors import FenceError
from ..faults import fault_point
from . import complete as _complete
from .astore import AsyncFence, async_url
from .dbretry import DEFAULT_RETRY, DbRetry, make_engine, retrying, skip_idle_ends, store_error, watch_disconnects
from .kept_connections import Direct
from .model import COMPLETABLE, FenceRow, FenceState, Owner, StateText, provider_key
from .rows import fenced_out as _fenced_out
from .rows import row_of as _row
from .schema import DEFAULT_TABLE, create_tables, db_now, db_now_plus, fence_table, missing_tables
from .statements import Statements, where

T = TypeVar("T")


class FenceStore:
    """Fences in a SQL database (SQLite, PostgreSQL, MySQL/MariaDB) through a sync Engine.

    The table must live in the application's own database: ``Step.complete(db)`` commits
    the fence's completion in the same transaction as the application's writes.
    """

    def __init__(self, engine_or_url: Engine | str, *, table_name: str = DEFAULT_TABLE,
                 retry: DbRetry = DEFAULT_RETRY) -> None:
        self.engine = watch_disconnects(make_engine(engine_or_url) if isinstance(engine_or_url, str)
                                        else engine_or_url)
        self.metadata = MetaData()
        self.table = fence_table(self.metadata, table_name)
        self.retry = retry  # every statement here rides out a dead connection (dbretry.py)
        self.stmts = Statements(self.table)
        # PostgreSQL: one statement is a transaction of its own, so the single-statement writes and the reads run
        # in autocommit (one round trip instead of BEGIN, the statement, COMMIT). psycopg switches autocommit on
        # the client, without a round trip; the pool is shared. Other databases keep explicit transactions
        # (MySQL drivers send no BEGIN, and switching autocommit there costs a round trip each way).
        self._pg = self.engine.dialect.name == "postgresql"
        self.auto: Engine = self.engine.execution_options(isolation_level="AUTOCOMMIT") if self._pg else self.engine
        self._writes_in_autocommit = self._pg  # single-statement writes in autocommit (one round trip each)
        if not self._pg and isinstance(engine_or_url, str) and "pymysql" in self.engine.dialect.driver:
            # PyMySQL would send `SET autocommit` each way on a shared pool: a small pool of its own, opened in
            # autocommit, for the fence's own single statements (statement alone instead of statement + COMMIT).
            # No overflow limit: the kept driver connections below come from this pool and stay checked out.
            self.auto = make_engine(engine_or_url, isolation_level="AUTOCOMMIT", pool_size=5, max_overflow=-1)
            skip_idle_ends(self.auto)
            self._writes_in_autocommit = True
            event.listen(self.engine, "engine_disposed", lambda _engine: self.auto.dispose())
        # A store built from a psycopg / PyMySQL URL sends its prebuilt single statements on driver connections it
        # keeps (kept_connections.py): SQLAlchemy's execution path cost more CPU than the statements. An Engine
        # passed in keeps SQLAlchemy's path (its events, its pool), as does SQLite.
        self.direct: Direct | None = None
        if isinstance(engine_or_url, str) and self.engine.dialect.driver in ("psycopg", "pymysql"):
            opener = self.auto if self.auto is not self.engine and not self._pg else make_engine(
                engine_or_url, isolation_level="AUTOCOMMIT", pool_size=5, max_overflow=-1)
            direct = self.direct = Direct(opener)
            direct.keep(vars(self.stmts).values())
            event.listen(self.engine, "engine_disposed", lambda _engine: direct.close())
        self._maria_returning: bool | None = None
        self._url_text: str | None = None
        # `async with` fences run their statements on an AsyncEngine of the same URL where there is one (astore.py).
        self._async_url = async_url(engine_or_url) if isinstance(engine_or_url, str) else None
        self._astore: AsyncFence | None = None

    def async_store(self) -> AsyncFence | None:
        """This store's statements on an AsyncEngine of the running event loop (the first loop that asks), or
        None: another loop, no loop, or no async driver for the URL here."""
        if self._async_url is None:
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        if self._astore is None:
            self._astore = AsyncFence(self, self._async_url, loop)
        return self._astore if self._astore.loop is loop else None

    def _read(self, fn: Callable[[Connection], T]) -> T:
        def attempt(_retried: bool) -> T:
            with self.auto.connect() as conn:
                return fn(conn)
        return retrying(self.retry, attempt, "fence read")

    def _read_prebuilt(self, fn: Callable[[Any], T]) -> T:
        """:meth:`_read` for ``fn`` that runs prebuilt statements only: on a kept driver connection where the
        store has them."""
        direct = self.direct
        if direct is None:
            return self._read(fn)
        return retrying(self.retry, lambda _retried: direct.run(fn), "fence read")

    def _write(self, what: str, fn: Callable[[Connection, bool], T]) -> T:
        """``fn(conn, retried)`` in one transaction, run again on a fresh connection when its connection dies."""
        def attempt(retried: bool) -> T:
            with self.engine.begin() as conn:
                return fn(conn, retried)
        return retrying(self.retry, attempt, what)

    def _write_statement(self, what: str, fn: Callable[[Any, bool], T]) -> T:
        """Like :meth:`_write`, for ``fn`` that writes with ONE statement (atomic alone): on a kept driver connection
        where the store has them (``kept_connections.py``), else in autocommit where cheap."""
        direct = self.direct
        if direct is not None:
            return retrying(self.retry, lambda retried: direct.run(lambda conn: fn(conn, retried)), what)
        if not self._writes_in_autocommit:
            return self._write(what, fn)

        def attempt(retried: bool) -> T:
            with self.auto.connect() as conn:
                return fn(conn, retried)
        return retrying(self.retry, attempt, what)

    def _holds(self, conn: Connection, subject: str, step: str, epoch: int, expect: dict[str, Any]) -> bool:
        """Does the row at ``epoch`` already hold ``expect``? (A retried write whose first try committed.)"""
        t = self.table
        q = select(*(t.c[k] for k in expect)).where(self._key(subject, step), t.c.epoch == epoch)
        found = conn.execute(q).first()
        return found is not None and tuple(found) == tuple(expect.values())

    def create_all(self) -> None:
        """Create the fence table and its indexes if missing (safe when several processes race)."""
        try:
            create_tables(self.metadata, self.engine)
        except SQLAlchemyError as exc:
            raise store_error(exc, "creating the fence table", self._url()) from exc

    def drop_all(self) -> None:
        """Drop the fence table (tests, teardown)."""
        try:
            self.metadata.drop_all(self.engine)
        except SQLAlchemyError as exc:
            raise store_error(exc, "dropping the fence table", self._url()) from exc

    # --- reads ------------------------------------------------------------------------------

    def row_select(self) -> Any:
        """SELECT of every column and ``lease_live`` (the database clock decides): what a FenceRow is read from."""
        t = self.table
        live = case((t.c.lease_until > db_now(), 1), else_=0).label("lease_live")
        return select(*t.c, live)

    def _key(self, subject: str, step: str) -> ColumnElement[bool]:
        return and_(self.table.c.subject == subject, self.table.c.step == step)

    def get(self, subject: str, step: str) -> FenceRow | None:
        """The fence row, or None."""
        key = {"w_subject": subject, "w_step": step}
        try:
            m = self._read_prebuilt(lambda conn: conn.execute(self.stmts.get, key).mappings().first())
        except Exception as exc:
            self._failed(exc, f"fence {subject!r}/{step!r}")
            raise
        return None if m is None else _row(m)

    def list_steps(self, *, state: FenceState | str | None = None, subject: str | None = None,
                   limit: int = 100) -> builtins.list[FenceRow]:
        """Fences, most recently changed first, filtered by state and/or subject."""
        q = self.row_select().order_by(self.table.c.updated_at.desc()).limit(limit)
        if state is not None:
            q = q.where(self.table.c.state == str(state))
        if subject is not None:
            q = q.where(self.table.c.subject == subject)
        try:
            return self._read(lambda conn: [_row(m) for m in conn.execute(q).mappings()])
        except Exception as exc:
            self._failed(exc, "listing fences")
            raise

    def _failed(self, exc: Exception, where: str) -> None:
        """A call failed: raise FenceTablesMissing when the table is not there, FenceStoreError naming ``where`` and
        the database for any other database error (the driver's error its cause); else return."""
        missing = missing_tables(exc, self.table.name, self._url())  # `ringfence fence init` not run
        if missing is not None:
            raise missing from exc
        if isinstance(exc, SQLAlchemyError):
            raise store_error(exc, where, self._url()) from exc

    def name_missing_table(self, exc: Exception) -> None:
        """Raise :class:`FenceTablesMissing` (one line: the database, the command that creates the table) when
        ``exc`` says the fence table is not there, for a job's step: the SQL error is not chained (a dead job's
        record shows the one line)."""
        missing = missing_tables(exc, self.table.name, self._url())
        if missing is not None:
            raise missing from None

    def db_now(self) -> datetime:
        """The database clock (what every fence timestamp is measured against)."""
        try:
            value: datetime = self._read(lambda conn: conn.execute(select(db_now())).scalar_one())
        except SQLAlchemyError as exc:
            raise store_error(exc, "reading the database clock", self._url()) from exc
        return value

    def in_window(self, subject: str, step: str, epoch: int, window_s: float) -> bool:
        """Is ``calling_at`` less than ``window_s`` ago (database clock)?"""
        t = self.table
        q = select(func.count()).select_from(t).where(
            self._key(subject, step), t.c.epoch == epoch, t.c.calling_at > db_now_plus(-window_s))
        return bool(self._read(lambda conn: conn.execute(q).scalar_one()))

    # --- transitions ------------------------------------------------------------------------

    def capture(self, subject: str, step: str, owner: Owner, phash: str,
                retention_s: float | None) -> FenceRow | None:
        """INSERT the fence (epoch 1, claimed) in its own transaction; None if the key exists."""
        row, fresh = self.capture_or_get(subject, step, owner, phash, retention_s)
        return row if fresh else None

    def capture_or_get(self, subject: str, step: str, owner: Owner, phash: str, retention_s: float | None,
                       request: str | None = None) -> tuple[FenceRow | None, bool]:
        """:meth:`_capture_or_get`; a fence table that is not there is FenceTablesMissing (one line, no SQL)."""
        try:
            return self._capture_or_get(subject, step, owner, phash, retention_s, request)
        except Exception as exc:
            self.name_missing_table(exc)
            raise

    def _capture_or_get(self, subject: str, step: str, owner: Owner, phash: str, retention_s: float | None,
                        request: str | None = None) -> tuple[FenceRow | None, bool]:
        """INSERT the fence (epoch 1, claimed), or read the row holding the key: ``(row, True)`` when this call
        inserted it, ``(existing row, False)`` when the key exists, ``(None, False)`` when the row vanished (or, on
        PostgreSQL, was inserted by another run after this statement began): the caller tries again.

        A retried INSERT whose first try committed finds the row too: the caller sees its own (job id, token)
        and continues as its owner.

        With ``request`` the row is inserted already ``calling`` with that request (capture and mark calling in
        one statement)."""
        values = {"v_subject": subject, "v_step": step, "v_owner_job_id": owner.job_id,
                  "v_owner_token": owner.token, "v_lease_s": float(owner.lease_s), "v_params_hash": phash,
                  "v_provider_key": (key := provider_key(subject, step)), "v_retention_s": retention_s}
        state = FenceState.CLAIMED if request is None else FenceState.CALLING
        if request is not None:
            values["v_request"] = request
        mine = FenceRow(subject=subject, step=step, state=state, epoch=1, owner_job_id=owner.job_id,
                        owner_token=owner.token, params_hash=phash, provider_key=key,
                        request=request, retention_s=retention_s, lease_live=True)  # as written; times stay in the db
        if self._pg:  # one statement, one round trip, either way
            pg = self.stmts.pg_capture if request is None else self.stmts.pg_capture_calling
            m = self._write_statement("fence capture", lambda conn, _r: conn.execute(pg, values).mappings().one())
            if m["fresh"]:
                return mine, True
            return (None if m["id"] is None else _row(m)), False

        if self._returning():  # MariaDB: one statement, one round trip, either way
            mc = self.stmts.maria_capture if request is None else self.stmts.maria_capture_calling
            m = self._write_statement("fence capture", lambda conn, _r: conn.execute(mc, values).mappings().one())
            return (mine, True) if m["fresh"] else (_row(m), False)
        ins = self.stmts.insert if request is None else self.stmts.insert_calling

        def attempt(conn: Connection, _retried: bool) -> tuple[FenceRow | None, bool]:
            try:
                conn.execute(ins, values)
            except IntegrityError:
                # Portable unique-violation handling: read the row in the same transaction (a failed INSERT
                # leaves it usable on MySQL and SQLite); no row means another integrity error, which surfaces.
                m = conn.execute(self.stmts.get, {"w_subject": subject, "w_step": step}).mappings().first()
                if m is None:
                    raise
                return _row(m), False
            return mine, True

        return self._write_statement("fence capture", attempt)

    def _returning(self) -> bool:
        """MariaDB >= 10.5 (``INSERT … RETURNING``), asked of the server once."""
        if self._maria_returning is None:
            dialect: Any = self.auto.dialect
            if getattr(dialect, "server_version_info", None) is None:
                with self.auto.connect():  # the dialect learns the server's version on its first connection
                    pass
            version = getattr(dialect, "server_version_info", None) or ()
            self._maria_returning = bool(getattr(dialect, "is_mariadb", False)) and tuple(version[:2]) >= (10, 5)
        return self._maria_returning

    def take_over(self, row: FenceRow, owner: Owner, *, lease_must_be_over: bool) -> FenceRow | None:
        """Become the owner with epoch+1, conditional on the epoch read; None if another run won."""
        t = self.table
        cond = [self._key(row.subject, row.step), t.c.epoch == row.epoch,
                t.c.state.not_in([FenceState.COMPLETED.value, FenceState.IN_DOUBT.value])]
        if lease_must_be_over:  # no broker probe: the database clock decides
            cond.append(or_(t.c.lease_until.is_(None), t.c.lease_until <= db_now()))
        stmt = update(t).where(*cond).values(
            epoch=t.c.epoch + 1, owner_job_id=owner.job_id, owner_token=owner.token,
            lease_until=db_now_plus(owner.lease_s), updated_at=db_now())
        mine = {"owner_job_id": owner.job_id, "owner_token": owner.token}

        def attempt(conn: Connection, retried: bool) -> bool:
            return conn.execute(stmt).rowcount == 1 or (
                retried and self._holds(conn, row.subject, row.step, row.epoch + 1, mine))

        if not self._write("fence takeover", attempt):
            return None
        return replace(row, epoch=row.epoch + 1, owner_job_id=owner.job_id, owner_token=owner.token, lease_live=True)

    def _cas(self, stmt: Update, subject: str, step: str, epoch: int, values: dict[str, Any],
             states: Sequence[FenceState] = (), expect: dict[str, Any] | None = None) -> None:
        """One epoch-conditional UPDATE (a prebuilt statement). ``expect``: what the row holds once this write is
        applied, so a retry after a lost COMMIT answer tells "already done" from "another run took it over"."""
        params = {**where(subject, step, epoch, *states), **values}

        def attempt(conn: Connection, retried: bool) -> None:
            if conn.execute(stmt, params).rowcount == 1:
                return
            if not (retried and expect is not None and self._holds(conn, subject, step, epoch, expect)):
                raise _fenced_out(subject, step, epoch, states or None)

        self._write_statement(f"fence {(expect or {}).get('state', 'update')}", attempt)

    def mark_calling(self, subject: str, step: str, epoch: int, request: str | None, lease_s: float) -> None:
        """claimed → calling, with the exact request; committed before the provider call."""
        self._cas(self.stmts.calling, subject, step, epoch, {"v_request": request, "v_lease_s": float(lease_s)},
                  [FenceState.CLAIMED], {"state": StateText.CALLING, "request": request})

    def renew(self, subject: str, step: str, epoch: int, lease_s: float) -> None:
        """Push ``lease_until`` ahead (a replay is about to call the provider again)."""
        self._cas(self.stmts.renew, subject, step, epoch, {"v_lease_s": float(lease_s)})

    def record(self, subject: str, step: str, epoch: int, reference: str) -> None:
        """calling → effected with the provider's reference, committed at once."""
        self._cas(self.stmts.record, subject, step, epoch, {"v_reference": reference}, [FenceState.CALLING],
                  {"state": StateText.EFFECTED, "reference": reference})

    def reset_claimed(self, subject: str, step: str, epoch: int) -> None:
        """calling → claimed: reconcile said the effect did not happen, so calling again is safe."""
        self._cas(self.stmts.reset_claimed, subject, step, epoch, {}, [FenceState.CALLING],
                  {"state": StateText.CLAIMED, "calling_at": None})

    def unmark(self, subject: str, step: str, epoch: int) -> None:
        """calling → claimed with the lease over: a step captured as calling whose block failed before its effect
        (nothing left the network), so a retry may take over at once."""
        self._cas(self.stmts.unmark, subject, step, epoch, {}, [FenceState.CALLING],
                  {"state": StateText.CLAIMED, "calling_at": None})

    def set_request(self, subject: str, step: str, epoch: int, request: str) -> None:
        """Store the exact request of a step captured as calling when ``effect(request=...)`` names another one."""
        self._cas(self.stmts.set_request, subject, step, epoch, {"v_request": request}, [FenceState.CALLING],
                  {"state": StateText.CALLING, "request": request})

    def park(self, subject: str, step: str, epoch: int) -> None:
        """calling → in_doubt: nobody can tell; a person resolves it. FencedOut when the step moved on."""
        try:
            self._cas(self.stmts.park, subject, step, epoch, {}, [FenceState.CALLING],
                      {"state": StateText.IN_DOUBT, "lease_until": None})
        except Exception as exc:
            self._failed(exc, f"parking fence {subject!r}/{step!r} in doubt")
            raise

    def release(self, subject: str, step: str, epoch: int) -> None:
        """End our lease early (a claimed step failed before its effect); best effort."""
        params = where(subject, step, epoch)
        self._write_statement("fence release", lambda conn, _retried: conn.execute(self.stmts.release, params))

    def complete_statement(self, subject: str, step: str, epoch: int, result: str | None,
                           states: Sequence[FenceState] = COMPLETABLE) -> _complete.Bound:
        """The epoch-conditional UPDATE to completed (prebuilt) and its parameters, for the application's
        transaction. ``states``: where it may complete from (a step captured as calling whose block called no
        effect completes from ``calling``)."""
        return _complete.Bound(self.stmts.complete, {"v_result": result, **where(subject, step, epoch, *states)})

    def complete(self, subject: str, step: str, epoch: int, result: str | None,
                 states: Sequence[FenceState] = COMPLETABLE) -> None:
        """Complete with no local writes: one statement, on its own (autocommit where that saves round trips)."""
        params = self.complete_statement(subject, step, epoch, result, states).params
        done = {"state": StateText.COMPLETED, "result": result}

        def attempt(conn: Connection, retried: bool) -> None:
            fault_point("before_commit")  # nothing committed yet, also in autocommit
            if conn.execute(self.stmts.complete, params).rowcount != 1 and not (
                    retried and self._holds(conn, subject, step, epoch, done)):
                raise _fenced_out(subject, step, epoch, states)

        self._write_statement("fence complete", attempt)

    def completion(self, db: Any, subject: str, step: str, epoch: int, result: str | None,
                   states: Sequence[FenceState] = COMPLETABLE) -> AbstractContextManager[Any]:
        """Sync context manager: one transaction on ``db`` holding the completion + caller's writes."""
        stmt = self.complete_statement(subject, step, epoch, result, states)
        stale = lambda: _fenced_out(subject, step, epoch, states)  # noqa: E731
        committed, alone = self._committed(subject, step, epoch, result), self._alone(db, subject, step, epoch,
                                                                                       result, states)
        inner = (_complete.lazy(db, stmt, stale, self.retry, committed, alone) if alone is not None else
                 _complete.sync_completion(db, stmt, self.engine.dialect, stale, self.retry, committed, alone))
        return _complete.NamingDatabases(inner, db, self.table.name, self._url())

    def acompletion(self, db: Any, subject: str, step: str, epoch: int, result: str | None,
                    states: Sequence[FenceState] = COMPLETABLE) -> AbstractAsyncContextManager[Any]:
        """Async twin of :meth:`completion` (AsyncEngine / AsyncConnection / AsyncSession, or a sync ``db``)."""
        stmt = self.complete_statement(subject, step, epoch, result, states)
        alone = self._alone(db, subject, step, epoch, result, states)
        astore = self.async_store() if alone is not None else None
        stale = lambda: _fenced_out(subject, step, epoch, states)  # noqa: E731
        if alone is not None and astore is not None:  # the store's own engine on the loop: the common path, flat
            return _complete.AloneOnLoop(db, stmt, stale, self.retry, self._committed(subject, step, epoch, result),
                                         lambda: astore.complete(subject, step, epoch, result, states),
                                         self.table.name, self._url())
        inner = _complete.async_completion(db, stmt, self.engine.dialect, stale, self.retry,
                                           self._committed(subject, step, epoch, result), alone,
                                           None if astore is None else
                                           lambda: astore.complete(subject, step, epoch, result, states))
        return _complete.anaming_databases(inner, db, self.table.name, self._url())

    def _alone(self, db: Any, subject: str, step: str, epoch: int, result: str | None,
               states: Sequence[FenceState]) -> Callable[[], None] | None:
        """For an Engine on the fence's own database: the completion of a block that wrote nothing, as the
        fence's single UPDATE (:meth:`complete`). None for anything else (the UPDATE opens the caller's
        transaction at once)."""
        if not isinstance(db, Engine) or not (db is self.engine or db.url == self.engine.url):
            return None
        return lambda: self.complete(subject, step, epoch, result, states)

    def _url(self) -> str:
        if self._url_text is None:  # named only when a completion fails: rendered once
            self._url_text = str(self.engine.url.render_as_string(hide_password=True))
        return self._url_text

    def _committed(self, subject: str, step: str, epoch: int, result: str | None) -> Callable[[], bool]:
        done = {"state": StateText.COMPLETED, "result": result}
        return lambda: self._read(lambda conn: self._holds(conn, subject, step, epoch, done))

    # --- a job that leaves the queue -------------------------------------------------------

    def owned(self, job_id: str, *, in_doubt: bool = False, claimed: bool = False) -> builtins.list[FenceRow]:
        """Steps past capture (``calling``/``effected``) that job ``job_id`` owns; with ``in_doubt``, also the
        steps parked ``in_doubt`` while it owned them (the dead-letter names them all); with ``claimed``, also its
        ``claimed`` steps (the dead-letter fences them out).

        Read through the state index: these states are transient or wait for a person, so few rows match.
        """
        t = self.table
        states = (*_PAST_CAPTURE, FenceState.IN_DOUBT.value) if in_doubt else _PAST_CAPTURE
        states = (*states, FenceState.CLAIMED.value) if claimed else states
        q = self.row_select().where(t.c.state.in_(states), t.c.owner_job_id == job_id).order_by(t.c.id)
        try:
            return self._read(lambda conn: [_row(m) for m in conn.execute(q).mappings()])
        except Exception as exc:
            self.name_missing_table(exc)
            if isinstance(exc, SQLAlchemyError):
                raise store_error(exc, f"the fence steps of job {job_id}", self._url()) from exc
            raise

    def fence_out(self, row: FenceRow, owner: Owner) -> bool:
        """A ``claimed`` step of a job leaving for dead-letter: epoch+1 with ``owner`` and its lease over, so an
        earlier attempt still running can no longer mark it calling. False: it moved on from ``claimed``."""
        t = self.table
        stmt = update(t).where(self._key(row.subject, row.step), t.c.epoch == row.epoch,
                               t.c.state == FenceState.CLAIMED.value).values(
            epoch=t.c.epoch + 1, owner_job_id=owner.job_id, owner_token=owner.token, lease_until=db_now(),
            updated_at=db_now())
        mine = {"owner_job_id": owner.job_id, "owner_token": owner.token}

        def attempt(conn: Connection, retried: bool) -> bool:
            return conn.execute(stmt).rowcount == 1 or (
                retried and self._holds(conn, row.subject, row.step, row.epoch + 1, mine))

        try:
            return self._write("fence out", attempt)
        except Exception as exc:
            self._failed(exc, f"fencing out the claimed fence {row.subject!r}/{row.step!r}")
            raise

    # --- operations by a person -------------------------------------------------------------

    def resolve(self, subject: str, step: str, *, happened: bool, reference: str | None = None) -> FenceRow:
        """Settle an in_doubt fence by hand, bumping the epoch.

        ``happened=True`` (needs ``reference``): the effect took place → effected; the next run
        completes with that reference. ``happened=False``: it did not → claimed; the next run
        calls the provider (with the same key).
        """
        if happened and not reference:
            raise ValueError("resolve(happened=True) needs the provider's reference")
        t = self.table
        values: dict[str, Any] = (
            {"state": StateText.EFFECTED, "reference": reference} if happened
            else {"state": StateText.CLAIMED, "calling_at": None})
        stmt = update(t).where(self._key(subject, step), t.c.state == FenceState.IN_DOUBT.value).values(
            epoch=t.c.epoch + 1, owner_job_id=None, owner_token=None, lease_until=None,
            updated_at=db_now(), **values)
        try:
            with self.engine.begin() as conn:
                changed = conn.execute(stmt).rowcount
        except Exception as exc:
            self._failed(exc, f"resolving fence {subject!r}/{step!r}")
            raise
        if changed != 1:
            raise FenceError(f"fence {subject!r}/{step!r} is not in_doubt; nothing to resolve")
        row = self.get(subject, step)
        assert row is not None
        return row

    def prune(self) -> int:
        """Delete completed fences older than their ``retention_s``; NULL retention is kept forever."""
        t = self.table
        stmt = delete(t).where(
            t.c.state == FenceState.COMPLETED.value, t.c.retention_s.is_not(None),
            t.c.completed_at < db_now_plus(-t.c.retention_s))
        try:
            return int(self._write("fence prune", lambda conn, _retried: conn.execute(stmt).rowcount))
        except Exception as exc:
            self._failed(exc, "pruning completed fences")
            raise


_PAST_CAPTURE = (FenceState.CALLING.value, FenceState.EFFECTED.value)
