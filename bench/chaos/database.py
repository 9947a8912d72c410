"""The chaos run's own database: created for the run, its connections terminated on purpose, dropped at the end.

PostgreSQL and MariaDB get a dedicated database ``chaos_<suffix>`` (nothing the run did not create is
touched: terminations are filtered by that database, and by application name on PostgreSQL); SQLite a
file in the run's directory (no connections to terminate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sqlalchemy import Engine, create_engine, event, text

ADMIN_URLS = {
    "postgresql": "postgresql+psycopg://root@127.0.0.1:5432/test",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}


@dataclass
class ChaosDatabase:
    kind: str  # sqlite | postgresql | mariadb
    suffix: str
    root: str
    created: bool = False
    _admin: Engine | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"chaos_{self.suffix}"

    @property
    def app_name(self) -> str:
        return f"ringfence-chaos-{self.suffix}"

    @property
    def url(self) -> str:
        """What workers and the driver connect with."""
        if self.kind == "sqlite":
            return f"sqlite:///{os.path.join(self.root, 'app.db')}"
        if self.kind == "postgresql":
            return f"postgresql+psycopg://root@127.0.0.1:5432/{self.name}?application_name={self.app_name}"
        return f"mysql+pymysql://root@127.0.0.1:3306/{self.name}"

    def admin(self) -> Engine:
        if self._admin is None:
            self._admin = create_engine(ADMIN_URLS[self.kind], isolation_level="AUTOCOMMIT", pool_pre_ping=True)
        return self._admin

    def create(self) -> None:
        if self.kind != "sqlite":
            with self.admin().connect() as c:
                c.execute(text(f"CREATE DATABASE {self.name}"))
        self.created = True

    def engine(self) -> Engine:
        """An engine on the run's database (SQLite: WAL and a busy timeout, several processes write it)."""
        eng = create_engine(self.url, pool_pre_ping=True)
        if self.kind == "sqlite":
            event.listen(eng, "connect", _wal)
        return eng

    def terminate(self) -> int:
        """Terminate every connection of the run's workers; returns how many."""
        if self.kind == "sqlite":
            return 0
        with self.admin().connect() as c:
            if self.kind == "postgresql":
                rows = c.execute(text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :db AND application_name = :app AND pid <> pg_backend_pid()"),
                    {"db": self.name, "app": self.app_name}).fetchall()
                return sum(1 for r in rows if r[0])
            ids = [r[0] for r in c.execute(text(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = :db AND ID <> CONNECTION_ID()"),
                {"db": self.name})]
            killed = 0
            for conn_id in ids:
                try:
                    c.execute(text(f"KILL {int(conn_id)}"))
                    killed += 1
                except Exception:  # gone meanwhile
                    pass
            return killed

    def drop(self) -> None:
        if not self.created:
            return
        if self.kind == "postgresql":
            with self.admin().connect() as c:
                c.execute(text(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)"))
        elif self.kind == "mariadb":
            self.terminate()
            with self.admin().connect() as c:
                c.execute(text(f"DROP DATABASE IF EXISTS {self.name}"))
        self.created = False
        if self._admin is not None:
            self._admin.dispose()


def _wal(dbapi_conn: object, _record: object) -> None:
    dbapi_conn.execute("PRAGMA journal_mode=WAL")  # type: ignore[attr-defined]
    dbapi_conn.execute("PRAGMA busy_timeout=10000")  # type: ignore[attr-defined]
