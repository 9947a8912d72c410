"""Where Redis clients are made: timeouts, health checks and retries set once, for the sync and async client.

redis-py's own defaults retry a failed command 10 times with backoff, so one call on a hung socket can take
about a minute, longer than any lease. Here a command is retried once on a fresh connection (a stale
pooled connection after a restart), never after a timeout (a script may have run), and a socket that stops
answering fails after ``socket_timeout_s``. Query parameters of the URL (``?socket_timeout=2``) win over these.
Sentinel or Cluster clients (issue 11) would be made here too.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ringfence.errors import RedisFull

log = logging.getLogger("ringfence.redis")

#: Errors meaning "Redis did not answer" (refused, reset, timed out, loading): wait and try again.
UNAVAILABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
#: Redis answered, with an error (a refused write, a script error).
REFUSED: tuple[type[Exception], ...] = (redis.ResponseError, RedisFull)


@dataclass(frozen=True)
class ConnectionSettings:
    """Timeouts of the Redis clients, in seconds.

    Example::

        App(redis_url, redis=ConnectionSettings(socket_timeout_s=2.0))
    """

    connect_timeout_s: float = 5.0
    socket_timeout_s: float = 5.0     # a command that gets no answer within this fails (half-open socket)
    health_check_interval_s: float = 10.0  # PING a connection idle for longer before using it again
    first_connect_s: float = 30.0     # a starting worker waits this long for Redis (backoff), then exits

    @classmethod
    def for_lease(cls, lease_s: float, heartbeat_s: float) -> ConnectionSettings:
        """Defaults that let a hung heartbeat fail, and the next one renew, before the lease ends."""
        timeout = min(5.0, max(1.0, (lease_s - 2 * heartbeat_s) / 2))
        return cls(connect_timeout_s=timeout, socket_timeout_s=timeout)

    def problems(self) -> list[str]:
        values = (self.connect_timeout_s, self.socket_timeout_s, self.health_check_interval_s, self.first_connect_s)
        if min(values) <= 0:
            return [f"ConnectionSettings: every value must be > 0 seconds, got {self}"]
        return []

    def _options(self) -> dict[str, Any]:
        return {"socket_timeout": self.socket_timeout_s, "socket_connect_timeout": self.connect_timeout_s,
                "health_check_interval": self.health_check_interval_s}


def sync_client(url: str, settings: ConnectionSettings) -> redis.Redis:
    retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return redis.Redis.from_url(url, retry=retry, **settings._options())


def async_client(url: str, settings: ConnectionSettings) -> aioredis.Redis:
    retry = AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return aioredis.Redis.from_url(url, retry=retry, **settings._options())


def redact(url: str) -> str:
    """The URL without its password, for log lines."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class Health:
    """Whether Redis answers, as seen by one process. Logs one line when it stops answering and one when it
    answers again, however many components fail meanwhile (not a traceback per attempt)."""

    def __init__(self, url: str) -> None:
        self.url = redact(url)
        self.down_since: float | None = None
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def lost(self, exc: BaseException) -> None:
        self.failures += 1
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("Redis at %s is unreachable (%s: %s); retrying quietly until it answers", self.url,
                        type(exc).__name__, exc)

    def ok(self) -> None:
        if self.down_since is not None:
            log.warning("Redis at %s answers again after %.1fs (%d failed call(s) meanwhile)", self.url,
                        time.monotonic() - self.down_since, self.failures)
            self.down_since = None
            self.failures = 0


def full_error(what: str, memory: dict[str, Any]) -> RedisFull:
    """The one line for a write refused at maxmemory, from ``INFO memory``."""
    limit = int(memory.get("maxmemory") or 0)
    policy = memory.get("maxmemory_policy", "?")
    return RedisFull(f"Redis is full (maxmemory {_mb(limit)} reached, policy {policy}): {what} refused; free memory "
                     "or raise maxmemory (running jobs still finish: leases, acks and retries work when full)")


def _mb(n: int) -> str:
    return f"{n / 1048576:.4g}mb" if n else "?"
