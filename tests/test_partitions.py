"""Partitioned queues on one Redis (app.queue(name, partitions=N)): enqueue spreads jobs over the partitions, one
partition per key; real worker processes drain every partition, none waiting behind a deep one; dead-letter,
replay, unique and debounce hold per job; ``info`` and ``dead`` name the queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from ringfence import App, ConfigError
from ringfence.redis.keys import partition_name
from support import ROOT, kill_groups, wait_until

PARTS = 4


def _noop(ctx: object, key: str, n: int, fail: bool = False) -> None:
    pass


def _spread(ctx: object, n: int) -> None:
    pass


@pytest.fixture
def hot(make_app: Callable[..., App]) -> App:
    app = make_app()
    app.queue("hot", partitions=PARTS)
    app.task(name="keyed", queue="hot", partition_key="k:{key}")(_noop)
    app.task(name="spread", queue="hot")(_spread)
    return app


@pytest.fixture
def workers(namespace: str, redis_url: str) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
               "TEST_PARTITIONS": str(PARTS),
               "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        p = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "partitionapp:app",
                              "--queues", "hot", *args], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        return p

    yield start
    kill_groups(procs)


def _pending(app: App) -> dict[str, int]:
    """Jobs waiting per partition: in its pending list or in its concurrency keys' lists."""
    return {p: app.broker.purgeable(p) for p in (partition_name("hot", i, PARTS) for i in range(PARTS))}


def _runs(rdb: redis.Redis, ns: str) -> list[list[str]]:
    return [r.decode().split() for r in rdb.lrange(f"{ns}:test:runs", 0, -1)]


@pytest.fixture
def cli(namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., str]:
    """``cli(*args)``: the ringfence command on tests/partitionapp.py, in this process; its stdout."""
    from click.testing import CliRunner

    from ringfence.cli import main

    monkeypatch.setenv("RINGFENCE_NAMESPACE", namespace)
    monkeypatch.setenv("RINGFENCE_REDIS_URL", redis_url)
    monkeypatch.setenv("TEST_PARTITIONS", str(PARTS))
    monkeypatch.delitem(sys.modules, "partitionapp", raising=False)

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, [*args, "--app", "partitionapp:app"])
        assert result.exit_code == 0, result.output
        return result.stdout

    return run


def test_jobs_without_a_key_spread_evenly_and_a_key_stays_in_one_partition(hot: App) -> None:
    hot.enqueue_many("spread", [{"n": n} for n in range(100)])
    for n in range(20):
        hot.enqueue("spread", n=n)
    assert set(_pending(hot).values()) == {30}, _pending(hot)  # in turn: exactly even
    before = _pending(hot)
    for n in range(30):
        hot.enqueue("keyed", key="a", n=n)
    grew = {p: c - before[p] for p, c in _pending(hot).items() if c != before[p]}
    assert list(grew.values()) == [30], grew
    assert hot.broker.queues() == sorted(_pending(hot))  # the partitions are the queues Redis knows


def test_a_bad_declaration_is_refused(make_app: Callable[..., App]) -> None:
    app = make_app()
    for bad in (0, -1, 1.5, "4", 100_000):
        with pytest.raises(ConfigError, match="partitions must be an int"):
            app.queue("hot", partitions=bad)  # type: ignore[arg-type]
    app.queue("hot", partitions=4)
    with pytest.raises(ConfigError, match="declared with partitions=4 and partitions=8"):
        app.queue("hot", partitions=8)
    with pytest.raises(ConfigError, match="queue 'h t'"):
        app.queue("h t", partitions=2)


