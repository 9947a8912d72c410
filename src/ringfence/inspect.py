"""Read-only views of a namespace, shared by the CLI, the doctor, metrics and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ringfence.models import DeadJob, JobSpec
from ringfence.redis.broker import Broker


def queue_info(broker: Broker, queue: str) -> dict[str, Any]:
    c = broker.queue_counts(queue)
    latency = 0.0
    if c["oldest_pending_spec"]:
        latency = max(0.0, (broker.clock() - JobSpec.decode(c["oldest_pending_spec"]).enqueued_ms) / 1000)
    stats = c["stats"]
    return {
        "queue": queue,
        "pending": c["pending"],
        "active": c["active"],
        "scheduled": c["scheduled"],
        "retry": c["retry"],
        "dead": c["dead"],
        "processed": stats.get("processed", 0),
        "failed": stats.get("failed", 0),
        "orphaned": stats.get("orphaned", 0),
        "latency_s": round(latency, 3),
        "paused": c["paused"],
        **versions_in_flight(broker, queue),
    }


def versions_in_flight(broker: Broker, queue: str) -> dict[str, Any]:
    """``task@version`` counts of the jobs in the queue (exact up to 1,000 jobs, else from a random sample)."""
    specs, exact = broker.spec_sample(queue)
    counts: dict[str, int] = {}
    for raw in specs:
        spec = JobSpec.decode(raw)
        tag = f"{spec.task}@v{spec.version}"
        counts[tag] = counts.get(tag, 0) + 1
    return {"versions": dict(sorted(counts.items())), "versions_exact": exact}


def info(broker: Broker) -> list[dict[str, Any]]:
    return [queue_info(broker, q) for q in broker.queues()]


def breakers(broker: Broker) -> list[dict[str, Any]]:
    """State of every dependency's circuit breaker, with its latest transitions."""
    return [broker.breaker_state(dep) for dep in broker.dependencies()]


def servers(broker: Broker) -> list[dict[str, Any]]:
    return sorted(broker.servers(), key=lambda s: (s.get("host", ""), s.get("pid", 0)))


def dead_job(queue: str, job_id: str, record: dict[str, Any]) -> DeadJob:
    spec = JobSpec.decode(record["spec"])
    return DeadJob(
        id=job_id, queue=queue, task=record.get("task", spec.task), args=spec.args,
        reason=record.get("reason", ""), error=record.get("error", ""), traceback=record.get("traceback", ""),
        attempts=int(record.get("attempts", 0)), died_ms=int(record.get("died_ms", 0)),
        history=orjson.loads(record["history"]) if record.get("history") else [],
    )


@dataclass(frozen=True)
class DeadFilter:
    queue: str | None = None
    task: str | None = None
    error: str | None = None
    reason: str | None = None

    def matches(self, job: DeadJob) -> bool:
        return (
            (self.task is None or job.task == self.task)
            and (self.reason is None or job.reason == self.reason)
            and (self.error is None or self.error.lower() in job.error.lower())
        )


def dead_jobs(broker: Broker, flt: DeadFilter, limit: int | None = None) -> list[DeadJob]:
    """Newest first. Scans in pages so a large dead-letter does not load at once."""
    out: list[DeadJob] = []
    for queue in [flt.queue] if flt.queue else broker.queues():
        offset = 0
        while True:
            ids = broker.dead_ids(queue, offset, 500)
            if not ids:
                break
            offset += len(ids)
            for job_id, record in broker.dead_records(queue, ids):
                job = dead_job(queue, job_id, record)
                if flt.matches(job):
                    out.append(job)
                    if limit is not None and len(out) >= limit:
                        return out
    return out


def find_dead(broker: Broker, job_id: str) -> DeadJob | None:
    for queue in broker.queues():
        for _, record in broker.dead_records(queue, [job_id]):
            return dead_job(queue, job_id, record)
    return None
