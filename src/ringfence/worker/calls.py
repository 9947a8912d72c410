"""Calling a handler under its time bound: async on the loop, sync on the worker's job threads.

The rule for sync handlers (a thread cannot be stopped): a job is settled only once its thread has returned.
Until then it keeps its slot and its lease; past its timeout the worker is told to stop and be restarted,
and a thread still running when the process exits takes the job's lease with it (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ringfence.logs import job_logger
from ringfence.tasks import JobContext, Task


class JobTimeout(Exception):
    """The job ran past its ``timeout_s`` (unlike a ``TimeoutError`` its handler raised, a job outcome)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"timed out after {timeout_s:g}s")


async def call_async(task: Task, ctx: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any],
                     timeout_s: float) -> Any:
    """The handler's return value."""
    try:
        async with asyncio.timeout(timeout_s) as bound:  # no extra Task per job, unlike wait_for
            return await task.fn(ctx, *args, **kwargs)
    except TimeoutError:
        if bound.expired():
            raise JobTimeout(timeout_s) from None
        raise


class SyncRun:
    """One sync handler call: ``future`` (on the loop) is done once its thread has returned."""

    __slots__ = ("args", "error", "finished", "fn", "future", "kwargs", "result", "started")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 future: asyncio.Future[Any]) -> None:
        self.fn, self.args, self.kwargs, self.future = fn, args, kwargs, future
        self.started: float | None = None  # time.monotonic() when its thread took it
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class SyncRunner:
    """Long-lived job threads that take calls from one queue and hand results back in batches.

    Unlike ``run_in_executor`` per job, a thread never wakes the loop to say it started (it stamps the time),
    and finished calls reach the loop through one ``call_soon_threadsafe`` per batch, not one per call: the
    loop thread and the job threads contend for the GIL far less often."""

    def __init__(self, max_threads: int, name: str = "ringfence-job") -> None:
        self.max_threads = max_threads
        self.name = name
        self._calls: queue.SimpleQueue[SyncRun | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._done: collections.deque[SyncRun] = collections.deque()
        self._lock = threading.Lock()
        self._wake_pending = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> SyncRun:
        loop = self._loop = asyncio.get_running_loop()
        run = SyncRun(fn, args, kwargs, loop.create_future())
        run.future.add_done_callback(_retrieved)  # a caller that stopped waiting must not leave it unread
        self._calls.put(run)
        if not self._idle.acquire(blocking=False) and len(self._threads) < self.max_threads:
            t = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()
        return run

    def _work(self) -> None:
        calls, done = self._calls, self._done
        while True:
            run = calls.get()
            if run is None:
                return
            run.started = time.monotonic()
            try:
                run.result = run.fn(*run.args, **run.kwargs)
            except BaseException as exc:  # the handler's outcome, whatever it is
                run.error = exc
            run.finished = True
            run.fn = run.args = run.kwargs = None  # type: ignore[assignment]  # free the payload early
            done.append(run)
            with self._lock:
                wake, self._wake_pending = not self._wake_pending, True
            if wake and self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting
                    self._loop.call_soon_threadsafe(self._settle)
            self._idle.release()

    def _settle(self) -> None:
        with self._lock:
            self._wake_pending = False
        done = self._done
        while done:
            run = done.popleft()
            if run.future.done():  # cancelled by close()
                continue
            if run.error is not None:
                run.future.set_exception(run.error)
                run.error = None  # no reference cycle through the traceback
            else:
                run.future.set_result(run.result)

    def close(self) -> None:
        """Stop idle threads; calls not started yet are dropped (a running one ends on its own)."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                run = self._calls.get_nowait()
            except queue.Empty:
                break
            if run is not None and not run.future.done():
                run.future.cancel()
        for _ in self._threads:
            self._calls.put(None)


async def _bounded(run: SyncRun, timeout_s: float) -> bool:
    """Wait for ``run``'s thread; False when it has not returned ``timeout_s`` after it started."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bool] = loop.create_future()
    handle: asyncio.TimerHandle | None = None

    def expire() -> None:
        nonlocal handle
        if waiter.done():
            return
        if run.finished:  # returned in time; its result is on the way to the loop
            return
        left = timeout_s if run.started is None else run.started + timeout_s - time.monotonic()
        if left > 0:  # started late (or not yet): its time counts from its start
            handle = loop.call_later(left, expire)
            return
        waiter.set_result(False)

    def finished(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(True)

    run.future.add_done_callback(finished)
    handle = loop.call_later(timeout_s, expire)
    try:
        return await waiter
    finally:
        handle.cancel()
        run.future.remove_done_callback(finished)


async def call_sync(runner: SyncRunner, task: Task, ctx: JobContext, args: tuple[Any, ...],
                    kwargs: dict[str, Any], timeout_s: float, *, on_thread: Callable[[asyncio.Future[Any]], None],
                    on_overrun: Callable[[], None]) -> Any:
    """Run a sync handler on ``runner``'s threads; ``on_thread`` receives the future that is done when its
    thread returns. The timeout counts from the moment the thread starts. Past it: ``ctx.cancelled`` is set,
    ``on_overrun`` is called (the worker must be replaced), and this call still waits for the thread, then
    raises ``JobTimeout``. Cancelling this call never stops the thread: the caller decides what becomes of a
    job whose thread still runs."""
    run = runner.submit(task.fn, (ctx, *args), kwargs)
    on_thread(run.future)
    if await _bounded(run, timeout_s):
        return run.future.result()  # the handler's own return or error
    ctx.cancelled.set()
    job_logger(ctx).error(
        "job %s (%s): sync handler exceeded its timeout of %gs; a thread cannot be stopped, so this worker stops "
        "fetching and exits to be restarted; the job stays leased to this run until its thread ends",
        ctx.id, task.name, timeout_s)
    on_overrun()
    await asyncio.wait([run.future])
    raise JobTimeout(timeout_s)
