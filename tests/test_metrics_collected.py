"""The job metrics hold their observations as plain numbers and count them into prometheus-client when they are
collected: every exposition (full, filtered, after a drain, after the worker stopped) reads exactly what
per-observation ``inc``/``observe`` calls would have shown, sums to the last bit."""

from __future__ import annotations

import random
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ringfence.metrics import DURATION_BUCKETS, LATENCY_BUCKETS, Metrics
from test_worker import run_until


class Reference:
    """The metrics as ``Metrics`` counted them before (19844f7): one prometheus-client call per value."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.started = Counter("ringfence_jobs_started", "Attempts started", ["task", "queue"], registry=r)
        self.finished = Counter("ringfence_jobs_finished", "Attempts finished, by outcome (ack, retry, dead, "
                                "requeue)", ["task", "queue", "outcome"], registry=r)
        self.failed = Counter("ringfence_jobs_failed", "Attempts that failed (outcome retry or dead)",
                              ["task", "queue"], registry=r)
        self.duration = Histogram("ringfence_job_duration_seconds", "Run time of an attempt, fetch to outcome",
                                  ["task", "queue"], buckets=DURATION_BUCKETS, registry=r)
        self.latency = Histogram("ringfence_job_start_latency_seconds", "Enqueue (or due time) to start",
                                 ["task", "queue"], buckets=LATENCY_BUCKETS, registry=r)

        self._children: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}

    def _for(self, task: str, queue: str) -> tuple[Any, Any, Any, Any]:
        found = self._children.get((task, queue))
        if found is None:  # the four children at once, at a job's first observation
            found = self._children[(task, queue)] = (
                self.started.labels(task, queue), self.latency.labels(task, queue),
                self.duration.labels(task, queue), self.failed.labels(task, queue))
        return found

    def job_started(self, task: str, queue: str, latency_s: float) -> None:
        started, latency, _, _ = self._for(task, queue)
        started.inc()
        latency.observe(max(0.0, latency_s))

    def job_finished(self, task: str, queue: str, outcome: str, duration_s: float) -> None:
        finished = self.finished.labels(task, queue, outcome)
        _, _, duration, failed = self._for(task, queue)
        finished.inc()
        if outcome in ("retry", "dead"):
            failed.inc()
        duration.observe(max(0.0, duration_s))


def exposed(registry: CollectorRegistry, only: list[str] | None = None) -> list[str]:
    """The exposition's lines of the job metrics, ``_created`` stamps left out (they differ by construction)."""
    source = registry.restricted_registry(only) if only else registry
    return [line for line in generate_latest(source).decode().splitlines()  # type: ignore[arg-type]
            if line.startswith("ringfence_j") and "_created" not in line]


def test_held_observations_expose_exactly_what_per_value_calls_did() -> None:
    rng = random.Random(8)
    m, ref = Metrics(), Reference()
    values = [*LATENCY_BUCKETS, *DURATION_BUCKETS, 0.0, -1.0, float("inf")]  # bucket edges, clamped, unbounded
    for n in range(5000):
        task, queue = rng.choice(["a", "b"]), rng.choice(["q1", "q2"])
        latency = rng.choice(values) if n % 3 == 0 else rng.expovariate(5)
        duration = rng.choice(values) if n % 5 == 0 else rng.uniform(0, 0.02)
        outcome = rng.choice(["ack", "ack", "retry", "dead", "requeue"])
        for target in (m, ref):
            target.job_started(task, queue, latency)
            target.job_finished(task, queue, outcome, duration)
        if n in (0, 1234, 4000):  # scraped midway: later observations are added to what was counted
            assert exposed(m.registry) == exposed(ref.registry)
        if n == 2500:  # a filtered scrape counts what is held too
            names = ["ringfence_job_start_latency_seconds", "ringfence_jobs_finished_total"]
            assert exposed(m.registry, names) == exposed(ref.registry, names)
    assert exposed(m.registry) == exposed(ref.registry)
    assert len(exposed(m.registry)) > 100
    assert m.registry.get_sample_value("ringfence_jobs_started_total", {"task": "a", "queue": "q1"}) == \
        ref.registry.get_sample_value("ringfence_jobs_started_total", {"task": "a", "queue": "q1"})


def scraped(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_a_workers_figures_are_exact_after_a_drain_and_after_it_stopped(make_app) -> None:
    app = make_app()
    ran: list[int] = []

    @app.task(max_attempts=1)
    def job(ctx, n: int) -> None:
        ran.append(n)
        if n % 10 == 0:
            raise ValueError("a tenth fail")

    app.enqueue_many(job, [{"n": n} for n in range(300)])
    box: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    labels = (("queue", "default"), ("task", job.name))

    def drained() -> bool:
        if app.broker.queue_counts("default")["stats"].get("processed", 0) < 270 or len(ran) < 300:
            return False
        box["drain"] = scraped(worker_metrics[0])  # while the worker still runs
        return box["drain"].get(("ringfence_jobs_finished_total", (("outcome", "dead"), *labels))) == 30

    worker_metrics: list[Metrics] = []
    from ringfence.worker import worker as worker_module

    made = worker_module.Metrics

    def keep(*args, **kwargs):  # the worker's own Metrics, read from here
        worker_metrics.append(made(*args, **kwargs))
        return worker_metrics[-1]

    worker_module.Metrics = keep  # type: ignore[misc]
    try:
        await run_until(app, drained)
    finally:
        worker_module.Metrics = made  # type: ignore[misc]
    after = scraped(worker_metrics[0])
    for figures in (box["drain"], after):
        assert figures[("ringfence_jobs_started_total", labels)] == 300
        assert figures[("ringfence_jobs_finished_total", (("outcome", "ack"), *labels))] == 270
        assert figures[("ringfence_jobs_finished_total", (("outcome", "dead"), *labels))] == 30
        assert figures[("ringfence_jobs_failed_total", labels)] == 30
        assert figures[("ringfence_job_duration_seconds_count", labels)] == 300
        assert figures[("ringfence_job_start_latency_seconds_count", labels)] == 300
        assert figures[("ringfence_job_duration_seconds_bucket", (("le", "+Inf"), *labels))] == 300
