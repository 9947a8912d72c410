"""Idle workers sleep on a pub/sub wake channel instead of polling (sharded pub/sub on a Redis 7 Cluster: each
wake channel shares its queue's slot, so only that queue's node carries the message)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import redis

from ringfence.models import Fetched
from ringfence.redis.broker import Broker
from ringfence.redis.keys import QueueKeys


class Waker:
    """Lets an idle worker sleep until a job arrives, with no polling loop.

    The worker marks itself idle in each queue's ``idle`` set; scripts that make a job ready publish on
    the queue's wake channel only while someone is idle, so a busy system sends no messages.
    """

    def __init__(self, broker: Broker, worker_id: str, queues: Sequence[str]) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queue_keys: list[QueueKeys] = [broker.keys.queue(q) for q in queues]
        self._pubsub: Any = None
        # '<wake>:<worker>' -> queue: enqueue_ready.lua pushes a job leased to this worker on it
        self._own = {f"{k.wake}:{worker_id}": q for k, q in zip(self.queue_keys, queues, strict=True)}
        self.pushed: list[tuple[str, bytes]] = []  # (queue, message) read and not yet taken
        self.handed_back = 0

    async def start(self) -> None:
        self._pubsub = self.broker.aio.pubsub(ignore_subscribe_messages=True)
        if self.broker.cluster:
            await self._pubsub.ssubscribe(*[k.wake for k in self.queue_keys], *self._own)
        else:
            await self._pubsub.subscribe(*[k.wake for k in self.queue_keys], *self._own)

    async def mark_busy(self) -> None:
        async with self.broker.aio.pipeline(transaction=False) as p:
            for k in self.queue_keys:
                p.zrem(k.idle, self.worker_id)
                p.hdel(k.idle_lease, self.worker_id)
            await p.execute()

    async def wait(self, timeout_s: float) -> bool:
        """True when woken by a message, False on timeout. Drains queued messages."""
        if self._pubsub is None:
            await self.start()
        if self.broker.cluster:
            return await self._wait_sharded(timeout_s)
        msg = await self._pubsub.get_message(timeout=timeout_s)
        woke = msg is not None
        while msg is not None:
            self._keep(msg)
            msg = await self._pubsub.get_message(timeout=0)
        return woke

    def _keep(self, msg: dict[str, Any]) -> None:
        queue = self._own.get(msg["channel"].decode())
        if queue is not None:
            self.pushed.append((queue, msg["data"]))

    def take(self) -> list[tuple[Fetched, int]]:
        """The jobs leased to this worker by wake messages read so far, each with its lease deadline (ms)."""
        out: list[tuple[Fetched, int]] = []
        now = self.broker.clock()
        for queue, message in self.pushed:
            attempt, deadline, token, entry = message.split(b" ", 3)
            at = entry.index(b"{")
            out.append((Fetched(entry[:at].decode(), queue, entry[at:], int(attempt), token.decode(), now),
                        int(deadline)))
        self.pushed = []
        return out

    async def hand_back(self, job: Fetched) -> None:
        """Give a pushed job back at once, its attempt not counted (a no-op once its lease ran out)."""
        self.handed_back += 1
        await self.broker.arun(self.broker.requeue(job.queue, job.id, job.token, self.broker.clock(),
                                                   "handed_back"))

    async def _wait_sharded(self, timeout_s: float) -> bool:
        # One connection per node owning a wake channel; read each briefly in turn until the deadline.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        woke = False
        while True:
            step = max(0.0, min(0.05, deadline - loop.time()))
            msg = await self._pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=step)
            if msg is not None:
                self._keep(msg)
            woke = woke or msg is not None
            if msg is None and not self._pubsub.node_pubsub_mapping:
                await asyncio.sleep(step)  # no node subscribed (yet): do not spin
            if (woke and msg is None) or (not woke and loop.time() >= deadline):
                return woke

    async def restart(self) -> None:
        """Subscribe again after a lost connection (errors are left for the next cycle to report)."""
        old, self._pubsub = self._pubsub, None
        if old is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                await old.aclose()
        try:
            await self.start()
        except (redis.RedisError, OSError):
            self._pubsub = None

    async def close(self) -> None:
        if self._pubsub is not None:
            try:
                await self.mark_busy()  # no job is pushed to this worker after it
                if not self.broker.cluster:  # jobs pushed before it and not read yet go back to their queue
                    while (msg := await self._pubsub.get_message(timeout=0.05)) is not None:
                        self._keep(msg)
                for job, _ in self.take():
                    await self.hand_back(job)
                await self._pubsub.aclose()
            except (redis.RedisError, OSError, asyncio.CancelledError):
                pass
            self._pubsub = None
