"""The worker's heartbeat: the leases of its running jobs, its clock offset to Redis, its server registry entry.

Renewing leases never depends on the registry: they are separate calls, and a failing registry write is
logged once (and once when it works again) while leases go on being renewed."""

from __future__ import annotations

import logging
import os
import socket
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, NamedTuple, Protocol

from ringfence.redis.broker import Broker
from ringfence.redis.connection import REFUSED, UNAVAILABLE
from ringfence.settings import WorkerSettings
from ringfence.worker.loop import Loop

log = logging.getLogger("ringfence.worker")


def _version() -> str:
    try:
        return metadata.version("ringfence")
    except metadata.PackageNotFoundError:
        return "unknown"


VERSION = _version()

LATENCY_EVERY_MS = 10_000  # how often a worker samples its queues' latency for the dashboard's charts


class Lease(NamedTuple):
    """A running job's lease, as the heartbeat renews it."""

    queue: str
    job_id: str
    token: str
    started_ms: int  # on the Redis clock: the lease is never renewed past started_ms + max_lease_s


class LeaseBook:
    """Until when (Redis clock, ms) each running attempt of this process is known to hold its lease: from its fetch,
    pushed on by each renewal Redis accepted. A fenced step asks it before an effect starts (``held``): an attempt
    whose process stood still past its lease (a pause, a stopped VM, a long GC) may have been swept meanwhile, its
    job recovered or dead-lettered naming no step, and must not call behind it. A local read, no round trip.

    The runner writes each attempt's fetched deadline in ``until`` as its handler starts (a dict store: this is
    on every job's path). In a worker's book an attempt it does not know is not held: the heartbeat drops an
    attempt whose lease was lost or that no longer runs. A book that is not ``active`` (a fence wiring with no
    worker) holds every lease."""

    def __init__(self, clock: Callable[[], int], active: bool = True) -> None:
        self.clock = clock
        self.until: dict[tuple[str, str], int] = {}
        self.active = active

    def renewed(self, leases: list[tuple[str, str, int]]) -> None:
        until = self.until
        for job_id, token, ms in leases:
            key = (job_id, token)
            if key in until:  # never brings back an attempt dropped meanwhile
                until[key] = max(until[key], ms)

    def keep(self, running: set[tuple[str, str]]) -> None:
        for key in [k for k in self.until if k not in running]:
            del self.until[key]

    def held(self, job_id: str, token: str, margin_ms: int) -> bool:
        """Does the lease outlast now by ``margin_ms`` (the time the ``calling`` write may take)?"""
        if not self.active:
            return True
        return self.clock() + margin_ms < self.until.get((job_id, token), 0)


_BOOKS: weakref.WeakKeyDictionary[Broker, LeaseBook] = weakref.WeakKeyDictionary()


def lease_book(broker: Broker) -> LeaseBook:
    """The process's book of its leases on ``broker``, shared by the heartbeat and the fence wiring."""
    book = _BOOKS.get(broker)
    if book is None:
        book = _BOOKS[broker] = LeaseBook(broker.clock)
    return book


class Slot(NamedTuple):
    """A global concurrency slot held by a running job (worker/gates.py)."""

    kind: str  # "task", "queue" or "key:<queue>"
    name: str
    holder: str  # the attempt: '<job id>:<lease token>' (gates.holder)


class LeaseHolder(Protocol):
    """What the heartbeat renews and whom it tells about a lost lease (the processor)."""

    def leases(self) -> list[Lease]: ...
    def slots(self) -> list[Slot]: ...
    def lease_lost(self, job_ids: list[str]) -> None: ...


@dataclass(frozen=True)
class ServerIdentity:
    """What a worker says about itself in the server registry, besides its live numbers."""

    id: str
    queues: dict[str, int]
    strict: bool
    concurrency: int
    namespace: str
    environment: str
    tasks: list[str]
    shutdown_timeout_s: float


