"""The check a worker runs when Redis answers again after failing (worker/acks.py ``check_lost``, ack_lost.lua),
on the shared Redis: a job acked and then back in its queue (as a failover that lost the ack leaves it) is
recorded and its rerun counts as attempt 2; a job whose lease is still the worker's is acked again; an ack
that stuck records nothing. On a private redis-server, killed and replaced on its port as a failover would: an
ack that failed to send, sent again and refused by the master answering now is recorded too, and a check that
found the node down is tried again until it answers; the acks sent before a failure are kept until it is checked,
however long the failover took."""

from __future__ import annotations

import asyncio
import time

import pytest

from ringfence.redis.broker import Broker
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.worker import acks as acks_module
from ringfence.worker.acks import Acks

SPEC = b'{"t":"noop","a":{"n":1},"e":1}'


def _kill(server: EmbeddedRedis) -> None:
    """SIGKILL, as a master dies in a failover; a new server on its port plays the promoted replica."""
    assert server.process is not None
    server.process.kill()
    server.process.wait()


async def test_acks_checked_after_an_outage(redis_url: str, namespace: str) -> None:
    b = Broker(redis_url, namespace)
    acks = Acks(b)
    try:
        assert b.run(b.enqueue("q", [("back", SPEC, 0), ("kept", SPEC, 0), ("held", SPEC, 0)], inline=True))
        fetched = {j[0]: j[1] for j in await b.arun(b.fetch("q", 3, b.clock() + 60_000, "w1.1"))}
        assert set(fetched) == {"back", "kept", "held"}
        for job_id, raw in fetched.items():
            acks.add("q", job_id, "w1.1", raw)
        await acks.flush()
        k = b.keys.queue("q")
        # A failover that lost the ack of "back" and its fetch: it is queued again, inline, never fetched.
        assert b.run(b.enqueue("q", [("back", SPEC, 0)], inline=True)) == [True]
        # ... and the ack of "held" but not its fetch: still leased to this worker.
        b.sync.hset(k.lease, "held", "w1.1")
        b.sync.zadd(k.active, {"held": b.clock() + 60_000})
        b.sync.hset(k.jobs, "held", fetched["held"])
        b.sync.hset(k.attempts, "held", 1)
        await acks.check_lost(time.monotonic())
        assert b.sync.hget(k.stats, "ack_lost") == b"1"
        [entry] = b.history("q", "back")
        assert entry["ack_lost"] is True and entry["attempt"] == 1 and "finished at" in entry["error"]
        assert b.history("q", "kept") == []
        await acks.flush()  # "held" was added again: acked now
        assert b.sync.hget(k.lease, "held") is None and b.sync.zscore(k.active, "held") is None
        [(job, _, attempt)] = await b.arun(b.fetch("q", 1, b.clock() + 60_000, "w2.1"))
        assert (job, attempt) == ("back", 2)
    finally:
        await b.aclose()
        b.close()


async def test_an_ack_that_failed_then_was_refused_is_recorded(private_redis: EmbeddedRedis) -> None:
    """The master died before the ack reached it; the one answering now had the enqueue but not the fetch: the ack
    sent again is refused (no lease), and the rerun it leaves is recorded before the worker stops."""
    b = Broker(private_redis.url, "ns")
    acks = Acks(b)
    promoted = None
    try:
        assert b.run(b.enqueue("q", [("gone", SPEC, 0)], inline=True))
        [(job_id, raw, attempt)] = await b.arun(b.fetch("q", 1, b.clock() + 60_000, "w1.1"))
        assert (job_id, attempt) == ("gone", 1)
        acks.add("q", "gone", "w1.1", raw)
        _kill(private_redis)
        with pytest.raises(UNAVAILABLE):
            await acks.flush()
        promoted = EmbeddedRedis.temporary(port=private_redis.port)
        assert b.run(b.enqueue("q", [("gone", SPEC, 0)], inline=True)) == [True]
        await acks.flush()
        await acks.stop(lease_s=5)
        k = b.keys.queue("q")
        assert b.sync.hget(k.stats, "ack_lost") == b"1"
        [entry] = b.history("q", "gone")
        assert entry["ack_lost"] is True and entry["attempt"] == 1 and "on w1," in entry["error"]
        [(job, _, attempt)] = await b.arun(b.fetch("q", 1, b.clock() + 60_000, "w2.1"))
        assert (job, attempt) == ("gone", 2)
    finally:
        await b.aclose()
        b.close()
        if promoted is not None:
            promoted.stop()


async def test_a_check_that_found_the_node_down_is_tried_again(private_redis: EmbeddedRedis) -> None:
    b = Broker(private_redis.url, "ns")
    acks = Acks(b)
    promoted = None
    try:
        assert b.run(b.enqueue("q", [("back", SPEC, 0)], inline=True))
        [(_, raw, _)] = await b.arun(b.fetch("q", 1, b.clock() + 60_000, "w1.1"))
        acks.add("q", "back", "w1.1", raw)
        await acks.flush()
        _kill(private_redis)
        check = asyncio.create_task(acks.check_lost(time.monotonic()))
        await asyncio.sleep(1.0)
        assert not check.done()
        promoted = EmbeddedRedis.temporary(port=private_redis.port)  # had the enqueue, neither fetch nor ack
        assert b.run(b.enqueue("q", [("back", SPEC, 0)], inline=True)) == [True]
        await asyncio.wait_for(check, timeout=5)
        assert b.sync.hget(b.keys.queue("q").stats, "ack_lost") == b"1"
    finally:
        await b.aclose()
        b.close()
        if promoted is not None:
            promoted.stop()


async def test_acks_sent_before_a_long_failover_are_kept_for_its_check(private_redis: EmbeddedRedis,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept 0.3 s here, the failover takes 1 s: the flush that finds Redis back does not drop them first."""
    monkeypatch.setattr(acks_module, "SENT_KEPT_S", 0.3)
    b = Broker(private_redis.url, "ns")
    acks = Acks(b)
    promoted = None
    try:
        assert b.run(b.enqueue("q", [("back", SPEC, 0), ("later", SPEC, 0)], inline=True))
        fetched = {j[0]: j[1] for j in await b.arun(b.fetch("q", 2, b.clock() + 60_000, "w1.1"))}
        acks.start()
        acks.add("q", "back", "w1.1", fetched["back"])
        await acks.flush()
        _kill(private_redis)
        acks.add("q", "later", "w1.1", fetched["later"])  # the flusher fails, and tries again every 0.5 s
        await asyncio.sleep(1.0)
        promoted = EmbeddedRedis.temporary(port=private_redis.port)
        other = Broker(private_redis.url, "ns")  # the worker's own flush is the first call to see Redis back
        assert other.run(other.enqueue("q", [("back", SPEC, 0), ("later", SPEC, 0)], inline=True)) == [True, True]
        other.close()
        k = b.keys.queue("q")
        deadline = time.monotonic() + 5
        while b.sync.hget(k.stats, "ack_lost") != b"2" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert b.sync.hget(k.stats, "ack_lost") == b"2"  # back's by the check, later's by its refused ack
        assert [e["ack_lost"] for e in b.history("q", "back")] == [True]
    finally:
        await acks.stop(lease_s=5)
        await b.aclose()
        b.close()
        if promoted is not None:
            promoted.stop()
