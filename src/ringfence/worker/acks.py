"""Settle, the happy path: acks are batched per queue and sent by one background flusher, so a busy worker
sends one script call per queue and batch instead of one per job. A batch is sent once it holds ``batch`` acks
or its first ack has waited ``wait_s`` (a finished job's ack follows it by that much at most)."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from ringfence.redis.broker import Broker
from ringfence.redis.connect import while_loading
from ringfence.redis.connection import UNAVAILABLE

log = logging.getLogger("ringfence.worker")


class Acks:
    def __init__(self, broker: Broker, batch: int = 1, wait_s: float = 0.002) -> None:
        self.broker = broker
        self.batch, self.wait_s = batch, wait_s
        self._pending: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self._count = 0  # acks pending, all queues
        self._ready = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one flush at a time: stop() waits for the flusher's call in flight

    def add(self, queue: str, job_id: str, token: str) -> None:
        self._pending[queue].append((job_id, token))
        self._count += 1
        if self._count >= self.batch:
            self._ready.set()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._ready.set)

    def start(self) -> None:
        self._flusher = asyncio.create_task(self._loop(), name="acker")

    async def stop(self) -> None:
        """Send what is pending, then stop the flusher: a call the flusher has in flight ends first (cancelled, it
        would leave its jobs leased, acked or not). A Redis loading its data is waited for: a lost ack runs the
        job again."""
        await while_loading(self.flush, self.broker.health, self.broker.connection.first_connect_s)
        if self._flusher is not None:
            self._flusher.cancel()

    async def _loop(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            try:
                await self.flush()
            except Exception as exc:
                if isinstance(exc, UNAVAILABLE):
                    self.broker.health.lost(exc)
                else:
                    log.exception("acks failed; retrying in 0.5s")
                await asyncio.sleep(0.5)
                self._ready.set()

    async def flush(self) -> None:
        async with self._lock:
            await self._flush()

    async def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending, self._count = self._pending, defaultdict(list), 0
        error: BaseException | None = None
        for queue in list(pending):
            pairs = pending[queue]
            try:
                lost = await self.broker.arun(self.broker.ack(queue, pairs))
            except UNAVAILABLE as exc:  # its node down (Cluster): the other queues' acks still go now
                error = error or exc
                if self.broker.cluster:
                    continue
                self._keep(pending)
                raise
            except BaseException:
                self._keep(pending)
                raise
            del pending[queue]
            if lost:
                log.warning("ack of %d job(s) in %s refused: their lease had moved to another attempt: %s",
                            len(lost), queue, " ".join(lost[:10]))
        if error is not None:
            self._keep(pending)
            raise error

    def _keep(self, pending: dict[str, list[tuple[str, str]]]) -> None:
        """What was not acked goes into the next flush."""
        for queue, left in pending.items():
            self._pending[queue].extend(left)
            self._count += len(left)
