"""The outbox table: jobs written in the application's own transaction, sent to Redis by the relay.

One row per job. ``job_id`` is chosen when the row is written and becomes the job's id in Redis, so a
relay that dies between sending and deleting the row sends it again and Redis refuses the second copy.
The relay deletes a row once it is in Redis; a row it cannot send as it is (or whose replicas did not confirm
it) is parked instead: ``parked_at`` and ``parked_reason`` set, never sent again unless retried.

Create it with :func:`create_outbox` (``ringfence outbox init``), or paste :func:`outbox_ddl`
(``ringfence outbox ddl --dialect postgresql``) into a migration.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Engine, Index, Integer, MetaData, String, Table, inspect
from sqlalchemy.schema import CreateIndex, CreateTable

from ringfence.fence.schema import BigId, LongText, Timestamp, create_tables

OUTBOX_TABLE = "ringfence_outbox"

# Column names are part of the contract: contrib.django's migration creates this same table.
COLUMNS = ("id", "namespace", "job_id", "queue", "task", "spec", "run_at_ms", "unique_key", "unique_until_ms",
           "min_replicas", "created_at", "parked_at", "parked_reason")
#: Columns added after the table's first form: ``create_outbox`` adds them to an existing table.
LATER_COLUMNS = ("parked_at", "parked_reason")


def outbox_table(metadata: MetaData, name: str = OUTBOX_TABLE) -> Table:
    """The outbox: ``id`` orders the rows (the relay sends them in id order per queue)."""
    return Table(
        name,
        metadata,
        Column("id", BigId, primary_key=True, autoincrement=True),
        Column("namespace", String(255), nullable=False),  # the App's namespace: one table serves several apps
        Column("job_id", String(255), nullable=False),      # the job's id in Redis (chosen at write time)
        Column("queue", String(255), nullable=False),
        Column("task", String(255), nullable=False),
        Column("spec", LongText, nullable=False),           # the encoded job (task, args, version, limits)
        Column("run_at_ms", BigInteger),                    # epoch ms to run at; NULL: now
        Column("unique_key", String(255)),                  # NULL: no uniqueness
        Column("unique_until_ms", BigInteger),              # epoch ms when the unique hold ends
        Column("min_replicas", Integer),                    # replicas that must confirm the send; NULL: 0
        Column("created_at", Timestamp, nullable=False),    # the database's clock (relay lag)
        Column("parked_at", Timestamp),                     # NULL: waiting; else the relay parked the row
        Column("parked_reason", LongText),                  # why (a bad job id, no replica confirmed it ...)
        Index(f"ix_{name}_ns", "namespace", "id"),
    )


def create_outbox(engine: Engine, *, table_name: str = OUTBOX_TABLE) -> Table:
    """Create the outbox table if missing, add the columns an older table lacks (idempotent); return it."""
    md = MetaData()
    table = outbox_table(md, table_name)
    create_tables(md, engine)
    for name in missing_columns(engine, table_name):
        kind = table.c[name].type.compile(dialect=engine.dialect)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {table_name} ADD COLUMN {name} {kind}")
        except Exception:
            if name in missing_columns(engine, table_name):  # else another process added it meanwhile
                raise
    return table


def later_column_types(dialect: str) -> list[tuple[str, str]]:
    """(name, SQL type) of each later column for ``dialect``: what ``ALTER TABLE ... ADD COLUMN`` takes."""
    from sqlalchemy.engine import make_url

    dia = make_url(f"{dialect}://").get_dialect()()
    table = outbox_table(MetaData())
    return [(name, table.c[name].type.compile(dialect=dia)) for name in LATER_COLUMNS]


def missing_columns(engine: Engine, table_name: str = OUTBOX_TABLE) -> list[str]:
    """The relay's columns an existing outbox table lacks (made before they were added)."""
    have = {c["name"] for c in inspect(engine).get_columns(table_name)}
    return [name for name in LATER_COLUMNS if name not in have]


def outbox_ddl(dialect: str, *, table_name: str = OUTBOX_TABLE) -> str:
    """CREATE TABLE / CREATE INDEX text for ``postgresql``, ``mysql``, ``mariadb`` or ``sqlite``."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import NoSuchModuleError

    try:
        dia = make_url(f"{dialect}://").get_dialect()()
    except NoSuchModuleError as exc:
        raise ValueError(f"outbox ddl: unknown dialect {dialect!r}; use postgresql, mysql, mariadb or sqlite") from exc
    table = outbox_table(MetaData(), table_name)
    out = [str(CreateTable(table).compile(dialect=dia)).strip() + ";"]
    out.extend(str(CreateIndex(ix).compile(dialect=dia)).strip() + ";"
               for ix in sorted(table.indexes, key=lambda ix: str(ix.name)))
    return "\n\n".join(out) + "\n"
