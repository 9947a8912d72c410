"""Run a fence's completion inside the application's own transaction.

``db`` may be a SQLAlchemy Engine / Connection / Session, their asyncio twins, a plain
DB-API connection (sqlite3, psycopg, PyMySQL …) or Django's ``django.db.connection``.
In every case: the epoch-conditional UPDATE runs first in the transaction (rowcount 0 →
``FencedOut`` and rollback), the caller's writes run in the ``with`` body, then one commit.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, Update
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ..errors import ConfigError, FencedOut
from ..faults import fault_point
from ..offloop import HOP, in_thread
from .dbretry import NO_RETRY, DbRetry, aretrying, is_disconnect, retrying, told
from .lazy import lazy_completion, take_spare, unsent

Stale = Callable[[], FencedOut]


@dataclass(frozen=True)
class Bound:
    """The completion's prebuilt UPDATE and this step's parameters for it."""

    stmt: Update
    params: dict[str, Any]

Committed = Callable[[], bool]  # does the fence row show this completion committed?


def _check(rowcount: int, stale: Stale) -> None:
    if rowcount != 1:
        raise stale()


_MISSING = ("no such table", "does not exist", "doesn't exist", "undefinedtable")


def _wrong_database(exc: Exception, db: Any, table: str, fence_db: str) -> ConfigError | None:
    """"No fence table here" as one line naming both databases (a ConfigError: retrying cannot help)."""
    text = str(exc).lower()
    if table.lower() not in text or not any(m in text for m in _MISSING):
        return None
    return ConfigError(f"step.complete(db): {describe(db)} has no fence table {table}; the fences are in "
                       f"{fence_db}: pass a connection to the fence database, or point fence_url at the database "
                       "the handler writes to")


def describe(db: Any) -> str:
    """The database ``db`` talks to (its URL without password), or its type for a plain DB-API connection."""
    finders: list[Callable[[], Any]] = [lambda: db.url, lambda: db.engine.url, lambda: db.get_bind().url,
                                        lambda: db.bind.url]
    for find in finders:
        try:
            return str(find().render_as_string(hide_password=True))
        except Exception:  # not this kind of object: try the next way to find the URL
            continue
    return f"the {type(db).__module__}.{type(db).__name__} passed"


class NamingDatabases:
    """``inner`` (a completion), with a failure of its fence UPDATE on a database without the table explained.
    A class: it wraps every sync completion, and a generator per job costs more than its check."""

    __slots__ = ("db", "fence_db", "inner", "table")

    def __init__(self, inner: AbstractContextManager[Any], db: Any, table: str, fence_db: str) -> None:
        self.inner, self.db, self.table, self.fence_db = inner, db, table, fence_db

    def __enter__(self) -> Any:
        try:
            return self.inner.__enter__()
        except Exception as exc:
            wrong = _wrong_database(exc, self.db, self.table, self.fence_db)
            if wrong is None:
                raise
            raise wrong from exc

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool | None:
        return self.inner.__exit__(et, exc, tb)


@asynccontextmanager
async def anaming_databases(inner: AbstractAsyncContextManager[Any], db: Any, table: str,
                            fence_db: str) -> AsyncIterator[Any]:
    """Async twin of :class:`NamingDatabases`."""
    entered = False
    try:
        async with inner as conn:
            entered = True
            yield conn
    except Exception as exc:
        wrong = None if entered else _wrong_database(exc, db, table, fence_db)
        if wrong is None:
            raise
        raise wrong from exc


def _begin(db: Engine, stmt: Bound, stale: Stale) -> tuple[AbstractContextManager[Any], Connection]:
    """Begin a transaction on ``db`` and run the fence's UPDATE as its first statement."""
    tx: Any = _PgBegin(db) if _pipelined(db.dialect) else db.begin()
    try:
        conn = tx.__enter__()
        rowcount = tx.first(stmt) if isinstance(tx, _PgBegin) else conn.execute(stmt.stmt, stmt.params).rowcount
        _check(rowcount, stale)
    except BaseException:
        tx.__exit__(*sys.exc_info())
        raise
    return tx, conn


class _PgBegin:
    """``engine.begin()`` for psycopg, ``BEGIN`` sent in the round trip of the fence's UPDATE (:func:`pg_first`)."""

    def __init__(self, db: Engine) -> None:
        self.conn = db.connect()

    def __enter__(self) -> Connection:
        return self.conn

    def first(self, stmt: Bound) -> int:
        return pg_first(self.conn, stmt)

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        try:
            if et is None:
                self.conn.commit()
            else:
                self.conn.rollback()
        finally:
            restore_autocommit(self.conn)
            self.conn.close()
        return False


