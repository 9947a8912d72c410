"""The worker survives its Redis going away: a private redis-server is stopped and started again."""

from __future__ import annotations

import asyncio
import time

from ringfence import App
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.worker.worker import Worker
from support import FAST, wait_until


async def test_worker_reconnects_after_a_redis_restart() -> None:
    port = free_port()
    server = EmbeddedRedis.temporary(port=port)
    app = App(server.url, "resilience", worker=FAST)
    done: list[int] = []

    @app.task
    async def t(ctx, n: int) -> None:
        done.append(n)

    worker = Worker(app, alerts=False)
    runner = asyncio.create_task(worker.run())
    try:
        await t.aenqueue(n=1)
        await asyncio.to_thread(wait_until, lambda: done == [1], 10)
        server.stop()
        await asyncio.sleep(1.0)  # the worker now fails to reach Redis, and keeps trying
        assert not runner.done()
        restarted = EmbeddedRedis(server.directory, port=port, owns_dir=True).start()
        t0 = time.monotonic()
        enqueued = False
        while time.monotonic() - t0 < 15 and not enqueued:
            try:
                await t.aenqueue(n=2)
                enqueued = True
            except Exception:
                await asyncio.sleep(0.2)
        await asyncio.to_thread(wait_until, lambda: done == [1, 2], 15)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 15)
        app.close()
        server.stop()
        if "restarted" in locals():
            restarted.stop()