def test_unique_and_debounce_keys_hold_across_partitions(hot: App) -> None:
    """A unique or debounce key routes to one partition, so it is held once for the whole queue."""
    unique = hot.resolve("spread").with_options(unique_for=60, unique_key="u:{n}")
    first = unique.enqueue(n=1)
    assert [unique.enqueue(n=1) for _ in range(8)] == [first] * 8
    debounced = hot.resolve("spread").with_options(debounce_s=60, debounce_key="d")
    one = debounced.enqueue(n=1)
    assert [debounced.enqueue(n=k) for k in range(2, 10)] == [one] * 8
    scheduled = {p: hot.broker.sync.zcard(hot.broker.keys.queue(p).scheduled) for p in _pending(hot)}
    assert sorted(scheduled.values()) == [0] * (PARTS - 1) + [1]  # the one debounced job
    assert sum(_pending(hot).values()) == 1  # the one unique job


def test_workers_drain_every_partition_and_a_deep_one_starves_none(
        hot: App, workers: Callable[..., subprocess.Popen[bytes]], rdb: redis.Redis, namespace: str) -> None:
    """One key holds 400 jobs in one partition, 40 other keys 3 jobs each over the partitions: with one worker
    of concurrency 1, the jobs of every small key in another partition start within the first quarter of the
    drain (the ones in the deep key's partition wait behind it: a partition is FIFO), and each key's jobs start
    in enqueue order."""
    hot.enqueue_many("keyed", [{"key": "big", "n": n} for n in range(400)])
    small = [f"s{k}" for k in range(40)]
    for n in range(3):
        hot.enqueue_many("keyed", [{"key": k, "n": n} for k in small])
    assert all(_pending(hot).values())
    workers("--concurrency", "1")
    wait_until(lambda: len(_runs(rdb, namespace)) >= 520, timeout=60)
    runs = _runs(rdb, namespace)
    assert len(runs) == 520 and not any(_pending(hot).values())
    deep = next(r[2] for r in runs if r[0] == "big")
    elsewhere = [i for i, r in enumerate(runs) if r[0] != "big" and r[2] != deep]
    assert len(elsewhere) >= 60 and max(elsewhere) < 520 // 4, f"their last job started at {max(elsewhere)} of 520"
    for key in ["big", *small]:
        order = [int(r[1]) for r in runs if r[0] == key]
        assert order == sorted(order) and len(order) == (400 if key == "big" else 3), (key, order)
        assert len({r[2] for r in runs if r[0] == key}) == 1  # one partition per key


def test_dead_letter_replay_and_info_name_the_queue(
        hot: App, workers: Callable[..., subprocess.Popen[bytes]], rdb: redis.Redis, namespace: str,
        cli: Callable[..., str]) -> None:
    """Failing jobs go to dead-letter in their partitions; ``dead list --queue hot`` shows them all, ``dead
    replay --queue hot --all`` sends each back to its partition; ``info`` has one row for the queue."""
    hot.enqueue_many("keyed", [{"key": f"k{n}", "n": n, "fail": True} for n in range(12)])
    hot.enqueue_many("spread", [{"n": n} for n in range(20)])
    w = workers("--concurrency", "4")
    wait_until(lambda: sum(int(hot.broker.sync.zcard(hot.broker.keys.queue(p).dead)) for p in _pending(hot)) == 12)
    dead_in = Counter(p for p in _pending(hot) for _ in range(hot.broker.sync.zcard(hot.broker.keys.queue(p).dead)))
    assert len(dead_in) > 1  # spread over partitions
    listed = json.loads(cli("dead", "list", "--queue", "hot", "--json"))
    assert sorted(j["id"] for j in listed) == sorted(r[4] for r in _runs(rdb, namespace) if r[0] != "-")
    info = json.loads(cli("info", "--json"))
    assert [(q["queue"], q["dead"], q["processed"], q["partitions"]) for q in info["queues"]] == [
        ("hot", 12, 20, PARTS)]
    os.killpg(w.pid, signal.SIGKILL)
    w.wait(10)
    cli("dead", "replay", "--queue", "hot", "--all")
    assert Counter({p: hot.broker.sync.llen(hot.broker.keys.queue(p).pending) for p in dead_in}) == dead_in
    workers("--concurrency", "4")
    wait_until(lambda: len(_runs(rdb, namespace)) >= 12 * 2 + 20)
    again = [r for r in _runs(rdb, namespace)[32:] if r[0] != "-"]
    first = {r[4]: r[2] for r in _runs(rdb, namespace)[:32] if r[0] != "-"}
    assert {r[4]: r[2] for r in again} == first  # each ran again, in the partition it died in


