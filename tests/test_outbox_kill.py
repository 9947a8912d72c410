"""Real relay processes, SIGKILLed at each step (after reading a batch, after sending it before deleting its
rows, after the delete committed), on SQLite, PostgreSQL and MariaDB, with a real worker running every job as
soon as it arrives: each committed row runs exactly once, in id order per queue, and no rolled-back row ever
runs. Two relays at once send nothing twice, and one takes over when the other is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

import outbox_helpers
from outbox_helpers import rows
from ringfence import App
from support import ROOT, wait_until

db = outbox_helpers.db  # the fixture: SQLite, PostgreSQL and MariaDB


class Procs:
    def __init__(self, namespace: str, redis_url: str, fence_url: str) -> None:
        self.env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
                    "RINGFENCE_FENCE_URL": fence_url,
                    "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", *args, "--app", "outboxapp:app"],
                                env={**self.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def relay(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self.start("relay", "--batch", "5", "--lease-s", "1", "--interval", "0.05", *args, env=env)

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        return self.start("worker", "--queues", "q1,q2", "--concurrency", "1", "--no-alerts", *args)

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture
def procs(db: sa.Engine, namespace: str, redis_url: str, tmp_path: Path) -> Iterator[Procs]:
    p = Procs(namespace, redis_url, db.url.render_as_string(hide_password=False))
    yield p
    p.stop_all()


def _app(engine: sa.Engine, redis_url: str, namespace: str) -> App:
    app = App(redis_url, namespace, fence_url=engine.url.render_as_string(hide_password=False))

    @app.task(queue="q1", name="record")
    def record(ctx, n: int) -> None: ...

    @app.task(queue="q2", name="record2")
    def record2(ctx, n: int) -> None: ...

    return app


def _write(app: App, engine: sa.Engine, start: int, count: int, *, commit: bool) -> dict[str, int]:
    """Jobs n = start..start+count-1 alternating between q1 and q2, in one transaction: {job id: n}."""
    tasks = [app.registry.get("record"), app.registry.get("record2")]
    out = {}
    with engine.connect() as conn:
        conn.begin()
        for n in range(start, start + count):
            out[tasks[n % 2].enqueue_in(conn, n=n)] = n
        conn.commit() if commit else conn.rollback()
    return out


def _committed_and_rolled_back(app: App, engine: sa.Engine, batches: int = 4, first: int = 0
                               ) -> tuple[dict[str, int], set[str]]:
    committed: dict[str, int] = {}
    rolled_back: set[str] = set()
    for b in range(first, first + batches):
        committed |= _write(app, engine, b * 20, 7, commit=True)
        rolled_back |= set(_write(app, engine, b * 20 + 10, 3, commit=False))
    return committed, rolled_back


def _runs(rdb: redis.Redis, namespace: str) -> list[tuple[str, str, int]]:
    out = []
    for raw in rdb.lrange(f"{namespace}:test:runs", 0, -1):
        job_id, queue, n = raw.decode().split()
        out.append((job_id, queue, int(n)))
    return out


def _check_once_in_order(rdb: redis.Redis, namespace: str, committed: dict[str, int], rolled_back: set[str],
                         ordered: bool = True) -> None:
    wait_until(lambda: len(_runs(rdb, namespace)) >= len(committed), timeout=30)
    time.sleep(0.5)  # a second copy, if any, would run by now
    runs = _runs(rdb, namespace)
    counts = Counter(job_id for job_id, _, _ in runs)
    assert set(counts) == set(committed) and set(counts.values()) == {1}, counts
    assert not rolled_back & set(counts)
    for queue in ("q1", "q2") if ordered else ():  # one worker, one job at a time: runs follow each queue's order
        ns = [n for _, q, n in runs if q == queue]
        assert ns == sorted(ns), (queue, ns)


@pytest.mark.parametrize("point", ["relay_after_read", "relay_after_send", "relay_after_mark"])
def test_a_relay_sigkilled_at_each_step_delivers_every_committed_row_once(point, db, procs, rdb, redis_url,
                                                                          namespace) -> None:
    app = _app(db, redis_url, namespace)
    committed, rolled_back = _committed_and_rolled_back(app, db)
    procs.worker()
    killed = procs.relay("--once", env={"RINGFENCE_FAULTS": point})
    assert killed.wait(30) == -signal.SIGKILL, killed.stdout.read() if killed.stdout else b""  # type: ignore[union-attr]
    sent_first = 0 if point == "relay_after_read" else 5
    if sent_first:  # the first batch runs and its jobs are forgotten before the next relay starts
        wait_until(lambda: len(_runs(rdb, namespace)) == sent_first, timeout=30)
        wait_until(lambda: all(not rdb.hexists(app.broker.keys.queue(q).jobs, j)
                               for j, q, _ in _runs(rdb, namespace)), timeout=30)
    left = len(committed) - (sent_first if point == "relay_after_mark" else 0)
    assert len(rows(db, namespace)) == left
    second = procs.relay("--once")
    out = second.communicate(timeout=60)[0].decode()
    assert second.returncode == 0, out
    refused = 5 if point == "relay_after_send" else 0
    assert f"relayed {left} row(s) ({left - refused} sent, {refused} refused as sent before)" in out, out
    _check_once_in_order(rdb, namespace, committed, rolled_back)
    assert rows(db, namespace) == []


def test_two_relays_send_nothing_twice_and_one_takes_over_from_a_killed_one(db, procs, rdb, redis_url,
                                                                             namespace) -> None:
    app = _app(db, redis_url, namespace)
    procs.worker()
    first = procs.relay()
    committed, rolled_back = _committed_and_rolled_back(app, db, batches=2)
    wait_until(lambda: rdb.get(app.broker.keys.outbox_lease), timeout=20)
    second = procs.relay()
    more, more_rolled_back = _committed_and_rolled_back(app, db, batches=2, first=2)
    wait_until(lambda: len(_runs(rdb, namespace)) >= len(committed) + len(more), timeout=30)
    leader = first if rdb.get(app.broker.keys.outbox_lease).decode().split(":")[1] == str(first.pid) else second
    standby = second if leader is first else first
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(10)
    after, after_rolled_back = _committed_and_rolled_back(app, db, batches=2, first=4)
    wait_until(lambda: (rdb.get(app.broker.keys.outbox_lease) or b"").decode().split(":")[1:2] == [str(standby.pid)],
               timeout=20)
    _check_once_in_order(rdb, namespace, committed | more | after, rolled_back | more_rolled_back | after_rolled_back)
    standby.send_signal(signal.SIGTERM)
    assert standby.wait(20) == 0
    assert rdb.get(app.broker.keys.outbox_lease) is None  # released on the way out


def test_workers_relay_under_one_lease(db, procs, rdb, redis_url, namespace) -> None:
    """WorkerSettings(relay_outbox_s=...): two workers both run the relay loop; one holds the lease."""
    app = _app(db, redis_url, namespace)
    relaying = {"TEST_RELAY_S": "0.1"}
    workers = [procs.start("worker", "--queues", "q1,q2", "--concurrency", "1", "--no-alerts", env=relaying)
               for _ in range(2)]
    committed, rolled_back = _committed_and_rolled_back(app, db, batches=3)
    _check_once_in_order(rdb, namespace, committed, rolled_back, ordered=False)  # two workers run side by side
    holder = rdb.get(app.broker.keys.outbox_lease).decode()
    assert holder in {s["id"] for s in app.broker.servers()}
    for w in workers:
        w.send_signal(signal.SIGTERM)
    assert [w.wait(20) for w in workers] == [0, 0]
    assert rdb.get(app.broker.keys.outbox_lease) is None  # released at shutdown
