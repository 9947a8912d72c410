"""On a Redis Cluster a job pushed to an idle worker (enqueue_ready.lua: leased and sent in the SPUBLISHed wake
message) whose node subscription dropped before the worker read it is handed back once that node's subscription
is re-established (redis/waker.py ``recover``, redis/shards.py), its attempt not counted: it does not wait out its
lease. Private 3-master clusters; the queue's master kills its pub/sub connections in the same MULTI that pushes
(then, in the failover test, is SIGKILLed once its replica has the lease, before the worker reconnects)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from ringfence import App, WorkerSettings
from ringfence.models import JobSpec, new_job_id
from ringfence.redis.scripts import script
from ringfence.worker.worker import Worker
from test_wake_push import _running
from test_worker import until
from topology import HAVE_REDIS, Cluster, queue_per_master

pytestmark = [pytest.mark.topology, pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]

# Leases of 20 s (the default): a job left to lease recovery would wait that long
SETTINGS = WorkerSettings(lease_s=20.0, heartbeat_s=5.0, recover_interval_s=0.5, promote_interval_s=0.1,
                          shutdown_timeout_s=3.0, server_ttl_s=10.0)


def _push_and_kill(app: App, queue: str, task: str, replicated: bool = False) -> str:
    """In one MULTI on the queue's master: a job enqueued through enqueue_ready.lua (leased to the idle worker
    and SPUBLISHed to it), then every pub/sub connection of that node killed, the message unread."""
    node = app.broker.sync.get_node_from_key(app.broker.keys.queue(queue).pending)  # type: ignore[attr-defined]
    job_id = new_job_id()
    call = app.broker.enqueue(queue, [(job_id, JobSpec.plain(task, {}, app.broker.clock(), 1), 0)], inline=True)
    assert call.name == "enqueue_ready"
    r = redis.Redis(port=node.port)
    with r.pipeline(transaction=True) as p:
        p.eval(script("enqueue_ready").for_server(True, sharded=True)[0], len(call.keys), *call.keys, *call.args)
        p.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        _, killed = p.execute()
    assert killed >= 1, killed
    if replicated:  # the replica has the lease (the reader tries to reconnect RETRY_S later)
        assert r.execute_command("WAIT", 1, 1000) == 1
    return job_id


async def test_a_pushed_job_lost_with_a_node_subscription_runs_at_once_as_attempt_1(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, node_timeout_ms=60_000)
    app = App(cluster.url, f"w{uuid.uuid4().hex[:6]}", environment="test", worker=SETTINGS)
    try:
        queues = sorted(queue_per_master(app.broker).values())  # the worker listens on every master
        runs: list[tuple[str, int]] = []

        @app.task(name="t")
        async def t(ctx: Any) -> None:
            runs.append((ctx.id, ctx.attempt))

        r = app.broker.sync
        worker = Worker(app, queues=[(q, 1) for q in queues])
        waker = worker.processor.fetcher.waker
        async with _running(worker) as runner:
            idle = [app.broker.keys.queue(q).idle for q in queues]
            await until(lambda: all(r.zscore(k, worker.server_id) for k in idle), runner, timeout=20)
            await asyncio.sleep(0.1)  # past the marks: asleep on the wake channels
            queue = queues[1]
            k = app.broker.keys.queue(queue)
            job = _push_and_kill(app, queue, "t")
            t0 = time.monotonic()
            assert r.hget(k.lease, job) is not None  # leased to the worker whose connection died
            await until(lambda: runs, runner, timeout=30)
            started_s = time.monotonic() - t0
            await until(lambda: not r.hexists(k.jobs, job), runner)
            others = [t.with_options(queue=q).enqueue() for q in queues]  # every node's pushes still reach it
            await until(lambda: len(runs) == 1 + len(others), runner, timeout=10)
            await asyncio.sleep(0.5)  # no second run
        assert runs[0] == (job, 1), runs  # handed back, its attempt not counted: not left to the lease's 20 s
        assert started_s < 2, started_s
        assert sorted(runs[1:]) == sorted((j, 1) for j in others)
        assert waker.recovered == 1
        assert r.hget(k.stats, "handed_back") == b"1" and r.hget(k.stats, "orphaned") is None
        print(f"started {started_s:.3f}s after the push")
    finally:
        app.close()
        cluster.stop()


async def test_a_pushed_job_lost_in_a_failover_runs_as_attempt_1_on_the_promoted_replica(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, replicas=1)
    app = App(cluster.url, f"w{uuid.uuid4().hex[:6]}", environment="test", worker=SETTINGS)
    try:
        by_master = queue_per_master(app.broker)
        home = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
        victim = sorted(m for m in by_master if m != home)[0]  # the namespace keys' master stays up
        queue = by_master[victim]
        queues = sorted(by_master.values())
        runs: list[tuple[str, int]] = []

        @app.task(name="t")
        async def t(ctx: Any) -> None:
            runs.append((ctx.id, ctx.attempt))

        r = app.broker.sync
        k = app.broker.keys.queue(queue)
        worker = Worker(app, queues=[(q, 1) for q in queues])
        async with _running(worker) as runner:
            idle = [app.broker.keys.queue(q).idle for q in queues]
            await until(lambda: all(r.zscore(i, worker.server_id) for i in idle), runner, timeout=20)
            await asyncio.sleep(0.1)
            port = int(victim.rsplit(":", 1)[1])
            replica = redis.Redis(port=cluster.masters()[port])  # type: ignore[arg-type]
            job = _push_and_kill(app, queue, "t", replicated=True)
            cluster.kill(port)
            promoted: list[float] = []

            def started() -> bool:  # also notes when the replica took over
                if not promoted and replica.info("replication")["role"] == "master":
                    promoted.append(time.monotonic())
                return bool(runs)

            await until(started, runner, timeout=40)
            started_s = time.monotonic() - promoted[0]
            await asyncio.sleep(0.5)  # no second run
        assert runs == [(job, 1)], runs  # handed back on the promoted replica: not left to the lease's 20 s
        assert started_s < 3, started_s
        assert worker.processor.fetcher.waker.recovered == 1
        assert r.hget(k.stats, "handed_back") == b"1" and r.hget(k.stats, "orphaned") is None
        print(f"started {started_s:.3f}s after the replica took over")
    finally:
        app.close()
        cluster.stop()
