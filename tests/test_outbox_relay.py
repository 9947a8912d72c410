"""The relay, in process, on SQLite, PostgreSQL and MariaDB: committed rows reach Redis once and in id order per
queue, rolled-back rows never; a re-send after a crash between send and delete is refused by Redis, even when
the first copy already ran and was forgotten; the lease lets one relay send at a time."""

from __future__ import annotations

import orjson
import pytest
import redis
import sqlalchemy as sa

import outbox_helpers
from outbox_helpers import rows
from ringfence import App, faults
from ringfence.errors import ConfigError
from ringfence.outbox.relay import Relay
from support import kill_at

db = outbox_helpers.db  # the fixture: SQLite, PostgreSQL and MariaDB


def _app(make_app, engine: sa.Engine) -> App:
    app = make_app(fence_url=engine.url.render_as_string(hide_password=False))

    @app.task(queue="orders", name="charge")
    def charge(ctx, n: int) -> None: ...

    @app.task(queue="mail", name="mail")
    def mail(ctx, n: int) -> None: ...

    return app


def _write(app: App, engine: sa.Engine, n: int, *, commit: bool = True) -> list[str]:
    """``n`` jobs alternating between the two queues, written in one transaction."""
    charge, mail = app.registry.get("charge"), app.registry.get("mail")
    with engine.connect() as conn:
        conn.begin()
        ids = [(charge if i % 2 == 0 else mail).enqueue_in(conn, n=i) for i in range(n)]
        conn.commit() if commit else conn.rollback()
    return ids


def _pending(rdb: redis.Redis, app: App, queue: str) -> list[str]:
    """Ids in the queue in the order workers take them (RPOP end first)."""
    return [x.decode() for x in reversed(rdb.lrange(app.broker.keys.queue(queue).pending, 0, -1))]


def test_committed_rows_arrive_once_in_order_rolled_back_never(make_app, db, rdb, namespace) -> None:
    app = _app(make_app, db)
    first = _write(app, db, 6)
    _write(app, db, 4, commit=False)
    second = _write(app, db, 6)
    relay = Relay(app, engine=db, batch=4)
    assert relay.run(once=True) == 12
    committed = first + second
    assert _pending(rdb, app, "orders") == committed[0::2] and _pending(rdb, app, "mail") == committed[1::2]
    assert rows(db, namespace) == [] and relay.counts.sent == 12 and relay.counts.refused == 0
    assert relay.run(once=True) == 0  # nothing is sent twice
    assert len(_pending(rdb, app, "orders")) == 6


def test_a_resend_after_a_crash_between_send_and_delete_is_refused(make_app, db, rdb, namespace) -> None:
    app = _app(make_app, db)
    ids = _write(app, db, 4)
    with kill_at("relay_after_send"), pytest.raises(faults.SimulatedKill):
        Relay(app, engine=db).step()
    assert [r["job_id"] for r in rows(db, namespace)] == ids  # rolled back: still waiting
    # The first copies run and are forgotten (as an ack does), so only the sent record can refuse the copy.
    for queue in ("orders", "mail"):
        k = app.broker.keys.queue(queue)
        rdb.delete(k.pending)
        rdb.hdel(k.jobs, *ids)
    again = Relay(app, engine=db)
    assert again.run(once=True) == 4 and again.counts.refused == 4 and again.counts.sent == 0
    assert rows(db, namespace) == [] and _pending(rdb, app, "orders") == []
    assert rdb.zcard(app.broker.keys.queue("orders").outbox_sent) == 0  # records dropped once the rows went


def test_a_crash_after_the_delete_leaves_only_sent_records(make_app, db, rdb, namespace) -> None:
    app = _app(make_app, db)
    ids = _write(app, db, 2)
    with kill_at("relay_after_mark"), pytest.raises(faults.SimulatedKill):
        Relay(app, engine=db).step()
    assert rows(db, namespace) == [] and _pending(rdb, app, "orders") == ids[:1]
    assert rdb.zcard(app.broker.keys.queue("orders").outbox_sent) == 1  # forgotten after keep_s


def test_one_relay_holds_the_lease(make_app, db) -> None:
    app = _app(make_app, db)
    ids = _write(app, db, 2)
    first, second = Relay(app, engine=db, lease_s=5), Relay(app, engine=db, lease_s=5)
    assert first.lead() and not second.lead()
    with pytest.raises(ConfigError, match="another relay holds the outbox lease"):
        Relay(app, engine=db, lease_s=0.2).run(once=True)
    first.release()
    assert second.run(once=True) == len(ids)


def test_the_lag_counts_waiting_rows_and_their_age(make_app, db) -> None:
    app = _app(make_app, db)
    relay = Relay(app, engine=db)
    assert relay.lag().waiting == 0 and relay.lag().oldest_s == 0
    _write(app, db, 3)
    lag = relay.lag()
    assert lag.waiting == 3 and 0 <= lag.oldest_s < 30
    relay.run(once=True)
    assert relay.lag().waiting == 0


