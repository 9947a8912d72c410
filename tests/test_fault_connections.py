"""Lost and hung Redis connections.

- Redis stopped for seconds under a running worker: the worker logs one line when Redis stops answering and
  one when it answers again (not a traceback per attempt), and resumes.
- A half-open connection (a proxy black-holes every open socket; new ones pass): the heartbeat's call fails
  within the socket timeout instead of hanging, is retried on a fresh connection, and the lease holds, so a
  healthy worker on a direct connection never takes the job."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis

from redisfaults import FaultWorker, HalfOpenProxy, runs
from ringfence import App
from ringfence.errors import BrokerError
from ringfence.redis.connection import ConnectionSettings
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.worker.worker import Worker
from support import wait_until

NS = "conn"


def slow_task(app: App):  # type: ignore[no-untyped-def]
    def slow(ctx: object, seconds: float) -> None: ...

    return app.task(name="faultapp.slow_a", queue="a")(slow)


def logged_at(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_redis_outage_is_logged_once_and_the_worker_resumes(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedRedis.temporary(port=port)
    app = App(server.url, NS, environment="test")
    task = slow_task(app)
    worker = FaultWorker(server.url, NS, tmp_path, "a", name="w", alerts=True)
    restarted = None
    try:
        first = task.enqueue(seconds=0.1)
        wait_until(lambda: runs(tmp_path, "finished")[first] == 1, 20)
        before = len(worker.lines())
        server.stop()
        time.sleep(6.0)  # 12 heartbeats, 60 promoter ticks, 12 recoverer ticks and the fetch loop all fail
        restarted = EmbeddedRedis(server.directory, port=port).start()
        second = wait_until(lambda: _enqueue(task), 15)
        wait_until(lambda: runs(tmp_path, "finished")[second] == 1, 20)
        time.sleep(1.0)
        outage = worker.lines()[before:]
    finally:
        worker.stop()
        app.close()
        for s in (restarted, server):
            if s is not None:
                s.stop()
    assert not any("Traceback" in line for line in outage), "\n".join(outage)
    assert len([x for x in outage if "is unreachable" in x]) == 1, "\n".join(outage)
    assert len([x for x in outage if "answers again" in x]) == 1, "\n".join(outage)
    assert len(outage) <= 4, "\n".join(outage)


def _enqueue(task) -> str | None:  # type: ignore[no-untyped-def]
    try:
        return str(task.enqueue(seconds=0.1))
    except BrokerError:  # CannotConnect while Redis is away
        return None


def test_a_half_open_connection_does_not_stall_the_heartbeat(tmp_path: Path) -> None:
    server = EmbeddedRedis.temporary(port=free_port())
    proxy = HalfOpenProxy(server.port)
    app = App(server.url, NS, environment="test")
    task = slow_task(app)
    # lease 3 s, heartbeat 0.5 s, socket timeout 1 s: a hung beat costs 1.5 s of the lease, 1.5 s to spare
    lease = {"FAULT_LEASE_S": "3"}
    behind_proxy = FaultWorker(proxy.url, NS, tmp_path, "a", name="proxied", env=lease)
    direct = None
    try:
        job = task.enqueue(seconds=7.0)  # two leases after the freeze
        wait_until(lambda: runs(tmp_path)[job] == 1, 20)
        direct = FaultWorker(server.url, NS, tmp_path, "a", name="direct", env=lease)
        wait_until(lambda: len(app.broker.servers()) == 2, 20)
        frozen_at = time.time()
        assert proxy.freeze() > 0
        wait_until(lambda: runs(tmp_path, "finished")[job] == 1, 20)
        k = app.broker.keys.queue("a")
        wait_until(lambda: not redis.Redis.from_url(server.url).hlen(k.jobs), 10)
        stats = redis.Redis.from_url(server.url).hgetall(k.stats)
        lines = behind_proxy.lines()
    finally:
        for w in (behind_proxy, direct):
            if w is not None:
                w.stop()
        proxy.close()
        app.close()
        server.stop()
    assert runs(tmp_path) == {job: 1}
    assert [p.name.split(".")[2] for p in tmp_path.glob(f"{job}.*.started")] == [str(behind_proxy.proc.pid)]
    assert b"orphaned" not in stats and stats[b"processed"] == b"1"
    noticed = [logged_at(x) for x in lines if "is unreachable" in x and re.search(r"Timeout", x)]
    # socket_timeout_s is 1 s with this lease (ConnectionSettings.for_lease), a beat every 0.5 s
    assert noticed and noticed[0] - frozen_at < 1.0 + 0.5 + 1.0, lines
    assert not any("Traceback" in x for x in lines), "\n".join(lines)


def test_a_worker_started_before_redis_waits_for_it(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    worker = FaultWorker(url, NS, tmp_path, "a", name="early")
    server = None
    try:
        wait_until(lambda: any("is unreachable" in x for x in worker.lines()), 20)
        time.sleep(1.0)  # the worker retries with backoff meanwhile
        assert worker.proc.poll() is None
        server = EmbeddedRedis.temporary(port=port)
        app = App(server.url, NS, environment="test")
        job = slow_task(app).enqueue(seconds=0.1)
        wait_until(lambda: runs(tmp_path, "finished")[job] == 1, 20)
        app.close()
    finally:
        worker.stop()
        if server is not None:
            server.stop()
    lines = worker.lines()
    assert len([x for x in lines if "is unreachable" in x]) == 1 and not any("Traceback" in x for x in lines)


async def test_a_worker_gives_up_on_a_redis_that_never_answers_with_one_line() -> None:
    app = App(f"redis://127.0.0.1:{free_port()}/0", NS, environment="test",
              redis=ConnectionSettings(first_connect_s=1.0))
    t0 = time.monotonic()
    with pytest.raises(BrokerError) as failed:
        await Worker(app, alerts=False).run()
    assert time.monotonic() - t0 < 5
    assert "did not answer within 1s" in str(failed.value) and "\n" not in str(failed.value)


def test_a_hung_redis_is_noticed_within_the_socket_timeout_and_leases_hold_after_it(tmp_path: Path) -> None:
    """Redis SIGSTOPped for 4 s (connections stay open and unanswered) under a 10 s job with an 8 s lease."""
    server = EmbeddedRedis.temporary(port=free_port())
    assert server.process is not None
    app = App(server.url, NS, environment="test")
    task = slow_task(app)
    worker = FaultWorker(server.url, NS, tmp_path, "a", name="w",
                         env={"FAULT_LEASE_S": "8", "FAULT_HEARTBEAT_S": "1"})  # socket timeout: 3 s
    try:
        job = task.enqueue(seconds=10.0)
        wait_until(lambda: runs(tmp_path)[job] == 1, 20)
        before = len(worker.lines())
        stopped_at = time.time()
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            time.sleep(4.0)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        wait_until(lambda: runs(tmp_path, "finished")[job] == 1, 20)
        k = app.broker.keys.queue("a")
        wait_until(lambda: not app.broker.sync.hlen(k.jobs), 10)
        stats = app.broker.sync.hgetall(k.stats)
        lines = worker.lines()[before:]
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        worker.stop()
        app.close()
        server.stop()
    assert runs(tmp_path) == {job: 1}
    assert b"orphaned" not in stats and stats[b"processed"] == b"1"
    noticed = [logged_at(x) for x in lines if "is unreachable" in x and "Timeout" in x]
    assert noticed and noticed[0] - stopped_at < 1.0 + 3.0 + 1.0, lines  # a heartbeat + the socket timeout
    assert len([x for x in lines if "answers again" in x]) == 1 and len(lines) <= 4, "\n".join(lines)
