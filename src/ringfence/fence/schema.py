"""The fence table and the dead-letter table (SQLAlchemy Core), plus the database clock.

The fence table lives in the application's own database so that a step's local writes
and its completion commit in ONE transaction. Create it with :func:`create_all`, or paste
:func:`ddl` into a migration::

    from ringfence.fence.schema import ddl
    print(ddl("postgresql"))

All times are the database's: statements use :func:`db_now` / :func:`db_now_plus`, which
compile to the dialect's own clock, so workers with skewed clocks agree.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Double,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.exc import OperationalError as SAOperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ColumnElement, FunctionElement, bindparam

from ..errors import FenceTablesMissing
from .dbretry import database_errors

DEFAULT_TABLE = "ringfence_fences"
FAILED_JOBS_TABLE = "ringfence_failed_jobs"

# Microsecond timestamps everywhere: MySQL's DATETIME defaults to whole seconds.
Timestamp = DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
# SQLite only auto-increments INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")
LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def fence_table(metadata: MetaData, name: str = DEFAULT_TABLE) -> Table:
    """The fence table: one row per (subject, step), e.g. (``order:42``, ``charge``)."""
    return Table(
        name,
        metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        Column("subject", String(255), nullable=False),  # business id, never the job id
        Column("step", String(128), nullable=False),
        Column("state", String(16), nullable=False),
        Column("epoch", Integer, nullable=False),  # fencing token: +1 on every takeover
        Column("owner_job_id", String(255)),
        Column("owner_token", String(255)),  # the owning attempt's lease token
        Column("lease_until", Timestamp),
        Column("params_hash", String(64), nullable=False),
        Column("request", LongText),
        Column("provider_key", String(64), nullable=False),
        Column("reference", String(255)),
        Column("result", LongText),
        Column("retention_s", Double),  # NULL: keep forever (money)
        Column("created_at", Timestamp, nullable=False),
        Column("updated_at", Timestamp, nullable=False),
        Column("calling_at", Timestamp),
        Column("completed_at", Timestamp),
        UniqueConstraint("subject", "step", name=f"uq_{name}_key"),
        Index(f"ix_{name}_state", "state", "updated_at"),  # list / in-doubt views
        Index(f"ix_{name}_prune", "completed_at"),  # prune scans completed rows by age
    )


def failed_jobs_table(metadata: MetaData, name: str = FAILED_JOBS_TABLE) -> Table:
    """Dead-letter jobs kept in SQL (reason ``in_doubt``, ``exhausted``, ``permanent`` …)."""
    return Table(
        name,
        metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        Column("job_id", String(255), nullable=False),
        Column("namespace", String(255)),  # NULL only in rows written before the column existed
        Column("queue", String(255), nullable=False),
        Column("task", String(255), nullable=False),
        Column("payload", JSON, nullable=False),
        Column("reason", String(64), nullable=False),
        Column("error", Text),
        Column("traceback", LongText),
        Column("attempts", Integer, nullable=False, default=0),
        Column("history", JSON),
        Column("died_at", Timestamp, nullable=False),
        Column("replayed_at", Timestamp),
        Index(f"ix_{name}_job", "job_id"),
        Index(f"ix_{name}_ns", "namespace", "job_id"),
        Index(f"ix_{name}_reason", "reason", "died_at"),
    )


def create_all(engine: Engine, *, table_name: str = DEFAULT_TABLE,
               failed_jobs_name: str = FAILED_JOBS_TABLE) -> MetaData:
    """Create both tables if missing (idempotent) and return their MetaData. A database that fails raises
    FenceStoreError (the driver's error its cause)."""
    md = MetaData()
    fence_table(md, table_name)
    failed_jobs_table(md, failed_jobs_name)
    with database_errors("creating the fence tables", engine):
        create_tables(md, engine)
    return md


def create_tables(metadata: MetaData, engine: Engine, *, attempts: int = 10) -> None:
    """``metadata.create_all`` that tolerates another process creating the same tables at the same moment.

    The existence check and the CREATE are separate statements: a process that loses the race gets
    "already exists" (or, on SQLite, "database is locked"); checking again then finds the tables.
    """
    for attempt in range(attempts):
        try:
            metadata.create_all(engine)
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.02 * (attempt + 1))


