"""A sync job whose only gate is its concurrency key (its slot taken by fetch.lua) takes the taskless sync path
(tests/test_taskless_sync.py) as a plain one does: no asyncio Task, its call queued for the job threads from the
fetch. Its key's slot is held while its thread runs and freed once it returned, whatever the outcome; the key's
limit holds as on the Task path (tests/test_concurrency_key.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

from ringfence.queries import find_dead
from ringfence.worker.worker import Worker
from support import drive


async def test_keyed_sync_jobs_run_without_a_task_and_hold_their_keys_slot_while_they_run(make_app) -> None:
    app = make_app()
    b = app.broker
    box: dict[str, Worker] = {}
    runs: list[tuple[Any, bool]] = []  # (the job's Task, whether its key's slot was held by it as it ran)
    running = {"a": 0, "b": 0}
    peak = dict(running)
    lock = threading.Lock()

    def slots(account: str) -> list[bytes]:
        return b.sync.zrange(b.keys.slots("key:default", f"account:{account}"), 0, -1)

    @app.task(max_attempts=1, concurrency_key="account:{account}", concurrency_limit=2)
    def work(ctx, account: str, fail: bool = False) -> None:
        with lock:
            running[account] += 1
            peak[account] = max(peak[account], running[account])
        runs.append((box["w"].processor.running[ctx.id].task, f"{ctx.id}:{ctx.token}".encode() in slots(account)))
        time.sleep(0.05)
        with lock:
            running[account] -= 1
        if fail:
            raise LookupError("no such account")

    for account in ("a", "b"):
        for _ in range(6):
            work.enqueue(account=account)
    failed = work.enqueue(account="a", fail=True)
    worker = box["w"] = Worker(app, concurrency=6)
    await drive(worker, lambda: b.queue_counts("default")["stats"].get("processed", 0) == 12
                and find_dead(b, failed) is not None and not slots("a") and not slots("b"))
    assert runs == [(None, True)] * 13  # no Task for any of them; each held its slot while its thread ran
    assert peak == {"a": 2, "b": 2}  # the limit held, and the other key's jobs ran meanwhile
    dead = find_dead(b, failed)
    assert dead is not None and "LookupError: no such account" in dead.error and "in work" in dead.traceback
    assert worker.processor.running == {} and worker.processor.gates.held == {}
