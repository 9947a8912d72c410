"""The Broker's reads of job keys (for queries.py, the doctor, metrics and the CLI), kept apart from the
transitions in ``broker.py``. Every read survives records it cannot decode: readers show what they can.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from ringfence.errors import BadRecord
from ringfence.models import JobSpec
from ringfence.redis.call import Call, as_text, as_texts
from ringfence.redis.keys import Keys, split_entry

if TYPE_CHECKING:
    import redis
    import redis.asyncio as aioredis

T = TypeVar("T")

#: Bytes of a spec that readers load to count jobs (task, version, times, limits; never the payload).
HEAD_BYTES = 512
#: Bytes of long specs copied inside Redis per read to cut their heads (Lua has no substring of a hash field).
HEAD_BUDGET = 16 * 1024 * 1024
#: Entries of the pending list read per LRANGE of a lookup by id (``pending_entry``): ~500 KB of inline jobs,
#: under a ms of Redis; consecutive reads overlap by PENDING_OVERLAP, as many removals as a scan survives meanwhile.
PENDING_SLICE = 5_000
PENDING_OVERLAP = 100


def find_entry(entries: list[bytes], job_id: str) -> bytes | None:
    """The job's entry among pending entries (the id, or ``<id><spec>``: keys.py), or None."""
    whole = job_id.encode()
    if whole not in b"\n".join(entries):  # one search of the lot: the job is in one read of a scan at most
        return None
    prefix = whole + b"{"
    return next((bytes(e) for e in entries if e == whole or e.startswith(prefix)), None)


def _int(raw: Any) -> int:
    """A counter as stored; a value written by something else reads as 0 rather than breaking every reader."""
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


def _json_list(raw: Any) -> list[Any]:
    """A stored JSON list; empty when missing or malformed (readers show what they can)."""
    try:
        found = orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError:
        return []
    return found if isinstance(found, list) else []


def _enqueued_ms(head: bytes, size: int) -> int | None:
    """Enqueue time from a spec's head; None without a record or when it is malformed (the worker
    dead-letters it when it gets there)."""
    if size < 0:
        return None  # no record (-1), or not read (-2)
    try:
        return int(JobSpec.decode_head(head, size).enqueued_ms)
    except BadRecord:
        return None


