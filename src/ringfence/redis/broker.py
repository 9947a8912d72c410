"""The only code that talks to Redis (with ``reads.py``, the reads of job keys it mixes in).

Each job transition is one Lua script (``lua/<name>.lua``). An operation is built once as a ``Call``
(script, keys, args, parser) and run by either client: ``broker.run(call)`` (sync, for producers and the
CLI) or ``await broker.arun(call)`` (the worker). Time arrives from the caller's clock: by default the Redis
server's (``clock.py``), in tests a simulated one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import orjson
import redis
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, NoScriptError, OutOfMemoryError

from ringfence.redis.admin import Admin
from ringfence.redis.call import Call, as_text, as_texts
from ringfence.redis.clock import ServerClock
from ringfence.redis.connect import check_url
from ringfence.redis.connection import (
    UNAVAILABLE,
    ConnectionSettings,
    Health,
    RedisClients,
    full_error,
    not_permitted,
    url_clients,
)
from ringfence.redis.keys import INLINE_MAX_BYTES, Keys
from ringfence.redis.node_gate import NodeGate
from ringfence.redis.raw_calls import AsyncDirectCalls, DirectCalls
from ringfence.redis.reads import Reads
from ringfence.redis.ready import ReadyEnqueue
from ringfence.redis.scripts import PROBE, script

T = TypeVar("T")

__all__ = ["Broker", "Call"]


def _json_object(raw: Any) -> dict[str, Any] | None:
    try:
        found = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def _enqueued(raw: Any) -> list[bool | str]:
    return [x.decode() if isinstance(x, bytes) else bool(x) for x in raw]


def _fetched(raw: Any) -> list[tuple[str, bytes, int]]:
    """(id, spec, attempt) per job; attempt 0 marks a dangling id (queued without a record: dropped, counted)."""
    raw = raw or []
    return [(as_text(raw[i]), raw[i + 1], int(raw[i + 2])) for i in range(0, len(raw), 3)]


def _shown(script_name: str) -> str:
    """The operation a script does, for messages: enqueue_ready.lua is an enqueue too."""
    return "enqueue" if script_name == "enqueue_ready" else script_name


def _fetched_marking(raw: Any) -> tuple[list[tuple[str, bytes, int]], bool]:
    """fetch.lua's answer with a worker id: the jobs, then whether the queue was left empty."""
    return _fetched(raw[:-1]), bool(int(raw[-1]))


def _compiles(probe: Callable[[], Any]) -> bool:
    try:
        probe()
    except redis.ResponseError:
        return False  # Redis < 7: a shebang line is a syntax error
    return True


async def _acompiles(probe: Any) -> bool:
    try:
        await probe
    except redis.ResponseError:
        return False
    return True