def ddl(dialect: str, *, table_name: str = DEFAULT_TABLE, failed_jobs_name: str = FAILED_JOBS_TABLE) -> str:
    """CREATE TABLE / CREATE INDEX text for ``postgresql``, ``mysql``, ``mariadb`` or ``sqlite``."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import NoSuchModuleError

    try:  # the URL's lookup: registry.load("mariadb") returns an instance on SQLAlchemy 2.1, a class before
        dia = make_url(f"{dialect}://").get_dialect()()
    except NoSuchModuleError as exc:
        raise ValueError(f"ddl: unknown dialect {dialect!r}; use postgresql, mysql, mariadb or sqlite") from exc
    md = MetaData()
    out: list[str] = []
    for table in (fence_table(md, table_name), failed_jobs_table(md, failed_jobs_name)):
        out.append(str(CreateTable(table).compile(dialect=dia)).strip() + ";")
        indexes = sorted(table.indexes, key=lambda ix: str(ix.name))
        out.extend(str(CreateIndex(ix).compile(dialect=dia)).strip() + ";" for ix in indexes)
    return "\n\n".join(out) + "\n"


# --- a fence database that cannot be used, in one line ----------------------------------------

# The words PostgreSQL (psycopg), MySQL/MariaDB and SQLite use for a table that is not there.
_NO_TABLE = ("no such table", "does not exist", "doesn't exist", "undefinedtable")


def safe_url(url: str) -> str:
    """``url`` without its password (``***``), as every message about a fence database names it."""
    from sqlalchemy.engine import make_url

    try:
        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:  # not a URL SQLAlchemy can parse: print no part that could hold a password
        return url.partition("://")[0] + "://…" if "@" in url else url


def missing_tables(exc: BaseException, table: str, url: str) -> FenceTablesMissing | None:
    """The one-line error when ``exc`` says ``table`` is not in the database at ``url``; else None."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    if table.lower() not in text or not any(m in text for m in _NO_TABLE):
        return None
    return tables_missing(table, url)


def tables_missing(table: str, url: str) -> FenceTablesMissing:
    """The one line for ``table`` not in the database at ``url``: the command that creates it."""
    dialect = {"postgres": "postgresql"}.get(d := url.partition(":")[0].partition("+")[0], d)
    return FenceTablesMissing(f"no fence table {table} in {safe_url(url)}: create the tables with `ringfence "
                              f"fence init` (or put `ringfence fence ddl --dialect {dialect}` in a migration)")


def unusable_database(exc: BaseException, url: str) -> tuple[str, bool] | None:
    """The one line for ``exc`` (or an error in its cause chain) that means the fence database at ``url`` cannot
    be used, and whether it is unreachable (True) rather than misconfigured; None for any other error."""
    seen: BaseException | None = exc
    while seen is not None:
        line = _unusable(seen, safe_url(url))
        if line is not None:
            return line
        seen = seen.__cause__ or seen.__context__
    return None


def _from_sqlalchemy(exc: BaseException) -> bool:
    """Raised while SQLAlchemy loaded a dialect's driver (not by some other import)."""
    return any("sqlalchemy" in f.filename for f in traceback.extract_tb(exc.__traceback__))


def _unusable(exc: BaseException, where: str) -> tuple[str, bool] | None:
    if isinstance(exc, FenceTablesMissing):
        return str(exc), False
    if isinstance(exc, NoSuchModuleError | ArgumentError):
        return f"bad fence database URL {where}: {exc}", False
    if isinstance(exc, ImportError) and _from_sqlalchemy(exc):
        return f"fence database {where}: its driver is not installed ({exc})", False
    orig = getattr(exc, "orig", None) or exc
    if isinstance(exc, SAOperationalError) or type(orig).__name__ in ("OperationalError", "InterfaceError"):
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        return f"cannot connect to the fence database at {where}: {first}", True
    return None


# --- the database clock -------------------------------------------------------------------


class db_now(FunctionElement[Any]):
    """The database's current time, microsecond precision."""

    type = Timestamp
    inherit_cache = True


class db_now_plus(FunctionElement[Any]):
    """The database's current time plus ``seconds`` (a float or a numeric column; may be negative)."""

    type = Timestamp
    inherit_cache = True

    def __init__(self, seconds: float | ColumnElement[Any]) -> None:
        # A column works too: ``completed_at < db_now_plus(-table.c.retention_s)`` prunes in SQL.
        arg = seconds if isinstance(seconds, ColumnElement) else bindparam(None, float(seconds), type_=Double)
        super().__init__(arg)


@compiles(db_now)
def _now_default(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(db_now, "postgresql")
def _now_pg(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "now()"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _now_my(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "NOW(6)"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # Same text format SQLAlchemy stores for SQLite datetimes, so comparisons are consistent.
    return "strftime('%Y-%m-%d %H:%M:%f000', 'now')"


def _arg(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(db_now_plus, "postgresql")
def _plus_pg(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(now() + make_interval(secs => CAST({_arg(element, compiler, **kw)} AS double precision)))"


@compiles(db_now_plus, "mysql")
@compiles(db_now_plus, "mariadb")
def _plus_my(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(NOW(6) + INTERVAL CAST({_arg(element, compiler, **kw)} * 1000000 AS SIGNED) MICROSECOND)"


@compiles(db_now_plus, "sqlite")
def _plus_sqlite(element: db_now_plus, compiler: SQLCompiler, **kw: Any) -> str:
    return (f"strftime('%Y-%m-%d %H:%M:%f000', 'now', "
            f"printf('%+.6f seconds', {_arg(element, compiler, **kw)}))")
