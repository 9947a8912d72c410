"""What became of a job attempt: the Outcome, its Verdict, and how a handler's exception maps to one (classify)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

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
from ringfence.tasks import JobContext, Task


class Outcome(StrEnum):
    """What becomes of a job attempt (the table in docs/architecture.md, "Outcomes")."""

    ACK = "ack"              # done: acked (batched)
    RETRY = "retry"          # failed, attempts left: back to ``scheduled`` after a backoff
    DEAD = "dead"            # dead-letter, with a reason
    REQUEUE = "requeue"      # not run, or deferred: back to the queue without burning an attempt
    LOST = "lost"            # the lease went to another attempt: nothing is recorded
    ABANDONED = "abandoned"  # shutdown left its thread running: the lease lapses, nothing is recorded


@dataclass(frozen=True, slots=True)
class Verdict:
    """An attempt's outcome and what goes with it: the dead-letter reason, the error and traceback, the delay
    of a retry or requeue, and the queue counter a requeue bumps."""

    outcome: Outcome
    reason: str = ""
    error: str = ""
    tb: str = ""
    delay_s: float = 0.0
    counter: str = ""
    result: bytes | None = None  # ack of a task with store_result: the record to store before the ack
    step: bytes | None = None  # ack of a workflow step: its return value (JSON) for the steps after it

    @property
    def recorded(self) -> bool:
        """Lost and abandoned attempts record nothing: another attempt, or the lease, decides."""
        return self.outcome is not Outcome.LOST and self.outcome is not Outcome.ABANDONED


def fence_outcome(exc: BaseException) -> str | None:
    """The fence outcome a handler's exception stands for (the step is not known here: label "-")."""
    if isinstance(exc, FenceConflict | FenceBusy):
        return "conflict"
    if isinstance(exc, InDoubt):
        return "in_doubt"
    if isinstance(exc, FencedOut):
        return "fenced_out"
    return None


def dependency_ok(v: Verdict) -> bool | None:
    """Did the dependency work? Success yes; errors and timeouts no; a permanent or payload error, a
    deferral or a duplicate say nothing about it."""
    if v.outcome is Outcome.ACK:
        return v.reason != "duplicate" or None
    if v.outcome is Outcome.RETRY or (v.outcome is Outcome.DEAD and v.reason == "max_attempts"):
        return False
    return None


def weighted_order(queues: list[tuple[str, int]], strict: bool) -> list[str]:
    """Strict: as given. Weighted: a random order where a queue comes first with probability ∝ its weight."""
    if strict or len(queues) == 1:
        return [q for q, _ in queues]
    return [q for q, _ in sorted(queues, key=lambda qw: -(random.random() ** (1.0 / qw[1])))]


def classify(task: Task, ctx: JobContext, exc: BaseException, tb: str) -> Verdict:
    """The verdict on a handler that raised ``exc`` (see the table in docs/architecture.md)."""
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RetryLater):
        return Verdict(Outcome.REQUEUE, delay_s=exc.delay_s, counter="deferred")
    if isinstance(exc, FenceBusy):
        return Verdict(Outcome.ACK, reason="duplicate", error=error)
    if isinstance(exc, InDoubt):
        return Verdict(Outcome.DEAD, "in_doubt", error, tb)
    # A ConfigError (no fence database, complete(db) on another database) does not heal by retrying.
    if isinstance(exc, Permanent | PayloadError | ConfigError) or (task.permanent and isinstance(exc, task.permanent)):
        return Verdict(Outcome.DEAD, "permanent", error, tb)
    if ctx.attempt >= ctx.max_attempts:
        return Verdict(Outcome.DEAD, "max_attempts", error, tb)
    return Verdict(Outcome.RETRY, "error", error, tb, delay_s=retry_delay(task, ctx.attempt, exc))


def retry_delay(task: Task, attempt: int, exc: BaseException) -> float:
    """The task's ``retry_delay`` clamped to the policy's cap, else full-jitter exponential backoff."""
    policy = task.options.retry
    if task.retry_delay is not None:
        return float(min(max(task.retry_delay(attempt, exc), 0.0), policy.cap_s))
    ceiling = policy.ceiling_s(attempt)
    return random.uniform(0, ceiling) if policy.jitter else ceiling
