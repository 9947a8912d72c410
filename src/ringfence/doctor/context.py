"""What every check reads: two samples of the namespace taken ``sample_s`` apart, the app and the thresholds it
judges by."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringfence.queries import queue_gauges
from ringfence.redis.broker import Broker
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.keys import logical_queue
from ringfence.redis.topology import node_of

if TYPE_CHECKING:
    from ringfence.app import App
    from ringfence.reconcile import Effect


@dataclass(frozen=True)
class Thresholds:
    """Where the doctor and the alert rules draw the line. Durations in seconds; counts in jobs."""

    sample_s: float = 2.0             # doctor: time between the two samples of the counters
    latency_warn_s: float = 60.0      # a queue's oldest pending job is older than this
    starvation_ratio: float = 4.0     # ... while another served queue's latency is below latency_warn_s / ratio
    retry_warn: int = 100             # jobs in one queue's retry set
    retry_growth_warn: int = 20       # retry set growth between two samples
    future_load_warn: int = 10_000    # backlog x remaining attempts of one dependency
    wave_window_s: float = 900.0      # look-back for error waves (bad payloads, newer versions)
    wave_warn: int = 1                # bad_payload dead jobs within the window that make a wave
    orphan_window_s: float = 3600.0   # look-back for orphaned attempts
    stuck_grace_s: float = 30.0       # an expired lease live workers have not recovered after this
    in_doubt_older_than_s: float = 0.0  # in-doubt fences older than this are reported (0: all)
    outbox_lag_warn_s: float = 60.0   # the oldest committed outbox row has waited this long for the relay
    memory_warn_ratio: float = 0.8    # Redis used_memory / maxmemory: warning from here
    memory_fail_ratio: float = 0.95   # ... failure from here (at maxmemory every enqueue is refused)


@dataclass(frozen=True)
class Snapshot:
    """The namespace at one moment: queue gauges, live servers and the recorded environment."""

    at: float
    queues: dict[str, dict[str, Any]]
    servers: list[dict[str, Any]]
    environment: str | None
    unreachable: dict[str, str] = field(default_factory=dict)  # queue (or "namespace") -> the error

    @classmethod
    def take(cls, broker: Broker, silent: dict[str, str] | None = None) -> Snapshot:
        """Every queue that can be read; one whose Redis node does not answer (a Cluster) is named in
        ``unreachable`` instead, and the others are still read. ``silent``: the masters that did not answer a short
        PING (``silent_masters``): their queues are named at once, never waited for."""
        silent = silent or {}
        unreachable: dict[str, str] = {}
        home = node_of(broker, broker.keys.queues) if silent else None
        names: list[str] = []
        servers: list[dict[str, Any]] = []
        environment: str | None = None
        if home in silent:
            unreachable["namespace"] = f"node {home} does not answer ({silent[home]})"
        else:
            try:
                names, servers, environment = broker.queues(), broker.servers(), broker.environment()
            except UNAVAILABLE as exc:
                if not broker.cluster:
                    raise
                unreachable["namespace"] = _said(exc)
        queues: dict[str, dict[str, Any]] = {}
        for q in names:
            node = node_of(broker, broker.keys.queue(q).pending) if silent else None
            if node in silent:
                unreachable[q] = f"node {node} does not answer ({silent[node]})"
                continue
            try:
                queues[q] = queue_gauges(broker, q)
            except UNAVAILABLE as exc:
                if not broker.cluster:
                    raise
                unreachable[q] = _said(exc)
        return cls(time.time(), queues, servers, environment, unreachable)

    def stat(self, queue: str, name: str) -> int:
        q = self.queues.get(queue)
        return int(q["stats"].get(name, 0)) if q else 0

    def listed_by(self, queue: str) -> list[dict[str, Any]]:
        """Live servers whose ``--queues`` include ``queue``; for a partition, those listing a partition of its
        queue: they fetch from the partitions of another N too (worker/partitions.py)."""
        own = logical_queue(queue)
        if own == queue:
            return [s for s in self.servers if queue in (s.get("queues") or {})]
        return [s for s in self.servers if any(q != own and logical_queue(q) == own for q in s.get("queues") or {})]


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


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
    silent: dict[str, str] = field(default_factory=dict)  # Cluster masters that did not answer a short PING

    @property
    def broker(self) -> Broker:
        return self.app.broker

    def primaries(self) -> Any:
        """The Cluster masters to ask for their INFO or CONFIG: those that answered (all of them, as redis-py's
        ``"primaries"``, when none is silent)."""
        if not self.silent:
            return "primaries"
        return [n for n in self.broker.sync.get_nodes()  # type: ignore[attr-defined]
                if n.server_type == "primary" and n.name not in self.silent]

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.after.at - self.before.at)

    def delta(self, queue: str, stat: str) -> int:
        return self.after.stat(queue, stat) - self.before.stat(queue, stat)
