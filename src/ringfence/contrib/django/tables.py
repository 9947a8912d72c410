"""Create and drop ringfence's tables from a Django migration, with ringfence's own DDL (one source of truth:
``ringfence.fence.schema``), so Django-made and ``ringfence fence init``-made tables are identical."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_OWNER = re.compile(r"^CREATE (?:TABLE|INDEX \S+ ON) (\S+)", re.IGNORECASE)


def dialect(connection: Any) -> str:
    """The ringfence DDL dialect of a Django connection."""
    if connection.vendor == "mysql":
        return "mariadb" if getattr(connection, "mysql_is_mariadb", False) else "mysql"
    return str(connection.vendor)  # "postgresql", "sqlite"


def statements(ddl: str) -> list[tuple[str, str]]:
    """(table, statement) pairs of a DDL text made of ``;``-terminated statements separated by blank lines."""
    out = []
    for raw in ddl.split(";\n\n"):
        stmt = raw.strip().rstrip(";").strip()
        if stmt:
            found = _OWNER.match(stmt)
            if found is None:
                raise ValueError(f"unexpected DDL statement: {stmt[:80]}")
            out.append((found.group(1).strip('"`'), stmt))
    return out


def creator(make_ddl: Callable[[str], str]) -> Callable[[Any, Any], None]:
    """A RunPython function creating the tables of ``make_ddl(dialect)``; a table that already exists (made by
    ``ringfence fence init`` before Django managed it) is left as it is, with its indexes."""

    def create(apps: Any, schema_editor: Any) -> None:
        conn = schema_editor.connection
        with conn.cursor() as cursor:
            existing = set(conn.introspection.table_names(cursor))
        for table, stmt in statements(make_ddl(dialect(conn))):
            if table not in existing:
                schema_editor.execute(stmt, params=None)

    return create


def dropper(*tables: str) -> Callable[[Any, Any], None]:
    def drop(apps: Any, schema_editor: Any) -> None:
        for table in tables:
            schema_editor.execute(f"DROP TABLE {schema_editor.quote_name(table)}", params=None)

    return drop
