"""Redis Cluster (3 masters) and Sentinel (1 master, 1 replica, 3 sentinels) as private redis-server processes:
URL forms, the broker and real worker processes on each, and a master SIGKILLed under a running worker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ringfence import App, ConfigError, RingfenceError
from ringfence.errors import NotReplicated
from ringfence.queries import info
from ringfence.redis import observe
from ringfence.redis.connection import parse_target
from support import ROOT, kill_at, wait_until
from topology import HAVE_REDIS, Cluster, SentinelSet, Servers, free_port

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


def stop(w: subprocess.Popen[bytes]) -> str:
    """SIGTERM the worker; all it printed, once it has exited."""
    w.send_signal(signal.SIGTERM)
    return w.communicate(timeout=30)[0].decode(errors="replace")


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
        out = stop(w)
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
PAD = "x" * 500_000  # the replication stream outgrows the socket buffers of a stopped replica: it falls behind


def _padded(ctx: object, n: int, pad: str) -> None:
    pass


class Producer(threading.Thread):
    """Enqueues delayed 500 KB jobs (they run after the failover, so a lost one never ran) until stopped; keeps
    the ids Redis acknowledged and counts the enqueues refused."""

    def __init__(self, app: App, durable: bool) -> None:
        super().__init__(daemon=True)
        self.task = app.task(name="padded")(_padded).with_options(delay_s=3.0, durable=durable)
        self.acked: list[str] = []
        self.refused: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.acked.append(self.task.enqueue(n=n, pad=PAD))
            except (redis.RedisError, RingfenceError, OSError) as exc:
                self.refused[type(exc).__name__] += 1
                time.sleep(0.05)
            time.sleep(0.01)


def _run_times(rdb: redis.Redis, ns: str) -> dict[str, float]:
    return {parts[0]: float(parts[2]) for parts in (r.decode().split() for r in rdb.lrange(f"{ns}:test:runs", 0, -1))}


@pytest.mark.parametrize("durable", [False, True], ids=["async-replication", "durable"])
def test_sentinel_failover_under_load(tmp_path: Path, redis_url: str, durable: bool) -> None:
    """The replica falls behind (SIGSTOP, 1 s) while a producer enqueues, then the master is SIGKILLed and the
    replica promoted. The worker never exits and resumes on the new master; every job the new master has runs.
    Without the durability option the enqueues the old master acknowledged alone are lost (counted); with
    ``durable=True`` every acknowledged enqueue runs (the others were refused with NotReplicated)."""
    s = SentinelSet(tmp_path)
    ns = f"t{uuid.uuid4().hex[:8]}"
    rdb = redis.Redis.from_url(redis_url)
    w = worker(s.url, ns, redis_url, "--queues", "default", "--concurrency", "10")
    app = App(s.url, ns, environment="test", replica_timeout_s=0.5)
    probe = app.task(name="noop")(_noop)
    producer = Producer(app, durable)
    try:
        first = probe.enqueue(n=0)
        wait_until(lambda: first in runs(rdb, ns), timeout=30)
        producer.start()
        time.sleep(1.0)
        os.kill(s.procs[s.replica].pid, signal.SIGSTOP)
        time.sleep(2.0)
        killed = time.time()
        s.kill(s.master)
        os.kill(s.procs[s.replica].pid, signal.SIGCONT)
        after = _probe_until_it_runs(probe, rdb, ns)
        resumed = _run_times(rdb, ns)[after] - killed
        time.sleep(1.0)
        producer.stop.set()
        producer.join(10)
        acked = set(producer.acked)
        wait_until(lambda: not (acked - runs(rdb, ns)) or not app.broker.queued_ids(acked - runs(rdb, ns)),
                   timeout=30)
        lost = acked - runs(rdb, ns)
        assert w.poll() is None, "the worker exited during the failover"
        print(f"\nsentinel failover ({'durable' if durable else 'async replication'}): processing resumed "
              f"{resumed:.1f}s after the master's SIGKILL; {len(acked)} enqueues acknowledged, {len(lost)} of them "
              f"lost; refused: {dict(producer.refused)}")
    finally:
        producer.stop.set()
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        s.stop()
    assert w.returncode == 0, out
    if durable:
        assert not lost and producer.refused["NotReplicated"] > 0
    else:
        assert lost and len(lost) < len(acked)  # the ones only the old master had; the rest ran


def _probe_until_it_runs(probe: Any, rdb: redis.Redis, ns: str) -> str:
    """Enqueue a job (retrying through the failover) and wait for a worker to run it; its id."""
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        try:
            job = probe.enqueue(n=-1)
        except (RingfenceError, OSError):  # CannotConnect, NotReplicated while the replica is promoted
            time.sleep(0.1)
            continue
        wait_until(lambda j=job: j in runs(rdb, ns), timeout=30)
        return str(job)
    raise AssertionError("no enqueue succeeded within 40 s of the failover")


def test_durable_enqueue_on_a_cluster_waits_on_the_node_that_took_it(cluster: Cluster) -> None:
    """WAIT goes to the primary owning the queue (the fixture's masters have no replica): the enqueue is
    refused as not replicated, one line, and the job is queued on that primary all the same."""
    app = App(cluster.url, f"t{uuid.uuid4().hex[:8]}", environment="test", replica_timeout_s=0.1)
    noop = app.task(name="noop")(_noop)
    with pytest.raises(NotReplicated, match="0 of 1 replica"):
        noop.with_options(queue="qd", durable=True, job_id="j1").enqueue(n=1)
    assert app.broker.queued_ids(["j1"]) == {"j1"}
    assert noop.with_options(queue="qd").enqueue(n=2)  # min_replicas 0: no WAIT


def test_a_worker_waits_for_a_redis_still_loading_its_data(tmp_path: Path, redis_url: str) -> None:
    """A restarted Redis answers PING but refuses commands (LOADING) while it reads its data: a worker started
    then waits (no exit 3) and runs the queued job once Redis is ready."""
    servers = Servers(tmp_path)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    ns = f"t{uuid.uuid4().hex[:8]}"
    servers.start(port, "--dbfilename", "dump.rdb", "--enable-debug-command", "yes")
    r = redis.Redis(port=port)
    r.execute_command("DEBUG", "POPULATE", "40000")  # a private server: filler keys to load
    App(url, ns, environment="test").task(name="noop")(_noop).enqueue(n=1)
    r.save()
    servers.kill(port)
    servers.procs[port] = subprocess.Popen(  # a pause per key loaded: up to 40 s of LOADING, ended below
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(servers.home(port)), "--dbfilename",
         "dump.rdb", "--save", "", "--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024"],
        stdout=subprocess.DEVNULL)
    wait_until(lambda: _loading(port), timeout=30, interval=0.01)
    rdb = redis.Redis.from_url(redis_url)
    w = worker(url, ns, redis_url, "--queues", "default")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(ln.decode(errors="replace") for ln in w.stdout or ()),
                              daemon=True)
    reader.start()
    try:
        # However slowly the worker starts (a loaded machine), Redis is still loading when it first connects;
        # once it was refused, the loading ends at once (CONFIG SET is served while loading).
        wait_until(lambda: any("is unreachable (BusyLoadingError" in ln for ln in lines) or w.poll() is not None,
                   timeout=60)
        assert w.poll() is None, "".join(lines)
        assert _loading(port)
        redis.Redis(port=port).config_set("key-load-delay", 0)
        wait_until(lambda: runs(rdb, ns) or w.poll() is not None, timeout=60)
        assert w.poll() is None, "".join(lines)
    finally:
        w.send_signal(signal.SIGTERM)
        w.wait(30)
        reader.join(10)
        rdb.delete(f"{ns}:test:runs")
        servers.stop()
    out = "".join(lines)
    assert w.returncode == 0, out
    assert "is unreachable (BusyLoadingError" in out and "answers again" in out


def _loading(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port).info("persistence")["loading"])
    except redis.BusyLoadingError:
        return True
    except (redis.ConnectionError, redis.TimeoutError):
        return False


async def test_broker_transitions_and_wake_ups(url: str) -> None:
    """Every job transition, the registry, breakers and limits on each topology; an idle worker's wait ends on
    an enqueue (sharded pub/sub on the cluster) well before its timeout."""
    from ringfence.redis.broker import Broker
    from ringfence.redis.waker import Waker

    ns = f"t{uuid.uuid4().hex[:8]}"
    b = Broker(url, ns)
    spec = b'{"t":"noop","a":{"n":1},"e":1}'
    try:
        assert b.run(b.enqueue("q", [("j1", spec, 0), ("j2", spec, 0)])) == [True, True]
        now = b.clock()
        got = await b.arun(b.fetch("q", 2, now + 5000, "tok"))
        assert [g[0] for g in got] == ["j1", "j2"]
        assert await b.arun(b.extend("q", [("j1", "tok", now + 9000)])) == []
        assert await b.arun(b.ack("q", [("j1", "tok")])) == []
        assert await b.arun(b.retry("q", "j2", "tok", now - 1, {"error": "x"}))
        assert await b.arun(b.promote("q")) == 1
        [(_, _, attempt)] = await b.arun(b.fetch("q", 1, b.clock() + 5000, "t2"))
        assert attempt == 2 and await b.arun(b.dead("q", "j2", "t2", {"error": "y"}, {"reason": "failed"}))
        assert b.dead_ids("q") == ["j2"] and b.run(b.replay("q", ["j2"])) == ["j2"]
        assert b.queue_counts("q")["pending"] == 1
        deadline = b.clock() + 5000
        [(lost, _, _)] = await b.arun(b.fetch("q", 1, deadline, "lost"))  # its reply lost: given back
        assert await b.arun(b.hand_back_fetch("q", [("lost", deadline)])) == [lost]
        assert b.queue_counts("q")["pending"] == 1
        await b.heartbeat_server("s1", {"id": "s1", "queues": {"q": 1}}, 5)
        assert [s["id"] for s in b.servers()] == ["s1"] and b.queues() == ["q"]
        await b.unregister_server("s1")
        assert b.servers() == []
        assert b.run(b.breaker_allow("dep", 10, 1000))[0]
        assert b.run(b.acquire_slot("task", "t", 1, "j9", b.clock() + 5000))
        waker = Waker(b, "w1", ["q2"])
        await waker.start()
        # An empty fetch marks the worker idle in its queue (fetch.lua), as a worker going to sleep does.
        assert await b.arun(b.fetch_marking("q2", 1, b.clock() + 5000, "t3", "w1", b.clock() + 10_000)) == ([], True)
        await waker.wait(0.2)  # reads the subscription's confirmation

        async def woken() -> float:
            while not await waker.wait(8):
                pass
            return time.monotonic()

        waiting = asyncio.ensure_future(woken())
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await b.arun(b.enqueue("q2", [("j3", spec, 0)]))
        assert await asyncio.wait_for(waiting, 8) - started < 3
        await waker.close()
    finally:
        await b.aclose()
        b.close()


def test_a_master_turned_replica_is_waited_out_not_a_crash(tmp_path: Path, redis_url: str) -> None:
    """A worker pointed at one address whose Redis becomes a replica (writes answer READONLY, as after a
    failover without Sentinel-aware clients) keeps running, and runs jobs again once that Redis is a master."""
    servers = Servers(tmp_path)
    a, b = free_port(), free_port()
    servers.start(a)
    servers.start(b)
    url = f"redis://127.0.0.1:{a}/0"
    ns = f"t{uuid.uuid4().hex[:8]}"
    app = App(url, ns, environment="test")
    noop = app.task(name="noop")(_noop)
    rdb = redis.Redis.from_url(redis_url)
    w = worker(url, ns, redis_url, "--queues", "default")
    try:
        first = noop.enqueue(n=1)
        wait_until(lambda: first in runs(rdb, ns), timeout=30)
        admin = redis.Redis(port=a)
        admin.replicaof("127.0.0.1", b)
        wait_until(lambda: admin.info("replication")["master_link_status"] == "up", timeout=20)
        time.sleep(2.0)  # the worker's loops meet READONLY
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
        admin.replicaof("NO", "ONE")
        second = noop.enqueue(n=2)
        wait_until(lambda: second in runs(rdb, ns) or w.poll() is not None, timeout=30)
        assert w.poll() is None, w.communicate()[0].decode(errors="replace")
    finally:
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        servers.stop()
    assert w.returncode == 0, out
    assert "ReadOnlyError" in out and "Traceback" not in out


async def test_results_on_a_cluster(cluster: Cluster) -> None:
    """store_result on a Redis Cluster: the worker stores the record (one key per job, its own slot) and a
    waiter blocked on it before the job ran wakes with the value; a failure wakes it with JobFailed."""
    from ringfence import JobFailed, RetryPolicy
    from support import FAST
    from test_worker import run_until

    app = App(cluster.url, f"t{uuid.uuid4().hex[:8]}", environment="test", worker=FAST)

    @app.task(name="double", store_result=True)
    async def double(ctx: Any, n: int) -> int:
        return 2 * n

    @app.task(name="fails", store_result=True, retry=RetryPolicy(max_attempts=1))
    def fails(ctx: Any) -> None:
        raise ValueError("no")

    try:
        job, bad = double.enqueue(n=21), fails.enqueue()
        waiting = asyncio.create_task(app.aresult(job, timeout=30))
        failing = asyncio.create_task(app.aresult(bad, timeout=30))
        await asyncio.sleep(0.2)
        await run_until(app, lambda: waiting.done() and failing.done(), timeout=30)
        assert waiting.result() == 42 and app.result(job, timeout=0) == 42
        with pytest.raises(JobFailed, match="max_attempts"):
            failing.result()
    finally:
        await app.broker.aclose()
        app.close()


def test_the_outbox_relay_on_a_cluster(cluster: Cluster, tmp_path: Path) -> None:
    """relay.lua's keys (the queue's, its sent records) share one slot; the lease key is a namespace key; a
    re-send after a crash between send and delete is refused on the cluster too."""
    import sqlalchemy as sa

    from ringfence import faults
    from ringfence.outbox import create_outbox
    from ringfence.outbox.relay import Relay

    engine = sa.create_engine(f"sqlite:///{tmp_path}/app.db")
    create_outbox(engine)
    app = App(cluster.url, f"t{uuid.uuid4().hex[:8]}", environment="test", fence_url=str(engine.url))

    @app.task(name="a", queue="qa")
    def a(ctx: Any, n: int) -> None: ...

    @app.task(name="b", queue="qb")
    def b(ctx: Any, n: int) -> None: ...

    with engine.begin() as conn:
        ids = [(a if n % 2 else b).enqueue_in(conn, n=n) for n in range(6)]

    with kill_at("relay_after_send"), pytest.raises(faults.SimulatedKill):
        Relay(app, engine=engine).step()
    again = Relay(app, engine=engine)
    assert again.run(once=True) == 6 and again.counts.refused == 6
    queued = {q: app.broker.sync.lrange(app.broker.keys.queue(q).pending, 0, -1) for q in ("qa", "qb")}
    assert sorted(x.decode() for xs in queued.values() for x in xs) == sorted(ids)
    app.broker.close()


def test_a_rerun_after_an_ack_lost_in_a_failover_is_recorded(tmp_path: Path, redis_url: str) -> None:
    """A delayed job reaches the replica (durable enqueue); the replica then stops (SIGSTOP) and falls behind
    (16 MB of filler) while the job runs and is acked on the master alone; the master is SIGKILLed and the
    replica promoted, without the fetch and the ack: the job runs again. The worker checks the acks it sent
    before the failover on the new master: the queue's stats count the lost ack (ack_lost) and the worker names
    the job."""
    s = SentinelSet(tmp_path)
    ns = f"t{uuid.uuid4().hex[:8]}"
    rdb = redis.Redis.from_url(redis_url)
    w = worker(s.url, ns, redis_url, "--queues", "default")
    app = App(s.url, ns, environment="test", replica_timeout_s=2.0)
    noop = app.task(name="noop")(_noop)
    try:
        first = noop.enqueue(n=0)
        wait_until(lambda: first in runs(rdb, ns), timeout=30)
        job = noop.with_options(delay_s=2.0, durable=True).enqueue(n=1)  # the replica has it
        os.kill(s.procs[s.replica].pid, signal.SIGSTOP)
        master = redis.Redis(port=s.master)
        for i in range(16):  # the replication stream outgrows the stopped replica's socket buffers
            master.set(f"filler:{i}", PAD * 2)
        assert job not in runs(rdb, ns), "the job ran before the replica fell behind"
        wait_until(lambda: job in runs(rdb, ns), timeout=20)
        stats = app.broker.keys.queue("default").stats
        wait_until(lambda: redis.Redis(port=s.master).hget(stats, "processed") == b"2", timeout=10)  # acked
        s.kill(s.master)
        os.kill(s.procs[s.replica].pid, signal.SIGCONT)
        wait_until(lambda: _runs_of(rdb, ns, job) == 2 or w.poll() is not None, timeout=40)
        assert w.poll() is None, "the worker exited during the failover"
        wait_until(lambda: redis.Redis(port=s.replica).hget(stats, "ack_lost") == b"1", timeout=10)
    finally:
        os.kill(s.procs[s.replica].pid, signal.SIGCONT)
        out = stop(w)
        rdb.delete(f"{ns}:test:runs")
        s.stop()
    assert w.returncode == 0, out
    assert f"their ack was lost): they run again, recorded in their history (ack_lost): {job}" in out, out


def _runs_of(rdb: redis.Redis, ns: str, job: str) -> int:
    return sum(r.decode().split()[0] == job for r in rdb.lrange(f"{ns}:test:runs", 0, -1))
