"""The Redis dead-letter and the failed_jobs table agree: per namespace, deleted and pruned together, SQL-only
jobs listed, and the row survives a SIGKILL between the two writes. Real Redis, real databases, real CLI."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, create_engine, insert, select, text

from ringfence import App
from ringfence.cli import main as cli
from ringfence.fence.failed import FailedJobs
from ringfence.models import DeadJob
from support import DATABASES, database_url, wait_until


@pytest.fixture(params=list(DATABASES))
def fence_url(request, tmp_path) -> str:
    return database_url(request.param, tmp_path)


def cli_run(namespace: str, redis_url: str, fence_url: str, *args: str) -> Result:
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": fence_url}
    return CliRunner().invoke(cli, list(args), env=env)


def dead_app(redis_url: str, namespace: str, fence_url: str) -> App:
    app = App(redis_url, namespace, fence_url=fence_url)
    app.fence_store.create_all()
    app.failed_jobs.create_all()
    return app


def kill_job(app: App, job_id: str, queue: str = "default", reason: str = "permanent") -> None:
    """A job reaches dead-letter the way the worker does it: the Redis script with its row owed, then the row."""
    b = app.broker
    spec = orjson.dumps({"t": "doomed", "v": 1, "e": 1.0, "a": {"n": 1}})
    b.run(b.enqueue(queue, [(job_id, spec, 0)]))
    b.register_queues([queue])
    [(got, _, _)] = b.run(b.fetch(queue, 1, b.clock() + 60_000, "tok"))
    assert got == job_id
    assert b.run(b.dead(queue, job_id, "tok", {"attempt": 1}, {"reason": reason, "error": "E", "traceback": "",
                                                                 "task": "doomed", "queue": queue}, durable=True))
    app.failed_jobs.record(DeadJob(job_id, queue, "doomed", {"n": 1}, reason, "E", "", 1, b.clock(), []),
                           orjson.loads(spec))


def rows(app: App, job_id: str) -> list[dict[str, Any]]:
    t = app.failed_jobs.table
    with app.failed_jobs.engine.connect() as c:
        return [dict(r) for r in c.execute(select(t).where(t.c.job_id == job_id)).mappings()]


def test_namespaces_never_touch_each_others_jobs(redis_url, fence_url, rdb) -> None:
    a_ns, b_ns = f"ta{uuid.uuid4().hex[:8]}", f"tb{uuid.uuid4().hex[:8]}"
    a, b = dead_app(redis_url, a_ns, fence_url), dead_app(redis_url, b_ns, fence_url)
    try:
        kill_job(a, f"{a_ns}-1")
        kill_job(b, f"{b_ns}-1")
        for ns in (a_ns, b_ns):  # Redis lost everything: only the table is left
            rdb.delete(*rdb.scan_iter(f"{ns}:*"))
        listed = orjson.loads(cli_run(a_ns, redis_url, fence_url, "dead", "list", "--json").output)
        assert [(j["id"], j["source"]) for j in listed] == [(f"{a_ns}-1", "sql")]
        res = cli_run(a_ns, redis_url, fence_url, "dead", "replay", "--all")
        assert res.exit_code == 0 and "replayed 1 job(s) (1 restored" in res.output, res.output
        assert b.failed_jobs.unreplayed([f"{b_ns}-1"])  # untouched
        assert a.broker.job_spec("default", f"{a_ns}-1") is not None
        assert b.broker.job_spec("default", f"{b_ns}-1") is None
        res = cli_run(a_ns, redis_url, fence_url, "dead", "delete", f"{b_ns}-1")
        assert res.exit_code == 2 and "not in dead-letter" in res.output
        assert len(rows(b, f"{b_ns}-1")) == 1
    finally:
        a.failed_jobs.delete([f"{a_ns}-1"])
        b.failed_jobs.delete([f"{b_ns}-1"])
        for ns in (a_ns, b_ns):
            keys = list(rdb.scan_iter(f"{ns}:*"))
            if keys:
                rdb.delete(*keys)


def test_delete_and_prune_remove_both_copies(redis_url, fence_url, namespace) -> None:
    app = dead_app(redis_url, namespace, fence_url)
    for i in range(3):
        kill_job(app, f"{namespace}-{i}")
    res = cli_run(namespace, redis_url, fence_url, "dead", "delete", f"{namespace}-0")
    assert res.exit_code == 0 and "deleted 1 job(s)" in res.output, res.output
    assert rows(app, f"{namespace}-0") == [] and app.broker.queue_counts("default")["dead"] == 2
    res = cli_run(namespace, redis_url, fence_url, "dead", "replay", "--all")
    assert "replayed 2 job(s)" in res.output, res.output  # the deleted job does not come back
    assert app.broker.job_spec("default", f"{namespace}-0") is None
    # Both die again; pruning everything (0 days) empties Redis and the table alike.
    b = app.broker
    assert len(b.run(b.fetch("default", 2, b.clock() + 60_000, "t"))) == 2
    for i in (1, 2):
        assert b.run(b.dead("default", f"{namespace}-{i}", "t", {}, {"reason": "permanent"}))
        app.failed_jobs.record(DeadJob(f"{namespace}-{i}", "default", "doomed", {}, "permanent", "", "", 1, 0, []),
                               {"t": "doomed", "v": 1, "e": 1.0, "a": {}})
    res = cli_run(namespace, redis_url, fence_url, "dead", "prune", "--older-than-days", "-1")
    assert res.exit_code == 2 and "must be >= 0" in res.output
    assert app.broker.queue_counts("default")["dead"] == 2
    res = cli_run(namespace, redis_url, fence_url, "dead", "prune", "--older-than-days", "0")
    # Four rows: each job's first death (replayed) and its second.
    assert res.exit_code == 0 and "deleted 2 job(s) (4 failed_jobs row(s))" in res.output, res.output
    assert app.broker.queue_counts("default")["dead"] == 0
    assert all(rows(app, f"{namespace}-{i}") == [] for i in range(3))


def test_sql_only_jobs_are_listed_shown_and_deletable(redis_url, fence_url, namespace, rdb) -> None:
    app = dead_app(redis_url, namespace, fence_url)
    kill_job(app, f"{namespace}-1")
    kill_job(app, f"{namespace}-2")
    rdb.delete(*rdb.scan_iter(f"{namespace}:*"))
    app.broker.register_queues(["default"])
    res = cli_run(namespace, redis_url, fence_url, "dead", "list")
    assert res.exit_code == 0 and res.output.count("(sql only)") == 2, res.output
    shown = orjson.loads(cli_run(namespace, redis_url, fence_url, "dead", "show", f"{namespace}-1").output)
    assert shown["source"] == "sql" and shown["args"] == {"n": 1}
    res = cli_run(namespace, redis_url, fence_url, "dead", "delete", "--all")
    assert "deleted 2 job(s)" in res.output, res.output
    assert orjson.loads(cli_run(namespace, redis_url, fence_url, "dead", "list", "--json").output) == []


def test_replay_all_works_in_batches(redis_url, namespace, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/f.db"
    app = dead_app(redis_url, namespace, url)
    b = app.broker
    n = 1203  # more than two batches of 500
    spec = orjson.dumps({"t": "doomed", "v": 1, "e": 1.0, "a": {}})
    b.run(b.enqueue("default", [(f"j{i}", spec, 0) for i in range(n)]))
    b.register_queues(["default"])
    got = b.run(b.fetch("default", n, b.clock() + 60_000, "tok"))
    for job_id, _, _ in got:
        b.run(b.dead("default", job_id, "tok", {}, {"reason": "permanent"}))
    res = cli_run(namespace, redis_url, url, "dead", "replay", "--all")
    assert res.exit_code == 0 and f"replayed {n} job(s)" in res.output, res.output
    assert b.queue_counts("default")["pending"] == n


def test_an_old_table_is_upgraded_and_fence_init_assigns_its_rows(redis_url, namespace, tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    engine = create_engine(url)
    old = Table("ringfence_failed_jobs", MetaData(), Column("id", Integer, primary_key=True),
                Column("job_id", String(255), nullable=False), Column("queue", String(255), nullable=False),
                Column("task", String(255), nullable=False), Column("payload", String, nullable=False),
                Column("reason", String(64), nullable=False), Column("error", String),
                Column("traceback", String), Column("attempts", Integer, nullable=False),
                Column("history", String), Column("died_at", DateTime, nullable=False),
                Column("replayed_at", DateTime))
    old.metadata.create_all(engine)
    with engine.begin() as c:
        c.execute(insert(old).values(job_id="legacy", queue="default", task="t", payload='{"t":"t","e":1,"a":{}}',
                                     reason="permanent", attempts=1, died_at=text("CURRENT_TIMESTAMP")))
    failed = FailedJobs(engine, namespace=namespace)
    assert failed.unreplayed() == []  # the lazy upgrade added the column; the old row has no namespace yet
    res = cli_run(namespace, redis_url, url, "fence", "init")
    assert res.exit_code == 0 and f"1 row(s) without a namespace now belong to namespace {namespace}" in res.output
    assert [r["job_id"] for r in failed.unreplayed()] == ["legacy"]


def killed_at(point: str, n: int, fence_url: str, spawn_worker, namespace: str, redis_url: str) -> tuple[App, str]:
    """A doomed job whose worker SIGKILLs itself at fault point ``point``."""
    os.environ.update(FENCE_URL=fence_url, RINGFENCE_NAMESPACE=namespace)
    app = dead_app(redis_url, namespace, fence_url)
    job = app.enqueue_many(_doomed(app), [{"n": n}])[0]
    w = spawn_worker("--app", "durableapp:app", env={"FENCE_URL": fence_url, "RINGFENCE_FAULTS": point})
    assert w.wait(60) == -signal.SIGKILL
    return app, job


def test_the_row_survives_a_kill_between_the_two_writes(fence_url, spawn_worker, namespace, redis_url, rdb) -> None:
    app, job = killed_at("after_dead_letter", 7, fence_url, spawn_worker, namespace, redis_url)
    k = app.broker.keys.queue("default")
    assert app.broker.queue_counts("default")["dead"] == 1
    assert rdb.zscore(k.durable, job) is not None and rows(app, job) == []  # the kill left the row owed
    spawn_worker("--app", "durableapp:app", env={"FENCE_URL": fence_url})
    wait_until(lambda: rows(app, job), timeout=40)
    wait_until(lambda: rdb.zcard(k.durable) == 0, timeout=10)
    [row] = rows(app, job)
    assert row["namespace"] == namespace and row["reason"] == "permanent" and row["payload"]["a"] == {"n": 7}
    app.failed_jobs.delete([job])


def test_a_kill_before_the_dead_letter_leaves_it_to_the_next_attempt(fence_url, spawn_worker, namespace,
                                                                      redis_url) -> None:
    app, job = killed_at("before_dead_letter", 8, fence_url, spawn_worker, namespace, redis_url)
    counts = app.broker.queue_counts("default")
    assert counts["dead"] == 0 and counts["active"] == 1 and rows(app, job) == []  # nothing written, nothing lost
    # the next worker recovers the lapsed lease, and attempt 2 dead-letters the job
    spawn_worker("--app", "durableapp:app", env={"FENCE_URL": fence_url})
    [row] = wait_until(lambda: rows(app, job), timeout=40)
    assert row["reason"] == "permanent" and row["attempts"] == 2 and row["payload"]["a"] == {"n": 8}
    assert app.broker.queue_counts("default")["dead"] == 1
    app.failed_jobs.delete([job])


def _doomed(app: App) -> Any:
    @app.task(name="doomed")
    async def doomed(ctx, n: int) -> None: ...

    return doomed



async def test_worker_retention_prunes_both_copies(redis_url, namespace, tmp_path) -> None:
    import asyncio
    import dataclasses

    from ringfence.worker.worker import Worker
    from support import FAST

    app = dead_app(redis_url, namespace, f"sqlite:///{tmp_path}/r.db")
    app.worker_settings = dataclasses.replace(FAST, dead_retention_s=0.5)
    kill_job(app, "old")
    await asyncio.sleep(0.6)
    worker = Worker(app, [("default", 1)])
    runner = asyncio.create_task(worker.run())
    try:
        for _ in range(200):
            if not rows(app, "old") and app.broker.queue_counts("default")["dead"] == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    assert rows(app, "old") == [] and app.broker.queue_counts("default")["dead"] == 0


def test_a_missing_table_reads_as_empty_until_it_exists(fence_url) -> None:
    failed = FailedJobs(fence_url, namespace="x", table_name=f"fj_{uuid.uuid4().hex[:8]}")
    try:
        assert failed.unreplayed() == [] and failed.delete(["a"]) == 0 and failed.prune(0) == 0
        failed.create_all()
        failed.record(DeadJob("a", "q", "t", {}, "permanent", "", "", 1, 0, []), {"t": "t", "e": 1, "a": {}})
        assert [r["job_id"] for r in failed.unreplayed()] == ["a"]
    finally:
        failed.table.drop(failed.engine, checkfirst=True)
        failed.engine.dispose()
