"""The durable copy of dead jobs (the failed-jobs table), kept in step with the Redis dead-letter.

The Redis dead-letter is written first, and in the same script the job's id joins the queue's ``durable``
set: "its row is owed". The worker then writes the row (an upsert: safe to repeat) and takes the id out.
A kill between the two leaves the id in the set, and :class:`DurableSweep` on any live worker writes the
row from the Redis record once it is older than the grace period (and every worker settles all it finds
when it stops). So a kill at any point loses neither.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from ringfence.fence.failed import FailedJobs
from ringfence.models import DeadJob
from ringfence.offloop import HOP
from ringfence.redis.broker import Broker
from ringfence.worker.loop import Loop
from ringfence.worker.maintenance import QueueSet

log = logging.getLogger("ringfence.worker")


class FailedJobsSource(Protocol):
    """Where the failed-jobs table comes from (opened on first use; None without a fence database)."""

    @property
    def failed_jobs(self) -> FailedJobs | None: ...


async def write_row(failed: FailedJobs, broker: Broker, dead: DeadJob, spec: dict[str, Any]) -> bool:
    """Write the failed-jobs row of a job that reached the Redis dead-letter, then clear its debt.
    On a database error the debt stays, and the sweep writes the row later."""
    try:
        await HOP.run(failed.record, dead, spec)
    except Exception as exc:
        log.error("job %s: its failed_jobs row could not be written (%s: %s); it is in the Redis dead-letter "
                  "and a worker writes the row later", dead.id, type(exc).__name__, exc)
        return False
    await broker.durable_done(dead.queue, [dead.id])
    return True


class DurableSweep(Loop):
    """Writes the failed-jobs rows that a killed or failing worker still owed, from the Redis records."""

    name = "durable-sweep"

    def __init__(self, failed: FailedJobs, broker: Broker, queues: QueueSet, interval_s: float,
                 grace_s: float) -> None:
        super().__init__(interval_s)
        self.failed = failed
        self.broker = broker
        self.queues = queues
        self.grace_ms = int(grace_s * 1000)

    async def tick(self, grace_ms: int | None = None) -> None:
        before = self.broker.clock() - (self.grace_ms if grace_ms is None else grace_ms)
        for queue in await self.queues.names():
            ids = await self.broker.durable_owed(queue, before)
            if ids:
                await self.settle(queue, ids)

    async def stop(self) -> None:
        """Stop, then settle what is owed without the grace period: the last worker to leave (a drain, a
        deploy) writes every row, and a row written twice stays one row (an upsert)."""
        await super().stop()
        try:
            await self.tick(grace_ms=0)
        except Exception as exc:
            log.warning("%s: final pass failed (%s); the next worker writes the rows", self.name, exc)

    async def settle(self, queue: str, ids: list[str]) -> None:
        records = dict(await self.broker.adead_records(queue, ids))
        gone = [i for i in ids if i not in records]  # replayed or deleted since: nothing owed
        written = 0
        for job_id, raw in records.items():
            spec = DeadJob.spec_of(raw)
            if spec is None:  # malformed: shown by `dead list`, nothing a replay could use
                gone.append(job_id)
                continue
            if await write_row(self.failed, self.broker, DeadJob.decode(queue, job_id, raw), spec):
                written += 1
        if gone:
            await self.broker.durable_done(queue, gone)
        if written:
            log.warning("queue %s: wrote %d failed_jobs row(s) a worker owed (it died or its database failed "
                        "after the Redis dead-letter)", queue, written)
