"""The fence's own single statements on driver connections, past SQLAlchemy's execution path.

A fenced no-op job makes 3–4 single statements; through ``Connection.execute`` each cost more client CPU than
the database's work (a pool checkout and return, the execution context, events, the result's metadata). A store
built from a psycopg or PyMySQL URL runs its prebuilt statements (``statements.py``) here instead: compiled once
to the driver's SQL, sent on a driver connection in autocommit (one statement is atomic alone) that the store
keeps between statements, its answer read as a plain tuple.

Nothing of the protocol changes: the same statements, the same epoch conditions, the same retries. A driver
error is raised as SQLAlchemy raises it (``DBAPIError`` and its subclasses), and one that means "this
connection is gone" (the dialect's test, or PostgreSQL's SQLSTATE as ``dbretry.watch_disconnects`` reads it)
is raised with ``connection_invalidated``: the connection is dropped with every idle one, and ``retrying``
runs the write again on a fresh connection. Connections come from an SQLAlchemy engine of the store's URL (so
its ``connect`` events, connect arguments and dialect set-up apply) and stay checked out while the store keeps
them. ``hooks`` see each statement just before it is sent, as ``before_cursor_execute`` does on an engine
(the disconnect tests kill the connection there); ``on_take`` / ``on_give`` see a connection handed to a
statement and back (the bench's wire trace).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from .dbretry import PG_GONE, PG_GONE_TEXT, told
from .pgwire import MISSING, PgForm, Wire, pg_form, values

T = TypeVar("T")
# Connections kept idle at most. They stay checked out of their engine, so that engine has no overflow limit: a
# statement never waits for a connection another one keeps idle (as many are open as statements ran at once).
MAX_IDLE = 16
Hook = Callable[[Any, str, dict[str, Any]], None]  # (driver connection, SQL, parameters)


class Sql:
    """One statement compiled for a dialect: its SQL text, the parameters fixed in it, its result columns."""

    __slots__ = ("names", "params", "pg", "text")

    def __init__(self, stmt: Any, dialect: Any) -> None:
        compiled: Any = stmt.compile(dialect=dialect)
        if _processed(compiled, dialect) or compiled.literal_execute_params or compiled.post_compile_params:
            raise ValueError("a statement with bind processing or expanding parameters needs SQLAlchemy's path")
        self.text: str = compiled.string
        self.params: dict[str, Any] = dict(compiled.params)  # the values fixed in it: the state it writes
        self.names: list[str] | None = None  # result columns, learned from the first answer
        self.pg: PgForm | None = None  # a kept statement on psycopg: its prepared form (pgwire.py)


class Result:
    """What the store reads of an answer: ``rowcount``, ``first()`` (a tuple) and ``mappings()``."""

    __slots__ = ("names", "rowcount", "rows")

    def __init__(self, rowcount: int, names: list[str] | None, rows: list[Any] | None) -> None:
        self.rowcount, self.names, self.rows = rowcount, names, rows

    def first(self) -> Any:
        return self.rows[0] if self.rows else None

    def scalar_one(self) -> Any:
        return self.mappings().one_row()[0]

    def mappings(self) -> Mappings:
        return Mappings(self)


class Mappings:
    """The rows of a :class:`Result` as dicts (``one()``, ``first()``, iteration)."""

    __slots__ = ("result",)

    def __init__(self, result: Result) -> None:
        self.result = result

    def one_row(self) -> Any:
        rows = self.result.rows
        if not rows or len(rows) != 1:
            raise ValueError(f"expected one row, got {len(rows or ())}")
        return rows[0]

    def one(self) -> dict[str, Any]:
        return dict(zip(self.result.names or (), self.one_row(), strict=True))

    def first(self) -> dict[str, Any] | None:
        rows = self.result.rows
        return dict(zip(self.result.names or (), rows[0], strict=True)) if rows else None

    def __iter__(self) -> Any:
        names = self.result.names or ()
        return (dict(zip(names, r, strict=True)) for r in self.result.rows or ())


class _Kept:
    """What the sync and the async kept connections share: hooks, compiled statements, errors as SQLAlchemy's."""

    def __init__(self, dialect: Any) -> None:
        self.dialect = dialect
        self.hooks: list[Hook] = []
        self.on_take: list[Callable[[Any], None]] = []
        self.on_give: list[Callable[[Any], None]] = []
        self._sql: dict[int, Sql] = {}
        self._kept: dict[int, Any] = {}

    def sql(self, stmt: Any) -> Sql:
        """``stmt`` compiled: once for a statement named by :meth:`keep`, at each call for any other."""
        sql = self._sql.get(id(stmt))
        if sql is None:
            sql = Sql(stmt, self.dialect)
            if id(stmt) in self._kept:  # compiled on first use: the dialect knows its server by then
                self._sql[id(stmt)] = sql
                if self.dialect.driver == "psycopg":
                    sql.pg = pg_form(sql.text)
        return sql

    def keep(self, stmts: Any) -> None:
        """The store's prebuilt statements: each is compiled once."""
        self._kept = {id(s): s for s in stmts}  # (held: an id stays theirs)

    def prepare(self, raw: Any, stmt: Any, params: dict[str, Any] | None) -> tuple[Sql, dict[str, Any]]:
        sql = self.sql(stmt)
        p = {**sql.params, **params} if params else dict(sql.params)
        for hook in self.hooks:
            hook(raw, sql.text, p)
        return sql, p

    def error(self, conn: Any, exc: Exception, sql: str | None, params: Any) -> BaseException:
        """The error SQLAlchemy would raise for ``exc``; ``conn`` (if any) is marked broken when it is dead."""
        dbapi = self.dialect.loaded_dbapi
        gone = _gone(self.dialect, exc, None if conn is None else conn.raw)
        if conn is not None and (gone or not isinstance(exc, dbapi.Error)):
            conn.broken = True
        if not isinstance(exc, dbapi.Error):
            return exc
        wrapped: BaseException = DBAPIError.instance(sql, params, exc, dbapi.Error, connection_invalidated=gone,
                                                     dialect=self.dialect)
        return wrapped


