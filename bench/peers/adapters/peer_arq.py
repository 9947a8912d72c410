"""arq: ``arq peer_arq.WorkerSettings`` per process (max_jobs 10, poll_delay 0.5 s: the defaults)."""

import asyncio
from typing import Any

import peerjob
from arq import create_pool
from arq.connections import RedisSettings

REDIS = RedisSettings.from_dsn(peerjob.BROKER_URL)


async def job(ctx: Any, sent: float = 0.0, sleep: float = 0.0) -> None:
    await peerjob.abody(sent, sleep)


class WorkerSettings:
    functions = [job]  # noqa: RUF012 - arq reads class attributes
    redis_settings = REDIS


class AsyncProducer:
    async def start(self) -> None:
        self.pool = await create_pool(REDIS)

    async def one(self, sent: float, sleep: float) -> None:
        await self.pool.enqueue_job("job", sent, sleep)

    async def bulk(self, n: int) -> None:
        for start in range(0, n, 100):  # no bulk API: 100 enqueues at a time on the pool
            await asyncio.gather(*(self.pool.enqueue_job("job") for _ in range(min(100, n - start))))

    async def close(self) -> None:
        await self.pool.aclose()
