"""Riding out a database blip: killed connections, a failover, a restart.

Optimistic disconnect handling (no pre-ping: that would cost a round trip per checkout). A statement
that fails because its connection died raises ``DBAPIError`` with ``connection_invalidated``; SQLAlchemy
has then invalidated that connection and every pooled connection older than it, so the next checkout
connects afresh. :func:`retrying` runs one whole transaction again on such an error, with bounded,
jittered backoff. Every write passed to it must be safe to repeat: the fence's writes are conditional on
the epoch, and a repeat that finds its own earlier write already committed counts it as done.

Example::

    engine = make_engine("postgresql+psycopg://app@db/app")
    n = retrying(DbRetry(), lambda retried: count_rows(engine))
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError

from ..errors import ConfigError, FenceStoreError

log = logging.getLogger("ringfence.fence")
T = TypeVar("T")

# PostgreSQL SQLSTATEs that mean "this connection is gone": class 08 (connection exception) and the
# operator-intervention codes (pg_terminate_backend, a shutdown, a server not accepting connections yet).
PG_GONE = ("08", "57P01", "57P02", "57P03")
# libpq's and psycopg's own words for a socket that was closed (no SQLSTATE: the client noticed). Unflagged,
# "connection socket closed" left the connection to a ROLLBACK that psycopg refuses ("another command is already
# in progress"), and the write was not retried.
PG_GONE_TEXT = ("server closed the connection unexpectedly", "consuming input failed", "connection is lost",
                 "connection socket closed")


@dataclass(frozen=True)
class DbRetry:
    """How often and how long a transaction is retried after its connection died.

    ``attempts`` tries in all, sleeping ``base_s * 2**n`` (capped at ``cap_s``, jittered to 50–100 %)
    between them, and never starting a sleep that would end past ``budget_s`` after the first try.
    The defaults ride out ~10 s of killed connections or a restart; keep ``budget_s`` well under the
    jobs' ``timeout_s`` (the fence's own lease is ``timeout_s + lease_s``).
    """

    attempts: int = 10
    base_s: float = 0.05
    cap_s: float = 2.0
    budget_s: float = 15.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.cap_s < self.base_s or self.budget_s < 0:
            raise ConfigError(f"DbRetry needs attempts >= 1 and 0 <= base_s <= cap_s, budget_s >= 0; got {self}")

    def delays(self) -> Iterator[float]:
        """The sleeps between tries, within the budget."""
        spent = 0.0
        for n in range(self.attempts - 1):
            delay = min(self.cap_s, self.base_s * 2**n) * random.uniform(0.5, 1.0)
            if spent + delay > self.budget_s:
                return
            spent += delay
            yield delay


DEFAULT_RETRY = DbRetry()
NO_RETRY = DbRetry(attempts=1)


def is_disconnect(exc: BaseException) -> bool:
    """Did this error come from a connection that died (so the transaction may run again on a new one)?"""
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def is_transient(exc: BaseException) -> bool:
    """Did the database not answer (a dead connection, a refused connect, a lock timeout)? Worth trying later."""
    if isinstance(exc, FenceStoreError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return is_disconnect(exc) or isinstance(exc, OperationalError | InterfaceError)


def store_error(exc: SQLAlchemyError, where: str, url: str | None = None) -> FenceStoreError:
    """``exc`` as ringfence's own error, naming ``where``, the database at ``url`` (its password hidden) and the
    driver's words (raise it ``from exc``)."""
    orig = getattr(exc, "orig", None)
    orig = orig if isinstance(orig, BaseException) else exc
    words = (str(orig).strip().splitlines() or [""])[0]
    db = "the fence database" if url is None else f"the fence database at {url}"
    return FenceStoreError(f"{where}: {db} failed: {type(orig).__name__}: {words}")


