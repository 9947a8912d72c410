"""The fence protocol's decisions, written once as blocking code.

``step.py`` wraps this for ``with`` (called directly) and ``async with`` (on a thread of ``offloop.HOP``;
a sync effect's calling, call and record share one hop); the provider call and the ``reconcile`` hook are the only parts
that run in the caller's own style, between :meth:`Core.begin_effect` and
:meth:`Core.finish_effect`.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any, Final, Protocol

from ..errors import (
    FenceBusy,
    FenceConflict,
    FencedOut,
    FenceError,
    InDoubt,
    ReconcileTimeout,
    RetryLater,
    SettleOnly,
)
from ..faults import fault_point
from ..offloop import HOP
from .model import FenceBackend, FenceRow, FenceState, Owner, dumps, params_hash, provider_key


class StepPolicy(Protocol):
    """What the core reads of a step's options (``step.StepOptions``, which depends on this module)."""

    @property
    def params(self) -> Any: ...
    @property
    def provider_dedup(self) -> bool: ...
    @property
    def key_window_s(self) -> float | None: ...
    @property
    def reconcile(self) -> Any: ...
    @property
    def retention_s(self) -> float | None: ...
    @property
    def reconcile_timeout_s(self) -> float | None: ...

# A lost takeover race re-reads the row; more losses than this means a storm of takeovers.
_MAX_ROUNDS = 8


class NotHappened:
    """Type of ``NOT_HAPPENED``: the provider has no record of the key."""

    def __repr__(self) -> str:
        return "NOT_HAPPENED"


RECONCILE: Final = object()  # enter() asks the caller to run the reconcile hook in its own style


