"""A Redis Cluster with real worker processes: a wake-up reaches an idle worker at once; while one master is down
(SIGKILL, until its replica takes over) the queues of the other masters keep their pace and lose no job; the
doctor names the topology (a node down, a master without replica, slots not served) instead of failing whole."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ringfence import App, BrokerError, RingfenceError
from support import ROOT, kill_groups, wait_until
from topology import HAVE_REDIS, Cluster

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


def _stamp(ctx: object, n: int) -> None:
    pass


def _env(url: str, ns: str, record_url: str) -> dict[str, str]:
    return {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "TEST_RECORD_URL": record_url,
            "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture
def started(redis_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    kill_groups(procs)


def _worker(procs: list[subprocess.Popen[bytes]], url: str, ns: str, record_url: str, queues: list[str]) -> None:
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "ringfence.cli", "worker", "--app", "clusterpaceapp:app", "--queues", ",".join(queues),
         "--concurrency", "20"], env=_env(url, ns, record_url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True))


def _idle(app: App, workers: int) -> None:
    deadline = time.monotonic() + 60
    while len(app.broker.servers()) < workers:
        assert time.monotonic() < deadline, "the workers did not register"
        time.sleep(0.2)
    time.sleep(1.0)  # past their first fetch: idle, waiting for a wake-up


def _starts(rdb: redis.Redis, ns: str) -> list[tuple[str, str, int, float]]:
    out = []
    for row in rdb.lrange(f"{ns}:test:runs", 0, -1):
        job_id, queue, attempt, at = row.decode().split()
        out.append((job_id, queue, int(attempt), float(at)))
    return out


def _queue_per_master(app: App) -> dict[str, str]:
    """Master address -> one queue whose keys it owns."""
    found: dict[str, str] = {}
    for i in range(1000):
        node = app.broker.sync.get_node_from_key(app.broker.keys.queue(f"q{i}").pending).name  # type: ignore[attr-defined]
        found.setdefault(node, f"q{i}")
    return found


def _enqueue_when_served(bound: Any) -> str:
    deadline = time.monotonic() + 40
    while True:
        try:
            return str(bound.enqueue(n=-1))
        except RingfenceError:
            assert time.monotonic() < deadline, "the replica did not take over"
            time.sleep(0.5)


def test_an_idle_worker_starts_a_job_at_once(tmp_path: Path, redis_url: str,
                                             started: list[subprocess.Popen[bytes]]) -> None:
    """Jobs enqueued one at a time (an explicit job_id: a wake-up then a fetch; a plain enqueue: the job leased in
    the wake message) on queues of three masters start within milliseconds, not at the next poll of each node."""
    cluster = Cluster(tmp_path)
    try:
        ns = f"pick{uuid.uuid4().hex[:6]}"
        app = App(cluster.url, ns)
        task = app.task(name="stamp")(_stamp)
        queues = sorted(_queue_per_master(app).values())
        _worker(started, cluster.url, ns, redis_url, queues)
        _idle(app, 1)
        acked: dict[str, float] = {}
        for n in range(30):
            bound = task.with_options(queue=queues[n % 3], **({"job_id": f"j{n}"} if n % 2 else {}))
            acked[bound.enqueue(n=n)] = time.time()
            time.sleep(0.1)
        rdb = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 30
        while len(_starts(rdb, ns)) < 30 and time.monotonic() < deadline:
            time.sleep(0.1)
        lat = sorted((at - acked[job_id]) * 1000 for job_id, _, _, at in _starts(rdb, ns))
        assert len(lat) == 30
        assert lat[len(lat) // 2] < 100, f"median pick-up {lat[len(lat) // 2]:.0f} ms: {[round(x) for x in lat]}"
        app.close()
    finally:
        cluster.stop()


# The longest start of a healthy queue's job. With cluster-require-full-coverage yes (Redis's default) every node
# refuses every command (CLUSTERDOWN) from the moment the master is marked failed until its replica is promoted:
# 0.7-1.4 s measured, the producer blocked too; with it off the healthy masters keep answering (0.6 s at most
# measured on a loaded 2-core machine). Each bound leaves a loaded CI machine about half a second more.
LATE_S = {True: 2.0, False: 1.2}


@pytest.mark.parametrize("full_coverage", [True, False], ids=["full_coverage", "partial_coverage"])
def test_healthy_masters_keep_their_pace_while_one_fails_over(tmp_path: Path, redis_url: str,
                                                            started: list[subprocess.Popen[bytes]],
                                                            full_coverage: bool) -> None:
    """A master is SIGKILLed; until its replica takes over (node timeout 5 s), jobs enqueued every 0.1 s on the
    queues of the two other masters each start within LATE_S, once, as attempt 1; the dead master's queue is served
    again after the failover, and the healthy queues' jobs still start within LATE_S after it."""
    late_s = LATE_S[full_coverage]
    cluster = Cluster(tmp_path, replicas=1, node_timeout_ms=5000, full_coverage=full_coverage)
    try:
        ns = f"pace{uuid.uuid4().hex[:6]}"
        app = App(cluster.url, ns)
        task = app.task(name="stamp")(_stamp)
        by_master = _queue_per_master(app)
        # the master of the namespace keys (server registry, queue set) too: the hardest one to lose
        victim = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
        dead_q = by_master[victim]
        healthy = [q for m, q in sorted(by_master.items()) if m != victim]
        second = next(f"x{i}" for i in range(1000) if app.broker.sync.get_node_from_key(  # type: ignore[attr-defined]
            app.broker.keys.queue(f"x{i}").pending).name == victim)  # two queues on the dead master
        _worker(started, cluster.url, ns, redis_url, [dead_q, second, *healthy])  # the dead master's queues first
        for q in healthy:  # this producer registers its queues (a namespace key) before the kill
            task.with_options(queue=q).enqueue(n=0)
        _idle(app, 1)
        cluster.kill(int(victim.rsplit(":", 1)[1]))
        killed = time.monotonic()
        acked: dict[str, float] = {}
        n = 0
        while time.monotonic() - killed < 6.0:  # the failover window (node timeout 5 s)
            # CLUSTERDOWN while the cluster marks the master failed (full coverage): the next round enqueues again
            with contextlib.suppress(BrokerError):
                acked[task.with_options(queue=healthy[n % 2]).enqueue(n=n)] = time.time()
            n += 1
            time.sleep(0.1)
        dead_job = _enqueue_when_served(task.with_options(queue=dead_q))  # the failed-over master takes it
        rdb = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and dead_job not in {r[0] for r in _starts(rdb, ns)}:
            time.sleep(0.2)
        for n in range(10):  # after the failover (its channels moved to the new master) too
            acked[task.with_options(queue=healthy[n % 2]).enqueue(n=n)] = time.time()
            time.sleep(0.1)
        while time.monotonic() < deadline and not {*acked, dead_job} <= {r[0] for r in _starts(rdb, ns)}:
            time.sleep(0.2)
        time.sleep(7.0)  # a lease (6 s) more: an orphaned healthy job would run again as attempt 2
        runs = _starts(rdb, ns)
        healthy_runs = [r for r in runs if r[0] in acked]
        late = {job_id: round(at - acked[job_id], 2) for job_id, _, _, at in healthy_runs
                if at - acked[job_id] > late_s}
        assert late == {}, f"{len(late)} of {len(acked)} healthy jobs started more than {late_s} s late: {late}"
        assert sorted(r[0] for r in healthy_runs) == sorted(acked), "each healthy job runs once"
        assert {r[2] for r in healthy_runs} == {1}
        assert dead_job in {r[0] for r in runs}
        app.close()
    finally:
        cluster.stop()


