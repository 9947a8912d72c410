"""RQ: ``rq worker --url URL peers`` per process (the default Worker forks a work horse per job)."""

import peerjob
from redis import Redis
from rq import Queue


def job(sent: float = 0.0, sleep: float = 0.0) -> None:
    peerjob.body(sent, sleep)


class Producer:
    def __init__(self) -> None:
        self.conn = Redis.from_url(peerjob.BROKER_URL)
        self.queue = Queue("peers", connection=self.conn)

    def one(self, sent: float, sleep: float) -> None:
        self.queue.enqueue(job, sent, sleep)

    def bulk(self, n: int) -> None:
        for start in range(0, n, 1000):
            self.queue.enqueue_many([Queue.prepare_data(job) for _ in range(min(1000, n - start))])

    def close(self) -> None:
        self.conn.close()