def first_statement(conn: Connection, stmt: Bound) -> int:
    """Run the fence's UPDATE as the first statement of ``conn``'s transaction; its rowcount."""
    if _pipelined(conn.dialect):
        return pg_first(conn, stmt)
    return int(conn.execute(stmt.stmt, stmt.params).rowcount)


def _pipelined(dialect: Dialect) -> bool:
    """Sync psycopg, where :func:`pg_first` can hand an error to SQLAlchemy's own handler (private: checked)."""
    if dialect.driver != "psycopg" or dialect.is_async:
        return False
    if not _ERROR_HANDLER:
        told("a fenced transaction sends BEGIN alone: SQLAlchemy's Connection has no _handle_dbapi_exception")
    return _ERROR_HANDLER


_ERROR_HANDLER = hasattr(Connection, "_handle_dbapi_exception")


def pg_first(conn: Connection, stmt: Bound) -> int:
    """psycopg sends ``BEGIN`` in a round trip of its own before a transaction's first statement (also in pipeline
    mode). Here the driver connection is switched to autocommit (a client-side flag) and ``BEGIN`` + the UPDATE go
    out in one pipeline: one round trip, and the transaction still begins explicitly. :func:`restore_autocommit`
    switches the flag back once the transaction ended."""
    raw: Any = conn.connection.dbapi_connection
    raw.autocommit = True
    try:
        with raw.pipeline():
            raw.execute("BEGIN")
            result = conn.execute(stmt.stmt, stmt.params)
    except DBAPIError:
        raise
    except conn.dialect.loaded_dbapi.Error as exc:  # raised when the pipeline synced, outside execute()
        conn._handle_dbapi_exception(exc, str(stmt.stmt), stmt.params, None, None)  # raises DBAPIError
    return int(result.context.cursor.rowcount)


def restore_autocommit(conn: Connection) -> None:
    """After :func:`pg_first`'s transaction ended: autocommit off again. A connection where that fails (or still
    in a transaction) is invalidated, never pooled in autocommit."""
    if conn.invalidated or conn.closed or conn.dialect.driver != "psycopg":
        return
    raw: Any = conn.connection.dbapi_connection
    try:
        if not raw.autocommit:
            return
        if not raw.closed and raw.info.transaction_status == 0:  # idle: the transaction ended
            raw.autocommit = False
            return
    except Exception:  # a broken connection: invalidated below
        pass
    with suppress(Exception):  # already invalidated or closed: it will not be pooled
        conn.invalidate()


def _confirm(exc: BaseException, committed: Committed | None) -> bool:
    """A COMMIT whose connection died: it may have gone through. The fence's row, read on another
    connection, tells (it was written in the same transaction): True means committed, so no error."""
    return committed is not None and is_disconnect(exc) and committed()


def lazy(db: Engine, stmt: Bound, stale: Stale, retry: DbRetry, committed: Committed | None,
         alone: Callable[[], None]) -> AbstractContextManager[Connection]:
    """:func:`sync_completion` on the fence's own Engine (``alone``: its UPDATE alone, for a block that sent
    nothing), without the dispatch's generator: the path of every ``step.complete(engine)`` there."""
    return lazy_completion(db, lambda conn: first_statement(conn, stmt), stale, retry, alone, committed, _confirm,
                           restore_autocommit)


@contextmanager
def sync_completion(db: Any, stmt: Bound, dialect: Dialect, stale: Stale, retry: DbRetry = NO_RETRY,
                    committed: Committed | None = None, alone: Callable[[], None] | None = None) -> Iterator[Any]:
    """Yield the object the caller writes through; commit once on success, roll back on error.

    With an Engine the fence's UPDATE is the transaction's first statement: if its (pooled) connection
    turns out dead, nothing of the caller's has run yet, so it starts over on a fresh connection. A
    COMMIT that loses its connection is checked with ``committed`` (SQLAlchemy ``db`` only).
    """
    if isinstance(db, Engine) and alone is not None:  # the fence's own database: the UPDATE only when needed
        with lazy(db, stmt, stale, retry, committed, alone) as conn:
            yield conn
        return
    if isinstance(db, Engine):
        with _engine_completion(db, stmt, stale, retry, committed) as conn:
            yield conn
        return
    if isinstance(db, Connection | Session):
        with _sa_completion(db, stmt, stale, committed) as conn:
            yield conn
        return
    if _is_django(db):
        with _django_completion(db, stmt, dialect, stale) as conn:
            yield conn
        return
    if callable(getattr(db, "cursor", None)) and callable(getattr(db, "commit", None)):
        with _dbapi_completion(db, stmt, dialect, stale) as conn:
            yield conn
        return
    raise TypeError(f"complete(db): cannot use a {type(db).__name__}; pass a SQLAlchemy Engine, "
                    "Connection or Session, an async one, or a DB-API connection")


