"""Calling a handler under its time bound: async on the loop, sync on the worker's job threads.

The rule for sync handlers (a thread cannot be stopped): a job is settled only once its thread has returned.
Until then it keeps its slot and its lease. Past its timeout ``ctx.cancelled`` is set; a thread still running
``OVERRUN_GRACE_S`` later has the worker told to stop and be replaced, and a thread still running when the
process exits takes the job's lease with it (docs/architecture.md)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ringfence.logs import job_logger
from ringfence.tasks import JobContext, Task

log = logging.getLogger("ringfence.worker")

# The grower adds no thread when the process's threads spent this share of its wait (``grow_after_s``) runnable
# but without a CPU: the machine, not a slow call, held the calls back.
STARVED = 0.25
# ...but a call never waits longer than this many grower periods for a thread because of it: on a machine busy
# for good, a slow call must not hold every other job of the process back.
STARVED_MAX_PERIODS = 20
# Short calls that block on I/O (a database statement of a millisecond) never leave every thread busy for a whole
# period, yet more threads would run more of them at once. One more thread when a call has waited ``IO_WAIT`` of
# a period while the process used less than ``IO_BOUND`` of one CPU since the grower's last look: its threads
# sleep on something other than the GIL (which one process cannot use past one CPU).
IO_WAIT = 0.2
IO_BOUND = 0.6
# A sync call past its timeout has this long to return (its handler saw ``ctx.cancelled``) before the worker is
# replaced: one that returns in time costs an attempt, never the process.
OVERRUN_GRACE_S = 5.0


class JobTimeout(Exception):
    """The job ran past its ``timeout_s`` (unlike a ``TimeoutError`` its handler raised, a job outcome)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"timed out after {timeout_s:g}s")


class AsyncBound:
    """One async call's time bound: the job's Task is cancelled past ``deadline`` (loop time)."""

    __slots__ = ("cancelling", "deadline", "expired", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task, self.deadline = task, deadline
        self.cancelling = task.cancelling()  # cancellations already asked for: not ours
        self.expired = False


class AsyncBounds:
    """The time bounds of every async call, kept by one timer armed for the earliest deadline (as
    ``asyncio.timeout`` per job would be: a timer handle, a reschedule and a context manager per job)."""

    def __init__(self) -> None:
        self.calls: set[AsyncBound] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0

    def enter(self, timeout_s: float) -> AsyncBound:
        task = asyncio.current_task()
        assert task is not None
        loop = task.get_loop()
        bound = AsyncBound(task, loop.time() + timeout_s)
        self.calls.add(bound)
        if self._timer is None or bound.deadline < self._at:
            self._arm(loop, bound.deadline)
        return bound

    def _arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = loop.call_at(at, self._watch, loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        earliest: float | None = None
        for bound in list(self.calls):
            if bound.deadline <= now:
                self.calls.discard(bound)  # its call is suspended at an await: it ends as timed out
                bound.expired = True
                bound.task.cancel()
            elif earliest is None or bound.deadline < earliest:
                earliest = bound.deadline
        if earliest is not None:
            self._arm(loop, earliest)


async def call_async(task: Task, ctx: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any],
                     timeout_s: float, bounds: AsyncBounds, fn: Callable[..., Any] | None = None) -> Any:
    """The handler's return value. Past ``timeout_s`` its Task is cancelled and this raises ``JobTimeout``
    (a cancellation from elsewhere, shutdown or a lost lease, stays a ``CancelledError``)."""
    bound = bounds.enter(timeout_s)
    try:
        value = await (fn or task.fn)(ctx, *args, **kwargs)
    except asyncio.CancelledError:
        if bound.expired and bound.task.uncancel() <= bound.cancelling:
            raise JobTimeout(timeout_s) from None
        raise
    finally:
        bounds.calls.discard(bound)
    if bound.expired:  # the handler swallowed our cancellation and returned
        bound.task.uncancel()
    return value


class SyncRun:
    """One sync handler call. ``future`` (on the loop) has its outcome once its thread has returned; ``done()``
    says whether the loop has heard that it returned (a cancelled ``future`` says nothing about the thread)."""

    __slots__ = ("args", "ctx", "error", "finished", "fn", "future", "kwargs", "on_overrun", "overran", "owner",
                 "result", "returned", "started", "stuck", "submitted", "task", "then", "timeout_s", "waiters")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 future: asyncio.Future[Any] | None, timeout_s: float, ctx: JobContext | None, task: str,
                 on_overrun: Callable[[], None] | None) -> None:
        self.fn, self.args, self.kwargs, self.future = fn, args, kwargs, future
        self.then: Callable[[SyncRun], None] | None = None  # called on the loop once it returned (no ``future``)
        self.owner: Any = None  # what ``then`` needs to know of it
        self.timeout_s, self.ctx, self.task, self.on_overrun = timeout_s, ctx, task, on_overrun
        self.submitted = 0.0  # time.monotonic() when it was queued
        self.started: float | None = None  # time.monotonic() when its thread took it
        self.finished = False  # set by its thread
        self.returned = False  # set on the loop, once the loop has the outcome
        self.overran = False   # the watchdog found it past its timeout
        self.stuck = False     # ...and still running ``OVERRUN_GRACE_S`` later: the worker is replaced
        self.result: Any = None
        self.error: BaseException | None = None
        self.waiters: list[asyncio.Future[None]] | None = None

    def done(self) -> bool:
        return self.returned

    def check_overrun(self, timeout_s: float) -> None:
        """Raise ``JobTimeout`` if the watchdog found this call past its timeout (whatever the handler gave)."""
        if self.overran:
            raise JobTimeout(timeout_s) from None


