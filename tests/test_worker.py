"""The worker in-process against the real Redis: outcomes, retries, dead-letter, replay, shutdown."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from ringfence import App, DeadJob, Permanent, RetryLater, RetryPolicy
from ringfence.cli import main as cli
from ringfence.queries import DeadFilter, dead_jobs, find_dead, queue_info
from ringfence.worker.worker import Worker
from support import SimClock, drive


async def until(done: Callable[[], Any], runner: asyncio.Task[Any], timeout: float = 30) -> None:
    """Wait (real time) for ``done()`` while the worker ``runner`` keeps running."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "condition not met in time"
        assert not runner.done(), runner.result()
        await asyncio.sleep(0.02)


async def run_until(app: App, done: Callable[[], Any], timeout: float = 15, **kw: Any) -> Worker:
    worker = Worker(app, **kw)
    await drive(worker, done, timeout)
    return worker


async def test_retries_follow_the_profile_and_stop_at_max_attempts(make_app, clock: SimClock) -> None:
    app = make_app(clock=clock)  # time moves only when the test says: each delay is checked to the millisecond
    runs: list[int] = []
    dead: list[DeadJob] = []
    app.on_dead(dead.append)

    @app.task(retry=RetryPolicy(max_attempts=4, base_s=0.2, cap_s=0.3, jitter=False))
    async def flaky(ctx) -> None:
        runs.append(clock.ms)
        raise ConnectionError(f"attempt {ctx.attempt}")

    job = flaky.enqueue()
    k = app.broker.keys.queue("default")
    retry_at = lambda: app.broker.sync.zscore(k.retry, job)  # noqa: E731
    worker = Worker(app)
    runner = asyncio.create_task(worker.run())
    try:
        # No jitter: 0.2, 0.3 (cap), 0.3 after attempts 1, 2, 3; the fourth failure is the last.
        for attempt, delay_ms in enumerate([200, 300, 300], start=1):
            await until(lambda n=attempt: len(runs) == n and retry_at() is not None, runner)
            assert retry_at() == clock.ms + delay_ms
            clock.advance((delay_ms - 1) / 1000)  # a millisecond early: the promoter's script moves nothing
            assert app.broker.run(app.broker.promote("default")) == 0 and len(runs) == attempt
            clock.advance(0.001)  # due: the promoter moves it, a fetch runs it
        await until(lambda: dead, runner)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    assert len(runs) == 4
    assert [b - a for a, b in itertools.pairwise(runs)] == [200, 300, 300]
    [d] = dead
    assert d.id == job and d.reason == "max_attempts" and d.attempts == 4
    stored = find_dead(app.broker, job)
    assert stored is not None and [h["attempt"] for h in stored.history] == [1, 2, 3, 4]
    assert "ConnectionError: attempt 4" in stored.error and "Traceback" in stored.traceback
    info = queue_info(app.broker, "default")
    assert info["dead"] == 1 and info["failed"] == 4 and info["pending"] == info["retry"] == info["active"] == 0


async def test_permanent_error_goes_straight_to_dead_letter(make_app) -> None:
    app = make_app()
    runs = []

    class CardDeclined(Exception):
        pass

    @app.task(permanent=(CardDeclined,))
    async def charge(ctx, kind: str) -> None:
        runs.append(kind)
        raise Permanent("no such order") if kind == "p" else CardDeclined("declined")

    charge.enqueue(kind="p")
    charge.enqueue(kind="c")
    await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 2)
    assert sorted(runs) == ["c", "p"]  # one run each, no retry
    reasons = {j.args["kind"]: (j.reason, j.attempts) for j in dead_jobs(app.broker, DeadFilter())}
    assert reasons == {"p": ("permanent", 1), "c": ("permanent", 1)}


