"""The /metrics endpoint scraped over HTTP and parsed: worker counters, histograms and queue gauges."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringfence.metrics import Metrics, serve_exporter
from ringfence.redis.broker import Broker
from ringfence.redis.embedded import free_port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def test_worker_metrics_and_queue_gauges_over_http(make_app) -> None:
    app = make_app(environment="test")

    @app.task(name="billing.charge", queue="critical")
    async def charge(ctx, n: int) -> None: ...

    app.enqueue_many(charge, [{"n": n} for n in range(3)])
    m = Metrics()
    m.add_queue_gauges(app.broker)
    m.job_started("billing.charge", "critical", latency_s=0.4)
    m.job_finished("billing.charge", "critical", "ack", duration_s=1.5)
    m.job_started("billing.charge", "critical", latency_s=0.2)
    m.job_finished("billing.charge", "critical", "retry", duration_s=0.5)
    m.fence_outcome("charge", "captured")
    m.fence_outcome("charge", "skipped_done")
    m.breaker_state("psp", "open")
    m.breaker_source(lambda: {"mailer": "half_open"})
    server = m.serve(0, "127.0.0.1")
    try:
        got = scrape(server.server_port)
    finally:
        server.shutdown()
    job = (("queue", "critical"), ("task", "billing.charge"))
    assert got[("ringfence_jobs_started_total", job)] == 2
    assert got[("ringfence_jobs_finished_total", (("outcome", "ack"), *job))] == 1
    assert got[("ringfence_jobs_finished_total", (("outcome", "retry"), *job))] == 1
    assert got[("ringfence_jobs_failed_total", job)] == 1
    assert got[("ringfence_job_duration_seconds_count", job)] == 2
    assert got[("ringfence_job_duration_seconds_sum", job)] == 2.0
    assert got[("ringfence_job_duration_seconds_bucket", (("le", "1.0"), *job))] == 1
    assert got[("ringfence_job_start_latency_seconds_count", job)] == 2
    assert got[("ringfence_fence_outcomes_total", (("outcome", "captured"), ("step", "charge")))] == 1
    assert got[("ringfence_breaker_state", (("dependency", "psp"),))] == 2
    assert got[("ringfence_breaker_state", (("dependency", "mailer"),))] == 1
    assert got[("ringfence_queue_pending", (("queue", "critical"),))] == 3
    assert got[("ringfence_queue_jobs_enqueued_total", (("queue", "critical"),))] == 3
    assert got[("ringfence_redis_up", ())] == 1
    assert m.duration_p95() == {"billing.charge": 1.5}


def test_standalone_exporter_serves_queue_gauges(make_app) -> None:
    app = make_app(environment="test")
    app.broker.set_paused("low", True)
    app.broker.register_queues(["low"])
    server = serve_exporter(app.broker, free_port(), "127.0.0.1")
    try:
        got = scrape(server.server_port)
    finally:
        server.shutdown()
    assert got[("ringfence_queue_paused", (("queue", "low"),))] == 1
    assert got[("ringfence_queue_latency_seconds", (("queue", "low"),))] == 0
    assert not any(name.startswith("ringfence_jobs_") for name, _ in got)  # worker counters live in workers


def test_exporter_answers_when_redis_does_not(namespace) -> None:
    server = serve_exporter(Broker(f"redis://127.0.0.1:{free_port()}/0", namespace), 0, "127.0.0.1")
    try:
        assert scrape(server.server_port)[("ringfence_redis_up", ())] == 0
    finally:
        server.shutdown()


def test_outcomes_outside_the_contract_are_refused() -> None:
    m = Metrics()
    with pytest.raises(ValueError, match="outcome 'lost'"):
        m.job_finished("t", "q", "lost", 1.0)
    with pytest.raises(ValueError, match="fence outcome"):
        m.fence_outcome("charge", "done")
    with pytest.raises(ValueError, match="breaker state"):
        m.breaker_state("psp", "broken")
