"""``task.enqueue_in(conn, ...)``: the job as a row of the outbox, written in the caller's transaction.

Nothing here commits or talks to Redis: the row becomes visible to the relay when the caller commits, and
vanishes with everything else when it rolls back. ``conn`` is what a fence completion takes: a SQLAlchemy
Connection or Session (``aenqueue_in``: AsyncConnection or AsyncSession), a DB-API connection (sqlite3,
psycopg, PyMySQL …) or Django's ``django.db.connection``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Insert, MetaData, Table, insert
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session

from ringfence.errors import ConfigError
from ringfence.fence.schema import db_now
from ringfence.outbox.schema import OUTBOX_TABLE, outbox_table

if TYPE_CHECKING:
    from ringfence.tasks import EnqueueOptions, Task

_TABLES: dict[str, Table] = {}

# A DB-API connection's module -> the SQLAlchemy dialect that renders SQL for it.
_DBAPI_DIALECTS = {"sqlite3": "sqlite", "psycopg": "postgresql+psycopg", "psycopg2": "postgresql+psycopg2",
                   "pymysql": "mysql+pymysql", "MySQLdb": "mysql+mysqldb", "mariadb": "mariadb+mariadbconnector"}
_DJANGO_DIALECTS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql", "sqlite": "sqlite"}


def table(name: str = OUTBOX_TABLE) -> Table:
    found = _TABLES.get(name)
    if found is None:
        found = _TABLES[name] = outbox_table(MetaData(), name)
    return found


def row(task: Task, payload: Any, opts: EnqueueOptions) -> dict[str, Any]:
    """Validate and encode exactly as ``task.enqueue`` does (same errors), timed by this host's clock."""
    if opts.raise_on_duplicate:
        raise ConfigError("enqueue_in: raise_on_duplicate cannot apply: the relay sends the job after the "
                          "transaction commits; check for the unique key in your own tables instead")
    client = task.app.client
    queue, job_id, spec, at, ukey, until = client.prepare(task, payload, opts, now_ms=time.time() * 1000)
    replicas = client.replicas(opts)
    return {"namespace": client.namespace, "job_id": job_id, "queue": queue, "task": task.name,
            "spec": spec.decode(), "run_at_ms": at or None, "unique_key": ukey or None,
            "unique_until_ms": until if ukey else None, "min_replicas": replicas or None}


_VALUES = ("namespace", "job_id", "queue", "task", "spec", "run_at_ms", "unique_key", "unique_until_ms",
           "min_replicas")
_STATEMENT: list[Insert] = []
_COMPILED: dict[tuple[str, str], Any] = {}


def statement() -> Insert:
    """The INSERT, built once (building it per call cost more than the round trip); values are parameters.
    inline: no RETURNING of the new id (nobody reads it; a raw DB-API cursor would leave it unread)."""
    if not _STATEMENT:
        _STATEMENT.append(insert(table()).values(created_at=db_now()).inline())
    return _STATEMENT[0]


def enqueue_in(task: Task, conn: Any, payload: Any, opts: EnqueueOptions) -> str:
    """Write the job into the outbox through ``conn``; return its id (the id it will have in Redis)."""
    values = row(task, payload, opts)
    with _table_named(conn):
        write(conn, values)
    return str(values["job_id"])


async def aenqueue_in(task: Task, conn: Any, payload: Any, opts: EnqueueOptions) -> str:
    values = row(task, payload, opts)
    with _table_named(conn):
        await awrite(conn, values)
    return str(values["job_id"])


_MISSING = ("no such table", "does not exist", "doesn't exist", "undefinedtable")


@contextmanager
def _table_named(conn: Any) -> Iterator[None]:
    """A write that failed for want of the outbox table raises one ConfigError saying how to create it."""
    try:
        yield
    except Exception as exc:
        missing = _no_table(exc, conn)
        if missing is None:
            raise
        raise missing from exc


def _no_table(exc: Exception, conn: Any) -> ConfigError | None:
    """"No outbox table in this database" as one line saying how to create it (the caller's transaction
    is lost either way: the failed INSERT aborted it on PostgreSQL)."""
    text = str(exc).lower()
    if OUTBOX_TABLE not in text or not any(m in text for m in _MISSING):
        return None
    from ringfence.fence.complete import describe

    return ConfigError(f"enqueue_in: {describe(conn)} has no {OUTBOX_TABLE} table; create it with "
                       "`ringfence outbox init --app APP`, or `ringfence outbox ddl --dialect DIALECT` in a migration")


def write(conn: Any, values: dict[str, Any]) -> None:
    """Insert the row through ``conn`` without committing."""
    if _is_async(conn):
        raise TypeError(f"enqueue_in: {type(conn).__name__} is asynchronous: use `await task.aenqueue_in(conn, ...)`")
    if isinstance(conn, Connection | Session):
        conn.execute(statement(), values)
        return
    if _is_django(conn):
        sql, args = _compiled(_DJANGO_DIALECTS.get(conn.vendor), conn.vendor, "format", values)
        with conn.cursor() as cur:
            cur.execute(sql, args)
        return
    if callable(getattr(conn, "cursor", None)) and callable(getattr(conn, "commit", None)):
        root = type(conn).__module__.split(".")[0]
        module = sys.modules.get(root)
        sql, args = _compiled(_DBAPI_DIALECTS.get(root), root, getattr(module, "paramstyle", None), values)
        cur = conn.cursor()
        try:
            cur.execute(sql, args)
        finally:
            cur.close()
        return
    raise TypeError(f"enqueue_in: cannot write through a {type(conn).__name__}; pass a SQLAlchemy Connection or "
                    "Session (aenqueue_in: an async one), a DB-API connection or django.db.connection")


async def awrite(conn: Any, values: dict[str, Any]) -> None:
    if not _is_async(conn):
        write(conn, values)  # a sync connection from async code: the caller's thread owns it
        return
    await conn.execute(statement(), values)


def _is_async(conn: Any) -> bool:
    mod = type(conn).__module__
    return mod.startswith("sqlalchemy.ext.asyncio") and type(conn).__name__ in ("AsyncConnection", "AsyncSession")


def _is_django(conn: Any) -> bool:
    return all(hasattr(conn, a) for a in ("vendor", "alias", "in_atomic_block"))


def _dialect(name: str | None, what: str) -> Dialect:
    if name is None:
        raise TypeError(f"enqueue_in: no SQL dialect known for {what!r} connections; pass a SQLAlchemy "
                        "Connection or Session instead")
    from sqlalchemy.engine import make_url

    dialect: Dialect = make_url(f"{name}://").get_dialect()()
    return dialect


def _compiled(name: str | None, what: str, paramstyle: str | None, values: dict[str, Any]) -> tuple[str, Any]:
    """SQL text + parameters for a driver with the given DB-API paramstyle (compiled once per driver)."""
    key = (what, str(paramstyle))
    compiled = _COMPILED.get(key)
    if compiled is None:
        dialect = _dialect(name, what)
        dia = type(dialect)(paramstyle=paramstyle or dialect.paramstyle)  # type: ignore[call-arg]
        compiled = _COMPILED[key] = statement().compile(dialect=dia, column_keys=list(_VALUES))
    params = compiled.construct_params(values)
    if compiled.positional:
        return str(compiled), tuple(params[n] for n in compiled.positiontup or ())
    return str(compiled), params
