"""The dead-letter sweep: a job that leaves the queue owning a ``calling`` step parks it in doubt and names it in
its dead record. Under the faults the chaos run found: its private Redis restarting (refused, then LOADING) while
the sweep asks whether the step's owner is alive, and the attempt's lease moving on between parking the step and
the dead-letter script. A real in-process worker, a real private redis-server, a SQLite fence store."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from sqlalchemy import event

from ringfence import App, WorkerSettings, faults
from ringfence.fence import Fences, FenceState, Owner
from ringfence.models import Fetched
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.worker.fencing import Fencing
from ringfence.worker.worker import Worker
from support import at_point, kill_at, wait_until

AOF = ("--appendonly", "yes", "--appendfsync", "always")
SETTINGS = WorkerSettings(lease_s=6.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                          shutdown_timeout_s=3.0, server_ttl_s=3.0)
SUBJECT = "order:1"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis(str(tmp_path / "redis"), port=free_port(), extra=AOF).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def app(server: EmbeddedRedis, tmp_path: Path) -> Iterator[App]:
    a = App(server.url, f"t{uuid.uuid4().hex[:8]}", environment="test", fence_url=f"sqlite:///{tmp_path}/f.db",
            worker=SETTINGS)
    a.fence_store.create_all()
    yield a
    a.close()


def leave_calling(app: App, job_id: str) -> None:
    """An earlier attempt of ``job_id`` got the provider's answer and died before recording it."""
    owner = Owner(job_id, "earlier-attempt", lease_s=1.0)
    with (kill_at("after_effect"), pytest.raises(faults.SimulatedKill),
          Fences(app.fence_store, owner).open(SUBJECT, "charge") as step):
        step.effect(lambda: "ch_1")
    row = app.fence_store.get(SUBJECT, "charge")
    assert row is not None and row.state is FenceState.CALLING


def restart_loading(server: EmbeddedRedis) -> threading.Thread:
    """Stop the Redis now; start it again in the background, LOADING its AOF for ~1.5 s (3,000 keys, 0.5 ms each)."""
    r = redis.Redis.from_url(server.url)
    pipe = r.pipeline(transaction=False)
    for i in range(3000):
        pipe.set(f"filler:{i}", "x")
    pipe.execute()
    r.bgrewriteaof()  # the keys go into the AOF's RDB preamble, which --key-load-delay slows down
    wait_until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0, timeout=10)
    r.close()
    server.stop()
    server.extra = (*AOF, "--key-load-delay", "500")
    thread = threading.Thread(target=server.start, daemon=True)
    thread.start()
    return thread


def on_sql(app: App, match: Callable[[str, Any], bool], action: Callable[[], None]) -> None:
    """Run ``action`` once, right after the fence store executes the first statement ``match`` accepts."""
    fired: list[bool] = []

    def hook(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if not fired and match(statement, parameters):
            fired.append(True)
            action()

    event.listen(app.fence_store.engine, "after_cursor_execute", hook)


def is_owned_read(statement: str, _parameters: Any) -> bool:
    return statement.lstrip().upper().startswith("SELECT") and "owner_job_id =" in statement


def one_dead(app: App) -> bool:
    try:
        return bool(app.broker.queue_counts("default")["dead"] == 1)
    except (redis.ConnectionError, redis.TimeoutError):
        # restarting: refused, LOADING (a ConnectionError too) or, under load, no reply within the socket timeout
        return False


def dead_record(app: App, job_id: str) -> dict[str, Any]:
    [(_, raw)] = app.broker.dead_records("default", [job_id])
    return dict(orjson.loads(raw))


def fetched(job_id: str) -> Fetched:
    return Fetched(job_id, "default", b"", 2, "this-attempt", 0)


async def test_sweep_rides_out_a_redis_restart(app: App, server: EmbeddedRedis) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    leave_calling(app, job)
    app.broker.register_queues(["default"])
    restarted = restart_loading(server)
    t0 = time.monotonic()
    left = await Fencing(app, app.broker, SETTINGS).leaving(fetched(job))  # refused, then LOADING, then answers
    restarted.join(15)
    assert time.monotonic() - t0 > 0.5  # it did meet the restart
    assert left is not None
    notes, in_doubt = left
    assert in_doubt and len(notes) == 1
    assert notes[0].startswith(f"fence {SUBJECT}/charge was calling: the effect may have happened; now in_doubt")
    row = app.fence_store.get(SUBJECT, "charge")
    assert row is not None and row.state is FenceState.IN_DOUBT and row.owner_job_id == job


async def test_sweep_that_cannot_check_does_not_let_the_job_die_blind(app: App, server: EmbeddedRedis) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    leave_calling(app, job)
    server.stop()  # and it stays down longer than the sweep's retries (one lease)
    short = WorkerSettings(lease_s=1.0, heartbeat_s=0.25)
    t0 = time.monotonic()
    assert await Fencing(app, app.broker, short).leaving(fetched(job)) is None
    assert 0.3 < time.monotonic() - t0 < 5  # it retried: its jittered delays sum to at least 0.35 s within a 1 s lease
    row = app.fence_store.get(SUBJECT, "charge")
    assert row is not None and row.state is FenceState.CALLING  # untouched: the next attempt's sweep decides


async def run_worker_until(app: App, done: Callable[[], bool], timeout: float = 30) -> None:
    worker = Worker(app, alerts=False)
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_until, done, timeout)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 20)


