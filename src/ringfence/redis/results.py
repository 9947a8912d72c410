"""Job results in Redis (tasks declared with ``store_result=True``): one key per job, ``Keys.result(job_id)``.

The key holds a list of one element, the result record as JSON, with a TTL. A waiter blocks on
``BLMOVE key key RIGHT LEFT`` (Redis 6.2+): the element moves onto the same list, so every waiter reads it and it
stays for the next; one key per job, so it works on a Redis Cluster as on a single Redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ringfence.errors import BadRecord
from ringfence.models import JobSpec
from ringfence.redis.call import Call, as_text

if TYPE_CHECKING:
    from ringfence.redis.broker import Broker


def _bytes(found: Any) -> bytes | None:
    return None if found is None else found.encode() if isinstance(found, str) else bytes(found)


def store(broker: Broker, job_id: str, record: bytes, ttl_ms: int) -> Call[int]:
    return Call("store_result", [broker.keys.result(job_id)], [record, ttl_ms], int)


def read(broker: Broker, job_id: str) -> bytes | None:
    return _bytes(broker.sync.lindex(broker.keys.result(job_id), 0))


async def aread(broker: Broker, job_id: str) -> bytes | None:
    return _bytes(await broker.aio.lindex(broker.keys.result(job_id), 0))


def wait(broker: Broker, job_id: str, timeout_s: float) -> bytes | None:
    """The record once stored, or None after ``timeout_s`` (keep it below the client's socket timeout)."""
    key = broker.keys.result(job_id)
    # redis-py types the timeout as int; Redis takes fractions of a second
    return _bytes(broker.sync.blmove(key, key, round(timeout_s, 3), "RIGHT", "LEFT"))  # type: ignore[arg-type]


async def await_(broker: Broker, job_id: str, timeout_s: float) -> bytes | None:
    key = broker.keys.result(job_id)
    return _bytes(await broker.aio.blmove(key, key, round(timeout_s, 3), "RIGHT", "LEFT"))  # type: ignore[arg-type]


def ttl_ms(broker: Broker, job_id: str) -> int:
    """Milliseconds the stored result has left (-2: none)."""
    return int(broker.sync.pttl(broker.keys.result(job_id)))


def present(broker: Broker, queue: str, job_id: str) -> bool:
    """Is the job still in ``queue`` (queued, running, retrying or dead)? Two O(1) reads in one round trip. A
    job of a task with ``store_result`` is never stored inline in pending (client.py ``_inline``), so its
    record is in the jobs hash from its enqueue on."""
    k = broker.keys.queue(queue)
    p = broker.sync.pipeline(transaction=False)
    p.hexists(k.jobs, job_id)
    p.zscore(k.dead, job_id)
    exists, dead = p.execute()
    return bool(exists) or dead is not None


async def apresent(broker: Broker, queue: str, job_id: str) -> bool:
    k = broker.keys.queue(queue)
    async with broker.aio.pipeline(transaction=False) as p:
        p.hexists(k.jobs, job_id)
        p.zscore(k.dead, job_id)
        exists, dead = await p.execute()
    return bool(exists) or dead is not None


def _run_of(queues: list[str], specs: list[Any]) -> tuple[str, float] | None:
    for queue, spec in zip(queues, specs, strict=True):
        if spec is not None:
            try:
                run = float(JobSpec.decode_head(bytes(spec)[:200], len(spec)).enqueued_ms)
            except BadRecord:
                run = -1.0  # unreadable: no record can match it, so none is taken for this run's
            return queue, run
    return None


def current_run(broker: Broker, job_id: str) -> tuple[str, float] | None:
    """(queue, run) of the job with this id that is queued, scheduled, running or retrying (not dead), or None.
    The run is its spec's ``enqueued_ms``: a result record names the run that wrote it. One round trip for the
    queues, one for their jobs hashes (an id enqueued again may have gone to another queue)."""
    queues = sorted(as_text(q) for q in broker.sync.smembers(broker.keys.queues))
    if not queues:
        return None
    p = broker.sync.pipeline(transaction=False)
    for queue in queues:
        p.hget(broker.keys.queue(queue).jobs, job_id)
    return _run_of(queues, p.execute())


async def acurrent_run(broker: Broker, job_id: str) -> tuple[str, float] | None:
    queues = sorted(as_text(q) for q in await broker.aio.smembers(broker.keys.queues))
    if not queues:
        return None
    async with broker.aio.pipeline(transaction=False) as p:
        for queue in queues:
            p.hget(broker.keys.queue(queue).jobs, job_id)
        specs = await p.execute()
    return _run_of(queues, specs)
