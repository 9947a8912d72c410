"""Test helpers: prove in your own test suite that the second run of a job is empty.

::

    from ringfence.testing import FakeProvider, assert_second_run_empty, run_job

    provider = FakeProvider()   # honours idempotency keys; counts one effect per distinct key

    def test_charge_is_fenced():
        report = assert_second_run_empty(
            charge_order,
            payload=lambda n: {"order_id": 1000 + n, "amount": 5},
            effects=lambda: provider.effects,
        )
        print(report)

    def test_charge_once():
        run_job(charge_order, order_id=1, amount=5)

Jobs run in-process, in the test's thread, with a real :class:`~ringfence.tasks.JobContext`
whose fences are wired like the worker's (one owner per attempt with a fresh token) against
the app's real fence store (``app.fence_url``). A "kill" is simulated with
``faults.inject``: :class:`~ringfence.faults.SimulatedKill` is raised at the fault point and
the attempt is then gone, as after a SIGKILL; the rerun is a redelivery of the same job.
No Redis and no worker process are needed (``ctx.redis_fence`` still uses the app's Redis).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import uuid
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

import orjson

from ringfence import faults
from ringfence.app import App
from ringfence.errors import ConfigError, InDoubt
from ringfence.fake_provider import Charge, FakeProvider, LostAnswer, ProviderError, ProviderUnavailable
from ringfence.tasks import JobContext, Task
from ringfence.worker.fencing import Fencing

__all__ = ["Attempt", "Charge", "FakeProvider", "JobRunner", "LostAnswer", "ProviderError", "ProviderUnavailable",
           "Report", "Scenario", "assert_second_run_empty", "run_job"]

EffectCount = int | Sized | Mapping[str, int]


class TestFencing(Fencing):
    """The worker's fence wiring with an in-process liveness probe instead of Redis leases:
    an attempt is alive while it runs and gone once it returned, raised or was "killed"."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, app: App) -> None:
        super().__init__(app, None, app.worker_settings)  # type: ignore[arg-type]  # no broker needed
        self.live: set[str] = set()

    def alive(self, job_id: str, token: str) -> bool:
        return token in self.live


@dataclass
class Attempt:
    """How one in-process attempt ended."""

    value: Any = None
    error: BaseException | None = None
    killed_at: str | None = None  # the fault point where the simulated SIGKILL hit
    points: list[str] = field(default_factory=list)  # fault points passed, in order

    @property
    def killed(self) -> bool:
        return self.killed_at is not None


class _Killer:
    """A fault hook: records the points passed and "kills" the attempt at ``point`` (once)."""

    def __init__(self, point: str | None) -> None:
        self.point, self.fired = point, False
        self.seen: list[str] = []

    def __call__(self, name: str) -> None:
        self.seen.append(name)
        if name == self.point and not self.fired:
            self.fired = True
            raise faults.SimulatedKill(name)


