"""The relay: moves committed outbox rows to Redis, each once, in batches, in id order per queue.

One step: lock the oldest waiting rows (outbox/store.py), send them to Redis with lua/relay.lua, record each
row's outcome (sent: deleted; cannot be sent as it is, or not confirmed by the replicas it asked for: parked
with the reason), commit, then drop the sent rows' records. Where a crash leaves things:

- after reading: the transaction dies with the process; the rows are still waiting.
- after sending, before the outcome commits: the rows are still waiting; the next step sends them again and
  Redis refuses every id it has a sent record of (answer 2), and the rows are deleted.
- after the commit, before the sent records are dropped: the relay drops them once they are ``keep_s`` old.

A sent record is dropped only when the database has no row of its id any more, so a row is never sent twice
while Redis keeps its records, however long the row waited.

Only the holder of the relay lease in Redis (one per namespace) runs steps; the row locks keep a relay whose
lease ran out meanwhile from sending rows another relay has already sent.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ringfence.errors import ConfigError
from ringfence.faults import RELAY_POINTS, fault_point
from ringfence.outbox.check import problem
from ringfence.outbox.store import Lag, OutboxStore, Waiting, relay_engine
from ringfence.redis import outbox as redis_outbox
from ringfence.redis.replicas import not_replicated, run_and_wait

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from ringfence.app import App

log = logging.getLogger("ringfence.outbox")

#: The relay's fault points, in step order (RINGFENCE_FAULTS=relay_after_send SIGKILLs the relay there).
POINTS = RELAY_POINTS


@dataclass
class RelayCounts:
    sent: int = 0      # rows whose job went to Redis (added, or found there already)
    refused: int = 0   # rows Redis refused as sent before (a re-send after a crash)
    parked: int = 0    # rows parked with the reason (not sent, or not confirmed by their replicas)
    steps: int = 0


@dataclass
class Outcome:
    """One batch's outcome: the rows sent (deleted with the commit), the rows parked and why."""

    sent: dict[str, list[Waiting]] = field(default_factory=lambda: defaultdict(list))
    parked: dict[int, str] = field(default_factory=dict)

    def sent_ids(self) -> list[int]:
        return [r.id for rows in self.sent.values() for r in rows]

    def by_queue(self) -> dict[str, list[str]]:
        return {q: [r.job_id for r in rows] for q, rows in self.sent.items()}


