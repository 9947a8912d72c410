"""Sharded pub/sub on a Redis Cluster read node by node: one reader task per node subscription, so a message is
seen the moment it arrives, and a dead or slow node delays no message of the others."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import redis

READ_S = 1.0  # one read's wait; a reader blocks only itself
RETRY_S = 0.5  # a node whose subscription fails is tried again this often (its reader alone waits)


class _Node(NamedTuple):
    name: str  # all get_sharded_message(target_node=...) reads of a node


class _Watch:
    """A node subscription's connect callback (redis-py keeps it as a weak method: ShardReaders holds it)."""

    def __init__(self, readers: ShardReaders, name: str) -> None:
        self.readers, self.name = readers, name

    def reconnected(self, connection: Any) -> Awaitable[None]:
        self.readers.resubscribed(self.name)
        # Its reply ends the idle wait now (it comes after the re-subscribe replies)
        sent: Awaitable[None] = connection.send_command("PING", b"ringfence-resubscribed", check_health=False)
        return sent


class ShardReaders:
    """Readers over redis-py's cluster pub/sub (``node_pubsub_mapping``: one subscription per node). ``pump``
    follows that mapping as redis-py changes it (a failover moves channels to the new master).

    ``reconnected`` collects the nodes whose subscription was re-established (its connection reconnected, or a
    subscription new since the first pump: channels moved there): messages sent to the old one may be lost, and
    ``on_resubscribed`` is told."""

    def __init__(self, pubsub: Any, on_resubscribed: Callable[[], None] | None = None) -> None:
        self.pubsub = pubsub
        self.inbox: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.failing: dict[str, float] = {}  # node name -> monotonic time its reads started failing
        self.reconnected: set[str] = set()
        self._on_resubscribed = on_resubscribed
        self._readers: dict[str, tuple[Any, asyncio.Task[None]]] = {}
        self._watches: dict[str, tuple[Any, _Watch]] = {}  # node name -> (connection, its callback)
        self._pumped = False

    def resubscribed(self, name: str) -> None:
        self.reconnected.add(name)
        self.arrived.set()  # the idle wait ends: the worker checks its leases now
        if self._on_resubscribed is not None:
            self._on_resubscribed()

    def pump(self) -> None:
        mapping = dict(getattr(self.pubsub, "node_pubsub_mapping", {}) or {})
        for name, (node_pubsub, task) in list(self._readers.items()):
            if mapping.get(name) is not node_pubsub or task.done():
                task.cancel()
                del self._readers[name]
                self.failing.pop(name, None)
        for name, node_pubsub in mapping.items():
            if name not in self._readers:
                if self._pumped:
                    self.resubscribed(name)
                task = asyncio.create_task(self._read(name, node_pubsub), name=f"wake-reader {name}")
                self._readers[name] = (node_pubsub, task)
            self._watch(name, node_pubsub)
        self._pumped = True

    def _watch(self, name: str, node_pubsub: Any) -> None:
        connection = getattr(node_pubsub, "connection", None)
        register = getattr(connection, "register_connect_callback", None)
        if register is None or self._watches.get(name, (None,))[0] is connection:
            return
        watch = _Watch(self, name)
        register(watch.reconnected)
        self._watches[name] = (connection, watch)

    def take(self) -> list[dict[str, Any]]:
        out, self.inbox = self.inbox, []
        self.arrived.clear()
        return out

    async def _read(self, name: str, node_pubsub: Any) -> None:
        node = _Node(name)
        # Until redis-py drops or replaces this node's subscription (a failover moved its channels): a read of a
        # node it no longer maps returns at once, without yielding to the event loop.
        while self.pubsub.node_pubsub_mapping.get(name) is node_pubsub:
            try:
                msg = await self.pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=READ_S,
                                                            target_node=node)
            except asyncio.CancelledError:
                raise
            except Exception:  # a node down, a subscription being moved: this node's reader alone waits
                self.failing.setdefault(name, time.monotonic())
                await asyncio.sleep(RETRY_S)
                continue
            self.failing.pop(name, None)
            if msg is not None:
                self.inbox.append(msg)
                self.arrived.set()
            else:
                await asyncio.sleep(0)  # a read that returned without waiting must not starve the loop
        self.failing.pop(name, None)
        self.arrived.set()  # the idle wait ends and pumps: the node's channels may have a new subscription

    async def close(self) -> None:
        for _, task in self._readers.values():
            task.cancel()
        for _, task in self._readers.values():
            with contextlib.suppress(asyncio.CancelledError, redis.RedisError, OSError):
                await task
        self._readers = {}
        self._watches = {}
