"""Prometheus metrics: what a worker counts as it runs jobs, and queue gauges read from Redis at scrape time.

The worker owns one :class:`Metrics` and calls its methods; ``serve(port)`` exposes ``/metrics`` from a
daemon thread (``ringfence worker --metrics-port``). ``ringfence exporter`` serves the queue gauges alone, so
one exporter per namespace gives the backlog while each worker gives its own counters.

Example::

    metrics = Metrics()
    metrics.add_queue_gauges(app.broker)       # only in the exporter, or in one worker
    server = metrics.serve(9108)
    metrics.job_started("billing.charge", "critical", latency_s=0.8)
    metrics.job_finished("billing.charge", "critical", "ack", duration_s=1.2)
    metrics.fence_outcome("charge", "captured")
    server.shutdown()

Metric names (all prefixed ``ringfence_``): see docs/observability.md.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from bisect import bisect_left
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ringfence.queries import queue_gauges
from ringfence.redis.broker import Broker
from ringfence.redis.keys import PARTITION, logical_queue

OUTCOMES = ("ack", "retry", "dead", "requeue")
FENCE_OUTCOMES = ("captured", "skipped_done", "resumed", "in_doubt", "conflict", "fenced_out")
#: Gauge value of each breaker state: 0 closed, 1 half-open, 2 open.
BREAKER_STATES = {"closed": 0, "half_open": 1, "open": 2}
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)
_QUEUE_GAUGES = {"pending": "jobs ready to run", "active": "jobs leased to a running attempt",
                 "scheduled": "delayed or deferred jobs", "retry": "jobs waiting to retry",
                 "dead": "jobs in dead-letter"}
_QUEUE_COUNTERS = ("enqueued", "processed", "failed", "dead", "orphaned", "replayed", "deferred",
                   "requeued_on_shutdown", "abandoned_on_shutdown", "dangling", "outbox_refused")

BreakerSource = Callable[[], Mapping[str, str]]
OutboxSource = Callable[[], Mapping[str, Any] | None]  # outbox/lag.py: waiting, oldest_s; None: no outbox


class _Counted:
    """A job metric whose observations are held by ``Metrics`` (plain numbers under one lock per job, not a lock
    per value in prometheus-client) and counted into it each time it is collected: a scrape, filtered or not,
    always reads every observation made before it."""

    counting: Callable[[], None] | None = None  # set on the labelled parent only

    def collect(self) -> Iterable[Metric]:
        if self.counting is not None:
            self.counting()
        return super().collect()  # type: ignore[misc, no-any-return]


class _Counter(_Counted, Counter):
    pass


_LATENCY_BOUNDS = (*LATENCY_BUCKETS, math.inf)
_DURATION_BOUNDS = (*DURATION_BUCKETS, math.inf)


class _Tally:
    """The counts of one (task, queue) not yet counted into its prometheus counters, and its two histograms (the
    count per bucket, the running sum added up in the order prometheus-client would have: the same float)."""

    __slots__ = ("children", "duration", "duration_sum", "failed", "finished", "latency", "latency_sum", "started")

    def __init__(self, children: tuple[Any, Any]) -> None:
        self.children = children  # started, failed
        self.started = self.failed = 0
        self.finished: dict[Any, int] = {}  # the finished counter's child per outcome -> count
        self.latency = [0] * len(_LATENCY_BOUNDS)
        self.duration = [0] * len(_DURATION_BOUNDS)
        self.latency_sum = self.duration_sum = 0.0


class Metrics:
    """A worker's metrics in their own registry (never the global one: tests and several apps coexist).

    Thread-safe; every method is cheap (no I/O) and may be called from the event loop.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.started = _Counter("ringfence_jobs_started", "Attempts started", ["task", "queue"], registry=r)
        self.finished = _Counter("ringfence_jobs_finished", "Attempts finished, by outcome (ack, retry, dead, "
                                 "requeue)", ["task", "queue", "outcome"], registry=r)
        self.failed = _Counter("ringfence_jobs_failed", "Attempts that failed (outcome retry or dead)",
                               ["task", "queue"], registry=r)
        for metric in (self.started, self.finished, self.failed):
            metric.counting = self.count
        r.register(_HistogramCollector(self, "ringfence_job_duration_seconds", "Run time of an attempt, fetch to "
                                       "outcome", _DURATION_BOUNDS, "duration"))
        r.register(_HistogramCollector(self, "ringfence_job_start_latency_seconds", "Enqueue (or due time) to start",
                                       _LATENCY_BOUNDS, "latency"))
        self.fences = Counter("ringfence_fence_outcomes", "Fence outcomes at step entry and write",
                              ["step", "outcome"], registry=r)
        self._breakers = _BreakerCollector()
        r.register(self._breakers)
        self._lock = threading.Lock()
        self._recent: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=200))
        self._tallies: dict[tuple[str, str], _Tally] = {}
        self._outcomes: dict[tuple[str, str, str], Any] = {}  # the finished counter's child per outcome
        self._queues: dict[str, str] = {}  # queue -> its label: a partition's is its queue's (queue_labels)
        self._minutes = _Minutes()

    def _tally(self, task: str, queue: str) -> _Tally:
        """(under ``_lock``) Its counters' children are made at the first observation, as ``inc`` would: their
        ``_created`` stamps stay those of the first job."""
        t = self._tallies[(task, queue)] = _Tally((self.started.labels(task, queue), self.failed.labels(task, queue)))
        return t

    # -- called by the worker --------------------------------------------------------------------
    def job_started(self, task: str, queue: str, latency_s: float) -> None:
        """An attempt started. ``latency_s``: now minus the job's enqueue time (or its due time for a
        scheduled or retried job); negative values (clock skew) count as 0. A partition's jobs count as its
        queue's (``hot~2of6``: ``hot``)."""
        latency_s = max(0.0, latency_s)
        queue = self._queues.get(queue) or self._queues.setdefault(queue, logical_queue(queue))
        with self._lock:
            t = self._tallies.get((task, queue)) or self._tally(task, queue)
            t.started += 1
            t.latency[bisect_left(_LATENCY_BOUNDS, latency_s)] += 1
            t.latency_sum += latency_s

    def job_finished(self, task: str, queue: str, outcome: str, duration_s: float) -> None:
        """An attempt's outcome was recorded. ``outcome`` ∈ ack, retry, dead, requeue (a lost lease records
        nothing: do not call). ``duration_s``: handler start to outcome."""
        observed = max(0.0, duration_s)
        queue = self._queues.get(queue) or self._queues.setdefault(queue, logical_queue(queue))
        with self._lock:
            finished = self._outcomes.get((task, queue, outcome))
            if finished is None:
                if outcome not in OUTCOMES:
                    raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
                finished = self._outcomes[(task, queue, outcome)] = self.finished.labels(task, queue, outcome)
            t = self._tallies.get((task, queue)) or self._tally(task, queue)
            t.finished[finished] = t.finished.get(finished, 0) + 1
            if outcome in ("retry", "dead"):
                t.failed += 1
            t.duration[bisect_left(_DURATION_BOUNDS, observed)] += 1
            t.duration_sum += observed
            self._recent[task].append(duration_s)

    def count(self) -> None:
        """Count the held observations into the prometheus metrics (each collect of a job metric does first)."""
        with self._lock:
            for t in self._tallies.values():
                started, failed = t.children
                if t.started:
                    started.inc(t.started)
                    t.started = 0
                if t.failed:
                    failed.inc(t.failed)
                    t.failed = 0
                if t.finished:
                    for child, n in t.finished.items():
                        child.inc(n)
                    t.finished.clear()

    def fence_outcome(self, step: str, outcome: str) -> None:
        """A fence event: captured (a new row), skipped_done (the second run is empty), resumed (took over
        a dead run's fence), in_doubt (parked), conflict (busy or different params), fenced_out (a superseded
        attempt tried to write after losing its lease)."""
        if outcome not in FENCE_OUTCOMES:
            raise ValueError(f"fence outcome {outcome!r} is not one of {', '.join(FENCE_OUTCOMES)}")
        self.fences.labels(step, outcome).inc()

    def breaker_state(self, dependency: str, state: str) -> None:
        """Record a breaker's state (closed, half_open, open) when it changes."""
        self._breakers.set(dependency, state)

    def breaker_source(self, source: BreakerSource) -> None:
        """Read breaker states at scrape time: ``source()`` returns {dependency: state}; it must be cheap and
        thread-safe (it runs in the HTTP thread). Its states override those set by ``breaker_state``."""
        self._breakers.sources.append(source)

    def duration_p95(self) -> dict[str, float]:
        """p95 run time per task over its last 200 attempts: for the heartbeat's server info
        (``duration_p95_s``), which the doctor compares with ``shutdown_timeout_s``."""
        with self._lock:
            recent = {task: sorted(d) for task, d in self._recent.items() if d}
        return {task: round(d[min(len(d) - 1, int(len(d) * 0.95))], 3) for task, d in recent.items()}

    def task_stats(self, now_s: float | None = None) -> list[dict[str, Any]]:
        """Per (task, queue): attempts finished and failed since this worker started, their run times as counts
        per ``DURATION_BUCKETS`` bound (+Inf last), and the same per minute of the last hour (``minutes``:
        [minute, finished, failed, [[bucket, count], ...]]). For the heartbeat's server info, which the dashboard
        sums over the live workers. Read from the tallies kept for /metrics: nothing more is done per job."""
        failed = {(s.labels["task"], s.labels["queue"]): int(s.value)  # counts the held observations first
                  for family in self.failed.collect() for s in family.samples if s.name.endswith("_total")}
        with self._lock:
            now = {key: (failed.get(key, 0), tuple(t.duration)) for key, t in self._tallies.items()}
        return self._minutes.update(now, int((time.time() if now_s is None else now_s) // 60))

    def histogram(self, which: str) -> list[tuple[tuple[str, str], list[int], float]]:
        """Per (task, queue): the bucket counts of ``which`` ("duration" or "latency") and their sum, copied
        under the lock (what a scrape of the job histograms reads)."""
        total = f"{which}_sum"
        with self._lock:
            return [(key, list(getattr(t, which)), getattr(t, total)) for key, t in self._tallies.items()]

    # -- exposition -------------------------------------------------------------------------------
    def add_queue_gauges(self, broker: Broker) -> None:
        """Also expose the namespace's queue gauges, read from Redis at each scrape."""
        self.registry.register(QueueCollector(broker))

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns the server (``.shutdown()``)."""
        server, _thread = start_http_server(port, addr, registry=self.registry)
        return server


_Snapshot = dict[tuple[str, str], tuple[int, tuple[int, ...]]]  # (task, queue) -> failed, duration counts


class _Minutes:
    """The tallies as they were at the first read of each of the last 61 minutes: a minute's attempts are the
    difference between its mark and the next one (bounded: 61 snapshots of the tallies). The closed minutes are
    worked out once, when a new minute begins; each read adds only the current one."""

    def __init__(self) -> None:
        self.marks: deque[tuple[int, _Snapshot]] = deque(maxlen=61)
        self.closed: dict[tuple[str, str], list[list[Any]]] = {}

    def update(self, now: _Snapshot, minute: int) -> list[dict[str, Any]]:
        if not self.marks:
            self.marks.append((minute, {}))  # the worker's start: its attempts so far belong to this minute
        elif self.marks[-1][0] < minute:
            self.marks.append((minute, now))
            self.closed = defaultdict(list)
            for (m, before), (_, after) in itertools.pairwise(self.marks):
                for key, tally in after.items():
                    if (d := _delta(m, before.get(key), tally)) is not None:
                        self.closed[key].append(d)
        last_minute, last = self.marks[-1]
        out = []
        for (task, queue), (failed, counts) in sorted(now.items()):
            current = _delta(last_minute, last.get((task, queue)), (failed, counts))
            out.append({"task": task, "queue": queue, "finished": sum(counts), "failed": failed,
                        "buckets": list(counts),
                        "minutes": self.closed.get((task, queue), []) + ([current] if current else [])})
        return out


def _delta(minute: int, before: tuple[int, tuple[int, ...]] | None, after: tuple[int, tuple[int, ...]]
           ) -> list[Any] | None:
    """[minute, finished, failed, [[bucket, count], ...]] between two reads of one tally (None: nothing ran)."""
    f0, c0 = before or (0, (0,) * len(after[1]))
    runs = [[i, b - a] for i, (a, b) in enumerate(zip(c0, after[1], strict=True)) if b != a]
    return [minute, sum(n for _, n in runs), after[0] - f0, runs] if runs else None


class _HistogramCollector(Collector):
    """One job histogram per (task, queue), read from the tallies at each collect: its buckets and sum are plain
    numbers under ``Metrics``' lock (a prometheus ``Histogram.observe`` takes a lock per bucket and per sum)."""

    def __init__(self, metrics: Metrics, name: str, doc: str, bounds: tuple[float, ...], which: str) -> None:
        self.metrics, self.name, self.doc, self.which = metrics, name, doc, which
        self.les = [floatToGoString(b) for b in bounds]  # type: ignore[no-untyped-call]  # "le" as prometheus writes it

    def describe(self) -> Iterable[Metric]:
        return [HistogramMetricFamily(self.name, self.doc, labels=["task", "queue"])]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=["task", "queue"])
        for (task, queue), counts, sum_value in self.metrics.histogram(self.which):
            family.add_metric([task, queue], list(zip(self.les, itertools.accumulate(counts), strict=True)), sum_value)
        yield family


class _BreakerCollector(Collector):
    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.sources: list[BreakerSource] = []

    def set(self, dependency: str, state: str) -> None:
        if state not in BREAKER_STATES:
            raise ValueError(f"breaker state {state!r} is not one of {', '.join(BREAKER_STATES)}")
        self.states[dependency] = state

    def collect(self) -> Iterator[Metric]:
        states = dict(self.states)
        for source in self.sources:
            states.update(source())
        g = GaugeMetricFamily("ringfence_breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open",
                              labels=["dependency"])
        for dep, state in sorted(states.items()):
            g.add_metric([dep], BREAKER_STATES.get(state, -1))
        yield g


class QueueCollector(Collector):
    """Queue gauges and the namespace's counters, read from Redis at scrape time (two round trips a queue)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def describe(self) -> list[Metric]:
        return []  # no Redis read at registration

    def collect(self) -> Iterator[Metric]:
        try:
            queues = [queue_gauges(self.broker, q) for q in self.broker.queues()]
            servers = self.broker.servers()
        except Exception:
            # A scrape must answer even when Redis does not: up=0 is the signal.
            yield GaugeMetricFamily("ringfence_redis_up", "1 when the exporter could read Redis", value=0)
            return
        yield GaugeMetricFamily("ringfence_redis_up", "1 when the exporter could read Redis", value=1)
        yield from self._gauges(queues)
        yield from self._counters(queues)
        g = GaugeMetricFamily("ringfence_servers", "Live worker processes", labels=["environment"])
        by_env: dict[str, int] = defaultdict(int)
        for s in servers:
            by_env[str(s.get("environment", ""))] += 1
        for env, n in sorted(by_env.items()):
            g.add_metric([env], n)
        yield g

    @staticmethod
    def _gauges(queues: list[dict[str, Any]]) -> Iterator[Metric]:
        for field, doc in _QUEUE_GAUGES.items():
            g = GaugeMetricFamily(f"ringfence_queue_{field}", f"Queue size: {doc}", labels=["queue"])
            for q in queues:
                g.add_sample(g.name, queue_labels(q["queue"]), q[field])
            yield g
        lat = GaugeMetricFamily("ringfence_queue_latency_seconds", "Age of the oldest pending job", labels=["queue"])
        paused = GaugeMetricFamily("ringfence_queue_paused", "1 while the queue is paused", labels=["queue"])
        for q in queues:
            lat.add_sample(lat.name, queue_labels(q["queue"]), q["latency_s"])
            paused.add_sample(paused.name, queue_labels(q["queue"]), int(q["paused"]))
        yield lat
        yield paused

    @staticmethod
    def _counters(queues: list[dict[str, Any]]) -> Iterator[Metric]:
        for name in _QUEUE_COUNTERS:
            c = CounterMetricFamily(f"ringfence_queue_jobs_{name}", f"Namespace counter '{name}' of the queue (Redis)",
                                    labels=["queue"])
            for q in queues:
                c.add_sample(f"{c.name}_total", queue_labels(q["queue"]), q["stats"].get(name, 0))
            yield c


def queue_labels(queue: str) -> dict[str, str]:
    """The labels of a queue's gauges: a partition's (``hot~2of6``) are ``queue="hot", partition="2of6"``, so
    ``{queue="hot"}`` selects the whole queue and ``sum by (queue)`` adds it up; a plain queue has no partition
    label."""
    m = PARTITION.fullmatch(queue)
    return {"queue": queue} if m is None else {"queue": m.group(1), "partition": f"{m.group(2)}of{m.group(3)}"}


class OutboxCollector(Collector):
    """Rows waiting in the transactional outbox and the age of the oldest (docs/outbox.md)."""

    def __init__(self, source: OutboxSource) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            lag = self.source()
        except Exception:
            yield GaugeMetricFamily("ringfence_outbox_up", "1 when the outbox table could be read", value=0)
            return
        if lag is None:
            return  # no outbox table: nothing to report
        yield GaugeMetricFamily("ringfence_outbox_up", "1 when the outbox table could be read", value=1)
        yield GaugeMetricFamily("ringfence_outbox_waiting", "Committed outbox rows not yet relayed to Redis",
                                value=lag["waiting"])
        yield GaugeMetricFamily("ringfence_outbox_oldest_seconds", "Age of the oldest waiting outbox row (relay lag)",
                                value=lag["oldest_s"])
        yield GaugeMetricFamily("ringfence_outbox_parked", "Outbox rows the relay parked (not sent; see the reason)",
                                value=lag.get("parked", 0))


def serve_exporter(broker: Broker, port: int, addr: str = "0.0.0.0", outbox: OutboxSource | None = None) -> Any:
    """The standalone exporter: queue gauges (and the outbox's lag, given its source). Returns the server
    (``.shutdown()`` to stop)."""
    registry = CollectorRegistry()
    registry.register(QueueCollector(broker))
    if outbox is not None:
        registry.register(OutboxCollector(outbox))
    server, _thread = start_http_server(port, addr, registry=registry)
    return server