class Conn:
    """One driver connection the store keeps (autocommit), with its cursor."""

    __slots__ = ("broken", "cur", "direct", "pooled", "raw", "wire")

    def __init__(self, direct: Direct, pooled: Any) -> None:
        self.direct, self.pooled, self.raw = direct, pooled, pooled.driver_connection
        self.cur = self.raw.cursor()
        self.broken = False
        self.wire = _wire(direct.dialect, self.raw)

    def execute(self, stmt: Any, params: dict[str, Any] | None = None) -> Result:
        """``stmt`` (a prebuilt statement, compiled once) with ``params``, as one autocommit statement."""
        sql, p = self.direct.prepare(self.raw, stmt, params)
        wire, form = self.wire, sql.pg
        args = None if wire is None or form is None else values(form, p)
        if wire is not None and form is not None and args is not None:
            try:
                return _result(sql, wire, wire.call(form, args))
            except Exception as exc:
                self.broken = self.broken or not wire.clean()
                raise self.direct.fail(self, exc, sql.text, p) from exc
        cur = self.cur
        try:
            cur.execute(sql.text, p)
            if sql.names is None:
                sql.names = None if cur.description is None else [c[0] for c in cur.description]
            return Result(cur.rowcount, sql.names, None if sql.names is None else cur.fetchall())
        except Exception as exc:
            raise self.direct.fail(self, exc, sql.text, p) from exc


