"""One attempt in flight: what the processor, the heartbeat and shutdown know about it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ringfence.models import Fetched
from ringfence.tasks import JobContext
from ringfence.worker.calls import SyncRun


@dataclass
class Running:
    job: Fetched
    ctx: JobContext | None = None
    task: asyncio.Task[None] | None = None
    lost: bool = False       # the lease went to another attempt: record nothing
    settled: bool = False    # an outcome was recorded (a sync handler's thread has returned by then)
    started: float = 0.0     # monotonic time the handler started (0: it never did)
    thread: SyncRun | None = None  # a sync handler's call in the pool (``done()`` once its thread returned)
    abandoned: bool = False  # shutdown left its thread running: the lease lapses, nothing is recorded
    sweeping: bool = False   # settled, on its way to dead-letter: the heartbeat still renews its lease
    waiter: asyncio.Future[None] | None = None  # shutdown waits on it for a job with no Task (processor.py)
