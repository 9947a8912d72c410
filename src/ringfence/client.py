"""The producer side: turns (task, payload, options) into stored jobs, one round trip per call."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ringfence.errors import ConfigError
from ringfence.models import JobSpec, new_job_id
from ringfence.settings import MAX_ATTEMPTS_LIMIT, check_name
from ringfence.tasks import EnqueueOptions, Task

if TYPE_CHECKING:
    from ringfence.app import App

Prepared = tuple[str, str, bytes, int]  # queue, id, spec, run-at ms (0 = now)


class Client:
    def __init__(self, app: App) -> None:
        self.app = app
        self._known_queues: set[str] = set()

    def prepare(self, task: Task, payload: Any, opts: EnqueueOptions) -> Prepared:
        """Validate and encode one job. ``payload`` is a dict of fields or the task's payload model."""
        args = task.codec.encode(payload)
        now = self.app.broker.clock()
        queue = check_name("queue", opts.queue or task.options.queue)
        at = 0
        if opts.run_at is not None and opts.delay_s is not None:
            raise ConfigError("give delay_s or run_at, not both")
        if opts.delay_s is not None:
            at = now + math.ceil(opts.delay_s * 1000)
        elif opts.run_at is not None:
            if opts.run_at.tzinfo is None:
                raise ConfigError(f"run_at={opts.run_at.isoformat()} has no timezone; pass an aware datetime")
            at = int(opts.run_at.timestamp() * 1000)
        if opts.max_attempts is not None and not 1 <= opts.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ConfigError(f"max_attempts={opts.max_attempts} must be between 1 and {MAX_ATTEMPTS_LIMIT}")
        if opts.timeout_s is not None and not 0 < opts.timeout_s < self.app.worker_settings.max_lease_s:
            raise ConfigError(
                f"timeout_s={opts.timeout_s} must be > 0 and below max_lease_s={self.app.worker_settings.max_lease_s}"
            )
        expiry_s = opts.expiry_s
        spec = JobSpec(
            task=task.name,
            args=args,
            enqueued_ms=now,
            version=task.version,
            max_attempts=opts.max_attempts,
            timeout_ms=None if opts.timeout_s is None else int(opts.timeout_s * 1000),
            expires_ms=None if expiry_s is None else max(now, at) + int(expiry_s * 1000),
        )
        job_id = opts.job_id or new_job_id()
        check_name("job id", job_id)
        return queue, job_id, spec.encode(), at

    def _calls(self, prepared: Iterable[Prepared]) -> list[Any]:
        by_queue: dict[str, list[tuple[str, bytes, int]]] = defaultdict(list)
        for queue, job_id, spec, at in prepared:
            by_queue[queue].append((job_id, spec, at))
        return [self.app.broker.enqueue(q, jobs) for q, jobs in by_queue.items()]

    def _new_queues(self, prepared: list[Prepared]) -> list[str]:
        new = {p[0] for p in prepared} - self._known_queues
        self._known_queues |= new
        return sorted(new)

    def enqueue(self, task: Task, payload: Any, opts: EnqueueOptions) -> str:
        return self.enqueue_many(task, [payload], opts)[0]

    def enqueue_many(self, task: Task, payloads: Iterable[Any], opts: EnqueueOptions) -> list[str]:
        prepared = [self.prepare(task, p, opts) for p in payloads]
        broker = self.app.broker
        broker.register_queues(self._new_queues(prepared))
        for call in self._calls(prepared):
            broker.run(call)
        return [p[1] for p in prepared]

    async def aenqueue(self, task: Task, payload: Any, opts: EnqueueOptions) -> str:
        return (await self.aenqueue_many(task, [payload], opts))[0]

    async def aenqueue_many(self, task: Task, payloads: Iterable[Any],
                            opts: EnqueueOptions) -> list[str]:
        prepared = [self.prepare(task, p, opts) for p in payloads]
        broker = self.app.broker
        await broker.aregister_queues(self._new_queues(prepared))
        for call in self._calls(prepared):
            await broker.arun(call)
        return [p[1] for p in prepared]

