"""Worker clocks disagree: a worker whose clock runs a minute ahead, far more than lease_s,
must not take a live job from a healthy worker. Leases, schedules and expiries are compared on the Redis
server's clock. The skew is real: the worker process runs under libfaketime."""

from __future__ import annotations

import os
from pathlib import Path

from redisfaults import FaultWorker, runs
from ringfence import App
from support import service_missing, wait_until

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SKEW = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "+60s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def marks(directory: Path, job_id: str) -> list[str]:
    """pids of the runs of ``job_id`` that started."""
    return [p.name.split(".")[2] for p in directory.glob(f"{job_id}.*.started")]


def test_a_worker_whose_clock_runs_ahead_does_not_take_live_jobs(redis_url: str, namespace: str,
                                                                  tmp_path: Path) -> None:
    if not os.path.exists(LIBFAKETIME):
        service_missing("libfaketime", "not installed (apt-get install faketime)")
    app = App(redis_url, namespace, environment="test")

    def slow(ctx: object, seconds: float) -> None: ...

    task = app.task(name="faultapp.slow_a", queue="a")(slow)
    healthy = FaultWorker(redis_url, namespace, tmp_path, "a", name="healthy")
    skewed = None
    try:
        wait_until(lambda: app.broker.servers(), 20)
        long_job = task.enqueue(seconds=8.0)  # 4 leases of 2 s
        wait_until(lambda: marks(tmp_path, long_job), 10)
        skewed = FaultWorker(redis_url, namespace, tmp_path, "a", name="skewed", env=SKEW)
        found = wait_until(lambda: [s for s in app.broker.servers() if s["pid"] == skewed.proc.pid], 20)
        assert 55 < found[0]["clock_skew_s"] < 65  # the fault is real: its wall clock is a minute ahead
        short = [task.enqueue(seconds=0.2) for _ in range(10)]
        wait_until(lambda: len(runs(tmp_path, "finished")) == 11, 30)
    finally:
        codes = [w.stop() for w in (healthy, skewed) if w is not None]
        app.close()
    assert marks(tmp_path, long_job) == [str(healthy.proc.pid)]
    started = runs(tmp_path)
    assert set(started.values()) == {1} and sorted(started) == sorted([long_job, *short])
    assert codes == [0, 0]
    # The skewed worker did work (it is not merely idle): it ran some of the short jobs, each once.
    pids = {pid for job in short for pid in marks(tmp_path, job)}
    assert str(skewed.proc.pid) in pids, (pids, skewed.lines()[-20:])
