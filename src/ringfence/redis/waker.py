"""Idle workers sleep on a pub/sub wake channel instead of polling (sharded pub/sub on a Redis 7 Cluster: each
wake channel shares its queue's slot, so only that queue's node carries the message; each node's subscription is
read by its own task, shards.py, so one dead node delays no wake-up of the others)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Sequence
from typing import Any

import redis

from ringfence.models import Fetched
from ringfence.redis.broker import Broker
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.keys import QueueKeys
from ringfence.redis.raw_calls import told
from ringfence.redis.shards import RETRY_S, ShardReaders

BARRIER_S = 5.0  # the longest a re-subscribed worker waits for its PING's reply before it checks its leases
PRUNE_AT = 64  # pushed jobs remembered before those finished are forgotten (one HMGET per queue)


class Waker:
    """Lets an idle worker sleep until a job arrives, with no polling loop.

    The worker marks itself idle in each queue's ``idle`` set; scripts that make a job ready publish on
    the queue's wake channel only while someone is idle, so a busy system sends no messages.
    """

    def __init__(self, broker: Broker, worker_id: str, queues: Sequence[str]) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queues = list(queues)
        self.queue_keys: list[QueueKeys] = [broker.keys.queue(q) for q in queues]
        self._pubsub: Any = None
        # '<wake>:<worker>' -> queue: enqueue_ready.lua pushes a job leased to this worker on it
        self._own = {f"{k.wake}:{worker_id}": q for k, q in zip(self.queue_keys, queues, strict=True)}
        self.pushed: list[tuple[str, bytes]] = []  # (queue, message) read and not yet taken
        self.handed_back = 0
        # token -> (queue, id): pushed jobs taken (started), forgotten once their lease is gone (_forget_finished)
        self.taken: dict[str, tuple[str, str]] = {}
        self._prune_at = PRUNE_AT
        self.resubscribed = False  # the subscription was re-established: messages may have been lost (recover)
        self.recovered = 0  # pushed jobs found lost and handed back by recover()
        self.checks = 0  # recover() calls that checked the leases
        self._pings = 0
        self._shards: ShardReaders | None = None  # on a Cluster
        self._unsubscribed: list[str] = []  # cluster channels whose node did not answer the SSUBSCRIBE yet
        self._subscribe_at = 0.0

    def _on_reconnect(self, connection: Any) -> Awaitable[None]:
        """redis-py re-established the pub/sub connection (and re-subscribed on it): messages sent to the old one
        are lost, so the worker checks its leases (``recover``). A PING ends the idle wait now (its reply comes
        after the subscribe replies) instead of at the fallback timer."""
        self.resubscribed = True
        sent: Awaitable[None] = connection.send_command("PING", b"ringfence-resubscribed", check_health=False)
        return sent

    async def start(self) -> None:
        self._pubsub = self.broker.aio.pubsub(ignore_subscribe_messages=True)
        if self.broker.cluster:
            self._shards = ShardReaders(self._pubsub, self._shard_resubscribed)
            self._unsubscribed = [*[k.wake for k in self.queue_keys], *self._own]
            # A channel whose node does not answer (a master failing over) is tried again by each wait after
            # RETRY_S; the fetch loop serves its queue once the node is back, so a worker starts all the same.
            await self._subscribe_shards()
        else:
            await self._pubsub.subscribe(*[k.wake for k in self.queue_keys], *self._own)
            register = getattr(self._pubsub.connection, "register_connect_callback", None)
            if register is None:  # a reconnect goes unseen: its lost wake messages wait for the lease to lapse
                told("the wake channel's reconnects go unseen: redis-py has no register_connect_callback")
            else:
                register(self._on_reconnect)

    def _shard_resubscribed(self) -> None:
        self.resubscribed = True

    async def _subscribe_shards(self) -> bool:
        """SSUBSCRIBE each channel not subscribed yet, one by one: a node that does not answer keeps only its own
        queues' channels for a later try. True when at least one channel is subscribed."""
        left: list[str] = []
        for channel in self._unsubscribed:
            try:
                await self._pubsub.ssubscribe(channel)
            except (redis.RedisError, OSError):
                left.append(channel)
        done = len(left) < len(self.queue_keys) + len(self._own)
        self._unsubscribed = left
        self._subscribe_at = asyncio.get_running_loop().time()
        if self._shards is not None:
            self._shards.pump()
        return done

    async def mark_busy(self) -> None:
        if self.broker.cluster:  # one pipeline per queue: a dead node keeps only its own queues' marks
            await asyncio.gather(*(self._unmark(k) for k in self.queue_keys), return_exceptions=True)
            return
        async with self.broker.aio.pipeline(transaction=False) as p:
            for k in self.queue_keys:
                p.zrem(k.idle, self.worker_id)
                p.hdel(k.idle_lease, self.worker_id)
            await p.execute()

    async def _unmark(self, k: QueueKeys) -> None:
        # Through the node gate: a dead master's pipeline would cost each call a slot map reload and a 0.25 s sleep
        async with self.broker.gate.through(self.broker.aio, k.idle), \
                self.broker.aio.pipeline(transaction=False) as p:
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
        if msg["type"] == "pong":  # _on_reconnect's or recover's PING
            return
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
            job = Fetched(entry[:at].decode(), queue, entry[at:], int(attempt), token.decode(), now)
            self.taken[job.token] = (queue, job.id)
            out.append((job, int(deadline)))
        self.pushed = []
        return out

    async def hand_back(self, job: Fetched) -> bool:
        """Give a pushed job back at once, its attempt not counted (a no-op once its lease ran out). False when its
        node did not answer: that job waits for its lease to end (then the recoverer has it), and the caller goes on
        with the other jobs read with it (raising here left them all leased to this worker, unstarted)."""
        self.handed_back += 1
        self.taken.pop(job.token, None)
        try:
            await self.broker.arun(self.broker.requeue(job.queue, job.id, job.token, self.broker.clock(),
                                                       "handed_back"))
        except UNAVAILABLE:
            return False
        return True

    async def _wait_sharded(self, timeout_s: float) -> bool:
        # Each node's reader task fills the inbox; the wait ends at the first message (or the timeout).
        shards = self._shards
        assert shards is not None
        if self._unsubscribed and asyncio.get_running_loop().time() - self._subscribe_at >= RETRY_S:
            await self._subscribe_shards()
        shards.pump()
        if not shards.inbox and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shards.arrived.wait(), timeout_s)
        messages = shards.take()
        for msg in messages:
            self._keep(msg)
        return bool(messages)

    async def recover(self) -> None:
        """After the subscription was re-established: hand back at once the jobs pushed to this worker whose
        message was lost with the old connection (else they wait for their lease to run out and the recoverer).

        Its idle marks are removed first, so no job is pushed to it from then on (its next fetch marks it again);
        then it reads its subscription up to the reply of a PING sent after that, so every message published to
        it before is read. Each pushed lease in its name whose token it neither read nor holds was lost: one
        script per queue gives those back (hand_back_lost.lua), their attempt not counted. On a Cluster the same,
        node by node, for the queues whose channel a re-established node subscription carries (``_recover_shards``)."""
        self.resubscribed = False  # a reconnect from here on sets it again
        if self._pubsub is None:
            return
        if self.broker.cluster:
            await self._recover_shards()
            return
        await self.mark_busy()
        if not await self._read_through():
            self.resubscribed = True  # the reply was lost with yet another connection: checked next time
            return
        await self._forget_finished()
        held = [*self.taken]
        for _, message in self.pushed:
            held.append(message.split(b" ", 3)[2].decode())
        for queue in self.queues:
            ids = await self.broker.arun(self.broker.hand_back_lost(queue, self.worker_id, held))
            self.recovered += len(ids)
        self.checks += 1

    async def _recover_shards(self) -> None:
        shards = self._shards
        if shards is None:
            return
        nodes, shards.reconnected = shards.reconnected, set()
        on = self._queues_on(nodes)
        failed: set[str] = set()
        unmarked = await asyncio.gather(*(self._unmark(self.queue_keys[i]) for i in on), return_exceptions=True)
        for i, result in zip(list(on), unmarked, strict=True):
            if isinstance(result, BaseException):
                failed.add(on.pop(i))
        failed |= await self._read_shards_through(set(on.values()) - failed)
        await self._forget_finished()
        held = [*self.taken]
        for _, message in self.pushed:
            held.append(message.split(b" ", 3)[2].decode())
        for i, name in on.items():
            if name in failed:
                continue
            try:
                ids = await self.broker.arun(self.broker.hand_back_lost(self.queues[i], self.worker_id, held))
            except UNAVAILABLE:
                failed.add(name)
                continue
            self.recovered += len(ids)
        if failed:  # checked next time
            shards.reconnected |= failed
            self.resubscribed = True
        self.checks += 1

    def _queues_on(self, nodes: set[str]) -> dict[int, str]:
        """Queue index -> the node of ``nodes`` whose subscription carries its own channel. A channel not
        subscribed yet is left out: its subscription, once made, is a new one and asks for a check then."""
        mapping = getattr(self._pubsub, "node_pubsub_mapping", {})
        on: dict[int, str] = {}
        for i, channel in enumerate(self._own):
            try:
                name = self.broker.aio.get_node_from_key(channel).name  # type: ignore[attr-defined]
            except redis.RedisError:  # its slot not covered (a failover under way): checked next time
                assert self._shards is not None
                self._shards.reconnected |= nodes
                self.resubscribed = True
                continue
            if name in nodes and name in mapping and channel not in self._unsubscribed:
                on[i] = name
        return on

    async def _read_shards_through(self, nodes: set[str]) -> set[str]:
        """Read the subscriptions of ``nodes`` up to the reply of a PING sent on each: every message published to
        this worker there before is read. Returns the nodes whose reply did not come in time."""
        shards = self._shards
        assert shards is not None
        mapping = getattr(self._pubsub, "node_pubsub_mapping", {})
        left: dict[bytes, str] = {}
        failed: set[str] = set()
        for name in nodes:
            self._pings += 1
            marker = f"ringfence-barrier-{self._pings}".encode()
            try:
                await mapping[name].ping(marker)
            except (redis.RedisError, OSError, KeyError):
                failed.add(name)
            else:
                left[marker] = name
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BARRIER_S
        while left:
            shards.pump()
            for msg in shards.take():
                if msg["type"] == "pong" and msg["data"] in left:
                    del left[msg["data"]]
                else:
                    self._keep(msg)
            wait_s = deadline - loop.time()
            if not left or wait_s <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(shards.arrived.wait(), wait_s)
        return failed | set(left.values())

    async def _read_through(self) -> bool:
        """Read every message published to this worker before now: a PING's reply comes after them."""
        self._pings += 1
        marker = f"ringfence-barrier-{self._pings}".encode()
        await self._pubsub.ping(marker)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BARRIER_S
        while (left := deadline - loop.time()) > 0:
            msg = await self._pubsub.get_message(timeout=left)
            if msg is None:
                break
            if msg["type"] == "pong" and msg["data"] == marker:
                return True
            self._keep(msg)
        return False

    async def forget_finished(self) -> None:
        """Forget the taken pushed jobs whose lease their token no longer holds (acked, retried, requeued): what
        ``recover`` must never hand back stays remembered (a job finished but not acked yet holds its lease)."""
        if len(self.taken) >= self._prune_at:
            await self._forget_finished()

    async def _forget_finished(self) -> None:
        taken = list(self.taken.items())
        if self.broker.cluster:  # one pipeline per queue: a dead node's jobs stay remembered, the others pruned
            by_queue: dict[str, list[tuple[str, tuple[str, str]]]] = {}
            for item in taken:
                by_queue.setdefault(item[1][0], []).append(item)
            await asyncio.gather(*(self._forget(items) for items in by_queue.values()), return_exceptions=True)
        elif taken:
            await self._forget(taken)
        self._prune_at = max(PRUNE_AT, 2 * len(self.taken))

    async def _forget(self, taken: list[tuple[str, tuple[str, str]]]) -> None:
        lease = self.broker.keys.queue(taken[0][1][0]).lease  # one queue's (a Cluster), or all on one Redis
        async with self.broker.gate.through(self.broker.aio, lease), \
                self.broker.aio.pipeline(transaction=False) as p:
            for _, (queue, job_id) in taken:
                p.hget(self.broker.keys.queue(queue).lease, job_id)
            holders = await p.execute()
        for (token, entry), holder in zip(taken, holders, strict=True):
            if holder != token.encode() and self.taken.get(token) is entry:
                del self.taken[token]

    async def restart(self) -> None:
        """Subscribe again after a lost connection (errors are left for the next cycle to report). On a Cluster
        only the channels whose node did not answer: each node's subscription reconnects by itself."""
        if self.broker.cluster and self._pubsub is not None:
            if self._unsubscribed:
                await self._subscribe_shards()
            return
        old, self._pubsub = self._pubsub, None
        if old is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                await self._close(old)
        try:
            await self.start()
        except (redis.RedisError, OSError):
            self._pubsub = None
        else:
            self.resubscribed = not self.broker.cluster  # messages sent to the old connection may be lost

    async def _close(self, pubsub: Any) -> None:
        deregister = getattr(pubsub.connection, "deregister_connect_callback", None)
        if deregister is not None and not self.broker.cluster:  # the connection goes back to the pool
            deregister(self._on_reconnect)
        if self._shards is not None:
            await self._shards.close()
            self._shards = None
        await pubsub.aclose()

    async def close(self) -> None:
        if self._pubsub is not None:
            try:
                await self.mark_busy()  # no job is pushed to this worker after it
                if not self.broker.cluster:  # jobs pushed before it and not read yet go back to their queue
                    while (msg := await self._pubsub.get_message(timeout=0.05)) is not None:
                        self._keep(msg)
                for job, _ in self.take():
                    await self.hand_back(job)
                await self._close(self._pubsub)
            except (redis.RedisError, OSError, asyncio.CancelledError):
                pass
            self._pubsub = None
