"""Redis Cluster under faults, on private redis-server processes: a slot resharded under a producer and under a
worker, an ACL user without and with the cluster commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.exceptions import NoPermissionError

from ringfence import App, RingfenceError
from ringfence.errors import NotReplicated
from support import ROOT, wait_until
from test_topology import _queues_on_every_node, cli, runs, stop, worker
from topology import (
    HAVE_REDIS,
    Cluster,
    close_migration,
    move_keys,
    move_slot,
    open_migration,
    owner_of,
    queue_per_master,
)

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


def _noop(ctx: object, n: int) -> None:
    pass


def test_durable_enqueues_follow_a_resharded_slot(cluster: Cluster, tmp_path: Path) -> None:
    """A producer making only durable enqueues: its queue's slot moves to another master (keys and ownership);
    the next enqueue follows the MOVED answer to the new owner, takes the write there and waits on its replicas
    (none here: NotReplicated, the job queued), instead of MOVED on every call."""
    app = App(cluster.url, f"t{uuid.uuid4().hex[:8]}", environment="test", replica_timeout_s=0.1)
    durable = app.task(name="noop")(_noop).with_options(queue="qd", durable=True)
    with pytest.raises(NotReplicated, match="0 of 1 replica"):
        durable.with_options(job_id="j1").enqueue(n=1)
    pending = app.broker.keys.queue("qd").pending
    slot = int(app.broker.sync.keyslot(pending))  # type: ignore[attr-defined]
    to = next(p for p in cluster.ports if p != owner_of(cluster.ports, slot))
    move_slot(cluster.ports, slot, to)
    for n in (2, 3):
        with pytest.raises(NotReplicated, match="0 of 1 replica"):
            durable.with_options(job_id=f"j{n}").enqueue(n=n)
    assert owner_of(cluster.ports, slot) == to
    assert sorted(redis.Redis(port=to).lrange(pending, 0, -1)) == [b"j1", b"j2", b"j3"]
    app.close()


def _documented_acls() -> tuple[str, str]:
    """docs/deployment.md's ACL lines, single Redis and cluster, as rules for a namespace ``{ns}``."""
    lines = [ln for ln in (ROOT / "docs" / "deployment.md").read_text().splitlines()
             if ln.startswith("ACL SETUSER ringfence ")]
    rules = [ln.removeprefix("ACL SETUSER ringfence ").replace(">PASSWORD", ">s3cret").replace("ns:*", "{ns}:*")
             for ln in lines]
    single = [r for r in rules if "cluster|" not in r]
    cluster = [r for r in rules if "+cluster|slots" in r]
    assert single and cluster, "docs/deployment.md shows no single-Redis or no cluster ACL line"
    return single[0], cluster[0]


ACL, CLUSTER_ACL = _documented_acls()


def _acl_user(cluster: Cluster, ns: str, rules: str) -> str:
    """The ACL user ``ringfence`` set on every node (ACLs are per node); the cluster URL logging in as it."""
    for p in cluster.ports:
        redis.Redis(port=p).execute_command("ACL", "SETUSER", "ringfence", "reset", *rules.format(ns=ns).split())
    return "redis+cluster://ringfence:s3cret@" + ",".join(f"127.0.0.1:{p}" for p in cluster.ports) + "/"


def test_an_acl_user_without_cluster_slots_is_one_line(cluster: Cluster, redis_url: str) -> None:
    """The single-Redis ACL line on a cluster: the client cannot read the slot map; the worker and ``info`` exit 3
    with one line naming the command to grant, no traceback."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    url = _acl_user(cluster, ns, ACL)
    for args in (["info"], ["worker", "--queues", "default"]):
        done = cli(url, ns, redis_url, *args)
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
        assert "refused a command" in done.stderr and "'cluster|slots'" in done.stderr, done.stderr


def test_the_documented_cluster_acl_runs_a_worker_and_the_cli(cluster: Cluster, redis_url: str) -> None:
    """With ``+cluster|slots +cluster|shards`` added: a worker runs jobs of queues on three primaries, ``info``,
    ``servers`` and ``dead list`` answer without NOPERM; keys outside the namespace stay refused."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    url = _acl_user(cluster, ns, CLUSTER_ACL)
    app = App(url, ns, environment="test")
    with pytest.raises(NoPermissionError):
        app.broker.sync.get("other:key")
    noop = app.task(name="noop")(_noop)
    queues = _queues_on_every_node(app)
    ids = {noop.with_options(queue=queues[i % 3]).enqueue(n=i) for i in range(12)}
    rdb = redis.Redis.from_url(redis_url)
    w = worker(url, ns, redis_url, "--queues", ",".join(queues))
    try:
        wait_until(lambda: runs(rdb, ns) >= ids or w.poll() is not None, timeout=30)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
        for args in (["info"], ["servers"], ["dead", "list"]):
            done = cli(url, ns, redis_url, *args)
            assert done.returncode in (0, 1), (args, done.stdout, done.stderr)
            assert "NOPERM" not in done.stdout + done.stderr and "Traceback" not in done.stderr, done.stderr
    finally:
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        app.close()
    assert w.returncode == 0, out
    assert "NOPERM" not in out and "Traceback" not in out, out


