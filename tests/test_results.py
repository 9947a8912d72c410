"""Job results (store_result=True): stored by a real in-process worker on the shared Redis, read back with
app.result / app.aresult before and after the job finishes, expired by their TTL, failures and non-JSON return
values raised with the job and reason, and ``ringfence job show`` as a real process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from ringfence import App, ConfigError, JobFailed, ResultTimeout, RetryPolicy, UnknownJob
from ringfence.jobs import cancel_job
from ringfence.queries import find_dead
from test_worker import run_until


class Total(BaseModel):
    order_id: int
    cents: int


def declare(app: App) -> dict[str, Any]:
    @app.task(name="add", store_result=True)
    def add(ctx: Any, a: int, b: int) -> int:
        return a + b

    @app.task(name="total", store_result=True, result_ttl_s=60)
    async def total(ctx: Any, order_id: int) -> Total:
        await asyncio.sleep(0)
        return Total(order_id=order_id, cents=4200)

    @app.task(name="short", store_result=True, result_ttl_s=0.3)
    def short(ctx: Any) -> str:
        return "soon gone"

    @app.task(name="boom", store_result=True, retry=RetryPolicy(max_attempts=1))
    async def boom(ctx: Any) -> None:
        raise ValueError("card declined")

    @app.task(name="stamp", store_result=True)
    def stamp(ctx: Any, n: int) -> dict[str, Any]:
        return {"ok": True, "when": datetime(2026, 1, 1, tzinfo=UTC)}

    @app.task(name="plain")
    def plain(ctx: Any) -> int:
        return 7

    return {"add": add, "total": total, "short": short, "boom": boom, "stamp": stamp, "plain": plain}


def done(app: App, *ids: str) -> Callable[[], bool]:
    return lambda: all(app.broker.job_state("default", i) in (None, "dead") for i in ids)


async def test_sync_and_async_handlers_results_read_after_they_finish(make_app: Callable[..., App],
                                                                      rdb: redis.Redis) -> None:
    app = make_app()
    t = declare(app)
    add, total, plain = t["add"].enqueue(a=2, b=3), t["total"].enqueue(order_id=42), t["plain"].enqueue()
    await run_until(app, done(app, add, total, plain))
    assert app.result(add, timeout=1) == 5
    assert await app.aresult(total, timeout=1) == {"order_id": 42, "cents": 4200}  # a model comes back as JSON
    assert 0 < rdb.pttl(app.broker.keys.result(total)) <= 60_000  # the task's result_ttl_s
    assert rdb.pttl(app.broker.keys.result(add)) > 86_000_000  # the default: a day
    assert not rdb.exists(app.broker.keys.result(plain))  # a task without store_result stores nothing
    with pytest.raises(UnknownJob, match=plain):
        app.result(plain, timeout=0)  # finished, forgotten: no result was kept
    assert app.result(add, timeout=0) == 5  # read again: the record stays until its TTL


async def test_waiting_before_the_job_runs(make_app: Callable[..., App]) -> None:
    app = make_app()
    t = declare(app)
    add, total = t["add"].enqueue(a=20, b=22), t["total"].enqueue(order_id=1)
    got: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: got.setdefault("add", app.result(add, timeout=20)))
    waiter.start()
    awaiting = asyncio.create_task(app.aresult(total, timeout=20))
    await asyncio.sleep(0.3)  # both wait on the result key before any worker exists
    assert not awaiting.done() and waiter.is_alive()
    await run_until(app, done(app, add, total))
    assert await asyncio.wait_for(awaiting, 5) == {"order_id": 1, "cents": 4200}
    await asyncio.to_thread(waiter.join, 5)
    assert got == {"add": 42}


async def test_result_expires_after_its_ttl(make_app: Callable[..., App]) -> None:
    app = make_app()
    job = declare(app)["short"].enqueue()
    await run_until(app, done(app, job))
    assert app.result(job, timeout=0) == "soon gone"
    time.sleep(0.4)
    with pytest.raises(UnknownJob):
        app.result(job, timeout=0)


async def test_a_failing_job_raises_job_failed_for_waiters_before_and_after(make_app: Callable[..., App]) -> None:
    app = make_app()
    job = declare(app)["boom"].enqueue()
    early = asyncio.create_task(app.aresult(job, timeout=20))
    await asyncio.sleep(0.1)
    await run_until(app, lambda: app.broker.job_state("default", job) == "dead")
    with pytest.raises(JobFailed) as raised:
        await asyncio.wait_for(early, 5)
    assert raised.value.job_id == job and raised.value.reason == "max_attempts"
    assert job in str(raised.value) and "card declined" in raised.value.error
    with pytest.raises(JobFailed, match="max_attempts"):
        app.result(job, timeout=0)


async def test_a_replayed_job_is_waited_for_again_not_answered_by_its_old_failure(
        make_app: Callable[..., App]) -> None:
    app = make_app()
    runs: list[int] = []

    @app.task(name="flaky", store_result=True, retry=RetryPolicy(max_attempts=1))
    async def flaky(ctx: Any) -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ValueError("first run fails")
        return "second run works"

    job = flaky.enqueue()
    await run_until(app, lambda: app.broker.job_state("default", job) == "dead")
    with pytest.raises(JobFailed):
        await app.aresult(job, timeout=0)
    assert app.broker.run(app.broker.replay("default", [job])) == [job]  # a person replays it after a fix
    waiting = asyncio.create_task(app.aresult(job, timeout=20))
    sync_waiting = asyncio.create_task(asyncio.to_thread(app.result, job, 20))
    await asyncio.sleep(0.3)
    assert not waiting.done() and not sync_waiting.done()  # the old failure does not answer them
    await run_until(app, lambda: waiting.done() and sync_waiting.done())
    assert waiting.result() == sync_waiting.result() == "second run works"


async def test_a_result_that_is_not_json_dead_letters_the_job_with_its_payload(make_app: Callable[..., App]) -> None:
    app = make_app()
    job = declare(app)["stamp"].enqueue(n=1)
    await run_until(app, lambda: app.broker.job_state("default", job) == "dead")
    dead = find_dead(app.broker, job)
    assert dead is not None and dead.reason == "bad_result" and "result.when" in dead.error
    assert dead.attempts == 1  # not retried: the handler ran, a retry would repeat its effect
    assert dead.args == {"n": 1}  # the payload is kept for a replay
    with pytest.raises(JobFailed) as raised:
        app.result(job, timeout=0)
    assert raised.value.reason == "bad_result" and "datetime" in raised.value.error


def test_unknown_ids_timeouts_and_tasks_without_results(make_app: Callable[..., App]) -> None:
    app = make_app()
    t = declare(app)
    with pytest.raises(UnknownJob, match="nosuchjob"):
        app.result("nosuchjob", timeout=5)  # raised at once, not after the timeout
    job = t["add"].enqueue(a=1, b=1)  # no worker runs it
    started = time.monotonic()
    with pytest.raises(ResultTimeout, match=job):
        app.result(job, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 2
    with pytest.raises(ConfigError, match="store_result"):
        app.result(t["plain"].enqueue(), timeout=1)
    cancelled = t["add"].enqueue(a=1, b=2)
    cancel_job(app, cancelled)
    with pytest.raises(UnknownJob):
        app.result(cancelled, timeout=5)
    with pytest.raises(ConfigError, match="result_ttl_s"):
        app.task(name="x", result_ttl_s=5)(lambda ctx: None)
    with pytest.raises(ConfigError, match="timeout"):
        app.result(job, timeout=-1)


async def test_job_show_prints_state_and_result(make_app: Callable[..., App], redis_url: str,
                                                namespace: str) -> None:
    app = make_app()
    t = declare(app)
    job, failed = t["add"].enqueue(a=4, b=5), t["boom"].enqueue()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
           "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}

    def show(job_id: str) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-m", "ringfence.cli", "job", "show", job_id], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    assert show(job)["state"] == "pending" and "result" not in show(job)
    await run_until(app, done(app, job, failed))
    shown = show(job)
    assert (shown["state"], shown["result"], shown["task"], shown["queue"]) == ("done", 9, "add", "default")
    assert show(failed)["state"] == "dead" and show(failed)["reason"] == "max_attempts"
