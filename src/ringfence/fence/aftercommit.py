"""Run a callback after the outermost transaction of an application's SQLAlchemy Session or Connection commits.

``after_commit(target, item, deliver)`` keeps ``item`` with the transaction that is innermost when it is called:
a rolled-back savepoint drops the items kept in it, a released one hands them to its parent, a rolled-back (or
closed) outer transaction drops everything, and the outer commit calls ``deliver(items, in_async)`` once with
every item left, in the order they were kept. ``in_async`` is true for an AsyncSession or AsyncConnection: the
commit runs inside SQLAlchemy's greenlet, where ``await_only`` can await a coroutine on the caller's loop.

A Session has an event after its commit. A Core Connection has none (its ``commit`` event fires before the
DBAPI commit), so for a Connection the commit event performs the DBAPI commit itself, then delivers; SQLAlchemy's
own commit that follows finds no open transaction and does nothing (psycopg, sqlite3, asyncpg, aiosqlite) or
sends a harmless empty COMMIT (PyMySQL). A failed commit raises from there as SQLAlchemy's wrapped error and
delivers nothing.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, exc
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, SessionTransaction

from ringfence.errors import ConfigError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

Deliver = Callable[[list[Any], bool], None]
_KEY = "ringfence.after_commit"
_ROOT = "root"  # the tag of items kept in a Connection's outer transaction


def after_commit(target: Any, item: Any, deliver: Deliver) -> None:
    """Keep ``item`` until ``target`` (Session, Connection, AsyncSession, AsyncConnection) commits its outer
    transaction; a target with no transaction open begins one, as its first statement would."""
    if _is_async(target, "AsyncSession"):
        _session(target.sync_session, True).keep(item, deliver)
    elif isinstance(target, Session):
        _session(target, False).keep(item, deliver)
    elif _is_async(target, "AsyncConnection"):
        _keep_async_connection(target, item, deliver)
    elif isinstance(target, Connection):
        _connection(target, False).keep(target, item, deliver)
    else:
        raise ConfigError(f"enqueue_on_commit: {type(target).__name__} is not a SQLAlchemy Session, Connection, "
                          "AsyncSession or AsyncConnection (for Django pass its connection, or call it inside "
                          "transaction.atomic())")


def _is_async(target: Any, name: str) -> bool:
    """``target`` is SQLAlchemy's AsyncSession/AsyncConnection. Its module is never imported here: it needs
    greenlet, which an install without async drivers lacks, and an object of it exists only once it is loaded."""
    module = sys.modules.get("sqlalchemy.ext.asyncio")
    return module is not None and isinstance(target, getattr(module, name))


def _keep_async_connection(target: AsyncConnection, item: Any, deliver: Deliver) -> None:
    if target.sync_connection is None:
        raise ConfigError("enqueue_on_commit: the AsyncConnection is not started (use `async with "
                          "engine.connect() as conn` or `await conn.start()`)")
    _connection(target.sync_connection, True).keep(target.sync_connection, item, deliver)


def kept(target: Any) -> int:
    """Items waiting for ``target``'s commit (tests, diagnostics)."""
    sync = getattr(target, "sync_session", None) or getattr(target, "sync_connection", None) or target
    state = _CONNECTIONS.get(sync) if isinstance(sync, Connection) else sync.info.get(_KEY)
    return 0 if state is None else sum(len(v) for v in state.items.values())


class _Kept:
    """Items per transaction tag, in keeping order across tags."""

    def __init__(self, in_async: bool) -> None:
        self.in_async = in_async
        self.items: dict[Any, list[tuple[int, Any, Deliver]]] = {}
        self.seq = 0

    def add(self, tag: Any, item: Any, deliver: Deliver) -> None:
        self.seq += 1
        self.items.setdefault(tag, []).append((self.seq, item, deliver))

    def move(self, tag: Any, to: Any) -> None:
        moved = self.items.pop(tag, [])
        if moved:
            self.items.setdefault(to, []).extend(moved)

    def drop(self, tag: Any) -> None:
        self.items.pop(tag, None)

    def deliver_all(self) -> None:
        entries = sorted((e for v in self.items.values() for e in v), key=lambda e: e[0])
        self.items.clear()
        by_callback: dict[Deliver, list[Any]] = {}
        for _, item, deliver in entries:
            by_callback.setdefault(deliver, []).append(item)
        for deliver, items in by_callback.items():
            deliver(items, self.in_async)


