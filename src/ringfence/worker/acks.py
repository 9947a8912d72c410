"""Settle, the happy path: acks are batched per queue and sent by one background flusher, so a busy worker
sends one script call per queue and batch instead of one per job. A batch is sent once it holds ``batch`` acks
or its first ack has waited ``wait_s`` (a finished job's ack follows it by that much at most)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Coroutine
from typing import Any

from ringfence.offloop import HOP
from ringfence.redis.broker import Broker
from ringfence.redis.connect import while_loading
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.replicas import run_and_wait

log = logging.getLogger("ringfence.worker")


#: Acks kept after they were sent, to check once Redis fails over: a replica promoted in its master's place lacks
#: the writes of about the last replication lag.
SENT_KEPT_S = 10.0
SENT_KEPT_MAX = 100_000  # at most this many (the newest): a bounded memory at any rate
#: A check after a failover whose queue's node does not answer yet is tried again this often.
CHECK_AGAIN_S = 0.5
#: At a stop, acks a node did not take are sent again for this long at most: a Sentinel failover takes 3-4 s, a
#: Cluster's the node timeout and an election.
STOP_RETRY_S = 5.0


class Acks:
    def __init__(self, broker: Broker, batch: int = 1, wait_s: float = 0.002) -> None:
        self.broker = broker
        self.batch, self.wait_s = batch, wait_s
        self._pending: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self._raw: dict[tuple[str, str], bytes] = {}  # (id, token) -> the fetched spec, for the inline entry
        # (monotonic, queue, id, token, spec) of the acks sent in the last SENT_KEPT_S
        self._sent: deque[tuple[float, str, str, str, bytes]] = deque(maxlen=SENT_KEPT_MAX)
        self._checks: set[asyncio.Task[object]] = set()
        self._resent: set[tuple[str, str]] = set()  # (id, token) of acks kept after a flush that failed
        self._unchecked_since: float | None = None  # a failure whose check has not run: _sent is kept from before it
        self._count = 0  # acks pending, all queues
        self._ready = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one flush at a time: stop() waits for the flusher's call in flight

    def add(self, queue: str, job_id: str, token: str, raw: bytes = b"") -> None:
        self._pending[queue].append((job_id, token))
        self._raw[(job_id, token)] = raw
        self._count += 1
        if self._count >= self.batch:
            self._ready.set()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.wait_s, self._ready.set)

    def start(self) -> None:
        self._flusher = asyncio.create_task(self._loop(), name="acker")
        loop = asyncio.get_running_loop()

        def recovered(since: float) -> None:  # before the call that saw Redis answer returns, so before a prune
            held = self._unchecked_since
            self._unchecked_since = since if held is None else min(held, since)
            loop.call_soon_threadsafe(self._check_after, since)

        self.broker.health.on_recovered.append(recovered)

    async def stop(self, lease_s: float) -> None:
        """Send what is pending, then stop the flusher: a call the flusher has in flight ends first (cancelled, it
        would leave its jobs leased, acked or not). A Redis loading its data is waited for: a lost ack runs the
        job again. A node that does not answer (a master failing over) is asked again for up to ``STOP_RETRY_S``
        and never past the jobs' lease; then the jobs not acked are named and the stop goes on, its exit code
        unchanged: they run again once their leases lapse."""
        deadline = time.monotonic() + min(lease_s, STOP_RETRY_S)
        while True:
            try:
                await while_loading(self.flush, self.broker.health, self.broker.connection.first_connect_s)
                break
            except UNAVAILABLE as exc:
                self.broker.health.lost(exc)
                if time.monotonic() >= deadline:
                    ids = [job_id for pairs in self._pending.values() for job_id, _ in pairs]
                    log.warning("shutdown: the ack of %d job(s) did not reach Redis (%s: %s); they run again once "
                                "their leases lapse: %s", len(ids), type(exc).__name__, exc, " ".join(ids[:20]))
                    break
                await asyncio.sleep(0.2)
        if self._flusher is not None:
            self._flusher.cancel()
        if self._checks:  # a rerun's record is worth a short wait
            await asyncio.wait(list(self._checks), timeout=STOP_RETRY_S)

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
            self._keep_sent(queue, pairs, set(lost))
            if lost:
                log.warning("ack of %d job(s) in %s refused: their lease had moved to another attempt: %s",
                            len(lost), queue, " ".join(lost[:10]))
        if error is not None:
            self._keep(pending)
            raise error

    def sent(self, queue: str, job_id: str, token: str, raw: bytes, at: float) -> None:
        """An ack sent at ``at`` (monotonic) by settle.py's confirmed ack, checked after a failover as the batch's
        are; ``at`` is before the call, so a failure the call itself saw is after it."""
        self._sent.append((at, queue, job_id, token, raw))

    def _keep_sent(self, queue: str, pairs: list[tuple[str, str]], lost: set[str]) -> None:
        now, wall_ms = time.monotonic(), int(time.time() * 1000)
        refused: list[tuple[str, str, bytes, int]] = []
        for job_id, token in pairs:
            raw = self._raw.pop((job_id, token), b"")
            resent = bool(self._resent) and (job_id, token) in self._resent  # empty unless a flush failed
            if resent:
                self._resent.discard((job_id, token))
            if job_id not in lost:
                self._sent.append((now, queue, job_id, token, raw))
            elif resent:
                refused.append((job_id, token, raw, wall_ms))
        kept_from = (now if self._unchecked_since is None else min(now, self._unchecked_since)) - SENT_KEPT_S
        while self._sent and self._sent[0][0] < kept_from:
            self._sent.popleft()
        if refused:  # sent again after a failure and refused: the master answering now never had the fetch
            self._spawn(self._check(queue, refused))

    def _check_after(self, since: float) -> None:
        """Redis answers again after failing at ``since``: check the acks sent shortly before (a failover may
        have lost them), in the background."""
        self._spawn(self.check_lost(since))

    def _spawn(self, check: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(check)
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def check_lost(self, since: float) -> None:
        """Record the jobs whose ack, sent before ``since``, the master answering now does not have: they run
        again (ack_lost.lua); the ones still leased to this worker are acked again. A queue whose node does not
        answer yet is asked again every ``CHECK_AGAIN_S`` for up to ``SENT_KEPT_S``; a checked ack is not checked
        again."""
        deadline = time.monotonic() + SENT_KEPT_S
        while True:
            by_queue: dict[str, list[tuple[str, str, bytes, int]]] = defaultdict(list)
            wall_ms, now = int(time.time() * 1000), time.monotonic()
            for at, queue, job_id, token, raw in self._sent:
                if at <= since:
                    by_queue[queue].append((job_id, token, raw, wall_ms - int((now - at) * 1000)))
            checked: set[tuple[str, str]] = set()
            for queue, sent in by_queue.items():
                if await self._check(queue, sent):
                    checked.update((queue, s[0]) for s in sent)
            if checked:
                self._sent = deque((e for e in self._sent if (e[1], e[2]) not in checked), maxlen=SENT_KEPT_MAX)
            if len(checked) == sum(map(len, by_queue.values())) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(CHECK_AGAIN_S)
        if self._unchecked_since is not None and self._unchecked_since <= since:
            self._unchecked_since = None

    async def _check(self, queue: str, sent: list[tuple[str, str, bytes, int]]) -> bool:
        """ack_lost.lua on ``sent`` (id, token, spec, finished ms); False when the queue's node does not answer."""
        try:
            rerun, ours = await self.broker.arun(self.broker.ack_lost(queue, sent[0][1].rpartition(".")[0], sent))
        except UNAVAILABLE:
            return False
        except Exception as exc:  # a check that cannot run costs a record, never the worker
            log.warning("the check of %d ack(s) of %s sent before Redis failed did not run (%s: %s)", len(sent),
                        queue, type(exc).__name__, exc)
        else:
            self._rerun(queue, sent, rerun, ours)
        return True

    def _rerun(self, queue: str, sent: list[tuple[str, str, bytes, int]], rerun: list[str], ours: list[str]) -> None:
        if rerun:
            log.warning("%d job(s) of %s acked just before Redis failed over are queued again (their ack was "
                        "lost): they run again, recorded in their history (ack_lost): %s", len(rerun), queue,
                        " ".join(rerun[:10]))
        raws = {s[0]: (s[1], s[2]) for s in sent}
        for job_id in ours:
            self.add(queue, job_id, *raws[job_id])

    def _keep(self, pending: dict[str, list[tuple[str, str]]]) -> None:
        """What was not acked goes into the next flush."""
        for queue, left in pending.items():
            self._pending[queue].extend(left)
            self._resent.update(left)
            self._count += len(left)


