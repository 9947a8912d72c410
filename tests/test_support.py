"""The test kit itself (tests/support.py): where the services are, the skip-or-fail policy, the simulated clock."""

from __future__ import annotations

import os
import subprocess
import sys

from support import ROOT, SimClock, async_url


def _support(code: str, **env: str) -> str:
    """Run ``code`` after ``import support`` in a fresh interpreter with ``env``; its stdout."""
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "RINGFENCE_REQUIRE_SERVICES")}
    full.update(env, PYTHONPATH=str(ROOT / "tests"))
    return subprocess.run([sys.executable, "-c", f"import support\n{code}"], env=full, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_service_urls_come_from_the_environment() -> None:
    out = _support("print(support.REDIS_URL, support.DATABASES['postgresql'], support.DATABASES['mariadb'])",
                   RINGFENCE_TEST_REDIS_URL="redis://r:1/2", RINGFENCE_TEST_POSTGRESQL_URL="postgresql+psycopg://p/x",
                   RINGFENCE_TEST_MARIADB_URL="mysql+pymysql://m/y")
    assert out.split() == ["redis://r:1/2", "postgresql+psycopg://p/x", "mysql+pymysql://m/y"]


def test_a_missing_service_skips_on_a_laptop_and_fails_in_ci() -> None:
    code = ("import _pytest.outcomes as o\ntry:\n    support.service_missing('Redis', 'refused')\n"
            "except (o.Skipped, o.Failed) as e:\n    print(type(e).__name__, e.msg)")
    assert _support(code) == "Skipped Redis unreachable: refused"
    for env in ({"CI": "true"}, {"RINGFENCE_REQUIRE_SERVICES": "1"}):
        assert _support(code, **env) == "Failed Redis is required (CI) but unreachable: refused"


def test_sim_clock_moves_only_when_told() -> None:
    clock = SimClock(5_000)
    assert clock() == clock() == 5_000
    assert clock.advance(0.25) == 5_250 == clock()


def test_async_url_keeps_the_database_and_swaps_the_driver() -> None:
    assert async_url("sqlite:////tmp/a.db") == "sqlite+aiosqlite:////tmp/a.db"
    assert async_url("postgresql+psycopg://root@h:5432/test") == "postgresql+psycopg_async://root@h:5432/test"
    assert async_url("mysql+pymysql://root@h:3306/test") == "mysql+aiomysql://root@h:3306/test"
