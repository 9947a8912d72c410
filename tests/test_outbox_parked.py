"""Rows the relay cannot send hold no other row back, on SQLite, PostgreSQL and MariaDB: a durable row no replica
confirms (a private redis-server with no replica) and rows it cannot send as they are (a bad job id or queue
name, an unreadable job) are parked with the reason, shown by `ringfence outbox status`, `info` and the doctor,
while every other row is sent once, in order. A row sent once is never sent again, however long its sent record
was kept; `ringfence outbox retry` gives a parked row back to the relay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import orjson
import pytest
import redis
import sqlalchemy as sa

import outbox_helpers
from outbox_helpers import rows
from ringfence import App, faults
from ringfence.metrics import serve_exporter
from ringfence.outbox import OUTBOX_TABLE
from ringfence.outbox.lag import outbox_lag
from ringfence.outbox.relay import Relay
from ringfence.redis.embedded import EmbeddedRedis, free_port
from support import ROOT, kill_at, wait_until
from test_metrics import scrape

db = outbox_helpers.db  # the fixture: SQLite, PostgreSQL and MariaDB


class Cli:
    """The `ringfence` CLI as a user runs it, on tests/outboxapp.py, the test's Redis and database."""

    def __init__(self, namespace: str, redis_url: str, engine: sa.Engine) -> None:
        self.env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
                    "RINGFENCE_FENCE_URL": engine.url.render_as_string(hide_password=False),
                    "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.workers: list[subprocess.Popen[bytes]] = []

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ringfence.cli", *args, "--app", "outboxapp:app"], env=self.env,
                              capture_output=True, text=True, timeout=120)

    def json(self, *args: str) -> dict[str, object]:
        res = self.run(*args, "--json")
        assert res.returncode in (0, 1, 2) and res.stdout.startswith("{"), res.stdout + res.stderr
        found: dict[str, object] = orjson.loads(res.stdout)
        return found

    def worker(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--queues", "q1,q2", "--concurrency",
                                 "1", "--no-alerts", "--app", "outboxapp:app"], env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        self.workers.append(proc)
        return proc

    def stop(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)


@pytest.fixture
def lone(private_redis: EmbeddedRedis) -> str:
    """A Redis with no replica: WAIT 1 answers 0."""
    return private_redis.url


@pytest.fixture
def cli(db: sa.Engine, namespace: str, lone: str) -> Iterator[Cli]:
    c = Cli(namespace, lone, db)
    yield c
    c.stop()


def _app(engine: sa.Engine, redis_url: str, namespace: str, **kw: object) -> App:
    app = App(redis_url, namespace, fence_url=engine.url.render_as_string(hide_password=False), **kw)  # type: ignore[arg-type]

    @app.task(queue="q1", name="record")
    def record(ctx, n: int) -> None: ...

    @app.task(queue="q2", name="record2")
    def record2(ctx, n: int) -> None: ...

    return app


def _pending(rdb: redis.Redis, app: App, queue: str) -> list[str]:
    """Ids in the queue in the order workers take them (an inline entry is '<id><spec>')."""
    entries = reversed(rdb.lrange(app.broker.keys.queue(queue).pending, 0, -1))
    return [e.decode().split("{", 1)[0] for e in entries]


def _good(app: App, conn: sa.Connection, numbers: range) -> list[str]:
    tasks = [app.registry.get("record"), app.registry.get("record2")]
    return [tasks[n % 2].enqueue_in(conn, n=n) for n in numbers]


def test_a_durable_row_no_replica_confirms_is_parked_and_the_others_are_sent_once(db, cli, lone, namespace) -> None:
    app = _app(db, lone, namespace)
    rdb = redis.Redis.from_url(lone)
    with db.begin() as conn:
        durable = app.registry.get("record").with_options(durable=True).enqueue_in(conn, n=0)
        good = _good(app, conn, range(1, 21))
    res = cli.run("relay", "--once", "--batch", "5")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "relayed 21 row(s) (20 sent, 0 refused as sent before, 1 parked" in res.stdout, res.stdout
    # Every good row is in Redis once, in order; the durable job too (the master took it; no replica confirmed it).
    assert _pending(rdb, app, "q1") == [durable, *good[1::2]] and _pending(rdb, app, "q2") == good[0::2]
    [row] = rows(db, namespace)
    assert row["job_id"] == durable and row["parked_at"] is not None
    assert "NotReplicated" in row["parked_reason"] and "0 of 1 replica(s)" in row["parked_reason"]

    status = cli.json("outbox", "status")
    assert status["waiting"] == 0 and status["parked"] == 1
    assert [(r["id"], r["job_id"]) for r in status["parked_rows"]] == [(row["id"], durable)]  # type: ignore[attr-defined]
    assert cli.json("info")["outbox"]["parked"] == 1  # type: ignore[index]
    metrics = serve_exporter(app.broker, free_port(), "127.0.0.1", outbox=lambda: outbox_lag(app))
    try:
        assert scrape(metrics.server_port)[("ringfence_outbox_parked", ())] == 1
    finally:
        metrics.shutdown()
    report = cli.json("doctor", "--sample-s", "0.01")
    [parked] = [f for f in report["findings"] if f["check"] == "outbox_parked"]  # type: ignore[attr-defined]
    assert parked["status"] == "failure" and durable in parked["symptom"] and report["exit_code"] == 2

    # Long after the sent records would have expired, a relay sends nothing again: the database knows.
    time.sleep(0.3)
    again = Relay(app, engine=db, lease_s=0.05, keep_s=0.2)
    assert again.run(once=True) == 0 and again.counts.sent == again.counts.refused == 0
    assert _pending(rdb, app, "q1") == [durable, *good[1::2]] and _pending(rdb, app, "q2") == good[0::2]
    stats = [app.broker.keys.queue(q).stats for q in ("q1", "q2")]
    assert sum(int(rdb.hget(k, "enqueued") or 0) for k in stats) == 21


