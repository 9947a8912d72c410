"""A worker for a test suite: the app's real worker pipeline (encoding, payload checks, fences, Redis scripts) on a
private Redis, with time simulated: ``drain()`` runs everything queued, and jumps the clock to each delayed job
and retry as it comes due; ``advance(s)`` moves the clock, enqueueing the cron ticks on the way. A job that
reaches dead-letter fails the test unless the test said it expects it (``drain(expect_dead=1)``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Any, cast

from ringfence.app import App
from ringfence.models import DeadJob
from ringfence.outbox.relay import Relay
from ringfence.outbox.schema import missing_columns
from ringfence.outbox.store import relay_engine
from ringfence.redis.broker import Broker
from ringfence.runtime import Runtime
from ringfence.scheduler import Scheduler
from ringfence.worker.worker import Worker

log = logging.getLogger("ringfence.testing")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TestClock:
    """Simulated time in ms, moved only by the test (and by ``drain``, to the next job due)."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, ms: int | None = None) -> None:
        self.ms = int(time.time() * 1000) if ms is None else ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> int:
        self.ms += round(seconds * 1000)
        return self.ms


@dataclass
class Drained:
    """What one ``drain()`` or ``advance()`` ran: jobs acked, and the jobs that reached dead-letter."""

    processed: int = 0
    dead: list[DeadJob] = field(default_factory=list)


class UnexpectedDeadJob(AssertionError):
    """Jobs reached dead-letter that the test did not expect."""


