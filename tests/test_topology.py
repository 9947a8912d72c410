"""Redis Cluster (3 masters) and Sentinel (1 master, 1 replica, 3 sentinels) as private redis-server processes:
URL forms, the broker and real worker processes on each, and a master SIGKILLed under a running worker."""

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
from ringfence.inspect import info
from ringfence.redis import observe
from ringfence.redis.connection import parse_target
from support import ROOT, wait_until
from topology import HAVE_REDIS, Cluster, SentinelSet

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture(scope="session")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    s = SentinelSet(tmp_path_factory.mktemp("sentinel"))
    yield s
    s.stop()


@pytest.fixture(params=["single", "cluster", "sentinel"])
def url(request: pytest.FixtureRequest, redis_url: str) -> str:
    if request.param == "single":
        return redis_url
    return str(request.getfixturevalue(request.param).url)


def worker(url: str, ns: str, record_url: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "TEST_RECORD_URL": record_url,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "topologyapp:app", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def cli(url: str, ns: str, record_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": url, "RINGFENCE_NAMESPACE": ns, "TEST_RECORD_URL": record_url,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "ringfence.cli", *args, "--app", "topologyapp:app"], env=env,
                          capture_output=True, text=True, timeout=60)


def runs(rdb: redis.Redis, ns: str) -> set[str]:
    return {r.decode().split()[0] for r in rdb.lrange(f"{ns}:test:runs", 0, -1)}


# -- URL forms ---------------------------------------------------------------------------------------
def test_cluster_and_sentinel_urls_parse_with_auth_and_tls() -> None:
    c = parse_target("rediss+cluster://user:pw@h1:7000,h2:7001/?ssl_ca_certs=/ca.pem&socket_timeout=2")
    assert c.kind == "cluster" and c.nodes == (("h1", 7000), ("h2", 7001))
    assert dict(c.options) == {"username": "user", "password": "pw", "ssl": True, "ssl_ca_certs": "/ca.pem",
                               "socket_timeout": 2.0}
    s = parse_target("redis+sentinel://:pw@s1,s2:26380/mymaster/2?sentinel_password=spw")
    assert (s.kind, s.service, s.nodes) == ("sentinel", "mymaster", (("s1", 26379), ("s2", 26380)))
    assert dict(s.options) == {"password": "pw", "db": 2} and dict(s.sentinel_options) == {"password": "spw"}
    assert parse_target("redis://h:1/0").kind == "single"


@pytest.mark.parametrize(("bad", "says"), [
    ("memcached://h:1", "unknown scheme 'memcached://'"),
    ("redis+sentinel://h1:1,h2:2/", "name the Sentinel service"),
    ("redis+cluster://h1:x/", "bad port"),
    ("redis+cluster://h1:1/3", "database 0 only"),
])
def test_a_bad_url_is_one_config_error_line(bad: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _ = App(bad, "ns").broker
    assert says in str(caught.value) and "\n" not in str(caught.value)


# -- the broker and a worker on each topology -------------------------------------------------------
def test_worker_runs_jobs_and_the_cli_reads(url: str, redis_url: str) -> None:
    """Jobs on three queues (on a cluster: owned by three different nodes) run once each; info, servers and
    doctor answer; SIGTERM exits 0 and unregisters."""
    ns = f"t{uuid.uuid4().hex[:8]}"
    app = App(url, ns, environment="test")
    noop = app.task(name="noop")(_noop)
    queues = _queues_on_every_node(app) if "+cluster" in url else ["qa", "qb", "qc"]
    ids = {noop.with_options(queue=queues[i % 3]).enqueue(n=i) for i in range(60)}
    rdb = redis.Redis.from_url(redis_url)
    w = worker(url, ns, redis_url, "--queues", ",".join(queues), "--concurrency", "5")
    try:
        wait_until(lambda: runs(rdb, ns) >= ids or w.poll() is not None, timeout=30)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
        assert sum(q["pending"] for q in info(app.broker)) == 0
        wait_until(lambda: len(app.broker.servers()) == 1, timeout=10)
        for args in (["info"], ["servers"], ["doctor"]):
            done = cli(url, ns, redis_url, *args)
            assert done.returncode in (0, 1) and "Traceback" not in done.stderr, (args, done.stderr)
        lone = App(url, ns + "l").broker  # the worker's alert loop holds the lease of ``ns``
        assert observe.acquire_lease(lone, "a", 5) and not observe.acquire_lease(lone, "b", 5)
        observe.release_lease(lone, "a")
        assert observe.acquire_lease(lone, "b", 5)
        observe.release_lease(lone, "b")
        assert observe.open_incident(lone, "k", {"since": 1}) and observe.close_incident(lone, "k")
        assert observe.close_incident(lone, "k") is None
        used, _, _ = observe.memory(app.broker)
        assert used > 0 and observe.config_value(app.broker, "maxmemory-policy") is not None
    finally:
        w.send_signal(signal.SIGTERM)
        out = w.communicate(timeout=30)[0].decode(errors="replace")
        rdb.delete(f"{ns}:test:runs")
    assert w.returncode == 0, out
    assert "Traceback" not in out and app.broker.servers() == []
    app.close()


def _noop(ctx: object, n: int) -> None:
    pass


def _queues_on_every_node(app: App) -> list[str]:
    """Three queue names whose keys land on ``nodes`` different primaries (3 on a 3-master cluster)."""
    sync = app.broker.sync
    chosen: dict[str, str] = {}
    for i in range(1000):
        q = f"q{i}"
        node = sync.get_node_from_key(app.broker.keys.queue(q).pending).name  # type: ignore[attr-defined]
        chosen.setdefault(node, q)
        if len(chosen) == 3:
            break
    assert len(chosen) == 3
    return sorted(chosen.values())


def test_namespace_keys_share_one_slot_on_a_cluster(cluster: Cluster) -> None:
    app = App(cluster.url, "nsx")
    k = app.broker.keys
    assert {k.queues, k.servers, k.server_info, k.meta, k.dependencies} == {
        f"nsx:{{nsx}}:{name}" for name in ("queues", "servers", "server_info", "meta", "dependencies")}
    assert App("redis://127.0.0.1:6379/0", "nsx").broker.keys.servers == "nsx:servers"  # single: unchanged


# -- failover ----------------------------------------------------------------------------------------
def test_sentinel_failover_worker_resumes(tmp_path: Path, redis_url: str) -> None:
    """The master is SIGKILLed while a worker runs jobs and a producer enqueues: the worker does not exit and
    resumes on the promoted replica; every job that reached the new master runs; enqueues lost in the
    failover (asynchronous replication) are counted."""
    s = SentinelSet(tmp_path)
    ns = f"t{uuid.uuid4().hex[:8]}"
    rdb = redis.Redis.from_url(redis_url)
    w = worker(s.url, ns, redis_url, "--queues", "default", "--concurrency", "5")
    try:
        app = App(s.url, ns, environment="test")
        noop = app.task(name="noop")(_noop)
        acked: list[str] = []
        for i in range(50):
            acked.append(noop.enqueue(n=i))
        wait_until(lambda: runs(rdb, ns) >= set(acked), timeout=30)
        killed = time.monotonic()
        s.kill(s.master)
        failed = 0
        resumed_at = None
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                job = noop.enqueue(n=-1)
                acked.append(job)
            except (redis.RedisError, OSError):
                failed += 1
                time.sleep(0.2)
                continue
            if job in runs(rdb, ns):
                resumed_at = time.monotonic()
                break
            time.sleep(0.1)
        assert resumed_at is not None, "processing did not resume after the failover"
        assert w.poll() is None, "the worker exited during the failover"
        present = set(acked) - runs(rdb, ns)
        wait_until(lambda: not (set(acked) - runs(rdb, ns)) or app.broker.queued_ids(present) == set(),
                   timeout=30)
        lost = set(acked) - runs(rdb, ns)
        print(f"sentinel failover: processing resumed {resumed_at - killed:.1f}s after the master's SIGKILL; "
              f"{len(lost)} acknowledged enqueue(s) lost, {failed} refused during the failover")
    finally:
        w.send_signal(signal.SIGTERM)
        out = w.communicate(timeout=30)[0].decode(errors="replace")
        rdb.delete(f"{ns}:test:runs")
        s.stop()
    assert w.returncode == 0, out
