"""Tells a dependency's circuit breaker how a job that went through it did (worker/gates.py keeps the state)."""

from __future__ import annotations

from ringfence.models import Fetched
from ringfence.tasks import Task
from ringfence.worker.gates import Gates
from ringfence.worker.observers import Observer
from ringfence.worker.outcomes import Verdict, dependency_ok


class BreakerObserver(Observer):
    def __init__(self, gates: Gates) -> None:
        self.gates = gates

    async def ran(self, job: Fetched, task: Task, verdict: Verdict) -> None:
        if task.dependency is not None:
            await self.gates.record(job, task, dependency_ok(verdict))

    def hears_ran(self, task: Task) -> bool:
        return task.dependency is not None