def test_a_row_sent_before_a_crash_is_refused_however_long_its_record_was_kept(db, rdb, redis_url,
                                                                              namespace) -> None:
    """The relay dies after sending, before its delete commits; the next relay comes after keep_s: the record
    of a row that still waits is kept, so Redis refuses the copy."""
    app = _app(db, redis_url, namespace)
    with db.begin() as conn:
        _good(app, conn, range(4))
    with kill_at("relay_after_send"), pytest.raises(faults.SimulatedKill):
        Relay(app, engine=db, lease_s=0.05, keep_s=0.2).step()
    for queue in ("q1", "q2"):  # the first copies ran and were forgotten
        rdb.delete(app.broker.keys.queue(queue).pending)
    time.sleep(0.3)
    again = Relay(app, engine=db, lease_s=0.05, keep_s=0.2)
    assert again.run(once=True) == 4 and again.counts.refused == 4 and again.counts.sent == 0
    assert _pending(rdb, app, "q1") == [] and _pending(rdb, app, "q2") == [] and rows(db, namespace) == []
    assert [rdb.zcard(app.broker.keys.queue(q).outbox_sent) for q in ("q1", "q2")] == [0, 0]


def _insert(engine: sa.Engine, namespace: str, job_id: str, queue: str, task: str, spec: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {OUTBOX_TABLE} (namespace, job_id, queue, task, spec, created_at) "
                             "VALUES (:ns, :job_id, :queue, :task, :spec, CURRENT_TIMESTAMP)"),
                     {"ns": namespace, "job_id": job_id, "queue": queue, "task": task, "spec": spec})


def test_rows_the_relay_cannot_send_as_they_are_are_parked_with_the_reason(db, cli, lone, namespace) -> None:
    """Rows written by hand (or another program) between good ones: each bad one parked with its reason, the
    good ones and the one with an unknown task sent in order; a worker runs them and dead-letters only the
    unknown task, with no phantom job."""
    app = _app(db, lone, namespace)
    rdb = redis.Redis.from_url(lone)
    spec = '{"t":"record","v":1,"e":1.0,"a":{"n":%d}}'
    with db.begin() as conn:
        first = _good(app, conn, [0])
    _insert(db, namespace, "poison{brace", "q1", "record", spec % 2)
    _insert(db, namespace, "ok-id", "bad queue!", "record", spec % 3)
    _insert(db, namespace, "garbled", "q1", "record", "not json")
    _insert(db, namespace, "listed", "q1", "record", "[1, 2]")
    _insert(db, namespace, "stranger", "q1", "nope", '{"t":"nope","v":1,"e":1.0,"a":{}}')
    with db.begin() as conn:
        last = _good(app, conn, [6])
    res = cli.run("relay", "--once", "--batch", "3")
    assert res.returncode == 0 and "relayed 7 row(s) (3 sent, 0 refused as sent before, 4 parked" in res.stdout, \
        res.stdout + res.stderr
    assert _pending(rdb, app, "q1") == [first[0], "stranger", last[0]] and _pending(rdb, app, "q2") == []
    parked = {r["job_id"]: r["parked_reason"] for r in rows(db, namespace)}
    assert set(parked) == {"poison{brace", "ok-id", "garbled", "listed"}
    assert parked["poison{brace"].startswith("job id 'poison{brace' must ")
    assert parked["ok-id"].startswith("queue 'bad queue!' must ")
    assert parked["garbled"].startswith("unreadable job: spec is not valid JSON")
    assert parked["listed"].startswith("unreadable job: spec is a list, expected a JSON object")
    status = cli.json("outbox", "status")
    assert status["parked"] == 4 and [r["job_id"] for r in status["parked_rows"]] == [  # type: ignore[attr-defined]
        "poison{brace", "ok-id", "garbled", "listed"]

    cli.worker()
    dead = app.broker.keys.queue("q1").dead
    wait_until(lambda: rdb.zcard(dead) == 1 and rdb.llen(app.broker.keys.queue("q1").pending) == 0, timeout=30)
    time.sleep(0.3)  # a phantom job, if any, would be dead by now too
    assert [x.decode() for x in rdb.zrange(dead, 0, -1)] == ["stranger"]


