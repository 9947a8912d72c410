"""Helpers shared by the tests (importable as ``support``; conftest modules are not importable by name)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ringfence import WorkerSettings

REQUIRE = os.environ.get("RINGFENCE_REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"
ROOT = Path(__file__).resolve().parent.parent

# Short leases and intervals so crash and retry tests finish in seconds.
FAST = WorkerSettings(lease_s=2.0, heartbeat_s=0.5, recover_interval_s=0.5, promote_interval_s=0.1,
                      shutdown_timeout_s=3.0, server_ttl_s=3.0)


def service_missing(name: str, why: str) -> None:
    """In CI a missing service fails the test; on a laptop it skips."""
    if REQUIRE:
        pytest.fail(f"{name} is required (CI) but unreachable: {why}")
    pytest.skip(f"{name} unreachable: {why}")


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



def wait_until(check: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {check}")


DATABASES = {
    "sqlite": None,
    "postgresql": "postgresql+psycopg://root@127.0.0.1:5432/test",
    "mariadb": "mysql+pymysql://root@127.0.0.1:3306/test",
}


def database_url(name: str, tmp_path: Path) -> str:
    """The URL of database ``name`` (a fresh SQLite file for "sqlite"), checked to answer."""
    from sqlalchemy import create_engine, text

    url = DATABASES[name] or f"sqlite:///{tmp_path}/app.db"
    try:
        engine = create_engine(url)
        with engine.connect() as c:
            c.execute(text("select 1"))
        engine.dispose()
    except Exception as exc:
        service_missing(name, str(exc))
    return url
