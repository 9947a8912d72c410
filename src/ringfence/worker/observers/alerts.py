"""Raises an alert, once per job and worker, for a job no worker could read for longer than ``grace_s``."""

from __future__ import annotations

from typing import Any, Protocol

from ringfence.models import Fetched, JobSpec
from ringfence.worker.observers import Observer


class Alerter(Protocol):
    async def alert(self, kind: str, message: str, details: dict[str, Any]) -> None: ...


class UnreadableAlerts(Observer):
    def __init__(self, alerter: Alerter, grace_s: float) -> None:
        self.alerter, self.grace_s = alerter, grace_s
        self._alerted: set[str] = set()

    async def unreadable(self, job: Fetched, spec: JobSpec, why: str, counter: str, age_s: float) -> None:
        if job.id in self._alerted:
            return
        self._alerted.add(job.id)
        await self.alerter.alert(counter, f"job {job.id}: {why}; waiting {age_s:.0f}s, past grace_s={self.grace_s:g}",
                                 {"job_id": job.id, "queue": job.queue, "task": spec.task, "version": spec.version})
