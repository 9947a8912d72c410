"""Operations on single jobs and whole queues by a person (CLI ``job``/``queue purge`` and the dashboard):
find a job in any state, browse a state page by page, cancel, purge.

A job that leaves its queue while it owns a fence step past capture never hides the effect: it goes to
dead-letter (reason ``cancelled``) instead of vanishing, and a ``calling`` step it owns becomes ``in_doubt``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ringfence import queries
from ringfence.errors import BadRecord, ConfigError, FencedOut
from ringfence.fence.model import FenceState
from ringfence.models import DeadJob, JobSpec
from ringfence.redis import workflows as waiting
from ringfence.redis.admin import is_pending

if TYPE_CHECKING:
    from ringfence.runtime import Live

PURGE_BATCH = 1000  # pending jobs deleted per script call


@dataclass
class JobView:
    """One job as a person sees it, whatever its state."""

    id: str
    queue: str
    state: str
    task: str = "?"
    args: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    enqueued_ms: float = 0
    reason: str = ""
    error: str = ""
    traceback: str = ""
    died_ms: int = 0
    malformed: str = ""
    source: str = "redis"  # or "sql": a dead job only in the failed_jobs table (Redis lost it)
    result: Any = None     # state "done" (a task with store_result): the handler's return value
    finished_ms: int = 0
    unknown: tuple[str, ...] = ()  # fields its record no longer holds (a finished job): never shown as 0 or {}
    waits_for: list[str] = field(default_factory=list)  # state "waiting" (depends_on): the jobs not done yet

    def to_dict(self) -> dict[str, Any]:
        found = {k: v for k, v in self.__dict__.items() if k not in self.unknown and k != "unknown"}
        if self.state != "done":
            del found["result"], found["finished_ms"]
        if self.state != "waiting":
            del found["waits_for"]
        return found


#: What a finished job's stored result record does not hold.
NOT_KEPT = ("args", "attempts", "history", "enqueued_ms", "traceback", "died_ms", "malformed")


def find_job(app: Live, job_id: str) -> JobView | None:
    """The job with this id in any queue and state (dead included), or None. The job's own records first (in
    every queue, then a stored result, then the failed_jobs table): only a job found in none of them is looked
    for among the inline pending entries, which only a generated id can be (``may_be_inline``)."""
    queues = app.broker.queues()
    found = _in_queues(app, queues, job_id, scan=False) or _finished(app, job_id) or _sql_only(app, job_id)
    return found or _in_queues(app, queues, job_id, scan=True)


def _in_queues(app: Live, queues: list[str], job_id: str, scan: bool) -> JobView | None:
    broker = app.broker
    for queue in queues:
        state, inline = broker.job_lookup(queue, job_id, scan)  # inline: the spec an inline pending job's scan found
        if state is None:
            continue
        if state == "dead":
            dead = queries.find_dead(broker, job_id)
            if dead is not None:
                return JobView(id=job_id, queue=queue, state="dead", task=dead.task, args=dead.args,
                               attempts=dead.attempts, history=dead.history, reason=dead.reason, error=dead.error,
                               traceback=dead.traceback, died_ms=dead.died_ms, malformed=dead.malformed)
        view = JobView(id=job_id, queue=queue, state=state, attempts=broker.attempts(queue, job_id),
                       history=broker.history(queue, job_id))
        if state == "waiting":
            view.waits_for = waiting.waits_for(broker, queue, job_id)
        raw = inline if inline is not None else broker.job_spec(queue, job_id)
        if raw is None:
            continue  # left the queue meanwhile: look on
        _fill(view, raw)
        return view
    return None


def _finished(app: Live, job_id: str) -> JobView | None:
    """A job that left its queue with a stored result (done; or dead and then deleted or replayed away)."""
    from ringfence.redis import results as stored

    raw = stored.read(app.broker, job_id)
    if raw is None:
        return None
    record = orjson.loads(raw)
    if not isinstance(record, dict):
        return None
    return JobView(id=job_id, queue=str(record.get("queue", "?")), state=str(record.get("state", "?")),
                   task=str(record.get("task", "?")), reason=str(record.get("reason", "")),
                   error=str(record.get("error", "")), result=record.get("result"),
                   finished_ms=int(record.get("finished_ms", 0)), unknown=NOT_KEPT)


def _sql_only(app: Live, job_id: str) -> JobView | None:
    """A dead job kept only in the failed_jobs table (not replayed): Redis lost it."""
    failed = app.failed_jobs
    if failed is None:
        return None
    from ringfence.fence.failed import as_dead_job

    rows = failed.unreplayed([job_id])
    if not rows:
        return None
    view = _dead_view(as_dead_job(rows[0]))
    view.source = "sql"
    return view


def _fill(view: JobView, raw: bytes) -> None:
    try:
        spec = JobSpec.decode(raw)
    except BadRecord as exc:
        view.malformed = str(exc)
        return
    view.task, view.args, view.enqueued_ms = spec.task, spec.args, spec.enqueued_ms
    if view.history:
        last = view.history[-1]
        view.error = str(last.get("error", "")) if isinstance(last, dict) else ""
        view.traceback = str(last.get("traceback", "")) if isinstance(last, dict) else ""


def browse(app: Live, queue: str, state: str, offset: int = 0, count: int = 50) -> list[JobView]:
    """One page of a queue's state: ids and scores from one range read, records of that page only."""
    broker = app.broker
    if state == "dead":
        ids = [i for i, _ in broker.page(queue, state, offset, count)]
        return [_dead_view(DeadJob.decode(queue, i, raw)) for i, raw in broker.dead_records(queue, ids)]
    return views_of(app, queue, state, broker.page_specs(queue, state, offset, count))


