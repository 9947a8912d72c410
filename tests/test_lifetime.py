"""A worker's lifetime as ``ringfence worker`` runs it (one process, no ``--processes``): a sync job past its
timeout, the process replacing itself, the shutdown order as a handler that watches ``ctx.cancelled`` sees it,
and the per-task summary lines."""

from __future__ import annotations

import importlib
import os
import signal
import time
from typing import Any

import orjson
import pytest

from ringfence import App
from ringfence.queries import find_dead
from support import wait_until
from test_processes import assert_one_run_at_a_time, records, spans

pytestmark = pytest.mark.slow

APP = ("--app", "lifetimeapp:app")


def producer(redis_url: str, namespace: str) -> tuple[App, Any]:
    os.environ["RINGFENCE_NAMESPACE"] = namespace
    os.environ["RINGFENCE_REDIS_URL"] = redis_url
    import lifetimeapp

    mod = importlib.reload(lifetimeapp)
    return mod.app, mod


def one_server(app: App) -> dict[str, Any]:
    [server] = wait_until(lambda: len(app.broker.servers()) == 1 and app.broker.servers(), timeout=30)
    return server


def test_a_sync_handler_that_returns_soon_after_its_timeout_keeps_its_worker(
    redis_url, namespace, rdb, spawn_worker
) -> None:
    """Its first run outlives the 0.5 s timeout, sees ``ctx.cancelled`` within a second and returns: that attempt
    is a timeout, and the same worker process, still registered under the same id, runs the retry and more."""
    app, m = producer(redis_url, namespace)
    w = spawn_worker(*APP)
    first = one_server(app)
    m.overruns.enqueue(seconds=30)
    runs = wait_until(lambda: len(spans(rdb, namespace)) == 2 and all(s.done for s in spans(rdb, namespace))
                      and spans(rdb, namespace), timeout=30)
    assert [(r.attempt, r.pid) for r in runs] == [(1, w.pid), (2, w.pid)]
    assert runs[0].end - runs[0].start < 5  # it returned soon after ctx.cancelled, not after 30 s
    assert_one_run_at_a_time(runs)
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 1)
    m.noop.enqueue(n=1)
    wait_until(lambda: records(rdb, namespace, "runs"), timeout=10)
    # the run's record comes from the handler, its count from the ack batched after it
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 2, timeout=10)
    assert w.proc.poll() is None
    assert [s["id"] for s in app.broker.servers()] == [first["id"]]  # never restarted
    stats = app.broker.queue_counts("default")["stats"]
    assert stats.get("orphaned", 0) == 0 and stats["processed"] == 2
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0


def test_a_stuck_sync_handler_has_its_worker_replace_itself(redis_url, namespace, rdb, spawn_worker) -> None:
    """A first run blind to ``ctx.cancelled`` for 60 s: past its timeout and the grace, the worker drains and
    executes itself again (same process id, a new server id); the new worker runs the job once the old run's
    thread is gone with the old image (its lease lapsed), and serves on; SIGTERM stops it as ever."""
    app, m = producer(redis_url, namespace)
    w = spawn_worker(*APP, "-p", "1", env={"TEST_SHUTDOWN_S": "1"})
    first = one_server(app)
    job = m.stuck.enqueue(seconds=60)
    runs = wait_until(lambda: len(spans(rdb, namespace)) == 2 and spans(rdb, namespace)[1].done
                      and spans(rdb, namespace), timeout=60)
    assert [(r.attempt, r.pid) for r in runs] == [(1, w.pid), (2, w.pid)]
    assert not runs[0].done  # the first run never returned: it ended with the process image
    assert_one_run_at_a_time(runs)
    assert w.proc.poll() is None
    [second] = app.broker.servers()
    assert second["pid"] == w.pid and second["id"] != first["id"]
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 1)
    assert app.broker.queue_counts("default")["stats"]["orphaned"] == 1  # the lapsed lease counted attempt 1
    m.noop.enqueue(n=1)
    wait_until(lambda: records(rdb, namespace, "runs"), timeout=10)
    assert not find_dead(app.broker, job)
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    wait_until(lambda: not app.broker.servers(), timeout=10)


@pytest.mark.parametrize(("signals", "code"), [([signal.SIGTERM], 0), ([signal.SIGINT], 0),
                                               ([signal.SIGTERM, signal.SIGTERM], 130)],
                         ids=["term", "int", "term-twice"])
def test_a_stop_during_the_replacement_drain_stops_the_worker(
    redis_url, namespace, rdb, spawn_worker, signals: list[int], code: int
) -> None:
    """A stop signal while a stuck run's worker drains to replace itself: a stop, not a replacement (a second
    signal: exit at once, 130, as ever)."""
    app, m = producer(redis_url, namespace)
    w = spawn_worker(*APP, env={"TEST_SHUTDOWN_S": "6"})
    one_server(app)
    m.stuck.enqueue(seconds=60)
    wait_until(lambda: spans(rdb, namespace))
    time.sleep(7)  # past the 0.5 s timeout and the 5 s grace: draining (for 6 s) to be replaced
    t0 = time.monotonic()
    for sig in signals:
        w.signal(sig)
        time.sleep(0.3)
    assert w.wait(20) == code
    if code == 130:
        assert time.monotonic() - t0 < 4  # at once, not at the drain's end
    assert "replacing" not in w.output()
    wait_until(lambda: not app.broker.servers(), timeout=10)  # gone (at once: its entry expires)


