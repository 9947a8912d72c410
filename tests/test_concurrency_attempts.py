"""A concurrency slot belongs to the attempt that took it, not to the job. An attempt whose lease lapsed (its worker
stood still past its lease) is replaced by the job's next attempt, which takes a slot of its own; when the lapsed
run resumes and ends, it frees and renews only its own slot, so the key (or the global limit) still counts the
new attempt's. Real broker calls on the shared Redis (fetch, recover, the heartbeat's renewal) and the worker's own
gate code, two workers' gates, time moved by a simulated clock instead of a stopped process; then real workers, one
SIGSTOPped past its lease."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from ringfence import App
from ringfence.models import Fetched
from ringfence.redis.broker import Broker
from ringfence.worker.admit import decode_spec
from ringfence.worker.gates import KEY_SLOT_WAIT_S, Gates, Wait
from support import FAST, SimClock, WorkerProc, wait_until
from test_concurrency_key import done, key_worker, keyed_task, starts

LEASE_MS = int(FAST.lease_s * 1000)  # the fetches' leases here, and the gates' slot leases (make_app's settings)


def gates(app: App) -> Gates:
    """One worker's gates."""
    return Gates(app.broker, app.worker_settings, app.queue_limits, app.breakers)


async def fetch(b: Broker, token: str, worker: str, count: int = 5) -> list[Fetched]:
    """A worker's fetch (fetch_marking, as fetcher.py calls it): its jobs as the worker holds them."""
    now = b.clock()
    got, _ = await b.arun(b.fetch_marking("default", count, now + LEASE_MS, token, worker, now + 5_000))
    out = []
    for job_id, raw, attempt in got:
        job = Fetched(job_id, "default", raw, attempt, token, now)
        job.spec = decode_spec(raw)
        out.append(job)
    return out


def slots(b: Broker, kind: str, name: str) -> list[tuple[bytes, float]]:
    return b.sync.zrange(b.keys.slots(kind, name), 0, -1, withscores=True)


async def heartbeat(b: Broker, g: Gates) -> int:
    """The heartbeat's renewal of ``g``'s slots (heartbeat.py): how many were renewed."""
    until = b.clock() + LEASE_MS
    return sum([await b.arun(b.extend_slots(kind, name, [(who, until)])) for kind, name, who in g.slots()])


async def lapse(b: Broker, clock: SimClock, job_id: str) -> None:
    """The attempt's worker stands still past its lease: another worker's sweep returns the job."""
    clock.advance(LEASE_MS / 1000 + 0.5)
    assert await b.arun(b.recover("default")) == [job_id]


async def test_a_lapsed_attempt_frees_and_renews_no_key_slot_of_the_attempt_after_it(
        make_app: Callable[..., App], clock: SimClock) -> None:
    app = make_app(clock=clock)
    b = app.broker

    @app.task(name="per_account", concurrency_key="account:{account}", concurrency_limit=1)
    async def per_account(ctx: Any, account: str, n: int) -> None:
        pass

    job = per_account.enqueue(account="a", n=0)
    first_worker, second_worker = gates(app), gates(app)
    [first] = await fetch(b, "t1", "w1")
    assert first_worker.hold_key(first, per_account)
    await lapse(b, clock, job)
    [second] = await fetch(b, "t2", "w2")
    assert (second.id, second.attempt) == (job, 2)
    assert second_worker.hold_key(second, per_account)
    other = per_account.enqueue(account="a", n=1)
    held = slots(b, "key:default", "account:a")
    assert len(held) == 1

    # a heartbeat later, the lapsed run's renews nothing of the second attempt's
    clock.advance(FAST.heartbeat_s)
    assert await heartbeat(b, first_worker) == 0
    assert slots(b, "key:default", "account:a") == held
    # it ends: its release rides on its worker's next fetch, which must not take the key's second job
    first_worker.release_key(first)
    assert await fetch(b, "t3", "w1") == []
    assert slots(b, "key:default", "account:a") == held
    await asyncio.sleep(KEY_SLOT_WAIT_S * 2)  # its release's fallback flush (nothing left to free)
    assert slots(b, "key:default", "account:a") == held

    # the second attempt's renewal and release are its own
    assert await heartbeat(b, second_worker) == 1
    second_worker.release_key(second)
    assert [j.id for j in await fetch(b, "t4", "w2")] == [other]


