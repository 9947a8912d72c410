"""What a job passes before it runs: global concurrency limits (per task, per queue) and the circuit breaker of
its dependency. A job that may not run yet waits without burning an attempt."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from ringfence.models import Fetched
from ringfence.redis.broker import Broker
from ringfence.redis.keys import logical_queue
from ringfence.settings import BreakerPolicy, WorkerSettings
from ringfence.tasks import Task

SLOT_RETRY_S = 0.5


@dataclass(frozen=True)
class Wait:
    delay_s: float
    counter: str


class Gates:
    def __init__(self, broker: Broker, settings: WorkerSettings, queue_limits: Mapping[str, int],
                 breakers: Mapping[str, BreakerPolicy]) -> None:
        self.broker = broker
        self.settings = settings
        self.queue_limits = queue_limits  # app.limit_queue(...)
        self.breakers = breakers          # app.breaker(...) and every task's dependency
        self.held: dict[str, list[tuple[str, str]]] = {}  # job id -> (kind, name) slots it holds

    def applies(self, job: Fetched, task: Task) -> bool:
        """Whether ``enter`` has anything to check for this job: a concurrency limit (task or queue) or a
        dependency. False: the caller may skip ``enter`` and ``release`` (no coroutine or clock read per job)."""
        return (task.concurrency is not None or task.dependency is not None
                or logical_queue(job.queue) in self.queue_limits)

    def limits(self, job: Fetched, task: Task) -> list[tuple[str, str, int]]:
        out = []
        if task.concurrency is not None:
            out.append(("task", task.name, task.concurrency))
        queue = logical_queue(job.queue)  # a partitioned queue's limit holds across its partitions
        if queue in self.queue_limits:
            out.append(("queue", queue, self.queue_limits[queue]))
        return out

    async def enter(self, job: Fetched, task: Task) -> Wait | None:
        """None when the job may run now (its slots are then held until ``leave``)."""
        b = self.broker
        until = b.clock() + int(self.settings.lease_s * 1000)
        taken: list[tuple[str, str]] = []
        for kind, name, limit in self.limits(job, task):
            if not await b.arun(b.acquire_slot(kind, name, limit, job.id, until)):
                for k, n in taken:
                    await b.release_slot(k, n, job.id)
                return Wait(SLOT_RETRY_S * (0.5 + random.random()), "concurrency_delayed")
            taken.append((kind, name))
        if task.dependency is not None:
            policy = self.breakers[task.dependency]
            ok, wait_ms, why = await b.arun(b.breaker_allow(
                task.dependency, policy.rate_per_s or 0, int(policy.probe_timeout_s * 1000)))
            if not ok:
                for k, n in taken:
                    await b.release_slot(k, n, job.id)
                return Wait(max(wait_ms, 50) / 1000, "rate_limited" if why == "rate_limited" else "breaker_delayed")
        if taken:
            self.held[job.id] = taken
        return None

    async def release(self, job: Fetched) -> None:
        for kind, name in self.held.pop(job.id, []):
            await self.broker.release_slot(kind, name, job.id)

    async def record(self, job: Fetched, task: Task, dependency_ok: bool | None) -> None:
        """Tell the breaker how the dependency did (None: the outcome says nothing about it)."""
        if task.dependency is not None and dependency_ok is not None:
            p = self.breakers[task.dependency]
            await self.broker.arun(self.broker.breaker_record(
                task.dependency, dependency_ok, p.failures, int(p.window_s * 1000), int(p.open_s * 1000),
                f"{job.id}.{job.attempt}.{job.token}"))

    def slots(self) -> list[tuple[str, str, str]]:
        """(kind, name, holder) of every slot held by a running job, for the heartbeat to renew."""
        return [(kind, name, job_id) for job_id, held in self.held.items() for kind, name in held]
