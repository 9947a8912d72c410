"""Task declarations: the registry of handlers and their options, and the per-job context handlers receive."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ringfence.errors import ConfigError, PayloadError
from ringfence.settings import TaskOptions

if TYPE_CHECKING:
    from ringfence.app import App

RetryDelay = Callable[[int, BaseException], float]


class Task:
    """A registered handler. ``task.enqueue(**payload)`` queues a job and returns its id.

    Example::

        @app.task(queue="critical", max_attempts=5)
        async def send_receipt(ctx, order_id: int) -> None: ...

        job_id = send_receipt.enqueue(order_id=42)
        later = send_receipt.with_options(delay_s=60).enqueue(order_id=42)
    """

    def __init__(self, app: App, fn: Callable[..., Any], options: TaskOptions,
                 permanent: tuple[type[BaseException], ...] = (), retry_delay: RetryDelay | None = None) -> None:
        self.app = app
        self.fn = fn
        self.options = options
        self.permanent = permanent
        self.retry_delay = retry_delay
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        if not params:
            raise ConfigError(f"task {options.name!r}: a handler takes the job context as its first argument")
        self._payload_params = {p.name: p for p in params[1:]}
        self._takes_any = any(p.kind is p.VAR_KEYWORD for p in params[1:])

    @property
    def name(self) -> str:
        return self.options.name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (tests)."""
        return self.fn(*args, **kwargs)

    def check_payload(self, payload: dict[str, Any]) -> None:
        """Refuse a payload that does not fit the handler, naming the field."""
        if not self._takes_any:
            unknown = sorted(set(payload) - set(self._payload_params))
            if unknown:
                raise PayloadError(
                    f"task {self.name!r}: unknown field(s) {', '.join(unknown)}; "
                    f"it takes {', '.join(self._payload_params) or 'no fields'}"
                )
        missing = [
            name for name, p in self._payload_params.items()
            if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in payload
        ]
        if missing:
            raise PayloadError(f"task {self.name!r}: missing required field(s) {', '.join(missing)}")

    def with_options(self, **options: Any) -> BoundTask:
        """Enqueue options: queue, delay_s, run_at (datetime), max_attempts, timeout_s, expiry_s, job_id."""
        return BoundTask(self, EnqueueOptions(**options))

    def enqueue(self, **payload: Any) -> str:
        return self.app.client.enqueue(self, payload, EnqueueOptions())

    async def aenqueue(self, **payload: Any) -> str:
        return await self.app.client.aenqueue(self, payload, EnqueueOptions())


@dataclass(frozen=True)
class EnqueueOptions:
    queue: str | None = None
    delay_s: float | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None
    expiry_s: float | None = None
    job_id: str | None = None


@dataclass(frozen=True)
class BoundTask:
    task: Task
    options: EnqueueOptions

    def with_options(self, **options: Any) -> BoundTask:
        return BoundTask(self.task, replace(self.options, **options))

    def enqueue(self, **payload: Any) -> str:
        return self.task.app.client.enqueue(self.task, payload, self.options)

    async def aenqueue(self, **payload: Any) -> str:
        return await self.task.app.client.aenqueue(self.task, payload, self.options)


@dataclass
class JobContext:
    """What a handler learns about its job. ``cancelled`` is set when the worker wants the job to stop
    (shutdown, timeout, or the lease was lost); long handlers should check it between steps."""

    id: str
    task: str
    queue: str
    attempt: int
    max_attempts: int
    enqueued_ms: int
    token: str
    timeout_s: float = 300.0
    cancelled: threading.Event = field(default_factory=threading.Event)
    fencing: Any = None  # the worker's fence wiring; None outside a worker

    def fence(self, subject: str, step: str, **options: Any) -> Any:
        """A fence on (business id, step) in the SQL store: ``with``/``async with ctx.fence(...) as step``.
        Options: params, provider_dedup, key_window_s, reconcile, retention_s (see docs/fences.md)."""
        if self.fencing is None:
            raise ConfigError("this job context has no fence wiring (it was not created by a worker)")
        return self.fencing.sql(self).open(subject, step, **options)

    def redis_fence(self, subject: str, step: str, **options: Any) -> Any:
        """The same API with the fence kept in Redis (SET NX + TTL): for cheap effects only, never money."""
        if self.fencing is None:
            raise ConfigError("this job context has no fence wiring (it was not created by a worker)")
        return self.fencing.redis(self).open(subject, step, **options)

    @property
    def enqueued_at(self) -> datetime:
        return datetime.fromtimestamp(self.enqueued_ms / 1000, UTC)

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


class Registry:
    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def add(self, task: Task) -> None:
        existing = self.tasks.get(task.name)
        if existing is not None and existing.fn is not task.fn:
            raise ConfigError(f"task name {task.name!r} is registered twice ({existing.fn!r} and {task.fn!r})")
        self.tasks[task.name] = task

    def get(self, name: str) -> Task | None:
        return self.tasks.get(name)

    def queues(self) -> list[str]:
        return sorted({t.options.queue for t in self.tasks.values()})