def test_depends_on_holds_within_a_partition_and_names_another(hot: App) -> None:
    """A job waits for jobs of its own partition: the same partition key puts it there; another key is refused,
    the partition of the dependency named."""
    keyed = hot.resolve("keyed")
    first = keyed.enqueue(key="a", n=1)
    after = keyed.with_options(depends_on=[first]).enqueue(key="a", n=2)
    assert hot.broker.job_state(partition_name("hot", _index(hot, "a"), PARTS), after) is not None
    other = next(k for k in (f"b{i}" for i in range(100)) if _index(hot, k) != _index(hot, "a"))
    with pytest.raises(ConfigError, match=rf"job {first} is in queue 'hot~{_index(hot, 'a')}of{PARTS}'"):
        keyed.with_options(depends_on=[first]).enqueue(key=other, n=3)


def _index(app: App, key: str) -> int:
    return int(app.client.partition("hot", f"k:{key}").split("~")[1].split("of")[0])


def test_a_queue_limit_counts_every_partition(hot: App) -> None:
    """``limit_queue("hot", n)`` is one limit over the partitions: a job of any partition takes a slot of "hot"."""
    from ringfence.models import Fetched
    from ringfence.worker.gates import Gates

    hot.limit_queue("hot", 3)
    gates = Gates(hot.broker, hot.worker_settings, hot.queue_limits, hot.breakers)
    task = hot.resolve("spread")
    for i in range(PARTS):
        job = Fetched(f"j{i}", partition_name("hot", i, PARTS), b"{}", 1, "t", 0)
        assert gates.limits(job, task) == [("queue", "hot", 3)]


def test_a_workflow_runs_in_one_partition(hot: App, workers: Callable[..., subprocess.Popen[bytes]],
                                          rdb: redis.Redis, namespace: str) -> None:
    import ringfence

    spread = hot.resolve("spread")
    ids = [ringfence.chain(spread.s(n=1), spread.s(n=2), spread.s(n=3)).enqueue(business_id=f"order-{k}")
           for k in range(6)]
    workers("--concurrency", "4")
    wait_until(lambda: all((v := hot.workflow(w)) is not None and v.state == "done" for w in ids))
    views = [hot.workflow(w) for w in ids]
    assert all(v is not None and "~" in v.queue for v in views)
    assert len({v.queue for v in views if v is not None}) > 1  # business ids spread the workflows
    by_job = {r[4]: r[2] for r in _runs(rdb, namespace)}
    for v in views:
        assert v is not None and {by_job[s.job_id] for s in v.steps if s.job_id} == {v.queue}


def test_the_dashboard_shows_a_partitioned_queue_and_each_partition(hot: App) -> None:
    pytest.importorskip("starlette")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    from ringfence.dashboard import create_app

    ids = hot.enqueue_many("spread", [{"n": n} for n in range(8)])
    client = TestClient(create_app(hot, token="s3cret-token"))
    overview = client.get("/")
    assert overview.status_code == 200
    total = overview.text.split('data-queue="hot" data-partitions="4"')[1].split("</tr>")[0]
    assert "hot (4 partitions)" in total and total.count('<td class="num">8</td>') == 1  # 8 pending in all
    for i in range(PARTS):
        name = partition_name("hot", i, PARTS)
        assert f'data-queue="{name}"' in overview.text
        page = client.get(f"/queues/{name}/pending")
        assert page.status_code == 200 and page.text.count('<tr data-job="') == 2
    job = client.get(f"/jobs?id={ids[0]}")
    assert job.status_code == 200 and "pending" in job.text