class JobRunner:
    """Runs a task's jobs in-process, attempt by attempt, as a worker would deliver them."""

    def __init__(self, task: Task) -> None:
        self.task = task
        if not isinstance(task.app, App):
            raise ConfigError(f"task {task.name!r} was not declared by a ringfence App")
        self.fencing = TestFencing(task.app)
        self._attempts: dict[str, int] = {}

    def attempt(self, payload: Any, job_id: str | None = None, kill_at: str | None = None) -> Attempt:
        """One delivery of job ``job_id`` (a new id when None) with ``payload`` (a dict of fields, or an
        instance of the task's payload model). Never raises the handler's error: it is in the Attempt."""
        job_id = job_id or uuid.uuid4().hex
        ctx = self._context(job_id)
        killer = _Killer(kill_at)
        self.fencing.live.add(ctx.token)
        try:
            with faults.inject(killer):
                return Attempt(value=self._call(ctx, payload), points=killer.seen)
        except faults.SimulatedKill as kill:
            return Attempt(killed_at=str(kill), points=killer.seen)
        except Exception as exc:
            return Attempt(error=exc, points=killer.seen)
        finally:
            self.fencing.live.discard(ctx.token)  # this attempt is over: a rerun may take over

    def _context(self, job_id: str) -> JobContext:
        n = self._attempts[job_id] = self._attempts.get(job_id, 0) + 1
        opts = self.task.options
        return JobContext(id=job_id, task=self.task.name, queue=opts.queue, attempt=n,
                          max_attempts=opts.retry.max_attempts, enqueued_ms=int(time.time() * 1000),
                          token=f"test-{uuid.uuid4().hex}", timeout_s=opts.timeout_s, fencing=self.fencing)

    def _call(self, ctx: JobContext, payload: Any) -> Any:
        # As the worker sees it: validated and encoded at enqueue, stored as JSON, decoded at fetch.
        codec = self.task.codec
        stored = orjson.loads(orjson.dumps(codec.encode(payload)))
        args, kwargs = codec.decode(codec.version, stored)
        if not self.task.is_async:
            return self.task.fn(ctx, *args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.task.fn(ctx, *args, **kwargs))
        # Called from async code: run the handler on a loop of its own, in another thread.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, self.task.fn(ctx, *args, **kwargs)).result()


def run_job(task: Task, /, **payload: Any) -> Any:
    """Run one job of ``task`` in-process with a real context (fences included); return its result.

    The handler's exceptions propagate. Each call is a new job (a new job id), like a
    second ``enqueue`` of the same payload: a fenced step that completed before is ``done``.
    """
    attempt = JobRunner(task).attempt(payload)
    if attempt.error is not None:
        raise attempt.error
    return attempt.value


@dataclass
class Scenario:
    """One scenario of :func:`assert_second_run_empty` and the effect counts it saw."""

    name: str
    payload: Any
    outcome: str = ""  # one effect | not reached | parked in_doubt | FAILED
    counts: list[dict[str, int]] = field(default_factory=list)  # before, then after each run
    problem: str = ""

    def line(self) -> str:
        seen = " → ".join(_fmt(c) for c in self.counts)
        return f"{self.name:<36} {self.outcome:<16} effects {seen}" + (f"  !! {self.problem}" if self.problem else "")


@dataclass
class Report:
    """What :func:`assert_second_run_empty` ran; ``str(report)`` is a table."""

    task: str
    scenarios: list[Scenario]

    @property
    def failed(self) -> list[Scenario]:
        return [s for s in self.scenarios if s.problem]

    @property
    def parked(self) -> list[Scenario]:
        """Scenarios whose rerun parked the step in doubt (no dedup, no reconcile): not a second effect."""
        return [s for s in self.scenarios if s.outcome == "parked in_doubt"]

    def __str__(self) -> str:
        lines = [f"second-run check of {self.task}:", *("  " + s.line() for s in self.scenarios)]
        if self.parked:
            lines.append("  (parked: the step declares neither provider_dedup=True + key_window_s nor reconcile=, "
                         "so a person must resolve it; no second effect was made)")
        return "\n".join(lines)


def assert_second_run_empty(task: Task, payload: Callable[[int], Any],
                            effects: Callable[[], EffectCount],
                            points: Sequence[str] = faults.POINTS) -> Report:
    """Run ``task`` clean then again, and killed at each fault point then again; assert no rerun adds effects.

    - ``payload(n)``: a fresh payload (a new business id) for scenario ``n``: a dict of fields,
      or an instance of the task's payload model;
    - ``effects()``: what the task does outside, counted: an int, a sized collection
      (``provider.calls``) or a mapping of counts (``{"charges": …, "rows": …}``).

    Scenario 0 runs the job and then redelivers it: the rerun must add nothing, and the first
    run sets the baseline (what one clean run does, normally one effect). Then, per fault
    point: the job is killed there, redelivered until it finishes, and redelivered once more;
    it must end with exactly the baseline (or less, when the step parks ``in_doubt``
    because it declares neither ``provider_dedup`` nor ``reconcile`` — reported, not a
    failure). Raises AssertionError naming every failed scenario and its counts; returns the
    :class:`Report` otherwise.
    """
    runner = JobRunner(task)
    clean = _clean_scenario(runner, payload(0), effects)
    report = Report(task.name, [clean])
    if not clean.problem:
        baseline = _delta(clean.counts[0], clean.counts[1])
        for n, point in enumerate(points, start=1):
            report.scenarios.append(_kill_scenario(runner, point, payload(n), effects, baseline))
        if all(s.outcome == "not reached" for s in report.scenarios[1:]):
            clean.problem = ("no fault point was reached: the task opens no fence (ctx.fence), so nothing stops "
                             "a rerun after a crash from repeating its effect")
            clean.outcome = "FAILED"
    if report.failed:
        raise AssertionError(f"the second run is not empty for {task.name}:\n{report}")
    return report


