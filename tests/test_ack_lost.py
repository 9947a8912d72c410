"""The check a worker runs when Redis answers again after failing (worker/acks.py ``check_lost``, ack_lost.lua),
on the shared Redis: a job acked and then back in its queue (as a failover that lost the ack leaves it) is
recorded and its rerun counts as attempt 2; a job whose lease is still the worker's is acked again; an ack
that stuck records nothing."""

from __future__ import annotations

import time

from ringfence.redis.broker import Broker
from ringfence.worker.acks import Acks

SPEC = b'{"t":"noop","a":{"n":1},"e":1}'


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
