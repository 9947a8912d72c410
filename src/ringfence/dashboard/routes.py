"""The dashboard's pages (GET, read-only) and the Starlette app around them; actions are in ``actions.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ringfence import jobs
from ringfence.dashboard import actions, search, views
from ringfence.dashboard.page import BadInput, Dashboard, seconds, whole
from ringfence.dashboard.security import Guard
from ringfence.queries import queue_gauges
from ringfence.redis.admin import KEY_WAIT, STATES

if TYPE_CHECKING:
    from ringfence.app import App



def build(app: App, *, read_only: bool, token: str | None, authorize: Any, redact: tuple[str, ...],
          refresh_s: float) -> Starlette:
    d = Dashboard(app, Guard(token, authorize, read_only), redact, refresh_s)

    def overview(request: Request) -> Response:
        return d.render(request, "overview.html", page="overview", **views.overview(app))

    def servers(request: Request) -> Response:
        return d.render(request, "servers.html", page="servers", servers=views.servers(app))

    def job(request: Request) -> Response:
        job_id = request.query_params.get("id", "").strip()
        found = jobs.find_job(app, job_id) if job_id else None
        steps: list[Any] = []
        store = app.fence_store_in_use() if found else None
        if store is not None:
            from ringfence.fence.reads import owner_rows

            steps = owner_rows(store, job_id)
        where = views.whereabouts(app, found) if found else {}
        return d.render(request, "job.html", page="jobs", job_id=job_id, job=found, steps=steps, where=where,
                        status=404 if job_id and found is None else 200)

    def browse(request: Request) -> Response:
        queue, state = request.path_params["queue"], request.path_params["state"]
        if state not in STATES or queue not in app.broker.queues():
            return d.render(request, "job.html", page="jobs", job_id="", job=None, steps=[], status=404,
                            missing=f"no state {state!r} of queue {queue!r}")
        q = request.query_params
        payload = q.get("payload", "").strip()
        flt = {"task": q.get("task", "").strip(), "error": q.get("error", "").strip(),
               "min_age_s": seconds(q.get("min_age_s"), "min_age_s"), "payload": payload,
               "field": search.payload_field(payload, d.redact_fields)}
        at = search.At.parse(whole(q.get("offset"), "offset"), q.get("keyed") if state == "pending" else None)
        found = search.scan(app, queue, state, at, flt)
        gauges = queue_gauges(app.broker, queue)
        return d.render(request, "browse.html", page="jobs", queue=queue, state=state, jobs=found.jobs, flt=flt,
                        at=at, next_at=found.next_at, scan=found, states=STATES,
                        due=views.due_times(app, queue, state, [j.id for j in found.jobs]),
                        keys={j.id: j.state.removeprefix(KEY_WAIT) for j in found.jobs if j.state.startswith(KEY_WAIT)},
                        key_waiting=state == "pending" and gauges["stats"].get("keyed_waiting", 0) > 0,
                        charts=views.queue_charts(app, queue) if state == "pending" and at == search.At() else [],
                        paused=gauges["paused"])

    def fences(request: Request) -> Response:
        replay = request.query_params.get("replay", "")
        dead = replay and jobs.find_job(app, replay)
        return d.render(request, "fences.html", page="fences", replay=dead if dead and dead.state == "dead" else None,
                        **views.fences(app))

    def doctor(request: Request) -> Response:
        return d.render(request, "doctor.html", page="doctor", findings=d.doctor.findings(app))

    def reconcile(request: Request) -> Response:
        step = request.query_params.get("step", "")
        source, error = views.reconcile_step(app, step)
        return d.render(request, "reconcile.html", page="reconcile", step=step, source=source, error=error,
                        report=None, status=404 if error else 200)

    static = StaticFiles(packages=[("ringfence.dashboard", "static")])
    routes = [
        Route("/", overview), Route("/servers", servers), Route("/jobs", job),
        Route("/queues/{queue}/{state}", browse), Route("/fences", fences), Route("/doctor", doctor),
        Route("/fences/reconcile", reconcile), Route("/tasks/{queue}/{task}", _page(d, _task)),
        Route("/workflows", _page(d, _workflow)),
        *actions.routes(d), Mount("/static", static, name="static"),
    ]
    def bad_input(request: Request, exc: Exception) -> Response:
        return d.render(request, "error.html", status=400, page="error", error=f"refused: {exc}")

    return Starlette(routes=routes, exception_handlers={BadInput: bad_input})


def _page(d: Dashboard, fn: Any) -> Any:
    def endpoint(request: Request) -> Response:
        return fn(d, request)  # type: ignore[no-any-return]
    return endpoint


def _task(d: Dashboard, request: Request) -> Response:
    queue, name = request.path_params["queue"], request.path_params["task"]
    found = views.task_page(d.app, queue, name)
    return d.render(request, "task.html", page="overview", queue=queue, task=name, found=found,
                    status=200 if found else 404)


def _workflow(d: Dashboard, request: Request) -> Response:
    from ringfence.errors import ConfigError

    wid = request.query_params.get("id", "").strip()
    try:
        found = d.app.workflow(wid) if wid else None
    except ConfigError as exc:
        raise BadInput(str(exc)) from exc
    return d.render(request, "workflow.html", page="workflows", wid=wid, wf=found,
                    status=404 if wid and found is None else 200)