class SyncRunner:
    """Long-lived job threads that take calls from one queue and hand results back in batches.

    Unlike ``run_in_executor`` per job, a thread never wakes the loop to say it started (it stamps the time),
    finished calls reach the loop through one ``call_soon_threadsafe`` per batch, not one per call, and time
    bounds are kept by one watchdog timer for all calls (armed for the earliest deadline), not one per call:
    per job the loop makes one future and no timer or callback.

    It starts ``first_threads`` threads and adds one, up to ``max_threads`` (one per slot), whenever a call has
    waited ``grow_after_s`` while no thread took any (the first time twice that: the run-queue time is read at
    the first look), or has waited ``IO_WAIT`` of that while the process used less than ``IO_BOUND`` of a CPU
    (its threads sleep on I/O), unless the process's threads waited for a CPU meanwhile (``queued_s``; never
    longer than ``STARVED_MAX_PERIODS`` periods): slow handlers and handlers that wait on a database soon
    get a thread each, while short ones that keep the process busy
    are run by a few threads, which take the GIL from each other less often than one per slot would. The worker
    starts two: a second thread costs CPU per job but overlaps one call's blocking I/O with the next, which drains
    faster on an idle machine, with one process or two (docs/benchmarks.md, "Job threads for I/O-bound sync
    handlers")."""

    def __init__(self, max_threads: int, name: str = "ringfence-job", *, first_threads: int = 1,
                 grow_after_s: float = 0.005, grace_s: float = OVERRUN_GRACE_S) -> None:
        self.max_threads = max_threads
        self.grace_s = grace_s
        self.first_threads = min(first_threads, max_threads)
        self.grow_after_s = grow_after_s
        self.name = name
        self.running: set[SyncRun] = set()  # submitted, not yet returned (as the loop knows)
        self._calls: queue.SimpleQueue[SyncRun | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._done: collections.deque[SyncRun] = collections.deque()
        self._lock = threading.Lock()
        self._wake_pending = False  # the loop is told, or about to be, that calls finished
        self._deferred = False  # a finished call did not tell the loop: ``_poll`` will find it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_at = 0.0
        self._waiting: collections.deque[SyncRun] = collections.deque()  # queued while every thread was busy
        self._grower: asyncio.TimerHandle | None = None
        self._last_start = 0.0  # time.monotonic() when a thread last took a call
        # The process's threads' run-queue wait (s) when the grower last found a call waiting with no thread free
        # (None: not yet in this wait); one more thread only if it grew by less than ``STARVED`` of a period since.
        self._queued_since: float | None = None
        self._cpu_since: tuple[float, float] | None = None  # (time.monotonic(), process CPU s) at the last look
        # A thread that finishes a call while others wait in the queue does not wake the loop (unless
        # ``wake_batch`` are done): it runs the next one, and the loop hears of both when the queue runs dry or
        # ``_poll`` looks, within ``poll_s``. One loop wake-up for several jobs: the loop and the job threads take
        # the GIL from each other less often (half the slots as the batch cost 10 % more CPU per peer job).
        self.wake_batch = max_threads
        self.poll_s = 0.002
        self._poller: asyncio.TimerHandle | None = None
        self._closed = False

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout_s: float = 0.0,
               ctx: JobContext | None = None, task: str = "", on_overrun: Callable[[], None] | None = None,
               then: Callable[[SyncRun], None] | None = None, owner: Any = None) -> SyncRun:
        """Queue a call; with ``timeout_s``, the watchdog sets ``ctx.cancelled`` once it is past it (counted from
        the call's start in its thread) and calls ``on_overrun`` if it is still running ``grace_s`` later. Its
        outcome comes in its ``future``, or with ``then``: ``then(run)`` on the loop once its thread returned
        (``result``, ``error``, ``overran``), and no future."""
        loop = self._loop = asyncio.get_running_loop()
        run = SyncRun(fn, args, kwargs, None if then else loop.create_future(), timeout_s, ctx, task, on_overrun)
        if then is not None:
            run.then, run.owner = then, owner
        run.submitted = now = time.monotonic()
        self.running.add(run)
        self._calls.put(run)
        if len(self.running) > len(self._threads) and len(self._threads) < self.max_threads:  # all threads busy
            if len(self._threads) < self.first_threads:
                self._start_thread()
            else:
                self._waiting.append(run)
                if self._grower is None:
                    self._queued_since = self._cpu_since = None  # read once a call has waited (not per arming)
                    self._grower = loop.call_later(self.grow_after_s, self._grow)
        if timeout_s:
            self._arm(now + timeout_s)  # its earliest deadline: it has not started yet
        self._poll_later()
        return run

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True)
        self._threads.append(t)
        t.start()

    def _grow(self) -> None:
        """One more thread when a call has waited ``grow_after_s`` for one (slow handlers: up to one per slot)."""
        self._grower = None
        waiting = self._waiting
        while waiting and waiting[0].started is not None:
            waiting.popleft()
        if not waiting or len(self._threads) >= self.max_threads:
            waiting.clear()
            return
        now, period = time.monotonic(), self.grow_after_s
        waited = now - waiting[0].submitted
        if waited >= period * IO_WAIT and self._grows(now, waited):
            queued = self.queued_s()
            since, self._queued_since = self._queued_since, queued
            held = waited >= period * STARVED_MAX_PERIODS
            if held or (since is not None and queued - since < period * STARVED):
                self._start_thread()
                waiting.popleft()
        if waiting and self._loop is not None:
            self._grower = self._loop.call_later(self.grow_after_s, self._grow)

    def _grows(self, now: float, waited: float) -> bool:
        """Would one more thread run a waiting call sooner? Yes when every thread is held by a slow call (none took
        a call for a period while one waited that long), or when the threads sleep on I/O: the process used less
        than ``IO_BOUND`` of a CPU since the last look (this look's CPU reading is kept for the next one)."""
        period = self.grow_after_s
        if waited >= period and now - self._last_start >= period:
            return True
        cpu = self.cpu_s()
        last, self._cpu_since = self._cpu_since, (now, cpu)
        return last is not None and cpu - last[1] < IO_BOUND * (now - last[0])

    @staticmethod
    def cpu_s() -> float:
        """CPU seconds of this process, every thread counted."""
        return time.process_time()

    @staticmethod
    def queued_s() -> float:
        """Seconds this process's threads have spent runnable but waiting for a CPU (Linux schedstat; 0 where
        it cannot be read). When they spent ``STARVED`` of the grower's wait so (a busy machine), no call started
        because the process was not given a CPU, not because a slow call holds every thread: another thread
        would not run the waiting call sooner, and on this path each one added costs CPU per job (the GIL
        taken from each other more often)."""
        total = 0
        try:
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                    total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            pass  # a thread ended between the listing and the read, or no schedstat here
        return total / 1e9

    def _work(self) -> None:
        calls, done = self._calls, self._done
        while True:
            run = calls.get()
            if run is None:
                return
            run.started = self._last_start = time.monotonic()
            try:
                run.result = run.fn(*run.args, **run.kwargs)
            except BaseException as exc:  # the handler's outcome, whatever it is
                run.error = exc
            run.finished = True
            run.fn = run.args = run.kwargs = None  # type: ignore[assignment]  # free the payload early
            done.append(run)
            with self._lock:
                if self._wake_pending:
                    continue
                if len(done) < self.wake_batch and not calls.empty():
                    self._deferred = True  # more calls wait for a thread: the poller settles this one
                    continue
                self._wake_pending = True
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the process is exiting
                    self._loop.call_soon_threadsafe(self._settle)

    def _settle(self) -> None:
        with self._lock:
            self._wake_pending = self._deferred = False
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        done, running = self._done, self.running
        while done:
            run = done.popleft()
            run.returned = True
            running.discard(run)
            future = run.future
            if future is None:
                try:
                    run.then(run)  # type: ignore[misc]
                except Exception:  # never lose the other calls' outcomes
                    log.exception("sync call %s: handing its outcome back failed", run.task)
            elif not future.done():  # cancelled: its caller stopped waiting
                if run.error is not None:
                    future.set_exception(run.error)
                else:
                    future.set_result(run.result)
            run.error = run.owner = None  # no reference cycle through the traceback
            for waiter in run.waiters or ():
                if not waiter.done():
                    waiter.set_result(None)
        self._poll_later()

    def _poll_later(self) -> None:
        """Look again in ``poll_s`` while a finished call may be deferred: only while calls are queued can one be
        (both read under the lock the threads decide under), and a new call re-arms this."""
        if self._poller is not None or self._loop is None:
            return  # armed already (or nothing submitted yet)
        with self._lock:
            maybe = self._deferred or not self._calls.empty()
        if maybe:
            self._poller = self._loop.call_later(self.poll_s, self._poll)

    def _poll(self) -> None:
        self._poller = None
        with self._lock:
            deferred = self._deferred
        if deferred or self._done:
            self._settle()
        else:
            self._poll_later()

    async def wait_returned(self, run: SyncRun) -> None:
        """Wait until ``run``'s thread has returned (whether or not anyone still waits for its outcome)."""
        if run.returned:
            return
        waiter = asyncio.get_running_loop().create_future()
        if run.waiters is None:
            run.waiters = []
        run.waiters.append(waiter)
        await waiter

    # -- the watchdog: one timer for every call's time bound --------------------------------------------------
    def _arm(self, at: float) -> None:
        if self._watchdog is not None and self._watchdog_at <= at:
            return
        if self._watchdog is not None:
            self._watchdog.cancel()
        assert self._loop is not None
        self._watchdog_at = at
        self._watchdog = self._loop.call_later(max(0.0, at - time.monotonic()), self._watch)

    def _watch(self) -> None:
        self._watchdog = None
        now = time.monotonic()
        earliest: float | None = None
        for run in list(self.running):
            if run.finished or run.stuck or not run.timeout_s:
                continue
            due = self._due(run, now)
            if due is None:
                continue
            if earliest is None or due < earliest:
                earliest = due
        if earliest is not None:
            self._arm(earliest)

    def _due(self, run: SyncRun, now: float) -> float | None:
        """(the watchdog) Act on ``run`` if a bound of it passed: its timeout, then the grace after it. When to
        look at it again (None: never)."""
        started = run.started
        if started is None:
            return now + run.timeout_s  # a call counts from its start
        due = started + run.timeout_s + (self.grace_s if run.overran else 0.0)
        if due > now:
            return due
        if not run.overran:
            run.overran = True
            _overran(run, self.grace_s)
            return due + self.grace_s
        run.stuck = True
        _stuck(run)
        return None

    def close(self) -> None:
        """Stop idle threads; calls not started yet are dropped (a running one ends on its own)."""
        if self._closed:
            return
        self._closed = True
        for timer in (self._watchdog, self._grower, self._poller):
            if timer is not None:
                timer.cancel()
        while True:
            try:
                run = self._calls.get_nowait()
            except queue.Empty:
                break
            if run is not None:
                self.running.discard(run)  # it never reaches a thread
                if run.future is not None:
                    run.future.cancel()
        for _ in self._threads:
            self._calls.put(None)


