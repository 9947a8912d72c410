"""Each broker script against the real Redis: seed, call one operation, compare the exact state."""

from __future__ import annotations

import orjson
import pytest
import redis

from ringfence.models import JobSpec
from ringfence.redis.broker import Broker
from support import SimClock


@pytest.fixture
def broker(redis_url: str, namespace: str, clock: SimClock) -> Broker:
    return Broker(redis_url, namespace, clock=clock)


def spec(task: str = "t", **args: object) -> bytes:
    return JobSpec(task=task, args=dict(args), enqueued_ms=1).encode()


def test_enqueue_is_idempotent_by_id_and_schedules_future_jobs(broker: Broker, rdb: redis.Redis) -> None:
    k = broker.keys.queue("q")
    assert broker.run(broker.enqueue("q", [("a", spec(), 0), ("b", spec(), 2_000_000)])) == [True, True]
    assert broker.run(broker.enqueue("q", [("a", spec(x=1), 0)])) == [False]
    assert rdb.lrange(k.pending, 0, -1) == [b"a"]
    assert rdb.zrange(k.scheduled, 0, -1, withscores=True) == [(b"b", 2_000_000.0)]
    assert orjson.loads(rdb.hget(k.jobs, "a"))["a"] == {}  # the first spec stays
    # Job keys never carry a TTL: nothing leaves Redis by expiry.
    for key in (k.pending, k.jobs, k.scheduled):
        assert rdb.ttl(key) == -1


