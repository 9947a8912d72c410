"""The job pipeline of one worker, in order:

    fetch (fetcher.py) → decode, refuse or defer (admit.py) → gate (gates.py)
      → run and classify (runner.py, outcomes.py) → settle (settle.py; acks batched in acks.py)

with observers (observers/) for metrics, breakers, the failed-jobs table, ``on_dead`` hooks and alerts. The
processor owns the table of running jobs: it starts each fetched job as an asyncio task, tells the heartbeat
which leases to renew, stops a job whose lease was lost, and drains at shutdown."""

from __future__ import annotations

import asyncio
import logging

from ringfence.models import Fetched
from ringfence.redis.connect import until_answered
from ringfence.redis.connection import UNAVAILABLE
from ringfence.tasks import Task
from ringfence.worker.admit import Admission, Admitted, Asks
from ringfence.worker.calls import SyncRun, SyncRunner
from ringfence.worker.fetcher import Fetcher
from ringfence.worker.gates import Gates, holder
from ringfence.worker.heartbeat import Lease, Slot
from ringfence.worker.observers import Observers
from ringfence.worker.outcomes import Outcome, Verdict
from ringfence.worker.runner import Runner
from ringfence.worker.running import Running
from ringfence.worker.settle import Settler, Writes, job_log

log = logging.getLogger("ringfence.worker")

# A busy worker fetches once half its slots are free, or once a free slot has waited this long: one script
# call for several jobs instead of one per finished job, for at most this much delay in filling a slot.
REFILL_WAIT_S = 0.002


