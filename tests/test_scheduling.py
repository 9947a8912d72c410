"""Priorities, aging, pause, cron ticks, unique enqueue, retry profiles, breakers and global limits."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections import Counter

import pytest

from ringfence import ConfigError, RetryPolicy
from ringfence.errors import DuplicateJob
from ringfence.queries import breakers, queue_info
from ringfence.redis.broker import Broker
from ringfence.scheduler import Scheduler
from ringfence.settings import BreakerPolicy
from support import SimClock, wait_until
from test_worker import run_until

QUEUES = [("critical", 6), ("default", 3), ("low", 1)]


def order_app(make_app, per_queue: int):
    app = make_app()
    seen: list[str] = []

    @app.task
    async def t(ctx) -> None:
        seen.append(ctx.queue)

    for q, _ in QUEUES:
        app.enqueue_many(t, [{}] * per_queue, queue=q)
    return app, seen


async def test_weighted_shares_and_no_starvation(make_app) -> None:
    app, seen = order_app(make_app, 1500)
    await run_until(app, lambda: len(seen) >= 1000, timeout=60, queues=QUEUES, concurrency=1)
    shares = Counter(seen[:1000])
    # Expected 600/300/100; the tolerance is about four standard deviations of a multinomial draw.
    assert abs(shares["critical"] - 600) <= 65
    assert abs(shares["default"] - 300) <= 60
    assert abs(shares["low"] - 100) <= 40
    assert "low" in seen[:100]  # the low-weight queue is served from the start


async def test_strict_order(make_app) -> None:
    app, seen = order_app(make_app, 50)
    await run_until(app, lambda: len(seen) == 150, queues=QUEUES, concurrency=1, strict=True)
    assert seen == ["critical"] * 50 + ["default"] * 50 + ["low"] * 50


async def test_starvation_bound_serves_an_old_low_job_first(make_app) -> None:
    app = make_app()
    seen: list[str] = []

    @app.task
    async def t(ctx) -> None:
        seen.append(ctx.queue)
        await asyncio.sleep(0.002)

    t.with_options(queue="low").enqueue()
    app.enqueue_many(t, [{}] * 3000, queue="critical")
    await asyncio.sleep(0.3)
    await run_until(app, lambda: "low" in seen, timeout=30, queues=[("critical", 1), ("low", 1)], concurrency=1,
                    strict=True, max_wait={"low": 0.2})
    assert seen.index("low") < 100  # without the bound it would come after all 3,000 critical jobs


async def test_paused_queue_keeps_its_jobs_until_resumed(make_app) -> None:
    from click.testing import CliRunner

    from ringfence.cli import main as cli

    app = make_app()
    done: list[int] = []

    @app.task
    async def t(ctx, n: int) -> None:
        done.append(n)

    env = {"RINGFENCE_REDIS_URL": app.redis_url, "RINGFENCE_NAMESPACE": app.namespace}
    app.broker.register_queues(["default"])  # pause refuses a queue the namespace never used (a typo)
    assert CliRunner().invoke(cli, ["queue", "pause", "default"], env=env).exit_code == 0
    app.enqueue_many(t, [{"n": i} for i in range(5)])
    await run_until(app, lambda: True)
    await asyncio.sleep(0)
    assert done == [] and queue_info(app.broker, "default")["pending"] == 5
    assert queue_info(app.broker, "default")["paused"] is True
    CliRunner().invoke(cli, ["queue", "resume", "default"], env=env)
    await run_until(app, lambda: len(done) == 5)


def cron_app(make_app, catch_up: str = "last"):
    app = make_app()

    @app.periodic("* * * * *", name="every_minute", catch_up=catch_up)
    async def every_minute(ctx) -> None: ...

    return app


async def test_three_concurrent_schedulers_enqueue_each_tick_once(make_app, rdb) -> None:
    app = cron_app(make_app)
    start = 1_800_000_000_000 // 60_000 * 60_000 + 5_000  # 5 s past a minute
    clock = SimClock(start)
    schedulers = [Scheduler(app.periodics, Broker(app.redis_url, app.namespace, clock=clock)) for _ in range(3)]
    while clock.ms < start + 30 * 60_000:  # 30 simulated minutes, checked every 7 s by all three at once
        await asyncio.gather(*(s.tick() for s in schedulers))
        clock.ms += 7_000
    jobs = sorted(x.decode() for x in rdb.hkeys(app.broker.keys.queue("default").jobs))
    ticks = [int(j.rsplit(":", 1)[1]) for j in jobs]
    # The minute just before the start (within the misfire grace), then each of the 30 minutes.
    assert len(jobs) == 31 and len(set(ticks)) == 31
    assert all(b - a == 60_000 for a, b in itertools.pairwise(ticks))
    assert rdb.llen(app.broker.keys.queue("default").pending) == 31


@pytest.mark.parametrize(("mode", "expected"), [("none", 0), ("last", 1), ("all", 10)])
async def test_catch_up_after_downtime(make_app, rdb, mode, expected) -> None:
    app = cron_app(make_app, mode)
    start = 1_800_000_000_000 // 60_000 * 60_000 + 1_000
    clock = SimClock(start)
    s = Scheduler(app.periodics, Broker(app.redis_url, app.namespace, clock=clock), misfire_grace_s=30)
    await s.tick()
    pending = app.broker.keys.queue("default").pending
    before = rdb.llen(pending)
    clock.ms += 10 * 60_000 + 40_000  # ten minutes down; the last missed tick is 40 s old (beyond the grace)
    await s.tick()
    await s.tick()
    assert rdb.llen(pending) - before == expected


def test_periodic_declaration_errors(make_app) -> None:
    app = make_app()
    with pytest.raises(ConfigError, match="not a valid cron"):
        app.periodic("every minute")(lambda ctx: None)
    with pytest.raises(ConfigError, match="catch_up"):
        app.periodic("* * * * *", catch_up="some")(lambda ctx: None)


def test_unique_enqueue(make_app, rdb) -> None:
    app = make_app()

    @app.task(unique_for=60, unique_key="order:{order_id}")
    async def receipt(ctx, order_id: int, note: str = "") -> None: ...

    first = receipt.enqueue(order_id=1)
    assert receipt.enqueue(order_id=1, note="again") == first  # the existing job's id
    with pytest.raises(DuplicateJob) as err:
        receipt.with_options(raise_on_duplicate=True).enqueue(order_id=1)
    assert err.value.existing_id == first
    other = receipt.enqueue(order_id=2)
    assert other != first
    assert rdb.llen(app.broker.keys.queue("default").pending) == 2
    # Once the first job is gone (done), the key is free again.
    app.broker.sync.hdel(app.broker.keys.queue("default").jobs, first)
    assert receipt.enqueue(order_id=1) not in (first, other)
    # Without unique_for, the same payload queues twice.
    plain = make_app()

    @plain.task
    async def p(ctx, order_id: int) -> None: ...

    assert p.enqueue(order_id=1) != p.enqueue(order_id=1)


async def test_unique_key_is_free_after_the_job_ran(make_app) -> None:
    app = make_app()
    runs: list[str] = []

    @app.task(unique_for=60)
    async def t(ctx, n: int) -> None:
        runs.append(ctx.id)

    a = t.enqueue(n=1)
    await run_until(app, lambda: runs)
    b = t.enqueue(n=1)
    assert a != b


def test_retry_profiles(make_app) -> None:
    app = make_app(retry_profiles={"psp": RetryPolicy(max_attempts=5, base_s=1, cap_s=10)})

    @app.task(retry="psp")
    def charge(ctx) -> None: ...

    assert charge.options.retry.max_attempts == 5
    with pytest.raises(ConfigError, match="retry profile 'nope'"):
        app.task(retry="nope")(lambda ctx: None)
    app.retry_profile("slow", RetryPolicy(max_attempts=30, base_s=600, cap_s=3600))
    with pytest.raises(ConfigError, match="expiry_s"):
        app.task(retry="slow")(lambda ctx: None)


async def test_breaker_opens_delays_without_burning_half_opens_and_closes(make_app) -> None:
    app = make_app(retry=RetryPolicy(max_attempts=10, base_s=0.05, cap_s=0.05, jitter=False))
    app.breaker("psp", BreakerPolicy(failures=3, window_s=30, open_s=1.0, probe_timeout_s=5))
    healthy = {"ok": False}
    calls: list[tuple[float, bool]] = []

    @app.task(dependency="psp")
    async def call_psp(ctx, n: int) -> None:
        calls.append((time.monotonic(), healthy["ok"]))
        if not healthy["ok"]:
            raise ConnectionError("psp down")

    ids = app.enqueue_many(call_psp, [{"n": i} for i in range(5)])
    state = lambda: breakers(app.broker)[0]["state"] if app.broker.dependencies() else "closed"  # noqa: E731
    # One job at a time, so the count of calls that reached the dependency is exact.
    await run_until(app, lambda: state() == "open" and len(calls) >= 3, timeout=20, concurrency=1)
    await asyncio.sleep(0.3)
    failing_calls = len(calls)
    assert failing_calls == 3  # the third failure opened it; nothing else reached the dependency
    healthy["ok"] = True
    await run_until(app, lambda: queue_info(app.broker, "default")["processed"] == 5, timeout=20, concurrency=1)
    assert state() == "closed"
    transitions = breakers(app.broker)[0]["transitions"]
    assert [t.split("@")[0] for t in reversed(transitions)] == ["closed>open", "open>half_open", "half_open>closed"]
    stats = app.broker.queue_counts("default")["stats"]
    assert stats["breaker_delayed"] >= 1 and stats.get("dead", 0) == 0
    # Delayed jobs kept their attempts: five jobs, three failures, then one success each.
    assert len(calls) == 8 and len(ids) == 5


async def test_rate_limit_per_dependency(make_app) -> None:
    app = make_app()
    app.breaker("mailer", BreakerPolicy(rate_per_s=4))
    starts: list[float] = []

    @app.task(dependency="mailer")
    async def send(ctx, n: int) -> None:
        starts.append(time.time())

    app.enqueue_many(send, [{"n": i} for i in range(12)])
    await run_until(app, lambda: len(starts) == 12, timeout=30, concurrency=12)
    # 12 jobs at 4 per second need three one-second windows: the starts span more than a second.
    assert max(starts) - min(starts) >= 0.9
    assert app.broker.queue_counts("default")["stats"]["rate_limited"] >= 1


def test_rate_limit_windows_on_a_simulated_clock(make_app) -> None:
    app = make_app()
    clock = SimClock(1_000_000_100)
    b = Broker(app.redis_url, app.namespace, clock=clock)
    allowed = [b.run(b.breaker_allow("api", 4, 1000)) for _ in range(6)]
    assert [a[0] for a in allowed] == [True] * 4 + [False] * 2
    assert allowed[4][1:] == (900, "rate_limited")  # wait until the next second
    clock.ms += 900
    assert [b.run(b.breaker_allow("api", 4, 1000))[0] for _ in range(5)] == [True] * 4 + [False]


@pytest.mark.slow
def test_global_concurrency_limit_holds_while_workers_are_killed(redis_url, namespace, rdb, spawn_worker) -> None:
    from test_processes import producer, records

    app, m = producer(redis_url, namespace)
    app.enqueue_many(m.limited, [{"seconds": 0.3}] * 16)
    workers = [spawn_worker("--concurrency", "4") for _ in range(3)]
    wait_until(lambda: len(records(rdb, namespace, "started")) >= 3, timeout=30)
    workers[0].signal(signal.SIGKILL)
    killed_at = time.time()
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed", 0) == 16, timeout=60)
    events = []
    finished = {(r[0], r[1]): float(r[2]) for r in records(rdb, namespace, "finished")}
    for job, attempt, t in records(rdb, namespace, "started"):
        end = finished.get((job, attempt), killed_at)  # a killed run ended when its worker died
        events += [(float(t), 1), (end, -1)]
    running = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        peak = max(peak, running)
    assert peak <= 2
    assert app.broker.slot_holders("task", "workerapp.limited") == 0  # every slot was given back or expired

