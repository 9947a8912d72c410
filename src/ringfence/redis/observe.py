"""Redis reads for the doctor and metrics, and the shared state of alerts (incidents, the evaluator lease).

Kept apart from ``broker.py`` (the job transitions) so observability never touches a job's keys: every
function here reads job keys only, and writes only the two alert keys below.

Keys (under the namespace ``<ns>``):

| key | type | holds |
|---|---|---|
| ``<ns>:alerts`` | hash | incident key → JSON ``{"since": ms, "message": ...}`` while the alert fires |
| ``<ns>:alerts:leader`` | string (PX) | id of the process that evaluates alert rules; expires unless renewed |
"""

from __future__ import annotations

from typing import Any

import orjson
import redis

from ringfence.redis.broker import Broker, Call
from ringfence.redis.keys import split_entry
from ringfence.redis.reads import HEAD_BYTES


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


# -- reads -----------------------------------------------------------------------------------------
def config_value(broker: Broker, name: str, nodes: Any = "primaries") -> str | None:
    """A ``CONFIG GET`` value; None where CONFIG is disabled (many managed Redis services). On a cluster, asked
    of every primary (or of ``nodes``): an evicting policy (``allkeys-*``) on any one of them wins, else the first
    value."""
    try:
        if broker.cluster:
            per_node: Any = broker.sync.config_get(name, target_nodes=nodes)
            answers = list(per_node.values())
        else:
            answers = [broker.sync.config_get(name)]
    except redis.ResponseError:
        return None
    values = [_text(v) for found in answers for k, v in found.items() if _text(k) == name]
    worst = [v for v in values if v and v.startswith("allkeys-")]
    return (worst or values or [None])[0]


def memory(broker: Broker, nodes: Any = "primaries") -> tuple[int, int, str]:
    """(used_memory, maxmemory (0: no limit), maxmemory_policy) from ``INFO memory`` (works where CONFIG is
    disabled). On a cluster: of the primary nearest its limit (it refuses enqueues first), among ``nodes``."""
    rows = [(int(i["used_memory"]), int(i.get("maxmemory") or 0), str(i.get("maxmemory_policy", "?")))
            for i in broker.memory_infos(nodes)]
    return max(rows, key=lambda r: (r[0] / r[1] if r[1] else 0.0, r[0]))


def waiting_jobs(broker: Broker, queue: str, limit: int = 1000) -> tuple[list[tuple[bytes, int, int]], int]:
    """Jobs waiting to run (pending, retry, scheduled): up to ``limit`` of (spec head, spec size, attempts
    started) — the head, never the whole payload (``JobSpec.decode_head``) — and the total number waiting, so
    a caller can scale a sample up."""
    k = broker.keys.queue(queue)
    p = broker.sync.pipeline(transaction=False)
    p.lrange(k.pending, -limit, -1)
    p.zrange(k.retry, 0, limit - 1)
    p.zrange(k.scheduled, 0, limit - 1)
    p.llen(k.pending)
    p.zcard(k.retry)
    p.zcard(k.scheduled)
    pending, retry, scheduled, n_pending, n_retry, n_scheduled = p.execute()
    entries = [split_entry(e) for e in pending]
    inline = [(spec[:HEAD_BYTES], len(spec), 0) for _, spec in entries if spec is not None]  # never ran
    ids = [i for i, spec in entries if spec is None] + [_text(i) or "" for i in list(retry) + list(scheduled)]
    ids = ids[:max(0, limit - len(inline))]
    if not inline and not ids:
        return [], 0
    out = inline
    if ids:
        heads, _ = broker.run(broker.spec_heads(queue, ids))
        attempts = broker.sync.hmget(k.attempts, ids)
        out += [(h, size, _count(a)) for (h, size), a in zip(heads, attempts, strict=True) if size >= 0]
    return out, int(n_pending + n_retry + n_scheduled)


def _count(raw: Any) -> int:
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def history_sample(broker: Broker, queue: str, count: int = 1000) -> list[dict[str, Any]]:
    """History entries (failed and orphaned attempts) of up to ~``count`` jobs still in Redis; malformed
    entries are skipped."""
    k = broker.keys.queue(queue)
    _, data = broker.sync.hscan(k.history, 0, count=count)
    entries: list[dict[str, Any]] = []
    for raw in data.values():  # type: ignore[union-attr]
        try:
            found = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(found, list):
            entries.extend(e for e in found if isinstance(e, dict))
    return entries


def expired_leases(broker: Broker, queue: str) -> tuple[int, float]:
    """Active jobs whose lease deadline has passed: (how many, seconds since the oldest deadline)."""
    k = broker.keys.queue(queue)
    now = broker.clock()
    expired = int(broker.sync.zcount(k.active, "-inf", now))
    oldest = broker.sync.zrange(k.active, 0, 0, withscores=True) if expired else []
    return expired, (max(0.0, (now - float(oldest[0][1])) / 1000) if oldest else 0.0)


# -- alert state -----------------------------------------------------------------------------------
def _alerts_key(broker: Broker) -> str:
    return broker.keys.alerts


def acquire_lease(broker: Broker, owner: str, ttl_s: float) -> bool:
    """Take or renew the alert evaluator lease; True while ``owner`` holds it."""
    key = broker.keys.alerts_leader
    return broker.run(Call("lease", [key], [owner, max(1, int(ttl_s * 1000))], bool), report=False)


def release_lease(broker: Broker, owner: str) -> None:
    key = broker.keys.alerts_leader
    broker.run(Call("lease", [key], [owner, 0], bool), report=False)


def open_incident(broker: Broker, key: str, record: dict[str, Any]) -> bool:
    """Record an incident; True only for the caller that opened it (so it is announced once)."""
    return bool(broker.sync.hsetnx(_alerts_key(broker), key, orjson.dumps(record)))


def close_incident(broker: Broker, key: str) -> dict[str, Any] | None:
    """Remove an incident; returns its record only to the caller that removed it."""
    raw = broker.run(Call("close_incident", [_alerts_key(broker)], [key], lambda raw: raw), report=False)
    return orjson.loads(raw) if raw else None


def incidents(broker: Broker) -> dict[str, dict[str, Any]]:
    """Every open incident: key → record."""
    raw = broker.sync.hgetall(_alerts_key(broker))
    return {_text(k) or "": orjson.loads(v) for k, v in raw.items()}
