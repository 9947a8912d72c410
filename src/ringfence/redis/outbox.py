"""The outbox relay's Redis operations: the refusing enqueue (lua/relay.lua), its record of sent ids and the
relay lease (one relay at a time per namespace)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ringfence.redis.broker import Broker
from ringfence.redis.call import Call

#: relay.lua's answer for an id the relay sent before (refused).
REFUSED = 2

Job = tuple[str, bytes, int, str, int]  # id, spec, run-at ms (0 = now), unique key ('' = none), hold end ms


def _sent(raw: Any) -> list[int | str]:
    return [x.decode() if isinstance(x, bytes) else int(x) for x in raw]


def relay(broker: Broker, queue: str, jobs: Iterable[Job]) -> Call[list[int | str]]:
    """Enqueue ``jobs`` (in order) unless the relay sent their id before. Parses to one value per job: 1 added
    (or already there, same spec), 0 the id holds another job, 2 refused (sent before), else a unique key's
    holder."""
    k = broker.keys.queue(queue)
    args: list[Any] = [broker.clock(), k.wake]
    for job in jobs:
        args += list(job)
    return Call("relay", [k.jobs, k.pending, k.scheduled, k.idle, k.stats, k.unique, k.unique_exp, k.outbox_sent],
                args, _sent)


def forget_sent(broker: Broker, by_queue: dict[str, list[str]]) -> None:
    """Drop the sent records of rows now deleted from the outbox (no relay can read them again)."""
    with broker.sync.pipeline(transaction=False) as p:
        for queue, ids in by_queue.items():
            if ids:
                p.zrem(broker.keys.queue(queue).outbox_sent, *ids)
        p.execute()


def old_sent(broker: Broker, before_ms: int, limit: int = 500) -> dict[str, list[str]]:
    """Per queue of the namespace, up to ``limit`` ids sent before ``before_ms`` whose records are still kept."""
    queues = sorted(x.decode() if isinstance(x, bytes) else x for x in broker.sync.smembers(broker.keys.queues))
    out: dict[str, list[str]] = {}
    for queue in queues:
        ids: list[Any] = broker.sync.zrangebyscore(broker.keys.queue(queue).outbox_sent, "-inf", before_ms, start=0,
                                                   num=limit)
        if ids:
            out[queue] = [x.decode() if isinstance(x, bytes) else str(x) for x in ids]
    return out


def acquire_lease(broker: Broker, owner: str, ttl_s: float) -> bool:
    """Take or renew the relay lease; True while ``owner`` holds it."""
    return broker.run(Call("lease", [broker.keys.outbox_lease], [owner, max(1, int(ttl_s * 1000))], bool),
                      report=False)


def release_lease(broker: Broker, owner: str) -> None:
    broker.run(Call("lease", [broker.keys.outbox_lease], [owner, 0], bool), report=False)


def lease_holder(broker: Broker) -> str | None:
    raw = broker.sync.get(broker.keys.outbox_lease)
    return raw.decode() if isinstance(raw, bytes) else raw
