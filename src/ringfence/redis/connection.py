"""Where Redis clients are made: timeouts, health checks and retries set once, for the sync and async client.

redis-py's own defaults retry a failed command 10 times with backoff, so one call on a hung socket can take
about a minute, longer than any lease. Here a command is retried once on a fresh connection (a stale
pooled connection after a restart), never after a timeout (a script may have run), and a socket that stops
answering fails after ``socket_timeout_s``. Query parameters of the URL (``?socket_timeout=2``) win over these.

The URL also names a Redis Cluster (``redis+cluster://h1:p1,h2:p2/``) or a Sentinel set-up
(``redis+sentinel://h1:p1,h2:p2/service_name``); ``rediss+…`` for TLS. Anything else: pass ready-made client
factories (``RedisClients``).
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.asyncio.sentinel as aiosentinel
import redis.cluster
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.connection import parse_url
from redis.exceptions import AskError, ClusterDownError, ClusterError, MovedError, ReadOnlyError, TryAgainError
from redis.retry import Retry

from ringfence.errors import BadRedisUrl, NotPermitted, RedisFull

log = logging.getLogger("ringfence.redis")

#: Errors meaning "Redis did not answer" (refused, reset, timed out, loading, a cluster or Sentinel failover in
#: progress, READONLY from a master that became a replica, a slot being resharded: MOVED, ASK or TRYAGAIN left
#: after the cluster client's own redirections, ``ClusterError`` when they ran out): wait and try again.
UNAVAILABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, ClusterDownError,
                                            TryAgainError, ReadOnlyError, ClusterError, MovedError, AskError)
#: The cluster's answers while a slot moves between nodes (a reshard): the same queue works once it moved.
RESHARDING: tuple[type[Exception], ...] = (ClusterError, MovedError, AskError, TryAgainError)
#: Redis answered, with an error (a refused write, a script error).
REFUSED: tuple[type[Exception], ...] = (redis.ResponseError, RedisFull)

# Commands the asyncio clients made here sent again by themselves, in the current Task (a ContextVar: a call
# awaited in the Task counts in it, another Task's do not). A script whose reply was lost may have run before
# the answered resend (the worker's fetch: ``Fetcher.fetch``).
_resent: contextvars.ContextVar[int] = contextvars.ContextVar("ringfence_resent", default=0)


def resent() -> int:
    """How many commands the current Task's asyncio client calls sent again (after a connection error or a
    timeout); compare two reads around a call to learn whether its command may have run twice."""
    return _resent.get()


def note_resend() -> None:
    _resent.set(_resent.get() + 1)


class _CountedNoBackoff(NoBackoff):
    """No backoff; counts each resend (redis-py's ``Retry`` asks its backoff only before trying again)."""

    def compute(self, failures: int) -> float:
        note_resend()
        return 0


class _CountedRetryErrors(tuple):  # type: ignore[type-arg]
    """The cluster client's ``ERRORS_ALLOW_RETRY``, counting each resend: its ``execute_command`` asks
    ``type(e) in ERRORS_ALLOW_RETRY`` only when an attempt is left, right before sending the command again."""

    def __contains__(self, kind: object) -> bool:
        if tuple.__contains__(self, kind):
            note_resend()
            return True
        return False


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


@dataclass(frozen=True)
class RedisClients:
    """Ready-made client factories, for set-ups the URL forms do not cover; each is called once per process.

    Example::

        App(redis_clients=RedisClients(sync=lambda: RedisCluster(...), aio=lambda: aio.RedisCluster(...),
                                       cluster=True))

    ``cluster``: the clients talk to a Redis Cluster (namespace keys then share one hash tag, wake-ups use
    sharded pub/sub).
    """

    sync: Callable[[], redis.Redis]
    aio: Callable[[], aioredis.Redis]
    cluster: bool = False
    name: str = "custom Redis clients"  # in log lines, instead of a URL


SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel")
_FORMS = ("redis://host:port/db, rediss://… (TLS), unix:///path, redis+cluster://h1:p1,h2:p2/, "
          "redis+sentinel://h1:p1,h2:p2/service_name (rediss+… for TLS)")


@dataclass(frozen=True)
class Target:
    """What a URL names: ``kind`` single, cluster or sentinel; its nodes; the options of every connection."""

    kind: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    sentinel_options: tuple[tuple[str, Any], ...] = ()


def scheme_of(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise BadRedisUrl(f"bad Redis URL {redact(url)}: unknown scheme {scheme + sep or url!r}; use {_FORMS}")
    return scheme.lower()


def parse_target(url: str) -> Target:
    """Split a cluster or Sentinel URL into its nodes and the options every connection takes (auth, TLS and
    query parameters parsed as redis-py parses them for one host)."""
    scheme = scheme_of(url)
    if "+" not in scheme:
        return Target("single")
    base, _, kind = scheme.partition("+")
    parts = urlsplit(url)
    auth, _, hosts = parts.netloc.rpartition("@")
    default_port = 26379 if kind == "sentinel" else 6379
    nodes = tuple(_node(h, default_port, url) for h in hosts.split(",") if h)
    if not nodes:
        raise BadRedisUrl(f"bad Redis URL {redact(url)}: names no host")
    path = [p for p in parts.path.split("/") if p]
    service = path.pop(0) if kind == "sentinel" and path else ""
    if kind == "sentinel" and not service:
        raise BadRedisUrl(f"bad Redis URL {redact(url)}: name the Sentinel service, as in redis+sentinel://h1:p1/mymaster")
    one = f"{base}://{auth + '@' if auth else ''}{nodes[0][0]}/{'/'.join(path)}"
    try:
        options = parse_url(one + (f"?{parts.query}" if parts.query else ""))  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise BadRedisUrl(f"bad Redis URL {redact(url)}: {exc}") from None
    options.pop("host", None)
    options.pop("port", None)
    if options.pop("connection_class", None) is not None:
        options["ssl"] = True
    sentinel = {k.removeprefix("sentinel_"): options.pop(k) for k in list(options) if k.startswith("sentinel_")}
    if kind == "cluster" and options.pop("db", 0):
        raise BadRedisUrl(f"bad Redis URL {redact(url)}: Redis Cluster has database 0 only")
    return Target(kind, nodes, service, tuple(options.items()), tuple(sentinel.items()))


def _node(text: str, default_port: int, url: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(default_port))
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise BadRedisUrl(f"bad Redis URL {redact(url)}: bad port in {text!r}") from None


def _cluster_retry() -> Retry:
    # Once more after a failover or a reset connection (the client reloads the slot map in between).
    return Retry(ExponentialBackoff(cap=0.5, base=0.1), 1)


def sync_client(url: str, settings: ConnectionSettings) -> redis.Redis:
    t = parse_target(url)
    opts = {**settings._options(), **dict(t.options)}
    if t.kind == "cluster":
        nodes = [redis.cluster.ClusterNode(h, p) for h, p in t.nodes]  # type: ignore[no-untyped-call]
        return cast(redis.Redis, redis.cluster.RedisCluster(startup_nodes=nodes, retry=_cluster_retry(), **opts))
    retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    if t.kind == "sentinel":
        sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(t.nodes), sentinel_kwargs={**settings._options(), **dict(t.sentinel_options)})
        return cast(redis.Redis, sentinel.master_for(t.service, retry=retry, **opts))  # type: ignore[no-untyped-call]
    return redis.Redis.from_url(url, retry=retry, **settings._options())


#: The functions of redis-py's asyncio cluster client that close it after a failure they handle themselves
#: (CLUSTERDOWN, a pipeline's connection error; before redis-py 8 any connection error), to reload its slot map.
_OWN_RESETS = frozenset({"_execute_command", "execute"})


class _AsyncCluster(aiocluster.RedisCluster):
    """redis-py's asyncio cluster client, but a failure it handles itself closes no connection. Its ``aclose``
    closed every connection of every node and forgot the default node: with one master dead, each call to it from
    a pipeline (the wake marks) did so. The calls other coroutines had in flight on healthy masters lost their
    replies, the wake subscriptions of healthy masters reconnected (losing the jobs leased in the messages sent
    meanwhile), and until the slot map was reloaded the scripts of healthy queues went to a random node, the dead
    one too (the node gate then held back the healthy master itself). Now such a close only has the slot map
    reloaded before the next call, which is what it was for; ``aclose`` called from anywhere else closes. Its
    resends are counted (``resent``)."""

    ERRORS_ALLOW_RETRY = _CountedRetryErrors(aiocluster.RedisCluster.ERRORS_ALLOW_RETRY)

    async def aclose(self) -> None:
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if (caller is not None and caller.f_code.co_name in _OWN_RESETS
                and caller.f_globals.get("__name__") == aiocluster.__name__):
            self._initialize = True
            return
        await super().aclose()


def async_client(url: str, settings: ConnectionSettings) -> aioredis.Redis:
    t = parse_target(url)
    opts = {**settings._options(), **dict(t.options)}
    if t.kind == "cluster":
        nodes = [aiocluster.ClusterNode(h, p) for h, p in t.nodes]
        retry = AsyncRetry(ExponentialBackoff(cap=0.5, base=0.1), 1)
        return cast(aioredis.Redis, _AsyncCluster(startup_nodes=nodes, retry=retry, **opts))
    aretry = AsyncRetry(_CountedNoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    if t.kind == "sentinel":
        sentinel = aiosentinel.Sentinel(  # type: ignore[no-untyped-call]
            list(t.nodes), sentinel_kwargs={**settings._options(), **dict(t.sentinel_options)})
        return cast(aioredis.Redis, sentinel.master_for(t.service, retry=aretry, **opts))
    return aioredis.Redis.from_url(url, retry=aretry, **settings._options())


def url_clients(url: str, settings: ConnectionSettings) -> RedisClients:
    """The client factories a URL names (checked now: a malformed URL fails at once, in one line)."""
    target = parse_target(url)
    return RedisClients(sync=lambda: sync_client(url, settings), aio=lambda: async_client(url, settings),
                        cluster=target.kind == "cluster", name=redact(url))


def redact(url: str) -> str:
    """The URL without its password, for log lines."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return url
    auth, _, hosts = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{auth.partition(':')[0]}:***@{hosts}"))


class Health:
    """Whether Redis answers, as seen by one process. Logs one line when it stops answering and one when it
    answers again, however many components fail meanwhile (not a traceback per attempt)."""

    def __init__(self, url: str) -> None:
        self.url = redact(url)
        self.down_since: float | None = None
        self.failures = 0
        #: Called with the monotonic time Redis stopped answering, when it answers again (from any thread).
        self.on_recovered: list[Callable[[float], None]] = []

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
            since, self.down_since = self.down_since, None
            self.failures = 0
            for listener in self.on_recovered:
                listener(since)


def full_error(what: str, memory: dict[str, Any]) -> RedisFull:
    """The one line for a write refused at maxmemory, from ``INFO memory``."""
    limit = int(memory.get("maxmemory") or 0)
    policy = memory.get("maxmemory_policy", "?")
    return RedisFull(f"Redis is full (maxmemory {_mb(limit)} reached, policy {policy}): {what} refused; free memory "
                     "or raise maxmemory (running jobs still finish: leases, acks and retries work when full)")


def not_permitted(what: str, exc: Exception) -> NotPermitted:
    """The one line for a call the Redis user may not run (ACL); the scripts that add jobs say which command."""
    said = str(exc).strip()
    if not said.startswith(what):
        said = f"{what} refused: {said} (ACL); grant it, see docs/deployment.md"
    return NotPermitted(said)


def _mb(n: int) -> str:
    return f"{n / 1048576:.4g}mb" if n else "?"
