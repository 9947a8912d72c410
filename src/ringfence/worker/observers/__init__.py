"""Observers of the job pipeline: metrics, breakers, the failed-jobs table, ``on_dead`` hooks and alerts.

Each lives in its own module with the one thing it needs; the pipeline calls them at fixed points and knows
nothing of what they do:

    started(job, task, wait_s)           the handler is about to run (``wait_s``: enqueue to start)
    handler(job, spec, ctx, fn)          its context is made: returns what to call in the handler's place
                                         (``fn`` or a wrapper of it, run where the handler runs)
    raised(exc)                          the handler raised (before it is classified)
    ran(job, task, verdict)     [async]  the handler returned or raised; its gate slots are released
                                         (``hears_ran(task)`` False: not called for that task's jobs)
    finished(task, queue, outcome, s)    the verdict is being recorded (an attempt that started only)
    dead(dead_job, spec)        [async]  the job reached the Redis dead-letter
    unreadable(job, spec, why, counter)  [async]  a job no worker could read for longer than ``grace_s``
    leaving()                            the process is about to end or exec itself again without its exit
                                         hooks (``os._exit``, ``os.execv``): flush what is buffered

An observer overrides what it needs; only overridden hooks are called, so a worker without breakers or
hooks pays nothing for them per job. An observer's error in ``dead`` is logged by the observer itself and
never stops the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringfence.models import DeadJob, Fetched, JobSpec
from ringfence.tasks import JobContext, Task
from ringfence.worker.outcomes import Outcome, Verdict


class Observer:
    """Base class: every hook does nothing."""

    def started(self, job: Fetched, task: Task, wait_s: float) -> None:
        return None

    def handler(self, job: Fetched, spec: JobSpec, ctx: JobContext, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    def raised(self, exc: BaseException) -> None:
        return None

    async def ran(self, job: Fetched, task: Task, verdict: Verdict) -> None:
        return None

    def hears_ran(self, task: Task) -> bool:
        """Whether ``ran`` does anything for this task's jobs (asked once per task: False spares them the call)."""
        return True

    def finished(self, task: str, queue: str, outcome: Outcome, duration_s: float) -> None:
        return None

    async def dead(self, dead: DeadJob, spec: JobSpec | None) -> None:
        return None

    async def unreadable(self, job: Fetched, spec: JobSpec, why: str, counter: str, age_s: float) -> None:
        return None

    def leaving(self) -> None:
        return None


#: Observers an instrumentation adds to every worker pipeline made while it is installed (contrib/otel).
INSTALLED: list[Observer] = []


def _overrides(o: Observer, hook: str) -> bool:
    return getattr(type(o), hook) is not getattr(Observer, hook)


class Observers:
    """The observers of one worker, called in the order given."""

    def __init__(self, observers: list[Observer]) -> None:
        observers = self.all = [*observers, *INSTALLED]
        hooks: dict[str, list[Any]] = {h: [getattr(o, h) for o in observers if _overrides(o, h)]
                                       for h in ("started", "handler", "raised", "ran", "finished", "dead",
                                                 "unreadable")}
        self._handler = hooks["handler"]
        self.wraps = bool(self._handler)  # False: the runner calls the handler itself, no hook per job
        self._started, self._raised, self._ran = hooks["started"], hooks["raised"], hooks["ran"]
        self._finished, self._dead, self._unreadable = hooks["finished"], hooks["dead"], hooks["unreadable"]
        self._hear_ran = [o for o in observers if _overrides(o, "ran")]
        self._hears: dict[str, bool] = {}  # task name -> does a ``ran`` hook do anything for its jobs

    def hears_ran(self, task: Task) -> bool:
        """False: ``ran`` would do nothing for this task's jobs (the caller may skip its coroutine)."""
        hears = self._hears.get(task.name)
        if hears is None:
            hears = self._hears[task.name] = any(o.hears_ran(task) for o in self._hear_ran)
        return hears

    def started(self, job: Fetched, task: Task, wait_s: float) -> None:
        for hook in self._started:
            hook(job, task, wait_s)

    def handler(self, job: Fetched, spec: JobSpec, ctx: JobContext, fn: Callable[..., Any]) -> Callable[..., Any]:
        for hook in self._handler:
            fn = hook(job, spec, ctx, fn)
        return fn

    def raised(self, exc: BaseException) -> None:
        for hook in self._raised:
            hook(exc)

    async def ran(self, job: Fetched, task: Task, verdict: Verdict) -> None:
        for hook in self._ran:
            await hook(job, task, verdict)

    def finished(self, task: str, queue: str, outcome: Outcome, duration_s: float) -> None:
        for hook in self._finished:
            hook(task, queue, outcome, duration_s)

    async def dead(self, dead: DeadJob, spec: JobSpec | None) -> None:
        for hook in self._dead:
            await hook(dead, spec)

    async def unreadable(self, job: Fetched, spec: JobSpec, why: str, counter: str, age_s: float) -> None:
        for hook in self._unreadable:
            await hook(job, spec, why, counter, age_s)

    def leaving(self) -> None:
        for o in self.all:
            if _overrides(o, "leaving"):
                o.leaving()
