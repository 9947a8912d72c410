"""A database of the test's own on the shared PostgreSQL or MariaDB server (or a SQLite file), with no tables:
what ``fence_url`` names before ``ringfence fence init`` ran. Dropped afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, make_url, text

from support import SERVERS, database_answering


@contextmanager
def empty_database(name: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh, empty database on server ``name`` ("postgresql", "mariadb" or "sqlite")."""
    if name == "sqlite":
        yield f"sqlite:///{tmp_path}/empty.db"
        return
    server = make_url(database_answering(name, SERVERS[name]))
    db = f"rf_empty_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {db}"))
    try:
        yield server.set(database=db).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            if name == "postgresql":
                c.execute(text(f"DROP DATABASE {db} WITH (FORCE)"))
            else:
                c.execute(text(f"DROP DATABASE {db}"))
        admin.dispose()