def _clean_scenario(runner: JobRunner, payload: Any, effects: Callable[[], EffectCount]) -> Scenario:
    s = Scenario("clean run, then a rerun", payload, counts=[_count(effects)])
    job_id = uuid.uuid4().hex
    for which in ("the clean run", "the rerun"):
        attempt = runner.attempt(payload, job_id)
        s.counts.append(_count(effects))
        if attempt.error is not None or attempt.killed:
            return _fail(s, f"{which} raised {_describe(attempt)}")
    first, rerun = _delta(s.counts[0], s.counts[1]), _delta(s.counts[1], s.counts[2])
    if not any(first.values()):
        return _fail(s, "the clean run made no effect that effects() counts: the check would prove nothing")
    if any(rerun.values()):
        return _fail(s, f"the rerun made {_fmt(rerun)} more effect(s)")
    s.outcome = "one effect"
    return s


def _kill_scenario(runner: JobRunner, point: str, payload: Any,
                   effects: Callable[[], EffectCount], baseline: dict[str, int]) -> Scenario:
    s = Scenario(f"kill at {point}, then reruns", payload, counts=[_count(effects)])
    job_id = uuid.uuid4().hex
    first = runner.attempt(payload, job_id, kill_at=point)
    s.counts.append(_count(effects))
    if not first.killed:
        s.outcome = "not reached"
        return _fail(s, f"the run raised {_describe(first)}") if first.error is not None else s
    parked = False
    for which in ("the rerun", "a further rerun"):
        attempt = runner.attempt(payload, job_id)
        s.counts.append(_count(effects))
        parked = isinstance(attempt.error, InDoubt)
        if attempt.error is not None and not parked:
            return _fail(s, f"{which} raised {_describe(attempt)}")
    total, last = _delta(s.counts[0], s.counts[2]), _delta(s.counts[2], s.counts[3])
    s.outcome = "parked in_doubt" if parked else "one effect"
    if any(last.values()):
        return _fail(s, f"a further rerun made {_fmt(last)} more effect(s)")
    too_many = any(total.get(k, 0) > v for k, v in baseline.items()) or any(
        total.get(k, 0) != v for k, v in baseline.items() if not parked)
    if too_many:
        return _fail(s, f"expected {_fmt(baseline)} effect(s) like a clean run, got {_fmt(total)}")
    return s


def _fail(s: Scenario, problem: str) -> Scenario:
    s.outcome, s.problem = "FAILED", f"{problem} (payload {s.payload})"
    return s


def _describe(attempt: Attempt) -> str:
    if attempt.killed:
        return f"a simulated kill at {attempt.killed_at}"
    return f"{type(attempt.error).__name__}: {attempt.error}"


def _count(effects: Callable[[], EffectCount]) -> dict[str, int]:
    value = effects()
    if isinstance(value, Mapping):
        return {str(k): int(v) for k, v in value.items()}
    if isinstance(value, int):
        return {"effects": value}
    return {"effects": len(value)}


def _delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after.keys() | before.keys()}


def _fmt(counts: Mapping[str, int]) -> str:
    if set(counts) == {"effects"}:
        return str(counts["effects"])
    return ",".join(f"{k}={v}" for k, v in sorted(counts.items()))
