"""Where the broker and the fence meet: each attempt owns its fences under its lease token, and
"is the owner alive" is answered by the owner's lease in Redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ringfence.app import App
from ringfence.fence import Fences, Owner
from ringfence.models import DeadJob
from ringfence.redis.broker import Broker
from ringfence.settings import WorkerSettings
from ringfence.tasks import JobContext

log = logging.getLogger("ringfence.worker")


class Fencing:
    def __init__(self, app: App, broker: Broker, settings: WorkerSettings,
                 observe: Callable[[str, str], None] | None = None) -> None:
        self.app = app
        self.broker = broker
        self.settings = settings
        self.observe = observe  # fence outcomes, for metrics

    def owner(self, ctx: JobContext) -> Owner:
        # The fence's own lease is the fallback when the broker cannot answer: it covers the job's timeout.
        return Owner(ctx.id, ctx.token, lease_s=ctx.timeout_s + self.settings.lease_s, alive=self.alive,
                     observe=self.observe)

    def sql(self, ctx: JobContext) -> Fences:
        return Fences(self.app.fence_store, self.owner(ctx))

    def redis(self, ctx: JobContext) -> Fences:
        return Fences(self.app.redis_fence_store, self.owner(ctx))

    def alive(self, job_id: str, token: str) -> bool:
        """Does attempt ``token`` of job ``job_id`` still hold a live lease, in any queue?"""
        return any(self.broker.lease_alive(q, job_id, token) for q in self.broker.queues())

    async def record_dead(self, dead: DeadJob, spec: dict[str, Any]) -> None:
        """Keep the dead job in the application's database too (durable dead-letter)."""
        failed = self.app.failed_jobs
        if failed is None:
            return
        try:
            await asyncio.to_thread(failed.record, dead, spec)
        except Exception:
            log.exception("job %s: writing it to the failed_jobs table failed; it stays in Redis dead-letter",
                          dead.id)
