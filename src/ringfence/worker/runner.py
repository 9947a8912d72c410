"""Run → classify: one admitted job's handler under its time bound, and its verdict (with the result record of
a task that stores results).

Async handlers run on the event loop (``calls.call_async``); sync handlers on the job threads (``Runner.start_sync``,
or ``calls.call_sync`` for a gated job; the sync thread rule in docs/architecture.md). A job whose previous run in
this process lost its lease but still holds a thread waits for that thread: never two runs of one job at once."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Callable
from typing import Any

from ringfence import results
from ringfence.errors import PayloadError
from ringfence.tasks import JobContext, Task
from ringfence.worker import workflows
from ringfence.worker.admit import Admitted
from ringfence.worker.calls import AsyncBounds, JobTimeout, SyncRun, SyncRunner, call_async, call_sync
from ringfence.worker.observers import Observers
from ringfence.worker.outcomes import Outcome, Verdict, classify
from ringfence.worker.running import Running

ACK = Verdict(Outcome.ACK)
LOST = Verdict(Outcome.LOST)
ABANDONED = Verdict(Outcome.ABANDONED)
REQUEUED_ON_SHUTDOWN = Verdict(Outcome.REQUEUE, counter="requeued_on_shutdown")


class Runner:
    def __init__(self, pool: SyncRunner, clock: Callable[[], int], fencing: Any, observers: Observers,
                 leftover: dict[str, Running], on_restart_required: Callable[[], None]) -> None:
        self.pool, self.clock, self.fencing, self.observers = pool, clock, fencing, observers
        self.leftover = leftover  # lost sync jobs whose thread still runs (the processor's table)
        self.on_restart_required = on_restart_required  # a sync job outlived its timeout (exit 75)
        self.shutting_down = False  # from the stop's start: ctx.cancelled set; a cancelled job requeued, not an error
        self.bounds = AsyncBounds()  # async handlers' time bounds: one timer for all
        self.lease_until, self.lease_ms = fencing.leases.until, fencing.lease_ms  # the lease book (heartbeat.py)

    def begin(self, r: Running, a: Admitted) -> tuple[JobContext, float, Callable[..., Any]]:
        """The handler is about to run: its context, its timeout (s) and what to call (the observers' wrapper)."""
        job, task, spec = r.job, a.task, a.spec
        timeout_s = spec.timeout_ms / 1000 if spec.timeout_ms else task.options.timeout_s
        r.started = time.monotonic()
        self.lease_until[job.id, job.token] = job.started_ms + self.lease_ms  # held until a renewal pushes it on
        self.observers.started(job, task, (self.clock() - spec.enqueued_ms) / 1000)
        r.ctx = ctx = JobContext(
            id=job.id, task=task.name, queue=job.queue, attempt=job.attempt,
            max_attempts=spec.max_attempts or task.options.retry.max_attempts,
            enqueued_ms=spec.enqueued_ms, token=job.token, timeout_s=timeout_s, fencing=self.fencing,
            settling=a.settling, deadline=r.started + timeout_s,
        )
        if "w" in spec.extra:
            ctx.workflow = workflows.step_of(spec.extra)
        if self.shutting_down:  # started after the stop began (admitted meanwhile): told at once
            ctx.cancelled.set()
        fn = self.observers.handler(job, spec, ctx, task.fn) if self.observers.wraps else task.fn
        return ctx, timeout_s, fn

    async def run(self, r: Running, a: Admitted) -> Verdict:
        ctx, timeout_s, fn = self.begin(r, a)
        task = a.task
        try:
            if task.is_async:
                value = await call_async(task, ctx, a.args, a.kwargs, timeout_s, self.bounds, fn=fn)
            else:
                value = await self._sync(r, task, ctx, a.args, a.kwargs, timeout_s, fn)
        except BaseException as exc:
            return self.raised(r, task, ctx, exc)
        return self.returned(r, a, value)

    def start_sync(self, r: Running, a: Admitted, then: Callable[[SyncRun], None]) -> bool:
        """``run``'s start of a sync handler without a coroutine: its call is queued for the job threads, and
        ``then(run)`` is called on the loop once the thread returned (``run.owner`` is ``(r, a)``): it asks
        ``outcome`` for the verdict. False: this job's previous run still holds a thread here; ``run`` waits."""
        earlier = self.leftover.get(r.job.id) if self.leftover else None
        if earlier is not None and earlier.thread is not None:
            return False
        ctx, timeout_s, fn = self.begin(r, a)
        task = a.task
        r.thread = self.pool.submit(fn, (ctx, *a.args), a.kwargs, timeout_s, ctx, task.name,
                                    self.on_restart_required, then, (r, a))
        return True

    def outcome(self, r: Running, a: Admitted, run: SyncRun) -> Verdict:
        """The verdict on a call of ``start_sync`` whose thread returned, as ``_sync`` and ``run`` reach it."""
        error = run.error
        if run.overran and not isinstance(error, asyncio.CancelledError):
            error = JobTimeout(run.timeout_s)
        if error is not None:
            assert r.ctx is not None
            return self.raised(r, a.task, r.ctx, error)
        return self.returned(r, a, run.result)

    def raised(self, r: Running, task: Task, ctx: JobContext, exc: BaseException) -> Verdict:
        """The verdict on the handler's error ``exc``; a cancellation that is not the worker's own is raised
        again."""
        if isinstance(exc, asyncio.CancelledError):
            if r.lost:
                return LOST
            if r.abandoned:
                return ABANDONED
            if self.shutting_down:
                return REQUEUED_ON_SHUTDOWN
            raise exc
        if isinstance(exc, JobTimeout):
            return self._failed(task, ctx, TimeoutError(str(exc)), "")
        return self._failed(task, ctx, exc, "".join(traceback.format_exception(exc)))  # an error of any kind

    def returned(self, r: Running, a: Admitted, value: Any) -> Verdict:
        task = a.task
        if "w" in a.spec.extra:
            return workflows.step_verdict(task, r.job, a.spec, value, self.clock())
        if task.store_result:
            job = r.job
            try:
                record = results.done_record(task, job.queue, value, self.clock(), a.spec.enqueued_ms)
                return Verdict(Outcome.ACK, result=record)
            except PayloadError as exc:  # the effect happened: dead-letter keeps the job, retrying would repeat it
                return Verdict(Outcome.DEAD, results.BAD_RESULT, f"job {job.id}: {exc}")
        return ACK

    @property
    def threads(self) -> set[SyncRun]:
        """Sync handlers whose thread has not returned (or that wait for one)."""
        return self.pool.running

    async def _sync(self, r: Running, task: Task, ctx: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any],
                    timeout_s: float, fn: Callable[..., Any]) -> Any:
        """A sync handler ``start_sync`` did not take (a gated job, or one whose earlier run holds a thread)."""
        earlier = self.leftover.get(ctx.id) if self.leftover else None
        if earlier is not None and earlier.thread is not None:
            # This job's previous run (its lease lost) still runs in this process: never two at once.
            await self.pool.wait_returned(earlier.thread)

        def on_thread(run: SyncRun) -> None:
            r.thread = run

        return await call_sync(self.pool, task, ctx, args, kwargs, timeout_s, on_thread=on_thread,
                               on_overrun=self.on_restart_required, fn=fn)

    def _failed(self, task: Task, ctx: JobContext, exc: BaseException, tb: str) -> Verdict:
        self.observers.raised(exc)
        return classify(task, ctx, exc, tb)