def test_a_concurrency_key_routes_to_one_partition(hot: App) -> None:
    """A per-key limit is kept in its partition's slot: without a partition key, a job goes where its
    concurrency key hashes, so the limit holds for the whole queue."""
    def per_account(ctx: object, account: str, n: int) -> None:
        pass

    task = hot.task(name="per_account", queue="hot", concurrency_key="acct:{account}", concurrency_limit=1)(
        per_account)
    for account in ("a", "b", "c", "d", "e", "f"):
        before = _pending(hot)
        hot.enqueue_many(task, [{"account": account, "n": n} for n in range(5)])
        grew = {p: c - before[p] for p, c in _pending(hot).items() if c != before[p]}
        assert list(grew.values()) == [5], (account, grew)
        assert list(grew) == [hot.client.partition("hot", f"acct:{account}")]


async def test_a_weight_is_the_queues_as_a_whole(make_app: Callable[..., App]) -> None:
    """``--queues hot=1,low=1`` with hot in 4 partitions: hot is served about half the time (a weight per
    partition would make it 4 in 5)."""
    from test_worker import run_until

    app = make_app()
    app.queue("hot", partitions=PARTS)
    seen: list[str] = []

    @app.task(name="t")
    async def t(ctx: Any) -> None:
        seen.append(ctx.queue.split("~")[0])

    for q in ("hot", "low"):
        app.enqueue_many(t, [{}] * 800, queue=q)
    await run_until(app, lambda: len(seen) >= 400, timeout=60, queues=[("hot", 1), ("low", 1)], concurrency=1)
    hot = Counter(seen[:400])["hot"]
    assert abs(hot - 200) <= 40, f"hot served {hot} of 400"  # four standard deviations of a fair coin


