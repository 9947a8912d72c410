"""After the run: copy what every party recorded into the driver's ledger (SQLite), in batches.

Sources: the provider's ledger (attached as ``p``), the app's database (fences, orders, acks, failed jobs),
the private Redis (jobs still queued, dead jobs), and the driver's own events. Memory stays bounded for
any number of orders: rows stream through in chunks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import redis
from sqlalchemy import Engine, select

from bench.chaos.app import QUEUE, done, orders
from bench.chaos.faults import Event
from ringfence.fence.schema import FAILED_JOBS_TABLE, failed_jobs_table, fence_table
from ringfence.redis.keys import Keys, split_entry

CHUNK = 5000
TABLES = """
CREATE TABLE fences (order_id INTEGER PRIMARY KEY, state TEXT, reference TEXT, epoch INTEGER, owner TEXT);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY, provider TEXT, charge_id TEXT);
CREATE TABLE acked (job_id TEXT PRIMARY KEY, outcome TEXT);
CREATE TABLE failed (job_id TEXT, reason TEXT, error TEXT);
CREATE TABLE queued (job_id TEXT PRIMARY KEY);
CREATE TABLE dead (job_id TEXT PRIMARY KEY, reason TEXT, error TEXT);
CREATE TABLE events (kind TEXT, t0 REAL, t1 REAL, detail TEXT);
CREATE TABLE pids (kind TEXT, pid INTEGER, t_end REAL);
"""


def _chunks(rows: Iterable[Any]) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for row in rows:
        chunk.append(tuple(row))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _copy(ledger: sqlite3.Connection, table: str, rows: Iterable[Any], width: int) -> None:
    marks = ", ".join("?" * width)
    for chunk in _chunks(rows):
        ledger.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", chunk)


def collect_database(ledger: sqlite3.Connection, engine: Engine) -> None:
    from sqlalchemy import MetaData

    md = MetaData()
    fences, failed = fence_table(md), failed_jobs_table(md, FAILED_JOBS_TABLE)
    with engine.connect() as c:
        stream = c.execution_options(yield_per=CHUNK)
        rows = stream.execute(select(fences.c.subject, fences.c.state, fences.c.reference, fences.c.epoch,
                                     fences.c.owner_job_id + ":" + fences.c.owner_token)
                              .where(fences.c.step == "charge"))
        _copy(ledger, "fences", ((int(s.removeprefix("order:")), *rest) for s, *rest in rows), 5)
        _copy(ledger, "orders", stream.execute(select(orders.c.id, orders.c.provider, orders.c.charge_id)), 3)
        acks = select(done.c.job_id, done.c.outcome).order_by(done.c.outcome.desc())  # "charged" wins
        _copy(ledger, "acked", stream.execute(acks), 2)
    with engine.connect() as c:
        rows = c.execution_options(yield_per=CHUNK).execute(select(failed.c.job_id, failed.c.reason, failed.c.error))
        for chunk in _chunks(rows):
            ledger.executemany("INSERT INTO failed VALUES (?, ?, ?)", chunk)


def collect_redis(ledger: sqlite3.Connection, r: redis.Redis, namespace: str) -> None:
    k = Keys(namespace).queue(QUEUE)
    _copy(ledger, "queued", ((key.decode(),) for key, _ in r.hscan_iter(k.jobs, count=CHUNK)), 1)
    # Inline pending jobs (keys.py) have no jobs entry; a second copy of an id is ignored.
    for first in range(0, int(r.llen(k.pending)), CHUNK):
        inline = {split_entry(e) for e in r.lrange(k.pending, first, first + CHUNK - 1)}
        ledger.executemany("INSERT OR IGNORE INTO queued VALUES (?)", [(i,) for i, spec in inline if spec is not None])
    records = ((i.decode(), orjson.loads(raw)) for i, raw in r.hscan_iter(k.dead_jobs, count=CHUNK))
    _copy(ledger, "dead", ((i, rec.get("reason", ""), rec.get("error", "")) for i, rec in records), 3)
    # A dead id without its record would hide a reason: keep it, with no reason.
    ids = ((i.decode(),) for i, _ in r.zscan_iter(k.dead, count=CHUNK))
    for chunk in _chunks(ids):
        ledger.executemany("INSERT OR IGNORE INTO dead VALUES (?, '', '')", chunk)


def collect_driver(ledger: sqlite3.Connection, events: list[Event], ends: list[tuple[str, int, float]]) -> None:
    ledger.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", [(e.kind, e.t0, e.t1, e.detail) for e in events])
    ledger.executemany("INSERT INTO pids VALUES (?, ?, ?)", ends)


def collect(ledger: sqlite3.Connection, provider_db: str, engine: Engine, r: redis.Redis, namespace: str,
            events: list[Event], ends: list[tuple[str, int, float]]) -> None:
    ledger.executescript(TABLES)
    ledger.execute("ATTACH DATABASE ? AS p", (provider_db,))
    collect_database(ledger, engine)
    collect_redis(ledger, r, namespace)
    collect_driver(ledger, events, ends)
    ledger.commit()
