"""The worker's heartbeat: its entry in the server registry, and the leases of its running jobs."""

from __future__ import annotations

import os
import socket
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ringfence.worker.loop import Loop

if TYPE_CHECKING:
    from ringfence.worker.worker import Worker


class Heartbeat(Loop):
    name = "heartbeat"

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.settings.heartbeat_s)
        self.worker = worker
        self.started = time.time()

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
            "heartbeat": time.time(),
            "running": sorted(w.processor.running),
            "processed": w.processor.processed,
            "failed": w.processor.failed,
            "tasks": sorted(w.app.registry.tasks),
            "shutdown_timeout_s": w.settings.shutdown_timeout_s,
            "duration_p95_s": w.processor.metrics.duration_p95(),
        }

    async def tick(self) -> None:
        await self.extend_leases()
        await self.worker.broker.heartbeat_server(self.worker.server_id, self.info(), self.worker.settings.server_ttl_s)

    async def extend_leases(self) -> None:
        w = self.worker
        broker, settings = w.broker, w.settings
        now = broker.clock()
        by_queue: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
        for r in list(w.processor.running.values()):
            if r.settled or r.lost:
                continue
            job = r.job
            # Never beyond max_lease_s after the start: a hung job loses its lease in the end.
            cap = job.started_ms + int(settings.max_lease_s * 1000)
            by_queue[job.queue].append((job.id, job.token, min(now + int(settings.lease_s * 1000), cap)))
        for queue, leases in by_queue.items():
            lost = await broker.arun(broker.extend(queue, leases))
            if lost:
                w.processor.lease_lost(lost)
        slots = w.processor.gates.slots()
        if slots:
            until = now + int(settings.lease_s * 1000)
            await broker.extend_slots([(kind, name, holder, until) for kind, name, holder in slots])
