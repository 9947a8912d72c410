"""A partitioned queue on a private 3-master Redis Cluster, real worker processes: its partitions sit one per
master, the commands each master serves during a drain are within 15 % of each other, and a master failing over
mid-drain loses no job and repeats no fenced effect."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.redis.keys import partition_name
from support import ROOT, database_url, kill_groups, wait_until
from topology import HAVE_REDIS, Cluster

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]

PARTS = 3


def _spread(ctx: object, n: int) -> None:
    pass


def _fenced(ctx: object, n: int) -> None:
    pass


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    kill_groups(procs)


def _worker(procs: list[subprocess.Popen[bytes]], url: str, ns: str, record_url: str, fence_url: str = "") -> None:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "TEST_RECORD_URL": record_url,
           "TEST_PARTITIONS": str(PARTS), "FENCE_URL": fence_url,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "ringfence.cli", "worker", "--app", "partitionapp:app", "--queues", "hot",
         "--concurrency", "10"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True))


def _node(app: App, key: str) -> str:
    return str(app.broker.sync.get_node_from_key(key).name)  # type: ignore[attr-defined]


def _commands(ports: list[int]) -> dict[int, int]:
    """Commands each node has served (INFO commandstats), this read's own INFO left out."""
    out = {}
    for port in ports:
        stats = redis.Redis(port=port).info("commandstats")
        out[port] = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    return out


def test_a_drain_spreads_the_commands_evenly_over_the_masters(tmp_path: Path, redis_url: str,
                                                               started: list[subprocess.Popen[bytes]]) -> None:
    cluster = Cluster(tmp_path)
    try:
        ns = f"part{uuid.uuid4().hex[:6]}"
        app = App(cluster.url, ns)
        app.queue("hot", partitions=PARTS)
        app.task(name="spread", queue="hot")(_spread)
        homes = {_node(app, app.broker.keys.queue(partition_name("hot", i, PARTS)).pending) for i in range(PARTS)}
        assert len(homes) == PARTS  # one partition per master
        jobs = 3000
        record = redis.Redis.from_url(redis_url)
        for _ in range(2):
            _worker(started, cluster.url, ns, redis_url)
        wait_until(lambda: app.broker.sync.zcard(app.broker.keys.servers) == 2, timeout=30)
        # The idle workers' own rate (heartbeats and registry, on the namespace keys' master) is not the drain's.
        time.sleep(0.5)
        idle0, t0 = _commands(cluster.ports), time.monotonic()
        time.sleep(2.0)
        before, t1 = _commands(cluster.ports), time.monotonic()
        app.enqueue_many("spread", [{"n": n} for n in range(jobs)])
        wait_until(lambda: record.llen(f"{ns}:test:runs") >= jobs, timeout=90, interval=0.02)
        after, t2 = _commands(cluster.ports), time.monotonic()
        idle_rate = {p: (before[p] - idle0[p]) / (t1 - t0) for p in cluster.ports}
        served = {p: after[p] - before[p] - round(idle_rate[p] * (t2 - t1)) for p in cluster.ports}
        spread = (max(served.values()) - min(served.values())) / max(served.values())
        # the queue's own list is fetched only when due (worker/partitions.py): its master serves no fetch per round
        assert spread <= 0.15, f"commands per master during the drain: {served} ({spread:.0%} apart)"
        assert record.llen(f"{ns}:test:runs") == jobs
        record.delete(f"{ns}:test:runs")
    finally:
        cluster.stop()


def test_a_master_failing_over_mid_drain_loses_no_job_and_repeats_no_effect(
        tmp_path: Path, redis_url: str, started: list[subprocess.Popen[bytes]]) -> None:
    """3 masters with a replica each, jobs enqueued durably (a replica confirms). One master (not the one of the
    namespace keys) is SIGKILLed a third into the drain; its replica takes over. Every job's fenced effect happens
    exactly once; the jobs the failover interrupted ran again."""
    fence_url = database_url("postgresql", tmp_path)
    cluster = Cluster(tmp_path, replicas=1)
    try:
        ns = f"partf{uuid.uuid4().hex[:6]}"
        app = App(cluster.url, ns, fence_url=fence_url)
        app.fence_store.create_all()
        app.queue("hot", partitions=PARTS)
        app.task(name="fenced", queue="hot")(_fenced)
        jobs = 450
        app.enqueue_many("fenced", [{"n": n} for n in range(jobs)], durable=True)
        home = _node(app, app.broker.keys.queues)
        victim = next(n for n in (_node(app, app.broker.keys.queue(partition_name("hot", i, PARTS)).pending)
                                  for i in range(PARTS)) if n != home)
        record = redis.Redis.from_url(redis_url)
        for _ in range(2):
            _worker(started, cluster.url, ns, redis_url, fence_url)
        wait_until(lambda: record.llen(f"{ns}:test:effects") >= jobs // 3, timeout=60, interval=0.02)
        cluster.kill(int(victim.rsplit(":", 1)[1]))
        wait_until(lambda: record.llen(f"{ns}:test:effects") >= jobs, timeout=90, interval=0.2)
        time.sleep(3.0)  # a lease (2 s) more: a job whose ack was lost runs again, its effect must not
        effects = Counter(int(n) for n in record.lrange(f"{ns}:test:effects", 0, -1))
        assert set(effects) == set(range(jobs)), f"lost: {sorted(set(range(jobs)) - set(effects))[:20]}"
        twice = {n: c for n, c in effects.items() if c > 1}
        assert not twice, f"effects repeated: {twice}"
        runs = [r.decode().split() for r in record.lrange(f"{ns}:test:runs", 0, -1)]
        assert {r[2] for r in runs} == {partition_name("hot", i, PARTS) for i in range(PARTS)}
        record.delete(f"{ns}:test:effects", f"{ns}:test:runs")
    finally:
        cluster.stop()
