"""Per-key concurrency limits (``concurrency_key``/``concurrency_limit`` on a task; lua/_keyed.lua), on the shared
Redis:

- bad declarations and payloads whose key cannot be built get one clear error, at declaration or enqueue; a job
  whose key cannot be built at run time goes to dead-letter with the reason;
- fetch takes the keys in turn and parks a key at its limit: the other keys' jobs are fetched meanwhile, and a
  release puts the key back (the exact Redis state after each call);
- real workers: at most N jobs of a key run at once (the jobs record it themselves); a SIGKILLed worker's slot
  holds its key until its lease lapses, then the key runs again; a key with a backlog does not delay the small
  keys' jobs queued behind it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from ringfence import App, ConfigError, PayloadError
from ringfence.models import JobSpec
from ringfence.queries import find_dead, queue_info
from support import FAST, WorkerProc, wait_until


def keyed_task(app: App, limit: int = 2) -> Any:
    @app.task(name="per_account", concurrency_key="account:{account}", concurrency_limit=limit)
    async def per_account(ctx: Any, account: str, n: int, sleep_s: float = 0.2,
                          first_s: float | None = None) -> None:
        pass

    return per_account


def key_worker(spawn_worker: Callable[..., WorkerProc], *args: str, limit: int = 2) -> WorkerProc:
    return spawn_worker("--app", "concurrencykeyapp:app", "--queues", "default", *args,
                        env={"TEST_KEY_LIMIT": str(limit)})


def starts(rdb: redis.Redis, namespace: str) -> list[tuple[str, int, float]]:
    """(key, n, start time) of each run, in start order (tests/concurrencykeyapp.py)."""
    out = []
    for raw in rdb.lrange(f"{namespace}:test:start", 0, -1):
        key, n, at, _pid = raw.decode().split()
        out.append((key, int(n), float(at)))
    return out


def done(rdb: redis.Redis, namespace: str) -> int:
    return int(rdb.get(f"{namespace}:test:done") or 0)


# -- declaration and enqueue errors ---------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "named"), [
    ({"concurrency_key": "account:{acount}", "concurrency_limit": 1}, "names field 'acount'"),
    ({"concurrency_key": "account:{0}", "concurrency_limit": 1}, "must name payload fields"),
    ({"concurrency_key": "account:{account", "concurrency_limit": 1}, "not a valid template"),
    ({"concurrency_key": "account:{account}"}, "go together"),
    ({"concurrency_limit": 2}, "go together"),
    ({"concurrency_key": "account:{account}", "concurrency_limit": 0}, "concurrency_limit=0"),
    ({"concurrency_key": "", "concurrency_limit": 1}, "non-empty template"),
])
def test_bad_declarations_name_the_problem(make_app: Callable[..., App], options: dict[str, Any],
                                          named: str) -> None:
    app = make_app()
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")):
        @app.task(**options)
        async def charge(ctx: Any, account: str) -> None:
            pass


def test_a_key_that_cannot_be_built_is_refused_at_enqueue(make_app: Callable[..., App]) -> None:
    app = make_app()

    @app.task(concurrency_key="region:{region}", concurrency_limit=1)
    async def optional(ctx: Any, region: str = "") -> None:
        pass

    keyed = keyed_task(app)
    with pytest.raises(PayloadError, match=r"concurrency_key 'region:\{region\}' cannot be built.*region"):
        optional.enqueue()
    for bad in ('a"b', "a\\b", "a\nb", "a" * 200):
        with pytest.raises(PayloadError, match="without quotes or backslashes"):
            keyed.enqueue(account=bad, n=1)
    assert queue_info(app.broker, "default")["pending"] == 0


def test_the_key_travels_in_the_spec_head(make_app: Callable[..., App]) -> None:
    app = make_app()
    job = keyed_task(app, limit=3).enqueue(account="a:1", n=1)
    r, pfx = app.broker.sync, app.broker.keys.keyed("default")
    # enqueued straight into its key's list, the key on the ring, pending untouched
    assert r.llen(app.broker.keys.queue("default").pending) == 0
    assert r.lrange(pfx + "ring", 0, -1) == [b"account:a:1"]
    assert r.hget(app.broker.keys.queue("default").stats, "keyed_waiting") == b"1"
    raw = r.lindex(pfx + "q:account:a:1", 0)
    assert raw is not None and raw.startswith(job.encode())
    spec = JobSpec.decode(raw[len(job):])
    assert (spec.extra["ck"], spec.extra["cl"], spec.args) == ("account:a:1", 3, {"account": "a:1", "n": 1})


def test_a_job_whose_key_cannot_be_built_at_run_time_goes_to_dead_letter(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    """A producer whose declaration has no key (an older release) sends a payload without the key's field."""
    producer = make_app()

    @producer.task(name="optional_key")
    def optional_key(ctx: Any, region: str = "") -> None:
        pass

    job = optional_key.enqueue()
    key_worker(spawn_worker)
    dead = wait_until(lambda: find_dead(producer.broker, job), timeout=15)
    assert dead.reason == "bad_payload"
    assert "concurrency_key 'region:{region}' cannot be built" in dead.error and "region" in dead.error
    assert done(producer.broker.sync, namespace) == 0


