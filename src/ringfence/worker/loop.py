"""The lifecycle shared by every background component of a worker: start, tick every interval, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ringfence.errors import RingfenceError
from ringfence.redis.connection import UNAVAILABLE, Health

log = logging.getLogger("ringfence.worker")

UNAVAILABLE_RETRY_S = 0.5


class Loop:
    """Runs ``tick()`` every ``interval_s`` until stopped; an error in one tick is logged, not fatal. With a
    ``health``, Redis not answering is reported there (one line per outage for the whole worker) instead."""

    name = "loop"
    health: Health | None = None

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        while not self._stop.is_set():
            wait_s = self.interval_s
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except UNAVAILABLE as exc:
                wait_s = min(wait_s, UNAVAILABLE_RETRY_S)  # back as soon as Redis is: leases may be running out
                if self.health is None:
                    log.warning("%s: Redis unreachable (%s); retrying in %.1fs", self.name, exc, wait_s)
                else:
                    self.health.lost(exc)
            except RingfenceError as exc:  # ours say what is wrong in one line (an ACL refusal, a missing table)
                log.error("%s: tick failed (%s: %s); retrying in %.1fs", self.name, type(exc).__name__, exc,
                          self.interval_s)
            except Exception:
                log.exception("%s: tick failed; retrying in %.1fs", self.name, self.interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), wait_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None
