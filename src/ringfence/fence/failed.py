"""Durable dead-letter: every dead job also lands in ``ringfence_failed_jobs`` of the application's database,
so ``ringfence dead replay`` works after Redis lost its data (no persistence, a flush, a failover)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, MetaData, insert, select, update

from ..models import DeadJob
from .dbretry import DEFAULT_RETRY, DbRetry, make_engine, retrying, watch_disconnects
from .schema import FAILED_JOBS_TABLE, create_tables, db_now, failed_jobs_table


class FailedJobs:
    def __init__(self, engine_or_url: Engine | str, *, table_name: str = FAILED_JOBS_TABLE,
                 retry: DbRetry = DEFAULT_RETRY) -> None:
        self.engine = watch_disconnects(make_engine(engine_or_url) if isinstance(engine_or_url, str)
                                        else engine_or_url)
        self.retry = retry
        self.metadata = MetaData()
        self.table = failed_jobs_table(self.metadata, table_name)

    def create_all(self) -> None:
        create_tables(self.metadata, self.engine)

    def record(self, job: DeadJob, spec: dict[str, Any]) -> None:
        """Insert the dead job, riding out a dead connection (a lost COMMIT answer may leave two rows for
        one death; ``unreplayed`` reads one per job id)."""
        stmt = insert(self.table).values(
            job_id=job.id, queue=job.queue, task=job.task, payload=spec, reason=job.reason,
            error=job.error, traceback=job.traceback, attempts=job.attempts, history=job.history,
            died_at=db_now())

        def attempt(_retried: bool) -> None:
            with self.engine.begin() as conn:
                conn.execute(stmt)

        retrying(self.retry, attempt, f"failed_jobs write of job {job.id}")

    def unreplayed(self, job_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """Rows not replayed yet, newest first; one per job id (its latest death)."""
        t = self.table
        q = select(t).where(t.c.replayed_at.is_(None)).order_by(t.c.died_at.desc(), t.c.id.desc())
        if job_ids is not None:
            q = q.where(t.c.job_id.in_(job_ids))
        seen: set[str] = set()
        out = []
        with self.engine.connect() as conn:
            for m in conn.execute(q).mappings():
                if m["job_id"] not in seen:
                    seen.add(m["job_id"])
                    out.append(dict(m))
        return out

    def mark_replayed(self, job_ids: list[str]) -> None:
        if job_ids:
            t = self.table
            with self.engine.begin() as conn:
                conn.execute(update(t).where(t.c.job_id.in_(job_ids), t.c.replayed_at.is_(None))
                             .values(replayed_at=db_now()))


def as_dead_job(row: dict[str, Any]) -> DeadJob:
    died = row["died_at"]
    died_ms = int(died.replace(tzinfo=died.tzinfo or UTC).timestamp() * 1000) if isinstance(died, datetime) else 0
    spec = row["payload"] or {}
    return DeadJob(id=row["job_id"], queue=row["queue"], task=row["task"], args=spec.get("a", {}),
                   reason=row["reason"], error=row["error"] or "", traceback=row["traceback"] or "",
                   attempts=row["attempts"], died_ms=died_ms, history=row["history"] or [])