class ConfirmedAcks:
    """The acks of ``durable_settle`` tasks: each waits until a replica confirms it. The acks that come in while a
    batch waits for its replicas go together in the next one: one script call and one ``WAIT`` per queue and batch,
    off the event loop. ``acks`` keeps the unconfirmed ones for its check after a failover."""

    def __init__(self, acks: Acks, replicas: int, timeout_ms: int) -> None:
        self.acks, self.broker = acks, acks.broker
        self.replicas, self.timeout_ms = replicas, timeout_ms
        self._waiting: dict[str, list[tuple[str, str, bytes, asyncio.Future[tuple[bool, int]]]]] = defaultdict(list)
        self._ready = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None

    async def ack(self, queue: str, job_id: str, token: str, raw: bytes) -> tuple[bool, int]:
        """Ack and wait: (refused: the lease had moved on, replicas that confirmed; -1: Redis did not answer)."""
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._loop(), name="confirmed-acker")
        done: asyncio.Future[tuple[bool, int]] = asyncio.get_running_loop().create_future()
        self._waiting[queue].append((job_id, token, raw, done))
        self._ready.set()
        return await done

    async def _loop(self) -> None:
        while self._waiting:
            await self._ready.wait()
            self._ready.clear()
            batch, self._waiting = self._waiting, defaultdict(list)
            for queue, items in batch.items():
                await self._send(queue, items)

    async def _send(self, queue: str, items: list[tuple[str, str, bytes, asyncio.Future[tuple[bool, int]]]]) -> None:
        at = time.monotonic()
        call = self.broker.ack(queue, [(i[0], i[1]) for i in items])
        try:
            lost, acked = await HOP.run(run_and_wait, self.broker, call, self.replicas, self.timeout_ms)
        except UNAVAILABLE:  # the ack may have run on a master that then died: checked once Redis answers
            lost, acked = [], -1
        except Exception as exc:
            for *_, done in items:
                if not done.done():  # a settle cancelled meanwhile (a shutdown) no longer waits
                    done.set_exception(exc)
            return
        refused = set(lost)
        for job_id, token, raw, done in items:
            if job_id not in refused and acked < self.replicas:
                self.acks.sent(queue, job_id, token, raw, at)
            if not done.done():
                done.set_result((job_id in refused, acked))
