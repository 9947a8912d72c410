"""The dashboard's actions (POST only): each needs the token or the host app's auth, and the CSRF value;
``--read-only`` refuses them all. Bulk dead-letter actions run one bounded batch per request and the page
submits the next one itself, showing the progress."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ringfence import jobs, queries
from ringfence.dashboard import later, views
from ringfence.dashboard.page import BadInput, whole
from ringfence.dashboard.security import AUTH_COOKIE, csrf_ok, same, token_proof
from ringfence.errors import RingfenceError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ringfence.dashboard.page import Dashboard

log = logging.getLogger("ringfence.dashboard")
BATCH = 500  # dead jobs per request of a bulk action


def _back(d: Dashboard, request: Request, path: str, msg: str = "", **query: Any) -> RedirectResponse:
    """A redirect after an action; its flash message is signed so a page shows only what the dashboard said."""
    q = urlencode({k: v for k, v in {**query, **d.flash(msg)}.items() if v not in (None, "")})
    return RedirectResponse(f"{_base(request)}{path}" + (f"?{q}" if q else ""), status_code=303)


def _guarded(d: Dashboard, fn: Callable[[Dashboard, Request, Any], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
    """CSRF first (every POST), then read-only, then who is asking; a refused input comes back as one line."""
    async def endpoint(request: Request) -> Response:
        form = await request.form()
        if not csrf_ok(request, form.get("csrf")):
            return PlainTextResponse("refused: missing or wrong CSRF value (reload the page)", 403)
        if d.guard.read_only:
            return PlainTextResponse("refused: the dashboard is read-only", 403)
        if not d.guard.allowed(request):
            return PlainTextResponse("refused: log in with the dashboard token first", 403)
        try:
            return await fn(d, request, form)
        except BadInput as exc:
            return PlainTextResponse(f"refused: {exc}", 400)
        except RingfenceError as exc:
            return _back(d, request, "/", msg=f"refused: {exc}")
    return endpoint


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def _no_login(d: Dashboard) -> str:
    """Why this dashboard has nothing to log in for, or "" when the token form applies."""
    if d.guard.read_only:
        return "This dashboard is read-only: no action can be enabled, token or not."
    if d.guard.token is None:
        return "No dashboard token is set (RINGFENCE_DASHBOARD_TOKEN): there is nothing to log in with."
    return ""


async def _login(d: Dashboard, request: Request) -> Response:
    closed = _no_login(d)
    if request.method == "GET":
        return d.render(request, "login.html", page="login", closed=closed)
    form = await request.form()
    if not csrf_ok(request, form.get("csrf")):
        return PlainTextResponse("refused: missing or wrong CSRF value (reload the page)", 403)
    if closed:
        return d.render(request, "login.html", status=403, page="login", closed=closed)
    assert d.guard.token is not None
    if not same(form.get("token", ""), d.guard.token):
        return d.render(request, "login.html", status=403, page="login", error="wrong token")
    resp = _back(d, request, "/", msg="logged in: actions enabled")
    resp.set_cookie(AUTH_COOKIE, token_proof(d.guard.token), httponly=True, samesite="strict",
                    path=_base(request) or "/")
    return resp


async def _logout(d: Dashboard, request: Request) -> Response:
    form = await request.form()
    if not csrf_ok(request, form.get("csrf")):
        return PlainTextResponse("refused: missing or wrong CSRF value (reload the page)", 403)
    resp = _back(d, request, "/", msg="logged out")
    resp.delete_cookie(AUTH_COOKIE, path=_base(request) or "/")
    return resp


async def _pause(d: Dashboard, request: Request, form: Any) -> Response:
    queue, paused = str(form.get("queue", "")), form.get("paused") == "1"
    if queue not in d.app.broker.queues():
        return PlainTextResponse(f"no queue {queue!r}", 404)
    d.app.broker.set_paused(queue, paused)
    return _back(d, request, "/", msg=f"{'paused' if paused else 'resumed'} {queue}")


async def _cancel(d: Dashboard, request: Request, form: Any) -> Response:
    job_id = str(form.get("id", ""))
    queue, left = jobs.cancel_job(d.app, job_id)
    msg = f"cancelled job {job_id} (was {left} in {queue})"
    log.warning("dashboard: %s", msg)  # the CLI prints its own line; a click on a page leaves this one
    if left.endswith("dead"):  # it owns a fence step past capture: kept in dead-letter, shown there
        return _back(d, request, "/jobs", id=job_id, msg=msg)
    return _back(d, request, f"/queues/{queue}/{page_of(left)}", msg=msg)


def page_of(state: str) -> str:
    """The queue's page that lists a job in ``state``: pending for every pending one (in the pending list or
    waiting for its key's slot) and for one waiting for its dependencies (depends_on: no page lists those)."""
    return state if state in ("scheduled", "retry", "active") else "pending"