def failing_task(app: App) -> Any:
    def fails(ctx: Any) -> None:
        raise RuntimeError("the provider said no")

    return app.task(name="sweep.fails", max_attempts=1)(fails)


async def test_dead_letter_during_a_redis_restart_names_the_step(app: App, server: EmbeddedRedis) -> None:
    """The attempt that meets the restart dead-letters the job itself, its step parked and named (before: it
    gave up on the first connection error; the job died as max_attempts with its step left calling)."""
    task = failing_task(app)
    job = task.enqueue()
    leave_calling(app, job)
    restarted: list[threading.Thread] = []
    on_sql(app, is_owned_read, lambda: restarted.append(restart_loading(server)))  # exactly while it sweeps
    await run_worker_until(app, lambda: one_dead(app))
    assert restarted and not restarted[0].is_alive()

    rec = dead_record(app, job)
    assert rec["attempts"] == 1  # dead-lettered by the attempt that met the restart
    assert rec["reason"] == "in_doubt"
    assert "exceeds" not in rec["error"] and "RuntimeError: the provider said no" in rec["error"]
    assert f"fence {SUBJECT}/charge was calling: the effect may have happened; now in_doubt" in rec["error"]
    row = app.fence_store.get(SUBJECT, "charge")
    assert row is not None and row.state is FenceState.IN_DOUBT and row.owner_job_id == job
    [durable] = wait_until(lambda: app.failed_jobs.unreplayed([job]), timeout=10)
    assert durable["reason"] == "in_doubt" and f"{SUBJECT}/charge" in durable["error"]


async def test_refused_dead_letter_keeps_the_steps_name(app: App) -> None:
    """The lease moves on between parking the step and the dead-letter script (it lapsed and was recovered):
    that dead-letter is refused, and the next attempt's dead-letter names the step now in doubt."""
    task = failing_task(app)
    job = task.enqueue()
    leave_calling(app, job)
    k = app.broker.keys.queue("default")

    lapsed: list[str] = []

    def lease_lapses(_name: str) -> None:
        r = redis.Redis.from_url(app.redis_url)
        r.zadd(k.active, {job: 0})
        lapsed.extend(app.broker.run(app.broker.recover("default")))
        r.close()

    # after the park has committed: a lapse inside the park's transaction would let the next attempt read the
    # step still calling and take a settling run instead
    with at_point("before_dead_letter", lease_lapses):
        await run_worker_until(app, lambda: one_dead(app))
    assert lapsed == [job]

    rec = dead_record(app, job)
    assert rec["attempts"] == 2 and rec["reason"] == "in_doubt"
    assert "attempt 2 exceeds max_attempts=1" in rec["error"]
    assert f"fence {SUBJECT}/charge is in_doubt: the effect may have happened (owner job {job}" in rec["error"]
    [durable] = wait_until(lambda: app.failed_jobs.unreplayed([job]), timeout=10)
    assert durable["reason"] == "in_doubt" and f"{SUBJECT}/charge is in_doubt" in durable["error"]
    row = app.fence_store.get(SUBJECT, "charge")
    assert row is not None and row.state is FenceState.IN_DOUBT and row.owner_job_id == job