class Core:
    """One fenced step of one attempt: the current row, and every transition on it."""

    def __init__(self, store: FenceBackend, owner: Owner, subject: str, step: str,
                 opts: StepPolicy) -> None:
        self.store, self.owner, self.subject, self.step, self.opts = store, owner, subject, step, opts
        self.phash = params_hash(opts.params)
        self.key = provider_key(subject, step)
        self._row: FenceRow | None = None
        self.done = False  # completed on an earlier run
        self.replay = False  # in doubt, provider dedups, window open: call again with the same key
        self.completed = False  # completed by this run
        # Captured already `calling` (capture and mark calling in one statement; see _premark): until this run
        # starts its effect (`called`), a failed block puts the row back to claimed and a clean one completes it.
        self.premarked = False
        self.called = False

    @property
    def row(self) -> FenceRow:
        if self._row is None:
            raise FenceError(f"fence {self.subject!r}/{self.step!r} is not open")
        return self._row

    @property
    def request(self) -> Any:
        return self.row.request_value

    def _where(self) -> str:
        return f"fence {self.subject!r}/{self.step!r}"

    # --- enter ------------------------------------------------------------------------------

    def enter(self, found: tuple[FenceRow | None, bool] | None = None) -> object | None:
        """Capture, or read and apply the rerun rules. Returns RECONCILE when the hook must run.
        ``found``: the answer of a capture already made (the async path's), used for the first round."""
        for _ in range(_MAX_ROUNDS):
            row, fresh = found if found is not None else self._capture()
            found = None
            decided = self.captured(row, fresh)
            if decided is not _LOST_RACE:
                return decided
        raise FenceBusy(f"{self._where()}: lost {_MAX_ROUNDS} takeover races in a row")

    def captured(self, row: FenceRow | None, fresh: bool) -> object | None:
        """Act on a capture's answer: ours (fresh), gone (capture again: ``_LOST_RACE``), or the rerun rules."""
        if fresh:  # we inserted it: epoch 1, claimed (or calling, see _premark)
            self._row = row
            self._observe("captured")
            fault_point("after_capture")
            return None
        if row is None:  # pruned between our insert and our read: capture again
            return _LOST_RACE
        return self._rerun(row)

    def capture_request(self) -> str | None:
        """The request a fresh capture stores (capturing it ``calling``), or None (captured ``claimed``)."""
        if not self._premark():
            return None
        self._hold_lease()
        return dumps(self.opts.params)

    async def aenter(self, a: Any) -> object | None:
        """:meth:`enter` with the capture on the loop (``a``: the store's AsyncFence). A fresh row or a completed
        one is settled here; any other rerun rule runs the blocking code in a thread, once."""
        request = self.capture_request()
        row, fresh = await a.capture_or_get(self.subject, self.step, self.owner, self.phash, self.opts.retention_s,
                                            request=request)
        self.premarked = fresh and request is not None
        if fresh or (row is not None and row.state is FenceState.COMPLETED and row.params_hash == self.phash):
            return self.captured(row, fresh)  # no database call in these branches
        return await HOP.run(self.enter, (row, fresh))

    def _capture(self) -> tuple[FenceRow | None, bool]:
        """(row, inserted by us): the SQL store answers in one call; another backend captures, then reads."""
        args = (self.subject, self.step, self.owner, self.phash, self.opts.retention_s)
        both = getattr(self.store, "capture_or_get", None)
        if both is not None:
            request = self.capture_request()
            found: tuple[FenceRow | None, bool] = both(*args, request=request)
            self.premarked = found[1] and request is not None
            return found
        row = self.store.capture(*args)
        if row is not None:
            return row, True
        return self.store.get(self.subject, self.step), False

    def _premark(self) -> bool:
        """Capture as ``calling`` (one statement less) only where a step left calling by a dead owner is
        resolved as a takeover would: the provider dedups by the key, so the in-doubt rule replays the stored
        request with the same key. A strict step keeps its own ``calling`` commit right before the call, so a
        crash before it stays a safe takeover instead of in doubt. Never on a settling run (no new effect)."""
        return self.opts.provider_dedup and not self.owner.settle_only

    def _rerun(self, row: FenceRow) -> object | None:
        if row.params_hash != self.phash:
            raise FenceConflict(
                f"{self._where()} exists with params hash {row.params_hash[:12]}…, this run has "
                f"{self.phash[:12]}…: same key, different parameters; refusing a second effect")
        if row.state is FenceState.COMPLETED:
            self._row, self.done = row, True
            self._observe("skipped_done")
            return None
        if row.state is FenceState.IN_DOUBT:
            raise self._in_doubt(row, "parked until a person resolves it")
        if (row.owner_job_id, row.owner_token) == (self.owner.job_id, self.owner.token):  # this attempt again
            self._row = row
            return self._after_takeover(row)
        if self._alive(row):
            if row.owner_job_id == self.owner.job_id:
                raise RetryLater(f"{self._where()}: an earlier attempt of this job still holds it",
                                 delay_s=self._backoff(row))
            raise FenceBusy(f"{self._where()} is owned by live job {row.owner_job_id!r}; "
                            "this job is a duplicate")
        new = self.store.take_over(row, self.owner, lease_must_be_over=self.owner.alive is None)
        if new is None:
            return _LOST_RACE
        self._row = new
        self._observe("resumed")
        fault_point("after_capture")
        return self._after_takeover(new)

    def _backoff(self, row: FenceRow) -> float:
        """Wait half as long as the live owner has held the step (0.5 s to 30 s): each rerun that finds it
        still held waits longer, without a counter anywhere."""
        db_now = getattr(self.store, "db_now", None)
        if db_now is None or row.updated_at is None:
            return max(1.0, min(self.owner.lease_s / 4, 30.0))
        held_s = _seconds_between(row.updated_at, db_now())
        return min(max(held_s / 2, 0.5), 30.0)

    def _observe(self, outcome: str) -> None:
        if self.owner.observe is not None:
            self.owner.observe(self.step, outcome)

    def _alive(self, row: FenceRow) -> bool:
        if row.owner_token is None or row.owner_job_id is None:  # released by a person
            return False
        if self.owner.alive is not None:  # the broker's lease is the truth
            return self.owner.alive(row.owner_job_id, row.owner_token)
        return row.lease_live  # fallback: lease_until > now, database clock

    def _after_takeover(self, row: FenceRow) -> object | None:
        if row.state is not FenceState.CALLING or row.reference is not None:
            return None  # claimed: proceed; effected: effect() returns the stored reference
        # The effect may have happened and nobody recorded its answer: in doubt.
        opts = self.opts
        if (opts.provider_dedup and opts.key_window_s is not None
                and self.store.in_window(self.subject, self.step, row.epoch, opts.key_window_s)):
            self.replay = True
            return None
        if opts.reconcile is not None:
            self._hook_fits()
            return RECONCILE
        self._park()
        return None  # unreachable: _park raises

    def _hook_fits(self) -> None:
        """Start the hook only if its bound fits before this attempt is stopped: a hook cut off by the job's
        timeout is a takeover for nothing. A bound longer than a whole attempt can never fit: park."""
        bound, deadline, budget = self.hook_bound(), self.owner.deadline, self.owner.budget_s
        if budget is not None and bound > budget:
            self._park(f"reconcile_timeout_s={bound:g} exceeds the job's timeout of {budget:g}s, so the "
                       "reconcile hook can never run; lower the bound or raise the timeout")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and bound > left:
            # An error, not a deferral: the attempt counts, so a handler that always reaches the hook late
            # ends in dead-letter (its calling step parked) instead of looping.
            raise ReconcileTimeout(f"{self._where()}: the reconcile hook may take up to {bound:g}s and this "
                                   f"attempt has {max(left, 0):.1f}s left; not started, the step stays calling")

    def hook_bound(self) -> float:
        """The hook's time bound: ``reconcile_timeout_s``, else 30 s or half an attempt, the shorter."""
        if self.opts.reconcile_timeout_s is not None:
            return self.opts.reconcile_timeout_s
        budget = self.owner.budget_s
        return 30.0 if budget is None else min(30.0, budget / 2)

    def apply_reconcile(self, answer: Any) -> None:
        """Act on the reconcile hook's answer: adopt a reference, call again, or park."""
        row = self.row
        if isinstance(answer, NotHappened):
            self.store.reset_claimed(self.subject, self.step, row.epoch)
        elif answer is None:
            self._park()
        else:
            self.store.record(self.subject, self.step, row.epoch, _as_reference(answer))
        self._refresh()

    def _park(self, why: str = "owner gone, no reference, no replay or reconcile possible") -> None:
        self.store.park(self.subject, self.step, self.row.epoch)
        self._refresh()
        raise self._in_doubt(self.row, why)

    def _in_doubt(self, row: FenceRow, why: str) -> InDoubt:
        return InDoubt(f"{self._where()} is in doubt ({why}); provider key {row.provider_key}, "
                       f"epoch {row.epoch}. Check the provider, then resolve it by hand")

    def _refresh(self) -> None:
        row = self.store.get(self.subject, self.step)
        if row is None:
            raise FenceError(f"{self._where()} disappeared")
        self._row = row

    # --- effect -----------------------------------------------------------------------------

    def begin_effect(self, request: Any) -> str | None:
        """Before the call: the stored reference if there is one, else commit ``calling``."""
        stored, write = self.plan_effect(request)
        if stored is not None:
            return stored
        if write is not None:
            getattr(self.store, write[0])(*write[1])
        self.effect_begun(write)
        return None

    async def abegin_effect(self, a: Any, request: Any) -> str | None:
        """:meth:`begin_effect` with its write on the loop."""
        stored, write = self.plan_effect(request)
        if stored is not None:
            return stored
        if write is not None:
            await getattr(a, write[0])(*write[1])
        self.effect_begun(write)
        return None

    def plan_effect(self, request: Any) -> tuple[str | None, tuple[str, tuple[Any, ...]] | None]:
        """(the stored reference, None) when the call is skipped; else (None, the write to make before the call:
        (store method, arguments), or None when the capture already marked calling with this request)."""
        row = self.row
        if row.reference is not None:
            return row.reference, None
        if self.done:
            raise FenceError(f"{self._where()} completed on an earlier run without a reference")
        if self.owner.settle_only and not self.replay:
            raise SettleOnly(f"{self._where()}: job {self.owner.job_id!r} is on its settling run (its attempts "
                             "were used up by orphaned runs): steps in doubt are settled, no new effect starts")
        self._hold_lease()
        key = (self.subject, self.step, row.epoch)
        if self.replay:  # same key, stored request: the provider answers with the first result
            return None, ("renew", (*key, self.owner.lease_s))
        body = dumps(self.opts.params if request is None else request)
        if self.premarked and not self.called:  # captured as calling with the params as its request
            return None, (None if body == row.request else ("set_request", (*key, body)))
        return None, ("mark_calling", (*key, body, self.owner.lease_s))

    def _hold_lease(self) -> None:
        """An effect starts only while this attempt knows its lease is held: once it lapsed, the job may have been
        recovered or dead-lettered meanwhile, naming no step, and nobody would ever settle a call made now."""
        held = self.owner.lease_held
        if held is not None and not held():
            raise FencedOut(f"{self._where()}: job {self.owner.job_id!r}'s lease is not known to be held any more "
                            "(its worker stood still past it, or could not renew it); no effect started")

    def effect_begun(self, write: tuple[str, tuple[Any, ...]] | None) -> None:
        """The write of :meth:`plan_effect` is committed: the row as written (no read-back)."""
        if write is not None and write[0] == "renew":
            return
        if write is not None:
            self._row = self.row.replaced(state=FenceState.CALLING, request=write[1][3])
        self.called = True
        fault_point("after_calling")

    def finish_effect(self, value: Any, extract: Any = None) -> str:
        """After the call: record the reference, committed at once."""
        ref = self._answer(value, extract)
        self.store.record(self.subject, self.step, self.row.epoch, ref)
        return self._recorded(ref)

    async def afinish_effect(self, a: Any, value: Any, extract: Any = None) -> str:
        """:meth:`finish_effect` with the record on the loop."""
        ref = self._answer(value, extract)
        await a.record(self.subject, self.step, self.row.epoch, ref)
        return self._recorded(ref)

    def _answer(self, value: Any, extract: Any) -> str:
        fault_point("after_effect")
        return _as_reference(extract(value) if extract is not None else value)

    def _recorded(self, ref: str) -> str:
        self._row = self.row.replaced(state=FenceState.EFFECTED, reference=ref)  # as written; no read-back
        self.replay = False
        fault_point("after_record")
        return ref

    # --- complete / exit --------------------------------------------------------------------

    def completion_args(self, result: Any) -> tuple[int, str | None]:
        if self.done or self.completed:
            raise FenceError(f"{self._where()} is already completed")
        if self.row.state is FenceState.CALLING and not self._unstarted():
            raise FenceError(f"{self._where()}: the effect's outcome is unknown; cannot complete")
        return self.row.epoch, None if result is None else dumps(result)

    def _unstarted(self) -> bool:
        """Captured as calling and no effect started by this run: nothing left the network."""
        return self.premarked and not self.called and self.row.state is FenceState.CALLING

    def completion_states(self) -> dict[str, Any]:
        """Extra arguments for the store's completion: a step captured as calling that called nothing completes
        from calling (this run knows nothing left); every other step from claimed or effected."""
        return {"states": (FenceState.CALLING, FenceState.EFFECTED)} if self._unstarted() else {}

    def settled(self) -> bool:
        """Nothing for :meth:`exit` to write (never opened, done on an earlier run, or completed by this one)."""
        return self._row is None or self.done or self.completed

    def exit(self, exc: BaseException | None) -> None:
        """Leave the block: auto-complete a clean exit; end the lease of a failed claimed step."""
        write = self.plan_exit(exc)
        if write is not None:
            getattr(self.store, write[0])(*write[1], **write[2])
        self.completed = self.completed or (write is not None and write[0] == "complete")

    async def aexit(self, a: Any, exc: BaseException | None) -> None:
        """:meth:`exit` with its write on the loop."""
        write = self.plan_exit(exc)
        if write is not None:
            await getattr(a, write[0])(*write[1], **write[2])
        self.completed = self.completed or (write is not None and write[0] == "complete")

    def plan_exit(self, exc: BaseException | None) -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
        if self._row is None or self.done or self.completed:
            return None
        key = (self.subject, self.step, self.row.epoch)
        if exc is None:
            _, result = self.completion_args(None)
            return "complete", (*key, result), self.completion_states()
        if isinstance(exc, Exception) and self.row.state is FenceState.CLAIMED:
            # Nothing left the network: let a retry take over at once. Any other state keeps
            # its lease and its row (an exception after `calling` never unlocks anything).
            return "release", key, {}
        if isinstance(exc, Exception) and self._unstarted():
            # Captured as calling, but this run never started its effect: back to claimed, lease over.
            return "unmark", key, {}
        return None


_LOST_RACE: Final = object()


def _seconds_between(then: datetime, now: datetime) -> float:
    if (now.tzinfo is None) != (then.tzinfo is None):  # SQLite gives naive UTC times, the others aware ones
        now, then = now.replace(tzinfo=None), then.replace(tzinfo=None)
    return (now - then).total_seconds()


def _as_reference(value: Any) -> str:
    if value is None:
        return ""  # an effect with no reference (an email): recorded as done all the same
    if isinstance(value, str | int | uuid.UUID):
        return str(value)
    raise TypeError(f"effect reference must be a str, int or UUID, got {type(value).__name__}; "
                    "pass reference=lambda r: r['id']")
