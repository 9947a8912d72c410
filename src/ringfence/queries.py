"""The read model: read-only views of a namespace (queue gauges, versions in flight, breakers, servers, dead
jobs), shared by ``ringfence info``, the doctor, the alert rules, metrics and the dashboard. Each reads through
the broker's read methods; nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ringfence.errors import BadRecord, CannotConnect
from ringfence.models import DeadJob, JobSpec
from ringfence.redis.broker import Broker
from ringfence.redis.call import as_text
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.keys import logical_queue, split_entry
from ringfence.redis.topology import node_of, prepare_reads


def queue_gauges(broker: Broker, queue: str) -> dict[str, Any]:
    """Counts, counters, latency and paused of one queue: two round trips, no job scan. The one read of a
    queue's numbers: ``info``, the doctor, the alert rules, metrics and the dashboard all start here."""
    c = broker.queue_counts(queue)
    latency = 0.0
    if c["oldest_enqueued_ms"] is not None:
        latency = max(0.0, (broker.clock() - c["oldest_enqueued_ms"]) / 1000)
    pending = c["pending"] + c["stats"].get("keyed_waiting", 0)  # jobs in their concurrency keys' lists count
    return {"queue": queue, "pending": pending, "active": c["active"], "scheduled": c["scheduled"],
            "retry": c["retry"], "dead": c["dead"], "paused": c["paused"], "latency_s": round(latency, 3),
            "stats": c["stats"]}


def queue_info(broker: Broker, queue: str) -> dict[str, Any]:
    """``ringfence info``'s row: the gauges, the main counters by name, and the versions in flight."""
    g = queue_gauges(broker, queue)
    stats = g.pop("stats")
    return {
        **{k: g[k] for k in ("queue", "pending", "active", "scheduled", "retry", "dead")},
        "processed": stats.get("processed", 0),
        "failed": stats.get("failed", 0),
        "orphaned": stats.get("orphaned", 0),
        "dangling": stats.get("dangling", 0),  # queued ids that had no record: dropped and logged by a worker
        "latency_s": g["latency_s"],
        "paused": g["paused"],
        **versions_in_flight(broker, queue),
    }


def versions_in_flight(broker: Broker, queue: str) -> dict[str, Any]:
    """``task@version`` counts of the jobs in the queue (exact up to 1,000 jobs, else from a random sample).
    Reads only the head of each spec, never a whole payload; a malformed record counts as ``malformed``."""
    heads, exact = broker.spec_sample(queue)
    counts: dict[str, int] = {}
    for head, size in heads:
        if size == -2:  # a long spec past the read budget: the versions are a sample
            exact = False
            continue
        try:
            spec = JobSpec.decode_head(head, size)
            tag = f"{spec.task}@v{spec.version}"
        except BadRecord:
            tag = "malformed"
        counts[tag] = counts.get(tag, 0) + 1
    return {"versions": dict(sorted(counts.items())), "versions_exact": exact}


_SUMMED = ("pending", "active", "scheduled", "retry", "dead", "processed", "failed", "orphaned", "dangling")


