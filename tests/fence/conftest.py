"""Fixtures for fence tests: one store per database, each on a table no one else uses.

Every backend test runs on SQLite (a temp file), PostgreSQL and MariaDB. Other suites use
the same servers concurrently, so each test session creates uniquely named tables and
drops them at the end. The URLs and the skip policy (in CI an unreachable server fails the
test instead of skipping it) are ``support``'s.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fence_helpers import Backend, OwnerFactory, Provider

from ringfence.fence import FenceStore, Owner
from support import DATABASES, REDIS_URL, database_answering, redis_answering


@pytest.fixture(scope="session", params=list(DATABASES))
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    name = request.param
    url = database_answering(name, DATABASES[name] or f"sqlite:///{tmp_path_factory.mktemp('fence') / 'fence.db'}")
    engine = sa.create_engine(url, pool_pre_ping=True)
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

    client = redis.Redis.from_url(redis_answering(REDIS_URL))
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
def url_store(backend: Backend) -> Iterator[FenceStore]:
    """A store built from the URL, as ``App(fence_url=...)`` builds it (its own engine, disposed after)."""
    if backend.name == "sqlite":
        pytest.skip("counted on PostgreSQL and MariaDB")
    store = FenceStore(backend.url, table_name=backend.store.table.name)
    try:
        yield store
    finally:
        store.engine.dispose()


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