def _overran(run: SyncRun, grace_s: float) -> None:
    ctx = run.ctx
    if ctx is not None:
        ctx.cancelled.set()
        job_logger(ctx).warning(
            "job %s (%s): sync handler exceeded its timeout of %gs; ctx.cancelled is set; if it has not returned in "
            "%gs this worker is replaced (a thread cannot be stopped)", ctx.id, run.task, run.timeout_s, grace_s)


def _stuck(run: SyncRun) -> None:
    ctx = run.ctx
    if ctx is not None:
        job_logger(ctx).error(
            "job %s (%s): sync handler still running after its timeout of %gs and the grace; a thread cannot be "
            "stopped, so this worker stops fetching and is replaced; the job stays leased to this run until its "
            "thread ends", ctx.id, run.task, run.timeout_s)
    if run.on_overrun is not None:
        run.on_overrun()


async def call_sync(runner: SyncRunner, task: Task, ctx: JobContext, args: tuple[Any, ...],
                    kwargs: dict[str, Any], timeout_s: float, *, on_thread: Callable[[SyncRun], None],
                    on_overrun: Callable[[], None], fn: Callable[..., Any] | None = None) -> Any:
    """Run a sync handler on ``runner``'s threads; ``on_thread`` receives its ``SyncRun`` (``done()`` once its
    thread has returned). The timeout counts from the moment the thread starts. Past it: ``ctx.cancelled`` is
    set, ``on_overrun`` is called if the thread has not returned ``grace_s`` later (the worker must be
    replaced), and this call still waits for the thread, then raises ``JobTimeout``. Cancelling this call never
    stops the thread: the caller decides what becomes of a job whose thread still runs."""
    run = runner.submit(fn or task.fn, (ctx, *args), kwargs, timeout_s, ctx, task.name, on_overrun)
    on_thread(run)
    assert run.future is not None
    try:
        value = await run.future  # the handler's own return or error
    except asyncio.CancelledError:
        raise
    except BaseException:
        run.check_overrun(timeout_s)
        raise
    run.check_overrun(timeout_s)
    return value