def test_retry_gives_a_parked_row_back_and_a_sent_one_is_refused(db, cli, lone, namespace) -> None:
    """A parked durable row, retried while there is still no replica, is refused as sent before (its record is
    kept while the row is there) and parked again: its job is in Redis once. A row id that is not parked is
    named."""
    app = _app(db, lone, namespace)
    rdb = redis.Redis.from_url(lone)
    with db.begin() as conn:
        durable = app.registry.get("record").with_options(durable=True).enqueue_in(conn, n=0)
    assert cli.run("relay", "--once").returncode == 0
    [row] = rows(db, namespace)
    res = cli.run("outbox", "retry", str(row["id"]))
    assert res.returncode == 0 and "1 of 1 row(s) back to the relay" in res.stdout, res.stdout + res.stderr
    assert rows(db, namespace)[0]["parked_at"] is None
    res = cli.run("relay", "--once")
    assert "relayed 1 row(s) (0 sent, 0 refused as sent before, 1 parked" in res.stdout, res.stdout + res.stderr
    assert _pending(rdb, app, "q1") == [durable] and rows(db, namespace)[0]["parked_at"] is not None
    assert int(rdb.hget(app.broker.keys.queue("q1").stats, "outbox_refused")) == 1
    res = cli.run("outbox", "retry", "999999999", str(row["id"]))
    assert res.returncode == 2 and "1 of 2 row(s) back to the relay" in res.stdout, res.stdout + res.stderr
    assert f"row id(s) 999999999 are not parked rows of namespace {namespace}" in res.stderr, res.stderr


def test_a_replica_wait_longer_than_the_socket_timeout_is_not_an_unreachable_redis(private_redis, tmp_path,
                                                                                   namespace) -> None:
    """replica_timeout_s above the socket timeout: a durable enqueue raises NotReplicated, and the relay parks its
    row with that reason (before: a socket timeout, reported as Redis unreachable)."""
    from ringfence.errors import NotReplicated
    from ringfence.outbox import create_outbox

    engine = sa.create_engine(f"sqlite:///{tmp_path}/app.db")
    create_outbox(engine)
    app = _app(engine, f"{private_redis.url}?socket_timeout=0.2", namespace, replica_timeout_s=0.5)
    record = app.registry.get("record").with_options(durable=True)
    started = time.monotonic()
    with pytest.raises(NotReplicated, match=r"0 of 1 replica\(s\) confirmed within 500 ms"):
        record.enqueue(n=1)
    assert time.monotonic() - started >= 0.45  # it waited the whole timeout
    with engine.begin() as conn:
        record.enqueue_in(conn, n=2)
    relay = Relay(app, engine=engine)
    assert relay.run(once=True) == 1 and relay.counts.parked == 1
    assert "NotReplicated" in rows(engine, namespace)[0]["parked_reason"]


def test_an_outbox_table_made_before_the_parked_columns_gets_them_from_init(db, namespace) -> None:
    """The relay names the missing columns and the command; `outbox init` adds them (on each database)."""
    import uuid

    from ringfence.errors import ConfigError
    from ringfence.outbox import create_outbox
    from ringfence.outbox.schema import LATER_COLUMNS, outbox_table
    from ringfence.outbox.store import OutboxStore

    name = f"old_o_{uuid.uuid4().hex[:8]}"
    md = sa.MetaData()
    old = outbox_table(md, name)
    for col in LATER_COLUMNS:
        old._columns.remove(old.c[col])
    md.create_all(db)
    try:
        store = OutboxStore(db, namespace, table_name=name)
        with pytest.raises(ConfigError, match=r"has no parked_at, parked_reason column\(s\); add them with "
                                              r"`ringfence outbox init"):
            store.check()
        create_outbox(db, table_name=name)
        create_outbox(db, table_name=name)  # idempotent
        store.check()
        assert [c["name"] for c in sa.inspect(db).get_columns(name)][-2:] == list(LATER_COLUMNS)
    finally:
        with db.begin() as c:
            c.execute(sa.text(f"DROP TABLE IF EXISTS {name}"))

