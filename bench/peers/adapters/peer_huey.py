"""Huey: ``huey_consumer peer_huey.huey`` per process (one worker thread, the default)."""

import peerjob
from huey import RedisHuey

huey = RedisHuey("peers", url=peerjob.BROKER_URL)


@huey.task()
def job(sent: float = 0.0, sleep: float = 0.0) -> None:
    peerjob.body(sent, sleep)


class Producer:
    def one(self, sent: float, sleep: float) -> None:
        job(sent, sleep)

    def bulk(self, n: int) -> None:
        job.map([(0.0, 0.0)] * n)  # Huey's way to enqueue many (one enqueue each)

    def close(self) -> None:
        pass