# -- Session ----------------------------------------------------------------------------------------------
class _SessionKept(_Kept):
    def __init__(self, session: Session, in_async: bool) -> None:
        super().__init__(in_async)
        self.session = session
        event.listen(session, "after_commit", self.on_commit)
        event.listen(session, "after_transaction_end", self.on_end)

    def keep(self, item: Any, deliver: Deliver) -> None:
        s = self.session
        trans = s.get_nested_transaction() or s.get_transaction() or s.begin()
        self.add(trans, item, deliver)

    def on_commit(self, session: Session) -> None:
        nested = session.get_nested_transaction()
        if nested is not None:  # a savepoint released: its items now belong to the enclosing transaction
            self.move(nested, _enclosing(nested))
            return
        self.deliver_all()

    def on_end(self, session: Session, trans: SessionTransaction) -> None:
        self.drop(trans)  # ended without a commit that took its items: rolled back or closed


def _enclosing(trans: SessionTransaction) -> SessionTransaction:
    parent = trans.parent
    while parent is not None and not parent.nested and parent.parent is not None:
        parent = parent.parent
    return parent or trans


def _session(session: Session, in_async: bool) -> _SessionKept:
    state = session.info.get(_KEY)
    if state is None:
        state = session.info[_KEY] = _SessionKept(session, in_async)
    state.in_async = state.in_async or in_async
    return state


# -- Connection -------------------------------------------------------------------------------------------
class _ConnectionKept(_Kept):
    """Tags are the connection's NestedTransaction objects (or _ROOT). A released savepoint's items float until
    the next event, when the connection names the enclosing savepoint again (SQLAlchemy deactivates the
    released one only after its event)."""

    def __init__(self, conn: Connection, in_async: bool) -> None:
        super().__init__(in_async)
        self.floating: list[Any] = []
        for name, fn in (("commit", self.on_commit), ("rollback", self.on_rollback),
                         ("savepoint", self.on_savepoint), ("release_savepoint", self.on_release),
                         ("rollback_savepoint", self.on_rollback_savepoint)):
            event.listen(conn, name, fn)

    @staticmethod
    def current(conn: Connection) -> Any:
        return conn.get_nested_transaction() or _ROOT

    def settle(self, conn: Connection) -> None:
        here = self.current(conn)
        for tag in self.floating:
            self.move(tag, here)
        self.floating.clear()

    def keep(self, conn: Connection, item: Any, deliver: Deliver) -> None:
        if not conn.in_transaction():
            conn.begin()
        self.settle(conn)
        self.add(self.current(conn), item, deliver)

    def on_savepoint(self, conn: Connection, name: str | None) -> None:
        self.settle(conn)

    def on_release(self, conn: Connection, name: str, context: Any) -> None:
        self.settle(conn)
        self.floating.append(self.current(conn))

    def on_rollback_savepoint(self, conn: Connection, name: str, context: Any) -> None:
        self.settle(conn)
        self.drop(self.current(conn))

    def on_rollback(self, conn: Connection) -> None:
        self.floating.clear()
        self.items.clear()

    def on_commit(self, conn: Connection) -> None:
        self.floating.clear()
        if not self.items:
            return
        dialect = conn.dialect
        try:
            dialect.do_commit(conn.connection)
        except Exception as error:
            self.items.clear()
            dbapi_error = getattr(dialect.loaded_dbapi, "Error", None)
            if dbapi_error is not None and isinstance(error, dbapi_error):
                raise exc.DBAPIError.instance("COMMIT", None, error, dbapi_error, dialect=dialect) from error
            raise
        self.deliver_all()


# Per Connection object (``Connection.info`` belongs to the pooled DBAPI connection, shared by later checkouts);
# the state holds no reference to its Connection, so the entry goes with it.
_CONNECTIONS: weakref.WeakKeyDictionary[Connection, _ConnectionKept] = weakref.WeakKeyDictionary()


def _connection(conn: Connection, in_async: bool) -> _ConnectionKept:
    state = _CONNECTIONS.get(conn)
    if state is None:
        state = _CONNECTIONS[conn] = _ConnectionKept(conn, in_async)
    state.in_async = state.in_async or in_async
    return state


def run_async(coro: Any) -> bool:
    """Await ``coro`` from a commit hook of an async session or connection (inside SQLAlchemy's greenlet).
    False, ``coro`` closed unstarted, when the commit did not run in that greenlet (the sync session of an
    AsyncSession committed directly): the caller then sends synchronously."""
    from sqlalchemy.util import await_only  # only an async target gets here: greenlet is installed

    try:
        await_only(coro)
    except exc.MissingGreenlet:
        return False
    return True
