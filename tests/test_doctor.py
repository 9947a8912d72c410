"""Each doctor check against the condition created for real: Redis state, worker processes, fence rows."""

from __future__ import annotations

import asyncio
import signal
import time

import orjson
import pytest
from click.testing import CliRunner

from ringfence import App, RetryPolicy, WorkerSettings
from ringfence.cli import main as cli
from ringfence.doctor import Report, Status, Thresholds, diagnose
from ringfence.fence import FenceStore
from ringfence.fence.model import Owner
from ringfence.models import JobSpec, new_job_id
from ringfence.redis.broker import Broker
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.worker.worker import Worker
from support import wait_until

QUICK = Thresholds(sample_s=0.2)


def statuses(report: Report, check: str) -> list[Status]:
    return [f.status for f in report.by_check(check)]


def finding(report: Report, check: str, subject: str | None = None):
    found = [f for f in report.by_check(check) if f.status in (Status.WARNING, Status.FAILURE)
             and (subject is None or f.subject == subject)]
    assert found, [f.to_dict() for f in report.findings]
    return found[0]


def fake_server(redis_url: str, namespace: str, queues: dict[str, int], environment: str = "test",
                ttl_s: float = 30.0, **extra) -> str:
    """Register a heartbeating server entry through the broker's own API."""
    server_id = f"fake.{new_job_id()[:6]}"
    info = {"id": server_id, "host": "fakehost", "pid": 1, "queues": queues, "environment": environment,
            "started": time.time(), "heartbeat": time.time(), "running": [], "shutdown_timeout_s": 25.0, **extra}

    async def beat() -> None:
        b = Broker(redis_url, namespace)
        await b.claim_environment("test")
        await b.heartbeat_server(server_id, info, ttl_s)
        await b.aclose()

    asyncio.run(beat())
    return server_id


def raw_enqueue(app: App, queue: str, spec: JobSpec) -> str:
    job_id = new_job_id()
    app.broker.register_queues([queue])  # as the client does on a queue's first enqueue
    app.broker.run(app.broker.enqueue(queue, [(job_id, spec.encode(), 0)], inline=True))  # as task.enqueue
    return job_id


def test_healthy_namespace_exits_0(make_app) -> None:
    app = make_app(environment="test")
    report = diagnose(app, QUICK)
    assert report.exit_code == 0, report.problems()
    assert {f.status for f in report.findings} <= {Status.OK, Status.SKIPPED}


def test_backlog_without_any_worker_is_a_failure(make_app, namespace, redis_url) -> None:
    app = make_app(environment="test")

    @app.task
    async def noop(ctx, n: int) -> None: ...

    for n in range(3):
        noop.enqueue(n=n)
    report = diagnose(app, QUICK)
    stalled = finding(report, "backlog_stalled", "default")
    assert stalled.status == Status.FAILURE and stalled.numbers["pending"] == 3
    assert stalled.numbers["processed"] == 0 and stalled.numbers["servers_listing"] == 0
    unserved = finding(report, "queue_unserved", "default")
    assert unserved.numbers["waiting"] == 3
    assert report.exit_code == 2

    res = CliRunner().invoke(cli, ["doctor", "--sample-s", "0.1", "--json"],
                             env={"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace})
    assert res.exit_code == 2, res.output
    doc = orjson.loads(res.output)
    assert {"backlog_stalled", "queue_unserved"} <= {f["check"] for f in doc["findings"] if f["status"] == "failure"}


def test_queue_that_no_live_server_lists(make_app, namespace, redis_url) -> None:
    app = make_app(environment="test")
    fake_server(redis_url, namespace, {"default": 1})
    raw_enqueue(app, "reports", JobSpec("reports.build", {}, app.broker.clock()))
    report = diagnose(app, QUICK)
    f = finding(report, "queue_unserved", "reports")
    assert f.numbers["served_queues"] == ["default"] and f.numbers["servers"] == 1
    assert statuses(report, "backlog_stalled") == [Status.FAILURE]
    assert report.exit_code == 2


def test_server_on_another_environment(make_app, namespace, redis_url) -> None:
    app = make_app(environment="test")
    server_id = fake_server(redis_url, namespace, {"default": 1}, environment="staging")
    report = diagnose(app, QUICK)
    f = finding(report, "environment", server_id)
    assert f.status == Status.FAILURE
    assert f.numbers == {"server_environment": "staging", "namespace_environment": "test"}
    assert report.exit_code == 2


async def test_error_wave_after_a_worker_start(make_app) -> None:
    app = make_app(environment="test")

    @app.task(name="wave.charge")
    async def charge(ctx, order_id: int) -> None: ...

    # A producer on old code sends a payload this handler cannot read (no version bump).
    for _ in range(2):
        raw_enqueue(app, "default", JobSpec("wave.charge", {"order": 1}, app.broker.clock()))
    worker = Worker(app)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_until, lambda: app.broker.queue_counts("default")["dead"] == 2)
        await asyncio.to_thread(wait_until, lambda: app.broker.servers())
        report = await asyncio.to_thread(diagnose, app, QUICK)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    f = finding(report, "error_wave", "default")
    assert f.numbers["bad_payload"] == 2 and f.numbers["server_started"] is not None
    assert report.exit_code == 1


async def test_retry_storm_and_future_load(make_app) -> None:
    app = make_app(environment="test")

    @app.task(name="storm.call", retry=RetryPolicy(max_attempts=5, base_s=30, cap_s=60, jitter=False))
    async def call(ctx, n: int) -> None:
        raise ConnectionError("dependency down")

    app.enqueue_many(call, [{"n": n} for n in range(30)])
    worker = Worker(app, concurrency=10)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_until, lambda: app.broker.queue_counts("default")["retry"] == 30)
        t = Thresholds(sample_s=0.1, retry_warn=10, future_load_warn=100)
        report = await asyncio.to_thread(diagnose, app, t)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    storm = finding(report, "retry_storm", "default")
    assert storm.numbers["retry"] == 30
    load = finding(report, "future_load", "queue:default")
    assert load.numbers == {"jobs": 30, "remaining_attempts": 30 * 4}  # one attempt burned, four left each
    assert report.exit_code == 1