async def test_a_periodic_task_ticks_into_one_partition(make_app: Callable[..., App], rdb: redis.Redis) -> None:
    from ringfence.redis.broker import Broker
    from ringfence.scheduler import Scheduler
    from support import SimClock

    app = make_app()
    app.queue("hot", partitions=PARTS)

    @app.periodic("* * * * *", name="every_minute", queue="hot")
    async def every_minute(ctx: Any) -> None: ...

    clock = SimClock(1_800_000_000_000 // 60_000 * 60_000 + 5_000)
    schedulers = [Scheduler(app.periodics, Broker(app.redis_url, app.namespace, clock=clock)) for _ in range(2)]
    for _ in range(10):
        for s in schedulers:
            await s.tick()
        clock.ms += 60_000
    held = {p: n for p, n in _pending(app).items() if n}
    assert list(held.values()) == [10], held  # one per minute, each once for both schedulers
    assert rdb.llen(app.broker.keys.queue("hot").pending) == 0


def test_the_outbox_relay_sends_each_job_to_its_partition(make_app: Callable[..., App], tmp_path: Any,
                                                           namespace: str) -> None:
    """``enqueue_in`` picks the partition when it writes the row; the relay sends it there (a partition's
    name passes the relay's check of a row's queue)."""
    import sqlalchemy as sa

    from outbox_helpers import forget, outbox_engine
    from ringfence.outbox.relay import Relay

    engine = outbox_engine("sqlite", tmp_path)
    try:
        app = make_app(fence_url=engine.url.render_as_string(hide_password=False))
        app.queue("hot", partitions=PARTS)
        keyed = app.task(name="keyed", queue="hot", partition_key="k:{key}")(_noop)
        with engine.connect() as conn:
            conn.begin()
            ids = {keyed.enqueue_in(conn, key=f"k{n}", n=n): f"k{n}" for n in range(12)}
            conn.commit()
        relay = Relay(app, engine=engine, batch=5)
        assert relay.run(once=True) == 12 and relay.counts.refused == 0
        for job_id, key in ids.items():
            assert app.broker.job_state(app.client.partition("hot", f"k:{key}"), job_id) is not None
        assert len({app.client.partition("hot", f"k:{k}") for k in ids.values()}) > 1
        with engine.connect() as c:
            assert c.execute(sa.text("SELECT count(*) FROM ringfence_outbox WHERE namespace = :ns"),
                             {"ns": namespace}).scalar() == 0
    finally:
        forget(engine, namespace)
        engine.dispose()


def test_pause_resume_and_purge_take_every_partition(hot: App, cli: Callable[..., str]) -> None:
    hot.enqueue_many("spread", [{"n": n} for n in range(8)])

    def paused() -> list[bool]:
        return [bool(hot.broker.sync.exists(hot.broker.keys.queue(p).paused)) for p in _pending(hot)]

    cli("queue", "pause", "hot")
    assert paused() == [True] * PARTS
    cli("queue", "resume", "hot")
    assert paused() == [False] * PARTS
    assert "purged 8 pending job(s) of hot" in cli("queue", "purge", "hot", "--yes")
    assert not any(_pending(hot).values())


def test_a_killed_workers_jobs_in_every_partition_run_again(
        hot: App, workers: Callable[..., subprocess.Popen[bytes]], rdb: redis.Redis, namespace: str) -> None:
    """A worker SIGKILLed while it runs jobs of every partition: their leases lapse and another worker runs each
    of them again (attempt 2) in its own partition; every job finishes."""
    hot.task(name="slow", queue="hot")(_spread)
    hot.enqueue_many("slow", [{"n": n} for n in range(16)])
    first = workers("--concurrency", "16")
    wait_until(lambda: len(_runs(rdb, namespace)) >= 16)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    done_then = {int(d.split()[0]) for d in rdb.lrange(f"{namespace}:test:done", 0, -1)}
    interrupted = {int(r[1]): r[2] for r in _runs(rdb, namespace) if int(r[1]) not in done_then}
    assert len(set(interrupted.values())) == PARTS
    workers("--concurrency", "8")
    wait_until(lambda: {int(d.split()[0]) for d in rdb.lrange(f"{namespace}:test:done", 0, -1)} == set(range(16)),
               timeout=30)
    again = {int(r[1]): r[2] for r in _runs(rdb, namespace) if r[3] == "2"}
    assert {n: again.get(n) for n in interrupted} == interrupted  # again, as attempt 2, in its partition
    assert set(again) - set(interrupted) <= done_then  # one that finished as the kill came, its ack unsent


def test_a_worker_serves_the_partitions_of_a_queue_it_names(hot: App) -> None:
    """``--queues hot=2,low`` and ``--max-wait hot=5``: the worker fetches from hot's partitions at hot's weight,
    and the bound holds for each partition; a bound on a queue it does not serve is refused."""
    from ringfence.worker.worker import Worker

    w = Worker(hot, [("hot", 2), ("low", 1)], max_wait={"hot": 5.0})
    parts = [partition_name("hot", i, PARTS) for i in range(PARTS)]
    assert w.queues == [(p, 2) for p in parts] + [("hot", 2), ("low", 1)]
    assert w.processor.fetcher.max_wait == dict.fromkeys([*parts, "hot"], 5.0)
    with pytest.raises(ConfigError, match="does not serve: hot~0of4"):
        Worker(hot, [("hot", 1)], max_wait={"hot~0of4": 5.0})


def test_jobs_of_a_producer_not_told_of_the_partitions_still_run(
        make_app: Callable[..., App], workers: Callable[..., subprocess.Popen[bytes]], rdb: redis.Redis,
        namespace: str) -> None:
    """A producer without ``app.queue("hot", partitions=N)`` enqueues into queue "hot" itself: a worker serving
    the partitioned queue fetches from it too."""
    plain = make_app()
    plain.task(name="spread", queue="hot")(_spread)
    plain.enqueue_many("spread", [{"n": n} for n in range(10)])
    workers("--concurrency", "4")
    wait_until(lambda: len(_runs(rdb, namespace)) >= 10)
    assert {r[2] for r in _runs(rdb, namespace)} == {"hot"}


def test_the_doctor_names_partitions_no_worker_serves(hot: App, redis_url: str, namespace: str) -> None:
    """A worker not told of the partitions lists only "hot": the doctor names each partition holding jobs."""
    from ringfence.doctor import Thresholds, diagnose
    from test_doctor import fake_server

    hot.enqueue_many("spread", [{"n": n} for n in range(8)])
    fake_server(redis_url, namespace, {"hot": 1})
    report = diagnose(hot, Thresholds(sample_s=0.2))
    unserved = sorted(f.subject for f in report.findings if f.check == "queue_unserved")
    assert unserved == [partition_name("hot", i, PARTS) for i in range(PARTS)]


def test_the_queues_own_list_is_fetched_when_due_last_otherwise_and_in_turn_while_it_holds_jobs() -> None:
    """A round fetches "hot" itself first once due (at start, then PLAIN_EVERY_S after it was found empty),
    else after the partitions (only a round that found them all empty reaches it); while it holds jobs it
    takes its turn with the partitions."""
    from ringfence.worker.partitions import PLAIN_EVERY_S, FetchOrder, expand

    now = [100.0]
    order = FetchOrder(expand([("hot", 1), ("low", 1)], {"hot": PARTS}), clock=lambda: now[0])
    parts = [partition_name("hot", i, PARTS) for i in range(PARTS)]
    assert order.next(strict=True)[0] == "hot"
    order.fetched("hot", empty=True)
    for _ in range(3):
        assert order.next(strict=True)[-1] == "hot" and order.next(strict=True).count("hot") == 1
    now[0] += PLAIN_EVERY_S
    assert order.next(strict=True)[0] == "hot"
    order.fetched("hot", empty=False)
    firsts = [order.next(strict=True)[0] for _ in range(PARTS + 1)]
    assert sorted(firsts) == sorted([*parts, "hot"])
    assert order.next(strict=True)[-1] == "low"


def test_a_busy_worker_fetches_the_queues_own_list_within_the_bound(
        hot: App, make_app: Callable[..., App], workers: Callable[..., subprocess.Popen[bytes]], rdb: redis.Redis,
        namespace: str) -> None:
    """Jobs enqueued into "hot" itself while one worker drains a 5,000-job backlog of the partitions start before the
    backlog is done: the worker looks at its own list every PLAIN_EVERY_S, not only once the partitions are
    empty."""
    hot.enqueue_many("spread", [{"n": n} for n in range(5000)])
    workers("--concurrency", "1")
    wait_until(lambda: len(_runs(rdb, namespace)) >= 50)
    plain = make_app()
    plain.task(name="spread", queue="hot")(_spread)
    plain.enqueue_many("spread", [{"n": n} for n in range(3)])
    wait_until(lambda: sum(r[2] == "hot" for r in _runs(rdb, namespace)) == 3, timeout=30, interval=0.02)
    assert sum(_pending(hot).values()) > 0, "the jobs of hot itself waited for the partitions' backlog"


def test_a_plain_enqueue_on_a_partitioned_queue_takes_the_packed_call_of_its_partition(hot: App) -> None:
    """``task.enqueue(...)`` with no options sends the packed-ahead call (redis/ready.py) of the partition the job
    routes to: in turn without a key, by the key's hash with one."""
    from ringfence.redis.ready import ReadyEnqueue

    for n in range(2 * PARTS):
        hot.enqueue("spread", n=n)
    for n in range(5):
        hot.enqueue("keyed", key="a", n=n)
    ready = hot.client._ready[hot.registry.get("spread")]  # type: ignore[index]
    assert isinstance(ready, dict) and sorted(ready) == sorted(_pending(hot))
    assert all(isinstance(call, ReadyEnqueue) for call in ready.values())
    keyed = hot.client.partition("hot", "k:a")
    assert _pending(hot) == {p: 2 + 5 * (p == keyed) for p in _pending(hot)}
    assert hot.broker.queues() == sorted(_pending(hot))
