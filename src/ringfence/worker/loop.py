"""The lifecycle shared by every background component of a worker: start, tick every interval, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger("ringfence.worker")


class Loop:
    """Runs ``tick()`` every ``interval_s`` until stopped; an error in one tick is logged, not fatal."""

    name = "loop"

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
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: tick failed; retrying in %.1fs", self.name, self.interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 5)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
            self._task = None