class Direct(_Kept):
    """The driver connections one store keeps for its single statements (sync; threads share them)."""

    def __init__(self, engine: Engine) -> None:
        """``engine``: an engine of the store's URL in autocommit, used only to open connections."""
        super().__init__(engine.dialect)
        self.engine = engine
        self._idle: deque[Conn] = deque()
        self._pid = os.getpid()
        self._inherited: list[Conn] = []  # a forked child's copies of the parent's: kept unused, never closed

    def run(self, fn: Callable[[Conn], T]) -> T:
        """``fn(conn)`` on a kept connection (a new one when none is idle); the connection is kept again unless
        it broke or ``fn`` was interrupted by something other than an error."""
        if self._pid != os.getpid():  # a forked child: the parent's sockets are not ours to use
            self._forked()
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._open()
        for tap in self.on_take:
            tap(conn.raw)
        try:
            out = fn(conn)
        except Exception:
            self._give(conn, _idle(conn.raw))
            raise
        except BaseException:
            self._give(conn, False)  # interrupted mid-statement, maybe: never reused
            raise
        self._give(conn, True)  # its statements ran in autocommit: nothing is open
        return out

    def _open(self) -> Conn:
        try:
            return Conn(self, self.engine.raw_connection())
        except Exception as exc:  # the pool hands out the driver's own connect error: raised as SQLAlchemy's
            out = self.error(None, exc, None, None)
            if out is exc:
                raise
            raise out from exc

    def _forked(self) -> None:
        self._inherited.extend(self._idle)
        self._idle = deque()
        self.engine.dispose(close=False)  # SQLAlchemy's way after a fork: new connections, the parent's left alone
        self._pid = os.getpid()

    def _give(self, conn: Conn, idle: bool) -> None:
        for tap in self.on_give:
            tap(conn.raw)
        if conn.broken or not idle:
            conn.broken = True
            _discard(conn)
            return
        if len(self._idle) >= MAX_IDLE:
            _discard(conn)  # back to the engine's pool, which keeps a few and closes the rest
            return
        self._idle.append(conn)

    def fail(self, conn: Conn, exc: Exception, sql: str, params: Any) -> BaseException:
        """:meth:`_Kept.error`; a dead connection is dropped with every idle one (a restart or a failover kills
        them all; SQLAlchemy's pool does the same)."""
        out = self.error(conn, exc, sql, params)
        if getattr(out, "connection_invalidated", False):
            self.drop_idle()
        return out

    def drop_idle(self) -> None:
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return
            conn.broken = True
            _discard(conn)

    def close(self) -> None:
        """Close every kept connection (the store's engine was disposed)."""
        self.drop_idle()
        self.engine.dispose()


class AConn:
    """One async driver connection (psycopg's ``AsyncConnection``, autocommit) kept by :class:`AsyncDirect`."""

    __slots__ = ("broken", "direct", "raw", "wire")

    def __init__(self, direct: AsyncDirect, raw: Any) -> None:
        self.direct, self.raw = direct, raw
        self.broken = False
        self.wire = _wire(direct.dialect, raw)

    async def execute(self, stmt: Any, params: dict[str, Any] | None = None) -> Result:
        """Async :meth:`Conn.execute`."""
        sql, p = self.direct.prepare(self.raw, stmt, params)
        wire, form = self.wire, sql.pg
        args = None if wire is None or form is None else values(form, p)
        if wire is not None and form is not None and args is not None:
            try:
                return _result(sql, wire, await wire.arun(wire.exchange(form, args)))
            except Exception as exc:
                self.broken = self.broken or not wire.clean()
                raise self.direct.fail(self, exc, sql.text, p) from exc
        if wire is not None:
            wire.unwatch()  # psycopg's own wait takes the socket's reader over
        try:
            cur = self.raw.cursor()
            try:
                await cur.execute(sql.text, p)
                if sql.names is None:
                    sql.names = None if cur.description is None else [c[0] for c in cur.description]
                return Result(cur.rowcount, sql.names, None if sql.names is None else await cur.fetchall())
            finally:
                await cur.close()
        except Exception as exc:
            raise self.direct.fail(self, exc, sql.text, p) from exc