@pytest.mark.slow
def test_orphaned_attempts_after_a_sigkill(make_app, spawn_worker) -> None:
    app = make_app(environment="test")
    first = spawn_worker()
    job = app.enqueue_many(_task(app, "workerapp.slow"), [{"seconds": 30}])[0]
    wait_until(lambda: app.broker.lease_token("default", job))
    first.kill()  # SIGKILL mid-job: its lease expires and a live worker recovers the job
    spawn_worker()
    wait_until(lambda: any(h.get("orphaned") for h in app.broker.history("default", job)), timeout=30)
    report = diagnose(app, QUICK)
    f = finding(report, "orphaned", "default")
    assert f.numbers["recent"] == 1 and f.numbers["total"] == 1
    assert report.exit_code == 1


@pytest.mark.slow
@pytest.mark.parametrize(("task", "counter"), [("workerapp.slow", "requeued_on_shutdown"),
                                               ("workerapp.slow_sync", "abandoned_on_shutdown")])
def test_shutdown_timeout_shorter_than_the_jobs(make_app, spawn_worker, task: str, counter: str) -> None:
    """Async jobs go back to the queue; a sync job's thread cannot be stopped, so it stays leased (counted)."""
    app = make_app(environment="test")
    w = spawn_worker(env={"TEST_SHUTDOWN_S": "0.3"})
    job = app.enqueue_many(_task(app, task), [{"seconds": 20}])[0]
    wait_until(lambda: app.broker.lease_token("default", job))
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    report = diagnose(app, QUICK)
    f = finding(report, "shutdown_timeout", "default")
    assert f.numbers[counter] == 1 and sum(f.numbers[c] for c in ("requeued_on_shutdown", "abandoned_on_shutdown")) == 1


def test_latency_high_in_one_queue_only(make_app, namespace, redis_url) -> None:
    app = make_app(environment="test")
    fake_server(redis_url, namespace, {"fast": 6, "slow": 1})
    app.broker.register_queues(["fast", "slow"])
    raw_enqueue(app, "slow", JobSpec("reports.build", {}, app.broker.clock() - 120_000))
    report = diagnose(app, Thresholds(sample_s=0.1, latency_warn_s=60))
    f = finding(report, "starvation", "slow")
    assert f.numbers["latency_s"] >= 120 and f.numbers["others_latency_s"] == {"fast": 0.0}
    assert not [x for x in report.by_check("starvation") if x.subject == "fast"]


def test_in_doubt_fence(make_app, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/fences.db"
    app = make_app(environment="test", fence_url=url)
    store: FenceStore = app.fence_store
    store.capture("order:7", "charge", Owner("job-1", "tok-1", 30.0), "h", None)
    store.mark_calling("order:7", "charge", 1, None, 30.0)
    store.park("order:7", "charge", 1)
    report = diagnose(app, QUICK)
    f = finding(report, "in_doubt", "fences")
    assert f.status == Status.FAILURE and f.numbers["in_doubt"] == 1
    assert report.exit_code == 2
    store.resolve("order:7", "charge", happened=True, reference="ch_7")
    assert statuses(diagnose(app, QUICK), "in_doubt") == [Status.OK]


def test_allkeys_eviction_policy_is_a_failure(namespace) -> None:
    server = EmbeddedRedis.temporary(port=free_port(), extra=("--maxmemory-policy", "allkeys-lru"))
    try:
        app = App(server.url, namespace, environment="test")
        report = diagnose(app, QUICK)
        f = finding(report, "eviction", "redis")
        assert f.status == Status.FAILURE and f.numbers["policy"] == "allkeys-lru"
        assert report.exit_code == 2
        app.close()
    finally:
        server.stop()


def test_per_job_timeout_beyond_the_workers_lease(make_app, namespace, redis_url) -> None:
    worker_app = make_app(environment="test")
    # A producer deployed with a longer max_lease_s than the workers'.
    producer = App(redis_url, namespace, environment="test", worker=WorkerSettings(max_lease_s=10_000))

    @producer.task(name="export.big")
    async def big(ctx) -> None: ...

    big.with_options(timeout_s=5000).enqueue()
    report = diagnose(worker_app, QUICK)
    f = finding(report, "timeouts", "default")
    assert f.numbers == {"jobs": 1, "max_timeout_s": 5000.0, "max_lease_s": 3600.0}
    assert report.exit_code == 2


def _task(app: App, name: str):
    """A producer-side handle for a task served by tests/workerapp.py (same name, payload shape)."""

    async def handler(ctx, seconds: float) -> None: ...

    return app.task(handler, name=name) if name not in app.registry.tasks else app.registry.tasks[name]
