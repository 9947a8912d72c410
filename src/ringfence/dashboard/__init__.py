"""The web dashboard: an ASGI app (Starlette + Jinja2, server-rendered) for ``ringfence dashboard`` or to mount
inside an existing ASGI application. Needs the ``dashboard`` extra: ``pip install 'ringfence[dashboard]'``.

Example (FastAPI/Starlette)::

    from ringfence.dashboard import create_app
    api.mount("/ringfence", create_app(app, authorize=lambda request: request.user.is_staff))
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request

    from ringfence.app import App

#: The dashboard redacts a payload field whose name contains one of these words (case-insensitive, at any depth)
#: unless told otherwise (``redact=`` or RINGFENCE_DASHBOARD_REDACT).
DEFAULT_REDACT = ("password", "passwd", "pwd", "secret", "token", "key", "card", "auth", "cookie", "session", "cvv",
                  "cvc", "iban", "ssn", "email", "credential", "signature", "private")


def create_app(app: App, *, read_only: bool = False, token: str | None = None,
               authorize: Callable[[Request], bool] | None = None, redact: Iterable[str] | None = None,
               refresh_s: float = 5.0) -> Starlette:
    """The dashboard of ``app``'s namespace.

    ``token`` (default: env RINGFENCE_DASHBOARD_TOKEN) unlocks actions after a login form; ``authorize`` (a
    host application's check on the request) replaces the token when mounted. Without either, or with
    ``read_only``, no action is shown or accepted. ``redact``: words; a payload field whose name contains one is
    shown as ``[redacted]``."""
    from ringfence.dashboard.routes import build

    if redact is None:
        env = os.environ.get("RINGFENCE_DASHBOARD_REDACT")
        redact = [f.strip() for f in env.split(",") if f.strip()] if env is not None else DEFAULT_REDACT
    return build(app, read_only=read_only, token=token if token is not None else
                 os.environ.get("RINGFENCE_DASHBOARD_TOKEN"), authorize=authorize, redact=tuple(redact),
                 refresh_s=refresh_s)


__all__ = ["DEFAULT_REDACT", "create_app"]
