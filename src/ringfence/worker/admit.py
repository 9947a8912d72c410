"""Decode → refuse or defer: what the processor learns about a fetched job before it may run.

A job the worker cannot run yet (its task is unknown here, or its payload version is newer: a rolling
deploy) waits without burning an attempt; one that no retry can fix goes to dead-letter with its reason."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple, Protocol

import orjson

from ringfence.errors import BadRecord, PayloadError, PayloadTooNew
from ringfence.logs import job_logger
from ringfence.models import Fetched, JobSpec
from ringfence.settings import WorkerSettings
from ringfence.tasks import Registry, Task
from ringfence.worker.observers import Observers
from ringfence.worker.outcomes import Outcome, Verdict


def plain_spec(raw: bytes | str) -> JobSpec | None:
    """``JobSpec.decode`` of the record a plain enqueue writes (``JobSpec.plain``: the four fields t, v, e, a, each
    of a type the decode takes; or those and a concurrency key's two, ck and cl), without its field-by-field walk:
    a third of its time. None for any other record: the full decode reads it (and names what is wrong with it)."""
    doc = orjson.loads(raw)
    if type(doc) is dict:
        n = len(doc)
        if n == 4:
            extra: dict[str, Any] = {}
        elif n == 6 and type(doc.get("ck")) is str and type(doc.get("cl")) is int:
            extra = {"ck": doc["ck"], "cl": doc["cl"]}
        else:
            return None
        task, version, enqueued_ms, args = doc.get("t"), doc.get("v"), doc.get("e"), doc.get("a")
        if (type(task) is str and type(version) is int and (type(enqueued_ms) is float or type(enqueued_ms) is int)
                and type(args) is dict):
            return JobSpec(task=task, args=args, enqueued_ms=enqueued_ms, version=version, extra=extra)
    return None


def decode_spec(raw: bytes | str) -> JobSpec:
    """``plain_spec``'s shortcut, else the full decode (whose ``BadRecord`` names what is wrong)."""
    try:
        plain = plain_spec(raw)
    except orjson.JSONDecodeError:
        plain = None
    return plain or JobSpec.decode(raw)


class Admitted(NamedTuple):
    """A job that may run: its task, its decoded spec and payload, and whether it is a settling run."""

    task: Task
    spec: JobSpec
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    settling: bool


# What ``Admission.admit`` returns when its answer needs Redis or a wait: await ``asks()`` for it.
Asks = Callable[[], Awaitable[Admitted | Verdict]]


class Settles(Protocol):
    """worker/fencing.py: does a job refused for its attempts still get one settling run?"""

    async def settles(self, job: Fetched, refused: str, max_attempts: int) -> bool: ...


class Admission:
    def __init__(self, registry: Registry, clock: Callable[[], int], settings: WorkerSettings, fencing: Settles,
                 observers: Observers) -> None:
        self.registry, self.clock, self.settings = registry, clock, settings
        self.fencing, self.observers = fencing, observers
        self._warned: set[tuple[str, str]] = set()  # (counter, task) warned once per worker

    def admit(self, job: Fetched) -> Admitted | Verdict | Asks:
        """Decide at once whether ``job`` may run, or is refused. Where the answer needs Redis or a wait (a task
        unknown here, a refused job that may still get a settling run, a payload of a newer version), an
        ``Asks``: the caller awaits ``asks()`` for it."""
        try:
            spec = decode_spec(job.raw)
        except BadRecord as exc:  # written straight into Redis by something else: no retry can fix it
            return Verdict(Outcome.DEAD, "bad_record", f"job {job.id}: {exc}")
        job.spec = spec
        task = self.registry.get(spec.task)
        if task is None:
            known = ", ".join(sorted(self.registry.tasks)) or "none"
            why = f"task {spec.task!r} is not registered in this worker (it knows: {known})"
            return lambda: self._unreadable(job, spec, why, "unknown_task", dead_after_grace=True)
        refused = self.refuse(job, spec, task)
        if refused is not None:
            return lambda: self._settling(job, spec, task, refused)
        return self._decode(job, spec, task, False)

    def _decode(self, job: Fetched, spec: JobSpec, task: Task, settling: bool) -> Admitted | Verdict | Asks:
        try:
            args, kwargs = task.codec.decode(spec.version, spec.args)
        except PayloadTooNew as exc:
            why = str(exc)
            return lambda: self._unreadable(job, spec, why, "newer_version", dead_after_grace=False)
        except PayloadError as exc:
            return Verdict(Outcome.DEAD, "bad_payload", str(exc))
        return Admitted(task, spec, args, kwargs, settling)

    async def _settling(self, job: Fetched, spec: JobSpec, task: Task, refused: Verdict) -> Admitted | Verdict:
        """A refused job runs once more only to settle its fence steps (worker/fencing.py decides)."""
        if not await self.fencing.settles(job, refused.reason, spec.max_attempts or task.options.retry.max_attempts):
            return refused
        admitted = self._decode(job, spec, task, True)
        return await admitted() if callable(admitted) else admitted

    def refuse(self, job: Fetched, spec: JobSpec, task: Task) -> Verdict | None:
        max_attempts = spec.max_attempts or task.options.retry.max_attempts
        if job.attempt > max_attempts:
            return Verdict(Outcome.DEAD, "max_attempts", f"attempt {job.attempt} exceeds max_attempts={max_attempts} "
                           "(earlier attempts were orphaned)")
        expiry_ms = spec.expires_ms or (
            spec.enqueued_ms + int(task.options.expiry_s * 1000) if task.options.expiry_s is not None else None)
        if expiry_ms is not None and self.clock() > expiry_ms:
            return Verdict(Outcome.DEAD, "expired", f"job expired at {expiry_ms} ms before it could run")
        return None

    async def _unreadable(self, job: Fetched, spec: JobSpec, why: str, counter: str,
                          dead_after_grace: bool) -> Verdict:
        """A job this worker cannot read yet (rolling deploy): wait without burning an attempt; past the grace
        period alert once, or give up to dead-letter when no worker will ever read it."""
        s = self.settings
        age_s = (self.clock() - spec.enqueued_ms) / 1000
        if age_s <= s.grace_s:
            first = (counter, spec.task) not in self._warned  # once per task and worker, not every defer_s
            self._warned.add((counter, spec.task))
            job_logger(job_id=job.id, task=spec.task, queue=job.queue, attempt=job.attempt).log(
                logging.WARNING if first else logging.DEBUG, "job %s: %s; retried every %gs without burning an "
                "attempt%s", job.id, why, s.defer_s, " (said once per task)" if first else "")
            return Verdict(Outcome.REQUEUE, delay_s=s.defer_s, counter=counter)
        if dead_after_grace:
            return Verdict(Outcome.DEAD, counter, f"{why}; still unreadable {age_s:.0f}s after enqueue "
                                                  f"(grace_s={s.grace_s:g})")
        await self.observers.unreadable(job, spec, why, counter, age_s)
        return Verdict(Outcome.REQUEUE, delay_s=s.defer_s, counter=counter)
