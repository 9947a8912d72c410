"""Dramatiq: ``dramatiq peer_dramatiq --processes N`` (8 threads per process, default middleware)."""

import dramatiq
import peerjob
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=peerjob.BROKER_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="peers")
def job(sent: float = 0.0, sleep: float = 0.0) -> None:
    peerjob.body(sent, sleep)


class Producer:
    def one(self, sent: float, sleep: float) -> None:
        job.send(sent, sleep)

    def bulk(self, n: int) -> None:
        for start in range(0, n, 1000):  # a group enqueues its messages one by one: Dramatiq has no bulk send
            dramatiq.group(job.message() for _ in range(min(1000, n - start))).run()

    def close(self) -> None:
        broker.close()