def test_a_job_without_its_key_in_the_spec_takes_its_slot_at_run_time(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    """Jobs from a producer whose declaration has no key: the worker builds the key and keeps the limit."""
    producer = make_app()

    @producer.task(name="per_account")
    async def per_account(ctx: Any, account: str, n: int, sleep_s: float = 0.2) -> None:
        pass

    for i in range(4):
        per_account.enqueue(account="a", n=i, sleep_s=0.3)
    key_worker(spawn_worker, "--concurrency", "4", limit=1)
    wait_until(lambda: done(producer.broker.sync, namespace) == 4, timeout=30)
    assert int(producer.broker.sync.get(f"{namespace}:test:peak:a") or 0) == 1


# -- the fetch script's turns and parking ------------------------------------------------------------------------
def test_fetch_takes_keys_in_turn_and_parks_a_key_at_its_limit(make_app: Callable[..., App]) -> None:
    app = make_app()
    task = keyed_task(app, limit=2)
    b = app.broker
    ids = {f"a{i}": task.enqueue(account="a", n=i) for i in range(6)}
    ids |= {f"b{i}": task.enqueue(account="b", n=i) for i in range(2)}
    ids |= {f"c{i}": task.enqueue(account="c", n=i) for i in range(2)}
    names = {v: k for k, v in ids.items()}
    deadline = b.clock() + 60_000

    got = b.run(b.fetch("default", 3, deadline, "t1"))
    assert [names[j[0]] for j in got] == ["a0", "b0", "c0"]  # one job per key per turn, not a's six first
    assert queue_info(b, "default")["pending"] == 7  # the jobs in the keys' lists count as pending
    got = b.run(b.fetch("default", 10, deadline, "t2"))
    assert [names[j[0]] for j in got] == ["a1", "b1", "c1"]  # then a is at its limit: parked, b and c go on
    pfx = b.keys.keyed("default")
    r = b.sync
    assert r.zrange(pfx + "parked", 0, -1) == [b"account:a"]
    assert r.lrange(pfx + "ring", 0, -1) == []
    # a slot's holder is the attempt: '<job id>:<lease token>'
    assert sorted(r.zrange(pfx + "s:account:a", 0, -1)) == sorted([f"{ids['a0']}:t1".encode(),
                                                                   f"{ids['a1']}:t2".encode()])
    assert r.llen(pfx + "q:account:a") == 4
    assert b.run(b.fetch("default", 10, deadline, "t3")) == []
    assert queue_info(b, "default")["pending"] == 4

    assert b.run(b.release_key_slots("default", [("account:a", f"{ids['a0']}:t1")])) == 1
    assert r.zrange(pfx + "parked", 0, -1) == []
    assert r.lrange(pfx + "ring", 0, -1) == [b"account:a"]
    got = b.run(b.fetch("default", 10, deadline, "t4"))
    assert [names[j[0]] for j in got] == ["a2"]  # one slot freed, one job
    assert r.zrange(pfx + "parked", 0, -1) == [b"account:a"]

    # a worker's next fetch carries the slots its ended jobs freed, and may take them in the same script
    b.free_key_slot("default", "account:a", f"{ids['a1']}:t2")
    got, _ = b.run(b.fetch_marking("default", 10, deadline, "t5", "w1", b.clock() + 5_000))
    assert [names[j[0]] for j in got] == ["a3"]
    assert sorted(r.zrange(pfx + "s:account:a", 0, -1)) == sorted([f"{ids['a2']}:t4".encode(),
                                                                   f"{ids['a3']}:t5".encode()])


def test_a_dead_workers_slot_ends_with_its_lease(make_app: Callable[..., App]) -> None:
    app = make_app()
    task = keyed_task(app, limit=1)
    b = app.broker
    first, second = task.enqueue(account="a", n=0), task.enqueue(account="a", n=1)
    now = b.clock()
    assert [j[0] for j in b.run(b.fetch("default", 5, now + 1_000, "t1"))] == [first]
    assert b.run(b.fetch("default", 5, now + 1_000, "t2")) == []
    time.sleep(1.1)  # the slot's lease (the fetch's deadline) lapses: nobody released it
    assert [j[0] for j in b.run(b.fetch("default", 5, b.clock() + 1_000, "t3"))] == [second]


# -- real workers ---------------------------------------------------------------------------------------------------
def test_at_most_n_jobs_of_a_key_run_at_once(make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc],
                                            namespace: str) -> None:
    app = make_app()
    task = keyed_task(app, limit=2)
    rdb = app.broker.sync
    for key in ("a", "b", "c"):
        for i in range(8):
            task.enqueue(account=key, n=i, sleep_s=0.15)
    for _ in range(2):
        key_worker(spawn_worker, "--concurrency", "8", limit=2)
    wait_until(lambda: done(rdb, namespace) == 24, timeout=30)
    peaks = {key: int(rdb.get(f"{namespace}:test:peak:{key}") or 0) for key in ("a", "b", "c")}
    assert peaks == {"a": 2, "b": 2, "c": 2}, peaks
    assert queue_info(app.broker, "default")["processed"] == 24


