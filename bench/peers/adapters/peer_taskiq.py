"""taskiq with taskiq-redis: ``taskiq worker peer_taskiq:broker --workers N`` (RedisStreamBroker, the broker
of taskiq-redis's README; no result backend)."""

import asyncio

import peerjob
from taskiq_redis import RedisStreamBroker

broker = RedisStreamBroker(url=peerjob.BROKER_URL)


@broker.task(task_name="peers.job")
async def job(sent: float = 0.0, sleep: float = 0.0) -> None:
    await peerjob.abody(sent, sleep)


class AsyncProducer:
    async def start(self) -> None:
        await broker.startup()

    async def one(self, sent: float, sleep: float) -> None:
        await job.kiq(sent, sleep)

    async def bulk(self, n: int) -> None:
        for start in range(0, n, 100):  # no bulk API: 100 sends at a time
            await asyncio.gather(*(job.kiq() for _ in range(min(100, n - start))))

    async def close(self) -> None:
        await broker.shutdown()