def test_a_relay_without_the_lease_cannot_send_rows_another_is_sending(make_app, db, rdb, namespace) -> None:
    """The row locks, not the lease, keep two relays from sending the same rows: the second one's batch waits
    for the first one's commit, then finds the rows gone."""
    import threading

    app = _app(make_app, db)
    ids = _write(app, db, 4)
    read, go = threading.Event(), threading.Event()
    holder = threading.current_thread()

    def hook(name: str) -> None:
        if name == "relay_after_send" and threading.current_thread() is holder:
            read.set()
            assert go.wait(10)

    first, second = Relay(app, engine=db), Relay(app, engine=db)
    taken: list[int] = []
    with faults.inject(hook):
        other = threading.Thread(target=lambda: (read.wait(10), taken.append(second.step())))
        other.start()
        timer = threading.Timer(0.5, go.set)  # let the second relay block on the locked rows meanwhile
        timer.start()
        assert first.step() == 4
        other.join(20)
    assert taken == [0] and second.counts.sent == second.counts.refused == 0
    assert sorted(_pending(rdb, app, "orders") + _pending(rdb, app, "mail")) == sorted(ids)
    assert rows(db, namespace) == []


def test_relay_once_exits_2_while_another_relay_holds_the_lease(make_app, db) -> None:
    from click.testing import CliRunner

    from ringfence.cli import main as cli

    app = _app(make_app, db)
    _write(app, db, 1)
    holder = Relay(app, engine=db)
    assert holder.lead()
    env = {"RINGFENCE_REDIS_URL": app.broker.url, "RINGFENCE_NAMESPACE": app.namespace,
           "RINGFENCE_FENCE_URL": str(app.fence_url)}
    res = CliRunner().invoke(cli, ["relay", "--once", "--lease-s", "0.1"], env=env)
    assert res.exit_code == 2 and f"another relay holds the outbox lease ({holder.owner})" in res.output, res.output
    holder.release()
    res = CliRunner().invoke(cli, ["relay", "--once"], env=env)
    assert res.exit_code == 0 and "relayed 1 row(s) (1 sent, 0 refused" in res.output, res.output


def test_a_delayed_job_keeps_its_time_and_a_held_id_or_unique_key_counts_as_sent(make_app, db, rdb,
                                                                                 namespace) -> None:
    app = _app(make_app, db)
    charge = app.registry.get("charge")
    taken = charge.with_options(job_id="held").enqueue(n=100)  # an id Redis already holds, another payload
    first = charge.with_options(unique_for=60, unique_key="order:{n}").enqueue(n=7)
    with db.begin() as conn:
        delayed = charge.with_options(delay_s=60).enqueue_in(conn, n=1)
        charge.with_options(job_id="held").enqueue_in(conn, n=2)
        charge.with_options(unique_for=60, unique_key="order:{n}").enqueue_in(conn, n=7)
    [row, *_] = rows(db, namespace)
    relay = Relay(app, engine=db)
    assert relay.run(once=True) == 3 and relay.counts.sent == 3 and rows(db, namespace) == []
    k = app.broker.keys.queue("orders")
    assert rdb.zscore(k.scheduled, delayed) == row["run_at_ms"]  # 60 s after enqueue_in, not after the relay
    assert orjson.loads(rdb.hget(k.jobs, taken))["a"] == {"n": 100}  # the held id keeps its job
    assert _pending(rdb, app, "orders") == [taken, first]  # no second job for the held id or the unique key


def test_sent_records_a_crash_left_are_dropped_after_keep_s(make_app, db, rdb) -> None:
    import time

    app = _app(make_app, db)
    _write(app, db, 2)
    with kill_at("relay_after_mark"), pytest.raises(faults.SimulatedKill):
        Relay(app, engine=db, lease_s=0.05, keep_s=0.2).step()
    sent = app.broker.keys.queue("orders").outbox_sent
    assert rdb.zcard(sent) == 1
    time.sleep(0.3)
    _write(app, db, 2)
    Relay(app, engine=db, lease_s=0.05, keep_s=0.2).run(once=True)
    assert rdb.zcard(sent) == 0


def test_the_application_writes_while_a_batch_is_being_sent(make_app, db, namespace) -> None:
    """PostgreSQL and MariaDB (READ COMMITTED): the app's insert into the outbox does not wait for the relay's
    locked batch. SQLite: the batch holds the database's write lock, so the app's write waits for it."""
    import sqlite3
    import threading
    import time

    app = _app(make_app, db)
    _write(app, db, 2)
    sending, done = threading.Event(), threading.Event()

    def hook(name: str) -> None:
        if name == "relay_after_send":
            sending.set()
            done.wait(3)

    relay = threading.Thread(target=lambda: Relay(app, engine=db).step())
    with faults.inject(hook):
        relay.start()
        assert sending.wait(10)
        started = time.monotonic()
        if db.dialect.name == "sqlite":
            raw = sqlite3.connect(db.url.database, timeout=0.2)
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                app.registry.get("charge").enqueue_in(raw, n=99)
                raw.commit()
            raw.close()
        else:
            _write(app, db, 1)
            assert time.monotonic() - started < 2  # did not wait for the relay's commit
        done.set()
        relay.join(10)
    assert len(rows(db, namespace)) == (0 if db.dialect.name == "sqlite" else 1)


def test_relay_once_without_redis_exits_3(make_app, db) -> None:
    from click.testing import CliRunner

    from ringfence.cli import main as cli
    from ringfence.redis.embedded import free_port

    app = _app(make_app, db)
    env = {"RINGFENCE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "RINGFENCE_NAMESPACE": app.namespace,
           "RINGFENCE_FENCE_URL": str(app.fence_url)}
    res = CliRunner().invoke(cli, ["relay", "--once"], env=env)
    assert res.exit_code == 3 and "another relay" not in res.output, res.output