async def test_a_lapsed_attempt_frees_and_renews_no_task_slot_of_the_attempt_after_it(
        make_app: Callable[..., App], clock: SimClock) -> None:
    app = make_app(clock=clock)
    b = app.broker

    @app.task(name="limited", concurrency=1)
    async def limited(ctx: Any, n: int) -> None:
        pass

    job = limited.enqueue(n=0)
    first_worker, second_worker = gates(app), gates(app)
    [first] = await fetch(b, "t1", "w1", count=1)
    assert await first_worker.enter(first, limited) is None
    await lapse(b, clock, job)
    [second] = await fetch(b, "t2", "w2", count=1)
    assert (second.id, second.attempt) == (job, 2)
    assert await second_worker.enter(second, limited) is None  # the lapsed run's slot ended with its lease
    held = slots(b, "task", "limited")
    assert len(held) == 1

    clock.advance(FAST.heartbeat_s)
    assert await heartbeat(b, first_worker) == 0
    assert slots(b, "task", "limited") == held
    await first_worker.release(first)
    assert slots(b, "task", "limited") == held
    other = limited.enqueue(n=1)
    [third] = await fetch(b, "t3", "w1", count=1)
    assert third.id == other
    assert isinstance(await first_worker.enter(third, limited), Wait)  # the limit of 1 is the second attempt's

    assert await heartbeat(b, second_worker) == 1
    await second_worker.release(second)
    assert await first_worker.enter(third, limited) is None


async def test_a_slot_held_under_the_bare_job_id_counts_until_its_lease_ends(
        make_app: Callable[..., App], clock: SimClock) -> None:
    """A slot taken by a worker of an earlier release, held under the job id alone (a rolling deploy): it counts
    against the key's limit until its lease ends; then the key's next job runs, its slot held by its attempt."""
    app = make_app(clock=clock)
    b = app.broker

    @app.task(name="per_account", concurrency_key="account:{account}", concurrency_limit=1)
    async def per_account(ctx: Any, account: str, n: int) -> None:
        pass

    key = b.keys.slots("key:default", "account:a")
    b.sync.zadd(key, {"older": b.clock() + LEASE_MS})
    job = per_account.enqueue(account="a", n=0)
    assert await fetch(b, "t1", "w1") == []
    clock.advance(LEASE_MS / 1000 + 0.5)
    [got] = await fetch(b, "t2", "w1")
    assert got.id == job
    g = gates(app)
    assert g.hold_key(got, per_account) and await heartbeat(b, g) == 1
    assert [m for m, _ in slots(b, "key:default", "account:a")] == [f"{job}:t2".encode()]


def test_a_stopped_workers_run_does_not_free_the_key_slot_of_the_attempt_after_it(
        make_app: Callable[..., App], spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    """Real workers: the first runs a job of a key limited to 1 and is SIGSTOPped past its lease; the second
    recovers the job and runs its second attempt; a second job of the key is enqueued and the first worker resumed
    (its heartbeat finds the lease lost and stops the run, which releases its slot). The second job starts only
    once the second attempt has ended."""
    app = make_app()
    task = keyed_task(app, limit=1)
    rdb = app.broker.sync
    attempt_s = 6.0
    job = task.enqueue(account="a", n=0, sleep_s=attempt_s, first_s=60)
    stopped = key_worker(spawn_worker, limit=1)
    wait_until(lambda: len(starts(rdb, namespace)) == 1, timeout=15)
    stopped.signal(signal.SIGSTOP)
    key_worker(spawn_worker, "--concurrency", "4", limit=1)
    wait_until(lambda: len(starts(rdb, namespace)) == 2, timeout=20)  # the second attempt runs
    assert int(rdb.hget(app.broker.keys.queue("default").attempts, job) or 0) == 2
    task.enqueue(account="a", n=1, sleep_s=0.01)
    stopped.signal(signal.SIGCONT)
    wait_until(lambda: done(rdb, namespace) == 2, timeout=30)
    (_, _, first), (_, _, second), (key, n, third) = starts(rdb, namespace)
    assert (key, n) == ("a", 1)
    assert third >= second + attempt_s, (first, second, third)
