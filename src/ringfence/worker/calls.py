"""Calling a handler under its time bound: async on the loop, sync in the worker's thread pool.

The rule for sync handlers (a thread cannot be stopped): a job is settled only once its thread has returned.
Until then it keeps its slot and its lease; past its timeout the worker is told to stop and be restarted,
and a thread still running when the process exits takes the job's lease with it (docs/architecture.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ringfence.logs import job_logger
from ringfence.tasks import JobContext, Task


class JobTimeout(Exception):
    """The job ran past its ``timeout_s`` (unlike a ``TimeoutError`` its handler raised, a job outcome)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"timed out after {timeout_s:g}s")


async def call_async(task: Task, ctx: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any],
                     timeout_s: float) -> None:
    try:
        async with asyncio.timeout(timeout_s) as bound:  # no extra Task per job, unlike wait_for
            await task.fn(ctx, *args, **kwargs)
    except TimeoutError:
        if bound.expired():
            raise JobTimeout(timeout_s) from None
        raise


def _started(flag: asyncio.Future[None]) -> None:
    if not flag.done():
        flag.set_result(None)


async def call_sync(pool: ThreadPoolExecutor, task: Task, ctx: JobContext, args: tuple[Any, ...],
                    kwargs: dict[str, Any], timeout_s: float, *, on_thread: Callable[[asyncio.Future[Any]], None],
                    on_overrun: Callable[[], None]) -> None:
    """Run a sync handler in ``pool``; ``on_thread`` receives its future. The timeout counts from the moment
    the thread starts. Past it: ``ctx.cancelled`` is set, ``on_overrun`` is called (the worker must be
    replaced), and this call still waits for the thread, then raises ``JobTimeout``. Cancelling this call
    never stops the thread: the caller decides what becomes of a job whose thread still runs."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()

    def run() -> Any:
        loop.call_soon_threadsafe(_started, started)
        return task.fn(ctx, *args, **kwargs)

    future = loop.run_in_executor(pool, run)
    on_thread(future)
    # A thread that is not yet running has not used any of its time (the pool is sized to the slots,
    # so this wait is short; it guards the rule, not the common case).
    await asyncio.wait([started, future], return_when=asyncio.FIRST_COMPLETED)
    try:
        async with asyncio.timeout(timeout_s) as bound:
            await asyncio.shield(future)
        return
    except TimeoutError:
        if not bound.expired():  # the handler raised TimeoutError itself: its own outcome, not ours
            raise
    if future.done():  # it ended just as the time ran out: nothing overran
        raise JobTimeout(timeout_s)
    ctx.cancelled.set()
    job_logger(ctx).error(
        "job %s (%s): sync handler exceeded its timeout of %gs; a thread cannot be stopped, so this worker stops "
        "fetching and exits to be restarted; the job stays leased to this run until its thread ends",
        ctx.id, task.name, timeout_s)
    on_overrun()
    await asyncio.wait([future])
    raise JobTimeout(timeout_s)