class Reads:
    """Mixed into :class:`~ringfence.redis.broker.Broker`, which supplies the clients, keys and clock."""

    keys: Keys
    clock: Callable[[], int]

    if TYPE_CHECKING:
        @property
        def sync(self) -> redis.Redis: ...
        @property
        def aio(self) -> aioredis.Redis: ...
        def run(self, call: Call[T]) -> T: ...
        async def arun(self, call: Call[T]) -> T: ...
        def queues(self) -> list[str]: ...
        def memory_infos(self) -> list[dict[str, Any]]: ...

    def queue_counts(self, queue: str) -> dict[str, Any]:
        k = self.keys.queue(queue)
        p = self.sync.pipeline(transaction=False)
        p.llen(k.pending)
        p.zcard(k.active)
        p.zcard(k.scheduled)
        p.zcard(k.retry)
        p.zcard(k.dead)
        p.hgetall(k.stats)
        p.exists(k.paused)
        p.lindex(k.pending, -1)
        pending, active, scheduled, retry, dead, stats, paused, oldest = p.execute()
        oldest_ms = self._entry_enqueued_ms(queue, oldest) if oldest else None
        return {
            "pending": pending, "active": active, "scheduled": scheduled, "retry": retry, "dead": dead,
            "stats": {as_text(key): _int(v) for key, v in stats.items()},
            "paused": bool(paused),
            "oldest_enqueued_ms": oldest_ms,  # None: nothing pending, or its record is malformed
        }

    def _entry_enqueued_ms(self, queue: str, entry: bytes) -> int | None:
        job_id, spec = split_entry(entry)
        if spec is not None:
            return _enqueued_ms(spec[:HEAD_BYTES], len(spec))
        [(head, size)], _ = self.run(self.spec_heads(queue, [job_id]))
        return _enqueued_ms(head, size)

    def spec_heads(self, queue: str, ids: Sequence[str] = (), size: int = 1000
                   ) -> Call[tuple[list[tuple[bytes, int]], bool]]:
        """The first ``HEAD_BYTES`` of job specs with their full size: of ``ids`` (size -1: no record in the jobs
        hash, as for an inline pending job), else of every job (inline pending ones included) when there are at
        most ``size``, else of a random sample. Long specs are read only within ``HEAD_BUDGET`` bytes (size -2:
        skipped). Parses to (heads, exact)."""
        def parse(raw: Any) -> tuple[list[tuple[bytes, int]], bool]:
            return [(bytes(raw[i]), int(raw[i + 1])) for i in range(1, len(raw), 2)], bool(raw[0])

        k = self.keys.queue(queue)
        return Call("spec_heads", [k.jobs, k.pending], [HEAD_BYTES, size, HEAD_BUDGET, random.random(), *ids],
                    parse)

    def spec_sample(self, queue: str, size: int = 1000) -> tuple[list[tuple[bytes, int]], bool]:
        """(head, size) of the specs in the queue: all of them when there are at most ``size``, else a random
        sample. Returns (heads, exact)."""
        return self.run(self.spec_heads(queue, size=size))

    async def oldest_enqueued_ms(self, queue: str) -> int | None:
        """Enqueue time of the job that has waited longest in ``pending`` (for starvation bounds)."""
        k = self.keys.queue(queue)
        oldest = await self.aio.lindex(k.pending, -1)
        if oldest is None:
            return None
        job_id, spec = split_entry(oldest)
        if spec is not None:
            return _enqueued_ms(spec[:HEAD_BYTES], len(spec))
        [(head, size)], _ = await self.arun(self.spec_heads(queue, [job_id]))
        return _enqueued_ms(head, size)

    def pending_entry(self, queue: str, job_id: str) -> bytes | None:
        """The job's entry in the pending list (``<id><spec>`` when inline, else the id), or None: a scan of the
        list newest first, ``PENDING_SLICE`` entries per LRANGE, searched here: Redis only copies them out (the
        same search in a script cost Redis ~15 times as much: every entry became a Lua string). Between reads
        entries move towards the end (LPUSH in front) or leave it (RPOP); only a removal in the middle (cancel's
        LREM) moves them back, so consecutive reads overlap."""
        key, first = self.keys.queue(queue).pending, 0
        while True:
            entries: list[bytes] = self.sync.lrange(key, first, first + PENDING_SLICE - 1)  # type: ignore[assignment]
            found = find_entry(entries, job_id)
            if found is not None or len(entries) < PENDING_SLICE:
                return found
            first += PENDING_SLICE - PENDING_OVERLAP

    def job_spec(self, queue: str, job_id: str) -> bytes | None:
        """The spec of a job in the queue (not dead): from the jobs hash, else from its inline pending entry."""
        jobs = self.keys.queue(queue).jobs
        raw: Any = self.sync.hget(jobs, job_id)
        if raw is None:
            entry = self.pending_entry(queue, job_id)
            spec = split_entry(entry)[1] if entry is not None else None
            if spec is not None:
                return spec
            raw = self.sync.hget(jobs, job_id)  # fetched during the scan
        return bytes(raw) if raw is not None else None

    def attempts(self, queue: str, job_id: str) -> int:
        raw = self.sync.hget(self.keys.queue(queue).attempts, job_id)
        return int(raw) if raw else 0

    def history(self, queue: str, job_id: str) -> list[dict[str, Any]]:
        raw = self.sync.hget(self.keys.queue(queue).history, job_id)
        return _json_list(raw)

    def dead_ids(self, queue: str, offset: int = 0, count: int = -1) -> list[str]:
        k = self.keys.queue(queue)
        end = -1 if count < 0 else offset + count - 1
        return as_texts(self.sync.zrevrange(k.dead, offset, end))

    def dead_records(self, queue: str, ids: Sequence[str]) -> list[tuple[str, bytes]]:
        """Stored dead records as bytes (decoded by ``DeadJob.decode``, which survives malformed ones)."""
        if not ids:
            return []
        raws: list[Any] = self.sync.hmget(self.keys.queue(queue).dead_jobs, list(ids))
        return [(i, bytes(r)) for i, r in zip(ids, raws, strict=True) if r is not None]

    def dead_present(self, queue: str, ids: Sequence[str]) -> list[bool]:
        """Per id: is it in the queue's Redis dead-letter?"""
        p = self.sync.pipeline(transaction=False)
        for i in ids:
            p.zscore(self.keys.queue(queue).dead, i)
        return [score is not None for score in p.execute()] if ids else []

    async def adead_records(self, queue: str, ids: Sequence[str]) -> list[tuple[str, bytes]]:
        raws: list[Any] = await self.aio.hmget(self.keys.queue(queue).dead_jobs, list(ids)) if ids else []
        return [(i, bytes(r)) for i, r in zip(ids, raws, strict=True) if r is not None]

    async def durable_owed(self, queue: str, before_ms: int, limit: int = 100) -> list[str]:
        """Dead jobs (died before ``before_ms``) whose failed_jobs row is still owed."""
        return as_texts(await self.aio.zrangebyscore(self.keys.queue(queue).durable, "-inf", before_ms, 0, limit))

    def lease_token(self, queue: str, job_id: str) -> str | None:
        raw = self.sync.hget(self.keys.queue(queue).lease, job_id)
        return as_text(raw) if raw else None

    def queued_ids(self, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` are still jobs of some queue (pending, scheduled, retrying or running): not acked,
        dead or deleted. One pipelined round trip. Asked of the owners of fence steps: a job that owns a step
        has been fetched, so its spec is in the jobs hash until it leaves; an inline pending job (keys.py) never
        ran and owns none."""
        wanted, queues = sorted(set(ids)), self.queues()
        if not wanted or not queues:
            return set()
        p = self.sync.pipeline(transaction=False)
        for q in queues:
            for job_id in wanted:
                p.hexists(self.keys.queue(q).jobs, job_id)
        found = p.execute()
        n = len(wanted)
        return {job_id for i, job_id in enumerate(wanted) if any(found[k * n + i] for k in range(len(queues)))}

    def lease_alive(self, queue: str, job_id: str, token: str) -> bool:
        """Whether attempt ``token`` of the job still holds a live lease."""
        k = self.keys.queue(queue)
        p = self.sync.pipeline(transaction=False)
        p.hget(k.lease, job_id)
        p.zscore(k.active, job_id)
        held, deadline = p.execute()
        return held is not None and held.decode() == token and deadline is not None and deadline > self.clock()

    def memory_usage(self) -> int:
        return sum(int(info["used_memory"]) for info in self.memory_infos())