@pytest.mark.parametrize(("task", "requeue"), [("steps", False), ("steps", True), ("asteps", False)],
                         ids=["sync-returns", "sync-asks-to-run-again", "async-returns"])
def test_sigterm_sets_ctx_cancelled_at_once_and_waits_for_the_handler(
    redis_url, namespace, rdb, spawn_worker, task: str, requeue: bool
) -> None:
    """A handler that checks ``ctx.cancelled`` once a second gets it at the stop's start, not at its end: it
    finishes its step and returns (the job is done) or raises RetryLater (back in the queue, no attempt counted),
    well within shutdown_timeout_s (5 s); the worker then exits 0 at once."""
    app, m = producer(redis_url, namespace)
    w = spawn_worker(*APP)
    one_server(app)
    kwargs: dict[str, Any] = {"seconds": 60} | ({"requeue": requeue} if task == "steps" else {})
    job = getattr(m, task).enqueue(**kwargs)
    k = app.broker.keys.queue("default")
    wait_until(lambda: rdb.zscore(k.active, job) is not None)
    time.sleep(1.5)  # into its run
    t0 = time.monotonic()
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    assert time.monotonic() - t0 < 4.5  # it did not wait out shutdown_timeout_s
    assert rdb.zscore(k.active, job) is None  # settled by this worker, not left to a lapsing lease
    stats = app.broker.queue_counts("default")["stats"]
    assert stats.get("orphaned", 0) == 0 and stats.get("abandoned_on_shutdown", 0) == 0
    if requeue:
        assert app.broker.job_state("default", job) == "pending" and stats.get("processed", 0) == 0
        assert app.broker.history("default", job) == []  # no attempt recorded as failed or orphaned
        w2 = spawn_worker(*APP)  # the next run is attempt 1 again
        wait_until(lambda: spans(rdb, namespace) and len(spans(rdb, namespace)) == 2, timeout=30)
        assert [s.attempt for s in spans(rdb, namespace)] == [1, 1]
        w2.kill()
    else:
        assert [f[:2] for f in records(rdb, namespace, "finished")] == [[job, "1"]]
        assert stats["processed"] == 1


def test_at_info_a_worker_says_what_it_did_once_per_interval(redis_url, namespace, rdb, spawn_worker) -> None:
    """One summary line per task and queue every ``--summary-s``, only when something finished: counts by
    outcome and the run time's p95, as JSON fields with ``--log-json``."""
    app, m = producer(redis_url, namespace)
    w = spawn_worker(*APP, "--summary-s", "1", env={"RINGFENCE_LOG_JSON": "1"})
    one_server(app)
    app.enqueue_many(m.noop, [{"n": i} for i in range(20)])
    m.fails.enqueue()
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed") == 20, timeout=20)
    time.sleep(3)  # at least one summary after the last job; then quiet ones print nothing
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    lines = [orjson.loads(x) for x in w.output().splitlines() if x.startswith("{")]
    summaries = [x for x in lines if "summary" in x]
    by_task: dict[str, dict[str, int]] = {}
    for s in summaries:
        assert s["level"] == "INFO" and s["queue"] == "default"
        for key, n in s["summary"].items():
            if isinstance(n, int):
                by_task.setdefault(s["task"], {}).setdefault(key, 0)
                by_task[s["task"]][key] += n
    noop, fails = f"{m.noop.name}", f"{m.fails.name}"
    assert by_task[noop] == {"done": 20, "retried": 0, "dead": 0, "requeued": 0}
    assert by_task[fails] == {"done": 0, "retried": 0, "dead": 1, "requeued": 0}
    assert len(summaries) <= 4  # one per task per interval with news, none while idle


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_summary_interval_is_refused(redis_url, namespace, rdb, spawn_worker, value: str) -> None:
    w = spawn_worker(*APP, "-p", "2", "--summary-s", value)
    assert w.wait(20) == 2
    out = w.output()
    assert f"--summary-s {float(value)}: must be a number of seconds >= 0" in out, out
    assert not rdb.keys(f"{namespace}:servers*"), "a worker started"


def test_a_stop_signal_during_the_replacement_stops_the_new_worker_gracefully(
    redis_url, namespace, rdb, spawn_worker
) -> None:
    """SIGTERM sent the moment the worker executes itself again (the new interpreter not yet handling signals):
    held across the exec, it reaches the new worker once it handles them, as a graceful stop (exit 0), not death
    by the signal (143) nor a worker that serves on."""
    app, m = producer(redis_url, namespace)
    w = spawn_worker(*APP, env={"TEST_SHUTDOWN_S": "1"})
    one_server(app)
    m.stuck.enqueue(seconds=60)
    assert w.proc.stdout is not None
    lines = []
    for raw in w.proc.stdout:
        lines.append(raw.decode(errors="replace"))
        if "replacing this worker process" in lines[-1]:
            w.signal(signal.SIGTERM)
            break
    else:
        raise AssertionError("".join(lines))
    rest = w.proc.stdout.read().decode(errors="replace")
    assert w.wait(30) == 0, rest
    assert "stopping: no new jobs" in rest  # the new worker took it as a stop
    wait_until(lambda: not app.broker.servers(), timeout=10)