class Processor:
    def __init__(self, concurrency: int, fetcher: Fetcher, admission: Admission, gates: Gates, runner: Runner,
                 settler: Settler, observers: Observers, pool: SyncRunner) -> None:
        self.concurrency = concurrency
        self.fetcher, self.admission, self.gates, self.runner = fetcher, admission, gates, runner
        self.settler, self.observers, self.pool = settler, observers, pool
        self.acks = settler.acks
        self.broker = fetcher.broker
        self.stopping = fetcher.stopping
        self.running: dict[str, Running] = {}
        self.leftover = runner.leftover  # lost sync jobs whose thread still runs: they keep their slot
        self._slot = asyncio.Event()  # set once ``_want`` slots are free, or at a stop
        self.stopping.wakes.append(self._slot)
        self._want = 1
        self._refill = max(1, concurrency // 2)
        self._loop: asyncio.AbstractEventLoop  # the running loop, from ``run``

    @property
    def processed(self) -> int:
        return self.settler.processed

    @property
    def failed(self) -> int:
        return self.settler.failed

    @property
    def threads(self) -> set[SyncRun]:
        return self.runner.threads

    # -- fetching -------------------------------------------------------------------------------
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        await until_answered(self.fetcher.waker.start, self.broker.health, self.broker.connection.first_connect_s)
        self.acks.start()
        backoff = 0.1
        while not self.stopping.is_set():
            try:
                free = self._free()
                if free <= 0 or (free < self._refill and self.running):
                    await self._wait_slots(free)
                    free = self._free()
                if free > 0 and not self.stopping.is_set():  # a stop may have come during the wait
                    await self.fetcher.cycle(free, self._start)
                backoff = 0.1
            except Exception as exc:
                # Redis went away (restart, failover, network): running jobs go on; fetching resumes when
                # it answers again. Leases cover the gap. The outage is logged once, by the broker's health.
                if isinstance(exc, UNAVAILABLE):
                    self.broker.health.lost(exc)
                else:
                    log.exception("fetch loop: Redis error; retrying in %.1fs", backoff)
                await self.fetcher.until(asyncio.sleep(backoff))
                backoff = min(backoff * 2, 5.0)
                await self.fetcher.waker.restart()

    def _free(self) -> int:
        return self.concurrency - len(self.running) - len(self.leftover)

    async def _wait_slots(self, free: int) -> None:
        """Wait for a slot to free; with one free already, for ``_refill`` of them or ``REFILL_WAIT_S`` (a stop ends
        either wait: ``Stopping`` sets ``_slot``)."""
        self._slot.clear()
        if free <= 0:
            self._want = 1
            await self._slot.wait()
            return
        self._want = self._refill
        timer = asyncio.get_running_loop().call_later(REFILL_WAIT_S, self._slot.set)
        try:
            await self._slot.wait()
        finally:
            timer.cancel()
            self._want = 1

    def _start(self, job: Fetched) -> None:
        r = Running(job)
        self.running[job.id] = r
        try:
            a = self.admission.admit(job)
            if type(a) is Admitted and self._start_sync(r, a):
                return  # no Task: ``_returned`` records it once its thread returned
        except Exception:
            self._unrecorded(r)
            self._done(r)
            return
        r.task = self._loop.create_task(self._execute(r, a))  # asyncio.create_task without its Python frame

    # -- one job --------------------------------------------------------------------------------
    def _start_sync(self, r: Running, a: Admitted) -> bool:
        """An admitted sync job with no gate but its concurrency key's slot (fetch.lua took it): its handler's call
        is queued for the job threads, and its verdict is recorded by ``_returned`` (a Task and its wake-up per job
        spared). False: ``_execute`` runs it (an async one, one with another gate, or one whose earlier run still
        holds a thread here)."""
        task = a.task
        if task.is_async:
            return False
        keyed = self.gates.applies(r.job, task)
        if keyed and not self.gates.hold_key(r.job, task):
            return False
        if self.runner.start_sync(r, a, self._returned):
            return True
        if keyed:
            self.gates.held.pop(holder(r.job), None)  # ``_execute`` takes it again
        return False

    def _returned(self, run: SyncRun) -> None:
        """(on the loop, from the job threads' hand-back) ``_execute``'s end for a job ``_start_sync`` started: a
        plain ack is recorded here; anything to await (observers, another verdict) goes to a Task."""
        r, a = run.owner
        if r.abandoned:
            return  # ``drain`` gave it up: nothing is recorded; its key's slot ends with its lease
        if self.gates.held:
            self.gates.release_key(r.job)  # its thread returned: the key's next job may run
        try:
            verdict = self.runner.outcome(r, a, run)
            if self.observers.hears_ran(a.task):
                r.task = self._loop.create_task(self._execute(r, verdict, a.task))
                return
            writes = self._settle(r, verdict)
            if writes is not None:
                r.task = self._loop.create_task(self._write(r, writes))
                return
        except asyncio.CancelledError:
            pass  # the handler raised it (as its Task would have ended: nothing recorded)
        except Exception:
            self._unrecorded(r)
        self._done(r)

    async def _execute(self, r: Running, a: Admitted | Verdict | Asks, heard_by: Task | None = None) -> None:
        """Admit, run and settle one job; given a verdict (``_returned``'s), settle it, told first to the observers
        of ``heard_by``, its task."""
        try:
            verdict = await self._verdict(r, a)
            if heard_by is not None:
                await self.observers.ran(r.job, heard_by, verdict)
            writes = self._settle(r, verdict)
            if writes is not None:
                await writes()
        except Exception:
            self._unrecorded(r)
        finally:
            self._done(r)

    async def _write(self, r: Running, writes: Writes) -> None:
        """The settling writes of a verdict ``_returned`` could not record at once."""
        try:
            await writes()
        except Exception:
            self._unrecorded(r)
        finally:
            self._done(r)

    def _settle(self, r: Running, verdict: Verdict) -> Writes | None:
        """Record the verdict (unless the run lost its lease, was settled already, or has nothing to record);
        what is left to await, if anything."""
        if r.settled or r.lost or not verdict.recorded:
            return None
        return self.settler.settle(r, verdict)

    @staticmethod
    def _unrecorded(r: Running) -> None:
        """(in an ``except`` block) Log the error that kept ``r``'s outcome from being recorded."""
        job_log(r).exception("job %s: recording its outcome failed; its lease will expire and it runs again",
                             r.job.id)

    def _done(self, r: Running) -> None:
        """The job leaves the tables; its slot is free."""
        job_id = r.job.id
        if self.running.get(job_id) is r:
            del self.running[job_id]
        if self.leftover.get(job_id) is r:
            del self.leftover[job_id]
        if r.waiter is not None and not r.waiter.done():
            r.waiter.set_result(None)
        if self._free() >= self._want:
            self._slot.set()

    async def _verdict(self, r: Running, admitted: Admitted | Verdict | Asks) -> Verdict:
        job = r.job
        if callable(admitted):
            admitted = await admitted()
        if isinstance(admitted, Verdict):
            return admitted
        task = admitted.task
        gated = self.gates.applies(job, task)
        key_only = gated and self.gates.hold_key(job, task)  # its key's slot alone: nothing to await
        if gated and not key_only:
            wait = await self.gates.enter(job, task)
            if isinstance(wait, Verdict):  # its concurrency key cannot be built: dead-letter
                return wait
            if wait is not None:
                return Verdict(Outcome.REQUEUE, delay_s=wait.delay_s, counter=wait.counter)
        try:
            verdict = await self.runner.run(r, admitted)
        finally:
            if key_only and not r.abandoned:  # an abandoned thread keeps its slots until their leases lapse
                self.gates.release_key(job)
            elif gated and not r.abandoned:
                await self.gates.release(job)
        await self.observers.ran(job, task, verdict)
        return verdict

    def _waiter(self, r: Running) -> asyncio.Future[None]:
        """A future ``_done`` resolves: what ``drain`` waits on for a job with no Task."""
        r.waiter = self._loop.create_future()
        return r.waiter

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
        """Stop fetching, set every running job's ``ctx.cancelled`` (a job that starts from now on finds it set),
        let them finish for ``timeout_s``, then cancel them and requeue the rest."""
        self.stopping.set()
        self.runner.shutting_down = True
        for r in [*self.running.values(), *self.leftover.values()]:
            if r.ctx is not None:
                r.ctx.cancelled.set()
        tasks = [r.task if r.task is not None else self._waiter(r) for r in self.running.values()]
        if tasks:
            log.info("shutdown: ctx.cancelled set; waiting up to %gs for %d running job(s)", timeout_s, len(tasks))
            await asyncio.wait(tasks, timeout=timeout_s)
        # Still here: a job whose Task runs, or one with no Task whose thread has not returned (``_start_sync``).
        left = [r for r in [*self.running.values(), *self.leftover.values()] if r.task is None or not r.task.done()]
        for r in left:
            # A sync handler's thread still running cannot be stopped: its job keeps its lease until this
            # process exits and is returned when the lease lapses, so it never runs twice at once.
            r.abandoned = r.thread is not None and not r.thread.done()
            if r.task is not None:
                r.task.cancel()
            else:  # abandoned (its thread has not returned): nothing is recorded, as its cancelled Task would
                self._done(r)
        abandoned = [r for r in left if r.abandoned and not r.lost]
        if abandoned:
            log.warning("shutdown: %d sync handler(s) still running; their jobs return to the queue when their "
                        "leases lapse after this process exits (the attempt counts as orphaned)", len(abandoned))
            await self._count_abandoned(abandoned)
        requeued = sum(not r.abandoned for r in left)
        if requeued:
            log.warning("shutdown: returning %d unfinished job(s) to their queue", requeued)
        cancelled = [r.task for r in left if r.task is not None]
        if cancelled:
            await asyncio.wait(cancelled, timeout=5)
        await self.acks.stop(self.fetcher.lease_ms / 1000)
        await self.fetcher.waker.close()
        await self.fetcher.close()
        self.pool.close()
