"""What every route of one dashboard app shares: the app, the guard, the templates, and the page renderer."""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ringfence.dashboard import views
from ringfence.dashboard.security import CSRF_COOKIE, Guard, new_csrf, redact, same

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
        self.env.filters["redact"] = self.redact
        self.env.filters["ago"] = _ago
        self.env.filters["secs"] = _secs
        self.env.filters["utc"] = _utc
        self.env.filters["stamp"] = _stamp
        self.env.filters["until"] = _in
        self.env.filters["q"] = lambda v: quote(str(v), safe="")  # one URL path segment or query value
        self._flash_key = secrets.token_bytes(32)

    def redact(self, value: Any) -> Any:
        return redact(value, self.redact_fields)

    def flash(self, msg: str) -> dict[str, str]:
        """Query fields carrying ``msg`` to the next page, signed: a link cannot make the dashboard say anything."""
        if not msg:
            return {}
        return {"msg": msg, "sig": hmac.new(self._flash_key, msg.encode(), hashlib.sha256).hexdigest()}

    def _shown(self, request: Request) -> str:
        msg = request.query_params.get("msg", "")
        return msg if msg and same(request.query_params.get("sig", ""), self.flash(msg)["sig"]) else ""

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        base = request.scope.get("root_path", "")
        html = self.env.get_template(name).render(
            request=request, base=base, csrf=csrf, can_act=self.guard.allowed(request),
            actions_possible=self.guard.actions_possible, read_only=self.guard.read_only,
            partial=request.headers.get("x-partial") == "1", refresh_s=self.refresh_s,
            namespace=self.app.namespace, msg=self._shown(request),
            now_ms=self.app.broker.clock(), **ctx)
        resp = HTMLResponse(html, status_code=status)
        if CSRF_COOKIE not in request.cookies:
            resp.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path=base or "/")
        return resp


def _secs(s: float | None) -> str:
    """A run time, readable: 12 ms, 1.25 s, 3.5 min; "-" for none."""
    if s is None:
        return "-"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    return f"{s:.2f} s" if s < 120 else f"{s / 60:.1f} min"


def _utc(ms: float) -> str:
    """A time in milliseconds since the epoch, readable (UTC, to the second)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _stamp(when: datetime | None) -> str:
    """A fence row's time as the database gave it, to the second: in UTC when it carries its zone (PostgreSQL);
    SQLite's and MariaDB's carry none, so no zone is claimed for them."""
    if when is None:
        return "-"
    if when.tzinfo is not None:
        return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _in(ms: float, now_ms: float) -> str:
    """How long until ``ms`` ("due now" once past)."""
    s = (ms - now_ms) / 1000
    if s <= 0:
        return "due now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"in {s / size:.1f}{unit}"
    return f"in {s:.1f}s"


def _ago(ms: float, now_ms: float) -> str:
    if not ms:
        return "-"
    s = max(0.0, (now_ms - ms) / 1000)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit} ago"
    return f"{s:.1f}s ago"


class BadInput(ValueError):
    """A query or form value the dashboard cannot use: refused with 400 and one line naming it."""


_WHOLE = re.compile(r"[0-9]{1,9}")


def whole(raw: str | None, name: str) -> int:
    """A whole number from 0 to 999,999,999 ("" or None: 0)."""
    if not raw:
        return 0
    if not _WHOLE.fullmatch(raw):
        raise BadInput(f"{name} must be a whole number from 0 to 999999999, got {raw[:40]!r}")
    return int(raw)


def seconds(raw: str | None, name: str) -> float:
    """A finite number of seconds >= 0 ("" or None: 0)."""
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise BadInput(f"{name} must be a number of seconds >= 0, got {raw[:40]!r}")
    return value