def test_fetch_leases_in_fifo_order_and_counts_attempts(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    broker.run(broker.enqueue("q", [(i, spec(), 0) for i in ("a", "b", "c")]))
    got = broker.run(broker.fetch("q", 2, clock.ms + 5000, "w1.1"))
    assert [(i, n) for i, _, n in got] == [("a", 1), ("b", 1)]
    assert rdb.zrange(k.active, 0, -1, withscores=True) == [(b"a", 1_005_000.0), (b"b", 1_005_000.0)]
    assert rdb.hgetall(k.lease) == {b"a": b"w1.1", b"b": b"w1.1"}
    assert rdb.lrange(k.pending, 0, -1) == [b"c"]


def test_fetch_moves_the_idle_mark_of_the_fetching_worker(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    rdb.zadd(k.idle, {"dead": clock.ms - 1, "w2": clock.ms + 60_000})
    broker.run(broker.enqueue("q", [(i, spec(), 0) for i in ("a", "b", "c")]))
    # Queue not left empty: no mark (and one it had is removed).
    rdb.zadd(k.idle, {"w1": clock.ms + 1})
    got, empty = broker.run(broker.fetch_marking("q", 2, clock.ms + 5000, "w1.1", "w1", clock.ms + 6000))
    assert ([i for i, _, _ in got], empty) == (["a", "b"], False)
    assert rdb.zrange(k.idle, 0, -1) == [b"dead", b"w2"]
    # Left empty with a free slot: marked idle until the given time; marks of workers that died asleep go.
    got, empty = broker.run(broker.fetch_marking("q", 2, clock.ms + 5000, "w1.2", "w1", clock.ms + 6000))
    assert ([i for i, _, _ in got], empty) == (["c"], True)
    assert rdb.zrange(k.idle, 0, -1, withscores=True) == [(b"w1", clock.ms + 6000.0), (b"w2", clock.ms + 60_000.0)]
    assert rdb.hgetall(k.lease) == {b"a": b"w1.1", b"b": b"w1.1", b"c": b"w1.2"}
    # Left empty with every slot taken: no wake-up would help it, the mark goes.
    broker.run(broker.enqueue("q", [("d", spec(), 0)]))
    got, empty = broker.run(broker.fetch_marking("q", 1, clock.ms + 5000, "w1.3", "w1", clock.ms + 6000))
    assert ([i for i, _, _ in got], empty) == (["d"], True)
    assert rdb.zrange(k.idle, 0, -1) == [b"w2"]
    # Nothing ready, or paused: marked idle.
    assert broker.run(broker.fetch_marking("q", 1, clock.ms + 5000, "w1.4", "w1", clock.ms + 7000)) == ([], True)
    assert rdb.zscore(k.idle, "w1") == clock.ms + 7000
    broker.run(broker.enqueue("q", [("e", spec(), 0)]))
    broker.set_paused("q", True)
    rdb.zrem(k.idle, "w1")
    assert broker.run(broker.fetch_marking("q", 1, clock.ms + 5000, "w1.5", "w1", clock.ms + 8000)) == ([], True)
    assert rdb.zscore(k.idle, "w1") == clock.ms + 8000
    assert rdb.lrange(k.pending, 0, -1) == [b"e"]


def test_paused_queue_keeps_jobs(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    broker.run(broker.enqueue("q", [("a", spec(), 0)]))
    broker.set_paused("q", True)
    assert broker.run(broker.fetch("q", 10, clock.ms + 5000, "w")) == []
    broker.set_paused("q", False)
    assert len(broker.run(broker.fetch("q", 10, clock.ms + 5000, "w"))) == 1


def test_ack_requires_the_current_token(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    broker.run(broker.enqueue("q", [("a", spec(), 0)]))
    broker.run(broker.fetch("q", 1, clock.ms + 5000, "w1.1"))
    assert broker.run(broker.ack("q", [("a", "stale")])) == ["a"]
    assert rdb.hexists(k.jobs, "a")
    assert broker.run(broker.ack("q", [("a", "w1.1")])) == []
    assert not any(rdb.exists(x) for x in (k.active, k.lease, k.jobs, k.attempts))
    assert rdb.hget(k.stats, "processed") == b"1"


def test_extend_moves_deadline_only_for_the_owner(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    broker.run(broker.enqueue("q", [("a", spec(), 0)]))
    broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok"))
    assert broker.run(broker.extend("q", [("a", "tok", clock.ms + 9000)])) == []
    assert rdb.zscore(k.active, "a") == clock.ms + 9000
    assert broker.run(broker.extend("q", [("a", "other", clock.ms + 99_000)])) == ["a"]
    assert rdb.zscore(k.active, "a") == clock.ms + 9000


def test_recover_returns_expired_leases_to_the_head_marked_orphaned(
    broker: Broker, rdb: redis.Redis, clock: SimClock
) -> None:
    k = broker.keys.queue("q")
    broker.run(broker.enqueue("q", [("a", spec(), 0), ("b", spec(), 0)]))
    broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok"))  # a is leased, b waits
    assert broker.run(broker.recover("q")) == []  # lease still live
    clock.ms += 5001
    assert broker.run(broker.recover("q")) == ["a"]
    assert rdb.lrange(k.pending, 0, -1) == [b"b", b"a"]  # a runs next (RPOP takes the right end)
    assert not rdb.exists(k.active) and not rdb.hexists(k.lease, "a")
    assert rdb.hget(k.attempts, "a") == b"1"  # the orphaned attempt still counts
    hist = orjson.loads(rdb.hget(k.history, "a"))
    assert hist[0]["orphaned"] is True and hist[0]["attempt"] == 1
    # The stale owner can no longer ack.
    assert broker.run(broker.ack("q", [("a", "tok")])) == ["a"]
    got = broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok2"))
    assert got[0][0] == "a" and got[0][2] == 2


def test_retry_then_promote(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    broker.run(broker.enqueue("q", [("a", spec(), 0)]))
    broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok"))
    assert broker.run(broker.retry("q", "a", "tok", clock.ms + 1000, {"attempt": 1, "error": "E"}))
    assert rdb.zscore(k.retry, "a") == clock.ms + 1000 and not rdb.exists(k.active)
    assert broker.run(broker.promote("q")) == 0
    clock.ms += 1000
    assert broker.run(broker.promote("q")) == 1
    assert rdb.lrange(k.pending, 0, -1) == [b"a"] and not rdb.exists(k.retry)
    assert orjson.loads(rdb.hget(k.history, "a")) == [{"attempt": 1, "error": "E"}]


def test_requeue_does_not_burn_the_attempt(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    broker.run(broker.enqueue("q", [("a", spec(), 0), ("b", spec(), 0)]))
    broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok"))
    assert not broker.run(broker.requeue("q", "a", "wrong", 0, "requeued_on_shutdown"))
    assert broker.run(broker.requeue("q", "a", "tok", 0, "requeued_on_shutdown"))
    assert not rdb.hexists(k.attempts, "a")
    assert rdb.lrange(k.pending, 0, -1) == [b"b", b"a"]  # back at the head
    assert rdb.hget(k.stats, "requeued_on_shutdown") == b"1"


def test_dead_keeps_everything_and_replay_restores_the_same_id(
    broker: Broker, rdb: redis.Redis, clock: SimClock
) -> None:
    k = broker.keys.queue("q")
    original = JobSpec(task="t", args={"big": 12345678901234567890, "s": 'quote " and \\'}, enqueued_ms=1).encode()
    broker.run(broker.enqueue("q", [("a", original, 0)]))
    broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok"))
    fields = {"reason": "permanent", "error": "Permanent: no", "traceback": "tb", "task": "t", "queue": "q"}
    assert broker.run(broker.dead("q", "a", "tok", {"attempt": 1, "error": "no"}, fields))
    assert not rdb.hexists(k.jobs, "a") and not rdb.exists(k.active)
    record = orjson.loads(rdb.hget(k.dead_jobs, "a"))
    assert record["spec"].encode() == original  # byte for byte, big ints included
    assert record["reason"] == "permanent" and record["attempts"] == 1
    assert orjson.loads(record["history"]) == [{"attempt": 1, "error": "no"}]
    assert rdb.zscore(k.dead, "a") == clock.ms
    assert broker.run(broker.replay("q", ["a", "unknown"])) == ["a"]
    assert rdb.hget(k.jobs, "a") == original
    assert rdb.lrange(k.pending, 0, -1) == [b"a"]
    assert not rdb.exists(k.dead) and not rdb.exists(k.dead_jobs) and not rdb.hexists(k.attempts, "a")


def test_delete_dead_by_age(broker: Broker, rdb: redis.Redis, clock: SimClock) -> None:
    k = broker.keys.queue("q")
    for i in ("a", "b"):
        broker.run(broker.enqueue("q", [(i, spec(), 0)]))
        broker.run(broker.fetch("q", 1, clock.ms + 5000, "tok" + i))
        broker.run(broker.dead("q", i, "tok" + i, {}, {"reason": "x"}))
        clock.ms += 10_000
    assert broker.run(broker.delete_dead("q", older_than_ms=15_000)) == 1  # only a is older
    assert rdb.zrange(k.dead, 0, -1) == [b"b"]


def test_keys_share_one_hash_slot_per_queue(broker: Broker) -> None:
    from redis.crc import key_slot

    k = broker.keys.queue("critical")
    names = [getattr(k, f) for f in k.__dataclass_fields__ if f != "wake"]
    assert len({key_slot(n.encode()) for n in names}) == 1
    assert all(n.startswith(broker.keys.ns + ":") for n in names)
