"""Background loops that keep the namespace healthy: recovery of expired leases, promotion of due jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ringfence.offloop import HOP
from ringfence.redis.broker import Broker
from ringfence.redis.call import Call
from ringfence.redis.connection import UNAVAILABLE
from ringfence.worker import workflows
from ringfence.worker.loop import Loop

log = logging.getLogger("ringfence.worker")


class QueueSet:
    """Every queue of the namespace (not only this worker's), refreshed now and then: any live worker
    recovers and promotes for all of them."""

    def __init__(self, broker: Broker, own: list[str], refresh_s: float = 10.0) -> None:
        self.broker = broker
        self.own = own
        self.refresh_s = refresh_s
        self._names: list[str] = list(own)
        self._at = 0.0

    async def names(self) -> list[str]:
        if time.monotonic() - self._at > self.refresh_s:
            try:
                raw = await self.broker.aio.smembers(self.broker.keys.queues)
            except UNAVAILABLE:  # the namespace's node down (Cluster): the names known so far are served
                self._at = time.monotonic() - self.refresh_s + 1.0
                return self._names
            self._names = sorted({*self.own, *(x.decode() if isinstance(x, bytes) else str(x) for x in raw)})
            self._at = time.monotonic()
        return self._names


async def each_queue(broker: Broker, names: list[str], call: Callable[[str], Call[Any]]) -> dict[str, Any]:
    """``call(queue)`` run for every queue; one whose node does not answer (Cluster) holds up none of the others.
    The first such error is raised after the others ran (the loop reports it and comes back soon)."""
    out: dict[str, Any] = {}
    error: BaseException | None = None
    for queue in names:
        try:
            out[queue] = await broker.arun(call(queue))
        except UNAVAILABLE as exc:
            if not broker.cluster:
                raise
            error = error or exc
    if error is not None and not out:
        raise error
    if error is not None:
        log.debug("queue skipped, its Redis node does not answer: %s", error)
    return out


class Recoverer(Loop):
    """Returns jobs whose lease expired (dead or hung worker) to the head of their queue, and finishes the
    workflow hand-overs between queues that a crash left."""

    name = "recoverer"

    def __init__(self, broker: Broker, queues: QueueSet, interval_s: float) -> None:
        super().__init__(interval_s)
        self.broker = broker
        self.queues = queues

    async def tick(self) -> None:
        names = await self.queues.names()
        for queue, ids in (await each_queue(self.broker, names, self.broker.recover)).items():
            if ids:
                log.warning("recovered %d orphaned job(s) in queue %s: %s", len(ids), queue, " ".join(ids[:10]))
        for queue in names:  # workflow steps between two queues a crash left half handed over (worker/workflows.py)
            try:
                done = await workflows.sweep(self.broker, queue)
            except UNAVAILABLE:
                if not self.broker.cluster:
                    raise
                continue  # its node does not answer: the others are swept, it is next round
            if done:
                log.warning("finished %d workflow hand-over(s) a crash left in queue %s", done, queue)


class DeadRetention(Loop):
    """Deletes dead jobs older than ``dead_retention_s`` — only when that setting is given: by default the
    dead-letter keeps everything, and its size is reported by ``ringfence info``."""

    name = "dead-retention"

    def __init__(self, broker: Broker, queues: QueueSet, retention_s: float, interval_s: float = 60.0,
                 failed_jobs: Any = None) -> None:
        super().__init__(interval_s)
        self.broker = broker
        self.queues = queues
        self.retention_ms = int(retention_s * 1000)
        self.failed_jobs = failed_jobs  # the durable copy is pruned alike, so a replay cannot bring them back

    async def tick(self) -> None:
        for queue in await self.queues.names():
            gone = await self.broker.arun(self.broker.delete_dead(queue, older_than_ms=self.retention_ms))
            if gone:
                log.info("dead-letter retention: deleted %d job(s) of queue %s older than %gs", gone, queue,
                         self.retention_ms / 1000)
        if self.failed_jobs is not None:
            rows = await HOP.run(self.failed_jobs.prune, self.retention_ms / 1000)
            if rows:
                log.info("dead-letter retention: deleted %d failed_jobs row(s)", rows)


class Promoter(Loop):
    """Moves scheduled and retry jobs whose time has come into their queue."""

    name = "promoter"

    def __init__(self, broker: Broker, queues: QueueSet, interval_s: float) -> None:
        super().__init__(interval_s)
        self.broker = broker
        self.queues = queues

    async def tick(self) -> None:
        busy = await self.queues.names()
        while busy:  # a queue with 1000 due jobs or more is promoted again at once
            moved = await each_queue(self.broker, busy, self.broker.promote)
            busy = [queue for queue, n in moved.items() if n >= 1000]


class SchedulerLoop(Loop):
    """Runs the cron scheduler inside a worker (``ringfence worker --scheduler``)."""

    name = "scheduler"

    def __init__(self, scheduler: Any, interval_s: float = 1.0) -> None:
        super().__init__(interval_s)
        self.scheduler = scheduler

    async def tick(self) -> None:
        await self.scheduler.tick()
