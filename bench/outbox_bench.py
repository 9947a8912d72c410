"""Outbox figures: ``task.enqueue_in`` rows/s inside one transaction, and relay rows/s (one in-process
``Relay.run(once=True)``) for two batch sizes, on PostgreSQL, MariaDB and SQLite.

Run: ``.venv/bin/python -m bench.outbox_bench [N]`` (default 5000 rows). Uses the shared services of the test
suite (PostgreSQL ``test``, MariaDB ``test``, Redis 6379) under a fresh namespace each, and removes its rows
and keys afterwards; the ``ringfence_outbox`` table is created if missing and never dropped.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid

import redis
import sqlalchemy as sa

from ringfence import App
from ringfence.outbox import OUTBOX_TABLE, create_outbox
from ringfence.outbox.relay import Relay

REDIS = "redis://127.0.0.1:6379/0"
URLS = {"postgresql": "postgresql+psycopg://root@127.0.0.1:5432/test",
        "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
        "sqlite": f"sqlite:///{tempfile.mkdtemp(prefix='ringfence-outbox-')}/app.db"}


def one(url: str, engine: sa.Engine, n: int, batch: int) -> tuple[float, float]:
    ns = f"bench{uuid.uuid4().hex[:8]}"
    app = App(REDIS, ns, fence_url=url)

    @app.task(name="t", queue="q")
    def t(ctx: object, n: int) -> None: ...

    try:
        start = time.perf_counter()
        with engine.begin() as conn:
            for i in range(n):
                t.enqueue_in(conn, n=i)
        written = time.perf_counter() - start
        start = time.perf_counter()
        assert Relay(app, engine=engine, batch=batch).run(once=True) == n
        return n / written, n / (time.perf_counter() - start)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DELETE FROM {OUTBOX_TABLE} WHERE namespace = :ns"), {"ns": ns})
        r = redis.Redis.from_url(REDIS)
        keys = list(r.scan_iter(f"{ns}:*"))
        if keys:
            r.delete(*keys)
        app.broker.close()


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    for name, url in URLS.items():
        engine = sa.create_engine(url)
        create_outbox(engine)
        for batch in (100, 500):
            written, relayed = one(url, engine, n, batch)
            print(f"{name:10s} batch {batch:3d}: enqueue_in {written:6.0f} rows/s, relay {relayed:6.0f} rows/s "
                  f"({n} rows)", flush=True)
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
