"""Real services only. Each test gets its own namespace on the shared Redis, so tests never see each other."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ringfence import App, WorkerSettings

REDIS_URL = os.environ.get("RINGFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REQUIRE = os.environ.get("RINGFENCE_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"
ROOT = Path(__file__).resolve().parent.parent


def service_missing(name: str, why: str) -> None:
    """In CI a missing service fails the test; on a laptop it skips."""
    if REQUIRE:
        pytest.fail(f"{name} is required (CI) but unreachable: {why}")
    pytest.skip(f"{name} unreachable: {why}")


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.RedisError as exc:
        service_missing("Redis", str(exc))
    return REDIS_URL


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{ns}:*", count=1000))
    if keys:
        r.delete(*keys)


FAST = WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                      shutdown_timeout_s=3.0, server_ttl_s=3.0)


@pytest.fixture
def make_app(redis_url: str, namespace: str) -> Callable[..., App]:
    def make(**kw: Any) -> App:
        kw.setdefault("worker", FAST)
        return App(redis_url, namespace, **kw)

    return make


@pytest.fixture
def rdb(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


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


def wait_until(check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {check}")
