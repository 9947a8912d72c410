"""Inline pending jobs (redis/keys.py): a job ready now, with a generated id, no unique key and no stored result
is queued as '<id><spec>' in the pending list with no jobs-hash entry; fetch moves its spec into the hash. Every
reader of a queued job finds it, a retried enqueue never runs twice at once, and old entries still run."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
import redis

from ringfence import App
from ringfence.jobs import browse, cancel_job, find_job, purge_queue
from ringfence.models import JobSpec
from ringfence.queries import queue_info
from ringfence.redis import observe, reads
from ringfence.redis.keys import INLINE_MAX_BYTES, split_entry
from ringfence.worker.worker import Worker
from support import SimClock

pytest.importorskip("starlette")
with warnings.catch_warnings():  # Starlette's note on which HTTP client its TestClient prefers
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from ringfence.dashboard import create_app  # after the skip: it needs starlette


@pytest.fixture
def app(make_app: Any, clock: SimClock) -> App:
    a = make_app(clock=clock)

    @a.task(name="work")
    async def work(ctx: Any, n: int) -> None:
        ran.append((ctx.id, n))

    @a.task(name="blob")
    async def blob(ctx: Any, s: str) -> None: ...

    @a.task(name="keep", store_result=True)
    async def keep(ctx: Any, n: int) -> int:
        return n

    ran: list[tuple[str, int]] = []
    a.ran = ran  # type: ignore[attr-defined]
    return a


def entries(app: App, queue: str = "default") -> list[bytes]:
    return app.broker.sync.lrange(app.broker.keys.queue(queue).pending, 0, -1)  # type: ignore[return-value]


def fetch(app: App, clock: SimClock, n: int = 10) -> list[tuple[str, bytes, int]]:
    return app.broker.run(app.broker.fetch("default", n, clock.ms + 60_000, "w.1"))


def old_format(app: App, job_id: str, n: int) -> None:
    """A job as a release before inline entries queued it: the id in pending, the spec in the jobs hash."""
    k = app.broker.keys.queue("default")
    spec = JobSpec("work", {"n": n}, app.broker.clock()).encode()
    app.broker.sync.hset(k.jobs, job_id, spec)
    app.broker.sync.lpush(k.pending, job_id)


def test_a_plain_enqueue_is_inline_and_the_others_keep_the_jobs_hash(app: App, rdb: redis.Redis) -> None:
    k = app.broker.keys.queue("default")
    job = app.enqueue("work", n=1)
    [entry] = entries(app)
    job_id, spec = split_entry(entry)
    assert job_id == job and spec is not None and JobSpec.decode(spec).args == {"n": 1}
    assert not rdb.hexists(k.jobs, job)
    work = app.registry.get("work")
    assert work is not None
    hashed = [work.with_options(job_id="explicit-1").enqueue(n=2),
              work.with_options(unique_for=60).enqueue(n=3),
              work.with_options(delay_s=60).enqueue(n=4),
              app.enqueue("keep", n=5)]  # its result is waited on by id: found in O(1)
    assert all(rdb.hexists(k.jobs, i) for i in hashed)
    big = app.enqueue("blob", s="x" * INLINE_MAX_BYTES)  # a spec past the inline limit
    assert rdb.hexists(k.jobs, big) and big.encode() in entries(app)
    many = app.enqueue_many("work", [{"n": i} for i in range(3)])
    assert not any(rdb.hexists(k.jobs, i) for i in many)


def test_fetch_moves_the_spec_into_the_hash_in_fifo_order_with_old_entries(app: App, rdb: redis.Redis,
                                                                           clock: SimClock) -> None:
    k = app.broker.keys.queue("default")
    old_format(app, "old-1", 1)
    new = app.enqueue("work", n=2)
    old_format(app, "old-2", 3)
    got = fetch(app, clock)
    assert [(i, JobSpec.decode(s).args["n"], a) for i, s, a in got] == [("old-1", 1, 1), (new, 2, 1), ("old-2", 3, 1)]
    assert JobSpec.decode(rdb.hget(k.jobs, new)).args == {"n": 2}  # type: ignore[arg-type]
    assert rdb.zscore(k.active, new) is not None and rdb.hget(k.lease, new) == b"w.1"
    assert rdb.llen(k.pending) == 0


def test_a_retried_enqueue_runs_once_while_the_first_is_queued_or_running(app: App, rdb: redis.Redis,
                                                                          clock: SimClock) -> None:
    """redis-py resends a script whose reply was lost: the same call, the same generated id, twice."""
    k = app.broker.keys.queue("default")
    spec = JobSpec("work", {"n": 1}, app.broker.clock()).encode()
    call = app.broker.enqueue("default", [("gen-1", spec, 0)], inline=True)
    assert app.broker.run(call) == [True] and app.broker.run(call) == [True]  # both copies queued
    assert len(entries(app)) == 2
    assert [i for i, _, _ in fetch(app, clock)] == ["gen-1"]  # both in one fetch: the second is dropped
    assert rdb.hget(k.stats, "duplicates") == b"1"
    app.broker.run(call)  # a third copy arrives while the first runs
    assert fetch(app, clock) == [] and rdb.hget(k.stats, "duplicates") == b"2"
    assert rdb.hget(k.attempts, "gen-1") == b"1"


async def test_a_worker_runs_a_mixed_list_once_each(app: App, rdb: redis.Redis) -> None:
    old_format(app, "old-1", 1)
    new = [app.enqueue("work", n=i) for i in (2, 3)]
    old_format(app, "old-2", 4)
    worker = Worker(app)
    runner = asyncio.create_task(worker.run())
    try:
        for _ in range(500):
            if len(app.ran) == 4:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.02)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    assert sorted(app.ran) == sorted([("old-1", 1), (new[0], 2), (new[1], 3), ("old-2", 4)])  # type: ignore[attr-defined]
    k = app.broker.keys.queue("default")
    assert not rdb.exists(k.jobs) and not rdb.exists(k.pending)


def test_job_show_state_spec_and_browse_find_an_inline_job(app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads, "PENDING_SLICE", 150)  # the lookup walks the list in several slices
    job = app.enqueue("work", n=7)
    app.enqueue_many("work", [{"n": i} for i in range(500)])
    old_format(app, "old-1", 8)
    b = app.broker
    assert b.job_state("default", job) == "pending" and b.job_state("default", "old-1") == "pending"
    assert b.job_state("default", "no-such-job") is None
    assert JobSpec.decode(b.job_spec("default", job) or b"").args == {"n": 7}  # type: ignore[arg-type]
    view = find_job(app, job)
    assert view is not None and (view.state, view.task, view.args) == ("pending", "work", {"n": 7})
    oldest = browse(app, "default", "pending", 0, 2)
    assert [(v.id, v.task, v.args) for v in oldest] == [(job, "work", {"n": 7}), (oldest[1].id, "work", {"n": 0})]
    assert browse(app, "default", "pending", 501, 5)[0].id == "old-1"
    web = TestClient(create_app(app, token=""))
    page = web.get(f"/jobs?id={job}")
    assert page.status_code == 200 and "pending" in page.text and "work" in page.text


def test_cancel_an_inline_job_and_the_queued_copy_of_a_running_one(app: App, rdb: redis.Redis,
                                                                    clock: SimClock) -> None:
    k = app.broker.keys.queue("default")
    keep = app.enqueue("work", n=1)
    job = app.enqueue("work", n=2)
    assert cancel_job(app, job) == ("default", "pending")
    assert [split_entry(e)[0] for e in entries(app)] == [keep]
    assert rdb.hget(k.stats, "cancelled") == b"1"
    spec = JobSpec("work", {"n": 3}, app.broker.clock()).encode()
    call = app.broker.enqueue("default", [("gen-2", spec, 0)], inline=True)
    app.broker.run(call)
    fetch(app, clock, 2)  # keep and gen-2 run
    app.broker.run(call)  # a retried enqueue's copy of gen-2, queued while it runs
    assert cancel_job(app, "gen-2") == ("default", "active")
    assert entries(app) == [] and not rdb.hexists(k.jobs, "gen-2")  # the copy left with it: it never runs


def test_purge_deletes_inline_jobs_and_keeps_a_running_jobs_record(app: App, rdb: redis.Redis,
                                                                   clock: SimClock) -> None:
    k = app.broker.keys.queue("default")
    spec = JobSpec("work", {"n": 3}, app.broker.clock()).encode()
    call = app.broker.enqueue("default", [("gen-3", spec, 0)], inline=True)
    app.broker.run(call)
    fetch(app, clock)
    app.broker.run(call)  # a copy of the running gen-3
    app.enqueue_many("work", [{"n": i} for i in range(5)])
    old_format(app, "old-1", 9)
    assert purge_queue(app, "default") == (7, 0)
    assert not rdb.exists(k.pending) and not rdb.hexists(k.jobs, "old-1")
    assert rdb.hget(k.jobs, "gen-3") == spec and rdb.hget(k.attempts, "gen-3") == b"1"


async def test_counts_latency_versions_and_the_doctors_sample_read_inline_jobs(app: App, clock: SimClock) -> None:
    b = app.broker
    first_ms = b.clock()
    app.enqueue("work", n=1)
    clock.advance(5.0)
    app.enqueue_many("work", [{"n": i} for i in range(3)])
    old_format(app, "old-1", 9)
    assert abs(b.queue_counts("default")["oldest_enqueued_ms"] - first_ms) < 2
    assert abs((await b.oldest_enqueued_ms("default") or 0) - first_ms) < 2
    info = queue_info(b, "default")
    assert info["pending"] == 5 and info["versions"] == {"work@v1": 5} and info["versions_exact"]
    sample, total = observe.waiting_jobs(b, "default")
    assert total == 5 and sorted(JobSpec.decode_head(h, n).args.get("n") for h, n, _ in sample) == [0, 1, 1, 2, 9]
    purge_queue(app, "default")
    old_format(app, "old-2", 1)  # the oldest entry of an old release: its spec is in the hash
    clock.advance(5.0)
    app.enqueue("work", n=1)
    assert abs(b.queue_counts("default")["oldest_enqueued_ms"] - (b.clock() - 5000)) < 2
    assert abs((await b.oldest_enqueued_ms("default") or 0) - (b.clock() - 5000)) < 2
    heads, exact = b.run(b.spec_heads("default", size=1))  # a sample of both the hash and the list
    assert not exact and len(heads) == 1
    assert all(JobSpec.decode_head(h, n).task == "work" for h, n in heads)
