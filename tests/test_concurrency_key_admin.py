"""A pending job waiting in its concurrency key's list (lua/_keyed.lua) is found, cancelled and purged like any
pending job: the lookup names its key, a cancelled one never runs, purge empties the keys' lists and the ring,
and the queue's counter of keyed jobs waiting stays right."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from ringfence import App, jobs
from ringfence.cli import main
from ringfence.fence import FenceStore, Owner
from ringfence.queries import queue_info
from support import WorkerProc, wait_until
from test_concurrency_key import done, key_worker, keyed_task, starts


def test_a_cancelled_keyed_waiting_job_never_runs(make_app: Callable[..., App],
                                                  spawn_worker: Callable[..., WorkerProc], namespace: str) -> None:
    app = make_app()
    task = keyed_task(app, limit=1)
    b, rdb = app.broker, app.broker.sync
    first = task.enqueue(account="7", n=0, sleep_s=1.5)  # holds the key's one slot while the others wait
    ids = [task.enqueue(account="7", n=i, sleep_s=0.05) for i in range(1, 4)]
    pfx = b.keys.keyed("default")
    key_worker(spawn_worker, "--concurrency", "4", limit=1)
    wait_until(lambda: rdb.llen(pfx + "q:account:7") == 3, timeout=15)

    view = jobs.find_job(app, ids[1])
    assert view is not None and view.state == "waiting for its key's slot: account:7"
    assert (view.task, view.args["n"]) == ("per_account", 2)
    assert b.job_state("default", first) == "active"
    assert jobs.cancel_job(app, ids[1]) == ("default", "waiting for its key's slot: account:7")
    assert rdb.llen(pfx + "q:account:7") == 2
    assert queue_info(b, "default")["pending"] == 2
    assert b.job_state("default", ids[1]) is None

    wait_until(lambda: done(rdb, namespace) == 3, timeout=15)
    assert sorted(n for _, n, _ in starts(rdb, namespace)) == [0, 1, 3]
    assert jobs.find_job(app, ids[1]) is None
    assert int(rdb.hget(b.keys.queue("default").stats, "keyed_waiting") or 0) == 0
    assert rdb.exists(pfx + "ring", pfx + "parked", pfx + "q:account:7") == 0


def test_purge_empties_the_key_lists_and_the_ring(make_app: Callable[..., App]) -> None:
    app = make_app()
    task = keyed_task(app, limit=1)
    b, rdb = app.broker, app.broker.sync
    a = [task.enqueue(account="a", n=i) for i in range(5)]
    bs = [task.enqueue(account="b", n=i) for i in range(2)]
    deadline = b.clock() + 60_000
    assert sorted(j[0] for j in b.run(b.fetch("default", 4, deadline, "t1"))) == sorted([a[0], bs[0]])
    pfx = b.keys.keyed("default")
    assert b.run(b.fetch("default", 4, deadline, "t2")) == []  # both at their limit: parked
    assert sorted(rdb.zrange(pfx + "parked", 0, -1)) == [b"account:a", b"account:b"]
    c = task.enqueue(account="c", n=0)  # in pending, not sorted yet
    assert jobs.find_job(app, a[3]).state == "waiting for its key's slot: account:a"  # type: ignore[union-attr]
    assert queue_info(b, "default")["pending"] == 6

    assert b.run(b.purge("default", 3)) == 3  # one bounded batch: c, then the first key's oldest
    assert queue_info(b, "default")["pending"] == 3
    assert jobs.purge_queue(app, "default") == (3, 0)
    assert queue_info(b, "default")["pending"] == 0
    assert int(rdb.hget(b.keys.queue("default").stats, "keyed_waiting") or 0) == 0
    assert rdb.exists(pfx + "ring", pfx + "parked", pfx + "q:account:a", pfx + "q:account:b") == 0
    assert all(jobs.find_job(app, j) is None for j in [*a[1:], bs[1], c])

    # the keys work on: a slot freed, a new job of the key runs in its turn and the counter stays right
    b.run(b.release_key_slots("default", [("account:a", f"{a[0]}:t1")]))
    late = task.enqueue(account="a", n=9)
    assert [j[0] for j in b.run(b.fetch("default", 4, deadline, "t3"))] == [late]
    assert int(rdb.hget(b.keys.queue("default").stats, "keyed_waiting") or 0) == 0


def test_purge_moves_a_keyed_waiting_job_owning_a_calling_step_to_dead_letter(
        make_app: Callable[..., App], tmp_path: Path, redis_url: str, namespace: str) -> None:
    """The purge's fence-step safety holds in the keys' lists; the CLI shows such a job with its key."""
    app = make_app(environment="test", fence_url=f"sqlite:///{tmp_path}/f.db")
    task = keyed_task(app, limit=1)
    store: FenceStore = app.fence_store
    store.create_all()
    ids = [task.enqueue(account="7", n=i) for i in range(3)]
    b = app.broker
    assert [j[0] for j in b.run(b.fetch("default", 2, b.clock() + 60_000, "t1"))] == [ids[0]]
    store.capture("order:7", "charge", Owner(ids[2], "tok", 30.0), "h", None)
    store.mark_calling("order:7", "charge", 1, None, 30.0)

    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}
    shown = CliRunner().invoke(main, ["job", "show", ids[1]], env=env)
    assert shown.exit_code == 0 and '"state": "waiting for its key\'s slot: account:7"' in shown.output
    assert jobs.purge_queue(app, "default") == (1, 1)
    row = store.get("order:7", "charge")
    assert row is not None and str(row.state) == "in_doubt"
    dead = b.dead_records("default", [ids[2]])
    assert dead and b'"reason":"cancelled"' in dead[0][1]
    assert jobs.find_job(app, ids[1]) is None
    assert queue_info(b, "default")["pending"] == 0
    assert int(b.sync.hget(b.keys.queue("default").stats, "keyed_waiting") or 0) == 0


def test_the_dashboard_finds_and_cancels_a_keyed_waiting_job(make_app: Callable[..., App]) -> None:
    pytest.importorskip("starlette")
    from dashboard_support import csrf, logged_in
    from ringfence.dashboard import create_app

    app = make_app()
    task = keyed_task(app, limit=1)
    ids = [task.enqueue(account="7", n=i) for i in range(3)]
    b = app.broker
    b.run(b.fetch("default", 1, b.clock() + 60_000, "t1"))
    client = logged_in(create_app(app, token="tok"), "tok")
    page = client.get(f"/jobs?id={ids[2]}")
    assert page.status_code == 200 and "waiting for its key&#39;s slot: account:7" in page.text
    assert "Cancel job" in page.text
    done = client.post("/actions/cancel", data={"csrf": csrf(client), "id": ids[2]})
    assert f"cancelled job {ids[2]} (was waiting for its key&#39;s slot: account:7 in default)" in done.text
    assert b.job_state("default", ids[2]) is None and queue_info(b, "default")["pending"] == 1


def test_stored_and_plain_jobs_in_the_keys_lists_are_found_cancelled_and_purged(make_app: Callable[..., App]) -> None:
    """A job with options keeps its spec in the jobs hash (its list entry is its id); a job without a key waits
    under key '' once the queue holds keyed ones, and reads as pending."""
    app = make_app()
    task = keyed_task(app, limit=1)

    @app.task(name="plain")
    def plain(ctx: object) -> None: ...

    b, rdb = app.broker, app.broker.sync
    k, pfx = b.keys.queue("default"), b.keys.keyed("default")
    ids = [task.with_options(job_id=f"stored-{i}").enqueue(account="7", n=i) for i in range(3)]
    others = [plain.enqueue() for _ in range(2)]
    b.run(b.fetch("default", 1, b.clock() + 60_000, "t1"))
    assert rdb.lrange(pfx + "q:account:7", 0, -1) == [ids[2].encode(), ids[1].encode()]  # ids, specs in the hash
    assert b.job_state("default", ids[1]) == "waiting for its key's slot: account:7"
    assert b.job_state("default", others[1]) == "pending"
    assert jobs.cancel_job(app, ids[1]) == ("default", "waiting for its key's slot: account:7")
    assert jobs.cancel_job(app, others[1]) == ("default", "pending")
    assert not rdb.hexists(k.jobs, ids[1]) and queue_info(b, "default")["pending"] == 2
    assert jobs.purge_queue(app, "default") == (2, 0)
    assert not rdb.hexists(k.jobs, ids[2]) and rdb.hexists(k.jobs, ids[0])  # the running job keeps its record
    assert rdb.exists(pfx + "ring", pfx + "parked", pfx + "q:account:7", pfx + "q:") == 0
    assert int(rdb.hget(k.stats, "keyed_waiting") or 0) == 0
