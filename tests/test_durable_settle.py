"""``durable_settle=True``: a task's ack, retry and dead-letter wait for a replica (WAIT) before its worker moves
on, on private redis-server processes: a replica that lags (SIGSTOP) holds the worker until it catches up, one
that stays behind past ``replica_timeout_s`` has the settle logged and counted (``settle_unconfirmed``), and a
master SIGKILLed after the worker moved on keeps a confirmed ack (the job ran once) and, for an unconfirmed one,
records the rerun (``ack_lost``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ringfence import App, ConfigError
from support import ROOT, wait_until
from topology import HAVE_REDIS, SentinelSet, Servers, free_port

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]

PAD = "x" * 1_000_000  # the replication stream outgrows the socket buffers of a stopped replica: it falls behind


def worker(url: str, ns: str, record_url: str, timeout_s: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "TEST_RECORD_URL": record_url,
           "TEST_REPLICA_TIMEOUT_S": str(timeout_s),
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "durable_settle_app:app",
                             "--queues", "default", "--concurrency", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def stop(w: subprocess.Popen[bytes]) -> str:
    if w.poll() is None:
        w.send_signal(signal.SIGTERM)
    return w.communicate(timeout=30)[0].decode(errors="replace")


def runs(rdb: redis.Redis, ns: str) -> list[tuple[str, int]]:
    """(job id, attempt) of every run, in order."""
    return [(p[0], int(p[3])) for p in (r.decode().split() for r in rdb.lrange(f"{ns}:test:runs", 0, -1))]


def ran(rdb: redis.Redis, ns: str, job: str) -> int:
    return sum(j == job for j, _ in runs(rdb, ns))


def _handler(ctx: object, n: int) -> None:
    pass


def producer(url: str, ns: str) -> tuple[App, dict[str, object]]:
    app = App(url, ns, environment="test", replica_timeout_s=5.0)
    return app, {"paid": app.task(name="paid")(_handler), "plain": app.task(name="plain")(_handler)}


def fall_behind(master: int, replica: subprocess.Popen[bytes]) -> None:
    os.kill(replica.pid, signal.SIGSTOP)
    r = redis.Redis(port=master)
    for i in range(16):
        r.set(f"filler:{i}", PAD)


def test_durable_settle_is_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"^durable_settle='yes' must be True or False$"):
        App(namespace="x", environment="test").task(name="t", durable_settle="yes")(_handler)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Servers, int, int]]:
    s = Servers(tmp_path)
    master, replica = free_port(), free_port()
    s.start(master)
    s.start(replica, "--replicaof", "127.0.0.1", str(master))
    wait_until(lambda: redis.Redis(port=replica).info("replication")["master_link_status"] == "up", timeout=20)
    yield s, master, replica
    os.kill(s.procs[replica].pid, signal.SIGCONT)
    s.stop()


def test_a_lagging_replica_holds_the_worker_then_an_unconfirmed_settle_is_counted(
        pair: tuple[Servers, int, int], redis_url: str) -> None:
    """Replica stopped: the worker waits on ``paid``'s ack (the next job does not start) until the replica is back
    (1.5 s later, within the 5 s timeout: confirmed, nothing counted). Replica stopped past a 5 s timeout: the
    ack, the retry and the dead-letter move of ``paid`` jobs are each logged and counted; ``plain``'s ack is not
    waited for."""
    s, master, replica = pair
    ns, rdb = f"t{uuid.uuid4().hex[:8]}", redis.Redis.from_url(redis_url)
    url = f"redis://127.0.0.1:{master}"
    app, tasks = producer(url, ns)
    stats = app.broker.keys.queue("default").stats
    w = worker(url, ns, redis_url, timeout_s=5.0)
    try:
        warm = tasks["plain"].enqueue(n=0)  # type: ignore[attr-defined]
        wait_until(lambda: ran(rdb, ns, warm) == 1, timeout=30)
        os.kill(s.procs[replica].pid, signal.SIGSTOP)
        first = tasks["paid"].enqueue(n=1)  # type: ignore[attr-defined]
        after = tasks["plain"].enqueue(n=2)  # type: ignore[attr-defined]
        wait_until(lambda: ran(rdb, ns, first) == 1, timeout=10)
        time.sleep(1.5)
        assert ran(rdb, ns, after) == 0, "the worker moved on before a replica confirmed the ack"
        os.kill(s.procs[replica].pid, signal.SIGCONT)
        wait_until(lambda: ran(rdb, ns, after) == 1, timeout=10)
        # the handler marks its run before its ack: wait for the (batched, plain) ack to reach the replica
        wait_until(lambda: redis.Redis(port=replica).hget(stats, "processed") == b"3", timeout=10)
        assert redis.Redis(port=master).hget(stats, "settle_unconfirmed") is None

        os.kill(s.procs[replica].pid, signal.SIGSTOP)
        failing = tasks["paid"].enqueue(n=-1)  # type: ignore[attr-defined]  # a retry, then an ack
        doomed = tasks["paid"].enqueue(n=-2)  # type: ignore[attr-defined]  # a dead-letter move
        plain = tasks["plain"].enqueue(n=3)  # type: ignore[attr-defined]
        wait_until(lambda: ran(rdb, ns, plain) == 1 and ran(rdb, ns, failing) == 2, timeout=40)
        assert [a for j, a in runs(rdb, ns) if j == failing] == [1, 2]
        wait_until(lambda: redis.Redis(port=master).hget(stats, "settle_unconfirmed") == b"3", timeout=15)
        assert redis.Redis(port=master).hget(stats, "processed") == b"5"
        assert redis.Redis(port=master).hexists(app.broker.keys.queue("default").dead_jobs, doomed)
    finally:
        os.kill(s.procs[replica].pid, signal.SIGCONT)
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        app.broker.close()
    assert w.returncode == 0, out
    assert f"job {failing}: its retry reached 0 of 1 replica(s) within 5000 ms" in out, out
    assert f"job {failing}: its ack reached 0 of 1 replica(s) within 5000 ms" in out, out
    assert f"job {doomed}: its dead-letter reached 0 of 1 replica(s) within 5000 ms" in out, out


@pytest.mark.parametrize("confirmed", [True, False], ids=["replica-back-in-time", "replica-behind-past-timeout"])
def test_a_failover_after_the_worker_moved_on(tmp_path: Path, redis_url: str, confirmed: bool) -> None:
    """The replica falls behind while ``paid`` runs (concurrency 1, ``plain`` queued behind it). Back within the
    timeout, it has the ack before ``plain`` runs: the master SIGKILLed after ``plain`` ran, ``paid`` ran once.
    Behind past the timeout, the ack is logged unconfirmed and ``plain`` runs; the master SIGKILLed then loses both
    acks: both run again, recorded (``ack_lost``) and named by the worker."""
    s = SentinelSet(tmp_path)
    ns, rdb = f"t{uuid.uuid4().hex[:8]}", redis.Redis.from_url(redis_url)
    app, tasks = producer(s.url, ns)
    stats = app.broker.keys.queue("default").stats
    w = worker(s.url, ns, redis_url, timeout_s=8.0 if confirmed else 2.0)
    replica = s.procs[s.replica]
    try:
        warm = tasks["plain"].enqueue(n=0)  # type: ignore[attr-defined]
        wait_until(lambda: ran(rdb, ns, warm) == 1, timeout=30)
        job = tasks["paid"].with_options(delay_s=2.0, durable=True).enqueue(n=1)  # type: ignore[attr-defined]
        after = tasks["plain"].with_options(delay_s=2.0, durable=True).enqueue(n=2)  # type: ignore[attr-defined]
        fall_behind(s.master, replica)
        wait_until(lambda: ran(rdb, ns, job) == 1, timeout=20)
        if confirmed:
            time.sleep(1.0)
            assert ran(rdb, ns, after) == 0, "the worker moved on before a replica confirmed the ack"
            os.kill(replica.pid, signal.SIGCONT)
        wait_until(lambda: ran(rdb, ns, after) == 1, timeout=20)
        s.kill(s.master)
        os.kill(replica.pid, signal.SIGCONT)
        last, deadline = None, time.monotonic() + 90  # a stalled host puts Sentinel in TILT for 30 s
        while last is None and time.monotonic() < deadline:  # the failover: the worker serves the promoted replica
            try:
                last = tasks["plain"].enqueue(n=3)  # type: ignore[attr-defined]
            except (redis.RedisError, OSError, Exception):
                time.sleep(0.5)
        assert last is not None
        wait_until(lambda: ran(rdb, ns, last) == 1 or w.poll() is not None, timeout=40)
        assert w.poll() is None, "the worker exited during the failover"
        new = redis.Redis(port=s.replica)
        if confirmed:
            assert ran(rdb, ns, job) == 1 and new.hget(stats, "ack_lost") is None
        else:
            wait_until(lambda: ran(rdb, ns, job) == 2 and ran(rdb, ns, after) == 2, timeout=20)
            assert new.hget(stats, "ack_lost") == b"2"  # paid's and plain's: the replica had neither
    finally:
        os.kill(replica.pid, signal.SIGCONT)
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        app.broker.close()
        s.stop()
    assert w.returncode == 0, out
    if not confirmed:
        assert f"job {job}: its ack reached 0 of 1 replica(s) within 2000 ms" in out, out
        [named] = [line.rsplit(": ", 1)[1].split() for line in out.splitlines() if "(ack_lost): " in line]
        assert sorted(named) == sorted([job, after]), out  # in any order
