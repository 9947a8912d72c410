"""Enqueues the run's orders in batches while the backlog is small (bounded memory for any ``--orders``).

Job ids are chosen here (``<run>-<order>``, ``<run>-<order>-dup`` for the second copy) and written to the
driver's own ledger before the first try, so a batch that fails mid-way (OOM, Redis restarting) is simply
sent again: enqueue by id is idempotent.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import redis

from bench.chaos.app import QUEUE, RETRY
from ringfence.app import App
from ringfence.errors import BrokerError, RedisFull
from ringfence.redis.replicas import run_replicated
from ringfence.tasks import enqueue_options

DOOMED_ATTEMPTS = 3  # a doomed order dies on every attempt: a few attempts are enough to orphan it for good


class Feeder:
    def __init__(self, app: App, ledger: sqlite3.Connection, run_id: str, orders: int, batch: int,
                 dup_rate: float, doomed_rate: float, durable: bool = False) -> None:
        self.app, self.ledger, self.run_id = app, ledger, run_id
        self.orders, self.batch, self.dup_rate, self.doomed_rate = orders, batch, dup_rate, doomed_rate
        self.durable = durable  # each batch confirmed by a replica (WAIT) before it counts as enqueued
        self.next_order = 1
        self.dups: list[int] = []        # orders whose second copy goes out with the next batch
        self.pending: list[tuple[str, int, bool, bool]] | None = None  # a batch not yet accepted by Redis
        self.enqueued_jobs = 0
        self.refused = 0                 # batches that failed (Redis down, restarting), sent again later
        self.refused_full = 0            # batches refused with RedisFull (maxmemory), sent again later
        self.tasks = {p: app.registry.tasks[f"chaos.charge_{p}"] for p in ("a", "b")}
        ledger.execute("CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, order_id INTEGER NOT NULL, "
                       "dup INTEGER NOT NULL, doomed INTEGER NOT NULL, sent INTEGER NOT NULL DEFAULT 0)")

    @property
    def done(self) -> bool:
        return self.next_order > self.orders and not self.dups and self.pending is None

    def _next_batch(self) -> list[tuple[str, int, bool, bool]]:
        rows = [(f"{self.run_id}-{o}-dup", o, True, False) for o in self.dups]
        self.dups = []
        last = min(self.orders, self.next_order + self.batch - 1)
        for o in range(self.next_order, last + 1):
            doomed = random.random() < self.doomed_rate
            rows.append((f"{self.run_id}-{o}", o, False, doomed))
            if not doomed and random.random() < self.dup_rate:
                if random.random() < 0.5:  # right behind the first copy: both may run at once
                    rows.append((f"{self.run_id}-{o}-dup", o, True, False))
                else:  # with the next batch: most likely after the first copy finished
                    self.dups.append(o)
        self.next_order = last + 1
        if self.next_order > self.orders and self.dups:  # the last batch's copies go out with it
            rows += [(f"{self.run_id}-{o}-dup", o, True, False) for o in self.dups]
            self.dups = []
        self.ledger.executemany(
            "INSERT OR IGNORE INTO jobs (job_id, order_id, dup, doomed) VALUES (?, ?, ?, ?)", rows)
        self.ledger.commit()
        return rows

    def feed(self, backlog: int, limit: int) -> None:
        """Send one batch when fewer than ``limit`` jobs wait or run."""
        if self.done or backlog >= limit:
            return
        if self.pending is None:
            self.pending = self._next_batch()
        try:
            self._send(self.pending)
        except RedisFull:
            self.refused_full += 1
            return
        except (redis.RedisError, BrokerError):  # down, failing over, not replicated in time: sent again
            self.refused += 1
            return
        self.ledger.executemany("UPDATE jobs SET sent = 1 WHERE job_id = ?", [(r[0],) for r in self.pending])
        self.ledger.commit()
        self.enqueued_jobs += len(self.pending)
        self.pending = None

    def _send(self, rows: list[tuple[str, int, bool, bool]]) -> None:
        client, broker = self.app.client, self.app.broker
        prepared: list[Any] = []
        for job_id, order, _dup, doomed in rows:
            provider = "a" if order % 2 else "b"
            payload = {"order_id": order, "amount": 500 + order % 1000, "doomed": doomed}
            opts = enqueue_options(job_id=job_id, max_attempts=DOOMED_ATTEMPTS if doomed else RETRY.max_attempts)
            prepared.append(client.prepare(self.tasks[provider], payload, opts))
        broker.register_queues([QUEUE])
        call = broker.enqueue(QUEUE, [p[1:] for p in prepared])
        if self.durable:
            run_replicated(broker, call, 1, int(self.app.replica_timeout_s * 1000))
        else:
            broker.run(call)