def test_a_slot_migrating_under_a_worker_is_waited_out(cluster: Cluster, redis_url: str) -> None:
    """A queue's slot held half migrated (some keys moved, MIGRATING/IMPORTING: every script of the queue answers
    TRYAGAIN or ASK) for 3 s, then moved: the worker logs no traceback and runs the jobs after it; an enqueue
    meanwhile raises a ringfence error naming the reshard, not redis-py's."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    app = App(cluster.url, ns, environment="test")
    noop = app.task(name="noop")(_noop).with_options(queue="qm")
    rdb = redis.Redis.from_url(redis_url)
    w = worker(cluster.url, ns, redis_url, "--queues", "qm")
    try:
        first = {noop.enqueue(n=i) for i in range(5)}
        wait_until(lambda: runs(rdb, ns) >= first or w.poll() is not None, timeout=30)
        slot = int(app.broker.sync.keyslot(app.broker.keys.queue("qm").pending))  # type: ignore[attr-defined]
        to = next(p for p in cluster.ports if p != owner_of(cluster.ports, slot))
        src = open_migration(cluster.ports, slot, to)
        assert move_keys(src, to, slot, limit=1) == 1  # the queue's keys now split over two nodes
        with pytest.raises(RingfenceError, match="moving this slot") as caught:
            noop.enqueue(n=-1)
        assert not isinstance(caught.value, redis.RedisError)
        time.sleep(3.0)  # the fetch loop, heartbeat, promoter and recoverer meet the migration
        while move_keys(src, to, slot):
            pass
        close_migration(cluster.ports, slot, to)
        after = {noop.enqueue(n=i) for i in range(5, 10)}
        wait_until(lambda: runs(rdb, ns) >= after or w.poll() is not None, timeout=30)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
    finally:
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        app.close()
    assert w.returncode == 0, out
    assert " ERROR ringfence" not in out and "refused: their lease had moved" not in out, out
    # redis-py logs its own failed re-subscription of a moved sharded channel (the wake subscription) with a
    # traceback; every other traceback would be ringfence's
    assert out.count("Traceback") == out.count("ERROR redis.asyncio.cluster: shard subscription reconciliation"), out


def test_durable_enqueues_resume_after_a_cluster_failover(tmp_path: Path) -> None:
    """3 masters with a replica each; the master of a durable producer's queue is SIGKILLed. Enqueues fail with
    a ringfence error while the cluster fails over, then reach the promoted replica (no replica of its own
    left: NotReplicated, the job queued there) without the dead node coming back."""
    c = Cluster(tmp_path, replicas=1)
    try:
        app = App(c.url, f"t{uuid.uuid4().hex[:8]}", environment="test", replica_timeout_s=0.5)
        durable = app.task(name="noop")(_noop).with_options(queue="qf", durable=True)
        assert durable.with_options(job_id="j0").enqueue(n=0) == "j0"  # its replica confirmed it
        slot = int(app.broker.sync.keyslot(app.broker.keys.queue("qf").pending))  # type: ignore[attr-defined]
        master = owner_of(c.ports, slot)
        c.kill(master)
        deadline, refused, n = time.monotonic() + 30, Counter[str](), 0
        while time.monotonic() < deadline:
            n += 1
            try:
                durable.with_options(job_id=f"j{n}").enqueue(n=n)
            except NotReplicated:
                break
            except RingfenceError as exc:
                refused[type(exc).__name__] += 1
                time.sleep(0.2)
        else:
            raise AssertionError(f"no durable enqueue reached the promoted replica within 30 s: {dict(refused)}")
        live = list(c.procs)
        assert owner_of(live, slot) != master and refused
        assert app.broker.queued_ids(["j0", f"j{n}"]) == {"j0", f"j{n}"}
        app.close()
    finally:
        c.stop()


def test_a_worker_starting_while_its_queues_master_is_down_waits_for_the_failover(tmp_path: Path,
                                                                                   redis_url: str) -> None:
    """The master holding a worker's only queue (its wake channels too) is SIGKILLed and not failed over yet
    (node timeout 60 s); the namespace keys' master answers. A worker started then keeps running (no exit 3:
    "no Redis Cluster node took the wake-up subscriptions"); once the replica takes the slots over, the queue's
    job runs."""
    c = Cluster(tmp_path, replicas=1, node_timeout_ms=60_000, full_coverage=False)
    ns = f"t{uuid.uuid4().hex[:8]}"
    app = App(c.url, ns, environment="test")
    rdb = redis.Redis.from_url(redis_url)
    w = None
    try:
        noop = app.task(name="noop")(_noop)
        home = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
        # Not the master redis-py's cluster client initializes its command table on (the first in the slot map):
        # with that one down, the client cannot start at all (docs/deployment.md).
        default = app.broker.sync.get_default_node().name  # type: ignore[attr-defined]
        victim, queue = next((m, q) for m, q in sorted(queue_per_master(app.broker).items())
                             if m not in (home, default))
        job = noop.with_options(queue=queue).enqueue(n=1)
        master = int(victim.rsplit(":", 1)[1])
        replica = c.masters()[master]
        assert replica is not None
        c.kill(master)
        w = worker(c.url, ns, redis_url, "--queues", queue)
        wait_until(lambda: app.broker.servers() or w.poll() is not None, timeout=60)  # its loops started
        time.sleep(8.0)  # the wake subscriptions tried and refused (the exit 3 came within 2 s)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
        assert job not in runs(rdb, ns)
        redis.Redis(port=replica).execute_command("CLUSTER", "FAILOVER", "TAKEOVER")  # type: ignore[no-untyped-call]
        wait_until(lambda: job in runs(rdb, ns) or w.poll() is not None, timeout=45)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
    finally:
        out = stop(w) if w is not None else ""
        rdb.delete(f"{ns}:test:runs")
        app.close()
        c.stop()
    assert w is not None and w.returncode == 0, out
    assert "wake-up subscriptions" not in out, out


def _slow(ctx: object, s: float) -> None:
    pass


def test_a_worker_stopped_while_its_queues_master_is_down_exits_0(tmp_path: Path) -> None:
    """SIGTERM while a job runs and its queue's master is SIGKILLed (not failed over: node timeout 60 s): the job
    ends during the shutdown and its ack cannot reach Redis. The worker exits 0, saying the job runs again once
    its lease lapses; no exit 3 "cannot connect to Redis" for a stop asked for."""
    c = Cluster(tmp_path, replicas=1, node_timeout_ms=60_000, full_coverage=False)
    ns = f"t{uuid.uuid4().hex[:8]}"
    app = App(c.url, ns, environment="test")
    w = None
    try:
        home = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
        # Not the master redis-py's cluster client initializes its command table on (the first in the slot map):
        # with that one down, the client cannot start at all (docs/deployment.md).
        default = app.broker.sync.get_default_node().name  # type: ignore[attr-defined]
        victim, queue = next((m, q) for m, q in sorted(queue_per_master(app.broker).items())
                             if m not in (home, default))
        master = int(victim.rsplit(":", 1)[1])
        env = {**os.environ, "RINGFENCE_REDIS_URL": c.url, "RINGFENCE_NAMESPACE": ns,
               "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        w = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "failoverapp:app",
                              "--queues", queue], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        job = app.task(name="slow")(_slow).with_options(queue=queue).enqueue(s=2.0)
        lease = app.broker.keys.queue(queue).lease
        wait_until(lambda: redis.Redis(port=master).hexists(lease, job) or w.poll() is not None, timeout=60)
        c.kill(master)
        w.send_signal(signal.SIGTERM)
        out = w.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        if w is not None and w.poll() is None:
            w.kill()
        app.close()
        c.stop()
    assert w.returncode == 0, out
    assert "cannot connect" not in out and f"they run again once their leases lapse: {job}" in out, out
