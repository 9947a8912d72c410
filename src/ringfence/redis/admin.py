"""The Broker's operations by a person (job lookup, cancel, purge, per-minute history), kept apart from the
worker's transitions in ``broker.py``. Every read is bounded: a page, a batch, or one job."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from ringfence.redis.call import Call, as_text
from ringfence.redis.keys import Keys, split_entry
from ringfence.redis.reads import PENDING_OVERLAP, PENDING_SLICE, find_entry

if TYPE_CHECKING:
    import redis

T = TypeVar("T")

#: The states a job of a queue can be browsed in, and the key (list or zset) that holds each.
STATES = ("pending", "active", "scheduled", "retry", "dead")
#: Oldest pending entries a lookup by id reads before its newest-first scan (one LRANGE): the pending page lists
#: jobs oldest first and latency is the oldest job's age, so those are the jobs looked up most, and the scan would
#: reach them last.
OLDEST_FIRST = 1000
#: The state of a job in its concurrency key's list while the key is at its limit (lua/_keyed.lua), the key after.
KEY_WAIT = "waiting for its key's slot: "


#: The ids ``models.new_job_id`` generates: the only ones an inline pending entry holds (client.py puts a job
#: inline only with an id it generated), so an id of another form needs no scan of the pending lists.
_GENERATED = re.compile(r"[a-z2-7]{16}")


def may_be_inline(job_id: str) -> bool:
    """Whether ``job_id`` could be an inline pending job's (keys.py): one ``new_job_id`` generates."""
    return _GENERATED.fullmatch(job_id) is not None


def is_pending(state: str | None) -> bool:
    """Whether a state of ``job_state`` is a pending one: in the pending list or waiting in its key's list."""
    return state == "pending" or (state or "").startswith(KEY_WAIT)


