"""A plain sync job (admitted at once, no gate) has no asyncio Task: its call goes to the job threads from the
fetch, and its verdict is recorded when the thread hands its outcome back. Outcomes, tracebacks, time bounds and
the shutdown drain are those of the Task path."""

from __future__ import annotations

import time

from ringfence.queries import find_dead, queue_info
from ringfence.worker.worker import Worker
from support import drive


async def test_plain_sync_jobs_run_without_a_task_and_record_every_outcome(make_app) -> None:
    app = make_app()
    tasks: list[object] = []
    box: dict[str, Worker] = {}

    @app.task(max_attempts=1)
    def work(ctx, kind: str) -> str:
        tasks.append(box["w"].processor.running[ctx.id].task)
        if kind == "fail":
            raise LookupError("no such card")
        return kind

    ok = [work.enqueue(kind="ok") for _ in range(20)]
    failed = work.enqueue(kind="fail")
    worker = box["w"] = Worker(app, concurrency=4)
    await drive(worker, lambda: queue_info(app.broker, "default")["dead"] == 1
                and app.broker.queue_counts("default")["stats"].get("processed", 0) == len(ok))
    assert tasks == [None] * 21  # no Task for any of them
    dead = find_dead(app.broker, failed)
    assert dead is not None and "LookupError: no such card" in dead.error
    assert "Traceback" in dead.traceback and "in work" in dead.traceback  # the handler's own frame
    assert worker.processor.running == {} and worker.processor.leftover == {}


async def test_a_plain_sync_job_past_its_timeout_is_a_timeout(make_app) -> None:
    app = make_app()

    @app.task(max_attempts=1, timeout_s=0.1)
    def bounded(ctx) -> None:
        time.sleep(0.3)

    late = bounded.enqueue()
    worker = Worker(app, concurrency=2)
    await drive(worker, lambda: find_dead(app.broker, late))
    assert worker.exit_code == 0  # it returned within the grace: the worker was not to be replaced
    timed_out = find_dead(app.broker, late)
    assert timed_out is not None and "TimeoutError: timed out after 0.1s" in timed_out.error


async def test_a_stop_waits_for_a_plain_sync_job_and_acks_it(make_app) -> None:
    app = make_app()
    started: list[str] = []

    @app.task
    def slow(ctx) -> None:
        started.append(ctx.id)
        time.sleep(0.5)

    job = slow.enqueue()
    worker = Worker(app, concurrency=2)
    await drive(worker, lambda: started)  # stopped at once: the drain waits for its thread, then acks
    info = queue_info(app.broker, "default")
    assert started == [job] and info["active"] == 0
    assert app.broker.queue_counts("default")["stats"].get("processed") == 1
    assert worker.processor.running == {}