async def _purge(d: Dashboard, request: Request, form: Any) -> Response:
    queue, typed = str(form.get("queue", "")), str(form.get("confirm", ""))
    if queue not in d.app.broker.queues() or typed != queue:
        return _back(d, request, f"/queues/{queue}/pending", msg="not purged: type the queue's name to confirm")
    deleted, moved = jobs.purge_queue(d.app, queue)
    note = f"; {moved} owning a fence step moved to dead-letter" if moved else ""
    return _back(d, request, f"/queues/{queue}/pending", msg=f"purged {deleted} pending job(s) of {queue}{note}")


async def _dead(d: Dashboard, request: Request, form: Any) -> Response:
    return _dead_action(d, request, form)


async def _resolve(d: Dashboard, request: Request, form: Any) -> Response:
    """Settle an in-doubt step; the fences page then offers its dead job's replay."""
    from ringfence.errors import FenceError

    subject, step, outcome = str(form.get("subject", "")), str(form.get("step", "")), form.get("outcome")
    reference = str(form.get("reference", "")).strip() or None
    store = d.app.fence_store_in_use()
    if store is None:
        return PlainTextResponse("no fence database", 404)
    if outcome == "done" and not reference:
        return _back(d, request, "/fences", msg="not resolved: 'done' needs the provider's reference")
    row = store.get(subject, step)
    owner = row.owner_job_id if row is not None else None
    try:
        row = store.resolve(subject, step, happened=outcome == "done", reference=reference)
    except FenceError as exc:
        return _back(d, request, "/fences", msg=f"not resolved: {exc}")
    return _back(d, request, "/fences", replay=owner,
                 msg=f"{subject}/{step}: now {row.state} (epoch {row.epoch}); replay its job to finish it")


async def _reconcile(d: Dashboard, request: Request, form: Any) -> Response:
    """Reconcile one step against the provider's records the App declares: the request names the step only."""
    step = str(form.get("step", ""))

    def work() -> tuple[str, str, Any]:
        source, error = views.reconcile_step(d.app, step)
        if error:
            return source, error, None
        report, error = views.reconcile(d.app, step, d.redact)
        return source, error, report

    source, error, report = await run_in_threadpool(work)
    return d.render(request, "reconcile.html", page="reconcile", step=step, source=source, error=error,
                    report=report, declared=step in d.app.reconcile_sources, status=404 if not source else 200)


def routes(d: Dashboard) -> list[Route]:
    async def login(request: Request) -> Response:
        return await _login(d, request)

    async def logout(request: Request) -> Response:
        return await _logout(d, request)

    return [
        Route("/login", login, methods=["GET", "POST"]), Route("/logout", logout, methods=["POST"]),
        Route("/actions/pause", _guarded(d, _pause), methods=["POST"]),
        Route("/actions/cancel", _guarded(d, _cancel), methods=["POST"]),
        Route("/actions/purge", _guarded(d, _purge), methods=["POST"]),
        Route("/actions/dead", _guarded(d, _dead), methods=["POST"]),
        Route("/actions/later", _guarded(d, later.action), methods=["POST"]),
        Route("/actions/resolve", _guarded(d, _resolve), methods=["POST"]),
        Route("/fences/reconcile", _guarded(d, _reconcile), methods=["POST"]),
    ]


def _dead_action(d: Dashboard, request: Request, form: Any) -> Response:
    """Replay or delete dead jobs: the ids selected, or (``all``) one batch of those matching the filter."""
    app = d.app
    op, queue = form.get("op"), str(form.get("queue", ""))
    if op not in ("replay", "delete") or queue not in app.broker.queues():
        return PlainTextResponse("say op=replay|delete and a queue", 400)
    done = whole(str(form.get("done", "") or "0"), "done")
    flt = queries.DeadFilter(queue=queue, task=str(form.get("task", "")) or None,
                             error=str(form.get("error", "")) or None)
    bulk = form.get("all") == "1"
    ids = _matching(app, flt, op) if bulk else [str(i) for i in form.getlist("id")][:BATCH]
    n = _apply(app, op, queue, ids)
    filtered = bulk and (flt.task or flt.error)
    left = len(_matching(app, flt, op)) if filtered else int(app.broker.sync.zcard(app.broker.keys.queue(queue).dead))
    return d.render(request, "progress.html", page="progress", op=op, queue=queue, done=done + n, left=left,
                    more=bulk and n == BATCH, filtered=filtered, at_least=filtered and left >= BATCH,
                    flt={"task": flt.task or "", "error": flt.error or ""})


def _matching(app: Any, flt: queries.DeadFilter, op: str) -> list[str]:
    """Up to one batch of the dead jobs the filter matches (a malformed one cannot be replayed)."""
    return [j.id for j in queries.dead_jobs(app.broker, flt, BATCH) if not j.malformed or op == "delete"]


def _apply(app: Any, op: str, queue: str, ids: list[str]) -> int:
    if not ids:
        return 0
    failed = app.failed_jobs
    if op == "replay":
        replayed = app.broker.run(app.broker.replay(queue, ids))
        if failed is not None and replayed:
            failed.mark_replayed(replayed)
        return len(replayed)
    n = int(app.broker.run(app.broker.delete_dead(queue, ids)))
    if failed is not None:
        failed.delete(ids)
    return n
