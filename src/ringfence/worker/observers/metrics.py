"""Prometheus metrics of the job path (ringfence/metrics.py): attempts started and finished, fence outcomes."""

from __future__ import annotations

from ringfence.metrics import Metrics
from ringfence.models import Fetched
from ringfence.tasks import Task
from ringfence.worker.observers import Observer
from ringfence.worker.outcomes import Outcome, fence_outcome


class MetricsObserver(Observer):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def started(self, job: Fetched, task: Task, wait_s: float) -> None:
        self.metrics.job_started(task.name, job.queue, wait_s)

    def raised(self, exc: BaseException) -> None:
        fence = fence_outcome(exc)
        if fence is not None:
            self.metrics.fence_outcome("-", fence)

    def finished(self, task: str, queue: str, outcome: Outcome, duration_s: float) -> None:
        self.metrics.job_finished(task, queue, outcome, duration_s)
