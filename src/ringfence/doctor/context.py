"""What every check reads: two samples of the namespace taken ``sample_s`` apart, the app and its thresholds."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringfence.doctor.model import Thresholds
from ringfence.redis.broker import Broker

if TYPE_CHECKING:
    from ringfence.app import App
    from ringfence.reconcile import Effect


def queue_gauges(broker: Broker, queue: str) -> dict[str, Any]:
    """Counts, counters, latency and paused of one queue: two round trips, no job scan."""
    c = broker.queue_counts(queue)
    latency = 0.0
    if c["oldest_enqueued_ms"] is not None:
        latency = max(0.0, (broker.clock() - c["oldest_enqueued_ms"]) / 1000)
    return {"queue": queue, "pending": c["pending"], "active": c["active"], "scheduled": c["scheduled"],
            "retry": c["retry"], "dead": c["dead"], "paused": c["paused"], "latency_s": round(latency, 3),
            "stats": c["stats"]}


@dataclass(frozen=True)
class Snapshot:
    """The namespace at one moment: queue gauges, live servers and the recorded environment."""

    at: float
    queues: dict[str, dict[str, Any]]
    servers: list[dict[str, Any]]
    environment: str | None

    @classmethod
    def take(cls, broker: Broker) -> Snapshot:
        queues = {q: queue_gauges(broker, q) for q in broker.queues()}
        return cls(time.time(), queues, broker.servers(), broker.environment())

    def stat(self, queue: str, name: str) -> int:
        q = self.queues.get(queue)
        return int(q["stats"].get(name, 0)) if q else 0

    def listed_by(self, queue: str) -> list[dict[str, Any]]:
        """Live servers whose ``--queues`` include ``queue``."""
        return [s for s in self.servers if queue in (s.get("queues") or {})]


@dataclass
class Context:
    """Input of every check. ``before`` and ``after`` are the two samples (equal when only one was taken)."""

    app: App
    before: Snapshot
    after: Snapshot
    thresholds: Thresholds
    step: str | None = None
    effects: Iterable[Effect] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def broker(self) -> Broker:
        return self.app.broker

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.after.at - self.before.at)

    def delta(self, queue: str, stat: str) -> int:
        return self.after.stat(queue, stat) - self.before.stat(queue, stat)
