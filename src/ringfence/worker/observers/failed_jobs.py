"""Writes the failed-jobs row of a job that reached the Redis dead-letter (worker/durable.py keeps the two in
step when a worker dies in between)."""

from __future__ import annotations

import orjson

from ringfence.models import DeadJob, JobSpec
from ringfence.redis.broker import Broker
from ringfence.worker.durable import FailedJobsSource, write_row
from ringfence.worker.observers import Observer


class FailedJobsObserver(Observer):
    def __init__(self, source: FailedJobsSource, broker: Broker) -> None:
        self.source, self.broker = source, broker

    async def dead(self, dead: DeadJob, spec: JobSpec | None) -> None:
        failed = self.source.failed_jobs
        if spec is not None and failed is not None:
            await write_row(failed, self.broker, dead, orjson.loads(spec.encode()))
