"""Real worker processes: SIGKILL, SIGTERM, two workers at once, bulk exactly-once, env guard.
(The supervisor of ``--processes``: test_supervisor.py.)"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import NamedTuple

import orjson
import pytest
import redis

from ringfence import App
from ringfence.queries import find_dead
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


class Span(NamedTuple):
    start: float
    end: float  # the run's last sign of life (its true end when done)
    done: bool  # the handler returned (else its process died while it ran)
    attempt: int
    pid: int


def spans(rdb: redis.Redis, namespace: str) -> list[Span]:
    """The runs recorded by workerapp.span, by start time."""
    out = []
    for run, value in rdb.hgetall(f"{namespace}:test:spans").items():
        _job, attempt, pid = run.decode().split()
        start, end, *done = value.decode().split()
        out.append(Span(float(start), float(end), bool(done), int(attempt), int(pid)))
    return sorted(out)


def assert_one_run_at_a_time(runs: list[Span]) -> None:
    for a, b in itertools.pairwise(runs):
        # A run whose process died ended within one 20 ms beat after its last sign of life.
        assert b.start > a.end + (0 if a.done else 0.1), f"run {b} started while {a} still ran"


def test_sigkill_mid_job_is_redelivered_and_runs_to_the_end(redis_url, namespace, rdb, spawn_worker) -> None:
    app, m = producer(redis_url, namespace)
    job = m.slow.enqueue(seconds=1.0, first_s=60)  # the first run lasts until it is killed
    w1 = spawn_worker("--concurrency", "2")
    wait_until(lambda: records(rdb, namespace, "started"))
    # The second worker is up (registered) before the kill: its start-up, slow on a loaded machine, is no part
    # of the redelivery time measured below.
    spawn_worker("--concurrency", "2")
    wait_until(lambda: len(app.broker.servers()) == 2, timeout=60)
    w1.kill()
    killed_at = time.time()
    assert not records(rdb, namespace, "finished")
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


def test_sigterm_keeps_a_sync_job_leased_until_its_thread_dies_with_the_process(
    redis_url, namespace, rdb, spawn_worker
) -> None:
    """A sync handler still running past shutdown_timeout_s is not requeued while it runs: the job stays
    leased, the process exits, the lease lapses and another worker runs it after the first run is gone."""
    app, m = producer(redis_url, namespace)
    job = m.lingers.enqueue(first_s=30, then_s=0.1)
    first = spawn_worker(env={"TEST_SHUTDOWN_S": "1"})
    wait_until(lambda: spans(rdb, namespace))
    second = spawn_worker()  # idle: it would take the job the moment it were free
    wait_until(lambda: len(app.broker.servers()) == 2)
    t0 = time.monotonic()
    first.signal(signal.SIGTERM)
    assert first.wait(15) == 0
    assert time.monotonic() - t0 < 6
    k = app.broker.keys.queue("default")
    assert rdb.zscore(k.active, job) is not None and rdb.llen(k.pending) == 0  # still leased, not requeued
    runs = wait_until(lambda: len(spans(rdb, namespace)) == 2 and spans(rdb, namespace)[1].done
                      and spans(rdb, namespace), timeout=20)
    assert_one_run_at_a_time(runs)
    assert [(r.attempt, r.pid) for r in runs] == [(1, first.pid), (2, second.pid)]
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 1)
    stats = app.broker.queue_counts("default")["stats"]
    assert stats["orphaned"] == 1 and stats["abandoned_on_shutdown"] == 1  # the lapsed lease counted the attempt


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


@pytest.mark.parametrize(("seconds", "shutdown_s"), [(1.2, "3"), (30, "1")],
                         ids=["thread-returns-within-the-grace", "thread-outlives-the-process"])
def test_a_sync_job_past_its_timeout_never_runs_twice_at_once(
    redis_url, namespace, rdb, spawn_worker, seconds: float, shutdown_s: str
) -> None:
    """Each run overruns its 0.5 s timeout. One that returns within the grace is a timeout and its worker serves
    on; one still running after it has its worker exit 75, and the supervisor replaces it. The job's next run
    starts only after the previous thread has returned or died with its process."""
    app, m = producer(redis_url, namespace)
    job = m.overruns.enqueue(seconds=seconds)
    sup = spawn_worker("-p", "2", env={"TEST_SHUTDOWN_S": shutdown_s})
    dead = wait_until(lambda: find_dead(app.broker, job), timeout=90)
    runs = spans(rdb, namespace)
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert_one_run_at_a_time(runs)
    assert all(r.done for r in runs) == (seconds < 3)
    ran_in = {r.pid for r in runs}
    if seconds < 3:  # the processes that ran it serve on
        assert ran_in <= {s["pid"] for s in app.broker.servers()}
    else:
        assert len(ran_in) == 3  # every process that ran it exited...
        wait_until(lambda: len(app.broker.servers()) == 2 and not ran_in & {s["pid"] for s in app.broker.servers()},
                   timeout=20)  # ...and was replaced
    assert dead.reason == "max_attempts"
    errors = [h["error"] for h in dead.history]
    if seconds < 3:  # settled when the thread returned
        assert errors == ["TimeoutError: timed out after 0.5s"] * 3
    else:  # the lease lapsed after the process exited
        assert [h.get("orphaned") for h in dead.history[:3]] == [True] * 3
        assert "earlier attempts were orphaned" in dead.error
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == 0


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


def test_threads_start_that_many_job_threads(redis_url, namespace, rdb, spawn_worker) -> None:
    """``--threads 3``: three job threads from the first calls on. Calls of 3 ms that keep the process on its CPU
    get no thread from the grower (none waits a whole 5 ms, and the process is not sleeping on I/O), so the
    default two would run them all."""
    app, mod = producer(redis_url, namespace)
    app.enqueue_many(mod.spins, [{"seconds": 0.003}] * 30)
    spawn_worker("--threads", "3", "--concurrency", "6")
    wait_until(lambda: rdb.llen(f"{namespace}:test:runs") == 30)
    names = {n.decode() for n in rdb.smembers(f"{namespace}:test:threads")}
    assert len(names) >= 3, names


@pytest.mark.parametrize(("args", "said"), [
    (["--threads", "0"], "--threads 0 must be between 1 and --concurrency (10)"),
    (["--threads", "11"], "--threads 11 must be between 1 and --concurrency (10)"),
    (["-c", "3", "-t", "4", "-p", "2"], "--threads 4 must be between 1 and --concurrency (3)"),  # before forking
])
def test_threads_out_of_range_is_refused(redis_url, namespace, rdb, spawn_worker, args: list[str], said: str) -> None:
    w = spawn_worker(*args)
    assert w.wait(20) == 2
    out = w.output()
    assert said in out and "one job thread per slot at most" in out, out
    assert not rdb.keys(f"{namespace}:servers*"), "a worker started"