def by_logical_queue(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``info`` rows with the partitions of a partitioned queue in one row under its name: counts summed, the
    oldest latency, paused when any partition is, ``partitions`` the number found."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        queue = logical_queue(row["queue"])
        merged = out.get(queue)
        if merged is None:
            out[queue] = {**row, "queue": queue, "versions": dict(row["versions"]),
                          "partitions": int(queue != row["queue"])}
            continue
        for k in _SUMMED:
            merged[k] += row[k]
        merged["latency_s"] = max(merged["latency_s"], row["latency_s"])
        merged["paused"] = merged["paused"] or row["paused"]
        merged["versions_exact"] = merged["versions_exact"] and row["versions_exact"]
        for tag, n in row["versions"].items():
            merged["versions"][tag] = merged["versions"].get(tag, 0) + n
        merged["partitions"] += 1
    return [out[q] for q in sorted(out)]


def info(broker: Broker) -> list[dict[str, Any]]:
    return [queue_info(broker, q) for q in broker.queues()]


def info_partial(broker: Broker, silent: dict[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``info``'s rows of every queue that can be read, and on a Cluster the queues that cannot (their node does
    not answer a short PING, or fails the read), each with that node and the error; outside a Cluster an
    unreachable Redis raises. ``silent``: the masters that did not answer a short PING (``silent_masters``)."""
    home = node_of(broker, broker.keys.queues)
    if home in silent:
        raise CannotConnect(f"the Redis Cluster node holding the queue list, {home}, does not answer ({silent[home]})")
    rows: list[dict[str, Any]] = []
    missing: list[dict[str, str]] = []
    names = broker.queues()
    prepare_reads(broker, ("spec_heads",), silent)
    for q in names:
        node = node_of(broker, broker.keys.queue(q).pending)
        try:
            if node in silent:
                missing.append({"queue": q, "node": node, "error": silent[node]})
            else:
                rows.append(queue_info(broker, q))
        except UNAVAILABLE as exc:
            if not broker.cluster:
                raise
            missing.append({"queue": q, "node": node, "error": _said(exc)})
    return rows, missing


def breakers_partial(broker: Broker, silent: dict[str, str]
                     ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``breakers`` of every dependency that can be read, and on a Cluster the ones whose node does not answer."""
    found: list[dict[str, Any]] = []
    missing: list[dict[str, str]] = []
    for dep in broker.dependencies():
        node = node_of(broker, broker.keys.breaker(dep).state)
        try:
            if node in silent:
                missing.append({"breaker": dep, "node": node, "error": silent[node]})
            else:
                found.append(broker.breaker_state(dep))
        except UNAVAILABLE as exc:
            if not broker.cluster:
                raise
            missing.append({"breaker": dep, "node": node, "error": _said(exc)})
    return found, missing


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def breakers(broker: Broker) -> list[dict[str, Any]]:
    """State of every dependency's circuit breaker, with its latest transitions."""
    return [broker.breaker_state(dep) for dep in broker.dependencies()]


def servers(broker: Broker) -> list[dict[str, Any]]:
    return sorted(broker.servers(), key=lambda s: (s.get("host", ""), s.get("pid", 0)))


@dataclass(frozen=True)
class DeadFilter:
    queue: str | None = None
    task: str | None = None
    error: str | None = None
    reason: str | None = None

    def matches(self, job: DeadJob) -> bool:
        return (
            (self.task is None or job.task == self.task)
            and (self.reason is None or job.reason == self.reason)
            and (self.error is None or self.error.lower() in job.error.lower())
        )


def dead_jobs(broker: Broker, flt: DeadFilter, limit: int | None = None) -> list[DeadJob]:
    """Newest first. Scans in pages so a large dead-letter does not load at once."""
    out: list[DeadJob] = []
    queues = broker.queues()
    if flt.queue:  # a partitioned queue's name stands for its partitions
        queues = [flt.queue, *(q for q in queues if q != flt.queue and logical_queue(q) == flt.queue)]
    for queue in queues:
        offset = 0
        while True:
            ids = broker.dead_ids(queue, offset, 500)
            if not ids:
                break
            offset += len(ids)
            for job_id, record in broker.dead_records(queue, ids):
                job = DeadJob.decode(queue, job_id, record)
                if flt.matches(job):
                    out.append(job)
                    if limit is not None and len(out) >= limit:
                        return out
    return out


def find_dead(broker: Broker, job_id: str) -> DeadJob | None:
    for queue in broker.queues():
        for _, record in broker.dead_records(queue, [job_id]):
            return DeadJob.decode(queue, job_id, record)
    return None


@dataclass(frozen=True)
class KeyWaiting:
    """A pending job in its concurrency key's list (redis/lua/_keyed.lua): its key ('' for a
    job without one, in a queue that holds keyed jobs), id, spec (None: its record is gone), and ``after``, the
    cursor of the job that follows it."""

    key: str
    job_id: str
    spec: bytes | None
    after: tuple[int, int]


KEY_ROUNDS = 3  # reads of keys a page makes at most: keys emptied between two reads leave it short


def key_waiting(broker: Broker, queue: str, at: tuple[int, int], count: int) -> list[KeyWaiting]:
    """Up to ``count`` jobs waiting in the queue's concurrency keys' lists from cursor ``at`` = (i, j): the
    i-th key in the order fetch takes them (the ring from its next key, then the parked keys by when they are
    looked at again), its j-th job from its oldest. Each key read holds at least one job, so a page reads at
    most count + 1 keys and count entries, however deep it is and however many jobs wait. The order moves as
    workers take jobs, as the pending list's does."""
    out: list[KeyWaiting] = []
    pfx = broker.keys.keyed(queue)
    i, j = at
    for _ in range(KEY_ROUNDS):
        want = count - len(out)
        keys, total = _keys_from(broker, pfx, i, want + 1) if want > 0 else ([], 0)
        if not keys:
            break
        p = broker.sync.pipeline(transaction=False)
        for key in keys:
            p.llen(pfx + "q:" + key)
        spans = []  # (position, key, first, n): the key's n jobs from its first-oldest
        seen: set[str] = set()
        for n, (key, size) in enumerate(zip(keys, p.execute(), strict=True)):
            if key in seen:  # a key met twice in one read (moved from parked to the ring meanwhile): once
                continue
            seen.add(key)
            first = j if n == 0 else 0
            take = max(0, min(int(size) - first, want))
            if take:
                spans.append((i + n, key, first, take))
                want -= take
            if not want:
                break
        out += _entries(broker, queue, pfx, spans)
        i, j = i + len(keys), 0  # short of count: every key read is done with
        if not want or i >= total:
            break
    return out


def _keys_from(broker: Broker, pfx: str, i: int, n: int) -> tuple[list[str], int]:
    """``n`` keys from the i-th in fetch order (the ring from its tail, then parked by score), and how many
    keys there are."""
    p = broker.sync.pipeline(transaction=False)
    p.llen(pfx + "ring")
    p.zcard(pfx + "parked")
    in_ring, parked = (int(x) for x in p.execute())
    if i >= in_ring + parked:
        return [], in_ring + parked
    p = broker.sync.pipeline(transaction=False)
    if i < in_ring:
        p.lrange(pfx + "ring", -min(i + n, in_ring), -(i + 1))
    if i + n > in_ring:
        p.zrange(pfx + "parked", max(0, i - in_ring), i + n - 1 - in_ring)
    got = p.execute()
    keys = [as_text(k) for k in reversed(got.pop(0))] if i < in_ring else []
    keys += [as_text(k) for k in (got[0] if got else [])]
    return keys[:n], in_ring + parked


def _entries(broker: Broker, queue: str, pfx: str, spans: list[tuple[int, str, int, int]]) -> list[KeyWaiting]:
    """The entries of ``spans`` oldest first, with their specs (inline, else one HMGET for the page)."""
    if not spans:
        return []
    p = broker.sync.pipeline(transaction=False)
    for _, key, first, n in spans:
        p.lrange(pfx + "q:" + key, -(first + n), -(first + 1))
    found = []
    for (pos, key, first, _), raw in zip(spans, p.execute(), strict=True):
        for k, entry in enumerate(reversed(raw)):
            job_id, spec = split_entry(entry)
            found.append((key, job_id, spec, (pos, first + k + 1)))
    stored = iter(broker.specs(queue, [f[1] for f in found if f[2] is None]))
    return [KeyWaiting(key, job_id, spec if spec is not None else next(stored), after)
            for key, job_id, spec, after in found]
