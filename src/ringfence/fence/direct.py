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

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from .dbretry import _PG_GONE, _PG_GONE_TEXT

T = TypeVar("T")
Hook = Callable[[Any, str, dict[str, Any]], None]  # (driver connection, SQL, parameters)


class Sql:
    """One statement compiled for a dialect: its SQL text, the parameters fixed in it, its result columns."""

    __slots__ = ("names", "params", "text")

    def __init__(self, stmt: Any, dialect: Any) -> None:
        compiled: Any = stmt.compile(dialect=dialect)
        if compiled._bind_processors or compiled.literal_execute_params or compiled.post_compile_params:
            raise ValueError("a statement with bind processing or expanding parameters needs SQLAlchemy's path")
        self.text: str = compiled.string
        self.params: dict[str, Any] = compiled.construct_params(_check=False)  # literals: the state it writes
        self.names: list[str] | None = None  # result columns, learned from the first answer


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


class Conn:
    """One driver connection the store keeps (autocommit), with its cursor."""

    __slots__ = ("broken", "direct", "fairy", "raw")

    def __init__(self, direct: Direct, fairy: Any) -> None:
        self.direct, self.fairy, self.raw = direct, fairy, fairy.driver_connection
        self.broken = False

    def execute(self, stmt: Any, params: dict[str, Any] | None = None) -> Result:
        """``stmt`` (a prebuilt statement, compiled once) with ``params``, as one autocommit statement."""
        d = self.direct
        sql = d.sql(stmt)
        p = {**sql.params, **params} if params else dict(sql.params)
        for hook in d.hooks:
            hook(self.raw, sql.text, p)
        try:
            cur = self.raw.cursor()
            try:
                cur.execute(sql.text, p)
                if sql.names is None:
                    sql.names = None if cur.description is None else [c[0] for c in cur.description]
                return Result(cur.rowcount, sql.names, None if sql.names is None else cur.fetchall())
            finally:
                cur.close()
        except Exception as exc:
            raise d.error(self, exc, sql.text, p) from exc


class Direct:
    """The driver connections one store keeps for its single statements (sync)."""

    def __init__(self, engine: Engine) -> None:
        """``engine``: an engine of the store's URL in autocommit, used only to open connections."""
        self.engine = engine
        self.dialect = engine.dialect
        self.hooks: list[Hook] = []
        self.on_take: list[Callable[[Any], None]] = []
        self.on_give: list[Callable[[Any], None]] = []
        self._idle: deque[Conn] = deque()
        self._sql: dict[int, Sql] = {}
        self._kept: dict[int, Any] = {}

    def sql(self, stmt: Any) -> Sql:
        """``stmt`` compiled: once for a statement named by :meth:`keep`, at each call for any other."""
        sql = self._sql.get(id(stmt))
        if sql is None:
            sql = Sql(stmt, self.dialect)
            if id(stmt) in self._kept:  # compiled on first use: the dialect knows its server by then
                self._sql[id(stmt)] = sql
        return sql

    def keep(self, stmts: Any) -> None:
        """The store's prebuilt statements: each is compiled once."""
        self._kept = {id(s): s for s in stmts}  # (held: an id stays theirs)

    def run(self, fn: Callable[[Conn], T]) -> T:
        """``fn(conn)`` on a kept connection (a new one when none is idle); the connection is kept again unless
        it broke or ``fn`` was interrupted by something other than an error."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = Conn(self, self.engine.raw_connection())  # SQLAlchemy raises its own errors here
        for tap in self.on_take:
            tap(conn.raw)
        try:
            out = fn(conn)
        except Exception:
            self._give(conn)
            raise
        except BaseException:
            conn.broken = True  # interrupted mid-statement, maybe: never reused
            self._give(conn)
            raise
        self._give(conn)
        return out

    def _give(self, conn: Conn) -> None:
        for tap in self.on_give:
            tap(conn.raw)
        if conn.broken or not _idle(conn.raw):
            _discard(conn)
            return
        self._idle.append(conn)

    def error(self, conn: Conn, exc: Exception, sql: str, params: Any) -> BaseException:
        """The error SQLAlchemy would raise for ``exc``; a dead connection is dropped with every idle one (a
        restart or a failover kills them all; SQLAlchemy's pool does the same)."""
        dbapi = self.dialect.loaded_dbapi
        gone = _gone(self.dialect, exc, conn.raw)
        if gone or not isinstance(exc, dbapi.Error):
            conn.broken = True
        if gone:
            self.drop_idle()
        if not isinstance(exc, dbapi.Error):
            return exc
        return DBAPIError.instance(sql, params, exc, dbapi.Error, connection_invalidated=gone, dialect=self.dialect)

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


def _discard(conn: Conn) -> None:
    try:
        if conn.broken:
            conn.fairy.invalidate()
        else:
            conn.fairy.close()  # back to its engine's pool
    except Exception:  # a connection already gone: nothing to give back
        pass


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
    return bool(isinstance(state, str) and state.startswith(_PG_GONE)) or (
        dialect.name == "postgresql" and any(t in str(exc) for t in _PG_GONE_TEXT))
