"""The relay's side of the outbox table: a locked batch of waiting rows, their outcome (deleted once sent, or
parked with the reason), the lag, and the parked rows.

A batch is read and deleted in one transaction that holds the rows' locks while the relay sends them to
Redis, so a second relay cannot read them until the first has committed (and then no longer finds them):
``SELECT ... FOR UPDATE`` on PostgreSQL and MariaDB (READ COMMITTED, so no gap lock blocks the
application's inserts), the database's write lock on SQLite (taken by the batch's first statement).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, MetaData, bindparam, delete, func, select, update

from ringfence.errors import ConfigError
from ringfence.fence.dbretry import make_engine
from ringfence.fence.schema import db_now
from ringfence.outbox.schema import OUTBOX_TABLE, missing_columns, outbox_table


@dataclass(frozen=True)
class Waiting:
    """One committed, unsent row."""

    id: int
    job_id: str
    queue: str
    spec: bytes
    run_at_ms: int  # 0: now
    unique_key: str  # '': none
    unique_until_ms: int
    min_replicas: int


@dataclass(frozen=True)
class Lag:
    waiting: int            # rows committed and not yet sent
    oldest_s: float         # age of the oldest of them (0 when none), by the database's clock
    parked: int = 0         # rows the relay parked (not sent, or sent without the replicas they asked for)

    def to_dict(self) -> dict[str, Any]:
        return {"waiting": self.waiting, "oldest_s": round(self.oldest_s, 3), "parked": self.parked}


def relay_engine(url: str) -> Engine:
    """The relay's own engine (its own pool: its batches never wait for the application's connections)."""
    return make_engine(url)


class Batch:
    def __init__(self, conn: Connection, table: Any, rows: list[Waiting]) -> None:
        self.conn = conn
        self.table = table
        self.rows = rows

    def finish(self, sent: list[int], parked: dict[int, str]) -> None:
        """Record each row's outcome, with the transaction's commit: sent rows go, parked rows stay with the
        reason (the relay reads them no more)."""
        t = self.table
        if sent:
            self.conn.execute(delete(t).where(t.c.id.in_(sent)))
        if parked:
            self.conn.execute(update(t).where(t.c.id == bindparam("row_id"))
                              .values(parked_at=db_now(), parked_reason=bindparam("reason")),
                              [{"row_id": i, "reason": r[:4000]} for i, r in parked.items()])


class OutboxStore:
    def __init__(self, engine: Engine, namespace: str, *, table_name: str = OUTBOX_TABLE) -> None:
        self.engine = engine
        self.namespace = namespace
        self.table = outbox_table(MetaData(), table_name)
        self._sqlite = engine.dialect.name == "sqlite"
        # MariaDB/MySQL's REPEATABLE READ would lock the gap after the batch: the application's inserts would
        # wait for the relay's commit. READ COMMITTED locks the batch's rows only.
        mysql = engine.dialect.name in ("mysql", "mariadb")
        self._batches = engine.execution_options(isolation_level="READ COMMITTED") if mysql else engine

    @contextmanager
    def batch(self, limit: int) -> Iterator[Batch]:
        """The oldest ``limit`` waiting rows of this namespace, locked; commits when the block ends."""
        t = self.table
        with self._batches.begin() as conn:
            if self._sqlite:  # a write first: takes the database's write lock for the whole batch
                conn.execute(delete(t).where(t.c.id == -1))
            query = (select(t.c.id, t.c.job_id, t.c.queue, t.c.spec, t.c.run_at_ms, t.c.unique_key,
                            t.c.unique_until_ms, t.c.min_replicas)
                     .where(t.c.namespace == self.namespace, t.c.parked_at.is_(None)).order_by(t.c.id).limit(limit))
            if not self._sqlite:
                query = query.with_for_update()
            rows = [Waiting(r.id, r.job_id, r.queue, r.spec.encode(), r.run_at_ms or 0, r.unique_key or "",
                            r.unique_until_ms or 0, r.min_replicas or 0) for r in conn.execute(query)]
            yield Batch(conn, t, rows)

    def lag(self) -> Lag:
        t = self.table
        with self.engine.connect() as conn:
            count, oldest, now = conn.execute(
                select(func.count(), func.min(t.c.created_at), db_now())
                .where(t.c.namespace == self.namespace, t.c.parked_at.is_(None))).one()
            parked = conn.execute(select(func.count()).where(
                t.c.namespace == self.namespace, t.c.parked_at.is_not(None))).scalar_one()
        return Lag(int(count), _age_s(now, oldest) if oldest is not None else 0.0, int(parked))

    def parked(self, limit: int = 100) -> list[dict[str, Any]]:
        """The parked rows, oldest first: id, job_id, queue, task, parked_at (ISO), reason."""
        t = self.table
        with self.engine.connect() as conn:
            found = conn.execute(select(t.c.id, t.c.job_id, t.c.queue, t.c.task, t.c.parked_at, t.c.parked_reason)
                                 .where(t.c.namespace == self.namespace, t.c.parked_at.is_not(None))
                                 .order_by(t.c.id).limit(limit))
            return [{"id": r.id, "job_id": r.job_id, "queue": r.queue, "task": r.task,
                     "parked_at": _dt(r.parked_at).isoformat(), "reason": r.parked_reason} for r in found]

    def retry(self, ids: list[int]) -> list[int]:
        """Put parked rows back in the queue of the relay; returns those of ``ids`` that were parked here."""
        t = self.table
        parked = (t.c.namespace == self.namespace, t.c.id.in_(ids), t.c.parked_at.is_not(None))
        with self.engine.begin() as conn:
            found = sorted(r.id for r in conn.execute(select(t.c.id).where(*parked)))
            if found:
                conn.execute(update(t).where(*parked).values(parked_at=None, parked_reason=None))
        return found

    def holding(self, job_ids: list[str]) -> set[str]:
        """Which of ``job_ids`` still have a row here (waiting or parked): the relay keeps their sent records."""
        t = self.table
        with self.engine.connect() as conn:
            found = conn.execute(select(t.c.job_id).where(t.c.namespace == self.namespace, t.c.job_id.in_(job_ids)))
            return {r.job_id for r in found}

    def exists(self) -> bool:
        from sqlalchemy import inspect

        return inspect(self.engine).has_table(self.table.name)

    def check(self) -> None:
        """A table made before the relay's later columns names them and the command that adds them."""
        missing = missing_columns(self.engine, self.table.name)
        if missing:
            raise ConfigError(f"the {self.table.name} table has no {', '.join(missing)} column(s); add them with "
                              "`ringfence outbox init --app APP` (Django: `manage.py migrate ringfence`)")


def _age_s(now: Any, then: Any) -> float:
    return max(0.0, float((_dt(now) - _dt(then)).total_seconds()))


def _dt(value: Any) -> datetime:
    if isinstance(value, str):  # SQLite returns db_now() as text
        value = datetime.fromisoformat(value[:26])
    found: datetime = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return found