def by_ids(app: Live, queue: str, state: str, ids: list[str]) -> list[JobView]:
    """The scheduled or retrying jobs ``ids`` of ``queue`` as ``browse`` shows them (one round trip each for
    their records, attempts and histories)."""
    return views_of(app, queue, state, list(zip(ids, app.broker.specs(queue, ids), strict=True)))


def views_of(app: Live, queue: str, state: str, page: list[tuple[str, bytes | None]]) -> list[JobView]:
    """Jobs of ``queue`` in ``state`` from their (id, spec) pairs (spec None: shown without task and payload),
    with their attempts and histories read in one round trip."""
    broker = app.broker
    ids = [job_id for job_id, _ in page]
    k = broker.keys.queue(queue)
    p = broker.sync.pipeline(transaction=False)
    p.hmget(k.attempts, ids)  # as find_job reads them, one round trip for the page
    p.hmget(k.history, ids)
    attempts, histories = p.execute() if ids else ([], [])
    out = []
    for (job_id, raw), tries, history in zip(page, attempts, histories, strict=True):
        view = JobView(id=job_id, queue=queue, state=state, attempts=int(tries or 0), history=_entries(history))
        if raw is not None:
            _fill(view, raw)
        out.append(view)
    return out


def _entries(raw: Any) -> list[dict[str, Any]]:
    """A stored history as ``broker.history`` reads it: empty when missing or malformed."""
    try:
        found = orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError:
        return []
    return found if isinstance(found, list) else []


def _dead_view(dead: Any) -> JobView:
    return JobView(id=dead.id, queue=dead.queue, state="dead", task=dead.task, args=dead.args,
                   attempts=dead.attempts, history=dead.history, reason=dead.reason, error=dead.error,
                   traceback=dead.traceback, died_ms=dead.died_ms, malformed=dead.malformed)


def _owned_notes(app: Live, job_id: str) -> list[str]:
    """Steps past capture the job owns, its ``calling`` ones parked in doubt: one note each."""
    store = app.fence_store_in_use()
    if store is None:
        return []
    from ringfence.fence.model import step_note

    notes = []
    for row in store.owned(job_id):
        if row.state is FenceState.CALLING:
            try:
                store.park(row.subject, row.step, row.epoch)
            except FencedOut:
                continue  # settled or taken over meanwhile
        notes.append(step_note(row, job_id))
    return notes


def cancel_job(app: Live, job_id: str) -> tuple[str, str]:
    """Cancel a pending, scheduled, retrying or running job. Returns (queue, state it left); a job owning a
    step past capture goes to dead-letter (state then reads ``... -> dead``). Refuses an unknown or dead id."""
    job = find_job(app, job_id)
    if job is None:
        raise ConfigError(f"no job {job_id!r} in namespace {app.namespace}")
    if job.state == "dead":
        raise ConfigError(f"job {job_id} is dead already; delete it with `ringfence dead delete {job_id}`")
    notes = _owned_notes(app, job_id)
    fields = None
    if notes:
        fields = {"task": job.task, "reason": "cancelled", "error": "cancelled by a person; " + "; ".join(notes),
                  "traceback": ""}
    entry = app.broker.inline_entry(job.queue, job_id)
    left = app.broker.run(app.broker.cancel(job.queue, job_id, fields, entry))
    if not left:
        raise ConfigError(f"job {job_id} left its queue meanwhile (ran or died); nothing cancelled")
    return job.queue, left + (" -> dead" if notes else "")


def purge_queue(app: Live, queue: str) -> tuple[int, int]:
    """Delete the pending jobs of ``queue`` (those queued when it starts), in bounded batches. Pending jobs
    that own a step past capture go to dead-letter instead. Returns (deleted, moved to dead-letter)."""
    broker = app.broker
    moved = 0
    store = app.fence_store_in_use()
    if store is not None:  # few rows: steps past capture are transient
        owners = {r.owner_job_id for s in (FenceState.CALLING, FenceState.EFFECTED)
                  for r in store.list_steps(state=s, limit=10_000) if r.owner_job_id}
        for job_id in sorted(owners):
            if is_pending(broker.job_state(queue, job_id)):
                cancel_job(app, job_id)
                moved += 1
    left = broker.purgeable(queue)
    deleted = 0
    while left > 0:
        n = broker.run(broker.purge(queue, min(PURGE_BATCH, left)))
        if n == 0:
            break
        deleted += n
        left -= n
    return deleted, moved