class Broker(Reads, Admin):
    """Redis operations of one namespace. Clients are created lazily; both share nothing but keys."""

    def __init__(self, url: str, namespace: str = "ringfence", clock: Callable[[], int] | None = None,
                 connection: ConnectionSettings | None = None, clients: RedisClients | None = None) -> None:
        self.connection = connection or ConnectionSettings()
        self._freed_key_slots: dict[str, list[tuple[str, str]]] = {}  # queue -> (key, holder): free_key_slot
        if clients is None:
            check_url(url)
            clients = url_clients(url, self.connection)
        self.url = url or clients.name
        self.clients = clients
        self.cluster = clients.cluster
        self.keys = Keys(namespace, cluster=self.cluster)
        self.health = Health(self.url)
        self.server_clock = ServerClock(lambda: self.sync)
        self.clock: Callable[[], int] = clock or self.server_clock
        self._simulated = clock is not None
        self._shebang: bool | None = None  # does the server take script flags (Redis 7+)? probed once
        self._sync: redis.Redis | None = None
        self._aio: aioredis.Redis | None = None
        self._direct: DirectCalls | None = None
        self._direct_checked = False  # is the sync client a plain one (redis/raw_calls.py)? asked once
        self._adirect: AsyncDirectCalls | None = None
        self._adirect_checked = False  # the same for the asyncio client
        self.gate = NodeGate()  # a Cluster node that just failed a call is asked again once per DOWN_S
        self.sync_gate = NodeGate()  # the same for the sync client (producers' calls, from any thread)

    def precise_ms(self) -> float:
        """Now in ms with µs precision (the injected clock as is, when one was given)."""
        if self._simulated:
            return float(self.clock())
        return int(self.server_clock.precise() * 1000 + 0.5) / 1000  # round(x, 3) in a fifth of its time

    # -- clients -------------------------------------------------------------------------------
    @property
    def sync(self) -> redis.Redis:
        if self._sync is None:
            self._sync = self.clients.sync()
        return self._sync

    @property
    def aio(self) -> aioredis.Redis:
        if self._aio is None:
            self._aio = self.clients.aio()
        return self._aio

    def memory_infos(self, nodes: Any = "primaries") -> list[dict[str, Any]]:
        """``INFO memory`` of every primary (one on a single Redis): maxmemory is per node on a cluster. ``nodes``:
        the cluster nodes to ask instead (the doctor leaves out a master that does not answer)."""
        if not self.cluster:
            return [self.sync.info("memory")]
        found: Any = self.sync.info("memory", target_nodes=nodes)
        return list(found.values())

    def _node_memory(self, key: str) -> dict[str, Any]:
        if not self.cluster:
            return self.sync.info("memory")
        node = self.sync.get_node_from_key(key)  # type: ignore[attr-defined]
        return self.sync.info("memory", target_nodes=node)

    async def _anode_memory(self, key: str) -> dict[str, Any]:
        if not self.cluster:
            return await self.aio.info("memory")
        node = self.aio.get_node_from_key(key)  # type: ignore[attr-defined]
        return await self.aio.info("memory", target_nodes=node)

    async def aping(self) -> None:
        """One round trip that also measures the offset to the Redis clock (worker start, heartbeat)."""
        try:
            await self.server_clock.ameasure(self.aio)
        except UNAVAILABLE as exc:
            if not isinstance(exc, redis.AuthenticationError):  # a refused login is reported by the caller
                await self._unavailable(exc)
            raise
        self.health.ok()

    async def _unavailable(self, exc: Exception) -> None:
        self.health.lost(exc)
        if isinstance(exc, redis.TimeoutError):
            # A socket that stops answering (half-open: NAT, failover) rarely dies alone: drop every pooled
            # connection so the next call opens a fresh one instead of waiting out a timeout per connection.
            pool = getattr(self.aio, "connection_pool", None)  # a cluster client keeps one pool per node
            if pool is not None:
                await pool.disconnect()

    def supports_flags(self, node: Any = None) -> bool:
        """Does the server take script flags (Redis 7+)? Probed once, on ``node`` (a Cluster node's client) when
        given, else through the client."""
        if self._shebang is None:
            on = self.sync if node is None else node
            self._shebang = _compiles(lambda: on.eval(PROBE, 0))
        return self._shebang

    def direct(self) -> DirectCalls | None:
        """The sync client's kept connections (raw_calls.py); None when it is not a plain client."""
        if not self._direct_checked:
            self._direct = DirectCalls(self.sync) if DirectCalls.usable(self.sync) else None
            self._direct_checked = True
        return self._direct

    def adirect(self) -> AsyncDirectCalls | None:
        """The asyncio client's kept connections (raw_calls.py); None when it is not a plain client."""
        if not self._adirect_checked:
            self._adirect = AsyncDirectCalls(self.aio) if AsyncDirectCalls.usable(self.aio) else None
            self._adirect_checked = True
        return self._adirect

    def ready_enqueue(self, queue: str) -> ReadyEnqueue | None:
        """``enqueue`` + ``run`` of one job ready now, generated id, no unique key and an inline-sized spec, packed
        ahead (ready.py); None on a client that is not plain (Cluster, Sentinel, a custom one)."""
        return ReadyEnqueue(self, self.keys.queue(queue), self.supports_flags()) if self.direct() is not None else None

    def run(self, call: Call[T], report: bool = True) -> T:
        """Run ``call``; ``report=False``: an unreachable Redis is left to the caller to report (no log line)."""
        node = self.sync_gate.check(self.sync, call.keys[0]) if self.cluster and call.keys else None
        try:
            source, sha = script(call.name).for_server(self.supports_flags(), self.cluster)
            direct = self._direct if self._direct_checked else self.direct()
            try:
                raw = (direct.call("EVALSHA", sha, len(call.keys), *call.keys, *call.args) if direct is not None
                       else self.sync.evalsha(sha, len(call.keys), *call.keys, *call.args))
            except NoScriptError:
                self._load(source, call.keys)
                raw = (direct.call("EVALSHA", sha, len(call.keys), *call.keys, *call.args) if direct is not None
                       else self.sync.evalsha(sha, len(call.keys), *call.keys, *call.args))
        except OutOfMemoryError as exc:
            raise full_error(_shown(call.name), self._node_memory(call.keys[0] if call.keys else "")) from exc
        except NoPermissionError as exc:
            raise not_permitted(_shown(call.name), exc) from exc
        except UNAVAILABLE as exc:
            if self.cluster and call.keys and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                self.sync_gate.failed(self.sync, call.keys[0])
            if report:
                self.health.lost(exc)
            raise
        self.sync_gate.answered(node)
        if report:
            self.health.ok()
        return call.parse(raw)

    async def arun(self, call: Call[T]) -> T:
        node = self.gate.check(self.aio, call.keys[0]) if self.cluster and call.keys else None
        try:
            if self._shebang is None:
                self._shebang = await _acompiles(self.aio.eval(PROBE, 0))
            source, sha = script(call.name).for_server(self._shebang, self.cluster)
            direct = self._adirect if self._adirect_checked else self.adirect()
            try:
                raw = (await direct.call("EVALSHA", sha, len(call.keys), *call.keys, *call.args) if direct is not None
                       else await self.aio.evalsha(sha, len(call.keys), *call.keys, *call.args))
            except NoScriptError:
                await self._aload(source, call.keys)
                raw = (await direct.call("EVALSHA", sha, len(call.keys), *call.keys, *call.args) if direct is not None
                       else await self.aio.evalsha(sha, len(call.keys), *call.keys, *call.args))
        except OutOfMemoryError as exc:
            raise full_error(_shown(call.name), await self._anode_memory(call.keys[0] if call.keys else "")) from exc
        except NoPermissionError as exc:
            raise not_permitted(_shown(call.name), exc) from exc
        except UNAVAILABLE as exc:
            if self.cluster and call.keys and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                self.gate.failed(self.aio, call.keys[0])
            await self._unavailable(exc)
            raise
        self.gate.answered(node)
        self.health.ok()
        return call.parse(raw)

    def _load(self, source: str, keys: Sequence[str]) -> None:
        """Load a script Redis answered NOSCRIPT for. On a Cluster only on the node that answered (the one owning
        the call's keys): SCRIPT LOAD alone goes to every master, and one of them down would fail the call."""
        if self.cluster and keys:
            node = self.sync.get_node_from_key(keys[0])  # type: ignore[attr-defined]
            self.sync.execute_command("SCRIPT LOAD", source, target_nodes=node)  # type: ignore[no-untyped-call]
        else:
            self.sync.script_load(source)

    async def _aload(self, source: str, keys: Sequence[str]) -> None:
        """:meth:`_load` on the asyncio client."""
        if self.cluster and keys:
            node = self.aio.get_node_from_key(keys[0])  # type: ignore[attr-defined]
            await self.aio.execute_command("SCRIPT LOAD", source, target_nodes=node)  # type: ignore[no-untyped-call]
        else:
            await self.aio.script_load(source)

    async def aclose(self) -> None:
        if self._adirect is not None:
            await self._adirect.close()
        self._adirect, self._adirect_checked = None, False
        if self._aio is not None:
            await self._aio.aclose()
            self._aio = None

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        self._direct, self._direct_checked = None, False
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    # -- transitions ----------------------------------------------------------------------------
    def enqueue(self, queue: str, jobs: Iterable[tuple[str, bytes, int] | tuple[str, bytes, int, str, int]],
                inline: bool = False) -> Call[list[bool | str]]:
        """jobs: (id, spec, run-at ms or 0[, unique key, unique hold end ms]). Parses to one value per job:
        True = added, False = the id existed, a str = the id of the job holding the unique key. ``inline``: the
        caller generated the ids and waits on no result, so the jobs ready now without a unique key and with a
        spec of at most ``INLINE_MAX_BYTES`` are stored in the pending list itself (keys.py)."""
        k = self.keys.queue(queue)
        jobs = list(jobs)
        if inline and all(j[2] == 0 and len(j[1]) <= INLINE_MAX_BYTES and (len(j) == 3 or j[3] == "") for j in jobs):
            # The common case: every job goes inline into pending, in three Redis calls (enqueue_ready.lua); one
            # with a concurrency key straight to its key's list
            keys = [k.pending, k.idle, k.stats, k.jobs, k.active, k.lease, k.attempts, k.idle_lease]
            if any(b',"ck":"' in j[1] for j in jobs):
                keys.append(self.keys.keyed(queue))
            return Call("enqueue_ready", keys, [k.wake, self.clock(), *[j[0].encode() + j[1] for j in jobs]],
                        _enqueued)
        args: list[Any] = [self.clock(), k.wake, INLINE_MAX_BYTES if inline else 0]
        for job in jobs:
            args += [*job, "", 0] if len(job) == 3 else list(job)
        return Call("enqueue", [k.jobs, k.pending, k.scheduled, k.idle, k.stats, k.unique, k.unique_exp], args,
                    _enqueued)

    def debounce(self, queue: str, job: tuple[str, bytes, int], key: str, max_wait_ms: int, replace: str
                 ) -> Call[tuple[str, bool]]:
        """job: (id, spec, run-at ms). Parses to (id, added): the new job's id, or the id of the scheduled job
        holding ``key`` whose spec and/or run-at this call replaced (lua/debounce.lua)."""
        k = self.keys.queue(queue)
        return Call("debounce", [k.jobs, k.scheduled, k.stats, k.debounce, k.debounce_at],
                    [self.clock(), *job, key, max_wait_ms, replace], lambda raw: (as_text(raw[0]), bool(raw[1])))

    def cron(self, queue: str, name: str, ticks: Iterable[tuple[int, str, bytes]], skip_to_ms: int = 0
             ) -> Call[list[int]]:
        """Enqueue due ticks (ascending) of periodic ``name`` once each; mark ``skip_to_ms`` handled."""
        k = self.keys.queue(queue)
        args: list[Any] = [self.clock(), k.wake, name, skip_to_ms]
        for tick in ticks:
            args += list(tick)
        return Call("cron", [k.jobs, k.pending, k.idle, k.stats, k.cron], args, lambda raw: [int(x) for x in raw])

    async def acron_last(self, queue: str, name: str) -> int | None:
        raw = await self.aio.hget(self.keys.queue(queue).cron, name)
        return int(raw) if raw else None

    def breaker_allow(self, dependency: str, rate_per_s: float, probe_timeout_ms: int
                      ) -> Call[tuple[bool, int, str]]:
        b = self.keys.breaker(dependency)
        return Call("breaker_allow", [b.state, b.transitions], [self.clock(), rate_per_s, probe_timeout_ms],
                    lambda raw: (bool(raw[0]), int(raw[1]), raw[2].decode()))

    def breaker_record(self, dependency: str, ok: bool, threshold: int, window_ms: int, open_ms: int,
                       failure_id: str) -> Call[str]:
        b = self.keys.breaker(dependency)
        return Call("breaker_record", [b.state, b.transitions, b.failures],
                    [self.clock(), 1 if ok else 0, threshold, window_ms, open_ms, failure_id],
                    lambda raw: raw.decode())

    def breaker_state(self, dependency: str) -> dict[str, Any]:
        b = self.keys.breaker(dependency)
        p = self.sync.pipeline(transaction=False)
        p.hgetall(b.state)
        p.lrange(b.transitions, 0, 9)
        p.zcard(b.failures)
        state, transitions, failures = p.execute()
        fields = {k.decode(): v.decode() for k, v in state.items()}
        return {"dependency": dependency, "state": fields.get("state", "closed"),
                "open_until_ms": int(fields.get("open_until", 0)), "changed_ms": int(fields.get("changed_ms", 0)),
                "recent_failures": failures, "transitions": [t.decode() for t in transitions]}

    def dependencies(self) -> list[str]:
        return sorted(as_texts(self.sync.smembers(self.keys.dependencies)))

    async def aregister_dependencies(self, names: Iterable[str]) -> None:
        names = list(names)
        if names:
            await self.aio.sadd(self.keys.dependencies, *names)

    def acquire_slot(self, kind: str, name: str, limit: int, holder: str, until_ms: int) -> Call[bool]:
        return Call("acquire_slot", [self.keys.slots(kind, name)], [self.clock(), limit, holder, until_ms], bool)

    async def release_slot(self, kind: str, name: str, holder: str) -> None:
        if kind.startswith("key:"):  # a concurrency key's: its key may go back to the fetch ring
            await self.arun(self.release_key_slots(kind[4:], [(name, holder)]))
            return
        await self.aio.zrem(self.keys.slots(kind, name), holder)

    def release_key_slots(self, queue: str, held: Iterable[tuple[str, str]]) -> Call[int]:
        """Free slots of concurrency keys, (key, holder) each; a key parked at its limit goes back to the ring."""
        pfx, k = self.keys.keyed(queue), self.keys.queue(queue)
        return Call("release_key_slots", [pfx + "parked", pfx + "ring", k.idle, pfx],
                    [self.clock(), k.wake, *(x for pair in held for x in pair)], int)

    def extend_slots(self, kind: str, name: str, holders: Iterable[tuple[str, int]]) -> Call[int]:
        """(holder, new slot lease end ms) of slots held by this worker's running jobs."""
        return Call("extend_slots", [self.keys.slots(kind, name)], [x for h in holders for x in h], int)

    def slot_holders(self, kind: str, name: str) -> int:
        key = self.keys.slots(kind, name)
        return int(self.sync.zcount(key, self.clock(), "+inf"))

    def fetch(self, queue: str, count: int, deadline_ms: int, token: str) -> Call[list[tuple[str, bytes, int]]]:
        k = self.keys.queue(queue)
        return Call("fetch", [k.pending, k.jobs, k.active, k.lease, k.attempts, k.paused, k.stats, k.idle,
                              k.idle_lease, self.keys.keyed(queue)], [deadline_ms, count, token], _fetched)

    def fetch_marking(self, queue: str, count: int, deadline_ms: int, token: str, worker: str,
                      idle_until_ms: int) -> Call[tuple[list[tuple[str, bytes, int]], bool]]:
        """``fetch`` that also moves ``worker``'s idle mark in the queue (fetch.lua): parses to the jobs and
        whether the queue was left empty; then the worker, if it still had free slots, is marked idle until
        ``idle_until_ms``, else unmarked. No round trips of their own for marks on the path of a woken worker."""
        k = self.keys.queue(queue)
        freed = self._freed_key_slots.pop(queue, ())
        return Call("fetch", [k.pending, k.jobs, k.active, k.lease, k.attempts, k.paused, k.stats, k.idle,
                              k.idle_lease, self.keys.keyed(queue)],
                    [deadline_ms, count, token, worker, idle_until_ms, self.clock(), *(x for p in freed for x in p)],
                    _fetched_marking)

    def free_key_slot(self, queue: str, key: str, holder: str) -> None:
        """Free ``holder``'s slot of concurrency key ``key`` with the queue's next ``fetch_marking`` (its script
        frees it first, so the fetch may take it at once), or ``flush_key_slots`` when no fetch comes first."""
        self._freed_key_slots.setdefault(queue, []).append((key, holder))

    async def flush_key_slots(self) -> None:
        """Free the key slots no fetch has carried (``free_key_slot``)."""
        while self._freed_key_slots:
            queue, held = self._freed_key_slots.popitem()
            await self.arun(self.release_key_slots(queue, held))

    def extend(self, queue: str, leases: Iterable[tuple[str, str, int]]) -> Call[list[str]]:
        """leases: (id, token, new deadline ms). Parses to the ids this worker lost."""
        k = self.keys.queue(queue)
        args: list[Any] = [x for lease in leases for x in lease]
        return Call("extend", [k.active, k.lease], args, as_texts)

    def ack(self, queue: str, done: Iterable[tuple[str, str]]) -> Call[list[str]]:
        k = self.keys.queue(queue)
        args = [self.clock(), k.wake, *(x for pair in done for x in pair)]
        return Call("ack", [k.active, k.lease, k.jobs, k.attempts, k.history, k.stats, k.minutes, k.waiters,
                            k.waiting, k.pending, k.idle], args, as_texts)

    def ack_lost(self, queue: str, worker: str, sent: Iterable[tuple[str, str, bytes, int]]
                 ) -> Call[tuple[list[str], list[str]]]:
        """sent: (id, token, fetched spec, finished ms) of acks sent before Redis failed over. Parses to the ids
        whose ack was lost (recorded: they run again) and the ids still leased to their token (to ack again)."""
        k = self.keys.queue(queue)
        args: list[Any] = [self.clock(), worker]
        for job_id, token, raw, finished_ms in sent:
            args += [job_id, token, job_id.encode() + raw, finished_ms]
        return Call("ack_lost", [k.lease, k.jobs, k.pending, k.attempts, k.history, k.stats], args,
                    lambda raw: (as_texts(raw[0]), as_texts(raw[1])))

    def retry(self, queue: str, job_id: str, token: str, at_ms: int, entry: dict[str, Any]) -> Call[bool]:
        k = self.keys.queue(queue)
        return Call("retry", [k.active, k.lease, k.retry, k.history, k.stats, k.minutes],
                    [job_id, token, at_ms, orjson.dumps(entry), self.clock()], bool)

    def requeue(self, queue: str, job_id: str, token: str, at_ms: int, counter: str) -> Call[bool]:
        """Give the job back without counting the attempt; ``counter`` names the stats field to bump."""
        k = self.keys.queue(queue)
        return Call("requeue", [k.active, k.lease, k.attempts, k.pending, k.scheduled, k.stats, k.idle],
                    [job_id, token, at_ms, self.clock(), counter, k.wake], bool)

    def hand_back_lost(self, queue: str, worker: str, held: Sequence[str]) -> Call[list[str]]:
        """Give back the jobs pushed to ``worker`` whose wake message it never read (every pushed lease in its name
        but the tokens it ``held``), their attempt not counted: hand_back_lost.lua says when that is safe."""
        k = self.keys.queue(queue)
        return Call("hand_back_lost", [k.active, k.lease, k.attempts, k.pending, k.stats, k.idle],
                    [f"{worker}.p", self.clock(), k.wake, *held], as_texts)

    def hand_back_fetch(self, queue: str, lost: Iterable[tuple[str, int]], held: Iterable[str] = ()
                        ) -> Call[list[str]]:
        """Give back the jobs leased by fetches whose reply was lost, (token, lease deadline ms) each, their attempt
        not counted, but for the ids in ``held`` (hand_back_fetch.lua). Parses to the ids handed back."""
        k = self.keys.queue(queue)
        pairs = [x for token, deadline in lost for x in (deadline, token)]
        return Call("hand_back_fetch", [k.active, k.lease, k.attempts, k.pending, k.jobs, k.stats, k.idle,
                                        self.keys.keyed(queue)],
                    [self.clock(), k.wake, len(pairs) // 2, *pairs, *held], as_texts)

    def dead(self, queue: str, job_id: str, token: str, entry: dict[str, Any],
             fields: dict[str, Any], durable: bool = False, step: tuple[list[str], list[Any]] | None = None
             ) -> Call[bool]:
        """Move the job to dead-letter; ``durable``: a failed_jobs row is owed for it (``durable`` set). ``step``:
        the keys and arguments of a workflow step (redis/workflows.py ``dead_parts``): its workflow learns of it in
        the same call, or, for a step of another queue than its workflow's, its slot records it on its way there."""
        k = self.keys.queue(queue)
        keys = [k.active, k.lease, k.jobs, k.attempts, k.history, k.dead, k.dead_jobs, k.stats, k.durable, k.minutes,
                k.waiters, k.waiting]
        args: list[Any] = [job_id, token, self.clock(), orjson.dumps(entry), orjson.dumps(fields), int(durable)]
        if step is not None:
            keys += step[0]
            args += step[1]
        return Call("dead", keys, args, bool)

    async def durable_done(self, queue: str, ids: Sequence[str]) -> None:
        if ids:
            await self.aio.zrem(self.keys.queue(queue).durable, *ids)

    def recover(self, queue: str, limit: int = 500) -> Call[list[str]]:
        k = self.keys.queue(queue)
        return Call("recover", [k.active, k.lease, k.pending, k.history, k.attempts, k.stats, k.idle],
                    [self.clock(), limit, k.wake], as_texts)

    def promote(self, queue: str, limit: int = 1000) -> Call[int]:
        k = self.keys.queue(queue)
        return Call("promote", [k.scheduled, k.retry, k.pending, k.idle], [self.clock(), limit, k.wake], int)

    def replay(self, queue: str, ids: Iterable[str]) -> Call[list[str]]:
        k = self.keys.queue(queue)
        return Call("replay", [k.dead, k.dead_jobs, k.jobs, k.pending, k.attempts, k.history, k.idle, k.stats],
                    [self.clock(), k.wake, *ids], as_texts)

    def delete_dead(self, queue: str, ids: Iterable[str] = (), older_than_ms: int | None = None,
                    limit: int = 10_000) -> Call[int]:
        k = self.keys.queue(queue)
        cutoff = -1 if older_than_ms is None else self.clock() - older_than_ms
        return Call("delete_dead", [k.dead, k.dead_jobs], [cutoff, limit, *ids], int)

    # -- namespace and servers ------------------------------------------------------------------
    def register_queues(self, queues: Iterable[str]) -> None:
        names = list(queues)
        if names:
            try:
                self.sync.sadd(self.keys.queues, *names)
            except OutOfMemoryError as exc:
                raise full_error("enqueue", self._node_memory(self.keys.queues)) from exc

    async def aregister_queues(self, queues: Iterable[str], what: str = "enqueue") -> None:
        names = list(queues)
        if names:
            try:
                await self.aio.sadd(self.keys.queues, *names)
            except OutOfMemoryError as exc:
                raise full_error(what, await self._anode_memory(self.keys.queues)) from exc

    def queues(self) -> list[str]:
        return sorted(as_texts(self.sync.smembers(self.keys.queues)))

    async def claim_environment(self, environment: str) -> str:
        """Record the namespace's environment on first use; return the one recorded."""
        return await self.arun(Call("claim_environment", [self.keys.meta], [environment], as_text))

    def environment(self) -> str | None:
        found = self.sync.hget(self.keys.meta, "environment")
        return as_text(found) if found else None

    async def heartbeat_server(self, server_id: str, info: dict[str, Any], ttl_s: float) -> None:
        await self.arun(Call("heartbeat_server", [self.keys.servers, self.keys.server_info, self.keys.queues],
                             [server_id, orjson.dumps(info), int(ttl_s * 1000), self.clock(), *info.get("queues", ())],
                             int))

    async def count(self, queue: str, counter: str, n: int = 1) -> None:
        """Bump a queue's stats counter (for what no transition script records)."""
        await self.aio.hincrby(self.keys.queue(queue).stats, counter, n)

    async def unregister_server(self, server_id: str) -> None:
        async with self.aio.pipeline(transaction=False) as p:
            p.hdel(self.keys.server_info, server_id)
            p.zrem(self.keys.servers, server_id)
            await p.execute()

    def servers(self) -> list[dict[str, Any]]:
        ids = as_texts(self.sync.zrangebyscore(self.keys.servers, self.clock(), "+inf"))
        if not ids:
            return []
        raws = self.sync.hmget(self.keys.server_info, ids)
        found = [_json_object(raw) for raw in raws if raw]
        return [s for s in found if s is not None]

    def set_paused(self, queue: str, paused: bool) -> None:
        k = self.keys.queue(queue)
        if paused:  # and no job pushed to a worker marked idle before the pause (enqueue_ready.lua)
            with self.sync.pipeline(transaction=True) as p:
                p.set(k.paused, b"1")
                p.delete(k.idle_lease)
                p.execute()
        else:
            self.sync.delete(k.paused)
