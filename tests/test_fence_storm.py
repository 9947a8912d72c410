"""A database blip during fenced jobs run by real worker processes: for 5 s every connection of the workers'
engine is terminated (PostgreSQL ``pg_terminate_backend`` by the workers' own ``application_name``, MariaDB
``KILL`` of the connection ids they recorded), while 30 orders are charged through a strict fence.

Required: no double effect; at least 28 orders completed with no person involved; any other order in doubt,
dead-lettered with reason ``in_doubt`` and kept in ``ringfence_failed_jobs``.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
import uuid
from collections import Counter

import orjson
import pytest
import sqlalchemy as sa

from support import SERVERS, database_answering, wait_until

pytestmark = pytest.mark.slow

ORDERS, STORM_S = 30, 5.0


class Storm:
    """Kills the workers' connections in a loop (only theirs), counting the kills."""

    def __init__(self, dialect: str, admin: sa.Engine, app_name: str, rdb, conn_ids_key: str) -> None:
        self.dialect, self.admin, self.app_name, self.rdb, self.key = dialect, admin, app_name, rdb, conn_ids_key
        self.kills = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + STORM_S
        with self.admin.connect() as c:
            while time.monotonic() < deadline and not self.stop.is_set():
                self.kills += self._round(c)
                time.sleep(0.05)

    def _round(self, c: sa.Connection) -> int:
        if self.dialect == "postgresql":
            return len(c.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                         "WHERE application_name = :app AND pid <> pg_backend_pid()"),
                                 {"app": self.app_name}).fetchall())
        killed = 0
        for raw in self.rdb.smembers(self.key):
            try:
                c.execute(sa.text(f"KILL {int(raw)}"))
                killed += 1
            except sa.exc.DBAPIError:  # already gone (killed before, or closed by its pool)
                self.rdb.srem(self.key, raw)
        return killed


def drain(pipe) -> list[str]:
    """Read a worker's output as it comes, in a thread; the lines read so far."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.decode(errors="replace") for line in pipe),
                     daemon=True).start()
    return lines


@pytest.fixture(params=list(SERVERS))
def storm_app(request, redis_url, namespace, tmp_path):
    dialect = request.param
    app_name = f"rf-storm-{uuid.uuid4().hex[:8]}"
    url = SERVERS[dialect] + (f"?application_name={app_name}" if dialect == "postgresql" else "")
    admin = sa.create_engine(database_answering(dialect, SERVERS[dialect]), isolation_level="AUTOCOMMIT")
    os.environ.update(RINGFENCE_NAMESPACE=namespace, RINGFENCE_REDIS_URL=redis_url, FENCE_URL=url,
                      FENCE_PROVIDER_DB=str(tmp_path / "provider.db"))  # the workers' FakeProvider file
    import stormapp

    mod = importlib.reload(stormapp)
    from ringfence.fence import create_all

    create_all(admin)
    mod.md.create_all(admin)
    with admin.begin() as c:
        c.execute(sa.insert(mod.orders), [{"id": i} for i in range(ORDERS)])
    jobs: list[str] = []
    yield mod, dialect, admin, app_name, url, jobs
    mod.md.drop_all(admin)
    fences, failed = mod.app.fence_store.table, mod.app.failed_jobs.table
    with admin.begin() as c:  # shared tables: remove only this run's rows
        c.execute(sa.delete(fences).where(fences.c.subject.like(f"{namespace}:%")))
        if jobs:
            c.execute(sa.delete(failed).where(failed.c.job_id.in_(jobs)))
    admin.dispose()
    mod.engine().dispose()


def test_connections_killed_for_5s_during_30_fenced_jobs(storm_app, spawn_worker, rdb, namespace) -> None:
    mod, dialect, admin, app_name, url, jobs = storm_app
    env = {"FENCE_URL": url}
    workers = [spawn_worker("--app", "stormapp:app", "-c", "3", env=env) for _ in range(2)]
    logs = [drain(w.proc.stdout) for w in workers]  # a full pipe would block the workers' logging
    broker = mod.app.broker
    wait_until(lambda: len(broker.servers()) == 2, timeout=30)
    storm = Storm(dialect, admin, app_name, rdb, mod.CONN_IDS)
    storm.thread.start()
    jobs += [mod.charge.enqueue(order_id=i) for i in range(ORDERS)]
    storm.thread.join(STORM_S + 5)
    settled = lambda: (broker.queue_counts("default")["stats"].get("processed", 0)  # noqa: E731
                       + broker.queue_counts("default")["dead"])
    try:
        wait_until(lambda: settled() == ORDERS, timeout=90, interval=0.2)
    except AssertionError:
        raise AssertionError(f"jobs did not settle: {broker.queue_counts('default')}; worker output:\n"
                             + "".join(line for lines in logs for line in lines[-40:])) from None

    charges = mod.provider.records()
    per_key = Counter(c.key for c in charges)  # the provider ignores keys: a second call is a second charge
    ref_of = {c.key: c.id for c in charges}
    with admin.connect() as c:
        charged = dict(c.execute(sa.select(mod.orders.c.id, mod.orders.c.charge_id)).all())
    dead = {i: orjson.loads(raw) for i, raw in broker.dead_records("default", broker.dead_ids("default"))}
    failed = {r["job_id"]: r for r in mod.app.failed_jobs.unreplayed(jobs)}
    completed, in_doubt = 0, 0
    for order_id, job in enumerate(jobs):
        row = mod.app.fence_store.get(f"{namespace}:order:{order_id}", "charge")
        assert row is not None, f"order {order_id}: no fence"
        if str(row.state) == "completed":
            assert charged[order_id] == ref_of[row.provider_key] and per_key[row.provider_key] == 1
            completed += 1
        else:  # parked for a person, with the reason in both dead-letters
            assert str(row.state) == "in_doubt", f"order {order_id}: fence {row.state}, job dead: {dead.get(job)}"
            assert dead[job]["reason"] == "in_doubt" and failed[job]["reason"] == "in_doubt"
            in_doubt += 1
    burnt = broker.queue_counts("default")["stats"].get("failed", 0)
    print(f"\n{dialect}: {storm.kills} connections killed in {STORM_S:g}s; {completed} completed, "
          f"{in_doubt} in doubt, {burnt} failed attempts")
    assert max(per_key.values()) == 1, f"double effects: { {k: v for k, v in per_key.items() if v > 1} }"
    assert storm.kills >= 20, f"the storm killed only {storm.kills} connections"
    assert completed >= 28 and completed + in_doubt == ORDERS
    for w in workers:
        assert w.proc.poll() is None, "a worker died during the storm"
