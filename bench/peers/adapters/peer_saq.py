"""SAQ: ``saq peer_saq.settings --workers N`` (concurrency 10, the default)."""

import asyncio
from typing import Any

import peerjob
from saq import Queue

queue = Queue.from_url(peerjob.BROKER_URL, name="peers")


async def job(ctx: Any, *, sent: float = 0.0, sleep: float = 0.0) -> None:
    await peerjob.abody(sent, sleep)


settings = {"queue": queue, "functions": [job]}


class AsyncProducer:
    async def start(self) -> None:
        await queue.connect()

    async def one(self, sent: float, sleep: float) -> None:
        await queue.enqueue("job", sent=sent, sleep=sleep)

    async def bulk(self, n: int) -> None:
        for start in range(0, n, 100):  # no bulk API (map() waits for the results): 100 enqueues at a time
            await asyncio.gather(*(queue.enqueue("job") for _ in range(min(100, n - start))))

    async def close(self) -> None:
        await queue.disconnect()
