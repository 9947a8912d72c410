"""The app that real worker processes in the tests run. Handlers record what they did in Redis."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import redis

from ringfence import Permanent, RetryPolicy
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(environment=os.environ.get("RINGFENCE_ENV", "test"),
                 shutdown_timeout_s=float(os.environ.get("TEST_SHUTDOWN_S", "3")),
                 retry=RetryPolicy(max_attempts=3, base_s=0.1, cap_s=0.5))
r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])


def log(kind: str, *values: object) -> None:
    r.rpush(f"{ns}:test:{kind}", " ".join(str(v) for v in values))


if os.environ.get("TEST_RECORD_BOOTS"):  # worker processes count their starts
    log("boots", os.getpid())


@app.task
async def noop(ctx, n: int) -> None:
    log("runs", ctx.id, n)


@app.task
async def slow(ctx, seconds: float, first_s: float | None = None) -> None:
    """Sleeps ``seconds`` (``first_s`` on the first attempt, when given: one that is meant to be killed)."""
    log("started", ctx.id, ctx.attempt, time.time())
    await asyncio.sleep(first_s if first_s is not None and ctx.attempt == 1 else seconds)
    log("finished", ctx.id, ctx.attempt, time.time())


@app.task
def slow_sync(ctx, seconds: float) -> None:
    log("started", ctx.id, ctx.attempt, time.time())
    time.sleep(seconds)
    log("finished", ctx.id, ctx.attempt, time.time())


@app.task
def spins(ctx, seconds: float) -> None:
    """A short call that keeps its CPU (and the GIL) busy, noting which job thread ran it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    r.sadd(f"{ns}:test:threads", threading.current_thread().name)
    log("runs", ctx.id)


@app.task(timeout_s=0.5)
def hangs(ctx, seconds: float) -> None:
    log("started", ctx.id, ctx.attempt, time.time())
    time.sleep(seconds)


def span(ctx, seconds: float) -> None:
    """Busy for ``seconds`` ignoring ``ctx.cancelled`` (as a blocking call would); keeps "start last-seen"
    of this run in a hash every 20 ms, and "start end done" once it returns, so overlapping runs show."""
    key, run = f"{ns}:test:spans", f"{ctx.id} {ctx.attempt} {os.getpid()}"
    start = time.time()
    while (now := time.time()) - start < seconds:
        r.hset(key, run, f"{start} {now}")
        time.sleep(0.02)
    r.hset(key, run, f"{start} {time.time()} done")


@app.task(timeout_s=0.5)
def overruns(ctx, seconds: float) -> None:
    span(ctx, seconds)


@app.task
def lingers(ctx, first_s: float, then_s: float) -> None:
    span(ctx, first_s if ctx.attempt == 1 else then_s)


@app.task
async def interval(ctx, seconds: float) -> None:
    """Records [start, end] so a test can check two runs of one job never overlap."""
    start = time.time()
    await asyncio.sleep(seconds)
    log("intervals", ctx.id, start, time.time())


@app.task
async def refuses(ctx) -> None:
    raise Permanent("card declined")


@app.task(concurrency=2)
async def limited(ctx, seconds: float) -> None:
    log("started", ctx.id, ctx.attempt, time.time())
    await asyncio.sleep(seconds)
    log("finished", ctx.id, ctx.attempt, time.time())


@app.task
def watches(ctx, seconds: float) -> None:
    """Runs until ``ctx.cancelled`` is set (then records it) or ``seconds`` pass."""
    log("started", ctx.id, ctx.attempt, time.time())
    if ctx.cancelled.wait(seconds):
        log("cancelled", ctx.id)
