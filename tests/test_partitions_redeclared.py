"""A partitioned queue declared again with another N (app.queue("hot", partitions=8), then 4): workers of the new
declaration fetch the jobs left in the partitions of the old one, found in Redis, without being told the old N;
the doctor counts those partitions as served."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis

from ringfence import App
from ringfence.redis.keys import partition_name
from support import ROOT, kill_groups, wait_until

OLD, NEW = 8, 4  # tests/partitionapp.py declares NEW (TEST_PARTITIONS)


def _spread(ctx: object, n: int) -> None:
    pass


def _noop(ctx: object, key: str, n: int, fail: bool = False) -> None:
    pass


def _limited(ctx: object, key: str, n: int) -> None:
    pass


@pytest.fixture
def old(make_app: Callable[..., App]) -> App:
    """A producer of the old declaration."""
    app = make_app()
    app.queue("hot", partitions=OLD)
    app.task(name="spread", queue="hot")(_spread)
    app.task(name="keyed", queue="hot", partition_key="k:{key}")(_noop)
    return app


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    kill_groups(procs)


def _worker(procs: list[subprocess.Popen[bytes]], redis_url: str, namespace: str) -> None:
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "TEST_PARTITIONS": str(NEW),
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "ringfence.cli", "worker", "--app", "partitionapp:app", "--queues", "hot",
         "--concurrency", "4"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True))


def _runs(rdb: redis.Redis, ns: str) -> list[list[str]]:
    return [r.decode().split() for r in rdb.lrange(f"{ns}:test:runs", 0, -1)]


def test_a_worker_declared_with_another_n_drains_the_old_partitions(
        old: App, redis_url: str, namespace: str, rdb: redis.Redis, started: list[subprocess.Popen[bytes]]) -> None:
    """Jobs in the 8 partitions of the old declaration (10 of one key in one), a worker declared with 4: every
    job runs once, from its old partition. Jobs an old producer still enqueues after the drain (a rolling deploy)
    run too, found by the worker's next look."""
    olds = {partition_name("hot", i, OLD) for i in range(OLD)}
    old.enqueue_many("spread", [{"n": n} for n in range(40)])
    old.enqueue_many("keyed", [{"key": "a", "n": n} for n in range(10)])
    _worker(started, redis_url, namespace)
    wait_until(lambda: len(_runs(rdb, namespace)) >= 50, timeout=20)
    old.enqueue_many("spread", [{"n": n} for n in range(40, 48)])
    wait_until(lambda: len(_runs(rdb, namespace)) >= 58, timeout=20)
    runs = _runs(rdb, namespace)
    twice = {i: c for i, c in Counter(r[4] for r in runs).items() if c > 1}
    assert len(runs) == 58 and not twice, twice
    assert {r[2] for r in runs} == olds  # each from a partition of 8
    assert sorted(int(r[1]) for r in runs if r[0] == "a") == list(range(10))
    assert sorted(int(r[1]) for r in runs if r[0] == "-") == list(range(48))
    assert not any(old.broker.sync.llen(old.broker.keys.queue(p).pending) for p in olds)


def test_keyed_jobs_an_old_worker_sorted_into_their_keys_lists_run(
        old: App, redis_url: str, namespace: str, rdb: redis.Redis, started: list[subprocess.Popen[bytes]]) -> None:
    """Jobs of a concurrency key that an old worker's fetch sorted into their keys' lists (its partition's pending
    list then empty) and one it leased and never finished: a worker declared with 4 runs each once more."""
    old.task(name="limited", queue="hot", concurrency_key="acct:{key}", concurrency_limit=1)(_limited)
    old.enqueue_many("limited", [{"key": f"k{k}", "n": n} for k in range(3) for n in range(10)])
    held = [p for p in sorted(old.broker.queues()) if old.broker.sync.llen(old.broker.keys.keyed(p) + "ring")]
    now = old.broker.clock()
    leased = [old.broker.run(old.broker.fetch(p, 1, now + 500, f"old.{i}")) for i, p in enumerate(held)]
    assert all(len(got) == 1 for got in leased)
    assert held and not any(old.broker.sync.llen(old.broker.keys.queue(p).pending) for p in held)
    _worker(started, redis_url, namespace)
    wait_until(lambda: len(_runs(rdb, namespace)) >= 30, timeout=20)
    runs = _runs(rdb, namespace)
    assert sorted((r[0], int(r[1])) for r in runs) == [(f"k{k}", n) for k in range(3) for n in range(10)]
    assert {r[2] for r in runs} <= set(held)


def test_the_doctor_counts_old_partitions_as_served(old: App, redis_url: str, namespace: str) -> None:
    """A live worker lists the partitions of 4: the jobs in partitions of 8 are its to fetch, not unserved; a
    worker not told of any partition still leaves them unserved."""
    from ringfence.doctor import Thresholds, diagnose
    from test_doctor import fake_server

    old.enqueue_many("spread", [{"n": n} for n in range(16)])
    fake_server(redis_url, namespace, {"hot": 1})
    report = diagnose(old, Thresholds(sample_s=0.2))
    assert sorted(f.subject for f in report.findings if f.check == "queue_unserved") == sorted(
        partition_name("hot", i, OLD) for i in range(OLD))
    fake_server(redis_url, namespace, {**{partition_name("hot", i, NEW): 1 for i in range(NEW)}, "hot": 1})
    report = diagnose(old, Thresholds(sample_s=0.2))
    assert [f.status.value for f in report.findings if f.check == "queue_unserved"] == ["ok"]
