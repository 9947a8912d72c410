"""fetch.lua and ack.lua write the leases and delete the keys of a batch in variadic calls of at most 1000 jobs:
the state after a batch larger than one chunk, with lost leases and a second copy of an id, is the one job by job
calls left."""

from __future__ import annotations

import pytest
import redis

from ringfence.models import JobSpec
from ringfence.redis.broker import Broker
from support import SimClock


@pytest.fixture
def broker(redis_url: str, namespace: str, clock: SimClock) -> Broker:
    return Broker(redis_url, namespace, clock=clock)


def test_a_batch_beyond_one_chunk_leases_and_acks_every_job(broker: Broker, rdb: redis.Redis,
                                                             clock: SimClock) -> None:
    k = broker.keys.queue("q")
    spec = JobSpec(task="t", args={}, enqueued_ms=1).encode()
    ids = [f"j{i}" for i in range(2500)]
    for start in range(0, len(ids), 500):
        broker.run(broker.enqueue("q", [(i, spec, 0) for i in ids[start:start + 500]]))
    got = broker.run(broker.fetch("q", 2500, clock.ms + 5000, "w1.1"))
    assert [(i, n) for i, _, n in got] == [(i, 1) for i in ids]
    assert rdb.zcard(k.active) == 2500 and set(rdb.zrange(k.active, 0, -1)) == {i.encode() for i in ids}
    assert set(rdb.zrange(k.active, 0, -1, withscores=True)) == {(i.encode(), clock.ms + 5000.0) for i in ids}
    assert rdb.hgetall(k.lease) == {i.encode(): b"w1.1" for i in ids}

    rdb.hset(k.lease, "j7", "w2.1")  # another attempt holds j7 now
    pairs = [(i, "w1.1") for i in ids] + [("j3", "w1.1")]  # and j3 comes twice
    lost = broker.run(broker.ack("q", pairs))
    assert lost == ["j7", "j3"]
    assert rdb.zrange(k.active, 0, -1) == [b"j7"]
    assert rdb.hgetall(k.lease) == {b"j7": b"w2.1"}
    assert rdb.hkeys(k.jobs) == [b"j7"] and rdb.hkeys(k.attempts) == [b"j7"]
    assert rdb.hget(k.stats, "processed") == b"2499"
