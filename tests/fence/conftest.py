"""Fixtures for fence tests: one store per database, each on a table no one else uses.

Every backend test runs on SQLite (a temp file), PostgreSQL and MariaDB. Other suites use
the same servers concurrently, so each test session creates uniquely named tables and
drops them at the end. With RINGFENCE_REQUIRE_SERVICES=1 an unreachable server fails the
test instead of skipping it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fence_helpers import Backend, OwnerFactory, Provider

from ringfence.fence import FenceStore, Owner

SERVER_URLS = {
    "postgresql": "postgresql+psycopg://root@127.0.0.1:5432/test",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}
BACKENDS = ["sqlite", "postgresql", "mariadb"]


def _unavailable(why: str) -> None:
    if os.environ.get("RINGFENCE_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"required service unavailable: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    name = request.param
    url = SERVER_URLS.get(name) or f"sqlite:///{tmp_path_factory.mktemp('fence') / 'fence.db'}"
    engine = sa.create_engine(url, pool_pre_ping=True)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        _unavailable(f"{name} at {url}: {exc.orig}")
    suffix = uuid.uuid4().hex[:10]
    store = FenceStore(engine, table_name=f"rf_fences_{suffix}")
    md = sa.MetaData()
    orders = sa.Table(
        f"rf_orders_{suffix}", md,
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("charge_id", sa.String(255)),
    )
    store.create_all()
    md.create_all(engine)
    try:
        yield Backend(name, url, store, orders)
    finally:
        md.drop_all(engine)
        store.drop_all()
        engine.dispose()


@pytest.fixture(scope="session")
def fence_redis() -> Iterator[Any]:
    """A RedisFenceStore under a prefix of its own; its keys are deleted afterwards."""
    import redis

    from ringfence.redis.fence import RedisFenceStore

    url = os.environ.get("RINGFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        _unavailable(f"redis at {url}: {exc}")
    store = RedisFenceStore(client, prefix=f"rf-test-{uuid.uuid4().hex[:10]}")
    try:
        yield store
    finally:
        keys = list(client.scan_iter(f"{store.prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def store(backend: Backend) -> FenceStore:
    return backend.store


@pytest.fixture
def subject() -> str:
    """A business id no other test touches (the tables are shared within a session)."""
    return f"order:{uuid.uuid4().hex[:12]}"


@pytest.fixture
def provider() -> Provider:
    return Provider()


@pytest.fixture
def make_owner() -> OwnerFactory:
    """``make_owner(job_id, alive=...)``: a fresh attempt (new lease token) of a job."""

    def make(job_id: str = "job-1", *, lease_s: float = 30.0, alive: Any = "dead") -> Owner:
        probe = {"dead": lambda j, t: False, "live": lambda j, t: True}.get(alive, alive)
        return Owner(job_id=job_id, token=uuid.uuid4().hex, lease_s=lease_s, alive=probe)

    return make
