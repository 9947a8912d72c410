"""What the tests share, in one place (importable as ``support``; conftest modules are not importable by name).

- services: the Redis and database URLs (each overridable by an environment variable) and the one skip policy:
  on a laptop a missing service skips its tests, in CI (``CI=true`` or ``RINGFENCE_REQUIRE_SERVICES=1``,
  set by ``.ci/run``) it fails them;
- :class:`SimClock`, the simulated clock a :class:`~ringfence.redis.broker.Broker` takes instead of Redis's;
- real worker processes (:class:`WorkerProc`) and :func:`wait_until`.

The fake payment provider is public: :class:`ringfence.testing.FakeProvider`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ringfence import App, RetryPolicy, WorkerSettings, faults
from ringfence.redis.broker import Broker
from ringfence.runtime import Runtime

REQUIRE = os.environ.get("RINGFENCE_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"
ROOT = Path(__file__).resolve().parent.parent

# --- services ------------------------------------------------------------------------------------------------
REDIS_URL = os.environ.get("RINGFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASES: dict[str, str | None] = {
    "sqlite": None,  # a fresh file per test (or session)
    "postgresql": os.environ.get("RINGFENCE_TEST_POSTGRESQL_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("RINGFENCE_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
SERVERS: dict[str, str] = {name: url for name, url in DATABASES.items() if url}  # the database servers only

# Short leases and intervals so crash and retry tests finish in seconds.
FAST = WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                      shutdown_timeout_s=3.0, server_ttl_s=3.0)


def service_missing(name: str, why: str) -> None:
    """In CI a missing service fails the test; on a laptop it skips."""
    import pytest  # here: worker processes import this module too (worker_app), and need no pytest

    if REQUIRE:
        pytest.fail(f"{name} is required (CI) but unreachable: {why}")
    pytest.skip(f"{name} unreachable: {why}")


def worker_app(*, fence: bool = False, environment: str = "test", retry: RetryPolicy | None = None,
               **timing: Any) -> App:
    """The App of a helper app that real worker processes import (tests/*app.py).

    Namespace (and, with ``fence``, the fence database ``FENCE_URL``) from the environment the test set; the
    FAST timings, ``timing`` overriding some of them (``lease_s=3.0``)."""
    return App(namespace=os.environ["RINGFENCE_NAMESPACE"], environment=environment,
               fence_url=os.environ["FENCE_URL"] if fence else None,
               worker=dataclasses.replace(FAST, **timing), retry=retry)


class WorkerProc:
    """A real worker process running tests/workerapp.py."""

    def __init__(self, namespace: str, redis_url: str, *args: str, env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
                    "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                    **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ringfence.cli", "worker", "--app", "workerapp:app", *args],
            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        out, _ = self.proc.communicate(timeout=30)
        return out.decode(errors="replace")



def kill_groups(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGKILL the process group of each process still running (started with ``start_new_session=True``), and
    reap each."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def wait_until(check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {check}")


def redis_answering(url: str = REDIS_URL) -> str:
    """``url``, checked to answer a PING (else :func:`service_missing`)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_missing("Redis", f"{url}: {exc}")
    finally:
        client.close()
    return url


def database_answering(name: str, url: str) -> str:
    """``url`` of database ``name``, checked to answer ``select 1`` (else :func:`service_missing`)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as c:
            c.execute(text("select 1"))
    except Exception as exc:
        service_missing(name, f"{url}: {exc}")
    finally:
        engine.dispose()
    return url


ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg_async", "mysql": "mysql+aiomysql"}


def async_url(url: Any) -> str:
    """The same database (a URL string or ``sqlalchemy.URL``) through SQLAlchemy's asyncio driver."""
    from sqlalchemy import make_url

    u = make_url(url)
    return u.set(drivername=ASYNC_DRIVERS[u.get_backend_name()]).render_as_string(hide_password=False)


def database_url(name: str, tmp_path: Path) -> str:
    """The URL of database ``name`` (a fresh SQLite file under ``tmp_path`` for "sqlite"), checked to answer."""
    return database_answering(name, DATABASES[name] or f"sqlite:///{tmp_path}/app.db")


# --- time ----------------------------------------------------------------------------------------------------
class SimClock:
    """A simulated clock for ``Broker(clock=...)``: now in ms, moved only by the test.

    Every lease, retry, schedule and expiry the broker's scripts compare is read from it, so a test sets time
    exactly instead of sleeping and allowing for a loaded machine.
    """

    def __init__(self, ms: int = 1_000_000) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> int:
        """Move time forward by ``seconds``; returns the new now (ms)."""
        self.ms += round(seconds * 1000)
        return self.ms


def on_clock(app: App, clock: SimClock) -> App:
    """``app`` with its broker on ``clock`` instead of Redis's: its worker, producer and scheduler read that."""
    app.runtime = Runtime(app, broker=Broker(app.declared_redis_url or "", app.namespace, clock=clock,
                                             connection=app.redis_settings, clients=app.redis_clients))
    return app


async def drive(worker: Any, done: Callable[[], Any], timeout: float = 15) -> None:
    """Run ``worker`` (a ``Worker``) until ``done()`` (real time), then stop it and wait for its exit."""
    runner = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert time.monotonic() < deadline, "condition not met in time"
            assert not runner.done(), runner.result()
            await asyncio.sleep(0.02)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)


def at_point(point: str, action: Callable[[str], None]) -> AbstractContextManager[None]:
    """While the block runs, ``action(point)`` the first time fault point ``point`` is reached."""
    fired: list[str] = []

    def hook(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            action(name)

    return faults.inject(hook)


def _simulated_kill(name: str) -> None:
    raise faults.SimulatedKill(name)


def kill_at(point: str) -> AbstractContextManager[None]:
    """A fault hook that 'SIGKILLs' (raises SimulatedKill) the first time ``point`` is reached."""
    return at_point(point, _simulated_kill)
