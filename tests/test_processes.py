"""Real worker processes: SIGKILL, SIGTERM, two workers at once, bulk exactly-once, env guard.
(The supervisor of ``--processes``: test_supervisor.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import orjson
import pytest
import redis

from ringfence import App
from support import ROOT, wait_until

pytestmark = pytest.mark.slow


def producer(redis_url: str, namespace: str) -> tuple[App, object]:
    """Import the worker app in this process too, for its task objects."""
    os.environ.setdefault("RINGFENCE_REDIS_URL", redis_url)
    os.environ["RINGFENCE_NAMESPACE"] = namespace
    os.environ["RINGFENCE_REDIS_URL"] = redis_url
    import importlib

    import workerapp

    mod = importlib.reload(workerapp)
    return mod.app, mod


def records(rdb: redis.Redis, namespace: str, kind: str) -> list[list[str]]:
    return [x.decode().split() for x in rdb.lrange(f"{namespace}:test:{kind}", 0, -1)]


def test_sigkill_mid_job_is_redelivered_and_runs_to_the_end(redis_url, namespace, rdb, spawn_worker) -> None:
    app, m = producer(redis_url, namespace)
    job = m.slow.enqueue(seconds=1.0)
    w1 = spawn_worker("--concurrency", "2")
    wait_until(lambda: records(rdb, namespace, "started"))
    w1.kill()
    killed_at = time.time()
    assert not records(rdb, namespace, "finished")
    spawn_worker("--concurrency", "2")
    finished = wait_until(lambda: records(rdb, namespace, "finished"), timeout=30)
    started = records(rdb, namespace, "started")
    assert [s[:2] for s in started] == [[job, "1"], [job, "2"]]  # second delivery, attempt counted
    assert finished[0][:2] == [job, "2"]
    assert float(started[1][2]) - killed_at < app.worker_settings.lease_s + 3
    # The ack follows the handler's last line by a moment (acks are batched).
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 1)
    assert app.broker.history("default", job) == []  # acked: the history went with the job
    assert app.broker.queue_counts("default")["stats"]["orphaned"] == 1


def test_sigterm_lets_a_short_job_finish(redis_url, namespace, rdb, spawn_worker) -> None:
    app, m = producer(redis_url, namespace)
    job = m.slow_sync.enqueue(seconds=1.0)
    w = spawn_worker(env={"TEST_SHUTDOWN_S": "5"})
    wait_until(lambda: records(rdb, namespace, "started"))
    w.signal(signal.SIGTERM)
    assert w.wait(15) == 0
    assert [f[:2] for f in records(rdb, namespace, "finished")] == [[job, "1"]]
    counts = app.broker.queue_counts("default")
    assert counts["stats"]["processed"] == 1 and counts["pending"] == counts["active"] == 0


def test_sigterm_returns_a_long_job_without_burning_an_attempt(redis_url, namespace, rdb, spawn_worker) -> None:
    app, m = producer(redis_url, namespace)
    job = m.slow_sync.enqueue(seconds=30)
    w = spawn_worker(env={"TEST_SHUTDOWN_S": "1"})
    wait_until(lambda: records(rdb, namespace, "started"))
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    w.wait(15)
    assert time.monotonic() - t0 < 6
    k = app.broker.keys.queue("default")
    assert rdb.lrange(k.pending, 0, -1) == [job.encode()]
    assert app.broker.attempts("default", job) == 0 and rdb.zcard(k.active) == 0
    assert not records(rdb, namespace, "finished")


def test_two_workers_never_run_one_job_at_once_and_bulk_runs_exactly_once(
    redis_url, namespace, rdb, spawn_worker
) -> None:
    app, m = producer(redis_url, namespace)
    ids = app.enqueue_many(m.noop, [{"n": i} for i in range(1000)])
    slow_ids = app.enqueue_many(m.interval, [{"seconds": 0.05} for _ in range(40)])
    spawn_worker("--concurrency", "8")
    spawn_worker("--concurrency", "8")
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed", 0) == 1040, timeout=60)
    runs = Counter(r[0] for r in records(rdb, namespace, "runs"))
    assert set(runs) == set(ids) and set(runs.values()) == {1}
    intervals = records(rdb, namespace, "intervals")
    assert sorted(r[0] for r in intervals) == sorted(slow_ids)
    servers = app.broker.servers()
    assert len(servers) == 2 and {s["environment"] for s in servers} == {"test"}


def test_sync_job_past_its_timeout_stops_the_worker_process(redis_url, namespace, rdb, spawn_worker) -> None:
    app, m = producer(redis_url, namespace)
    job = m.hangs.enqueue(seconds=30)
    w = spawn_worker()
    code = w.wait(20)
    assert code == 75
    assert "exceeded its timeout" in w.output()
    retry = app.broker.sync.zrange(app.broker.keys.queue("default").retry, 0, -1)
    assert retry == [job.encode()]
    assert "timed out after 0.5s" in app.broker.history("default", job)[0]["error"]


def test_worker_on_another_environment_refuses_to_start(redis_url, namespace, spawn_worker) -> None:
    spawn_worker()  # claims the namespace as "test"
    app, _ = producer(redis_url, namespace)
    wait_until(lambda: app.broker.servers())
    w = spawn_worker(env={"RINGFENCE_ENV": "staging"})
    assert w.wait(20) == 2
    out = w.output()
    assert "belongs to environment 'test'" in out and "'staging'" in out


def test_info_and_servers_json(redis_url, namespace, spawn_worker) -> None:
    app, m = producer(redis_url, namespace)
    app.enqueue_many(m.slow, [{"seconds": 0.01}] * 3)
    m.slow.with_options(delay_s=3600).enqueue(seconds=0.01)
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "PYTHONPATH": str(ROOT / "tests")}
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "info", "--json"], env=env,
                         capture_output=True, timeout=30, check=True)
    [q] = orjson.loads(out.stdout)["queues"]
    assert q["queue"] == "default" and q["pending"] == 3 and q["scheduled"] == 1
    assert set(q) >= {"pending", "active", "scheduled", "retry", "dead", "processed", "failed", "latency_s", "paused"}
    spawn_worker("--queues", "default=3,other=1", "--concurrency", "4")
    wait_until(lambda: app.broker.servers())
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "servers", "--json"], env=env,
                         capture_output=True, timeout=30, check=True)
    [s] = orjson.loads(out.stdout)
    assert s["queues"] == {"default": 3, "other": 1} and s["concurrency"] == 4
    assert {"host", "pid", "namespace", "environment", "started", "heartbeat", "running"} <= set(s)
    table = subprocess.run([sys.executable, "-m", "ringfence.cli", "info"], env=env, capture_output=True,
                           timeout=30, check=True, text=True)
    assert "default" in table.stdout and "pending" in table.stdout