class Heartbeat(Loop):
    name = "heartbeat"

    def __init__(self, broker: Broker, settings: WorkerSettings, me: ServerIdentity, queues: list[str],
                 holder: LeaseHolder, live: Callable[[], dict[str, Any]]) -> None:
        super().__init__(settings.heartbeat_s)
        self.broker, self.settings, self.me, self.queues = broker, settings, me, queues
        self.holder = holder
        self.live = live  # the worker's live numbers for its registry entry (running, processed, failed, p95)
        self.started = broker.clock() / 1000  # Redis clock, like every time other processes compare
        self.registry_failing = False
        self.latency_sampled_ms = 0
        self.book = lease_book(broker)

    def info(self) -> dict[str, Any]:
        me, b = self.me, self.broker
        return {
            "id": me.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": me.queues,
            "strict": me.strict,
            "concurrency": me.concurrency,
            "namespace": me.namespace,
            "environment": me.environment,
            "started": self.started,
            "heartbeat": b.clock() / 1000,
            "clock_skew_s": round(b.server_clock.skew_ms / 1000, 3),
            **self.live(),
            "tasks": me.tasks,
            "shutdown_timeout_s": me.shutdown_timeout_s,
            "version": VERSION,
        }

    async def tick(self) -> None:
        failed: BaseException | None = None
        try:
            await self.extend_leases()
        except UNAVAILABLE as exc:
            # Once more at once, on a fresh connection: a hung socket must not cost the leases a whole beat.
            self.broker.health.lost(exc)
            try:
                await self.extend_leases()
            except UNAVAILABLE as again:
                if not self.broker.cluster:
                    raise
                failed = again  # one node down: the registry entry is still refreshed, then the loop reports it
        await self.broker.aping()  # re-measures the offset to the Redis clock
        await self.register()
        await self.sample_latency()
        if failed is not None:
            raise failed

    async def sample_latency(self) -> None:
        """Age of each served queue's oldest pending job, kept per minute for the dashboard's charts (a cost per
        worker and queue every LATENCY_EVERY_MS, none per job). A failure only costs a point of a chart."""
        b = self.broker
        now = b.clock()
        if now - self.latency_sampled_ms < LATENCY_EVERY_MS:
            return
        self.latency_sampled_ms = now
        try:
            for queue in self.queues:
                oldest = await b.oldest_enqueued_ms(queue)
                await b.arun(b.latency_sample(queue, int(now - oldest) if oldest else 0))
        except REFUSED as exc:
            log.debug("latency sample skipped: %s", exc)

    async def register(self) -> None:
        try:
            await self.broker.heartbeat_server(self.me.id, self.info(), self.settings.server_ttl_s)
        except REFUSED as exc:
            if not self.registry_failing:
                log.warning("server registry write failed (%s); leases are still renewed; retrying every %gs",
                            exc, self.interval_s)
            self.registry_failing = True
            return
        if self.registry_failing:
            log.warning("server registry write works again")
            self.registry_failing = False

    async def extend_leases(self) -> None:
        broker, settings = self.broker, self.settings
        now = broker.clock()
        by_queue: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
        for lease in self.holder.leases():
            # Never beyond max_lease_s after the start: a hung job loses its lease in the end.
            cap = lease.started_ms + int(settings.max_lease_s * 1000)
            by_queue[lease.queue].append((lease.job_id, lease.token, min(now + int(settings.lease_s * 1000), cap)))
        error: BaseException | None = None
        for queue, leases in by_queue.items():
            try:
                lost = await broker.arun(broker.extend(queue, leases))
            except UNAVAILABLE as exc:  # its node down (Cluster): the other queues' leases are renewed still
                if not broker.cluster:
                    raise
                error = error or exc
                continue
            if lost:
                self.holder.lease_lost(lost)
            self.book.renewed([lease for lease in leases if lease[0] not in lost])
        # Read again, with no await since: an attempt begun during the calls above is kept.
        self.book.keep({(lease.job_id, lease.token) for lease in self.holder.leases()})
        until = now + int(settings.lease_s * 1000)
        by_limit: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        for slot in self.holder.slots():
            by_limit[(slot.kind, slot.name)].append((slot.holder, until))
        for (kind, name), holders in by_limit.items():
            await broker.arun(broker.extend_slots(kind, name, holders))
        if error is not None:
            raise error
