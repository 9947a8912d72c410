"""What "cannot connect to Redis" looks like: one line per cause (down, a malformed URL, a wrong or missing
password), never a traceback. The CLI exits 3 on these (``--debug`` shows the traceback)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.connection import parse_url

from ringfence.errors import BrokerError, CannotConnect, NotPermitted
from ringfence.redis.connection import RESHARDING, UNAVAILABLE, Health, parse_target

T = TypeVar("T")


def safe_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return url


def check_url(url: str) -> None:
    """Refuse a malformed Redis URL with one line: an unknown scheme or a malformed cluster or Sentinel URL is a
    ``ConfigError``, a bad port of a single Redis ``CannotConnect``."""
    if parse_target(url).kind != "single":
        return
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise CannotConnect(f"bad Redis URL {safe_url(url)}: {exc}") from exc
    parts = urlsplit(url)
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():  # redis-py would silently use database 0
        raise CannotConnect(f"bad Redis URL {safe_url(url)}: database {db!r} is not a number (redis://host:port/0)")


def still_loading(exc: BaseException) -> bool:
    """Redis answered LOADING: it is restarting with its data, so waiting helps."""
    return isinstance(exc, redis.BusyLoadingError)


async def while_loading(step: Callable[[], Awaitable[T]], health: Health, patience_s: float) -> T:
    """``step()``, run again while Redis answers LOADING (it is reading its data: waiting helps), for up to
    ``patience_s`` after the first refusal; then, or on any other error, the error is raised."""
    deadline: float | None = None
    while True:
        try:
            found = await step()
        except redis.BusyLoadingError as exc:
            health.lost(exc)
            deadline = deadline or time.monotonic() + patience_s
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
            continue
        health.ok()
        return found


async def until_answered(step: Callable[[], Awaitable[T]], health: Health, patience_s: float) -> T:
    """``step()`` of a starting worker, run again with backoff while Redis does not answer (a master failing over,
    a restart) for up to ``patience_s`` after the first failure, and while it answers LOADING for as long as it
    loads; then the error is raised. A refused login is raised at once: waiting cannot help."""
    deadline: float | None = None
    delay = 0.1
    while True:
        try:
            found = await step()
        except UNAVAILABLE as exc:
            if isinstance(exc, redis.AuthenticationError):
                raise
            health.lost(exc)
            now = time.monotonic()
            if deadline is None or still_loading(exc):
                deadline = now + patience_s
            elif now > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            continue
        health.ok()
        return found


def login_refused(exc: BaseException, url: str) -> str | None:
    """The one line when Redis refused the login (a wrong or missing password): waiting cannot help."""
    return cannot_connect(exc, url) if isinstance(exc, redis.AuthenticationError) else None


def cannot_connect(exc: BaseException, url: str | None) -> str | None:
    """The one line for an exception (or one in its cause chain) that means Redis cannot be used; else None."""
    seen: BaseException | None = exc
    where = safe_url(url) if url else "the configured URL"
    while seen is not None:
        if isinstance(seen, CannotConnect):
            return str(seen)
        if isinstance(seen, redis.AuthenticationError) or (
                isinstance(seen, redis.ResponseError) and str(seen).startswith(("NOAUTH", "WRONGPASS"))):
            if url and urlsplit(url).password is None and urlsplit(url).scheme != "unix":
                return f"Redis at {where} requires a password: put it in the URL (redis://:PASSWORD@host:port/db)"
            return f"Redis at {where} refused the login: {seen}"
        if isinstance(seen, redis.ConnectionError | redis.TimeoutError):
            return f"cannot connect to Redis at {where}: {seen}"
        if isinstance(seen, redis.exceptions.NoPermissionError):  # an ACL user without a command it needs
            return f"Redis at {where} refused a command to this user (grant it in the user's ACL): {seen}"
        seen = seen.__cause__ or seen.__context__
    return None


#: What redis-py raises; the producer path (client.py, results.py) catches it and raises ``broker_error`` instead.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError,)


def broker_error(what: str, exc: Exception, url: str | None) -> BrokerError:
    """The ringfence error for redis-py's ``exc`` raised while doing ``what`` (the caller keeps ``exc`` as the
    cause): CannotConnect (down, timed out, login refused), NotPermitted (ACL), else BrokerError."""
    said = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return NotPermitted(f"{what} refused: Redis at {safe_url(url or '?')} refused a command to this user "
                            f"(grant it in the user's ACL): {said}")
    line = cannot_connect(exc, url)
    if line is not None:
        return CannotConnect(f"{what}: {' '.join(line.split())}")
    if isinstance(exc, RESHARDING) and not isinstance(exc, redis.exceptions.ClusterDownError):
        return BrokerError(f"{what}: the Redis Cluster is moving this slot to another node (a reshard); retry once "
                           f"it moved: {type(exc).__name__}: {said}")
    return BrokerError(f"{what}: Redis answered {type(exc).__name__}: {said}")
