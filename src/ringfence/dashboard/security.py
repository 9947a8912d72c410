"""Who may act: a token (``RINGFENCE_DASHBOARD_TOKEN``) or the host application's own check when mounted,
CSRF on every POST (a per-browser random value in a cookie, echoed in each form), and payload redaction."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from starlette.requests import Request

CSRF_COOKIE = "rf_csrf"
AUTH_COOKIE = "rf_auth"
REDACTED = "[redacted]"


def token_proof(token: str) -> str:
    """What the auth cookie holds: a digest of the token, never the token itself."""
    return hmac.new(token.encode(), b"ringfence-dashboard", hashlib.sha256).hexdigest()


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(request: Request, sent: Any) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    return bool(cookie) and isinstance(sent, str) and hmac.compare_digest(cookie, sent)


class Guard:
    """Decides per request whether actions are shown and allowed."""

    def __init__(self, token: str | None, authorize: Callable[[Request], bool] | None, read_only: bool) -> None:
        self.token = token or None
        self.authorize = authorize
        self.read_only = read_only

    @property
    def actions_possible(self) -> bool:
        return not self.read_only and (self.token is not None or self.authorize is not None)

    def allowed(self, request: Request) -> bool:
        if not self.actions_possible:
            return False
        if self.authorize is not None:
            return bool(self.authorize(request))
        assert self.token is not None
        sent = request.cookies.get(AUTH_COOKIE, "")
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        want = token_proof(self.token)
        return hmac.compare_digest(sent, want) or (bool(bearer) and hmac.compare_digest(bearer, self.token))


def redact(value: Any, fields: Iterable[str]) -> Any:
    """A copy of ``value`` with every mapping key in ``fields`` (at any depth) replaced by a mark."""
    names = {f.lower() for f in fields}
    if not names:
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (REDACTED if str(k).lower() in names else walk(x)) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value)
