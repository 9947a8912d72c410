"""Calls to a Redis Cluster node that just failed are not sent again for a moment.

Every call that fails to reach a node makes redis-py's asyncio cluster client reload its slot map before the next
call of any coroutine, the healthy nodes' calls included, one reload at a time. A worker sends many calls a second
to the queues of a dead master (leases, acks, recovery, its queue list), so while the master is down the calls of
the healthy queues kept waiting on reloads. Now a node that failed a call is asked again only once per ``DOWN_S``
(by the first call after that): the others fail at once with a ``ConnectionError`` naming it, as if sent. After a
failover the reloaded map names the promoted replica, whose calls pass. The sync client has a gate of its own
(``Broker.sync_gate``): each of its calls to a dead node reloaded the map twice (a retry), from any thread."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis

DOWN_S = 0.5  # as long as the fetcher leaves a queue of a node that does not answer out of its fetches


class NodeGate:
    def __init__(self) -> None:
        self.down: dict[str, float] = {}  # node name -> monotonic time until which its calls fail at once

    def check(self, client: Any, key: str) -> str | None:
        """The name of ``key``'s node while a node is marked down (else None, no lookup); raises when that node
        failed within ``DOWN_S`` and another call probes it already."""
        if not self.down:
            return None
        try:
            name: str = client.get_node_from_key(key).name
        except Exception:  # the slot map is being reloaded: the call finds its node itself
            return None
        until = self.down.get(name)
        now = time.monotonic()
        if until is None:
            # A node no key maps to any more (its slots moved to the promoted replica) is never probed again.
            for stale, t in list(self.down.items()):  # a copy: the sync client's gate is shared by threads
                if t < now - DOWN_S:
                    self.down.pop(stale, None)
            return name
        if now < until:
            raise redis.ConnectionError(f"Redis Cluster node {name} did not answer within the last {DOWN_S:g}s; "
                                        "asked again soon")
        self.down[name] = now + DOWN_S  # this call is the probe; the others wait for its answer
        return name

    def failed(self, client: Any, key: str) -> None:
        """A call on ``key`` did not reach its node (refused, reset, timed out)."""
        try:
            name: str = client.get_node_from_key(key).name
        except Exception:
            return
        self.down[name] = time.monotonic() + DOWN_S

    def answered(self, name: str | None) -> None:
        if name is not None and self.down:
            self.down.pop(name, None)

    @asynccontextmanager
    async def through(self, client: Any, key: str) -> AsyncIterator[None]:
        """The calls of the ``async with`` body (a pipeline on ``key``'s node) pass the gate as one call."""
        node = self.check(client, key)
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError):
            self.failed(client, key)
            raise
        self.answered(node)
