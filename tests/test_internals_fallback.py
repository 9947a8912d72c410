"""A library that moved an internal ringfence reads never breaks it: with each private module or name hidden (a
``sitecustomize`` in the child processes removes it after the library loaded, as a new release would), a real
producer enqueues, a real worker runs a fenced job on PostgreSQL to one charge, and the fast path it lost is named
once in the log. Also: a client-side-caching Redis pool keeps redis-py's own path; no private attribute of the
standard library or prometheus-client is read."""

from __future__ import annotations

import ast
import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from sqlalchemy import insert, select

from ringfence import App
from ringfence.redis.connection import RedisClients
from support import DATABASES, ROOT, database_answering, wait_until

HIDE = '''
import importlib, os, sys, types

for item in filter(None, os.environ.get("RINGFENCE_TEST_HIDE", "").split(",")):
    name, _, attr = item.partition(":")
    module = importlib.import_module(name)  # the library loads as released
    if attr:  # the name is gone from the module: a copy without it is what importers now find
        copy = types.ModuleType(name)
        copy.__dict__.update(module.__dict__)
        del copy.__dict__[attr]
        sys.modules[name] = copy
    else:  # the module is gone
        sys.modules[name] = None
'''

# hidden -> (what the fast path's log line names, does the producer keep its direct calls)
HIDDEN = {
    "redis._parsers.hiredis": ("script calls go through redis-py's client: redis._parsers.hiredis", False),
    "redis._parsers.hiredis:NOT_ENOUGH_DATA": ("redis._parsers.hiredis.NOT_ENOUGH_DATA not found", False),
    "hiredis": ("script calls go through redis-py's client: hiredis is not importable", False),
    "psycopg.adapt:Transformer": ("the fence's statements go through psycopg's cursor", True),
}


@pytest.fixture
def pg_fenceapp(redis_url, namespace, tmp_path):
    fence_url = database_answering("postgresql", DATABASES["postgresql"] or "")
    os.environ.update(RINGFENCE_NAMESPACE=namespace, RINGFENCE_REDIS_URL=redis_url, FENCE_URL=fence_url,
                      FENCE_PROVIDER_DB=str(tmp_path / "provider.db"))
    import fenceapp

    mod = importlib.reload(fenceapp)
    mod.app.fence_store.create_all()
    mod.md.create_all(mod.engine())
    with mod.engine().begin() as c:
        c.execute(insert(mod.orders), [{"id": 1}])
    yield mod
    mod.md.drop_all(mod.engine())
    mod.engine().dispose()
    mod.app.close()


def _child_env(tmp_path: Path, hidden: str) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join([str(site), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "RINGFENCE_TEST_HIDE": hidden, "PYTHONPATH": path}


ENQUEUE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import fenceapp
job = fenceapp.charge_strict.enqueue(order_id=1, amount=500)
print(json.dumps({"job": job, "direct": fenceapp.app.broker.direct() is not None}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("hidden", list(HIDDEN))
def test_with_an_internal_hidden_a_fenced_job_runs_once_on_the_public_path(pg_fenceapp, tmp_path, hidden) -> None:
    mod, (named, direct) = pg_fenceapp, HIDDEN[hidden]
    env = _child_env(tmp_path, hidden)
    producer = subprocess.run([sys.executable, "-c", ENQUEUE], env=env, capture_output=True, text=True, timeout=60)
    assert producer.returncode == 0, producer.stderr
    out = json.loads(producer.stdout)
    assert out["direct"] is direct
    if not direct:
        assert producer.stderr.count(named) == 1, producer.stderr
    worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "fenceapp:app"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until(lambda: mod.app.broker.queue_counts("default")["stats"].get("processed") == 1, timeout=40)
    except AssertionError:
        os.killpg(worker.pid, signal.SIGKILL)
        raise AssertionError(worker.communicate(timeout=30)[0]) from None
    os.killpg(worker.pid, signal.SIGTERM)
    log, _ = worker.communicate(timeout=30)
    charges = [c for c in mod.provider.records() if c.order == 1]
    with mod.engine().connect() as c:
        ref = c.execute(select(mod.orders.c.charge_id).where(mod.orders.c.id == 1)).scalar()
    row = mod.app.fence_store.get(f"{mod.ns}:order:1", "charge")
    assert len(charges) == 1 and ref is not None and row.reference == ref and str(row.state) == "completed"
    assert worker.returncode == 0, log
    assert log.count(named) == 1, log


def test_a_client_side_caching_pool_keeps_redis_py_s_path(redis_url, namespace) -> None:
    """Its connections are proxies that must see every command (they hold no socket of their own). Only the choice
    is checked: redis-py serves client-side caching from Redis 7.4, newer than the server here."""
    CacheConfig = pytest.importorskip("redis.cache", reason="redis-py without client-side caching").CacheConfig
    clients = RedisClients(sync=lambda: redis.Redis.from_url(redis_url, protocol=3, cache_config=CacheConfig()),
                           aio=lambda: aioredis.Redis.from_url(redis_url))  # no client-side cache in asyncio
    app = App(namespace=namespace, redis_clients=clients)
    try:
        assert app.broker.direct() is None
        assert app.broker.ready_enqueue("q") is None
    finally:
        app.close()


PRIVATE = {"_cond", "_flag", "_buckets", "_sum", "_bind_processors"}  # Event's, prometheus-client's, SQLAlchemy's


def test_no_private_attribute_of_the_standard_library_or_prometheus_is_read() -> None:
    found = []
    for path in sorted((ROOT / "src" / "ringfence").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.keyword) and node.arg == "_check":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} _check=")
    assert found == []
