"""What every route of one dashboard app shares: the app, the guard, the templates, and the page renderer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ringfence.dashboard import views
from ringfence.dashboard.security import CSRF_COOKIE, Guard, new_csrf, redact

if TYPE_CHECKING:
    from ringfence.app import App


class Dashboard:
    """State shared by the routes of one dashboard app. Pages are plain functions: Starlette runs them in its
    thread pool, so their blocking Redis and SQL reads never hold up the event loop."""

    def __init__(self, app: App, guard: Guard, redact_fields: tuple[str, ...], refresh_s: float) -> None:
        self.app, self.guard, self.redact_fields, self.refresh_s = app, guard, redact_fields, refresh_s
        self.doctor = views.DoctorView()
        self.env = Environment(loader=PackageLoader("ringfence.dashboard", "templates"),
                               autoescape=select_autoescape(["html"]))
        self.env.filters["redact"] = lambda v: redact(v, self.redact_fields)
        self.env.filters["ago"] = _ago

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        base = request.scope.get("root_path", "")
        html = self.env.get_template(name).render(
            request=request, base=base, csrf=csrf, can_act=self.guard.allowed(request),
            actions_possible=self.guard.actions_possible, read_only=self.guard.read_only,
            partial=request.headers.get("x-partial") == "1", refresh_s=self.refresh_s,
            namespace=self.app.namespace, msg=request.query_params.get("msg", ""),
            now_ms=self.app.broker.clock(), **ctx)
        resp = HTMLResponse(html, status_code=status)
        if CSRF_COOKIE not in request.cookies:
            resp.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=base or "/")
        return resp


def _ago(ms: float, now_ms: float) -> str:
    if not ms:
        return "-"
    s = max(0.0, (now_ms - ms) / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit} ago"
    return f"{s:.1f}s ago"