def test_the_doctor_names_a_dead_node_and_answers_for_the_rest(tmp_path: Path, redis_url: str) -> None:
    """One master SIGKILLed and another master's replica too (node timeout 60 s: no failover meanwhile). The
    doctor exits 2 with its findings, not 3 "cannot connect": the dead master and the dead replica are named, the
    master left without a replica is named, the dead master's queue is named unreadable, and the queues of the
    masters that answer are still judged (a backlog no worker serves)."""
    cluster = Cluster(tmp_path, replicas=1, node_timeout_ms=60_000)
    try:
        ns = f"doc{uuid.uuid4().hex[:6]}"
        app = App(cluster.url, ns)
        task = app.task(name="stamp")(_stamp)
        by_master = _queue_per_master(app)
        for q in by_master.values():
            task.with_options(queue=q).enqueue(n=1)
        home = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
        victim, lonely = sorted(m for m in by_master if m != home)
        wait_until(lambda: None not in cluster.masters().values(), 30)  # every replica attached
        replicas = cluster.masters()
        lonely_replica = replicas[int(lonely.rsplit(":", 1)[1])]
        assert lonely_replica is not None
        cluster.kill(int(victim.rsplit(":", 1)[1]))
        cluster.kill(lonely_replica)
        app.close()
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "ringfence.cli", "doctor", "--app", "clusterpaceapp:app", "--json",
                               "--sample-s", "0.2"], env=_env(cluster.url, ns, redis_url), capture_output=True,
                              text=True, timeout=120)
        took = time.monotonic() - started
        assert done.returncode == 2, done.stdout + done.stderr
        found = json.loads(done.stdout)["findings"]
        topo = {f["subject"]: f for f in found if f["check"] == "topology"}
        assert topo[victim]["status"] == "failure" and "down" in topo[victim]["symptom"]
        assert topo[f"127.0.0.1:{lonely_replica}"]["status"] == "warning"
        assert topo[lonely]["status"] == "warning" and "no live replica" in topo[lonely]["symptom"]
        assert topo[by_master[victim]]["status"] == "failure" and "cannot be read" in topo[by_master[victim]]["symptom"]
        judged = {f["subject"] for f in found if f["check"] == "queue_unserved"}
        assert judged == {by_master[home], by_master[lonely]}
        assert took < 60, f"the doctor took {took:.0f}s"
    finally:
        cluster.stop()
