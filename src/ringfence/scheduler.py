"""Periodic jobs on cron schedules. Any number of schedulers may run: the ``cron`` script enqueues each tick
once (the last handled tick is kept in Redis, and the job id is derived from the tick)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from croniter import croniter

from ringfence.errors import ConfigError
from ringfence.models import JobSpec
from ringfence.redis.broker import Broker
from ringfence.tasks import Task

log = logging.getLogger("ringfence.scheduler")

CATCH_UP = ("none", "last", "all")
MAX_TICKS_PER_CALL = 1000


@dataclass(frozen=True)
class Periodic:
    task: Task
    cron: str
    catch_up: str
    payload: dict[str, Any]

    @staticmethod
    def validate(name: str, cron: str, catch_up: str) -> None:
        if not croniter.is_valid(cron):
            raise ConfigError(f"periodic {name!r}: {cron!r} is not a valid cron expression")
        if catch_up not in CATCH_UP:
            raise ConfigError(f"periodic {name!r}: catch_up={catch_up!r} must be one of {', '.join(CATCH_UP)}")

    @classmethod
    def create(cls, task: Task, cron: str, catch_up: str, payload: dict[str, Any]) -> Periodic:
        cls.validate(task.name, cron, catch_up)
        task.codec.encode(payload)  # a payload that does not fit fails at declaration, not at every tick
        return cls(task, cron, catch_up, payload)

    @property
    def name(self) -> str:
        return self.task.name

    def ticks_after(self, after_ms: int, until_ms: int, limit: int) -> list[int]:
        it = croniter(self.cron, _dt(after_ms))
        out: list[int] = []
        while len(out) < limit:
            tick = int(it.get_next(float) * 1000)
            if tick > until_ms:
                break
            out.append(tick)
        return out

    def latest_tick(self, now_ms: int) -> int:
        """The latest tick at or before now."""
        return int(croniter(self.cron, _dt(now_ms + 1)).get_prev(float) * 1000)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


class Scheduler:
    """Enqueues due ticks of the periodic tasks (``app.periodics``). ``misfire_grace_s``: how late a tick may
    still run in catch-up mode "none" (and on the very first run, when no tick was handled yet)."""

    def __init__(self, periodics: list[Periodic], broker: Broker, misfire_grace_s: float = 60.0) -> None:
        self.periodics = periodics
        self.broker = broker
        self.grace_ms = int(misfire_grace_s * 1000)

    async def tick(self) -> int:
        enqueued = 0
        for p in self.periodics:
            enqueued += await self.run_one(p)
        return enqueued

    async def run_one(self, p: Periodic) -> int:
        b = self.broker
        # a partitioned queue: its ticks and their record in one partition, the same for every scheduler
        queue = p.task.app.client.partition(p.task.options.queue, f"cron:{p.name}")
        now = b.clock()
        last = await b.acron_last(queue, p.name)
        if last is None:
            last = now - self.grace_ms  # first run: a tick due just now still runs, older ones do not
        ticks, skip_to = self.select(p, last, now)
        if not ticks and skip_to <= last:
            return 0
        args = p.task.codec.encode(p.payload)
        jobs = [(t, f"cron:{p.name}:{t}", JobSpec(p.task.name, args, now, p.task.version).encode()) for t in ticks]
        done = await b.arun(b.cron(queue, p.name, jobs, skip_to))
        if done:
            log.info("periodic %s: enqueued %d tick(s), latest %s", p.name, len(done), _dt(max(done)).isoformat())
        return len(done)

    def select(self, p: Periodic, last: int, now: int) -> tuple[list[int], int]:
        """(ticks to enqueue, tick to mark handled without enqueueing) for the catch-up mode."""
        if p.catch_up == "all":
            return p.ticks_after(last, now, MAX_TICKS_PER_CALL), 0
        latest = p.latest_tick(now)
        if latest <= last:
            return [], 0
        if p.catch_up == "last" or latest >= now - self.grace_ms:
            return [latest], latest
        return [], latest  # "none": the missed tick is too old; skip it