@contextmanager
def _engine_completion(db: Engine, stmt: Bound, stale: Stale, retry: DbRetry,
                       committed: Committed | None) -> Iterator[Connection]:
    tx, conn = retrying(retry, lambda _retried: _begin(db, stmt, stale), "fence completion")
    try:
        yield conn
        fault_point("before_commit")
    except BaseException:
        if not tx.__exit__(*sys.exc_info()):  # rolls back
            raise
    else:
        try:
            tx.__exit__(None, None, None)  # commits
        except DBAPIError as exc:
            if not _confirm(exc, committed):
                raise


@contextmanager
def _sa_completion(db: Connection | Session, stmt: Bound, stale: Stale,
                   committed: Committed | None) -> Iterator[Any]:
    try:
        _check(db.execute(stmt.stmt, stmt.params).rowcount, stale)  # type: ignore[attr-defined]
        yield db
        fault_point("before_commit")
    except BaseException:
        db.rollback()
        raise
    try:
        db.commit()
    except DBAPIError as exc:
        db.rollback()  # the caller's Connection/Session stays usable
        if not _confirm(exc, committed):
            raise


@asynccontextmanager
async def async_completion(db: Any, stmt: Bound, dialect: Dialect, stale: Stale, retry: DbRetry = NO_RETRY,
                           committed: Committed | None = None, alone: Callable[[], None] | None = None,
                           aalone: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[Any]:
    """Async twin of :func:`sync_completion` for AsyncEngine, AsyncConnection and AsyncSession.

    A sync SQLAlchemy ``db`` gets its blocking statements (begin, the fence UPDATE, commit) run in a
    thread; a DB-API or Django connection, usually bound to its thread, keeps them on the loop's.
    ``aalone``: ``alone`` on the loop (the store's async statements), for a block that sent nothing.
    """
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

    if not isinstance(db, AsyncEngine | AsyncConnection | AsyncSession):
        async with _sync_db(db, stmt, dialect, stale, retry, committed, alone, aalone) as conn:
            yield conn
        return
    if isinstance(db, AsyncEngine):
        atx, aconn = await aretrying(retry, lambda _retried: _abegin(db, stmt, stale), "fence completion")
        try:
            yield aconn
            fault_point("before_commit")
        except BaseException:
            if not await atx.__aexit__(*sys.exc_info()):
                raise
        else:
            try:
                await atx.__aexit__(None, None, None)
            except DBAPIError as exc:
                if not await HOP.run(_confirm, exc, committed):
                    raise
        return
    try:
        _check((await db.execute(stmt.stmt, stmt.params)).rowcount, stale)  # type: ignore[attr-defined]
        yield db
        fault_point("before_commit")
    except BaseException:
        await db.rollback()
        raise
    try:
        await db.commit()
    except DBAPIError as exc:
        await db.rollback()
        if not await HOP.run(_confirm, exc, committed):
            raise


@asynccontextmanager
async def _sync_db(db: Any, stmt: Bound, dialect: Dialect, stale: Stale, retry: DbRetry, committed: Committed | None,
                   alone: Callable[[], None] | None,
                   aalone: Callable[[], Awaitable[None]] | None) -> AsyncIterator[Any]:
    """:func:`async_completion` with a sync ``db``."""
    if isinstance(db, Engine) and alone is not None and aalone is not None:
        async with AloneOnLoop(db, stmt, stale, retry, committed, aalone) as conn:
            yield conn
        return
    sync = sync_completion(db, stmt, dialect, stale, retry, committed, alone)
    if isinstance(db, Engine | Connection | Session):
        async with in_thread(sync) as conn:
            yield conn
    else:
        with sync as conn:
            yield conn


class AloneOnLoop:
    """The store's own sync Engine in an ``async with``: the connection is a spare one an earlier block left unused
    (taken on the loop: no I/O) or is checked out in a thread; a block that sent nothing gives it back on the loop
    (no I/O: nothing is open on it) and completes with the store's async statement (``aalone``), with no second
    thread hop. A block that wrote commits in a thread. With ``table``, a failure to begin is explained
    as :func:`anaming_databases` does.

    A class, not nested ``asynccontextmanager``s: this is the path of every ``async with step.complete(engine)``
    on the store's own engine, and four nested async generators cost more CPU than the rest of the completion."""

    __slots__ = ("aalone", "committed", "conn", "db", "fence_db", "needed", "retry", "stale", "stmt", "sync", "table")

    def __init__(self, db: Engine, stmt: Bound, stale: Stale, retry: DbRetry, committed: Committed | None,
                 aalone: Callable[[], Awaitable[None]], table: str | None = None, fence_db: str = "") -> None:
        self.db, self.stmt, self.stale, self.retry, self.committed = db, stmt, stale, retry, committed
        self.aalone, self.table, self.fence_db = aalone, table, fence_db
        self.needed = False

    def _needed(self) -> None:
        self.needed = True

    async def __aenter__(self) -> Connection:
        db, stmt = self.db, self.stmt
        try:
            spare = take_spare(db)  # a connection kept from an earlier completion: no I/O, no thread hop
            self.sync = sync = lazy_completion(db, lambda c: first_statement(c, stmt), self.stale, self.retry,
                                               self._needed, self.committed, _confirm, restore_autocommit, spare)
            self.conn = sync.__enter__() if spare is not None else await HOP.run(sync.__enter__)
        except Exception as exc:
            wrong = None if self.table is None else _wrong_database(exc, db, self.table, self.fence_db)
            if wrong is None:
                raise
            raise wrong from exc
        return self.conn

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        sync = self.sync
        if et is not None:
            return bool(await HOP.run(sync.__exit__, et, exc, tb))
        if not unsent(self.conn):
            await HOP.run(sync.__exit__, None, None, None)
            return False
        sync.__exit__(None, None, None)  # gives the connection back and asks for the completion alone
        if self.needed:
            await self.aalone()
        return False


async def _abegin(db: Any, stmt: Bound, stale: Stale) -> tuple[Any, Any]:
    tx = db.begin()
    conn = await tx.__aenter__()
    try:
        _check((await conn.execute(stmt.stmt, stmt.params)).rowcount, stale)
    except BaseException:
        await tx.__aexit__(*sys.exc_info())
        raise
    return tx, conn


def compile_for(stmt: Bound, dialect: Dialect, paramstyle: str) -> tuple[str, Any]:
    """Render ``stmt`` as SQL text + parameters for a driver with the given DB-API paramstyle."""
    dialect_cls: Any = type(dialect)  # same dialect, the raw driver's paramstyle
    dia = dialect_cls(paramstyle=paramstyle)
    compiled = stmt.stmt.compile(dialect=dia)
    params = compiled.construct_params(stmt.params)
    if compiled.positional:
        return str(compiled), tuple(params[name] for name in compiled.positiontup or ())
    return str(compiled), params


def _paramstyle(db: Any, dialect: Dialect) -> str:
    # Every DB-API module declares its paramstyle at top level (PEP 249).
    module = sys.modules.get(type(db).__module__.split(".")[0])
    return str(getattr(module, "paramstyle", dialect.paramstyle))


@contextmanager
def _dbapi_completion(db: Any, stmt: Bound, dialect: Dialect, stale: Stale) -> Iterator[Any]:
    sql, args = compile_for(stmt, dialect, _paramstyle(db, dialect))
    try:
        cur = db.cursor()
        try:
            cur.execute(sql, args)  # DB-API drivers open a transaction implicitly here
            _check(cur.rowcount, stale)
        finally:
            cur.close()
        yield db
        fault_point("before_commit")
    except BaseException:
        db.rollback()
        raise
    db.commit()


def _is_django(db: Any) -> bool:
    return all(hasattr(db, a) for a in ("vendor", "alias", "in_atomic_block"))


@contextmanager
def _django_completion(db: Any, stmt: Bound, dialect: Dialect, stale: Stale) -> Iterator[Any]:
    from django.db import transaction  # only when a Django connection is passed

    sql, args = compile_for(stmt, dialect, "format")  # Django cursors take %s on every backend
    with transaction.atomic(using=db.alias):  # nests as a savepoint inside the caller's atomic()
        with db.cursor() as cur:
            cur.execute(sql, args)
            _check(cur.rowcount, stale)
        yield db
        fault_point("before_commit")
