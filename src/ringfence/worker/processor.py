"""Fetch → run → ack/retry/dead-letter. The one place where a job's outcome is decided."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson

from ringfence import results
from ringfence.app import App
from ringfence.errors import BadRecord, PayloadError, PayloadTooNew
from ringfence.faults import fault_point
from ringfence.logs import JobLogger, job_logger
from ringfence.metrics import Metrics
from ringfence.models import DeadJob, Fetched, JobSpec
from ringfence.redis.broker import Broker
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.waker import Waker
from ringfence.settings import WorkerSettings
from ringfence.tasks import JobContext, Task
from ringfence.worker.calls import JobTimeout, SyncRunner, call_async, call_sync
from ringfence.worker.durable import write_row
from ringfence.worker.fencing import Fencing
from ringfence.worker.gates import Gates
from ringfence.worker.heartbeat import Lease, Slot
from ringfence.worker.outcomes import Outcome, Running, classify, dependency_ok, fence_outcome, weighted_order

log = logging.getLogger("ringfence.worker")


class Processor:
    def __init__(self, app: App, broker: Broker, queues: list[tuple[str, int]], *, concurrency: int,
                 strict: bool, settings: WorkerSettings, server_id: str,
                 on_restart_required: Callable[[], None], max_wait: dict[str, float] | None = None,
                 metrics: Metrics | None = None) -> None:
        self.app = app
        self.broker = broker
        self.queues = queues
        self.concurrency = concurrency
        self.strict = strict
        self.settings = settings
        self.server_id = server_id
        self.on_restart_required = on_restart_required
        self.running: dict[str, Running] = {}
        self.leftover: dict[str, Running] = {}  # lost sync jobs whose thread still runs: they keep their slot
        self.pool = SyncRunner(concurrency)
        self.waker = Waker(broker, server_id, [q for q, _ in queues])
        self.stopping = asyncio.Event()
        self.shutting_down = False
        self._slot = asyncio.Event()
        self._seq = 0
        self._acks: dict[str, list[tuple[str, str]]] = defaultdict(list)
        self._ack_ready = asyncio.Event()
        self._acker: asyncio.Task[None] | None = None
        self.processed = 0
        self.failed = 0
        self.threads: set[Any] = set()  # futures of sync handlers still running in the pool
        self.max_wait = max_wait or {}   # queue -> starvation bound (s): served first once exceeded
        self._starving: list[str] = []
        self._starving_at = 0.0
        self._warned: set[tuple[str, str]] = set()  # (counter, task) warned, (counter, job id) alerted
        self._unmark: asyncio.Task[None] | None = None
        self.metrics = metrics or Metrics()
        self.fencing = Fencing(app, broker, settings, observe=self.metrics.fence_outcome)
        self.gates = Gates(app, broker, settings)

    # -- fetching -------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.waker.start()
        self._acker = asyncio.create_task(self._ack_loop(), name="acker")
        backoff = 0.1
        while not self.stopping.is_set():
            try:
                await self._cycle()
                backoff = 0.1
            except Exception as exc:
                # Redis went away (restart, failover, network): running jobs go on; fetching resumes when
                # it answers again. Leases cover the gap. The outage is logged once, by the broker's health.
                if isinstance(exc, UNAVAILABLE):
                    self.broker.health.lost(exc)
                else:
                    log.exception("fetch loop: Redis error; retrying in %.1fs", backoff)
                await self._until(asyncio.sleep(backoff))
                backoff = min(backoff * 2, 5.0)
                await self.waker.restart()

    async def _cycle(self) -> None:
        free = self.concurrency - len(self.running) - len(self.leftover)
        if free <= 0:
            self._slot.clear()
            await self._until(self._slot.wait())
            return
        if await self._fetch(free):
            return
        if self._unmark is not None:
            unmark, self._unmark = self._unmark, None
            await unmark  # never let a late "busy" erase the new idle mark
        await self.waker.mark_idle(self.settings.heartbeat_s + 1)
        if not await self._fetch(free):
            await self._until(self.waker.wait(self.settings.heartbeat_s))
        # Clear the idle mark off the wake-up path: the next fetch need not wait for it.
        self._unmark = asyncio.create_task(self.waker.mark_busy())

    async def _until(self, aw: Any) -> None:
        """Await ``aw`` unless the worker is asked to stop first."""
        waiter = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
        for t in (waiter, stop):
            if not t.done():
                t.cancel()
        error = waiter.exception() if waiter.done() and not waiter.cancelled() else None
        if error is not None:
            raise error

    async def _order(self) -> list[str]:
        order = weighted_order(self.queues, self.strict)
        if not self.max_wait:
            return order
        now = self.broker.clock()
        if now - self._starving_at > 500:  # checked twice a second at most: two reads per bounded queue
            self._starving_at = now
            self._starving = []
            for queue, bound_s in self.max_wait.items():
                oldest = await self.broker.oldest_enqueued_ms(queue)
                if oldest is not None and now - oldest > bound_s * 1000:
                    self._starving.append(queue)
        return self._starving + [q for q in order if q not in self._starving]

    async def _fetch(self, free: int) -> int:
        now = self.broker.clock()
        for queue in await self._order():
            self._seq += 1
            token = f"{self.server_id}.{self._seq}"
            deadline = now + int(self.settings.lease_s * 1000)
            got = await self.broker.arun(self.broker.fetch(queue, free, deadline, token))
            dangling = [job_id for job_id, _, attempt in got if attempt == 0]
            if dangling:
                got = [g for g in got if g[2] > 0]
                log.error("queue %s: %d queued id(s) had no job record and were dropped (counted as "
                          "'dangling'): %s", queue, len(dangling), " ".join(dangling[:10]))
            for job_id, raw, attempt in got:
                self._start(Fetched(job_id, queue, raw, attempt, token, now))
            if got or dangling:
                return len(got) or 1  # dangling only: fetch again at once, the queue may hold more
        return 0

    def _start(self, job: Fetched) -> None:
        r = Running(job)
        self.running[job.id] = r
        r.task = asyncio.create_task(self._execute(r))

    # -- running --------------------------------------------------------------------------------
    async def _execute(self, r: Running) -> None:
        try:
            outcome = await self._outcome(r)
            if not r.settled and not r.lost and outcome.kind not in ("lost", "abandoned"):
                await self._record(r, outcome)
        except Exception:
            self._log(r).exception("job %s: recording its outcome failed; its lease will expire and it runs again",
                                   r.job.id)
        finally:
            for table in (self.running, self.leftover):
                if table.get(r.job.id) is r:
                    del table[r.job.id]
            self._slot.set()

    async def _outcome(self, r: Running) -> Outcome:
        job = r.job
        try:
            spec = JobSpec.decode(job.raw)
        except BadRecord as exc:  # written straight into Redis by something else: no retry can fix it
            return Outcome("dead", "bad_record", f"job {job.id}: {exc}")
        job.spec = spec
        task = self.app.registry.get(spec.task)
        if task is None:
            known = ", ".join(sorted(self.app.registry.tasks)) or "none"
            return await self._unreadable(job, spec, f"task {spec.task!r} is not registered in this worker "
                                          f"(it knows: {known})", "unknown_task", dead_after_grace=True)
        refused = self._refuse(job, spec, task)
        settling = refused is not None and await self.fencing.settles(
            job, refused.reason, spec.max_attempts or task.options.retry.max_attempts)
        if refused is not None and not settling:
            return refused
        try:
            args, kwargs = task.codec.decode(spec.version, spec.args)
        except PayloadTooNew as exc:
            return await self._unreadable(job, spec, str(exc), "newer_version", dead_after_grace=False)
        except PayloadError as exc:
            return Outcome("dead", "bad_payload", str(exc))
        wait = await self.gates.enter(job, task)
        if wait is not None:
            return Outcome("requeue", delay_s=wait.delay_s, counter=wait.counter)
        try:
            outcome = await self._run(r, task, spec, args, kwargs, settling)
        finally:
            if not r.abandoned:  # an abandoned thread keeps its slots until their leases lapse
                await self.gates.release(job)
        await self.gates.record(job, task, dependency_ok(outcome))
        return outcome

    async def _run(self, r: Running, task: Task, spec: JobSpec, args: tuple[Any, ...],
                   kwargs: dict[str, Any], settling: bool = False) -> Outcome:
        job = r.job
        timeout_s = spec.timeout_ms / 1000 if spec.timeout_ms else task.options.timeout_s
        r.started = time.monotonic()
        self.metrics.job_started(task.name, job.queue, (self.broker.clock() - spec.enqueued_ms) / 1000)
        r.ctx = ctx = JobContext(
            id=job.id, task=task.name, queue=job.queue, attempt=job.attempt,
            max_attempts=spec.max_attempts or task.options.retry.max_attempts,
            enqueued_ms=spec.enqueued_ms, token=job.token, timeout_s=timeout_s, fencing=self.fencing,
            settling=settling, deadline=r.started + timeout_s,
        )
        try:
            value = await self._call(r, task, ctx, args, kwargs, timeout_s)
        except asyncio.CancelledError:
            if r.lost:
                return Outcome("lost")
            if r.abandoned:
                return Outcome("abandoned")
            if self.shutting_down:
                return Outcome("requeue", counter="requeued_on_shutdown")
            raise
        except JobTimeout as exc:
            return self._failure(task, ctx, TimeoutError(str(exc)), "")
        except BaseException as exc:  # a handler's error of any kind is the job's outcome
            return self._failure(task, ctx, exc, traceback.format_exc())
        if task.store_result:
            try:
                return Outcome("ack", result=results.done_record(task, job.queue, value, self.broker.clock()))
            except PayloadError as exc:  # the effect happened: dead-letter keeps the job, retrying would repeat it
                return Outcome("dead", results.BAD_RESULT, f"job {job.id}: {exc}")
        return Outcome("ack")

    def _refuse(self, job: Fetched, spec: JobSpec, task: Task) -> Outcome | None:
        max_attempts = spec.max_attempts or task.options.retry.max_attempts
        if job.attempt > max_attempts:
            return Outcome("dead", "max_attempts", f"attempt {job.attempt} exceeds max_attempts={max_attempts} "
                           "(earlier attempts were orphaned)")
        expiry_ms = spec.expires_ms or (
            spec.enqueued_ms + int(task.options.expiry_s * 1000) if task.options.expiry_s is not None else None)
        if expiry_ms is not None and self.broker.clock() > expiry_ms:
            return Outcome("dead", "expired", f"job expired at {expiry_ms} ms before it could run")
        return None

    async def _unreadable(self, job: Fetched, spec: JobSpec, why: str, counter: str,
                          dead_after_grace: bool) -> Outcome:
        """A job this worker cannot read yet (rolling deploy): wait without burning an attempt; past the grace
        period alert once, or give up to dead-letter when no worker will ever read it."""
        s = self.settings
        age_s = (self.broker.clock() - spec.enqueued_ms) / 1000
        if age_s <= s.grace_s:
            first = (counter, spec.task) not in self._warned  # once per task and worker, not every defer_s
            self._warned.add((counter, spec.task))
            self._log(Running(job)).log(logging.WARNING if first else logging.DEBUG,
                                        "job %s: %s; retried every %gs without burning an attempt%s", job.id, why,
                                        s.defer_s, " (said once per task)" if first else "")
            return Outcome("requeue", delay_s=s.defer_s, counter=counter)
        if dead_after_grace:
            return Outcome("dead", counter, f"{why}; still unreadable {age_s:.0f}s after enqueue "
                                            f"(grace_s={s.grace_s:g})")
        if (counter, job.id) not in self._warned:  # past the grace period: alert once per job and worker
            self._warned.add((counter, job.id))
            await self.app.alert(counter, f"job {job.id}: {why}; waiting {age_s:.0f}s, past grace_s={s.grace_s:g}",
                                 {"job_id": job.id, "queue": job.queue, "task": spec.task, "version": spec.version})
        return Outcome("requeue", delay_s=s.defer_s, counter=counter)

    async def _call(self, r: Running, task: Task, ctx: JobContext, args: tuple[Any, ...], kwargs: dict[str, Any],
                    timeout_s: float) -> Any:
        if task.is_async:
            return await call_async(task, ctx, args, kwargs, timeout_s)
        earlier = self.leftover.get(ctx.id)
        if earlier is not None and earlier.thread is not None:
            # This job's previous run (its lease lost) still runs in this process: never two at once.
            await asyncio.wait([earlier.thread])

        def on_thread(future: asyncio.Future[Any]) -> None:
            r.thread = future
            self.threads.add(future)
            future.add_done_callback(self.threads.discard)

        return await call_sync(self.pool, task, ctx, args, kwargs, timeout_s, on_thread=on_thread,
                               on_overrun=self.on_restart_required)

    def _failure(self, task: Task, ctx: JobContext, exc: BaseException, tb: str) -> Outcome:
        fence = fence_outcome(exc)
        if fence is not None:
            self.metrics.fence_outcome("-", fence)
        return classify(task, ctx, exc, tb)

    # -- recording ------------------------------------------------------------------------------
    async def _record(self, r: Running, o: Outcome) -> None:
        job, b = r.job, self.broker
        r.settled = True
        if r.started and job.spec is not None:
            self.metrics.job_finished(job.spec.task, job.queue, o.kind, time.monotonic() - r.started)
        if o.kind == "ack":
            self.processed += 1
            if o.reason == "duplicate":
                self._log(r).info("job %s: %s; acked as a duplicate", job.id, o.error)
            if o.result is not None:  # stored before the ack: a crash between them reruns the job, never loses it
                await results.store(self.app, b, job.id, job.spec.task if job.spec else "", o.result)
            self._acks[job.queue].append((job.id, job.token))
            self._ack_ready.set()
            return
        if o.kind == "requeue":
            at = b.clock() + int(o.delay_s * 1000) if o.delay_s else 0
            await b.arun(b.requeue(job.queue, job.id, job.token, at, o.counter))
            return
        self.failed += 1
        entry = {"attempt": job.attempt, "error": o.error, "at": b.clock(), "worker": self.server_id}
        if o.kind == "retry":
            self._log(r).warning("job %s attempt %d failed: %s; retry in %.1fs", job.id, job.attempt, o.error,
                                 o.delay_s)
            await b.arun(b.retry(job.queue, job.id, job.token, b.clock() + int(o.delay_s * 1000), entry))
            return
        task_name = job.spec.task if job.spec is not None else "?"
        r.sweeping = True  # the lease is renewed while the steps are checked: a lapse would lose the dead-letter
        try:
            named = await self._leaving(job, o)
            if named is None:
                return  # not dead-lettered blind: the lease lapses and the next attempt does it again
            o = named
            fields = {"reason": o.reason, "error": o.error, "traceback": o.tb, "task": task_name, "queue": job.queue}
            durable = job.spec is not None and self.app.failed_jobs is not None
            took = await b.arun(b.dead(job.queue, job.id, job.token, entry, fields, durable=durable))
        finally:
            r.sweeping = False
        if not took:
            self._log(r).warning("job %s: dead-letter [%s] refused: its lease had moved on; the attempt holding "
                                 "it now decides (it names the steps in doubt): %s", job.id, o.reason, o.error)
            return
        self._log(r).error("job %s (%s) -> dead-letter [%s]: %s", job.id, task_name, o.reason, o.error)
        await results.store_failure(self.app, b, job.id, job.queue, task_name, o.reason, o.error)
        fault_point("after_dead_letter")  # a kill here leaves the failed_jobs row owed: the sweep writes it
        await self._dead_hooks(job, o, task_name)

    async def _leaving(self, job: Fetched, o: Outcome) -> Outcome | None:
        """Name the steps a dead job leaves behind; a ``calling`` one is now in doubt, and so is the job.
        None: they could not be checked."""
        left = await self.fencing.leaving(job)
        if left is None:
            return None
        notes, in_doubt = left
        if not notes:
            return o
        return replace(o, reason="in_doubt" if in_doubt else o.reason, error="; ".join([o.error, *notes]))

    @staticmethod
    def _log(r: Running) -> JobLogger:
        """A logger whose lines carry the job's id, task, queue, attempt and fence keys."""
        if r.ctx is not None:
            return job_logger(r.ctx)
        job = r.job
        return job_logger(job_id=job.id, task=job.spec.task if job.spec else None, queue=job.queue,
                          attempt=job.attempt)

    async def _dead_hooks(self, job: Fetched, o: Outcome, task_name: str) -> None:
        spec = job.spec
        dead = DeadJob(id=job.id, queue=job.queue, task=task_name, args=spec.args if spec else {},
                       reason=o.reason, error=o.error, traceback=o.tb, attempts=job.attempt,
                       died_ms=self.broker.clock(), history=[])
        if spec is not None:
            await write_row(self.app, self.broker, dead, orjson.loads(spec.encode()))
        for hook in self.app.dead_hooks:
            try:
                result = hook(dead)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("on_dead hook %r failed for job %s", hook, job.id)

    async def _ack_loop(self) -> None:
        while True:
            await self._ack_ready.wait()
            self._ack_ready.clear()
            try:
                await self.flush_acks()
            except Exception as exc:
                if isinstance(exc, UNAVAILABLE):
                    self.broker.health.lost(exc)
                else:
                    log.exception("acks failed; retrying in 0.5s")
                await asyncio.sleep(0.5)
                self._ack_ready.set()

    async def flush_acks(self) -> None:
        pending, self._acks = self._acks, defaultdict(list)
        for queue in list(pending):
            pairs = pending[queue]
            try:
                lost = await self.broker.arun(self.broker.ack(queue, pairs))
            except BaseException:
                for q, left in pending.items():  # keep what was not acked for the next flush
                    self._acks[q].extend(left)
                raise
            del pending[queue]
            if lost:
                log.warning("ack of %d job(s) in %s refused: their lease had moved to another attempt: %s",
                            len(lost), queue, " ".join(lost[:10]))

    # -- leases and shutdown --------------------------------------------------------------------
    def leases(self) -> list[Lease]:
        """The leases the heartbeat renews: running jobs not settled yet, and those on their way to dead-letter."""
        return [Lease(r.job.queue, r.job.id, r.job.token, r.job.started_ms) for r in list(self.running.values())
                if not ((r.settled and not r.sweeping) or r.lost)]

    def slots(self) -> list[Slot]:
        return [Slot(*held) for held in self.gates.slots()]

    def lease_lost(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            r = self.running.get(job_id)
            if r is None or r.settled:
                continue
            log.error("job %s lost its lease (another attempt owns it now, or a person cancelled it); stopping this "
                      "run", job_id)
            r.lost = True
            if r.ctx is not None:
                r.ctx.cancelled.set()
            if r.thread is not None and not r.thread.done():
                # Its thread cannot be stopped: it keeps its slot (and the job id) until it returns.
                self.leftover[job_id] = self.running.pop(job_id)
            elif r.task is not None:
                r.task.cancel()

    async def _count_abandoned(self, runs: list[Running]) -> None:
        """``abandoned_on_shutdown`` per queue: the doctor tells these from workers that died."""
        try:
            for queue in {r.job.queue for r in runs}:
                await self.broker.count(queue, "abandoned_on_shutdown", sum(r.job.queue == queue for r in runs))
        except Exception:
            log.exception("shutdown: could not count the abandoned jobs")

    async def drain(self, timeout_s: float) -> None:
        """Stop fetching, let running jobs finish for ``timeout_s``, then cancel them and requeue the rest."""
        self.stopping.set()
        tasks = [r.task for r in self.running.values() if r.task is not None]
        if tasks:
            log.info("shutdown: waiting up to %gs for %d running job(s)", timeout_s, len(tasks))
            await asyncio.wait(tasks, timeout=timeout_s)
        self.shutting_down = True
        left = [r for r in [*self.running.values(), *self.leftover.values()] if r.task and not r.task.done()]
        for r in left:
            if r.ctx is not None:
                r.ctx.cancelled.set()
            # A sync handler's thread still running cannot be stopped: its job keeps its lease until this
            # process exits and is returned when the lease lapses, so it never runs twice at once.
            r.abandoned = r.thread is not None and not r.thread.done()
            r.task.cancel()  # type: ignore[union-attr]
        abandoned = [r for r in left if r.abandoned and not r.lost]
        if abandoned:
            log.warning("shutdown: %d sync handler(s) still running; their jobs return to the queue when their "
                        "leases lapse after this process exits (the attempt counts as orphaned)", len(abandoned))
            await self._count_abandoned(abandoned)
        requeued = sum(not r.abandoned for r in left)
        if requeued:
            log.warning("shutdown: returning %d unfinished job(s) to their queue", requeued)
        if left:
            await asyncio.wait([r.task for r in left if r.task is not None], timeout=5)
        await self.flush_acks()
        if self._acker is not None:
            self._acker.cancel()
        await self.waker.close()
        self.pool.close()
