"""The Redis server's clock, read locally.

Leases, schedules, retries and expiries are compared by every worker; each one's own clock would let a worker
whose clock runs ahead take live jobs from the others. So the broker's clock is Redis ``TIME``, read without a
round trip: ``time.monotonic()`` plus the offset to Redis, measured at connect and again on every worker
heartbeat (so a wall-clock step on this host changes nothing, and drift is corrected within a heartbeat).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

#: A first reading slower than this (a connection's setup, a stalled host) is taken again, up to
#: ``FIRST_READINGS`` in all: its middle could be off by half of it, and every later reading only narrows.
TIGHT_MS = 10.0
FIRST_READINGS = 3


class ServerClock:
    """``clock()`` → now in ms on the Redis server's clock. ``skew_ms``: this host's wall clock minus Redis's."""

    def __init__(self, sync_client: Callable[[], Any]) -> None:
        self._sync_client = sync_client
        self._offset_ms: float | None = None
        self.skew_ms = 0.0
        self.rtt_ms = 0.0

    @property
    def measured(self) -> bool:
        return self._offset_ms is not None

    def __call__(self) -> int:
        return int(self.precise())

    def precise(self) -> float:
        if self._offset_ms is None:  # a producer's first call; a worker measures at start, asynchronously
            self.measure(self._sync_client())
        return time.monotonic() * 1000 + self._offset_ms  # type: ignore[operator]

    def measure(self, client: Any) -> None:
        for _ in range(1 if self.measured else FIRST_READINGS):
            before = time.monotonic()
            raw = client.time()
            self._update(before, raw, time.monotonic(), time.time())
            if self.rtt_ms <= TIGHT_MS:
                return

    async def ameasure(self, client: Any) -> None:
        for _ in range(1 if self.measured else FIRST_READINGS):
            before = time.monotonic()
            raw = await client.time()
            self._update(before, raw, time.monotonic(), time.time())
            if self.rtt_ms <= TIGHT_MS:
                return

    def _update(self, before: float, raw: tuple[int, int], after: float, wall: float) -> None:
        server_ms = raw[0] * 1000 + raw[1] / 1000
        # Redis read its clock somewhere in the round trip, so the offset lies between these two. The first
        # reading takes the middle; a later one moves the offset only as far as needed to fall inside its own
        # interval: one slow round trip (a loaded host) cannot move the clock by half of it, a tight one
        # narrows the error, and drift or a step of Redis's clock is still followed.
        low, high = server_ms - after * 1000, server_ms - before * 1000
        if self._offset_ms is None:
            self._offset_ms = (low + high) / 2
        else:
            self._offset_ms = min(max(self._offset_ms, low), high)
        self.rtt_ms = (after - before) * 1000
        self.skew_ms = wall * 1000 - (server_ms + (after - before) / 2 * 1000)
