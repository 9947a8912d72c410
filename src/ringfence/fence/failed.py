"""Durable dead-letter: every dead job also lands in ``ringfence_failed_jobs`` of the application's database,
so ``ringfence dead replay`` works after Redis lost its data (no persistence, a flush, a failover). A database that
fails raises FenceStoreError (the driver's error its cause)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, MetaData, insert, select, text, update
from sqlalchemy import delete as sa_delete
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateIndex

from ..models import DeadJob
from .dbretry import DEFAULT_RETRY, DbRetry, database_errors, make_engine, retrying, watch_disconnects
from .schema import FAILED_JOBS_TABLE, create_tables, db_now, db_now_plus, failed_jobs_table, tables_missing


class FailedJobs:
    """The failed-jobs rows of one namespace. Every statement filters by namespace: two namespaces sharing
    a database never see, replay or delete each other's jobs."""

    def __init__(self, engine_or_url: Engine | str, *, namespace: str = "ringfence",
                 table_name: str = FAILED_JOBS_TABLE, retry: DbRetry = DEFAULT_RETRY) -> None:
        self.engine = watch_disconnects(make_engine(engine_or_url) if isinstance(engine_or_url, str)
                                        else engine_or_url)
        self.namespace = namespace
        self.retry = retry
        self.metadata = MetaData()
        self.table = failed_jobs_table(self.metadata, table_name)
        self._upgraded = False
        self._lock = threading.Lock()

    def create_all(self) -> None:
        """Create the failed-jobs table and its indexes if missing."""
        with database_errors("creating the failed_jobs table", self.engine):
            create_tables(self.metadata, self.engine)
        self._upgraded = False

    def upgrade(self, assign_unowned: bool = False) -> tuple[bool, int]:
        """Bring a table created before namespaces up to date: add the ``namespace`` column and its index
        (run at first use; safe to race). With ``assign_unowned`` (``ringfence fence init``), rows written
        before the upgrade are given this namespace. Returns (column added, rows assigned)."""
        with database_errors("upgrading the failed_jobs table", self.engine):
            return self._upgrade(assign_unowned)

    def _upgrade(self, assign_unowned: bool) -> tuple[bool, int]:
        t = self.table
        added = False
        with self._lock:
            columns = {c["name"] for c in sa_inspect(self.engine).get_columns(t.name)} if self._exists() else None
            if columns is not None and "namespace" not in columns:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(text(f"ALTER TABLE {t.name} ADD COLUMN namespace VARCHAR(255)"))
                    added = True
                except DBAPIError:  # another process added it first
                    if "namespace" not in {c["name"] for c in sa_inspect(self.engine).get_columns(t.name)}:
                        raise
                if added:
                    with self.engine.begin() as conn:
                        conn.execute(CreateIndex(next(ix for ix in t.indexes if ix.name == f"ix_{t.name}_ns")))
            self._upgraded = columns is not None  # a missing table is looked for again next time
        assigned = 0
        if assign_unowned and columns is not None:
            with self.engine.begin() as conn:
                assigned = conn.execute(update(t).where(t.c.namespace.is_(None))
                                        .values(namespace=self.namespace)).rowcount
        return added, assigned

    def _exists(self) -> bool:
        return sa_inspect(self.engine).has_table(self.table.name)

    def _ready(self) -> bool:
        """Upgrade once; False while the table does not exist (``ringfence fence init`` creates it)."""
        if not self._upgraded:
            self.upgrade()
        return self._upgraded

    def _mine(self) -> Any:
        return self.table.c.namespace == self.namespace

    def record(self, job: DeadJob, spec: dict[str, Any]) -> None:
        """Write the dead job's row: an upsert of its one row not replayed yet, so a repeat (a retry after a
        lost COMMIT answer, the sweep after a kill) changes nothing. Without the table: FenceTablesMissing."""
        if not self._ready():
            raise tables_missing(self.table.name, self.engine.url.render_as_string(hide_password=True))
        t = self.table
        values = dict(queue=job.queue, task=job.task, payload=spec, reason=job.reason, error=job.error,
                      traceback=job.traceback, attempts=job.attempts, history=job.history)

        def attempt(_retried: bool) -> None:
            with self.engine.begin() as conn:
                found = conn.execute(update(t).where(self._mine(), t.c.job_id == job.id, t.c.replayed_at.is_(None))
                                     .values(**values)).rowcount
                if not found:
                    conn.execute(insert(t).values(job_id=job.id, namespace=self.namespace, died_at=db_now(),
                                                  **values))

        with database_errors(f"the failed_jobs row of job {job.id}", self.engine):
            retrying(self.retry, attempt, f"failed_jobs write of job {job.id}")

    def unreplayed(self, job_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """Rows not replayed yet, newest first; one per job id (its latest death). None without the table."""
        if not self._ready():
            return []
        t = self.table
        q = select(t).where(self._mine(), t.c.replayed_at.is_(None)).order_by(t.c.died_at.desc(), t.c.id.desc())
        if job_ids is not None:
            q = q.where(t.c.job_id.in_(job_ids))

        def attempt(_retried: bool) -> list[dict[str, Any]]:
            with self.engine.connect() as conn:
                rows = [dict(m) for m in conn.execute(q).mappings()]
            return rows

        seen: set[str] = set()
        out = []
        with database_errors("reading failed_jobs", self.engine):
            found = retrying(self.retry, attempt, "failed_jobs read")
        for m in found:
            if m["job_id"] not in seen:
                seen.add(m["job_id"])
                out.append(m)
        return out

    def mark_replayed(self, job_ids: list[str]) -> None:
        if job_ids and self._ready():
            t = self.table
            stmt = (update(t).where(self._mine(), t.c.job_id.in_(job_ids), t.c.replayed_at.is_(None))
                    .values(replayed_at=db_now()))

            def attempt(_retried: bool) -> None:
                with self.engine.begin() as conn:  # repeating it is harmless: only unmarked rows match
                    conn.execute(stmt)

            with database_errors("marking failed_jobs rows replayed", self.engine):
                retrying(self.retry, attempt, "failed_jobs replay mark")

    def delete(self, job_ids: list[str]) -> int:
        """Delete every row of these jobs (``ringfence dead delete``)."""
        if not job_ids or not self._ready():
            return 0
        t = self.table
        with database_errors("deleting failed_jobs rows", self.engine), self.engine.begin() as conn:
            return int(conn.execute(sa_delete(t).where(self._mine(), t.c.job_id.in_(job_ids))).rowcount)

    def prune(self, older_than_s: float) -> int:
        """Delete rows of jobs that died more than ``older_than_s`` ago (``ringfence dead prune``)."""
        if not self._ready():
            return 0
        t = self.table
        with database_errors("pruning failed_jobs", self.engine), self.engine.begin() as conn:
            return int(conn.execute(sa_delete(t).where(self._mine(), t.c.died_at < db_now_plus(-older_than_s)))
                       .rowcount)


def as_dead_job(row: dict[str, Any]) -> DeadJob:
    died = row["died_at"]
    died_ms = int(died.replace(tzinfo=died.tzinfo or UTC).timestamp() * 1000) if isinstance(died, datetime) else 0
    spec = row["payload"] or {}
    return DeadJob(id=row["job_id"], queue=row["queue"], task=row["task"], args=spec.get("a", {}),
                   reason=row["reason"], error=row["error"] or "", traceback=row["traceback"] or "",
                   attempts=row["attempts"], died_ms=died_ms, history=row["history"] or [], source="sql")
