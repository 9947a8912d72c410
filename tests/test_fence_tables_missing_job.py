"""A fenced job on a fence database without its tables (``fence_url`` set, ``ringfence fence init`` not run): a
configuration error, not a failure of the job. The step raises FenceTablesMissing, the job is dead-lettered at
once (reason ``permanent``, one attempt, the one line as its error and no SQL in its record), the failed-jobs
writer logs one line, and once the tables exist ``ringfence dead replay`` runs the jobs: nothing is lost.
SQLite fence databases get their tables on first use, so only PostgreSQL and MariaDB can reach this state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from empty_databases import empty_database
from ringfence import App, RetryPolicy
from ringfence.models import DeadJob
from ringfence.queries import find_dead
from support import wait_until

APP = """
from ringfence import App, RetryPolicy

app = App(retry=RetryPolicy(max_attempts=3, base_s=0.05, cap_s=0.1))

@app.task(name="charge", store_result=True)
def charge(ctx, order: int) -> str:
    with ctx.fence(f"order:{order}", "charge") as step:
        return "charged" if step.done else step.effect(lambda: "charged")

@app.task(name="acharge", store_result=True)
async def acharge(ctx, order: int) -> str:
    async with ctx.fence(f"order:{order}", "acharge") as step:
        return "charged" if step.done else await step.effect(lambda: "charged")
"""


def producer_side(ctx: object, order: int) -> str:
    raise AssertionError("runs in the worker")


class Setup:
    def __init__(self, url: str, redis_url: str, namespace: str, tmp_path: Path) -> None:
        (tmp_path / "tablesapp.py").write_text(APP)
        self.url, self.tmp_path, self.log = url, tmp_path, tmp_path / "worker.log"
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
                    "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
                    "RINGFENCE_FENCE_URL": url, "RINGFENCE_APP": "tablesapp:app",
                    "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.app = App(redis_url, namespace, retry=RetryPolicy(max_attempts=3))
        for name in ("charge", "acharge"):  # the producer's declarations: the same names, run by the worker
            self.app.task(name=name, store_result=True)(producer_side)

    def worker(self) -> subprocess.Popen[bytes]:
        with self.log.open("a") as sink:
            return subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker"], env=self.env, cwd=self.tmp_path,
                                    stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], env=self.env, cwd=self.tmp_path,
                              capture_output=True, text=True, timeout=60)


@pytest.fixture(params=["postgresql", "mariadb"])
def setup(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, namespace: str) -> Iterator[Setup]:
    with empty_database(request.param, tmp_path) as url:
        s = Setup(url, redis_url, namespace, tmp_path)
        yield s
        s.app.close()


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_a_fenced_job_without_fence_tables_is_dead_at_once_in_one_line_and_replays_after_init(setup: Setup) -> None:
    ids = [setup.app.enqueue("charge", order=1), setup.app.enqueue("acharge", order=2)]
    proc = setup.worker()
    try:
        wait_until(lambda: all(find_dead(setup.app.broker, i) for i in ids) or proc.poll() is not None, timeout=60)
        time.sleep(1.0)  # a retry storm would show as more attempts, or as the job leaving the dead-letter
    finally:
        stop(proc)
    line = (f"FenceTablesMissing: no fence table ringfence_fences in {setup.url}: create the tables with `ringfence "
            f"fence init` (or put `ringfence fence ddl --dialect {setup.url.partition('+')[0]}` in a migration)")
    for job_id in ids:
        dead = find_dead(setup.app.broker, job_id)
        assert isinstance(dead, DeadJob), job_id
        assert (dead.reason, dead.error, dead.attempts) == ("permanent", line, 1), dead
        assert "SELECT" not in dead.traceback.upper() and "INSERT INTO" not in dead.traceback.upper(), dead.traceback
    text = setup.log.read_text()
    owed = [line for line in text.splitlines() if "failed_jobs row could not be written" in line]
    assert owed and all("(FenceTablesMissing: no fence table ringfence_failed_jobs in " in line for line in owed), text
    assert "INSERT INTO" not in text.upper() and "[SQL:" not in text and "Background on this error" not in text, text
    assert "Traceback" not in text, text

    assert setup.cli("fence", "init").returncode == 0  # the operator's fix, then the dead jobs run again
    replay = setup.cli("dead", "replay", "--all")
    assert replay.returncode == 0, replay.stderr
    proc = setup.worker()
    try:
        assert [setup.app.result(i, timeout=30) for i in ids] == ["charged", "charged"]
    finally:
        stop(proc)