class AsyncDirect(_Kept):
    """The async driver connections one store keeps on one event loop (opened by ``connect``, in autocommit)."""

    def __init__(self, dialect: Any, connect: Callable[[], Awaitable[Any]]) -> None:
        super().__init__(dialect)
        self._connect = connect
        self._idle: deque[AConn] = deque()
        self._dead: list[AConn] = []  # closed at the next statement (closing is async)

    async def run(self, fn: Callable[[AConn], Awaitable[T]]) -> T:
        """Async :meth:`Direct.run`."""
        if self._dead:
            await self._close_dead()
        try:
            conn = self._idle.pop()
        except IndexError:
            try:
                conn = AConn(self, await self._connect())
            except Exception as exc:
                raise self.error(None, exc, None, None) from exc
        for tap in self.on_take:
            tap(conn.raw)
        try:
            out = await fn(conn)
        except Exception:
            self._give(conn, _idle(conn.raw))
            raise
        except BaseException:  # cancelled mid-statement, maybe: never reused
            self._give(conn, False)
            raise
        self._give(conn, True)
        return out

    def _give(self, conn: AConn, idle: bool) -> None:
        for tap in self.on_give:
            tap(conn.raw)
        if conn.broken or not idle or len(self._idle) >= MAX_IDLE:
            conn.broken = conn.broken or not idle
            self._dead.append(conn)  # closed at the next statement
            return
        self._idle.append(conn)

    def fail(self, conn: AConn, exc: Exception, sql: str, params: Any) -> BaseException:
        out = self.error(conn, exc, sql, params)
        if getattr(out, "connection_invalidated", False):
            self._dead.extend(self._idle)
            self._idle.clear()
        return out

    async def _close_dead(self) -> None:
        dead, self._dead = self._dead, []
        for conn in dead:
            if conn.wire is not None:
                conn.wire.unwatch()  # before its socket closes (pgwire.Wire.arun)
            with suppress(Exception):  # already gone: nothing to close
                await conn.raw.close()

    async def aclose(self) -> None:
        """Close every kept connection."""
        self._dead.extend(self._idle)
        self._idle.clear()
        await self._close_dead()


def _processed(compiled: Any, dialect: Any) -> bool:
    """Does any parameter of ``compiled`` go through a type's bind processor (which only SQLAlchemy's path runs)?"""
    return any(b.type.dialect_impl(dialect).bind_processor(dialect) is not None for b in compiled.binds.values())


def _wire(dialect: Any, raw: Any) -> Wire | None:
    """psycopg's libpq connection for the kept statements (pgwire.py), where it can take them."""
    if dialect.driver != "psycopg":
        return None
    if MISSING:
        told(f"the fence's statements go through psycopg's cursor: {MISSING}")
        return None
    return Wire(raw) if Wire.usable(raw) else None


def _result(sql: Sql, wire: Wire, res: Any) -> Result:
    names, rows = wire.rows(res, sql.names)
    if sql.names is None:
        sql.names = names
    count = res.command_tuples
    return Result(-1 if count is None else count, sql.names, rows)


def _discard(conn: Conn) -> None:
    with suppress(Exception):  # a connection already gone: nothing to give back
        if conn.broken:
            conn.pooled.invalidate()
        else:
            conn.pooled.close()  # back to its engine's pool


def _idle(raw: Any) -> bool:
    """No transaction left open on the driver connection (autocommit keeps it so; a failure might not)."""
    info = getattr(raw, "info", None)
    if info is not None and hasattr(info, "transaction_status"):  # psycopg
        return bool(int(info.transaction_status) == 0 and not raw.closed)
    status = getattr(raw, "server_status", None)  # PyMySQL
    return isinstance(status, int) and not status & 1 and bool(getattr(raw, "open", False))


def _gone(dialect: Any, exc: BaseException, raw: Any) -> bool:
    """Is the connection dead (the dialect says so, or PostgreSQL's SQLSTATE / libpq's words)?"""
    try:
        if dialect.is_disconnect(exc, raw, None):
            return True
    except Exception:  # a dialect that cannot tell from this error
        pass
    if getattr(raw, "broken", False) or getattr(raw, "closed", False) is True:
        return True
    state = getattr(exc, "sqlstate", None)
    return bool(isinstance(state, str) and state.startswith(PG_GONE)) or (
        dialect.name == "postgresql" and any(t in str(exc) for t in PG_GONE_TEXT))
