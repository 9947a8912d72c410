"""ack.lua deletes the keys of a batch in variadic calls of at most 1000 jobs: the state after a batch larger
than one chunk, with lost leases and a second copy of an id, is the one job by job calls left. fetch.lua (its
leases written job by job: batched, they measured no cheaper) takes a mixed batch entry by entry."""

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


def test_a_mixed_batch_is_taken_entry_by_entry(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    """Inline and plain entries of one id in one batch, second copies, a dangling id: each entry sees what the
    entries before it wrote, as with one call per job."""
    k = broker.keys.queue("q")
    s1, s2, si, si2, sg = (JobSpec(task=t, args={}, enqueued_ms=1).encode() for t in ("p1", "p2", "i", "i2", "g"))
    rdb.hset(k.jobs, mapping={"p1": s1, "p2": s2})
    rdb.hset(k.attempts, "p1", 2)
    entries = [b"p1", b"i1" + si, b"i1" + si2, b"i1", b"gone", b"gone" + sg, b"p1", b"p2" + s2]
    rdb.lpush(k.pending, *entries)  # popped from the tail: in this order
    got = broker.run(broker.fetch("q", 10, clock.ms + 5000, "w1.1"))
    assert got == [("p1", s1, 3), ("i1", si, 1), ("i1", si, 2), ("gone", b"", 0), ("gone", sg, 1), ("p1", s1, 4)]
    assert rdb.hgetall(k.attempts) == {b"p1": b"4", b"i1": b"2", b"gone": b"1"}
    assert rdb.hgetall(k.jobs) == {b"p1": s1, b"p2": s2, b"i1": si, b"gone": sg}
    assert rdb.hgetall(k.lease) == {b"p1": b"w1.1", b"i1": b"w1.1", b"gone": b"w1.1"}
    leased = {(i, clock.ms + 5000.0) for i in (b"p1", b"i1", b"gone")}
    assert set(rdb.zrange(k.active, 0, -1, withscores=True)) == leased
    assert rdb.hgetall(k.stats) == {b"dangling": b"1", b"duplicates": b"2"}
    assert rdb.llen(k.pending) == 0
