"""Per task type: counts, failure rate and run-time percentiles on the overview and the task page, summed from the
heartbeats of real worker processes; the run-time history a worker keeps stays bounded."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from ringfence import App
from ringfence.dashboard import create_app
from ringfence.dashboard.tasks import quantile
from ringfence.metrics import Metrics
from support import ROOT, wait_until


@pytest.fixture
def workers(redis_url: str, namespace: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "dashtasksapp:app",
                               "--concurrency", "4"], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT) for _ in range(2)]
    yield procs
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def task_rows(page: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for m in re.finditer(r'<tr data-queue="([^"]+)" data-task="([^"]+)">.*?class="num finished">(\d+)<.*?'
                         r'class="num failed"><a [^>]*>(\d+)</a>.*?class="num rate">([\d.]+)%<.*?'
                         r'class="num p50" data-s="([^"]+)">.*?class="num p95" data-s="([^"]+)">', page, re.S):
        out[(m[1], m[2])] = {"finished": int(m[3]), "failed": int(m[4]), "rate": float(m[5]),
                             "p50": None if m[6] == "None" else float(m[6]),
                             "p95": None if m[7] == "None" else float(m[7])}
    return out


def test_overview_and_task_page_show_counts_failure_rate_and_run_times(make_app: Any, workers: Any) -> None:
    app: App = make_app()
    for name in ("quick", "slow", "broken"):
        app.task(name=name)(lambda ctx, **kw: None)
    app.enqueue_many("quick", [{"n": i} for i in range(40)])
    app.enqueue_many("slow", [{"n": i} for i in range(8)])
    app.enqueue_many("broken", [{"n": i} for i in range(5)])
    client = TestClient(create_app(app))
    want = {("default", "quick"): (40, 0), ("default", "slow"): (8, 0), ("default", "broken"): (5, 5)}

    def shown() -> dict[tuple[str, str], dict[str, Any]]:
        return task_rows(client.get("/").text)

    wait_until(lambda: {k: (v["finished"], v["failed"]) for k, v in shown().items()} == want, timeout=30)
    rows = shown()
    assert rows[("default", "broken")]["rate"] == 100.0 and rows[("default", "quick")]["rate"] == 0.0
    # slow sleeps 0.3 s: never under its sleep, and within a loaded machine's delay of it; quick is far below
    assert 0.25 <= rows[("default", "slow")]["p50"] <= rows[("default", "slow")]["p95"] <= 2.5
    assert rows[("default", "quick")]["p95"] < rows[("default", "slow")]["p50"]

    page = client.get("/tasks/default/slow")
    assert page.status_code == 200 and task_rows(page.text) == {("default", "slow"): rows[("default", "slow")]}
    assert "/queues/default/dead?task=slow" in page.text
    assert re.search(r"finished \(total 8\)", page.text), "the last hour's per-minute attempts sum to 8"
    assert re.search(r"failed \(total 0\)", page.text)
    broken = client.get("/tasks/default/broken").text
    assert re.search(r"failed \(total 5\)", broken)
    assert client.get("/tasks/default/nosuch").status_code == 404


def test_a_workers_run_time_history_is_bounded_and_per_minute() -> None:
    m = Metrics()
    t0 = 1_000_000 * 60.0
    for minute in range(500):  # a read early in each minute (a heartbeat), then one attempt
        m.task_stats(now_s=t0 + minute * 60)
        m.job_started("t", "q", 0.0)
        m.job_finished("t", "q", "ack" if minute % 2 else "dead", 0.2)
    stats = m.task_stats(now_s=t0 + 499 * 60 + 30)
    (row,) = stats
    assert row["finished"] == 500 and row["failed"] == 250
    assert len(m._minutes.marks) == 61 and len(row["minutes"]) == 61
    last = row["minutes"][-1]
    assert last[0] == 1_000_000 + 499 and last[1] == 1 and last[2] == 0
    assert quantile(row["buckets"], 0.5) is not None and 0.1 < quantile(row["buckets"], 0.5) <= 0.25


def test_quantile_interpolates_inside_the_bucket() -> None:
    counts = [0] * 19
    counts[5] = 10  # (0.1, 0.25]
    assert quantile(counts, 0.5) == pytest.approx(0.175)
    counts[-1] = 90  # past the last bound: that bound
    assert quantile(counts, 0.95) == 3600
    assert quantile([0] * 19, 0.5) is None


def test_attempts_before_a_workers_first_read_count_in_its_history() -> None:
    m = Metrics()
    for _ in range(3):
        m.job_finished("t", "q", "retry", 0.01)
    (row,) = m.task_stats(now_s=60.0 * 7)
    assert row["minutes"] == [[7, 3, 3, [[1, 3]]]] and row["failed"] == 3
