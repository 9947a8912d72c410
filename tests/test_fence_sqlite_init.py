"""A fresh SQLite fence database hit by the first jobs of several processes and threads at once: the tables
are created once, race-free, and no first job fails ("no such table", "table already exists")."""

from __future__ import annotations

import multiprocessing
import threading
import traceback
import uuid
from typing import Any

from ringfence import App
from ringfence.fence import Fences, Owner

PROCESSES, THREADS = 4, 6


def first_jobs(redis_url: str, fence_url: str, barrier: Any, errors: Any) -> None:
    """A worker-like process: THREADS first jobs at once, through ``app.fence_store`` and the failed-jobs table."""
    app = App(redis_url, "sqlite-init", fence_url=fence_url)
    gate = threading.Barrier(THREADS)

    def job(i: int) -> None:
        try:
            barrier.wait(30) if i == 0 else None  # every process starts together
            gate.wait(30)
            owner = Owner(job_id=uuid.uuid4().hex, token=uuid.uuid4().hex, lease_s=30)
            with Fences(app.fence_store, owner).open(f"order:{uuid.uuid4().hex}", "charge") as step:
                step.effect(lambda: "ch_1")
            assert app.failed_jobs.unreplayed([owner.job_id]) == []
        except BaseException:
            errors.put(traceback.format_exc(limit=3))

    threads = [threading.Thread(target=job, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_first_jobs_of_many_processes_and_threads_on_a_fresh_sqlite_file(tmp_path, redis_url) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(PROCESSES), ctx.Queue()
    url = f"sqlite:///{tmp_path}/fresh.db"
    procs = [ctx.Process(target=first_jobs, args=(redis_url, url, barrier, errors)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == [], f"{len(failures)} first jobs failed:\n" + "\n".join(failures[:3])
    assert [p.exitcode for p in procs] == [0] * PROCESSES
    app = App(redis_url, "sqlite-init", fence_url=url)
    assert len(app.fence_store.list_steps(limit=1000)) == PROCESSES * THREADS
