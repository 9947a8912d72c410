"""Settle, the happy path: acks are batched per queue and sent by one background flusher, so a busy worker
sends one script call per queue and batch instead of one per job."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

from ringfence.redis.broker import Broker
from ringfence.redis.connection import UNAVAILABLE

log = logging.getLogger("ringfence.worker")


class Acks:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._pending: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self._ready = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None

    def add(self, queue: str, job_id: str, token: str) -> None:
        self._pending[queue].append((job_id, token))
        self._ready.set()

    def start(self) -> None:
        self._flusher = asyncio.create_task(self._loop(), name="acker")

    async def stop(self) -> None:
        """Send what is pending, then stop the flusher."""
        await self.flush()
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
        pending, self._pending = self._pending, defaultdict(list)
        for queue in list(pending):
            pairs = pending[queue]
            try:
                lost = await self.broker.arun(self.broker.ack(queue, pairs))
            except BaseException:
                for q, left in pending.items():  # keep what was not acked for the next flush
                    self._pending[q].extend(left)
                raise
            del pending[queue]
            if lost:
                log.warning("ack of %d job(s) in %s refused: their lease had moved to another attempt: %s",
                            len(lost), queue, " ".join(lost[:10]))
