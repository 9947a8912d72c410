"""Fetch: which queue first (weighted or strict, starving queues ahead), one script call for as many jobs as
there are free slots, and the idle wait (pub/sub wake-ups, docs/architecture.md "Fetching without polling")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ringfence.models import Fetched
from ringfence.redis.broker import Broker
from ringfence.redis.connection import UNAVAILABLE, resent
from ringfence.redis.waker import Waker
from ringfence.worker.partitions import LEFTOVER_EVERY_S, FetchOrder

log = logging.getLogger("ringfence.worker")

DOWN_S = 0.5  # a queue whose Redis node did not answer is left out of fetches this long (the others go on)
HAND_BACK_EVERY_S = 0.5  # how often the jobs of fetches whose reply was lost are given back (``_lose``)


class Stopping(asyncio.Event):
    """The worker's stop request. Setting it also sets the events in ``wakes``: a wait on one of them ends at a
    stop too, without the two Tasks of ``Fetcher.until`` (the processor's wait for free slots, several times a
    millisecond on a busy worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes: list[asyncio.Event] = []

    def set(self) -> None:
        super().set()
        for event in self.wakes:
            event.set()


class Fetcher:
    def __init__(self, broker: Broker, server_id: str, queues: list[tuple[str, int]], *, strict: bool,
                 lease_s: float, idle_s: float, max_wait: dict[str, float] | None, stopping: Stopping) -> None:
        self.broker, self.server_id, self.queues, self.strict = broker, server_id, queues, strict
        self.lease_ms = int(lease_s * 1000)
        self.idle_s = idle_s  # the fallback timer of an idle wait (heartbeat_s): covers a lost connection
        self.max_wait = max_wait or {}  # queue -> starvation bound (s): served first once exceeded
        self.stopping = stopping
        self.waker = Waker(broker, server_id, [q for q, _ in queues])
        self._seq = 0
        self._order = FetchOrder(queues)  # a partitioned queue's partitions in turn (worker/partitions.py)
        self._left = 0  # slots the last fetch left free: pushed jobs beyond them are handed back
        self._marked = False  # the last fetch left this worker marked idle in some queue (fetch.lua)
        self._starving: list[str] = []
        self._starving_at = 0.0
        self.down: dict[str, float] = {}  # queue -> monotonic time until which its fetch is skipped
        # queue -> {token: (lease deadline ms, ids it gave that the worker holds)}: fetches with no reply, or sent
        # twice by the client
        self.lost_fetches: dict[str, dict[str, tuple[int, tuple[str, ...]]]] = {}
        self._handing_back: asyncio.Task[None] | None = None

    async def cycle(self, free: int, start: Callable[[Fetched], None]) -> None:
        """Fetch up to ``free`` jobs and ``start`` each; once every queue was found empty, wait idle until woken.

        Each fetch moves this worker's idle mark in its queue (fetch.lua). A job enqueued while the worker sleeps
        comes leased in the wake message itself (enqueue_ready.lua) and starts with no fetch; a plain wake-up is
        followed by one fetch round trip. Once the wake subscription was re-established, the jobs pushed to this
        worker whose message was lost are handed back first (``Waker.recover``)."""
        if self.waker.resubscribed:
            await self.waker.recover()
        await self.waker.forget_finished()
        if await self.fetch(free, start):
            if self._marked:  # a queue left empty marked it idle, yet it will not wait: jobs must not wait on it
                await self.waker.mark_busy()
                await self.waker.wait(0)  # reads what was pushed before the unmark
            else:
                return
        else:  # a queue left out (its node down) is tried again soon, not at the fallback timer
            # partitions of another N wake no one (not subscribed): they are fetched again within LEFTOVER_EVERY_S
            idle_s = min(self.idle_s, LEFTOVER_EVERY_S) if self._order.leftovers else self.idle_s
            await self.until(self.waker.wait(DOWN_S if self.down else idle_s))
        pushed = self.waker.take()
        if pushed:
            await self.take_pushed(pushed, self._left, start)

    async def take_pushed(self, pushed: list[tuple[Fetched, int]], free: int,
                          start: Callable[[Fetched], None]) -> None:
        """Start the jobs leased to this worker by wake messages; those beyond ``free`` slots (marks in several
        queues, each the promise of a slot) are handed back at once, their attempt not counted. So is one read
        after its lease ran out (the recoverer has it; the hand-back then does nothing)."""
        started = 0
        now = self.broker.clock()
        for job, deadline in pushed:
            if started < free and deadline > now + 1000:
                # Its lease began when Redis leased it, not when the message was read (a delayed message): the
                # lease book counts to the deadline Redis set (Redis clock, like the deadline) and no later.
                job.started_ms = deadline - self.lease_ms
                start(job)
                started += 1
            else:
                await self.waker.hand_back(job)
        await asyncio.sleep(0)  # the started jobs reach their handlers before the next fetch

    def _lose(self, queue: str, token: str, deadline_ms: int, held: tuple[str, ...] = ()) -> None:
        """A fetch failed without a reply (a timeout, a dropped connection), or the client sent it again and read
        the second reply only: it may have leased jobs nobody holds (all but ``held``), and a Redis that stood still
        may still run it from its input buffer, up to the end of the lease it would give. Those jobs are given
        back every ``HAND_BACK_EVERY_S`` until then, by a task of its own, so they neither wait out their lease nor
        depend on this worker fetching again (its slots may be full by then). A fetch answered at the first try
        costs no call (two reads of ``resent``)."""
        self.lost_fetches.setdefault(queue, {})[token] = (deadline_ms, held)
        if self._handing_back is None or self._handing_back.done():
            self._handing_back = asyncio.get_running_loop().create_task(self._hand_back_until_over())

    async def _hand_back_until_over(self) -> None:
        while self.lost_fetches:
            await asyncio.sleep(HAND_BACK_EVERY_S)  # not at once: the Redis that did not answer seldom does now
            await self.hand_back_lost_fetches()

    async def hand_back_lost_fetches(self) -> None:
        """Give back what the fetches without a reply leased (hand_back_fetch.lua); one whose lease has ended is
        forgotten (the recoverer has its jobs). A queue whose Redis does not answer is tried again next time."""
        now = self.broker.clock()
        for queue, tokens in list(self.lost_fetches.items()):
            for token, (deadline, _) in list(tokens.items()):
                if deadline <= now:
                    del tokens[token]
            if not tokens:
                self.lost_fetches.pop(queue, None)
                continue
            lost = [(token, deadline) for token, (deadline, _) in tokens.items()]
            held = [job_id for _, kept in tokens.values() for job_id in kept]
            try:
                ids = await self.broker.arun(self.broker.hand_back_fetch(queue, lost, held))
            except UNAVAILABLE:
                continue
            except Exception as exc:  # refused (an ACL, say): it would be again; the leases run out instead
                log.warning("queue %s: the jobs of fetches whose reply was lost could not be given back (%s: %s); "
                            "they return when their lease ends", queue, type(exc).__name__, exc)
                self.lost_fetches.pop(queue, None)
                continue
            if ids:
                log.info("queue %s: %d job(s) leased by a fetch whose reply was lost given back: %s", queue,
                         len(ids), " ".join(ids[:10]))

    async def close(self) -> None:
        """At shutdown: the jobs of fetches without a reply are given back once more, if Redis answers."""
        if self._handing_back is not None:
            self._handing_back.cancel()
        if self.lost_fetches:
            await self.hand_back_lost_fetches()

    async def until(self, aw: Awaitable[Any]) -> None:
        """Await ``aw`` unless the worker is asked to stop first."""
        waiter = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
        for t in (waiter, stop):
            if not t.done():
                t.cancel()
        error = waiter.exception() if waiter.done() and not waiter.cancelled() else None
        if error is not None:
            raise error

    def _left_out(self, queue: str, exc: BaseException) -> None:
        if queue not in self.down:
            log.warning("queue %s: its Redis node does not answer (%s: %s); the other queues are served, this one "
                        "is tried every %gs", queue, type(exc).__name__, exc, DOWN_S)
        self.down[queue] = time.monotonic() + DOWN_S

    async def order(self) -> list[str]:
        await self._order.look(self.broker)  # partitions of another N holding jobs, now and then
        order = self._order.next(self.strict)
        if not self.max_wait:
            return order
        now = self.broker.clock()
        if now - self._starving_at > 500:  # checked twice a second at most: two reads per bounded queue
            self._starving_at = now
            self._starving = []
            for queue, bound_s in self.max_wait.items():
                oldest = await self.broker.oldest_enqueued_ms(queue)
                if oldest is not None and now - oldest > bound_s * 1000:
                    self._starving.append(queue)
        return self._starving + [q for q in order if q not in self._starving]

    async def fetch(self, free: int, start: Callable[[Fetched], None]) -> bool:
        """Fetch from the queues in order; False when each one was left empty (this worker is then marked idle in
        each, by the same script calls), True when one may hold more or every slot is taken."""
        now = self.broker.clock()
        until = now + int((self.idle_s + 1) * 1000)  # outlives the idle wait (its fallback timer)
        started, more = 0, False
        self._marked = False
        failed: list[BaseException] = []
        for queue in await self.order():
            if self.down.get(queue, 0.0) > time.monotonic():
                continue
            self._seq += 1
            token = f"{self.server_id}.{self._seq}"
            sent = resent()
            try:
                got, empty = await self.broker.arun(self.broker.fetch_marking(
                    queue, free, now + self.lease_ms, token, self.server_id, until))
            except BaseException as exc:
                self._lose(queue, token, now + self.lease_ms)
                if not isinstance(exc, UNAVAILABLE) or not self.broker.cluster:
                    raise
                self._left_out(queue, exc)  # one node down (Cluster): the queues of the others are still served
                failed.append(exc)
                continue
            if resent() != sent:  # the client sent the fetch again: the first run's jobs are nobody's
                self._lose(queue, token, now + self.lease_ms, tuple(job_id for job_id, _, _ in got))
            if self.down.pop(queue, None) is not None:
                log.warning("queue %s: its Redis node answers again; fetching from it", queue)
            self._order.fetched(queue, empty)
            self._marked = self._marked or (empty and len(got) < free)  # as fetch.lua marks
            dangling = [job_id for job_id, _, attempt in got if attempt == 0]
            if dangling:
                got = [g for g in got if g[2] > 0]
                log.error("queue %s: %d queued id(s) had no job record and were dropped (counted as "
                          "'dangling'): %s", queue, len(dangling), " ".join(dangling[:10]))
            for job_id, raw, attempt in got:
                start(Fetched(job_id, queue, raw, attempt, token, now))
            free -= len(got)
            started += len(got)
            if dangling or not empty or free <= 0:
                more = True
                break
        self._left = free
        if failed and not started and len(self.down) >= len(self.queues):
            raise failed[-1]  # no queue answers: the processor's backoff and outage report
        if started:
            await asyncio.sleep(0)  # the started jobs reach their handlers before the next fetch or the wait
        return more
