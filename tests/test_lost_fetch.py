"""A fetch whose reply is lost (a timeout, a dropped connection) may still have leased jobs, even after the worker
gave up on it: a Redis that stood still runs it from its input buffer later. Nobody holds those jobs; the worker
gives them back (hand_back_fetch.lua) until the lease they got would have ended, their attempt not counted.

- the script, on the shared Redis: it gives back exactly the lost fetch's jobs (another fetch's with the same
  deadline stay leased, and so do those of the same fetch the worker holds), frees a concurrency key's slot, and
  the jobs are fetched again as attempt 1;
- a real worker, a private redis-server blocked by ``DEBUG SLEEP`` with the worker's fetch in its input buffer: the
  job that fetch leased after the sleep runs at once as attempt 1, not after its lease as attempt 2;
- a real worker whose fetch's reply a proxy drops, closing the connection: the client sends the fetch again and
  reads the second reply (it leased nothing: the first run took the job); the job runs at once as attempt 1;
- the plain asyncio client, by redis-py's path and by raw_calls.py's, counts such a resend in its Task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from redisfaults import FaultWorker, HalfOpenProxy, ran_once_at_once
from ringfence import App
from ringfence.redis.connection import ConnectionSettings, async_client, resent
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.redis.raw_calls import AsyncDirectCalls
from support import wait_until


def test_the_jobs_of_a_lost_fetch_go_back_unrun_and_uncounted(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(name="per_account", concurrency_key="account:{account}", concurrency_limit=1)
    async def per_account(ctx: Any, account: str) -> None:
        pass

    b = app.broker
    k, pfx, r = b.keys.queue("default"), b.keys.keyed("default"), b.sync
    jobs = [per_account.enqueue(account=a) for a in ("a", "b", "c")]
    deadline = b.clock() + 60_000
    assert b.run(b.hand_back_fetch("default", [("lost", deadline)])) == []  # the fetch has not run yet
    lost = [j[0] for j in b.run(b.fetch("default", 2, deadline, "lost"))]  # its reply "lost": nobody runs these
    other = [j[0] for j in b.run(b.fetch("default", 1, deadline, "other"))]  # same deadline, another token
    assert len(lost) == 2 and set(lost + other) == set(jobs)
    assert sorted(b.run(b.hand_back_fetch("default", [("lost", deadline)]))) == sorted(lost)
    for job in lost:
        assert r.hget(k.lease, job) is None and r.zscore(k.active, job) is None and r.hget(k.attempts, job) is None
    assert {m for a in "abc" for m in r.zrange(pfx + f"s:account:{a}", 0, -1)} == {f"{other[0]}:other".encode()}
    assert r.hget(k.lease, other[0]) == b"other" and r.zscore(k.active, other[0]) == deadline
    assert r.hget(k.stats, "handed_back") == b"2" and r.hget(k.stats, "orphaned") is None
    assert b.run(b.hand_back_fetch("default", [("lost", deadline)])) == []  # given back once
    twice = [j[0] for j in b.run(b.fetch("default", 2, deadline, "twice"))]  # sent twice: the worker holds one
    assert b.run(b.hand_back_fetch("default", [("twice", deadline)], twice[:1])) == twice[1:]
    assert r.hget(k.lease, twice[0]) == b"twice"
    b.run(b.hand_back_fetch("default", [("twice", deadline)]))
    again = b.run(b.fetch("default", 5, b.clock() + 60_000, "next"))  # their keys' slots were freed: no key parked
    assert sorted((job, attempt) for job, _, attempt in again) == sorted((job, 1) for job in lost)
    assert r.zrange(pfx + "parked", 0, -1) == []


def _slow(ctx: object, seconds: float) -> None:
    """The producer's side of faultapp.py's slow_a."""


def _pending_while_paused(app: App, task: Any, r: redis.Redis) -> str:
    """Once the worker sleeps idle, one job in queue "a", paused: no wake message leases it, the next idle fetch
    after the pause ends does."""
    k = app.broker.keys.queue("a")
    wait_until(lambda: r.zcard(k.idle) > 0, 20)
    app.broker.set_paused("a", True)
    job: str = task.enqueue(seconds=0.1)
    time.sleep(1.0)
    assert r.hget(k.lease, job) is None and r.llen(k.pending) == 1
    return job


def test_a_job_leased_by_a_fetch_whose_reply_was_lost_runs_at_once(private_redis: EmbeddedRedis,
                                                                    tmp_path: Path) -> None:
    """Redis blocked (``DEBUG SLEEP 3``) just as the queue is resumed, in the same write from another connection:
    an idle worker's fallback fetch waits in Redis's input buffer, the worker gives it up after its 1 s socket
    timeout, and Redis runs it after the sleep, leasing the job (lease 10 s) to a reply nobody reads. The job runs
    within 3 s of Redis answering, as attempt 1, once (else: at the end of its lease, as attempt 2)."""
    ns = "lostfetch"
    app = App(private_redis.url, ns, environment="test")
    task = app.task(name="faultapp.slow_a", queue="a")(_slow)
    k = app.broker.keys.queue("a")
    r = redis.Redis.from_url(private_redis.url)
    worker = FaultWorker(private_redis.url + "?socket_timeout=1", ns, tmp_path, "a", name="w",
                         env={"FAULT_LEASE_S": "10", "FAULT_HEARTBEAT_S": "0.5"})  # fetches every 0.5 s idle
    try:
        job = _pending_while_paused(app, task, r)
        with r.pipeline(transaction=False) as p:  # one write: Redis resumes the queue and sleeps at once
            p.delete(k.paused)
            p.execute_command("DEBUG", "SLEEP", "3")
            p.execute()
        answered = time.time()
        wait_until(lambda: list(tmp_path.glob(f"{job}.*.finished")), 20)
        stats = r.hgetall(k.stats)
        lines = worker.lines()
    finally:
        worker.stop()
        app.close()
    ran_once_at_once(tmp_path, job, answered, stats, lines)


def test_the_jobs_of_a_fetch_sent_twice_run_at_once(private_redis: EmbeddedRedis, tmp_path: Path) -> None:
    """A worker behind a proxy that drops the reply of the fetch leasing the job and closes that connection
    (Redis ran it): the client sends the fetch again on a new connection, which answers (the job is gone from
    pending). The job runs within 3 s of the drop, as attempt 1, once (else: at the end of its 10 s lease, as
    attempt 2)."""
    ns = "sentfetch"
    app = App(private_redis.url, ns, environment="test")
    task = app.task(name="faultapp.slow_a", queue="a")(_slow)
    k = app.broker.keys.queue("a")
    r = redis.Redis.from_url(private_redis.url)
    proxy = HalfOpenProxy(private_redis.port)
    worker = FaultWorker(proxy.url, ns, tmp_path, "a", name="w",
                         env={"FAULT_LEASE_S": "10", "FAULT_HEARTBEAT_S": "0.5"})  # fetches every 0.5 s idle
    try:
        job = _pending_while_paused(app, task, r)
        proxy.drop_reply_with(job.encode())
        r.delete(k.paused)  # the next idle fetch leases it
        wait_until(lambda: r.hget(k.stats, "processed") == b"1", 20)
        stats = r.hgetall(k.stats)
        lines = worker.lines()
    finally:
        worker.stop()
        proxy.close()
        app.close()
    assert proxy.dropped_at is not None
    print(f"started {ran_once_at_once(tmp_path, job, proxy.dropped_at, stats, lines):.3f}s after the dropped reply")


async def test_the_plain_client_counts_its_resends(private_redis: EmbeddedRedis) -> None:
    proxy = HalfOpenProxy(private_redis.port)
    client = async_client(proxy.url, ConnectionSettings())
    direct = AsyncDirectCalls(client)
    try:
        before = resent()
        proxy.drop_reply_with(b"first")
        assert await client.echo("first") == b"first"  # redis-py's path: Retry, its backoff asked once
        assert resent() == before + 1
        proxy.drop_reply_with(b"second")
        assert await direct.call("ECHO", "second") == b"second"
        assert resent() == before + 2
        assert await client.echo("third") == b"third" and await direct.call("ECHO", "fourth") == b"fourth"
        assert resent() == before + 2  # answered at the first try
    finally:
        await direct.close()
        await client.aclose()
        proxy.close()
