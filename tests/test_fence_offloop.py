"""Async fenced steps never block the worker's event loop: a sync effect, a sync completion and the Redis
fence's completion run in threads, so two async jobs of one worker overlap."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis
import sqlalchemy as sa

from ringfence.redis.fence import RedisFenceStore
from ringfence.runtime import Runtime
from ringfence.worker.worker import Worker
from support import wait_until


def overlap(intervals: list[tuple[float, float]]) -> float:
    """How long the intervals all ran at once (<= 0: they did not overlap)."""
    return min(end for _, end in intervals) - max(start for start, _ in intervals)


async def run_until_processed(app: Any, n: int) -> None:
    worker = Worker(app, concurrency=4)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_until, lambda: app.broker.queue_counts("default")["stats"].get("processed") == n,
                                30)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)


async def test_sync_effect_and_sync_completion_of_two_async_jobs_overlap(make_app, tmp_path) -> None:
    app = make_app(fence_url=f"sqlite:///{tmp_path}/app.db")
    engine = app.fence_store.engine
    app.fence_store.create_all()
    effects: list[tuple[float, float]] = []
    completions: list[tuple[float, float]] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def slow_fence_completion(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE") and "completed_at" in statement:
            time.sleep(0.3)  # a slow database: the completion's UPDATE blocks its caller

    def charge(n: int) -> str:  # a blocking provider SDK, as in the README's lambda
        start = time.monotonic()
        time.sleep(0.5)
        effects.append((start, time.monotonic()))
        return f"ch_{n}"

    @app.task(name="offloop.charge")
    async def job(ctx: Any, n: int) -> None:
        async with ctx.fence(f"order:{n}", "charge") as step:
            ref = await step.effect(lambda: charge(n))
            start = time.monotonic()
            async with step.complete(engine, result={"ref": ref}):
                pass  # nothing written: the completion's UPDATE may go out when the block ends
            completions.append((start, time.monotonic()))

    app.enqueue_many(job, [{"n": 1}, {"n": 2}])
    await run_until_processed(app, 2)
    assert len(effects) == 2 and len(completions) == 2
    assert overlap(effects) > 0.3, effects  # on the loop they would run one after the other
    assert overlap(completions) > 0.1, completions
    assert [str(app.fence_store.get(f"order:{n}", "charge").state) for n in (1, 2)] == ["completed"] * 2


class ThreadRecordingRedis(redis.Redis):
    """A real client that notes which thread sent each fence script."""

    threads: set[int]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] in ("EVALSHA", "EVAL"):
            self.threads.add(threading.get_ident())
        return super().execute_command(*args, **options)


async def test_redis_fence_async_completion_runs_off_the_loop(make_app, redis_url, namespace) -> None:
    app = make_app()
    client = ThreadRecordingRedis.from_url(redis_url)
    client.threads = set()
    app.runtime = Runtime(app, redis_fence_store=RedisFenceStore(client, prefix=namespace))
    loop_thread: list[int] = []
    completion_threads: set[int] = set()

    @app.task(name="offloop.thumb")
    async def thumb(ctx: Any, n: int) -> None:
        loop_thread.append(threading.get_ident())
        async with ctx.redis_fence(f"img:{n}", "thumb") as step:
            await step.effect(lambda: f"t{n}")
            client.threads.clear()  # from here on: only the completion's own calls
            async with step.complete(None):
                pass
            completion_threads.update(client.threads)

    thumb.enqueue(n=1)
    await run_until_processed(app, 1)
    assert completion_threads and loop_thread[0] not in completion_threads
    row = app.redis_fence_store.get("img:1", "thumb")
    assert row is not None and str(row.state) == "completed"