class Relay:
    """Example::

        relay = Relay(app, batch=100)
        relay.run(interval_s=1.0)   # until relay.stop.set(); or relay.run(once=True) to drain and return
    """

    def __init__(self, app: App, *, engine: Engine | None = None, batch: int = 100, lease_s: float = 10.0,
                 keep_s: float = 86400.0, owner: str | None = None) -> None:
        if type(batch) is not int or batch < 1:
            raise ConfigError(f"relay batch={batch!r} must be an int >= 1")
        if not lease_s > 0 or not keep_s > lease_s:
            raise ConfigError(f"relay lease_s={lease_s} must be > 0 and keep_s={keep_s} above it")
        if engine is None:
            if not app.fence_url:
                raise ConfigError("the relay needs the application's database: App(fence_url=...) or "
                                  "RINGFENCE_FENCE_URL (the outbox table lives there)")
            engine = relay_engine(app.fence_url)
        self.app = app
        self.broker = app.broker
        self.store = OutboxStore(engine, app.namespace)
        self.batch = batch
        self.lease_s = lease_s
        self.keep_ms = int(keep_s * 1000)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.counts = RelayCounts()
        self.stop = threading.Event()
        self._leading = False
        self._checked = False
        self._next_sweep = 0.0

    def lead(self) -> bool:
        """Take or renew the relay lease; True while this relay holds it."""
        held = redis_outbox.acquire_lease(self.broker, self.owner, self.lease_s)
        if held != self._leading:
            log.info("outbox relay %s: %s the lease", self.owner, "holds" if held else "does not hold")
        self._leading = held
        return held

    def release(self) -> None:
        if self._leading:
            redis_outbox.release_lease(self.broker, self.owner)
            self._leading = False

    def step(self) -> int:
        """Send one batch (the caller holds the lease); returns the number of rows it took."""
        if not self._checked:
            self.store.check()
            self._checked = True
        self._sweep()
        with self.store.batch(self.batch) as batch:
            fault_point("relay_after_read")
            if not batch.rows:
                return 0
            outcome = self._send(batch.rows)
            fault_point("relay_after_send")
            batch.finish(outcome.sent_ids(), outcome.parked)
        fault_point("relay_after_mark")
        redis_outbox.forget_sent(self.broker, outcome.by_queue())
        for row in batch.rows:
            if row.id in outcome.parked:
                log.error("outbox: row %d (job %s) parked: %s", row.id, row.job_id, outcome.parked[row.id])
        self.counts.parked += len(outcome.parked)
        self.counts.steps += 1
        return len(batch.rows)

    def _send(self, rows: list[Waiting]) -> Outcome:
        out = Outcome()
        groups: dict[str, list[Waiting]] = defaultdict(list)
        for row in rows:  # rows come in id order: each queue's jobs keep it
            reason = problem(row, self.app.max_payload_bytes)
            if reason is None:
                groups[row.queue].append(row)
            else:
                out.parked[row.id] = reason
        if groups:
            self.broker.register_queues(groups)
        for queue, group in groups.items():
            answers, acked = self._call(queue, group)
            for row, answer in zip(group, answers, strict=True):
                if row.min_replicas > acked:
                    out.parked[row.id] = self._unconfirmed(row, acked)
                    continue
                self._count(row, answer)
                out.sent[queue].append(row)
        return out

    def _call(self, queue: str, group: list[Waiting]) -> tuple[list[int | str], int]:
        """The queue's jobs in one script call, and how many replicas confirmed it (0 when none were asked)."""
        call = redis_outbox.relay(self.broker, queue, [
            (r.job_id, r.spec, r.run_at_ms, r.unique_key, r.unique_until_ms) for r in group])
        replicas = max(r.min_replicas for r in group)
        if not replicas:
            return self.broker.run(call), 0
        return run_and_wait(self.broker, call, replicas, self._timeout_ms())

    def _timeout_ms(self) -> int:
        return int(self.app.replica_timeout_s * 1000)

    def _unconfirmed(self, row: Waiting, acked: int) -> str:
        return ("NotReplicated: " + not_replicated(f"job {row.job_id}", acked, row.min_replicas, self._timeout_ms())
                + "; `ringfence outbox retry` waits for the replicas again")

    def _sweep(self) -> None:
        """Drop sent records older than ``keep_s`` whose rows the database no longer has (a crash after the
        commit left them); a record whose row still waits or is parked stays: it refuses a second send."""
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + min(60.0, self.keep_ms / 2000)
        old = redis_outbox.old_sent(self.broker, self.broker.clock() - self.keep_ms)
        if not old:
            return
        kept = self.store.holding([i for ids in old.values() for i in ids])
        redis_outbox.forget_sent(self.broker, {q: [i for i in ids if i not in kept] for q, ids in old.items()})

    def _count(self, row: Waiting, answer: Any) -> None:
        if answer == redis_outbox.REFUSED:
            self.counts.refused += 1
            log.info("outbox: job %s (row %d) was sent before; Redis refused the copy", row.job_id, row.id)
            return
        self.counts.sent += 1
        if answer == 0:
            log.warning("outbox: job id %s (row %d) holds another job already; this row's job is dropped",
                        row.job_id, row.id)

    def lag(self) -> Lag:
        return self.store.lag()

    def run(self, *, once: bool = False, interval_s: float = 1.0) -> int:
        """Relay until :attr:`stop` is set (``once``: until no row is waiting). Returns the rows relayed."""
        total = 0
        waited_since = time.monotonic()
        try:
            while not self.stop.is_set():
                if not self._lead_or_report(once):
                    if once and time.monotonic() - waited_since > 2 * self.lease_s:
                        holder = redis_outbox.lease_holder(self.broker)
                        raise ConfigError(f"another relay holds the outbox lease ({holder}); it relays the rows")
                    self.stop.wait(min(interval_s, self.lease_s / 2))
                    continue
                try:
                    n = self.step()
                except ConfigError:  # the table lacks a column: retrying cannot help
                    raise
                except Exception as exc:  # Redis or the database away: nothing was deleted, the rows wait
                    if once:
                        raise
                    log.warning("outbox relay: step failed (%s: %s); retrying in %gs", type(exc).__name__, exc,
                                interval_s)
                    self.stop.wait(interval_s)
                    continue
                total += n
                if n < self.batch:
                    if once:
                        break
                    self.stop.wait(interval_s)
        finally:
            try:
                self.release()
            except Exception as exc:  # the lease expires by itself
                log.warning("outbox relay: releasing the lease failed (%s)", exc)
        return total

    def _lead_or_report(self, once: bool) -> bool:
        try:
            return self.lead()
        except Exception as exc:
            if once:  # --once: one clear error (Redis unreachable, refused login), not "another relay leads"
                raise
            log.warning("outbox relay: cannot reach Redis for the lease (%s: %s)", type(exc).__name__, exc)
            self._leading = False
            return False
