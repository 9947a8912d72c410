"""Settle: record a verdict in Redis. Ack (batched, ``acks.py``; a stored result first), requeue, retry, or
dead-letter (waking result waiters with the reason); a job
leaving for dead-letter first has the fence steps it owns checked (a ``calling`` one is now in doubt, and so
is the job), with its lease renewed meanwhile. A task with ``durable_settle=True`` has each of these writes
confirmed by a replica (``WAIT``, redis/replicas.py) before its slot is free."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol, TypeVar

from ringfence import results
from ringfence.faults import fault_point
from ringfence.logs import JobLogger, job_logger
from ringfence.models import DeadJob, Fetched
from ringfence.offloop import HOP
from ringfence.redis.broker import Broker
from ringfence.redis.call import Call
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.replicas import run_and_wait
from ringfence.tasks import Registry
from ringfence.worker import workflows
from ringfence.worker.acks import Acks, ConfirmedAcks
from ringfence.worker.observers import Observers
from ringfence.worker.outcomes import Outcome, Verdict
from ringfence.worker.running import Running

T = TypeVar("T")
# What ``Settler.settle`` returns for a verdict it cannot record at once: await ``writes()`` to record it.
Writes = Callable[[], Awaitable[None]]


class Leaving(Protocol):
    """worker/fencing.py: the notes on the steps a dead job leaves behind (None: they could not be checked)."""

    async def leaving(self, job: Fetched) -> tuple[list[str], bool] | None: ...


class Settler:
    def __init__(self, broker: Broker, server_id: str, acks: Acks, fencing: Leaving, observers: Observers,
                 registry: Registry, durable: bool, replicas: int = 1, replica_timeout_s: float = 1.0) -> None:
        self.broker, self.server_id, self.acks, self.fencing = broker, server_id, acks, fencing
        self.registry = registry  # a task's result_ttl_s and store_result
        self.observers = observers
        self.durable = durable  # a failed-jobs table exists: the dead-letter script marks its row owed
        self.processed = 0
        self.failed = 0
        # the tasks whose settling writes wait for ``replicas`` replicas (at least 1), up to the timeout
        self.confirmed = frozenset(name for name, t in registry.tasks.items() if t.durable_settle)
        self.replicas, self.timeout_ms = max(1, replicas), int(replica_timeout_s * 1000)
        self.unconfirmed = 0  # settles no replica confirmed in time (also the queue's settle_unconfirmed stat)
        self.confirmed_acks = ConfirmedAcks(acks, self.replicas, self.timeout_ms)

    def settle(self, r: Running, v: Verdict) -> Writes | None:
        """Record ``v``: a plain ack (no stored result, not a duplicate, no replica to wait for) joins the acks'
        batch here and this returns None; any other verdict returns its ``Writes``, for the caller to await."""
        self._finished(r, v)
        if (v.outcome is Outcome.ACK and v.result is None and not v.reason and v.step is None
                and not (self.confirmed and self._confirms(r.job))):
            job = r.job
            self.processed += 1
            self.acks.add(job.queue, job.id, job.token, job.raw)
            return None
        return lambda: self._record(r, v)

    def _finished(self, r: Running, v: Verdict) -> None:
        r.settled = True
        job = r.job
        if r.started and job.spec is not None:
            self.observers.finished(job.spec.task, job.queue, v.outcome, time.monotonic() - r.started)

    async def _record(self, r: Running, v: Verdict) -> None:
        job, b = r.job, self.broker
        if v.outcome is Outcome.ACK and job.spec is not None and "w" in job.spec.extra:
            await self._step_done(r, v)
            return
        if v.outcome is Outcome.ACK:
            self.processed += 1
            if v.reason == "duplicate":
                job_log(r).info("job %s: %s; acked as a duplicate", job.id, v.error)
            if v.result is not None:  # stored before the ack: a crash between them reruns the job, never loses it
                task = self.registry.get(job.spec.task) if job.spec else None
                await results.store(b, job.id, task, v.result)
            if self.confirmed and self._confirms(job):
                await self._ack_confirmed(r)
            else:
                self.acks.add(job.queue, job.id, job.token, job.raw)
            return
        if v.outcome is Outcome.REQUEUE:
            at = b.clock() + int(v.delay_s * 1000) if v.delay_s else 0
            await self._write(r, b.requeue(job.queue, job.id, job.token, at, v.counter), "requeue")
            return
        self.failed += 1
        entry = {"attempt": job.attempt, "error": v.error, "at": b.clock(), "worker": self.server_id}
        if v.outcome is Outcome.RETRY:
            job_log(r).warning("job %s attempt %d failed: %s; retry in %.1fs", job.id, job.attempt, v.error, v.delay_s)
            at = b.clock() + int(v.delay_s * 1000)
            await self._write(r, b.retry(job.queue, job.id, job.token, at, entry), "retry")
            return
        await self._dead(r, v, entry)

    def _confirms(self, job: Fetched) -> bool:
        return job.spec is not None and job.spec.task in self.confirmed

    async def _write(self, r: Running, call: Call[T], what: str) -> T:
        """Run a settling write; for a ``durable_settle`` task, wait until replicas confirm it."""
        if not (self.confirmed and self._confirms(r.job)):
            return await self.broker.arun(call)
        return (await self._confirm(r, call, what))[0]

    async def _confirm(self, r: Running, call: Call[T], what: str) -> tuple[T, bool]:
        """The write, then WAIT; one the replicas did not confirm in time is logged and counted (it is on the
        master: a failover before a replica has it loses it)."""
        parsed, acked = await HOP.run(run_and_wait, self.broker, call, self.replicas, self.timeout_ms)
        if acked < self.replicas:
            await self._unconfirmed(r, what, acked)
        return parsed, acked >= self.replicas

    async def _unconfirmed(self, r: Running, what: str, acked: int) -> None:
        self.unconfirmed += 1
        job = r.job
        job_log(r).error("job %s: its %s reached %d of %d replica(s) within %d ms; a failover before a replica has "
                         "it loses it", job.id, what, acked, self.replicas, self.timeout_ms)
        with contextlib.suppress(*UNAVAILABLE):  # the count is lost with Redis; the line above stays
            await self.broker.aio.hincrby(self.broker.keys.queue(job.queue).stats, "settle_unconfirmed", 1)

    async def _ack_confirmed(self, r: Running) -> None:
        """Ack and wait for the replicas (acks.py ``ConfirmedAcks``, which keeps an unconfirmed ack for the check
        after a failover: a lost one is recorded as ack_lost, one still leased to this worker is acked again)."""
        job = r.job
        refused, acked = await self.confirmed_acks.ack(job.queue, job.id, job.token, job.raw)
        if refused:
            job_log(r).warning("ack of job %s refused: its lease had moved to another attempt", job.id)
        elif 0 <= acked < self.replicas:
            await self._unconfirmed(r, "ack", acked)

    async def _step_done(self, r: Running, v: Verdict) -> None:
        """A workflow step's ack is its workflow's advance. A duplicate (another run holds its fence) is not acked:
        it runs again later, when that run's fence step has its result."""
        job, b = r.job, self.broker
        if v.step is None:
            await b.arun(b.requeue(job.queue, job.id, job.token, b.clock() + 1000, "deferred"))
            return
        self.processed += 1
        if v.result is not None:
            task = self.registry.get(job.spec.task) if job.spec else None
            await results.store(b, job.id, task, v.result)
        fault_point("before_step_ack")
        if await workflows.advance(b, job, v.step) < 0:  # also fires after_step_ack, then finishes its hand-overs
            job_log(r).warning("ack of workflow step %s refused: its lease had moved to another attempt", job.id)

    async def _dead(self, r: Running, v: Verdict, entry: dict[str, object]) -> None:
        job, b = r.job, self.broker
        task_name = job.spec.task if job.spec is not None else "?"
        r.sweeping = True  # the lease is renewed while the steps are checked: a lapse would lose the dead-letter
        try:
            named = await self._leaving(job, v)
            if named is None:
                return  # not dead-lettered blind: the lease lapses and the next attempt does it again
            v = named
            fields = {"reason": v.reason, "error": v.error, "traceback": v.tb, "task": task_name, "queue": job.queue}
            durable = job.spec is not None and self.durable
            fault_point("before_dead_letter")  # the steps are parked and committed; the lease may lapse here
            step = workflows.dead_step(b, job, v.reason, v.error)
            took = await self._write(r, b.dead(job.queue, job.id, job.token, entry, fields, durable=durable, step=step),
                                     "dead-letter")
        finally:
            r.sweeping = False
        if not took:
            job_log(r).warning("job %s: dead-letter [%s] refused: its lease had moved on; the attempt holding it now "
                           "decides (it names the steps in doubt): %s", job.id, v.reason, v.error)
            return
        job_log(r).error("job %s (%s) -> dead-letter [%s]: %s", job.id, task_name, v.reason, v.error)
        await workflows.died(b, job, step)  # a step of another queue: its death on its way to its workflow
        await results.store_failure(b, job.id, job.queue, self.registry.get(task_name), task_name, v.reason, v.error)
        fault_point("after_dead_letter")  # a kill here leaves the failed_jobs row owed: the sweep writes it
        spec = job.spec
        dead = DeadJob(id=job.id, queue=job.queue, task=task_name, args=spec.args if spec else {},
                       reason=v.reason, error=v.error, traceback=v.tb, attempts=job.attempt, died_ms=b.clock(),
                       history=[])
        await self.observers.dead(dead, spec)

    async def _leaving(self, job: Fetched, v: Verdict) -> Verdict | None:
        """Name the steps a dead job leaves behind; a ``calling`` one is now in doubt, and so is the job.
        None: they could not be checked."""
        left = await self.fencing.leaving(job)
        if left is None:
            return None
        notes, in_doubt = left
        if not notes:
            return v
        return replace(v, reason="in_doubt" if in_doubt else v.reason, error="; ".join([v.error, *notes]))


def job_log(r: Running) -> JobLogger:
    """A logger whose lines carry the job's id, task, queue, attempt and fence keys."""
    if r.ctx is not None:
        return job_logger(r.ctx)
    job = r.job
    return job_logger(job_id=job.id, task=job.spec.task if job.spec else None, queue=job.queue, attempt=job.attempt)
