"""The wake carries the job (enqueue_ready.lua, redis/waker.py, worker/fetcher.py): an enqueue while a worker
sleeps leases the job to it inside the script and sends it in the wake message, so the worker starts it with no
fetch. A lease that looks like a fetch's; a message lost with its connection is handed back once the worker
subscribes again; a worker gone while idle
gets nothing; a worker never runs more than its concurrency. A private redis-server, so the commands Redis served
and its pub/sub clients are this test's alone."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ringfence import App, WorkerSettings
from ringfence.models import JobSpec, new_job_id
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.redis.scripts import script
from ringfence.worker.worker import Worker
from support import wait_until
from test_worker import until

SETTINGS = WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                          shutdown_timeout_s=3.0, server_ttl_s=3.0)


@pytest.fixture
def app(private_redis: EmbeddedRedis) -> Iterator[App]:
    a = App(private_redis.url, f"t{uuid.uuid4().hex[:8]}", environment="test", worker=SETTINGS)
    yield a
    a.close()


def _fetched_ids(app: App) -> list[str]:
    """Every job id a fetch returned from now on (a hook on the broker's fetch call)."""
    got: list[str] = []
    fetch_marking = app.broker.fetch_marking

    def counted(*args: Any, **kw: Any) -> Any:
        call = fetch_marking(*args, **kw)

        def parse(raw: Any) -> Any:
            jobs, empty = call.parse(raw)
            got.extend(j[0] for j in jobs)
            return jobs, empty
        return call._replace(parse=parse)

    app.broker.fetch_marking = counted  # type: ignore[method-assign]
    return got


def _raw_enqueue(p: Any, app: App, queue: str, task: str) -> str:
    """Queue a plain job through enqueue_ready.lua on pipeline ``p`` (so a test can put it in a MULTI)."""
    job_id = new_job_id()
    spec = JobSpec.plain(task, {}, app.broker.clock(), 1)
    call = app.broker.enqueue(queue, [(job_id, spec, 0)], inline=True)
    assert call.name == "enqueue_ready"
    p.eval(script("enqueue_ready").for_server(True)[0], len(call.keys), *call.keys, *call.args)
    return job_id


@contextlib.asynccontextmanager
async def _running(worker: Worker) -> AsyncIterator[asyncio.Task[Any]]:
    """The worker running (its task), stopped on the way out."""
    runner = asyncio.create_task(worker.run())
    try:
        yield runner
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)


def _recording(app: App, name: str = "t") -> tuple[list[tuple[str, int]], Any]:
    """A task that records (id, attempt) of each run."""
    runs: list[tuple[str, int]] = []

    @app.task(name=name)
    async def t(ctx: Any) -> None:
        runs.append((ctx.id, ctx.attempt))

    return runs, t


async def _idle(app: App, worker: Worker, runner: asyncio.Task[Any], *queues: str) -> None:
    keys = [app.broker.keys.queue(q).idle for q in queues]
    await until(lambda: all(app.broker.sync.zscore(k, worker.server_id) for k in keys), runner, timeout=10)
    await asyncio.sleep(0.1)  # past the mark: asleep on the wake channel


async def test_an_idle_worker_starts_a_pushed_job_with_a_lease_like_a_fetchs_and_no_fetch(app: App) -> None:
    r, k = app.broker.sync, app.broker.keys.queue("default")
    seen: list[tuple[Any, ...]] = []
    release = asyncio.Event()

    @app.task
    async def t(ctx: Any) -> None:
        seen.append((ctx.id, ctx.attempt, r.zscore(k.active, ctx.id), r.hget(k.lease, ctx.id)))
        await release.wait()

    fetched = _fetched_ids(app)
    worker = Worker(app, concurrency=2)
    async with _running(worker) as runner:
        for n in range(1, 4):
            await _idle(app, worker, runner, "default")
            job = t.enqueue()
            await until(lambda n=n: len(seen) == n, runner)
            job_id, attempt, deadline, token = seen[-1]
            assert (job_id, attempt) == (job, 1)
            assert deadline is not None and token is not None and token.decode().startswith(worker.server_id)
            assert r.hget(k.attempts, job) == b"1"
            release.set()
            await until(lambda job=job: not r.hexists(k.jobs, job), runner)  # acked under the pushed token
            release.clear()
    assert fetched == []  # each job came in its wake message: no fetch returned one
    assert r.hget(k.stats, "processed") == b"3"
    assert not r.zcard(k.active) and not r.hlen(k.lease) and not r.hlen(k.attempts)


@pytest.fixture
def long_leases(private_redis: EmbeddedRedis) -> Iterator[App]:
    """Leases of 20 s (the default): a job left to lease recovery would wait that long."""
    settings = WorkerSettings(lease_s=20.0, heartbeat_s=5.0, recover_interval_s=0.5, promote_interval_s=0.1,
                              shutdown_timeout_s=3.0, server_ttl_s=10.0)
    a = App(private_redis.url, f"t{uuid.uuid4().hex[:8]}", environment="test", worker=settings)
    yield a
    a.close()