@contextmanager
def database_errors(where: str, engine: Engine) -> Iterator[None]:
    """SQLAlchemy's and the driver's errors raised inside as :func:`store_error` (an operator's call: the message
    names the database)."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise store_error(exc, where, engine.url.render_as_string(hide_password=True)) from exc


def retrying(policy: DbRetry, attempt: Callable[[bool], T], what: str = "database call") -> T:
    """``attempt(retried)`` runs one whole transaction; it runs again while its connection dies.

    ``retried`` is True on every try after the first: the previous try may have committed before
    its connection died (the answer to COMMIT was lost), so a conditional write that now matches
    nothing must check whether the row already holds what it wanted to write.
    """
    delays: Iterator[float] | None = None  # made once a try failed: most statements succeed at once
    retried = False
    while True:
        try:
            return attempt(retried)
        except DBAPIError as exc:
            delays = delays or policy.delays()
            delay = _next_delay(exc, delays, what)
        time.sleep(delay)
        retried = True


async def aretrying(policy: DbRetry, attempt: Callable[[bool], Awaitable[T]], what: str = "database call") -> T:
    """Async twin of :func:`retrying` (sleeps with ``asyncio.sleep``)."""
    delays: Iterator[float] | None = None
    retried = False
    while True:
        try:
            return await attempt(retried)
        except DBAPIError as exc:
            delays = delays or policy.delays()
            delay = _next_delay(exc, delays, what)
        await asyncio.sleep(delay)
        retried = True


def _next_delay(exc: DBAPIError, delays: Iterator[float], what: str) -> float:
    if not is_disconnect(exc):
        raise exc
    delay = next(delays, None)
    if delay is None:
        log.warning("%s: the database connection died again and the retries are spent: %s", what, exc.orig)
        raise exc
    log.debug("%s: the database connection died (%s); retrying in %.2fs on a new one", what, exc.orig, delay)
    return delay


def watch_disconnects(engine: Engine) -> Engine:
    """Make ``engine`` count every "connection is gone" error as a disconnect, also while connecting.

    SQLAlchemy's psycopg dialect recognises a terminated backend only once the driver marked the
    connection broken, and never for an error raised while a new connection initialises (the dialect's
    first-connect queries); the SQLSTATE, or libpq's message, says it in every case. Idempotent.
    """
    if not event.contains(engine, "handle_error", _flag_gone):
        event.listen(engine, "handle_error", _flag_gone)
    return engine


def _flag_gone(ctx: ExceptionContext) -> None:
    if ctx.is_disconnect:
        return
    exc = ctx.original_exception
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if (isinstance(state, str) and state.startswith(PG_GONE)) or (
            ctx.dialect.name == "postgresql" and any(text in str(exc) for text in PG_GONE_TEXT)):
        ctx.is_disconnect = True


def make_engine(url: str, **kwargs: Any) -> Engine:
    """The engine the project creates from a URL: no pre-ping (a round trip per checkout), disconnects watched.

    With PyMySQL a connection goes back to the pool without the pool's ROLLBACK when the server said its last
    answer left no transaction open (after a COMMIT): a round trip less per fence write on MariaDB/MySQL."""
    if "pymysql" in url.split("://", 1)[0] and "pool_reset_on_return" not in kwargs:
        engine = create_engine(url, pool_reset_on_return=None, **kwargs)
        event.listen(engine, "reset", _rollback_if_open)
        return watch_disconnects(engine)
    return watch_disconnects(create_engine(url, **kwargs))


_IN_TRANS = 1  # MySQL's SERVER_STATUS_IN_TRANS, sent with every OK / EOF packet


def _rollback_if_open(dbapi_conn: Any, record: Any, state: Any) -> None:
    if state.terminate_only or not state.asyncio_safe:
        return  # the connection is being discarded
    status = getattr(dbapi_conn, "server_status", None)
    if not isinstance(status, int) or status & _IN_TRANS:
        dbapi_conn.rollback()

_told: set[str] = set()


def told(reason: str) -> None:
    """Log ``reason`` (a fast path not taken) once per process."""
    if reason not in _told:
        _told.add(reason)
        log.info("%s", reason)


def skip_idle_ends(engine: Engine) -> None:
    """An autocommit PyMySQL engine: SQLAlchemy still ends each use with ``rollback()``, which PyMySQL always sends
    (a round trip). Send COMMIT / ROLLBACK only when the server said a transaction is open (a driver connection
    without ``server_status`` gets them always). A dialect whose methods cannot be replaced keeps its own."""
    dialect: Any = engine.dialect
    real_commit, real_rollback = dialect.do_commit, dialect.do_rollback

    def do_commit(dbapi_conn: Any) -> None:
        if _open(dbapi_conn):
            real_commit(dbapi_conn)

    def do_rollback(dbapi_conn: Any) -> None:
        if _open(dbapi_conn):
            real_rollback(dbapi_conn)

    try:
        dialect.do_commit, dialect.do_rollback = do_commit, do_rollback
    except (AttributeError, TypeError) as exc:  # a dialect with slots or read-only methods
        told(f"the fence's autocommit engine sends every COMMIT / ROLLBACK: {exc}")


def _open(dbapi_conn: Any) -> bool:
    status = getattr(getattr(dbapi_conn, "dbapi_connection", dbapi_conn), "server_status", None)
    return not isinstance(status, int) or bool(status & _IN_TRANS)