class TestWorker:
    """Runs ``app``'s jobs on the broker at ``redis_url`` with ``clock``; fences in ``fence_url``."""

    __test__ = False

    def __init__(self, app: App, redis_url: str, clock: TestClock, fence_url: str, *, concurrency: int = 1,
                 timeout_s: float = 60.0) -> None:
        self.app, self.clock = app, clock
        self.concurrency, self.timeout_s = concurrency, timeout_s
        runtime = Runtime(app, broker=Broker(redis_url, app.namespace, clock=clock, connection=app.redis_settings))
        runtime.fence_url = app.fence_url or fence_url
        self.runtime = runtime
        self._before = app.built_runtime
        app.runtime = runtime  # the test's enqueues and the worker's jobs both use it
        self.queues = app.registry.queues() or ["default"]
        self._dead_seen: set[tuple[str, str]] = set()
        self._relay: Relay | bool | None = None  # False: no outbox table

    def reset(self) -> None:
        """Empty this Redis (a private one: every test starts from empty queues)."""
        self.broker.sync.flushall()

    @property
    def broker(self) -> Broker:
        return self.runtime.broker

    def drain(self, *, expect_dead: int = 0) -> Drained:
        """Run every job queued, retries and delayed jobs included (the clock jumps to each as it comes due), until
        none is left. Raises ``UnexpectedDeadJob`` unless exactly ``expect_dead`` jobs reached dead-letter."""
        return self._check(self._run(until_ms=None), expect_dead)

    def advance(self, seconds: float, *, expect_dead: int = 0) -> Drained:
        """Move the clock ``seconds`` forward as a running system would live them: each cron tick on the way is
        enqueued at its time and, like every job due by then, run."""
        target = self.clock() + round(seconds * 1000)
        drained = Drained()
        while True:
            tick = self._next_tick(target)
            self._add(drained, self._run(until_ms=tick or target))
            if tick is None:
                break
            self.clock.ms = max(self.clock.ms, tick)
            self._call(self._tick())
        self.clock.ms = max(self.clock.ms, target)
        return self._check(drained, expect_dead)

    async def _tick(self) -> None:
        try:
            await Scheduler(self.app.periodics, self.broker).tick()
        finally:
            await self.broker.aclose()  # its async clients belong to this loop

    def _next_tick(self, target: int) -> int | None:
        ticks = [t for p in self.app.periodics for t in p.ticks_after(self.clock(), target, 1)]
        return min(ticks) if ticks else None

    def _run(self, until_ms: int | None) -> Drained:
        drained = Drained()
        while True:
            self.relay()
            self._add(drained, Drained(self._call(self._serve())))
            if self.relay():
                continue  # the jobs ran wrote more outbox rows
            due = self._next_due()
            if due is None or (until_ms is not None and due > until_ms):
                return drained
            self.clock.ms = max(self.clock.ms, due)
            for queue in self.queues:
                self.broker.run(self.broker.promote(queue))

    def relay(self) -> int:
        """Send the outbox rows committed so far to Redis, as ``ringfence relay`` does (0 when the app's database
        has no outbox table); ``drain`` calls it before and after each run."""
        if self._relay is None:
            self._relay = self._outbox_relay()
        return self._relay.run(once=True) if isinstance(self._relay, Relay) else 0

    def _outbox_relay(self) -> Relay | bool:
        if not self.app.fence_url:
            return False
        engine = relay_engine(self.app.fence_url)
        try:
            missing_columns(engine)
        except Exception:  # no outbox table in that database: nothing to relay
            engine.dispose()
            return False
        return Relay(self.app, engine=engine)

    async def _serve(self) -> int:
        """One real worker on this loop until every queue is empty and nothing runs; the jobs it acked."""
        worker = Worker(self.app, [(q, 1) for q in self.queues], concurrency=self.concurrency, alerts=False,
                        summary_s=0)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + self.timeout_s
        try:
            while not self._idle(worker):
                if runner.done():
                    runner.result()  # its error, if it failed
                    raise AssertionError("the test worker stopped by itself")
                if time.monotonic() > deadline:
                    raise AssertionError(f"drain: jobs still queued or running after {self.timeout_s:g}s: "
                                         f"{self._counts()}")
                await asyncio.sleep(0.005)
        finally:
            worker.request_stop()
            await asyncio.wait_for(runner, 30)
        return worker.processor.processed

    def _idle(self, worker: Worker) -> bool:
        if worker.processor.running:
            return False
        return all(c["pending"] == 0 and c["active"] == 0 for c in self._counts().values())

    def _counts(self) -> dict[str, dict[str, Any]]:
        return {q: self.broker.queue_counts(q) for q in self.queues}

    def _next_due(self) -> int | None:
        """The earliest time a delayed job or a retry of these queues comes due (ms), if any."""
        due = []
        for queue in self.queues:
            k = self.broker.keys.queue(queue)
            for key in (k.scheduled, k.retry):
                first = cast(list[tuple[bytes, float]], self.broker.sync.zrange(key, 0, 0, withscores=True))
                due += [int(score) for _, score in first]
        return min(due) if due else None

    def _call(self, coro: Any) -> Any:
        """Run ``coro`` on a loop of its own, the test's signal handlers kept (the worker sets its own)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("TestWorker.drain()/advance() run their own event loop: call them from a sync test")
        saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            return asyncio.run(coro)
        finally:
            for sig, handler in saved.items():
                signal.signal(sig, handler)

    def new_dead(self) -> list[DeadJob]:
        out = []
        for queue in self.queues:
            ids = [i for i in self.broker.dead_ids(queue) if (queue, i) not in self._dead_seen]
            for job_id, raw in self.broker.dead_records(queue, ids):
                self._dead_seen.add((queue, job_id))
                out.append(DeadJob.decode(queue, job_id, raw))
        return out

    @staticmethod
    def _add(total: Drained, more: Drained) -> None:
        total.processed += more.processed
        total.dead += more.dead

    def _check(self, drained: Drained, expect_dead: int) -> Drained:
        drained.dead += self.new_dead()
        if len(drained.dead) != expect_dead:
            lines = [f"  {d.task} job {d.id}: {d.reason}: {d.error}" for d in drained.dead]
            raise UnexpectedDeadJob(f"{len(drained.dead)} job(s) reached dead-letter, {expect_dead} expected"
                                    + "".join(f"\n{line}" for line in lines))
        return drained

    def close(self) -> None:
        """Close the connections and give the app back its own runtime."""
        if isinstance(self._relay, Relay):
            self._relay.store.engine.dispose()
        self.runtime.close()
        self.app.built_runtime = self._before