def test_the_heartbeat_keeps_a_long_jobs_slot(make_app: Callable[..., App],
                                              spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    """Jobs running longer than a lease (2 s here) keep their key's slot: the next job of the key waits."""
    app = make_app()
    task = keyed_task(app, limit=1)
    rdb = app.broker.sync
    for i in range(2):
        task.enqueue(account="a", n=i, sleep_s=FAST.lease_s * 1.75)
    key_worker(spawn_worker, "--concurrency", "4", limit=1)
    wait_until(lambda: done(rdb, namespace) == 2, timeout=30)
    assert int(rdb.get(f"{namespace}:test:peak:a") or 0) == 1
    first, second = starts(rdb, namespace)
    assert second[2] - first[2] >= FAST.lease_s * 1.75


def test_a_sigkilled_workers_slot_comes_back_when_its_lease_lapses(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    app = make_app()
    task = keyed_task(app, limit=1)
    rdb = app.broker.sync
    task.enqueue(account="a", n=0, sleep_s=0.1, first_s=30)
    doomed = key_worker(spawn_worker, limit=1)
    wait_until(lambda: len(starts(rdb, namespace)) == 1, timeout=15)
    slots = app.broker.keys.slots("key:default", "account:a")
    assert rdb.zcard(slots) == 1
    doomed.signal(signal.SIGKILL)
    doomed.wait(10)
    killed = time.time()
    task.enqueue(account="a", n=1, sleep_s=0.1)
    key_worker(spawn_worker, limit=1)
    wait_until(lambda: done(rdb, namespace) == 2, timeout=30)  # the key came back (a new worker starts)
    runs = starts(rdb, namespace)
    later = [at for key, n, at in runs[1:]]
    # nothing of key a ran while the dead worker's slot was live; both jobs ran once it lapsed
    assert min(later) >= killed + FAST.lease_s * 0.5, (killed, runs)
    assert sorted(n for _, n, _ in runs[1:]) == [0, 1]
    wait_until(lambda: rdb.zcard(slots) == 0, timeout=5)  # freed by the next fetch, or within 50 ms


def test_a_backlog_of_one_key_does_not_delay_the_other_keys(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    app = make_app()
    task = keyed_task(app, limit=100)  # the limit is no constraint here: the turns are what is tested
    rdb = app.broker.sync
    app.enqueue_many(task, [{"account": "big", "n": i, "sleep_s": 0.01} for i in range(400)])
    app.enqueue_many(task, [{"account": f"small{k}", "n": i, "sleep_s": 0.01} for k in range(10) for i in range(3)])
    key_worker(spawn_worker, "--concurrency", "4", limit=100)
    wait_until(lambda: done(rdb, namespace) == 430, timeout=40)
    order = [key for key, _, _ in starts(rdb, namespace)]
    small = [i for i, key in enumerate(order) if key != "big"]
    assert len(small) == 30
    # queued behind 400 jobs of one key, each small key's 3 jobs start within its first turns
    assert max(small) < 100, small
