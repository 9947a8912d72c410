"""The pytest plugin (entry point ``pytest11``: loaded wherever ringfence is installed). Fixtures:

- ``ringfence_redis_url`` (session): a private embedded redis-server on a unix socket, flushed before each test;
- ``ringfence_clock``: the simulated clock (``TestClock``) the test's broker reads;
- ``ringfence_fence_url``: a SQLite fence database in the test's tmp_path (used when the app names none);
- ``ringfence_worker``: a ``TestWorker`` for the App your ``ringfence_app`` fixture returns.

Nothing connects to a Redis, PostgreSQL or MariaDB server: ``RINGFENCE_REDIS_URL`` is pointed at the embedded
one for the session, so an App that reads it at import finds it too."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures: a pytest session that uses none of them loads nothing more
    from ringfence.app import App
    from ringfence.testing.kit import TestClock, TestWorker


@pytest.fixture(scope="session")
def ringfence_redis_url() -> Iterator[str]:
    from ringfence.redis.embedded import EmbeddedRedis

    server = EmbeddedRedis.temporary()
    before = os.environ.get("RINGFENCE_REDIS_URL")
    os.environ["RINGFENCE_REDIS_URL"] = server.url
    try:
        yield server.url
    finally:
        server.stop()
        if before is None:
            os.environ.pop("RINGFENCE_REDIS_URL", None)
        else:
            os.environ["RINGFENCE_REDIS_URL"] = before


@pytest.fixture
def ringfence_clock() -> TestClock:
    from ringfence.testing.kit import TestClock

    return TestClock()


@pytest.fixture
def ringfence_fence_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'fences.db'}"


@pytest.fixture
def ringfence_app() -> App:
    raise pytest.UsageError("the ringfence_worker fixture needs your App: define a fixture named ringfence_app "
                            "that returns it (in conftest.py)")


@pytest.fixture
def ringfence_worker(ringfence_app: App, ringfence_redis_url: str, ringfence_clock: TestClock,
                     ringfence_fence_url: str) -> Iterator[TestWorker]:
    from ringfence.testing.kit import TestWorker

    worker = TestWorker(ringfence_app, ringfence_redis_url, ringfence_clock, ringfence_fence_url)
    worker.reset()  # each test starts from empty queues
    try:
        yield worker
    finally:
        worker.close()
