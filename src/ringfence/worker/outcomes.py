"""What became of a job attempt: the outcome record, and how a handler's exception maps to one."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from ringfence.errors import (
    ConfigError,
    FenceBusy,
    FenceConflict,
    FencedOut,
    InDoubt,
    PayloadError,
    Permanent,
    RetryLater,
)
from ringfence.models import Fetched
from ringfence.tasks import JobContext, Task


@dataclass
class Running:
    job: Fetched
    ctx: JobContext | None = None
    task: asyncio.Task[None] | None = None
    lost: bool = False       # the lease went to another attempt: record nothing
    settled: bool = False    # an outcome was recorded (a sync handler's thread has returned by then)
    started: float = 0.0     # monotonic time the handler started (0: it never did)
    thread: asyncio.Future[Any] | None = None  # a sync handler's run in the pool
    abandoned: bool = False  # shutdown left its thread running: the lease lapses, nothing is recorded
    sweeping: bool = False   # settled, on its way to dead-letter: the heartbeat still renews its lease


@dataclass
class Outcome:
    kind: str                # ack | retry | dead | requeue | lost | abandoned
    reason: str = ""
    error: str = ""
    tb: str = ""
    delay_s: float = 0.0
    counter: str = ""
    result: bytes | None = None  # ack of a task with store_result: the record to store before the ack


def fence_outcome(exc: BaseException) -> str | None:
    """The fence outcome a handler's exception stands for (the step is not known here: label "-")."""
    if isinstance(exc, FenceConflict | FenceBusy):
        return "conflict"
    if isinstance(exc, InDoubt):
        return "in_doubt"
    if isinstance(exc, FencedOut):
        return "fenced_out"
    return None


def dependency_ok(o: Outcome) -> bool | None:
    """Did the dependency work? Success yes; errors and timeouts no; a permanent or payload error, a
    deferral or a duplicate say nothing about it."""
    if o.kind == "ack":
        return o.reason != "duplicate" or None
    if o.kind == "retry" or (o.kind == "dead" and o.reason == "max_attempts"):
        return False
    return None


def weighted_order(queues: list[tuple[str, int]], strict: bool) -> list[str]:
    """Strict: as given. Weighted: a random order where a queue comes first with probability ∝ its weight."""
    if strict or len(queues) == 1:
        return [q for q, _ in queues]
    return [q for q, _ in sorted(queues, key=lambda qw: -(random.random() ** (1.0 / qw[1])))]


def classify(task: Task, ctx: JobContext, exc: BaseException, tb: str) -> Outcome:
    """The outcome of a handler that raised ``exc`` (see the table in docs/architecture.md)."""
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RetryLater):
        return Outcome("requeue", delay_s=exc.delay_s, counter="deferred")
    if isinstance(exc, FenceBusy):
        return Outcome("ack", reason="duplicate", error=error)
    if isinstance(exc, InDoubt):
        return Outcome("dead", "in_doubt", error, tb)
    # A ConfigError (no fence database, complete(db) on another database) does not heal by retrying.
    if isinstance(exc, Permanent | PayloadError | ConfigError) or (task.permanent and isinstance(exc, task.permanent)):
        return Outcome("dead", "permanent", error, tb)
    if ctx.attempt >= ctx.max_attempts:
        return Outcome("dead", "max_attempts", error, tb)
    return Outcome("retry", "error", error, tb, delay_s=retry_delay(task, ctx.attempt, exc))


def retry_delay(task: Task, attempt: int, exc: BaseException) -> float:
    """The task's ``retry_delay`` clamped to the policy's cap, else full-jitter exponential backoff."""
    policy = task.options.retry
    if task.retry_delay is not None:
        return float(min(max(task.retry_delay(attempt, exc), 0.0), policy.cap_s))
    ceiling = policy.ceiling_s(attempt)
    return random.uniform(0, ceiling) if policy.jitter else ceiling
