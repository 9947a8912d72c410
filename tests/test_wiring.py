"""The worker's observability wiring: metrics endpoint, fence outcomes, JSON job logs, p95 in server info."""

from __future__ import annotations

import io
import logging
import urllib.request

import orjson
from prometheus_client.parser import text_string_to_metric_families

from ringfence.logs import configure
from ringfence.redis.embedded import free_port
from test_worker import run_until


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_worker_serves_metrics_and_counts_fence_outcomes(make_app, tmp_path) -> None:
    app = make_app(fence_url=f"sqlite:///{tmp_path}/f.db")
    app.fence_store.create_all()
    effects: list[int] = []

    @app.task(max_attempts=1)
    def charge(ctx, order_id: int) -> None:
        with ctx.fence(f"order:{order_id}", "charge") as step:
            if step.done:
                return
            step.effect(lambda: effects.append(order_id) or f"ch_{order_id}")

    charge.enqueue(order_id=1)
    charge.enqueue(order_id=1)  # a second job for the same order: the second run is empty
    port = free_port()
    worker_box = {}

    def scraped():
        try:
            worker_box["m"] = _samples(port)
        except OSError:
            return False
        return worker_box["m"].get(("ringfence_jobs_finished_total", (("outcome", "ack"), ("queue", "default"),
                                                                       ("task", charge.name)))) == 2

    await run_until(app, scraped, concurrency=1, metrics_port=port)
    m = worker_box["m"]
    assert effects == [1]
    assert m[("ringfence_fence_outcomes_total", (("outcome", "captured"), ("step", "charge")))] == 1
    assert m[("ringfence_fence_outcomes_total", (("outcome", "skipped_done"), ("step", "charge")))] == 1
    assert m[("ringfence_job_duration_seconds_count", (("queue", "default"), ("task", charge.name)))] == 2


async def test_job_log_lines_carry_job_fields_as_json(make_app) -> None:
    app = make_app()
    stream = io.StringIO()
    handler = configure(json=True, level="INFO", stream=stream)

    @app.task(max_attempts=2, retry_delay=lambda attempt, exc: 0.05)
    async def flaky(ctx) -> None:
        raise ValueError("nope")

    job = flaky.enqueue()
    try:
        await run_until(app, lambda: app.broker.queue_counts("default")["dead"] == 1)
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{")]
    about_job = [x for x in lines if x.get("job_id") == job]
    assert len(about_job) >= 2
    assert all(x["task"] == flaky.name and x["queue"] == "default" and x["attempt"] in (1, 2) for x in about_job)


async def test_server_info_reports_job_duration_p95(make_app) -> None:
    app = make_app()

    @app.task
    async def t(ctx) -> None: ...

    app.enqueue_many(t, [{}] * 5)
    await run_until(app, lambda: any(t.name in s.get("duration_p95_s", {}) for s in app.broker.servers()))
