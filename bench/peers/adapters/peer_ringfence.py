"""ringfence: ``ringfence worker --app peer_ringfence:sync_app --queues peers`` per process (default settings,
concurrency 10); ``async_app`` is the same with an ``async def`` handler."""

from typing import Any

import peerjob

from ringfence import App

sync_app = App(peerjob.BROKER_URL)
async_app = App(peerjob.BROKER_URL)


@sync_app.task(name="peers.job", queue="peers")
def job(ctx: Any, sent: float = 0.0, sleep: float = 0.0) -> None:
    peerjob.body(sent, sleep)


@async_app.task(name="peers.job", queue="peers")
async def ajob(ctx: Any, sent: float = 0.0, sleep: float = 0.0) -> None:
    await peerjob.abody(sent, sleep)


class Producer:
    app, task = sync_app, job

    def one(self, sent: float, sleep: float) -> None:
        self.task.enqueue(sent=sent, sleep=sleep)

    def bulk(self, n: int) -> None:
        for start in range(0, n, 1000):
            self.app.enqueue_many(self.task, [{}] * min(1000, n - start))

    def close(self) -> None:
        self.app.close()
