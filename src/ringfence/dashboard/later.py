"""Actions on scheduled and retrying jobs (POST; the token and CSRF as every action): run now (the job's due time
becomes now, so the next promotion moves it to pending) or cancel, for the jobs ticked or, in batches of 500,
every job of the state matching the task and error filter; the page submits the next batch itself."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ringfence import jobs
from ringfence.dashboard.page import BadInput, whole
from ringfence.errors import ConfigError

if TYPE_CHECKING:
    from ringfence.app import App
    from ringfence.dashboard.page import Dashboard

BATCH = 500
STATES = ("scheduled", "retry")


def run_now(app: App, queue: str, state: str, ids: list[str]) -> int:
    """Due now: ``ZADD XX LT`` changes only a job still in the set and only to an earlier time (a job promoted or
    cancelled meanwhile is left alone). Returns how many were changed."""
    if not ids:
        return 0
    k = app.broker.keys.queue(queue)
    key, now = (k.retry if state == "retry" else k.scheduled), app.broker.clock()
    changed: Any = app.broker.sync.zadd(key, dict.fromkeys(ids, now), xx=True, lt=True, ch=True)
    return int(changed)


def cancel(app: App, ids: list[str]) -> int:
    """Cancel each job still scheduled or retrying; any other error (the fence store or Redis failing) stops the
    batch and reaches the page, the rest staying queued."""
    n = 0
    for job_id in ids:
        try:
            jobs.cancel_job(app, job_id)
            n += 1
        except ConfigError:
            continue  # left the state meanwhile (ran, or cancelled by someone else)
    return n


def _batch(app: App, queue: str, state: str, cursor: tuple[int, int], flt: dict[str, str]
           ) -> tuple[list[str], tuple[int, int], bool]:
    """Up to BATCH jobs due from ``cursor`` on (a due time in ms, and how many jobs left due exactly then to
    skip), in due order, that match the filter: (ids, the cursor after them, whether more may follow). The jobs
    acted on leave the range (cancelled, or due now: earlier than the cursor)."""
    k = app.broker.keys.queue(queue)
    after, skip = cursor
    key = k.retry if state == "retry" else k.scheduled
    read: list[Any] = app.broker.sync.zrangebyscore(key, after, "+inf", start=skip, num=BATCH,
                                                    withscores=True)
    ids = [i.decode() if isinstance(i, bytes) else str(i) for i, _ in read]
    chosen = [v.id for v in jobs.by_ids(app, queue, state, ids) if (not flt["task"] or v.task == flt["task"])
              and (not flt["error"] or flt["error"].lower() in v.error.lower())]
    if not read:
        return chosen, cursor, False
    last, picked = int(read[-1][1]), set(chosen)
    kept = sum(1 for i, score in zip(ids, read, strict=True) if int(score[1]) == last and i not in picked)
    return chosen, (last, kept + (skip if last == after else 0)), len(read) == BATCH


def _ms(raw: str) -> int:
    """A time in ms since the epoch ("": 0)."""
    if raw and not (raw.isascii() and raw.isdigit() and len(raw) <= 15):
        raise BadInput(f"after must be a time in milliseconds, got {raw[:40]!r}")
    return int(raw or 0)


async def action(d: Dashboard, request: Request, form: Any) -> Response:
    app = d.app
    op, queue, state = form.get("op"), str(form.get("queue", "")), str(form.get("state", ""))
    if op not in ("run_now", "cancel") or state not in STATES or queue not in app.broker.queues():
        return PlainTextResponse("say op=run_now|cancel, state=scheduled|retry and a queue", 400)
    done = whole(str(form.get("done", "") or "0"), "done")
    flt = {"task": str(form.get("task", "")), "error": str(form.get("error", ""))}
    more, cursor = False, (_ms(str(form.get("after", ""))), whole(str(form.get("skip", "") or "0"), "skip"))
    if form.get("all") == "1":
        if not cursor[0]:  # the first batch: jobs due later than now (run now moves them before it)
            cursor = (app.broker.clock() + 1, 0)
        ids, cursor, more = _batch(app, queue, state, cursor, flt)
    else:
        ids = [str(i) for i in form.getlist("id")][:BATCH]
    n = run_now(app, queue, state, ids) if op == "run_now" else cancel(app, ids)
    return d.render(request, "later_progress.html", page="progress", op=op, queue=queue, state=state,
                    done=done + n, more=more, after=cursor[0], skip=cursor[1], flt=flt)
