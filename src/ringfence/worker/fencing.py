"""Where the broker and the fence meet. A job's fences are owned by its attempt (its lease token), and "is the
owner alive" is answered by the owner's lease in Redis. Off the happy path: a job whose attempts were used up
by orphaned runs gets one settling run (``settles``), and a job leaving for dead-letter has the steps it owns
named, a ``calling`` one parked in doubt (``leaving``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ringfence.errors import FencedOut, FenceTablesMissing
from ringfence.fence import DbRetry, Fences, FenceState, Owner
from ringfence.fence.dbretry import is_transient
from ringfence.fence.model import FenceRow, step_note
from ringfence.models import Fetched
from ringfence.offloop import HOP
from ringfence.redis.broker import Broker
from ringfence.redis.connect import REDIS_ERRORS, broker_error
from ringfence.redis.connection import UNAVAILABLE
from ringfence.settings import WorkerSettings
from ringfence.tasks import JobContext
from ringfence.worker.heartbeat import LeaseBook, lease_book

if TYPE_CHECKING:
    from ringfence.fence.store import FenceStore
    from ringfence.redis.fence import RedisFenceStore

log = logging.getLogger("ringfence.worker")


class FenceStores(Protocol):
    """The fence stores of a runtime (runtime.py), opened on first use."""

    @property
    def fence_store(self) -> FenceStore: ...
    @property
    def redis_fence_store(self) -> RedisFenceStore: ...
    def fence_store_in_use(self) -> FenceStore | None: ...


class Fencing:
    def __init__(self, stores: FenceStores, broker: Broker, settings: WorkerSettings,
                 observe: Callable[[str, str], None] | None = None) -> None:
        self.stores = stores
        self.broker = broker
        self.settings = settings
        self.observe = observe  # fence outcomes, for metrics
        self.leases = LeaseBook(int, active=False) if broker is None else lease_book(broker)
        # An effect starts only while the lease outlasts the `calling` write by this much.
        self.margin_ms = int(min(settings.lease_s / 4, 2.0) * 1000)
        self.lease_ms = int(settings.lease_s * 1000)

    def owner(self, ctx: JobContext) -> Owner:
        # The fence's own lease is the fallback when the broker cannot answer: it covers the job's timeout.
        return Owner(ctx.id, ctx.token, lease_s=ctx.timeout_s + self.settings.lease_s, alive=self._owner_alive,
                     observe=self.observe, settle_only=ctx.settling, deadline=ctx.deadline, budget_s=ctx.timeout_s,
                     lease_held=lambda: self.leases.held(ctx.id, ctx.token, self.margin_ms))

    def sql(self, ctx: JobContext) -> Fences:
        return Fences(self.stores.fence_store, self.owner(ctx))

    def redis(self, ctx: JobContext) -> Fences:
        return Fences(self.stores.redis_fence_store, self.owner(ctx))

    def alive(self, job_id: str, token: str) -> bool:
        """Does attempt ``token`` of job ``job_id`` still hold a live lease, in any queue?"""
        return any(self.broker.lease_alive(q, job_id, token) for q in self.broker.queues())

    def _owner_alive(self, job_id: str, token: str) -> bool:
        """``alive`` asked inside a handler's fence: redis-py's errors reach the handler as ringfence's
        (CannotConnect, NotPermitted, BrokerError), redis-py's as the cause."""
        try:
            return self.alive(job_id, token)
        except REDIS_ERRORS as exc:
            what = f"fence: checking the lease of job {job_id} (it holds the step)"
            raise broker_error(what, exc, self.broker.url) from exc

    # -- a job that leaves the queue while it owns a step past capture --------------------------------

    async def settles(self, job: Fetched, refused: str, max_attempts: int) -> bool:
        """One settling run for a job whose attempts were used up by orphaned runs while it owns a step past
        capture: the in-doubt rules get their chance instead of the job dying blind (docs/fences.md).
        Asked only off the happy path (a job refused at fetch)."""
        if refused != "max_attempts" or job.attempt != max_attempts + 1:
            return False
        store = self.stores.fence_store_in_use()
        if store is None:
            return False
        try:
            owned = await HOP.run(store.owned, job.id)
        except Exception:
            log.exception("job %s: reading the steps it owns failed; no settling run", job.id)
            return False
        if owned:
            log.warning("job %s: attempts used up by orphaned runs while it owns %s; one settling run applies the "
                        "in-doubt rules", job.id, ", ".join(f"{r.subject}/{r.step} ({r.state})" for r in owned))
        return bool(owned)

    async def leaving(self, job: Fetched) -> tuple[list[str], bool] | None:
        """The job goes to dead-letter: its ``calling`` steps become ``in_doubt`` (with its id as owner), and
        every step it owns past capture or in doubt is named. A step held by another live attempt is left alone.
        Returns the notes and whether a step is in doubt; None when the steps could not be checked (Redis or
        the database did not answer within the retries): the job must not be dead-lettered blind."""
        store = self.stores.fence_store_in_use()
        if store is None:
            return [], False
        try:
            return await HOP.run(self._leaving, store, job)
        except FenceTablesMissing:
            return [], False  # no fence table, so no step it owns; the job's own error says so
        except Exception as exc:
            if not transient(exc):
                log.exception("job %s: reading the steps it owns failed", job.id)
                return [f"the steps it owns could not be read ({type(exc).__name__}: {exc}); `ringfence doctor` "
                        "reports any it left calling or effected"], False
            log.warning("job %s: the steps it owns could not be checked (%s: %s); not dead-lettered now: its "
                        "lease lapses and the next attempt dead-letters it", job.id, type(exc).__name__, exc)
            return None

    def _leaving(self, store: Any, job: Fetched) -> tuple[list[str], bool]:
        notes, in_doubt = [], False
        for found in store.owned(job.id, in_doubt=True, claimed=True):
            row = self._fence_out(store, job, found) if found.state is FenceState.CLAIMED else found
            if row is None:
                continue
            if row.state is FenceState.IN_DOUBT:  # parked by an earlier attempt whose dead-letter did not happen
                notes.append(step_note(row, job.id))
                in_doubt = True
                continue
            if self._held(job, row):
                continue
            if row.state is FenceState.CALLING:
                try:
                    store.park(row.subject, row.step, row.epoch)
                except FencedOut:
                    continue  # settled or taken over meanwhile
                in_doubt = True
            notes.append(step_note(row, job.id))
        return notes, in_doubt

    def _held(self, job: Fetched, row: FenceRow) -> bool:
        """Is the step held by another attempt of the job whose lease is live (running, not lapsed)?"""
        return bool(row.owner_token != job.token and row.owner_token and self._alive(job.id, row.owner_token))

    def _fence_out(self, store: Any, job: Fetched, row: FenceRow) -> FenceRow | None:
        """A ``claimed`` step: an attempt whose lease lapsed may still run its handler (a sync thread) and would
        mark it calling and call behind the dead job; the epoch moves on so it cannot. Returns the row to name
        when it went past claimed meanwhile, else None."""
        if self._held(job, row) or store.fence_out(row, Owner(job.id, job.token, lease_s=self.settings.lease_s)):
            return None
        now: FenceRow | None = store.get(row.subject, row.step)
        moved = now is not None and now.owner_job_id == job.id and now.state in _NAMED
        return now if moved else None

    def _alive(self, job_id: str, token: str) -> bool:
        """``alive``, riding out a Redis restart (refused, LOADING) for up to a lease."""
        retry = DbRetry(attempts=100, base_s=0.1, cap_s=1.0, budget_s=self.settings.lease_s)
        delays = retry.delays()
        while True:
            try:
                return self.alive(job_id, token)
            except UNAVAILABLE as exc:
                delay = next(delays, None)
                if delay is None:
                    raise
                self.broker.health.lost(exc)
                time.sleep(delay)


_NAMED = (FenceState.CALLING, FenceState.EFFECTED, FenceState.IN_DOUBT)  # the states a dead job names


def transient(exc: BaseException) -> bool:
    """Redis or the database not answering (worth doing the whole dead-letter again later)."""
    return isinstance(exc, UNAVAILABLE) or is_transient(exc)
