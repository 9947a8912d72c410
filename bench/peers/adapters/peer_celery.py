"""Celery: ``celery -A peer_celery worker -c N`` (prefork pool; no result backend, the default)."""

import peerjob
from celery import Celery, group

app = Celery("peers", broker=peerjob.BROKER_URL)


@app.task(name="peers.job")
def job(sent: float = 0.0, sleep: float = 0.0) -> None:
    peerjob.body(sent, sleep)


class Producer:
    def one(self, sent: float, sleep: float) -> None:
        job.delay(sent, sleep)

    def bulk(self, n: int) -> None:
        for start in range(0, n, 1000):  # a group is Celery's way to send many at once
            group(job.s() for _ in range(min(1000, n - start))).apply_async()

    def close(self) -> None:
        app.close()