async def test_replay_runs_a_dead_job_again_under_the_same_id(make_app) -> None:
    app = make_app()
    fixed = {"ok": False}
    seen: list[tuple[str, int]] = []

    @app.task(max_attempts=1)
    async def job(ctx) -> None:
        seen.append((ctx.id, ctx.attempt))
        if not fixed["ok"]:
            raise ValueError("bug")

    job_id = job.enqueue()
    await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 1)
    fixed["ok"] = True
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["dead", "replay", "--task", job.name], env=_env(app))
    assert result.exit_code == 0, result.output
    assert "replayed 1" in result.output
    await run_until(app, lambda: queue_info(app.broker, "default")["processed"] == 1)
    assert seen == [(job_id, 1), (job_id, 1)]  # same id, attempts reset
    assert queue_info(app.broker, "default")["dead"] == 0


def _env(app: App) -> dict[str, str]:
    return {"RINGFENCE_REDIS_URL": app.redis_url, "RINGFENCE_NAMESPACE": app.namespace}


async def test_dead_cli_filters_and_refuses_without_selection(make_app) -> None:
    from click.testing import CliRunner

    app = make_app()

    @app.task(max_attempts=1)
    async def fails(ctx, n: int) -> None:
        raise ValueError(f"timeout talking to bank {n}" if n % 2 else "bad data")

    app.enqueue_many(fails, [{"n": i} for i in range(6)])
    await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 6)
    runner = CliRunner()
    res = runner.invoke(cli, ["dead", "replay"], env=_env(app))
    assert res.exit_code == 2 and "--all" in res.output
    res = runner.invoke(cli, ["dead", "list", "--json", "--error", "BANK"], env=_env(app))
    import orjson

    assert len(orjson.loads(res.output)) == 3
    res = runner.invoke(cli, ["dead", "delete", "--error", "bad data"], env=_env(app))
    assert "deleted 3" in res.output
    res = runner.invoke(cli, ["dead", "show", "nope"], env=_env(app))
    assert res.exit_code == 2 and "not in dead-letter: nope" in res.output


async def test_retry_later_does_not_burn_attempts(make_app) -> None:
    app = make_app()
    attempts: list[int] = []

    @app.task(max_attempts=1)
    async def waits(ctx) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) < 3:
            raise RetryLater("provider busy", delay_s=0.05)

    waits.enqueue()
    await run_until(app, lambda: queue_info(app.broker, "default")["processed"] == 1)
    assert attempts == [1, 1, 1]


async def test_sync_and_async_handlers_and_context(make_app) -> None:
    app = make_app()
    seen: dict[str, Any] = {}

    @app.task(queue="q1")
    def sync_task(ctx, a: int) -> None:
        import threading

        seen["sync"] = (ctx.task, ctx.queue, ctx.attempt, threading.current_thread().name, a)

    @app.task(queue="q2")
    async def async_task(ctx, b: str) -> None:
        seen["async"] = (ctx.id, ctx.enqueued_at.year, b)

    sync_task.enqueue(a=1)
    job = async_task.enqueue(b="x")
    await run_until(app, lambda: len(seen) == 2, queues=[("q1", 1), ("q2", 1)])
    assert seen["sync"][:3] == (sync_task.name, "q1", 1) and seen["sync"][3].startswith("ringfence-job")
    assert seen["async"][0] == job and seen["async"][2] == "x"


async def test_async_timeout_cancels_the_job(make_app) -> None:
    app = make_app()
    cancelled = []

    @app.task(timeout_s=0.2, max_attempts=1)
    async def hangs(ctx) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    hangs.enqueue()
    await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 1)
    assert cancelled == [True]
    [d] = dead_jobs(app.broker, DeadFilter())
    assert "timed out after 0.2s" in d.error


async def test_unknown_task_is_kept_not_lost(make_app) -> None:
    producer = make_app()

    @producer.task(name="only.in.new.release")
    def newer(ctx) -> None: ...

    newer.enqueue()
    consumer = make_app()

    @consumer.task
    def other(ctx) -> None: ...

    await run_until(consumer, lambda: queue_info(consumer.broker, "default")["scheduled"] == 1)
    info = queue_info(consumer.broker, "default")
    assert info["dead"] == 0 and info["processed"] == 0


