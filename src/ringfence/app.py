"""The application object: declarations only (settings, tasks, policies, hooks) and the producer API over its
runtime (runtime.py), which is built from them on first use."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Concatenate, overload

from ringfence.client import Client
from ringfence.errors import ConfigError
from ringfence.models import DeadJob
from ringfence.notify import AlertHook
from ringfence.oncommit import OnCommit
from ringfence.redis.broker import Broker
from ringfence.redis.connection import ConnectionSettings, RedisClients
from ringfence.runtime import Runtime
from ringfence.scheduler import Periodic
from ringfence.settings import (
    BreakerPolicy,
    RetryPolicy,
    TaskOptions,
    WorkerSettings,
    check,
    check_name,
    env_default,
)
from ringfence.tasks import (
    JobContext,
    P,
    R,
    Registry,
    RetryDelay,
    Task,
    check_result_options,
    check_seconds,
    enqueue_options,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from ringfence.fence.failed import FailedJobs
    from ringfence.fence.provider import ProviderTable
    from ringfence.fence.store import FenceStore
    from ringfence.redis.fence import RedisFenceStore
    from ringfence.workflows import WorkflowView

log = logging.getLogger("ringfence")

DeadHook = Callable[[DeadJob], Any]
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024  # a job is a message, not a file: every reader and replica copies it
MAX_PARTITIONS = 1024  # a worker makes one fetch call per partition it finds empty before it sleeps
_DEFAULT: Any = object()  # "use the app default", distinct from None ("off")


class App:
    """A ringfence application.

    Example::

        app = App(redis_url="redis://127.0.0.1:6379/0", environment="production")

        @app.task(queue="critical")
        async def charge_order(ctx, order_id: int, amount: int) -> None: ...

    Without a ``redis_url`` and without ``RINGFENCE_REDIS_URL``, the first use of Redis raises ConfigError;
    ``redis_url="embedded"`` asks for a private embedded Redis, started on first use and stopped by
    ``close()`` (demos only). ``max_payload_bytes`` (default 1 MiB; None: no cap) refuses larger jobs at enqueue;
    ``max_result_bytes`` (the same default) larger stored results (the job goes to dead-letter, ``bad_result``).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        namespace: str | None = None,
        *,
        environment: str | None = None,
        worker: WorkerSettings | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float = 300.0,
        expiry_s: float | None = 86400.0,
        fence_url: str | None = None,
        retry_profiles: dict[str, RetryPolicy] | None = None,
        redis: ConnectionSettings | None = None,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        max_result_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        redis_clients: RedisClients | None = None,
        min_replicas: int = 0,
        replica_timeout_s: float = 1.0,
    ) -> None:
        self.redis_clients = redis_clients  # ready-made client factories: used instead of the URL
        if type(min_replicas) is not int or min_replicas < 0:
            raise ConfigError(f"min_replicas={min_replicas!r} must be an int >= 0")
        check_seconds("replica_timeout_s", replica_timeout_s, minimum=None)
        self.min_replicas = min_replicas  # replicas that confirm every enqueue (WAIT); 0: asynchronous replication
        self.replica_timeout_s = replica_timeout_s
        self._redis_url = redis_url or env_default("RINGFENCE_REDIS_URL")
        if redis_clients is not None and self._redis_url is None:
            self._redis_url = redis_clients.name
        self.namespace = check_name("namespace", namespace or env_default("RINGFENCE_NAMESPACE", "ringfence") or "")
        self.environment = check_name("environment", environment or env_default("RINGFENCE_ENV", "default") or "")
        self.worker_settings = worker or WorkerSettings()
        check(self.worker_settings.problems())
        w = self.worker_settings
        self.redis_settings = redis or ConnectionSettings.for_lease(w.lease_s, w.heartbeat_s)
        check(self.redis_settings.problems())
        self.default_retry = retry or RetryPolicy()
        check_seconds("timeout_s", timeout_s, minimum=None)
        check_seconds("expiry_s", expiry_s, minimum=None)
        self.default_timeout_s = timeout_s
        self.default_expiry_s = expiry_s
        self.fence_url = fence_url or env_default("RINGFENCE_FENCE_URL")
        if max_payload_bytes is not None and (type(max_payload_bytes) is not int or max_payload_bytes < 1):
            raise ConfigError(f"max_payload_bytes={max_payload_bytes!r} must be a positive int (bytes) or None")
        self.max_payload_bytes = max_payload_bytes
        if max_result_bytes is not None and (type(max_result_bytes) is not int or max_result_bytes < 1):
            raise ConfigError(f"max_result_bytes={max_result_bytes!r} must be a positive int (bytes) or None")
        self.max_result_bytes = max_result_bytes  # a stored result's record above it is refused (results.py)
        self.registry = Registry()
        from ringfence import workflows

        self.registry.builtin[workflows.START_TASK] = workflows.starter(self)
        self.retry_profiles: dict[str, RetryPolicy] = {}
        self.breakers: dict[str, BreakerPolicy] = {}
        self.queue_limits: dict[str, int] = {}
        self.partitions: dict[str, int] = {}  # queue -> its partitions (app.queue(name, partitions=N))
        self.periodics: list[Periodic] = []
        for name, policy in (retry_profiles or {}).items():
            self.retry_profile(name, policy)
        self.dead_hooks: list[DeadHook] = []
        self.alert_hooks: list[AlertHook] = []
        self.alert_rules: Any = None  # ringfence.alerts.AlertRules for workers' alert loop; None: the defaults
        self.reconcile_sources: dict[str, ProviderTable | Callable[[], Iterable[Any]]] = {}
        self._runtime: Runtime | None = None
        self._runtime_lock = threading.Lock()

    # -- the runtime (runtime.py): built from these declarations on first use -----------------
    @property
    def declared_redis_url(self) -> str | None:
        return self._redis_url

    @property
    def runtime(self) -> Runtime:
        """The live parts (broker, producer, fence stores, failed-jobs table, notifier), built on first use."""
        if self._runtime is None:
            with self._runtime_lock:  # a worker's first jobs may ask from several threads
                if self._runtime is None:
                    self._runtime = Runtime(self)
        return self._runtime

    @runtime.setter
    def runtime(self, runtime: Runtime) -> None:
        """Replace the runtime (tests: a broker on a simulated clock, ``Runtime(app, broker=...)``)."""
        self._runtime = runtime

    @property
    def built_runtime(self) -> Runtime | None:
        """The runtime if one was built or set, else None: reading it builds nothing (no connection)."""
        return self._runtime

    @built_runtime.setter
    def built_runtime(self, runtime: Runtime | None) -> None:
        """Put back what :attr:`built_runtime` returned (None: the next use builds a new runtime)."""
        self._runtime = runtime

    @property
    def redis_url(self) -> str:
        return self.runtime.redis_url

    @property
    def broker(self) -> Broker:
        return self.runtime.broker

    @property
    def client(self) -> Client:
        return self.runtime.client

    @property
    def on_commit(self) -> OnCommit:
        """Jobs sent after a database commit (oncommit.py), and the ones Redis did not take."""
        return self.runtime.on_commit

    @property
    def fence_store(self) -> FenceStore:
        """The SQL fence store (``fence_url``; without one, in the "default" environment only, SQLite
        ``./ringfence.db`` with its tables created)."""
        return self.runtime.fence_store

    def fence_store_in_use(self) -> FenceStore | None:
        """The SQL fence store if this app has one (configured, opened, or the default file exists), else None.
        Never creates ``./ringfence.db``."""
        return self.runtime.fence_store_in_use()

    @property
    def redis_fence_store(self) -> RedisFenceStore:
        """Fences kept in Redis: for cheap effects where a lost key is acceptable, never for money."""
        return self.runtime.redis_fence_store

    @property
    def failed_jobs(self) -> FailedJobs | None:
        """The durable dead-letter table, when a fence database is configured; else None."""
        return self.runtime.failed_jobs

    # -- declaration ----------------------------------------------------------------------------
    # Typed: the returned Task is generic over the handler's fields after ``ctx``; a payload model's task also
    # takes the model's fields as keywords, which the handler's signature does not show.
    @overload
    def task(self, fn: Callable[Concatenate[JobContext, P], R], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: None = None, /, *, payload: type[BaseModel],
             **options: Any) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[..., R]]: ...
    @overload
    def task(self, fn: None = None, /,
             **options: Any) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        """Register a handler: ``@app.task`` or ``@app.task(name=..., queue=..., max_attempts=..., timeout_s=...,
        expiry_s=..., retry=RetryPolicy(...), retry_delay=fn(attempt, exc), permanent=(ExcType, ...),
        version=N, payload=PydanticModel, example={...}, store_result=True, result_ttl_s=..., durable_settle=True,
        partition_key="order:{order_id}", concurrency_key="account:{account_id}", concurrency_limit=N)``."""
        if fn is not None:
            return self._register(fn, **options)
        return lambda f: self._register(f, **options)

    def _register(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int | None = None,
        timeout_s: float | None = None,
        expiry_s: float | None = _DEFAULT,
        retry: RetryPolicy | str | None = None,
        retry_delay: RetryDelay | None = None,
        permanent: Iterable[type[BaseException]] = (),
        version: int = 1,
        payload: Any = None,
        example: dict[str, Any] | None = None,
        dependency: str | None = None,
        concurrency: int | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        unique_for: float | None = None,
        unique_key: Any = None,
        partition_key: Any = None,
        store_result: bool = False,
        result_ttl_s: float | None = None,
        durable_settle: bool = False,
    ) -> Task:
        if isinstance(retry, str):
            if retry not in self.retry_profiles:
                raise ConfigError(f"retry profile {retry!r} is not declared; known: {sorted(self.retry_profiles)}")
            retry = self.retry_profiles[retry]
        if dependency is not None:
            check_name("dependency", dependency)
            self.breakers.setdefault(dependency, BreakerPolicy())
        check_seconds("unique_for", unique_for, minimum=None)
        check_result_options(store_result, result_ttl_s)
        if type(durable_settle) is not bool:
            raise ConfigError(f"durable_settle={durable_settle!r} must be True or False")
        check_seconds("timeout_s", timeout_s, minimum=None)
        if expiry_s is not _DEFAULT:
            check_seconds("expiry_s", expiry_s, minimum=None)
        if concurrency is not None and concurrency < 1:
            raise ConfigError(f"concurrency={concurrency} must be >= 1 (jobs of this task at once, all workers)")
        policy = retry or self.default_retry
        if max_attempts is not None:
            policy = RetryPolicy(max_attempts, policy.base_s, policy.cap_s, policy.jitter)
        options = TaskOptions(
            name=name or f"{fn.__module__}.{fn.__qualname__}",
            queue=queue,
            timeout_s=self.default_timeout_s if timeout_s is None else timeout_s,
            expiry_s=self.default_expiry_s if expiry_s is _DEFAULT else expiry_s,
            retry=policy,
        )
        check(options.problems(self.worker_settings))
        task = Task(self, fn, options, tuple(permanent), retry_delay, version=version, payload=payload,
                    example=example, dependency=dependency, concurrency=concurrency, unique_for=unique_for,
                    unique_key=unique_key, store_result=store_result, result_ttl_s=result_ttl_s,
                    durable_settle=durable_settle, partition_key=partition_key, concurrency_key=concurrency_key,
                    concurrency_limit=concurrency_limit)
        self.registry.add(task)
        return task

    def retry_profile(self, name: str, policy: RetryPolicy) -> RetryPolicy:
        """Declare a named retry policy tasks can use with ``retry="name"``."""
        check(policy.problems(f"retry profile {name!r}"))
        self.retry_profiles[check_name("retry profile", name)] = policy
        return policy

    def breaker(self, dependency: str, policy: BreakerPolicy | None = None, **options: Any) -> BreakerPolicy:
        """Configure the circuit breaker of a dependency (tasks join it with ``dependency="name"``)."""
        policy = policy or BreakerPolicy(**options)
        check(policy.problems(dependency))
        self.breakers[check_name("dependency", dependency)] = policy
        return policy

    def reconcile_source(self, step: str, source: ProviderTable | Callable[[], Iterable[Any]]) -> None:
        """The provider's records of fence step ``step``, which the dashboard's reconcile page compares with the
        fence rows: a ``ProviderTable`` (ringfence.fence.provider) or a function returning ``reconcile.Effect``s."""
        if not (callable(source) or hasattr(source, "problems")):
            raise ConfigError(f"reconcile_source({step!r}, ...): give a ProviderTable or a function, got {source!r}")
        if not callable(source):
            check(source.problems())
        self.reconcile_sources[step] = source

    def queue(self, name: str, *, partitions: int) -> None:
        """Declare queue ``name`` as ``partitions`` queues in as many Redis Cluster slots, spread over its masters
        (docs/deployment.md): enqueue puts a job in one partition (by the task's ``partition_key``, else its unique
        or debounce key, else in turn), a worker serving ``name`` fetches from all of them. Jobs with one key keep
        their order; the queue as a whole is not FIFO. Declare it the same way in producers and workers::

            app.queue("hot", partitions=6)
        """
        check_name("queue", name)
        if type(partitions) is not int or not 1 <= partitions <= MAX_PARTITIONS:
            raise ConfigError(f"queue({name!r}, partitions={partitions!r}): partitions must be an int from 1 to "
                              f"{MAX_PARTITIONS}")
        known = self.partitions.get(name)
        if known is not None and known != partitions:
            raise ConfigError(f"queue {name!r} is declared with partitions={known} and partitions={partitions}; "
                              "declare it once")
        if partitions > 1:
            self.partitions[name] = partitions

    def limit_queue(self, queue: str, concurrency: int) -> None:
        """At most ``concurrency`` jobs of ``queue`` run at once across all workers."""
        if concurrency < 1:
            raise ConfigError(f"limit_queue({queue!r}, {concurrency}): the limit must be >= 1")
        self.queue_limits[check_name("queue", queue)] = concurrency

    def periodic(self, cron: str, *, name: str | None = None, queue: str = "default",
                 catch_up: str = "last", payload: dict[str, Any] | None = None,
                 **task_options: Any) -> Callable[[Callable[..., Any]], Task]:
        """Register a handler and run it on a cron schedule (``ringfence scheduler`` or ``worker --scheduler``).

        ``catch_up`` after downtime: "none" (skip missed ticks), "last" (run the latest missed tick once) or
        "all" (run every missed tick, at most 1,000). Each tick is enqueued once however many schedulers run.
        """
        def register(fn: Callable[..., Any]) -> Task:
            Periodic.validate(name or fn.__qualname__, cron, catch_up)
            task = self._register(fn, name=name, queue=queue, **task_options)
            self.periodics.append(Periodic.create(task, cron, catch_up, payload or {}))
            return task

        return register

    def on_dead(self, hook: DeadHook) -> DeadHook:
        """Call ``hook(dead_job)`` in the worker after a job reaches dead-letter (usable as a decorator)."""
        self.dead_hooks.append(hook)
        return hook

    def on_alert(self, hook: AlertHook) -> AlertHook:
        """Call ``hook(kind, message, details)`` when a worker raises an alert (usable as a decorator)."""
        self.alert_hooks.append(hook)
        return hook

    async def alert(self, kind: str, message: str, details: dict[str, Any]) -> None:
        """Send an alert through the runtime's notifier (notify.py): the log, every hook, the webhook of
        ``alert_rules`` if set. A failing hook is logged, never raised."""
        await self.runtime.notifier.alert(kind, message, details)

    def check(self, worker: WorkerSettings | None = None) -> None:
        """Check every task against the worker settings; raise one ConfigError listing all violations."""
        settings = worker or self.worker_settings
        problems = list(settings.problems())
        for task in self.registry.tasks.values():
            problems += task.options.problems(settings)
        check(problems)

    # -- producing ------------------------------------------------------------------------------
    def enqueue(self, task: Task | str, /, **fields: Any) -> str:
        """Enqueue one job of a task of this app, given as the Task or its registered name."""
        return self.client.enqueue(self.resolve(task), fields, enqueue_options())

    def enqueue_many(self, task: Task | str, payloads: Iterable[Any], **options: Any) -> list[str]:
        """Enqueue many jobs of one task in one round trip per queue; returns their ids in order."""
        return self.client.enqueue_many(self.resolve(task), payloads, enqueue_options(**options))

    async def aenqueue_many(self, task: Task | str, payloads: Iterable[Any], **options: Any) -> list[str]:
        return await self.client.aenqueue_many(self.resolve(task), payloads, enqueue_options(**options))

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The return value of job ``job_id`` of a task with ``store_result=True``, waiting up to ``timeout``
        seconds (None: no limit). Raises JobFailed (dead-letter), ResultTimeout or UnknownJob (results.py)."""
        from ringfence import results

        return results.result(self, job_id, timeout)

    def workflow(self, workflow_id: str) -> WorkflowView | None:
        """A workflow's state and its steps' (workflows.py), or None: no such id, or it expired."""
        from ringfence import workflows

        return workflows.read(self, workflow_id)

    async def aresult(self, job_id: str, timeout: float | None = None) -> Any:
        from ringfence import results

        return await results.aresult(self, job_id, timeout)

    def resolve(self, task: Task | str) -> Task:
        """The registered Task named by ``task``; an unknown name (or another app's task) is refused."""
        name = task if isinstance(task, str) else getattr(task, "name", None)
        found = self.registry.get(name) if isinstance(name, str) else None
        if found is None or (not isinstance(task, str) and found is not task):
            known = ", ".join(sorted(self.registry.tasks)) or "none"
            raise ConfigError(f"task {name or task!r} is not registered in this app; known: {known}")
        return found

    def close(self) -> None:
        """Close the runtime's connections (and stop its embedded Redis), if it was built."""
        if self._runtime is not None:
            self._runtime.close()


def load_app(path: str) -> App:
    """Import ``module:attr`` and return the App it names."""
    import importlib
    import sys

    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app {path!r} must look like 'package.module:app'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {path!r}: cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"--app {path!r}: {attr!r} in {module_name!r} is not a ringfence App")
    return app
