"""Prometheus labels of a partitioned queue, scraped from the real endpoints: the exporter labels each partition's
series ``queue="hot", partition="2of4"`` (a plain queue's: ``queue`` alone), a worker counts a partition's jobs
under ``queue="hot"``."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringfence import App
from ringfence.metrics import serve_exporter
from ringfence.redis.embedded import free_port
from support import ROOT, kill_groups, wait_until

PARTS = 4


def _spread(ctx: object, n: int) -> None:
    pass


def scrape(port: int, prefix: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except (urllib.error.URLError, ConnectionError):
        return {}
    return {(s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(body)
            for s in family.samples if s.name.startswith(prefix)}


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    kill_groups(procs)


def test_the_exporter_labels_each_partition_with_its_queue(make_app: Callable[..., App]) -> None:
    app = make_app()
    app.queue("hot", partitions=PARTS)
    app.task(name="spread", queue="hot")(_spread)
    app.task(name="low", queue="low")(_spread)
    app.enqueue_many("spread", [{"n": n} for n in range(4 * PARTS)])
    app.enqueue_many("low", [{"n": n} for n in range(3)])
    server = serve_exporter(app.broker, free_port(), "127.0.0.1")
    try:
        got = scrape(server.server_port, "ringfence_queue_")
    finally:
        server.shutdown()
    parts = {frozenset({("queue", "hot"), ("partition", f"{i}of{PARTS}")}) for i in range(PARTS)}
    low = frozenset({("queue", "low")})
    for name in ("ringfence_queue_pending", "ringfence_queue_jobs_enqueued_total"):
        assert {labels: v for (n, labels), v in got.items() if n == name} == {**dict.fromkeys(parts, 4), low: 3}
    assert {labels for n, labels in got if n == "ringfence_queue_latency_seconds"} == {*parts, low}


def test_a_worker_counts_a_partitions_jobs_under_its_queue(
        make_app: Callable[..., App], redis_url: str, namespace: str, started: list[subprocess.Popen[bytes]]) -> None:
    app = make_app()
    app.queue("hot", partitions=PARTS)
    app.task(name="spread", queue="hot")(_spread)
    app.enqueue_many("spread", [{"n": n} for n in range(20)])
    port = free_port()
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "TEST_PARTITIONS": str(PARTS),
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started.append(subprocess.Popen(
        [sys.executable, "-m", "ringfence.cli", "worker", "--app", "partitionapp:app", "--queues", "hot",
         "--concurrency", "4", "--metrics-port", str(port)], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True))
    job = frozenset({("task", "spread"), ("queue", "hot")})
    acked = ("ringfence_jobs_finished_total", job | {("outcome", "ack")})
    got: dict[Any, float] = wait_until(lambda: (g := scrape(port, "ringfence_job")).get(acked) == 20 and g)
    assert got[("ringfence_jobs_started_total", job)] == 20
    assert got[("ringfence_job_duration_seconds_count", job)] == 20
    assert {dict(labels)["queue"] for _, labels in got} == {"hot"}  # no series per partition
