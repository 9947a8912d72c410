"""Pure data shared by every fence backend: states, rows, keys, the backend protocol.

No SQLAlchemy and no redis-py here, so both backends (``ringfence.fence.store`` and
``ringfence.redis.fence``) and the step protocol can depend on it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol


class FenceState(StrEnum):
    """Where a fenced step is. ``claimed → calling → effected → completed``; ``in_doubt`` is parked."""

    CLAIMED = "claimed"  # captured; the effect has certainly not started
    CALLING = "calling"  # the effect may have happened: the provider call was about to leave
    EFFECTED = "effected"  # the provider answered; its reference is recorded
    COMPLETED = "completed"  # local writes committed with the fence: the second run is empty
    IN_DOUBT = "in_doubt"  # calling, owner gone, no way to tell: a person decides


class StateText:
    """The states as plain ``str``, for statement parameters (a member's ``.value`` is two Python calls on 3.11)."""

    CLAIMED, CALLING, EFFECTED, COMPLETED, IN_DOUBT = (s.value for s in FenceState)


#: States from which a step may still complete (never from ``calling``: the answer is unknown).
COMPLETABLE = (FenceState.CLAIMED, FenceState.EFFECTED)


@dataclass(frozen=True)
class Owner:
    """One job attempt that may own fences.

    ``(job_id, token)`` identifies one attempt (the broker may share a token across one fetch
    batch). ``alive(job_id, token)`` asks the broker whether that attempt's lease is still live; without it the fence
    falls back to its own ``lease_until`` (database clock), set ``lease_s`` ahead. ``settle_only``: the job's
    attempts are used up by orphaned runs; this last run may settle steps in doubt but never start an effect.
    ``deadline``/``budget_s``: when this attempt is stopped and how long an attempt may run; a ``reconcile``
    hook starts only if its ``reconcile_timeout_s`` fits before the deadline. ``lease_held()``: False once the
    attempt cannot tell that its lease is still live (its process stood still past it): no effect starts.
    """

    job_id: str
    token: str
    lease_s: float
    alive: Callable[[str, str], bool] | None = None
    observe: Callable[[str, str], None] | None = None  # (step, outcome): captured, skipped_done, resumed
    settle_only: bool = False  # a settling run: in-doubt rules and completion only, no new effect
    deadline: float | None = None  # time.monotonic() when this attempt is stopped (the job's timeout)
    budget_s: float | None = None  # an attempt's whole time (the job's timeout)
    lease_held: Callable[[], bool] | None = None  # is this attempt's lease still held? asked before an effect


@dataclass(frozen=True)
class FenceRow:
    """One fence as stored. Times come from the backend's clock (database or Redis)."""

    subject: str
    step: str
    state: FenceState
    epoch: int
    owner_job_id: str | None
    owner_token: str | None
    params_hash: str
    provider_key: str
    request: str | None = None
    reference: str | None = None
    result: str | None = None
    retention_s: float | None = None
    lease_live: bool = False  # lease_until > now, computed by the backend's clock
    lease_until: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    calling_at: datetime | None = None
    completed_at: datetime | None = None

    def replaced(self, **changes: Any) -> FenceRow:
        """``dataclasses.replace(self, **changes)`` without its per-call walk of the 18 fields and ``__init__``
        (two per fenced job: the row as written after calling and after the record)."""
        unknown = changes.keys() - _ROW_FIELDS
        if unknown:
            raise TypeError(f"FenceRow has no field {', '.join(sorted(unknown))}")
        new = object.__new__(FenceRow)
        d = new.__dict__
        d.update(self.__dict__)
        d.update(changes)
        return new

    @property
    def result_value(self) -> Any:
        """The stored result, decoded from JSON."""
        return None if self.result is None else json.loads(self.result)

    @property
    def request_value(self) -> Any:
        """The stored request, decoded from JSON."""
        return None if self.request is None else json.loads(self.request)


_ROW_FIELDS = frozenset(f.name for f in fields(FenceRow))


# What json.dumps builds on every call with these arguments (encode() keeps no state: threads share it).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def dumps(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces): equal values give equal text and hashes."""
    return _CANONICAL.encode(value)


def params_hash(params: Any) -> str:
    """sha256 of the canonical JSON of a step's parameters."""
    return hashlib.sha256(dumps(params).encode()).hexdigest()


def provider_key(subject: str, step: str) -> str:
    """The provider idempotency key: derived once from the fence key, the same on every run.

    35 characters, inside every common provider's limit (Stripe 255, PayPal 108).
    """
    digest = hashlib.sha256(f"{subject}\x1f{step}".encode()).hexdigest()
    return "rf-" + digest[:32]


class FenceBackend(Protocol):
    """What the step protocol needs from a store. Every write after capture is epoch-conditional
    and raises ``FencedOut`` when the epoch moved."""

    def capture(self, subject: str, step: str, owner: Owner, phash: str,
                retention_s: float | None) -> FenceRow | None: ...
    def get(self, subject: str, step: str) -> FenceRow | None: ...
    def take_over(self, row: FenceRow, owner: Owner, *, lease_must_be_over: bool) -> FenceRow | None: ...
    def mark_calling(self, subject: str, step: str, epoch: int, request: str | None,
                     lease_s: float) -> None: ...
    def renew(self, subject: str, step: str, epoch: int, lease_s: float) -> None: ...
    def record(self, subject: str, step: str, epoch: int, reference: str) -> None: ...
    def reset_claimed(self, subject: str, step: str, epoch: int) -> None: ...
    def park(self, subject: str, step: str, epoch: int) -> None: ...
    def release(self, subject: str, step: str, epoch: int) -> None: ...
    def in_window(self, subject: str, step: str, epoch: int, window_s: float) -> bool: ...
    def complete(self, subject: str, step: str, epoch: int, result: str | None) -> None: ...
    def completion(self, db: Any, subject: str, step: str, epoch: int,
                   result: str | None) -> AbstractContextManager[Any]: ...
    def acompletion(self, db: Any, subject: str, step: str, epoch: int,
                    result: str | None) -> AbstractAsyncContextManager[Any]: ...


def step_note(row: FenceRow, job_id: str) -> str:
    """One line for the dead-letter error: which step the dead job leaves behind, and what it means."""
    where = f"fence {row.subject}/{row.step}"
    if row.state is FenceState.IN_DOUBT:
        return (f"{where} is in_doubt: the effect may have happened (owner job {job_id}, provider key "
                f"{row.provider_key})")
    if row.state is FenceState.EFFECTED:
        return (f"{where} was effected (reference {row.reference!r}): the effect happened, its local completion "
                f"did not; replay job {job_id} to finish it")
    return (f"{where} was calling: the effect may have happened; now in_doubt (owner job {job_id}, provider key "
            f"{row.provider_key})")
