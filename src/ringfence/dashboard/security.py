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


def same(sent: object, want: str) -> bool:
    """Constant-time equality of a value a browser sent (any text, or not text at all) with ``want``."""
    return isinstance(sent, str) and hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), want.encode())


def new_csrf() -> str:
    return secrets.token_urlsafe(24)


def csrf_ok(request: Request, sent: Any) -> bool:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    return bool(cookie) and same(sent, cookie)


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
        return same(sent, token_proof(self.token)) or (bool(bearer) and same(bearer, self.token))


def redact(value: Any, words: Iterable[str]) -> Any:
    """A copy of ``value`` where the value of every mapping key whose name contains one of ``words``
    (case-insensitive, at any depth) is replaced by a mark."""
    lowered = tuple(w.lower() for w in words if w)
    if not lowered:
        return value

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: (REDACTED if any(w in str(k).lower() for w in lowered) else walk(x)) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return walk(value)
