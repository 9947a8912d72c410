"""The app of worker processes in the Redis fault tests (full Redis, skewed clocks, lost connections).

Handlers record their runs in files under $FAULT_DIR, not in Redis: a full Redis must not hide a run."""

from __future__ import annotations

import asyncio
import os
import time

from support import worker_app

app = worker_app(lease_s=float(os.environ.get("FAULT_LEASE_S", "2")),
                 heartbeat_s=float(os.environ.get("FAULT_HEARTBEAT_S", "0.5")))
DIR = os.environ["FAULT_DIR"]


def mark(kind: str, job_id: str, attempt: int) -> None:
    with open(os.path.join(DIR, f"{job_id}.{attempt}.{os.getpid()}.{kind}"), "w") as f:
        f.write(repr(time.time()))


@app.task(queue="a")
async def slow_a(ctx, seconds: float) -> None:
    mark("started", ctx.id, ctx.attempt)
    await asyncio.sleep(seconds)
    mark("finished", ctx.id, ctx.attempt)


@app.task(queue="b")
async def slow_b(ctx, seconds: float) -> None:
    mark("started", ctx.id, ctx.attempt)
    await asyncio.sleep(seconds)
    mark("finished", ctx.id, ctx.attempt)
