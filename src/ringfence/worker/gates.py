"""What a job passes before it runs: global concurrency limits (per task, per queue), the limit of its
concurrency key, and the circuit breaker of its dependency. A job that may not run yet waits without burning an
attempt."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass

from ringfence.errors import PayloadError
from ringfence.models import Fetched
from ringfence.redis.broker import Broker
from ringfence.redis.keys import logical_queue
from ringfence.settings import BreakerPolicy, WorkerSettings
from ringfence.tasks import Task, concurrency_key
from ringfence.worker.outcomes import Outcome, Verdict

SLOT_RETRY_S = 0.5
KEY_SLOT_WAIT_S = 0.05  # a freed concurrency-key slot waits this long for a fetch of its queue to carry it
log = logging.getLogger("ringfence.worker")


def holder(job: Fetched) -> str:
    """The holder of the job's slots: its attempt, not the job. A run whose lease lapsed (its worker stood still)
    then frees and renews only its own slots, never those of the attempt that replaced it."""
    return f"{job.id}:{job.token}"


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
        self.held: dict[str, list[tuple[str, str]]] = {}  # holder (``holder``) -> (kind, name) slots it holds
        self._flusher: asyncio.Task[None] | None = None
        self._queue_limited: dict[str, bool] = {}
        self._limits_seen = len(queue_limits)

    def applies(self, job: Fetched, task: Task) -> bool:
        """Whether ``enter`` has anything to check for this job: a concurrency limit (task or queue) or a
        dependency. False: the caller may skip ``enter`` and ``release`` (no coroutine or clock read per job)."""
        return (task.concurrency is not None or task.dependency is not None or self._limited(job.queue)
                or task.concurrency_key is not None or b',"ck":"' in job.raw)

    def _limited(self, queue: str) -> bool:
        """Whether ``queue`` (or the queue it is a partition of) has a limit; read once per queue."""
        if len(self.queue_limits) != self._limits_seen:  # a limit declared since
            self._queue_limited.clear()
            self._limits_seen = len(self.queue_limits)
        limited = self._queue_limited.get(queue)
        if limited is None:
            limited = self._queue_limited[queue] = logical_queue(queue) in self.queue_limits
        return limited

    def limits(self, job: Fetched, task: Task) -> list[tuple[str, str, int]]:
        out = []
        if task.concurrency is not None:
            out.append(("task", task.name, task.concurrency))
        queue = logical_queue(job.queue)  # a partitioned queue's limit holds across its partitions
        if queue in self.queue_limits:
            out.append(("queue", queue, self.queue_limits[queue]))
        return out

    def hold_key(self, job: Fetched, task: Task) -> bool:
        """True when the job's only gate is its concurrency key, whose slot fetch.lua took: the slot is then held
        (renewed by the heartbeat) until ``release`` or ``release_key``, and nothing is awaited."""
        spec = job.spec
        key = spec.extra.get("ck") if spec is not None else None
        if type(key) is str and task.concurrency is None and task.dependency is None and not self._limited(job.queue):
            self.held[holder(job)] = [(f"key:{job.queue}", key)]
            return True
        return False

    async def enter(self, job: Fetched, task: Task) -> Wait | Verdict | None:
        """None when the job may run now (its slots are then held until ``release``); a Verdict (dead-letter) when
        its concurrency key cannot be built from its payload."""
        if self.hold_key(job, task):
            return None
        b, who = self.broker, holder(job)
        until = b.clock() + int(self.settings.lease_s * 1000)
        taken: list[tuple[str, str]] = []
        keyed = await self._key_slot(job, task, who, until)
        if isinstance(keyed, Wait | Verdict):
            return keyed
        if keyed is not None:
            taken.append(keyed)
        for kind, name, limit in self.limits(job, task):
            if not await b.arun(b.acquire_slot(kind, name, limit, who, until)):
                for k, n in taken:
                    await b.release_slot(k, n, who)
                return Wait(SLOT_RETRY_S * (0.5 + random.random()), "concurrency_delayed")
            taken.append((kind, name))
        if task.dependency is not None:
            policy = self.breakers[task.dependency]
            ok, wait_ms, why = await b.arun(b.breaker_allow(
                task.dependency, policy.rate_per_s or 0, int(policy.probe_timeout_s * 1000)))
            if not ok:
                for k, n in taken:
                    await b.release_slot(k, n, who)
                return Wait(max(wait_ms, 50) / 1000, "rate_limited" if why == "rate_limited" else "breaker_delayed")
        if taken:
            self.held[who] = taken
        return None

    async def _key_slot(self, job: Fetched, task: Task, who: str,
                        until: int) -> tuple[str, str] | Wait | Verdict | None:
        """The slot of the job's concurrency key. fetch.lua took it for a job whose spec names its key (the only
        script that leases such jobs); a job of a keyed task without one (enqueued before the task had its key)
        has its key built here and its slot taken as a global limit's."""
        kind = f"key:{job.queue}"
        spec = job.spec
        key = spec.extra.get("ck") if spec is not None else None
        if isinstance(key, str):
            return kind, key
        if task.concurrency_key is None or task.concurrency_limit is None:
            return None
        try:
            key = concurrency_key(task, spec.args if spec is not None else {})
        except PayloadError as exc:
            return Verdict(Outcome.DEAD, "bad_payload", str(exc))
        if not await self.broker.arun(self.broker.acquire_slot(kind, key, task.concurrency_limit, who, until)):
            return Wait(SLOT_RETRY_S * (0.5 + random.random()), "concurrency_delayed")
        return kind, key

    async def release(self, job: Fetched) -> None:
        who = holder(job)
        for kind, name in self.held.pop(who, []):
            if kind.startswith("key:"):
                self._free_key_slot(kind[4:], name, who)
            else:
                await self.broker.release_slot(kind, name, who)

    def release_key(self, job: Fetched) -> None:
        """``release`` of a job ``hold_key`` took: its key's slot, with no await."""
        who = holder(job)
        held = self.held.pop(who, None)
        if held is not None:
            self.broker.free_key_slot(job.queue, held[0][1], who)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._free_key_slots())

    def _free_key_slot(self, queue: str, key: str, holder: str) -> None:
        """Freed by the queue's next fetch, in its script: no call of its own."""
        self.broker.free_key_slot(queue, key, holder)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._free_key_slots())

    async def _free_key_slots(self) -> None:
        """Free the key slots no fetch carried within ``KEY_SLOT_WAIT_S`` (the worker fetched other queues, or
        stops); a slot a failed call leaves ends with its lease, as a crashed worker's does."""
        await asyncio.sleep(KEY_SLOT_WAIT_S)
        try:
            await self.broker.flush_key_slots()
        except Exception as exc:  # any failure: the slots end with their lease
            log.warning("concurrency-key slots not released (%s: %s); they end with their lease",
                        type(exc).__name__, exc)

    async def record(self, job: Fetched, task: Task, dependency_ok: bool | None) -> None:
        """Tell the breaker how the dependency did (None: the outcome says nothing about it)."""
        if task.dependency is not None and dependency_ok is not None:
            p = self.breakers[task.dependency]
            await self.broker.arun(self.broker.breaker_record(
                task.dependency, dependency_ok, p.failures, int(p.window_s * 1000), int(p.open_s * 1000),
                f"{job.id}.{job.attempt}.{job.token}"))

    def slots(self) -> list[tuple[str, str, str]]:
        """(kind, name, holder) of every slot held by a running job, for the heartbeat to renew."""
        return [(kind, name, who) for who, held in self.held.items() for kind, name in held]
