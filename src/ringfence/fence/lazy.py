"""``step.complete(engine)`` on the fence's own database, with the fence's UPDATE sent only when needed.

The UPDATE must be the first statement of the caller's transaction, and its answer read before any of the
caller's statements run (a zombie gets ``FencedOut`` before its writes; a dead pooled connection is replaced
before them). It need not go out before the block starts: here it goes out just before the block's first
statement (an engine event), on the same connection, in the same round trip as ``BEGIN`` (psycopg). A block that
sends nothing costs no transaction of its own: its completion is the fence's single UPDATE in autocommit, one
round trip.

When the UPDATE finds the connection dead, nothing of the caller's has reached the database yet: the dead
transaction is rolled back and the UPDATE runs again on a fresh connection (``DbRetry``), and the caller's
statement then goes out on that connection.

A block that sent nothing leaves its connection as it found it: up to ``SPARE`` such connections per engine stay
checked out for the next completion (no pool checkout and return per job; an ``async with`` takes one on the loop
instead of a thread hop). A spare is a pooled connection that skipped the pool: a dead one is replaced as above.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from weakref import WeakKeyDictionary, WeakSet

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError

from ..faults import fault_point
from .dbretry import DbRetry, retrying

_pending: dict[Connection, _Pending] = {}  # a connection whose block has not sent its first statement yet
_watched: WeakSet[Engine] = WeakSet()
_lock = threading.Lock()
SPARE = 4  # unused connections kept checked out per engine (at most; the pool lends the rest)


class _Spares:
    """Connections of one engine that a completion's block left unused, kept checked out for the next one."""

    def __init__(self) -> None:
        self.conns: deque[Connection] = deque()
        self.pid = os.getpid()

    def take(self) -> Connection | None:
        if self.pid != os.getpid():  # a forked child: the parent's sockets are not ours (left unused)
            self.conns, self.pid = deque(), os.getpid()
        try:
            return self.conns.pop()
        except IndexError:
            return None

    def keep(self, conn: Connection, db: Engine) -> bool:
        if (self.pid != os.getpid() or len(self.conns) >= SPARE or conn.closed or conn.invalidated
                or conn.in_transaction() or conn.get_execution_options() != db.get_execution_options()):
            return False
        self.conns.append(conn)
        return True

    def close(self) -> None:
        while (conn := self.take()) is not None:
            with suppress(Exception):  # already gone
                conn.close()


_spares: WeakKeyDictionary[Engine, _Spares] = WeakKeyDictionary()


def take_spare(db: Engine) -> Connection | None:
    """A connection of ``db`` kept from an earlier completion (no I/O, no wait), or None."""
    spares = _spares.get(db)
    return None if spares is None else spares.take()


class _Pending:
    def __init__(self, first: Callable[[Connection], int], stale: Callable[[], Exception], retry: DbRetry) -> None:
        self.first, self.stale, self.retry = first, stale, retry

    def run(self, conn: Connection, *, reconnect: bool) -> None:
        """The fence's UPDATE as the transaction's first statement; ``FencedOut`` if the epoch moved."""
        def attempt(retried: bool) -> int:
            if retried:
                conn.rollback()  # the dead connection's transaction: the next statement reconnects
            return self.first(conn)

        rowcount = retrying(self.retry, attempt, "fence completion") if reconnect else self.first(conn)
        if rowcount != 1:
            raise self.stale()


def _before_execute(conn: Connection, *args: Any) -> None:
    pending = _pending.pop(conn, None)
    if pending is not None:
        pending.run(conn, reconnect=True)  # no cursor taken yet: the connection may still be replaced


def _before_cursor_execute(conn: Connection, *args: Any) -> None:
    pending = _pending.pop(conn, None)  # exec_driver_sql: no before_execute; the cursor is already taken
    if pending is not None:
        pending.run(conn, reconnect=False)


def _watch(engine: Engine) -> None:
    if engine in _watched:
        return
    with _lock:
        if engine not in _watched:
            event.listen(engine, "before_execute", _before_execute)
            event.listen(engine, "before_cursor_execute", _before_cursor_execute)
            spares = _spares[engine] = _Spares()
            event.listen(engine, "engine_disposed", lambda _engine: spares.close())
            _watched.add(engine)


@contextmanager
def lazy_completion(db: Engine, first: Callable[[Connection], int], stale: Callable[[], Exception],
                    retry: DbRetry, alone: Callable[[], None], committed: Callable[[], bool] | None,
                    confirm: Callable[[BaseException, Callable[[], bool] | None], bool],
                    restore: Callable[[Connection], None], spare: Connection | None = None) -> Iterator[Connection]:
    """Yield a connection of ``db`` whose first statement is preceded by the fence's UPDATE (``first``); a block
    that sent nothing completes with ``alone()`` (the UPDATE in autocommit). ``restore`` puts the driver
    connection back as the pool expects it (psycopg: autocommit off) before it is returned. ``spare``: a
    connection :func:`take_spare` gave (else one is taken here)."""
    _watch(db)
    conn = spare or take_spare(db) or db.connect()
    _pending[conn] = _Pending(first, stale, retry)
    try:
        yield conn
        fault_point("before_commit")
    except BaseException:
        _pending.pop(conn, None)
        try:
            conn.rollback()
        finally:
            _close(conn, restore)
        raise
    pending = _pending.pop(conn, None)
    if pending is not None and not _in_transaction(conn):  # the block sent nothing
        restore(conn)
        if not _spares[db].keep(conn, db):
            conn.close()
        alone()
        return
    try:
        if pending is not None:  # written through the driver connection directly: the UPDATE now, then commit
            pending.run(conn, reconnect=False)
        conn.commit()
    except DBAPIError as exc:
        with suppress(Exception):
            conn.rollback()
        if not confirm(exc, committed):
            _close(conn, restore)
            raise
    except BaseException:
        with suppress(Exception):
            conn.rollback()
        _close(conn, restore)
        raise
    _close(conn, restore)


def unsent(conn: Connection) -> bool:
    """Has the block on ``conn`` (from :func:`lazy_completion`) sent nothing yet? Leaving it then does no I/O but
    the completion ``alone``."""
    return conn in _pending and not _in_transaction(conn)


def _close(conn: Connection, restore: Callable[[Connection], None]) -> None:
    try:
        restore(conn)
    finally:
        conn.close()


def _in_transaction(conn: Connection) -> bool:
    """Did anything open a transaction on the driver connection (a statement sent around SQLAlchemy)?"""
    if conn.invalidated:
        return False
    raw: Any = conn.connection.dbapi_connection
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is not None:  # psycopg: libpq's status as an int (``raw.info`` builds an object and two enums)
        return int(pgconn.transaction_status) != 0
    info = getattr(raw, "info", None)
    if info is not None and hasattr(info, "transaction_status"):  # psycopg
        return int(info.transaction_status) != 0
    status = getattr(raw, "server_status", None)  # PyMySQL
    if isinstance(status, int):
        return bool(status & 1)
    return bool(getattr(raw, "in_transaction", True))  # sqlite3; anything else: assume so

