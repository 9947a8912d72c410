"""The live parts an App's declarations run on, built explicitly from them: the broker (Redis), the producer
(and its after-commit jobs), the SQL and Redis fence stores, the failed-jobs table and the notifier.

``App`` holds declarations only (tasks, policies, hooks, settings). ``app.runtime`` builds this object on
first use (a producer's first enqueue, a worker's start, a CLI command) and every part of it is typed; the
worker hands each of its components the one part it needs. What it may start, it says: with
``redis_url="embedded"`` it starts a private embedded Redis (logged; stopped by ``app.close()``), and in the
"default" environment without a ``fence_url`` the SQL fence store is SQLite ``./ringfence.db``, created on
the first fence a job opens (``fence_store_in_use()`` never creates it). Nothing connects to Redis before the
broker is first used. Tests replace parts with
``app.runtime = Runtime(app, broker=...)``.

``Declarations`` is what it reads of an App (runtime.py never imports app.py); ``Live`` is what jobs.py and
results.py read (an App or its Runtime).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Protocol

from ringfence.client import Client
from ringfence.errors import ConfigError
from ringfence.notify import AlertHook, Notifier, WebhookSender
from ringfence.oncommit import OnCommit
from ringfence.redis.broker import Broker
from ringfence.redis.connection import ConnectionSettings, RedisClients
from ringfence.settings import WorkerSettings
from ringfence.tasks import Registry

if TYPE_CHECKING:
    from ringfence.fence.failed import FailedJobs
    from ringfence.fence.store import FenceStore
    from ringfence.redis.embedded import EmbeddedRedis
    from ringfence.redis.fence import RedisFenceStore

log = logging.getLogger("ringfence")

EMBEDDED = "embedded"  # App(redis_url="embedded"): a private embedded Redis (demos)
DEFAULT_FENCE_URL = "sqlite:///ringfence.db"  # the fallback fence store, in the "default" environment only


class Declarations(Protocol):
    """What the runtime reads of an App."""

    namespace: str
    environment: str
    registry: Registry
    redis_settings: ConnectionSettings
    redis_clients: RedisClients | None
    fence_url: str | None
    worker_settings: WorkerSettings
    max_payload_bytes: int | None
    min_replicas: int
    replica_timeout_s: float
    partitions: dict[str, int]
    alert_hooks: list[AlertHook]
    alert_rules: Any

    @property
    def declared_redis_url(self) -> str | None: ...


class Runtime:
    def __init__(self, app: Declarations, *, broker: Broker | None = None,
                 redis_fence_store: RedisFenceStore | None = None) -> None:
        self.namespace = app.namespace
        self.environment = app.environment
        self.registry = app.registry
        self.redis_settings = app.redis_settings
        self.worker_settings = app.worker_settings
        self.max_payload_bytes = app.max_payload_bytes
        self.min_replicas = app.min_replicas
        self.replica_timeout_s = app.replica_timeout_s
        self.partitions = app.partitions  # the App's own dict: a queue declared after this is seen too
        self.fence_url = app.fence_url
        self.embedded: EmbeddedRedis | None = None
        self._declared_url, self._redis_clients = app.declared_redis_url, app.redis_clients
        self._broker = broker
        self.client = Client(self)  # needs no Redis until it enqueues (the outbox and on-commit checks never do)
        self.on_commit = OnCommit(self)  # jobs sent after a database commit, and the ones kept unsent
        rules = app.alert_rules
        webhook = (WebhookSender(rules.webhook_url, rules.webhook_attempts, rules.webhook_backoff_s,
                                 rules.webhook_timeout_s) if rules is not None and rules.webhook_url else None)
        self.notifier = Notifier(app.alert_hooks, webhook)
        self._fence_store: FenceStore | None = None
        self._redis_fence_store = redis_fence_store
        self._failed_jobs: FailedJobs | None = None
        self._stores_lock = threading.Lock()

    @property
    def broker(self) -> Broker:
        """The broker, connected on first use (with ``redis_url="embedded"``, the embedded Redis starts then)."""
        if self._broker is None:
            with self._stores_lock:
                if self._broker is None:
                    self._broker = Broker(self._redis_url(self._declared_url), self.namespace,
                                          connection=self.redis_settings, clients=self._redis_clients)
        return self._broker

    @property
    def redis_url(self) -> str:
        return self.broker.url

    def _redis_url(self, declared: str | None) -> str:
        if declared is None:
            raise ConfigError("no Redis URL: pass App(redis_url=...) or --app, or set RINGFENCE_REDIS_URL "
                              f"(App(redis_url={EMBEDDED!r}) starts a private embedded Redis, for demos)")
        if declared != EMBEDDED:
            return declared
        from ringfence.redis.embedded import EmbeddedRedis

        self.embedded = EmbeddedRedis.temporary()
        # Child processes (workers of a demo) share this server.
        os.environ["RINGFENCE_REDIS_URL"] = self.embedded.url
        log.warning("started an embedded Redis at %s (for demos only)", self.embedded.url)
        return self.embedded.url

    # -- fence stores ---------------------------------------------------------------------------
    @property
    def fence_store(self) -> FenceStore:
        """The SQL fence store (``fence_url``; without one, in the "default" environment only, SQLite
        ``./ringfence.db`` with its tables created)."""
        if self._fence_store is None:
            if not self.fence_url and self.environment != "default":
                raise ConfigError(f"environment {self.environment!r} needs an explicit fence database: "
                                  "App(fence_url=...) or RINGFENCE_FENCE_URL (the SQLite ./ringfence.db fallback is "
                                  "for the default environment only)")
            with self._stores_lock:  # the first jobs of a worker arrive together, from several threads
                if self._fence_store is None:
                    from ringfence.fence.store import FenceStore

                    store = FenceStore(self.fence_url or DEFAULT_FENCE_URL)
                    if store.engine.dialect.name == "sqlite":
                        store.create_all()  # the embedded default needs no migration step
                    self._fence_store = store  # published only once its tables exist
        return self._fence_store

    def fence_store_in_use(self) -> FenceStore | None:
        """The SQL fence store if there is one (configured, opened, or the default file exists), else None.
        Never creates ``./ringfence.db``."""
        if self._fence_store is None and not self.fence_url and (
                self.environment != "default" or not os.path.exists(DEFAULT_FENCE_URL.removeprefix("sqlite:///"))):
            return None  # outside the default environment there is no fallback store to look in
        return self.fence_store

    @property
    def redis_fence_store(self) -> RedisFenceStore:
        """Fences kept in Redis: for cheap effects where a lost key is acceptable, never for money."""
        if self._redis_fence_store is None:
            from ringfence.redis.fence import RedisFenceStore

            self._redis_fence_store = RedisFenceStore(self.broker.sync, prefix=self.namespace, url=self.broker.url)
        return self._redis_fence_store

    @property
    def failed_jobs(self) -> FailedJobs | None:
        """The durable dead-letter table, when a fence database is configured; else None."""
        if self._failed_jobs is None and self.fence_url:
            engine = self.fence_store.engine
            with self._stores_lock:
                if self._failed_jobs is None:
                    from ringfence.fence.failed import FailedJobs

                    failed = FailedJobs(engine, namespace=self.namespace)
                    if engine.dialect.name == "sqlite":
                        failed.create_all()
                    self._failed_jobs = failed
        return self._failed_jobs

    def prepare_fence_tables(self) -> None:
        """Create a configured SQLite fence database's tables now (a worker at start), not in its first jobs."""
        if self.fence_url and self.fence_url.startswith("sqlite"):
            _ = self.fence_store, self.failed_jobs

    async def alert(self, kind: str, message: str, details: dict[str, Any]) -> None:
        await self.notifier.alert(kind, message, details)

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
        self.notifier.close()
        if self.embedded is not None:
            self.embedded.stop()


class Live(Protocol):
    """What jobs.py and results.py need of a live namespace: an App or its Runtime."""

    @property
    def namespace(self) -> str: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def redis_settings(self) -> ConnectionSettings: ...
    @property
    def failed_jobs(self) -> FailedJobs | None: ...
    def fence_store_in_use(self) -> FenceStore | None: ...
