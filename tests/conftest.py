"""Real services only. Each test gets its own namespace on the shared Redis, so tests never see each other."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from ringfence import App
from ringfence.redis.embedded import EmbeddedRedis, free_port
from support import (  # noqa: F401 (re-exported for tests)
    FAST,
    REDIS_URL,
    SimClock,
    WorkerProc,
    on_clock,
    redis_answering,
    service_missing,
    wait_until,
)

# A user's project that tests/test_pytest_plugin.py runs in its own pytest process, offline.
collect_ignore = ["kitproject"]

@pytest.fixture(scope="session")
def redis_url() -> str:
    return redis_answering(REDIS_URL)


@pytest.fixture
def private_redis() -> Iterator[EmbeddedRedis]:
    """A redis-server of the test's own on a free port, DEBUG enabled: its connections, commands and restarts are
    the test's alone."""
    s = EmbeddedRedis.temporary(port=free_port(), extra=("--enable-debug-command", "yes"))
    yield s
    s.stop()


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{ns}:*", count=1000))
    if keys:
        r.delete(*keys)


@pytest.fixture
def make_app(redis_url: str, namespace: str) -> Callable[..., App]:
    """``make_app(**App options)``: an App on this test's namespace; ``clock=`` puts its broker on a SimClock."""

    def make(*, clock: SimClock | None = None, **kw: Any) -> App:
        kw.setdefault("worker", FAST)
        app = App(redis_url, namespace, **kw)
        return app if clock is None else on_clock(app, clock)

    return make


@pytest.fixture
def rdb(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def clock() -> SimClock:
    """A simulated clock (``Broker(clock=clock)``, or ``make_app(clock=clock)``)."""
    return SimClock()


@pytest.fixture
def spawn_worker(namespace: str, redis_url: str) -> Iterator[Callable[..., WorkerProc]]:
    procs: list[WorkerProc] = []

    def spawn(*args: str, env: dict[str, str] | None = None) -> WorkerProc:
        w = WorkerProc(namespace, redis_url, *args, env=env)
        procs.append(w)
        return w

    yield spawn
    for w in procs:
        if w.proc.poll() is None:
            os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait(10)
