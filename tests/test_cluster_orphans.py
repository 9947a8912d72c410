"""A dead Redis Cluster master must not orphan jobs of the healthy masters' queues: a job a healthy master leased to
a worker (fetched, or pushed in a wake message) starts now, as attempt 1, not once its lease ran out."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ringfence import App, RingfenceError
from support import ROOT, kill_groups
from topology import HAVE_REDIS, Cluster, queue_per_master

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]

LEASE_S = 6.0  # tests/clusterpaceapp.py's: an orphaned job would start that much after its lease began


def _stamp(ctx: object, n: int) -> None:
    pass


@pytest.fixture
def started(redis_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    kill_groups(procs)


def _worker(procs: list[subprocess.Popen[bytes]], url: str, ns: str, record_url: str, queues: list[str]) -> None:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "TEST_RECORD_URL": record_url,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "ringfence.cli", "worker", "--app", "clusterpaceapp:app", "--queues", ",".join(queues),
         "--concurrency", "20"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True))


def _starts(rdb: redis.Redis, ns: str) -> list[tuple[str, str, int, float]]:
    out = []
    for row in rdb.lrange(f"{ns}:test:runs", 0, -1):
        job_id, queue, attempt, at = row.decode().split()
        out.append((job_id, queue, int(attempt), float(at)))
    return out


def test_no_job_of_a_healthy_master_waits_for_its_lease(tmp_path: Path, redis_url: str,
                                                        started: list[subprocess.Popen[bytes]]) -> None:
    """One master SIGKILLed (no replica, node timeout 60 s: it stays dead) while two workers serve a queue on each
    master; jobs flow on the two healthy masters' queues (120/s for 5 s). Each starts once, as attempt 1, within
    LEASE_S - 1 of its enqueue: none is leased to a worker that never runs it until its lease ends."""
    cluster = Cluster(tmp_path, node_timeout_ms=60_000)
    try:
        ns = f"orph{uuid.uuid4().hex[:6]}"
        app = App(cluster.url, ns)
        task = app.task(name="stamp")(_stamp)
        by_master = queue_per_master(app.broker)
        home = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
        victim = sorted(m for m in by_master if m != home)[0]
        healthy = [q for m, q in sorted(by_master.items()) if m != victim]
        for q in healthy:  # registered (a namespace key) before the kill
            task.with_options(queue=q).enqueue(n=-1)
        for _ in range(2):
            _worker(started, cluster.url, ns, redis_url, [by_master[victim], *healthy])
        deadline = time.monotonic() + 60
        while len(app.broker.servers()) < 2:
            assert time.monotonic() < deadline, "the workers did not register"
            time.sleep(0.2)
        time.sleep(1.0)  # idle, waiting for wake-ups
        cluster.kill(int(victim.rsplit(":", 1)[1]))
        acked: dict[str, float] = {}
        begin, n = time.monotonic(), 0
        while time.monotonic() - begin < 5.0:
            with contextlib.suppress(RingfenceError):
                acked[task.with_options(queue=healthy[n % 2]).enqueue(n=n)] = time.time()
            n += 1
            time.sleep(max(0.0, begin + n / 120 - time.monotonic()))
        rdb = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + LEASE_S + 10
        while time.monotonic() < deadline and not set(acked) <= {r[0] for r in _starts(rdb, ns)}:
            time.sleep(0.2)
        runs = [r for r in _starts(rdb, ns) if r[0] in acked]
        late = {job_id: (attempt, round(at - acked[job_id], 2)) for job_id, _, attempt, at in runs
                if attempt > 1 or at - acked[job_id] > LEASE_S - 1}
        assert len(acked) > 400
        assert late == {}, f"{len(late)} of {len(acked)} healthy jobs orphaned (attempt, s after enqueue): {late}"
        assert sorted(r[0] for r in runs) == sorted(acked), "each healthy job runs once"
        app.close()
    finally:
        cluster.stop()