def _kill_listener(r: Any, p: Any) -> None:
    """Kill (on pipeline ``p``) the worker's pub/sub connection: redis-py reconnects and subscribes again."""
    [listener] = [c for c in r.client_list() if int(c["sub"]) > 0]
    p.client_kill_filter(_id=listener["id"])


async def test_a_pushed_job_whose_message_is_lost_is_handed_back_once_the_worker_resubscribes(long_leases: App) -> None:
    app = long_leases
    r, k = app.broker.sync, app.broker.keys.queue("default")
    runs, _ = _recording(app)
    worker = Worker(app)
    async with _running(worker) as runner:
        await _idle(app, worker, runner, "default")
        with r.pipeline(transaction=True) as p:  # leased and published, then the connection killed unread
            job = _raw_enqueue(p, app, "default", "t")
            _kill_listener(r, p)
            p.execute()
        t0 = time.monotonic()
        assert r.zscore(k.active, job) is not None  # leased to the worker whose connection died
        await until(lambda: runs, runner, timeout=20)
        started_s = time.monotonic() - t0
        await until(lambda: not r.hexists(k.jobs, job), runner)
        await asyncio.sleep(0.5)  # no second run
    assert runs == [(job, 1)]  # handed back, its attempt not counted: not left to the lease's 20 s
    assert started_s < 5, started_s
    assert worker.processor.fetcher.waker.recovered == 1
    assert r.hget(k.stats, "handed_back") == b"1" and r.hget(k.stats, "orphaned") is None


async def test_a_job_pushed_and_running_is_not_handed_back_when_the_worker_resubscribes(long_leases: App) -> None:
    app = long_leases
    r, k = app.broker.sync, app.broker.keys.queue("default")
    runs: list[tuple[str, int]] = []
    release = asyncio.Event()

    @app.task(name="t")
    async def t(ctx: Any) -> None:
        runs.append((ctx.id, ctx.attempt))
        await release.wait()

    fetched = _fetched_ids(app)
    worker = Worker(app, concurrency=2)
    waker = worker.processor.fetcher.waker
    async with _running(worker) as runner:
        await _idle(app, worker, runner, "default")
        job = t.enqueue()
        await until(lambda: runs, runner)
        token = r.hget(k.lease, job)
        await _idle(app, worker, runner, "default")  # one slot free: asleep again
        with r.pipeline(transaction=True) as p:
            _kill_listener(r, p)
            p.execute()
        await until(lambda: waker.checks == 1, runner, timeout=10)
        assert r.hget(k.lease, job) == token and r.llen(k.pending) == 0  # still its lease, not queued again
        assert job in {j for _, j in waker.taken.values()}
        release.set()
        await until(lambda: not r.hexists(k.jobs, job), runner)
        await _idle(app, worker, runner, "default")
        with r.pipeline(transaction=True) as p:  # once more: a job acked is forgotten by the check
            _kill_listener(r, p)
            p.execute()
        await until(lambda: waker.checks == 2, runner, timeout=10)
        assert waker.taken == {}
    assert runs == [(job, 1)] and fetched == []  # pushed, run once
    assert waker.recovered == 0 and r.hget(k.stats, "handed_back") is None


async def test_jobs_enqueued_while_the_worker_resubscribes_each_run_once(long_leases: App) -> None:
    app = long_leases
    r, k = app.broker.sync, app.broker.keys.queue("default")
    runs: list[tuple[str, int]] = []

    @app.task(name="t")
    async def t(ctx: Any) -> None:
        runs.append((ctx.id, ctx.attempt))
        await asyncio.sleep(0.01)

    worker = Worker(app, concurrency=4)
    jobs: list[str] = []
    async with _running(worker) as runner:
        for _ in range(3):
            await _idle(app, worker, runner, "default")
            with r.pipeline(transaction=True) as p:
                jobs.append(_raw_enqueue(p, app, "default", "t"))
                _kill_listener(r, p)
                p.execute()
            for _ in range(20):  # pushed, or queued, around the reconnect and the check
                jobs.append(t.enqueue())
                await asyncio.sleep(0.01)
            await until(lambda: len(runs) >= len(jobs), runner, timeout=10)
        await asyncio.sleep(0.5)  # no second run
    assert sorted(runs) == sorted((j, 1) for j in jobs)  # each once, no attempt counted twice
    assert worker.processor.fetcher.waker.checks >= 3
    assert not r.zcard(k.active) and not r.llen(k.pending)


async def test_a_mark_nobody_listens_on_is_dropped_and_the_job_pushed_to_the_next_worker(app: App) -> None:
    r, k = app.broker.sync, app.broker.keys.queue("default")
    runs, t = _recording(app)
    fetched = _fetched_ids(app)
    worker = Worker(app)
    async with _running(worker) as runner:
        await _idle(app, worker, runner, "default")
        # a worker SIGKILLed while idle: its mark outlives it (first in line: the earliest end), nobody listens
        r.zadd(k.idle, {"gone.1": app.broker.clock() + 1000})
        r.hset(k.idle_lease, "gone.1", 2000)
        job = t.enqueue()
        await until(lambda: runs, runner)
    assert runs == [(job, 1)] and fetched == []  # pushed to the worker that listens
    assert r.zscore(k.idle, "gone.1") is None
    assert not r.hexists(k.lease, job)