async def test_graceful_shutdown_requeues_unfinished_async_job_without_burning(make_app) -> None:
    app = make_app()
    started = asyncio.Event()
    saw_cancel = []

    @app.task
    async def long(ctx) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw_cancel.append(ctx.cancelled.is_set())
            raise

    job = long.enqueue()
    worker = Worker(app)
    runner = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.monotonic()
    worker.request_stop()
    await asyncio.wait_for(runner, 15)
    # Bounded by shutdown_timeout_s (3 s), not by the job's 60 s; the slack is for a loaded machine.
    assert time.monotonic() - t0 < app.worker_settings.shutdown_timeout_s + 7
    assert saw_cancel == [True]
    k = app.broker.keys.queue("default")
    assert app.broker.sync.lrange(k.pending, 0, -1) == [job.encode()]
    assert app.broker.attempts("default", job) == 0  # not burned
    assert app.broker.sync.zcard(k.active) == 0


async def test_idle_worker_wakes_on_enqueue_without_polling(make_app) -> None:
    from ringfence import WorkerSettings

    # A long heartbeat: the fallback timer fires only every 30 s, so a start within 15 s of the enqueue (however
    # loaded the machine) is a wake-up, and a worker that only polled would start nothing before the deadline.
    app = make_app(worker=WorkerSettings(heartbeat_s=30, lease_s=60, server_ttl_s=90))
    started: list[float] = []

    @app.task
    async def t(ctx) -> None:
        started.append(time.time() * 1000 - ctx.enqueued_ms)

    worker = Worker(app)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(1.0)  # idle: asleep on the wake channel (fallback timer is heartbeat_s)
        for n in range(1, 6):
            await t.aenqueue()
            await until(lambda n=n: len(started) == n, runner, timeout=app.worker_settings.heartbeat_s / 2)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    assert len(started) == 5
    # Far below the fallback interval: the worker was woken, not polling.
    assert max(started) < app.worker_settings.heartbeat_s * 1000 / 2


async def test_idle_worker_of_two_queues_is_woken_by_each_and_marked_only_while_idle(make_app) -> None:
    from ringfence import WorkerSettings

    # The idle marks move with the fetches (fetch.lua): a worker that found both queues empty is marked in
    # both, a job in either wakes it (the fallback timer is 30 s away), and it leaves no mark when it stops.
    app = make_app(worker=WorkerSettings(heartbeat_s=30, lease_s=60, server_ttl_s=90))
    started: list[str] = []

    @app.task(queue="a")
    async def ta(ctx) -> None:
        started.append("a")

    @app.task(queue="b")
    async def tb(ctx) -> None:
        started.append("b")

    b = app.broker
    idle = [b.keys.queue(q).idle for q in ("a", "b")]
    worker = Worker(app, [("a", 1), ("b", 1)], concurrency=2)
    runner = asyncio.create_task(worker.run())
    try:
        await until(lambda: all(b.sync.zscore(key, worker.server_id) for key in idle), runner, timeout=10)
        for n, task in enumerate([tb, ta, tb, ta], 1):
            await task.aenqueue()
            await until(lambda n=n: len(started) == n, runner, timeout=10)
            await until(lambda: all(b.sync.zscore(key, worker.server_id) for key in idle), runner, timeout=10)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    assert started == ["b", "a", "b", "a"]
    assert not any(b.sync.zscore(key, worker.server_id) for key in idle)


@pytest.mark.parametrize("bad", ["critical=x", "critical=0", "", "bad name=1"])
def test_queue_spec_errors(bad: str) -> None:
    from ringfence.errors import ConfigError
    from ringfence.worker.worker import parse_queues

    with pytest.raises(ConfigError):
        parse_queues(bad)


