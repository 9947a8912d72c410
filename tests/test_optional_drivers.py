"""The database drivers are extras (``ringfence[postgres]``, ``ringfence[mysql]``): without them ringfence imports,
enqueues and loads its CLI; only a fence on that database needs its driver."""

from __future__ import annotations

import subprocess
import sys

import redis

BLOCK = "import sys\nfor name in ('psycopg', 'psycopg_pool', 'pymysql'):\n    sys.modules[name] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=60)


def test_ringfence_imports_and_enqueues_without_the_database_drivers(redis_url: str, namespace: str,
                                                                    rdb: redis.Redis) -> None:
    done = _run(
        "import ringfence.cli\n"
        "from ringfence import App\n"
        f"app = App({redis_url!r}, {namespace!r})\n"
        "@app.task(name='nodrivers.job', queue='nodrivers')\n"
        "def job(ctx, n: int = 0):\n    pass\n"
        "job.enqueue(n=1)\n"
        "app.close()\n")
    assert done.returncode == 0, done.stderr
    pending = [k for k in rdb.scan_iter(f"{namespace}:*nodrivers*pending")]
    assert len(pending) == 1 and rdb.llen(pending[0]) == 1


def test_the_drivers_are_really_blocked_in_that_process() -> None:
    for name in ("psycopg", "pymysql"):
        done = _run(f"import {name}\n")
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, name
