"""The app of tests/test_lifetime.py's worker processes: handlers that watch ``ctx.cancelled`` once a second, or
ignore it, and record each run in Redis (the ``span`` of tests/workerapp.py, so overlapping runs show)."""

from __future__ import annotations

import asyncio
import os
import time

import redis

from ringfence import RetryLater, RetryPolicy
from support import worker_app

ns = os.environ["RINGFENCE_NAMESPACE"]
app = worker_app(shutdown_timeout_s=float(os.environ.get("TEST_SHUTDOWN_S", "5")),
                 retry=RetryPolicy(max_attempts=3, base_s=0.1, cap_s=0.2))
r = redis.Redis.from_url(os.environ["RINGFENCE_REDIS_URL"])


def log(kind: str, *values: object) -> None:
    r.rpush(f"{ns}:test:{kind}", " ".join(str(v) for v in values))


def span(ctx, seconds: float, watch: bool) -> bool:
    """Busy for ``seconds`` in steps of one second; with ``watch``, stops at the first step that finds
    ``ctx.cancelled`` set (True: it did). Keeps "start last-seen" of this run in a hash, "start end done" once
    it returns."""
    key, run = f"{ns}:test:spans", f"{ctx.id} {ctx.attempt} {os.getpid()}"
    start = time.time()
    while time.time() - start < seconds:
        r.hset(key, run, f"{start} {time.time()}")
        if watch and ctx.cancelled.is_set():
            log("cancelled", ctx.id, ctx.attempt, time.time())
            r.hset(key, run, f"{start} {time.time()} done")
            return True
        end = min(time.time() + 1.0, start + seconds)
        while (now := time.time()) < end:  # one "step": blind to ctx.cancelled, as a blocking call would be
            r.hset(key, run, f"{start} {now}")
            time.sleep(0.02)
    r.hset(key, run, f"{start} {time.time()} done")
    return False


@app.task(timeout_s=0.5)
def overruns(ctx, seconds: float) -> None:
    """Past its timeout on the first attempt; it watches ``ctx.cancelled`` and returns within a second of it."""
    span(ctx, seconds if ctx.attempt == 1 else 0.1, watch=True)


@app.task(timeout_s=0.5)
def stuck(ctx, seconds: float) -> None:
    """Blind to ``ctx.cancelled`` for ``seconds`` on the first attempt (a call that cannot be interrupted)."""
    span(ctx, seconds if ctx.attempt == 1 else 0.1, watch=False)


@app.task
def steps(ctx, seconds: float, requeue: bool) -> None:
    """A long job in one-second steps; when ``ctx.cancelled`` is set it stops after the step, and either returns
    (its work is complete as far as it goes) or asks to be run again without an attempt counted."""
    if span(ctx, seconds, watch=True) and requeue:
        raise RetryLater("stopped for shutdown", delay_s=0)
    log("finished", ctx.id, ctx.attempt)


@app.task
async def asteps(ctx, seconds: float) -> None:
    """``steps`` as a coroutine: it finishes its current one-second step once ``ctx.cancelled`` is set."""
    start = time.time()
    while time.time() - start < seconds and not ctx.cancelled.is_set():
        await asyncio.sleep(1.0)
    log("finished", ctx.id, ctx.attempt)


@app.task
async def noop(ctx, n: int) -> None:
    log("runs", ctx.id, n)


@app.task(max_attempts=1)
async def fails(ctx) -> None:
    raise LookupError("no such card")