class Admin:
    """Mixed into :class:`~ringfence.redis.broker.Broker`, which supplies the clients, keys and clock."""

    keys: Keys
    clock: Callable[[], int]

    if TYPE_CHECKING:
        @property
        def sync(self) -> redis.Redis: ...
        def run(self, call: Call[T]) -> T: ...
        def queues(self) -> list[str]: ...
        def pending_entry(self, queue: str, job_id: str) -> bytes | None: ...

    def inline_entry(self, queue: str, job_id: str) -> bytes:
        """The job's inline pending entry (``<id><spec>``, keys.py) for ``cancel``, or b"" when its spec is in
        the jobs hash or it is not pending: a scan of pending only for a job with no record in the hash."""
        if self.sync.hexists(self.keys.queue(queue).jobs, job_id) or not may_be_inline(job_id):
            return b""
        found = self._pending_entry(queue, job_id)
        if found is None:
            found = (self._keyed_entry(queue, job_id) or ("", None, False))[1]
        return found if found is not None and split_entry(found)[1] is not None else b""

    def cancel(self, queue: str, job_id: str, dead_fields: dict[str, Any] | None = None, inline_entry: bytes = b""
               ) -> Call[str]:
        """Take a job out of ``queue`` (pending, scheduled, retry or running). With ``dead_fields`` it goes to
        dead-letter with those fields instead of being deleted. Parses to the state it left ('' if none). An
        inline pending job is cancelled only given its ``inline_entry``."""
        k = self.keys.queue(queue)
        return Call("cancel", [k.pending, k.scheduled, k.retry, k.active, k.lease, k.jobs, k.attempts, k.history,
                               k.dead, k.dead_jobs, k.stats, k.waiters, k.waiting, self.keys.keyed(queue)],
                    [job_id, self.clock(), orjson.dumps(dead_fields) if dead_fields else "", inline_entry], as_text)

    def purge(self, queue: str, limit: int) -> Call[int]:
        """Delete up to ``limit`` pending jobs, oldest first, then those waiting in their keys' lists."""
        k = self.keys.queue(queue)
        return Call("purge", [k.pending, k.jobs, k.attempts, k.history, k.stats, k.waiters, k.waiting, k.dead,
                              k.dead_jobs, self.keys.keyed(queue)], [limit, self.clock()], int)

    def purgeable(self, queue: str) -> int:
        """Pending jobs a purge deletes: the pending list's and those waiting in their keys' lists."""
        k = self.keys.queue(queue)
        p = self.sync.pipeline(transaction=False)
        p.llen(k.pending)
        p.hget(k.stats, "keyed_waiting")
        queued, keyed = p.execute()
        return int(queued) + max(0, int(keyed or 0))

    def job_state(self, queue: str, job_id: str) -> str | None:
        """Where job ``job_id`` is in ``queue``: a state of STATES, 'unknown' (a record in no set: being moved),
        or None when the queue has no such job. Pending is found by LPOS (one scan of the list in Redis), an
        inline pending job (no record in the jobs hash, keys.py; only a generated id, ``may_be_inline``) in the
        oldest entries, then by a scan in slices (pending_entry). A pending job in its concurrency key's
        list reads ``KEY_WAIT`` and the key while the key is parked at its limit."""
        return self.job_lookup(queue, job_id)[0]

    def job_lookup(self, queue: str, job_id: str, scan: bool = True) -> tuple[str | None, bytes | None]:
        """``job_state`` and, for an inline pending job, its spec as the scan found it (None otherwise: the spec
        is in the jobs hash, ``job_spec``), so that a job page scans the pending list once. ``scan=False``: the
        job's own records only (one round trip), no scan for an inline entry."""
        state = self._job_state(queue, job_id)
        if state is not None or not scan or not may_be_inline(job_id):
            return state, None
        entry = self._pending_entry(queue, job_id)
        spec = split_entry(entry)[1] if entry is not None else None
        if spec is not None:
            return "pending", spec
        if entry is None:
            keyed = self._keyed_entry(queue, job_id)
            spec = split_entry(keyed[1])[1] if keyed is not None else None
            if keyed is not None and spec is not None:
                return _key_state(keyed[0], keyed[2]), spec
        return self._job_state(queue, job_id), None  # an inline job fetched during the scan has its record now

    def _keyed_entry(self, queue: str, job_id: str) -> tuple[str, bytes, bool] | None:
        """(key, entry, whether the key is parked at its limit) of a job waiting in its concurrency key's list, or
        None: the keys in ring and parked (lua/_keyed.lua), each list scanned newest first as pending_entry. A
        queue with no job waiting in a key's list (its counter 'keyed_waiting') costs one HGET."""
        if int(self.sync.hget(self.keys.queue(queue).stats, "keyed_waiting") or 0) <= 0:
            return None
        pfx = self.keys.keyed(queue)
        p = self.sync.pipeline(transaction=False)
        p.lrange(pfx + "ring", 0, -1)
        p.zrange(pfx + "parked", 0, -1)
        ring, parked = p.execute()
        for raw, at_limit in [*((r, False) for r in ring), *((r, True) for r in parked)]:
            key = as_text(raw)
            first = 0
            while True:
                entries: list[bytes] = self.sync.lrange(pfx + "q:" + key, first, first + PENDING_SLICE - 1)  # type: ignore[assignment]
                found = find_entry(entries, job_id)
                if found is not None:
                    return key, found, at_limit
                if len(entries) < PENDING_SLICE:
                    break
                first += PENDING_SLICE - PENDING_OVERLAP
        return None

    def _pending_entry(self, queue: str, job_id: str) -> bytes | None:
        """``pending_entry`` with the oldest ``OLDEST_FIRST`` entries read first (a list no longer than that is
        read whole by that one LRANGE)."""
        oldest: list[bytes] = self.sync.lrange(self.keys.queue(queue).pending, -OLDEST_FIRST, -1)  # type: ignore[assignment]
        found = find_entry(oldest, job_id)
        if found is not None or len(oldest) < OLDEST_FIRST:
            return found
        return self.pending_entry(queue, job_id)

    def _job_state(self, queue: str, job_id: str) -> str | None:
        k = self.keys.queue(queue)
        p = self.sync.pipeline(transaction=False)
        p.hexists(k.jobs, job_id)
        p.zscore(k.active, job_id)
        p.zscore(k.scheduled, job_id)
        p.zscore(k.retry, job_id)
        p.zscore(k.dead, job_id)
        exists, active, scheduled, retry, dead = p.execute()
        if dead is not None:
            return "dead"
        if not exists:
            return None
        for state, score in (("active", active), ("scheduled", scheduled), ("retry", retry)):
            if score is not None:
                return state
        if self.sync.lpos(k.pending, job_id) is not None:
            return "pending"
        if self.sync.hexists(k.waiting, job_id):
            return "waiting"
        keyed = self._keyed_entry(queue, job_id)
        return _key_state(keyed[0], keyed[2]) if keyed is not None else "unknown"

    def page(self, queue: str, state: str, offset: int, count: int) -> list[tuple[str, float]]:
        """(id, score) of one page of a state: pending oldest first by position (score = position), the sorted
        sets by score (run-at, retry-at, lease deadline), dead newest first."""
        k = self.keys.queue(queue)
        if state == "pending":
            raw: Any = self.sync.lrange(k.pending, -(offset + count), -(offset + 1) if offset else -1)
            ids = [split_entry(e)[0] for e in raw]
            return [(i, float(offset + n)) for n, i in enumerate(reversed(ids))]
        key = {"active": k.active, "scheduled": k.scheduled, "retry": k.retry, "dead": k.dead}[state]
        if state == "dead":
            raw = self.sync.zrevrange(key, offset, offset + count - 1, withscores=True)
        else:
            raw = self.sync.zrange(key, offset, offset + count - 1, withscores=True)
        return [(as_text(pair[0]), float(pair[1])) for pair in raw]

    def page_specs(self, queue: str, state: str, offset: int, count: int) -> list[tuple[str, bytes | None]]:
        """(id, spec) of one page of a state other than dead (as ``page``); inline pending specs come with
        their entries, the others from one HMGET."""
        k = self.keys.queue(queue)
        if state != "pending":
            ids = [i for i, _ in self.page(queue, state, offset, count)]
            return list(zip(ids, self.specs(queue, ids), strict=True))
        raw: Any = self.sync.lrange(k.pending, -(offset + count), -(offset + 1) if offset else -1)
        entries = [split_entry(e) for e in reversed(raw)]
        stored = iter(self.specs(queue, [i for i, spec in entries if spec is None]))
        return [(i, spec if spec is not None else next(stored)) for i, spec in entries]

    def specs(self, queue: str, ids: list[str]) -> list[bytes | None]:
        if not ids:
            return []
        raws: list[Any] = self.sync.hmget(self.keys.queue(queue).jobs, ids)
        return [bytes(r) if r is not None else None for r in raws]

    def latency_sample(self, queue: str, latency_ms: int) -> Call[int]:
        """Keep the largest latency sample of this minute (workers, every few seconds; the charts read it)."""
        return Call("latency", [self.keys.queue(queue).minutes], [self.clock(), max(0, int(latency_ms))], int)

    def minutes(self, queue: str) -> dict[str, int]:
        """The per-minute history the workers keep for a day: ``p<minute>`` processed, ``f<minute>`` failed
        attempts, ``l<minute>`` the largest latency sample (ms)."""
        raw: dict[Any, Any] = self.sync.hgetall(self.keys.queue(queue).minutes)
        return {as_text(key): int(v) for key, v in raw.items()}


def _key_state(key: str, parked: bool) -> str:
    """The state of a job in key ``key``'s list: waiting for a slot while its key is parked at its limit, else
    pending (its key takes its turn in the ring; plain jobs of a keyed queue wait under key '')."""
    return KEY_WAIT + key if key and parked else "pending"