async def test_dead_letter_retention_is_explicit(make_app, clock: SimClock) -> None:
    import dataclasses

    keep = make_app(clock=clock)

    @keep.task(max_attempts=1)
    async def fails(ctx) -> None:
        raise ValueError("x")

    fails.enqueue()
    await run_until(keep, lambda: queue_info(keep.broker, "default")["dead"] == 1)
    clock.advance(365 * 86_400)  # a year later
    await run_until(keep, lambda: True)
    assert queue_info(keep.broker, "default")["dead"] == 1  # no retention configured: kept

    keep.worker_settings = dataclasses.replace(keep.worker_settings, dead_retention_s=0.5)
    await run_until(keep, lambda: queue_info(keep.broker, "default")["dead"] == 0, timeout=10)


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_a_lost_sync_run_keeps_its_slot_until_its_thread_returns(make_app, clock: SimClock,
                                                                      concurrency: int) -> None:
    """Another attempt takes the lease of a sync job whose thread cannot be stopped. The old thread keeps its
    slot: a later job does not wait in the pool behind it (its timeout would run meanwhile), and the job's
    next run in this process starts only once the old thread has returned."""
    import threading

    app = make_app(clock=clock)
    spans: dict[tuple[str, int], list[float]] = {}
    started = threading.Event()

    cancelled: list[bool] = []
    contexts: list[Any] = []

    @app.task
    def long(ctx) -> None:
        contexts.append(ctx)
        spans[("long", ctx.attempt)] = [time.monotonic()]
        started.set()
        time.sleep(3.5 if ctx.attempt == 1 else 0.1)  # ignores ctx.cancelled, as a blocking call would
        cancelled.append(ctx.cancelled.is_set())
        spans[("long", ctx.attempt)].append(time.monotonic())

    @app.task(timeout_s=0.5)
    def short(ctx) -> None:
        spans[("short", ctx.attempt)] = [time.monotonic()]
        time.sleep(0.2)
        spans[("short", ctx.attempt)].append(time.monotonic())

    job = long.enqueue()
    worker = Worker(app, concurrency=concurrency)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(started.wait, 10)
        k = app.broker.keys.queue("default")
        app.broker.sync.hset(k.lease, job, "another-attempt")  # what a recovery by another worker leaves
        await until(lambda: contexts[0].cancelled.is_set(), runner)  # a heartbeat found the lease lost
        clock.advance(app.worker_settings.lease_s)  # then it runs out: the job goes back to the queue
        short.enqueue()
        deadline = time.monotonic() + 20
        while queue_info(app.broker, "default")["processed"] < 2:
            assert time.monotonic() < deadline and not runner.done()
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 15)
    assert worker.exit_code == 0  # no spurious restart
    first, second, quick = spans[("long", 1)], spans[("long", 2)], spans[("short", 1)]
    assert second[0] >= first[1]  # one run of the job at a time in this process
    assert cancelled == [True, False]  # the lost run was told to stop
    if concurrency == 1:
        assert quick[0] >= first[1]  # not fetched while the lost thread held the only slot
    assert app.broker.history("default", job) == []  # acked once, by the second run
    stats = app.broker.queue_counts("default")["stats"]
    assert stats["processed"] == 2 and stats.get("failed", 0) == 0 and stats["orphaned"] == 1


async def test_a_timeout_error_raised_by_a_sync_handler_is_its_own_failure(make_app) -> None:
    app = make_app()

    @app.task(timeout_s=5, max_attempts=1)
    def calls_out(ctx) -> None:
        raise TimeoutError("read timed out talking to the bank")

    calls_out.enqueue()
    worker = await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 1)
    assert worker.exit_code == 0  # the job's time bound did not expire: no restart
    [d] = dead_jobs(app.broker, DeadFilter())
    assert "read timed out talking to the bank" in d.error and "Traceback" in d.traceback