async def test_a_worker_pushed_more_jobs_than_its_free_slots_hands_the_extra_back(app: App) -> None:
    r = app.broker.sync
    running, most, runs = [0], [0], []

    async def body(ctx: Any) -> None:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.3)
        runs.append((ctx.id, ctx.attempt))
        running[0] -= 1

    app.task(name="ta", queue="a")(body)
    app.task(name="tb", queue="b")(body)
    worker = Worker(app, [("a", 1), ("b", 1)], concurrency=1)
    async with _running(worker) as runner:
        await _idle(app, worker, runner, "a", "b")
        with r.pipeline(transaction=True) as p:  # a mark in each queue, each a promise of the one free slot
            jobs = [_raw_enqueue(p, app, "a", "ta"), _raw_enqueue(p, app, "b", "tb")]
            p.execute()
        await until(lambda: len(runs) == 2, runner)
    assert most[0] == 1
    assert sorted(runs) == sorted((j, 1) for j in jobs)  # the one handed back: its attempt not counted
    handed = [r.hget(app.broker.keys.queue(q).stats, "handed_back") for q in ("a", "b")]
    assert sorted(handed, key=str) == sorted([None, b"1"], key=str)


def test_a_worker_sigkilled_while_idle_gets_no_job_and_another_runs_them(redis_url, namespace, rdb,
                                                                         spawn_worker) -> None:
    from test_processes import producer, records

    app, m = producer(redis_url, namespace)
    k = app.broker.keys.queue("default")
    first, second = spawn_worker(), spawn_worker()
    wait_until(lambda: rdb.zcard(k.idle) == 2, timeout=60)  # both asleep on their wake channels
    first.kill()
    jobs = [m.noop.enqueue(n=n) for n in range(5)]  # each offered to an idle worker: only the live one hears
    wait_until(lambda: {r[0] for r in records(rdb, namespace, "runs")} == set(jobs), timeout=30)
    assert second.proc.poll() is None
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 5)


def test_a_worker_that_leaves_no_lease_length_gets_a_plain_wake_and_the_job_stays_pending(app: App) -> None:
    r, k = app.broker.sync, app.broker.keys.queue("default")

    @app.task(name="t")
    def t(ctx: Any) -> None: ...

    sub = r.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(k.wake, f"{k.wake}:old.1")
    r.zadd(k.idle, {"old.1": app.broker.clock() + 60_000})  # an older release's mark: no idle_lease entry
    job = t.enqueue()
    messages = [sub.get_message(timeout=0.2) for _ in range(6)]  # the subscribe replies read as None
    assert [m["channel"] for m in messages if m] == [k.wake.encode()]
    assert r.llen(k.pending) == 1 and not r.zscore(k.active, job) and r.zscore(k.idle, "old.1")
    sub.close()


async def test_a_worker_that_will_not_wait_leaves_no_idle_mark_for_pushes(make_app: Any) -> None:
    # One slot, queues a then b (strict): a is found empty with the slot free (marked idle there), then b fills
    # the slot. A mark left in a would have enqueues there lease jobs to a worker that cannot take them.
    app = make_app(worker=WorkerSettings(heartbeat_s=30, lease_s=60, server_ttl_s=90))
    release = asyncio.Event()
    started: list[str] = []

    @app.task(name="tb", queue="b")
    async def tb(ctx: Any) -> None:
        started.append(ctx.id)
        await release.wait()

    idle_a = app.broker.keys.queue("a").idle
    tb.enqueue()
    worker = Worker(app, [("a", 1), ("b", 1)], concurrency=1, strict=True)
    async with _running(worker) as runner:
        await until(lambda: started, runner)
        await until(lambda: app.broker.sync.zscore(idle_a, worker.server_id) is None, runner, timeout=5)
        release.set()
        await until(lambda: app.broker.sync.zscore(idle_a, worker.server_id), runner, timeout=10)  # idle again


async def test_no_job_is_pushed_while_its_queue_is_paused(app: App) -> None:
    r, k = app.broker.sync, app.broker.keys.queue("default")
    runs, t = _recording(app)
    worker = Worker(app)
    async with _running(worker) as runner:
        await _idle(app, worker, runner, "default")  # marked idle, with its lease length, before the pause
        app.broker.set_paused("default", True)
        job = t.enqueue()
        await asyncio.sleep(1.5)  # three fallback fetches
        assert runs == [] and r.llen(k.pending) == 1 and not r.zscore(k.active, job)
        app.broker.set_paused("default", False)
        await until(lambda: runs == [(job, 1)], runner)
