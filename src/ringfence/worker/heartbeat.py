"""The worker's heartbeat: the leases of its running jobs, its clock offset to Redis, its server registry entry.

Renewing leases never depends on the registry: they are separate calls, and a failing registry write is
logged once (and once when it works again) while leases go on being renewed."""

from __future__ import annotations

import logging
import os
import socket
from collections import defaultdict
from importlib import metadata
from typing import TYPE_CHECKING, Any

from ringfence.redis.connection import REFUSED, UNAVAILABLE
from ringfence.worker.loop import Loop

if TYPE_CHECKING:
    from ringfence.worker.worker import Worker

log = logging.getLogger("ringfence.worker")


def _version() -> str:
    try:
        return metadata.version("ringfence")
    except metadata.PackageNotFoundError:
        return "unknown"


VERSION = _version()

LATENCY_EVERY_MS = 10_000  # how often a worker samples its queues' latency for the dashboard's charts


class Heartbeat(Loop):
    name = "heartbeat"

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.settings.heartbeat_s)
        self.worker = worker
        self.started = worker.broker.clock() / 1000  # Redis clock, like every time other processes compare
        self.registry_failing = False
        self.latency_sampled_ms = 0

    def info(self) -> dict[str, Any]:
        w = self.worker
        return {
            "id": w.server_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": dict(w.queues),
            "strict": w.strict,
            "concurrency": w.concurrency,
            "namespace": w.app.namespace,
            "environment": w.app.environment,
            "started": self.started,
            "heartbeat": w.broker.clock() / 1000,
            "clock_skew_s": round(w.broker.server_clock.skew_ms / 1000, 3),
            "running": sorted(w.processor.running),
            "processed": w.processor.processed,
            "failed": w.processor.failed,
            "tasks": sorted(w.app.registry.tasks),
            "shutdown_timeout_s": w.settings.shutdown_timeout_s,
            "duration_p95_s": w.processor.metrics.duration_p95(),
            "version": VERSION,
        }

    async def tick(self) -> None:
        try:
            await self.extend_leases()
        except UNAVAILABLE as exc:
            # Once more at once, on a fresh connection: a hung socket must not cost the leases a whole beat.
            self.worker.broker.health.lost(exc)
            await self.extend_leases()
        await self.worker.broker.aping()  # re-measures the offset to the Redis clock
        await self.register()
        await self.sample_latency()

    async def sample_latency(self) -> None:
        """Age of each served queue's oldest pending job, kept per minute for the dashboard (a cost per worker
        and queue every LATENCY_EVERY_MS, none per job). A failure only costs a point of a chart."""
        w = self.worker
        now = w.broker.clock()
        if now - self.latency_sampled_ms < LATENCY_EVERY_MS:
            return
        self.latency_sampled_ms = now
        try:
            for queue, _ in w.queues:
                oldest = await w.broker.oldest_enqueued_ms(queue)
                await w.broker.arun(w.broker.latency_sample(queue, int(now - oldest) if oldest else 0))
        except REFUSED as exc:
            log.debug("latency sample skipped: %s", exc)

    async def register(self) -> None:
        w = self.worker
        try:
            await w.broker.heartbeat_server(w.server_id, self.info(), w.settings.server_ttl_s)
        except REFUSED as exc:
            if not self.registry_failing:
                log.warning("server registry write failed (%s); leases are still renewed; retrying every %gs",
                            exc, self.interval_s)
            self.registry_failing = True
            return
        if self.registry_failing:
            log.warning("server registry write works again")
            self.registry_failing = False

    async def extend_leases(self) -> None:
        w = self.worker
        broker, settings = w.broker, w.settings
        now = broker.clock()
        by_queue: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
        for r in list(w.processor.running.values()):
            if (r.settled and not r.sweeping) or r.lost:
                continue
            job = r.job
            # Never beyond max_lease_s after the start: a hung job loses its lease in the end.
            cap = job.started_ms + int(settings.max_lease_s * 1000)
            by_queue[job.queue].append((job.id, job.token, min(now + int(settings.lease_s * 1000), cap)))
        for queue, leases in by_queue.items():
            lost = await broker.arun(broker.extend(queue, leases))
            if lost:
                w.processor.lease_lost(lost)
        until = now + int(settings.lease_s * 1000)
        by_limit: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        for kind, name, holder in w.processor.gates.slots():
            by_limit[(kind, name)].append((holder, until))
        for (kind, name), holders in by_limit.items():
            await broker.arun(broker.extend_slots(kind, name, holders))
