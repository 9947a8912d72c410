"""Task declarations: the registry of handlers and their options, and the per-job context handlers receive."""

from __future__ import annotations

import inspect
import math
import re
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, Protocol, TypedDict, Unpack

from pydantic import BaseModel

from ringfence.errors import ConfigError, PayloadError
from ringfence.fence_api import Fence, FenceWiring
from ringfence.models import Prepared
from ringfence.payloads import PayloadCodec, Upcaster
from ringfence.settings import TaskOptions

if TYPE_CHECKING:  # defaults (PEP 696): a bare ``Task`` stays ``Task[..., Any]``
    from typing_extensions import ParamSpec, TypeVar

    P = ParamSpec("P", default=...)
    R = TypeVar("R", default=Any)
else:
    from typing import ParamSpec, TypeVar

    P = ParamSpec("P")
    R = TypeVar("R")

RetryDelay = Callable[[int, BaseException], float]
Replace = Literal["payload", "delay", "both"]  # what a debounced enqueue replaces in the scheduled job


class Enqueuer(Protocol):
    """The producer a task enqueues through (``client.Client``)."""

    @property
    def namespace(self) -> str: ...
    def enqueue(self, task: Task, payload: Any, opts: EnqueueOptions) -> str: ...
    async def aenqueue(self, task: Task, payload: Any, opts: EnqueueOptions) -> str: ...
    def enqueue_in(self, task: Task, conn: Any, payload: Any, opts: EnqueueOptions) -> str: ...
    async def aenqueue_in(self, task: Task, conn: Any, payload: Any, opts: EnqueueOptions) -> str: ...
    def prepare(self, task: Task, payload: Any, opts: EnqueueOptions, now_ms: float | None = None) -> Prepared: ...
    def replicas(self, opts: EnqueueOptions) -> int: ...
    def partition(self, queue: str, key: str = "") -> str: ...


class Deferrer(Protocol):
    """Jobs sent after a database commit (``oncommit.OnCommit``)."""

    def defer(self, task: Task, target: Any, payload: Any, opts: EnqueueOptions, using: str | None = None) -> str: ...


class TaskOwner(Protocol):
    """What a Task needs of the App that declared it: its producers (so tasks.py never imports app.py)."""

    @property
    def client(self) -> Enqueuer: ...
    @property
    def on_commit(self) -> Deferrer: ...


class Task(Generic[P, R]):
    """A registered handler. ``task.enqueue(**payload)`` queues a job and returns its id. Generic over the
    handler's parameters after ``ctx`` (``P``) and its return type, so a type checker checks the payload.

    Example::

        @app.task(queue="critical", max_attempts=5)
        async def send_receipt(ctx, order_id: int) -> None: ...

        job_id = send_receipt.enqueue(order_id=42)
        later = send_receipt.with_options(delay_s=60).enqueue(order_id=42)
    """

    def __init__(self, app: TaskOwner, fn: Callable[Concatenate[JobContext, P], R], options: TaskOptions,
                 permanent: tuple[type[BaseException], ...] = (), retry_delay: RetryDelay | None = None,
                 version: int = 1, payload: type[BaseModel] | None = None,
                 example: dict[str, Any] | None = None, dependency: str | None = None,
                 concurrency: int | None = None, unique_for: float | None = None,
                 unique_key: str | Callable[[dict[str, Any]], str] | None = None, store_result: bool = False,
                 result_ttl_s: float | None = None, durable_settle: bool = False,
                 partition_key: str | Callable[[dict[str, Any]], str] | None = None,
                 concurrency_key: str | None = None, concurrency_limit: int | None = None) -> None:
        self.app = app
        self.fn = fn
        self.options = options
        self.permanent = permanent
        self.retry_delay = retry_delay
        self.is_async = inspect.iscoroutinefunction(fn)
        self.codec = PayloadCodec(options.name, fn, version, payload)
        self.example = example  # the contract sample of the current version (else built from the schema)
        self.dependency = dependency    # the circuit breaker this task's jobs go through
        self.concurrency = concurrency  # jobs of this task running at once across all workers
        self.unique_for = unique_for
        self.unique_key = unique_key
        self.partition_key = partition_key  # picks the partition of a partitioned queue (client.Client.route)
        self.store_result = store_result  # keep the handler's return value for app.result() (results.py)
        self.result_ttl_s = result_ttl_s  # how long it is kept (None: results.DEFAULT_TTL_S)
        self.durable_settle = durable_settle  # its ack, retry, dead-letter wait for a replica (worker/settle.py)
        # at most concurrency_limit jobs per key built from the payload run at once (redis/lua/_keyed.lua)
        self.concurrency_key, self.concurrency_limit = check_concurrency_key(
            options.name, payload_fields(fn, payload), concurrency_key, concurrency_limit)

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def version(self) -> int:
        return self.codec.version

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (tests)."""
        return self.fn(*args, **kwargs)

    def upcaster(self, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Declare how a payload of ``from_version`` becomes one of ``from_version + 1``::

            @charge.upcaster(1)
            def v1_to_v2(old: dict) -> dict:
                return {**old, "currency": "EUR"}
        """

        def register(fn: Upcaster) -> Upcaster:
            self.codec.add_upcaster(from_version, fn)
            return fn

        return register

    def s(self, *args: Any, **fields: Any) -> Signature:
        """This task with its payload, not enqueued: a step of ``ringfence.chain``, ``group`` or ``chord``."""
        return Signature(self, _payload(self, args, fields), NO_OPTIONS)

    def with_options(self, **options: Unpack[OptionFields]) -> BoundTask[P, R]:
        """Enqueue options: queue, delay_s, run_at (datetime), max_attempts, timeout_s, expiry_s, job_id,
        unique_for (s), unique_key (str template like "order:{order_id}" or callable(payload)), raise_on_duplicate,
        depends_on (job ids of the same queue: the job runs once they are all done), debounce_s, debounce_key,
        max_wait_s, replace (the last enqueue with a key wins: docs/scheduling.md), partition_key (as unique_key: the
        partition of a partitioned queue; jobs with one key keep their order)."""
        return BoundTask(self, enqueue_options(**options))

    def enqueue(self, *args: P.args, **fields: P.kwargs) -> str:
        """Queue one job; the payload is the handler's fields (keywords, or positional in its order), or an
        instance of the task's payload model."""
        return self.app.client.enqueue(self, _payload(self, args, fields) if args else fields, NO_OPTIONS)

    async def aenqueue(self, *args: P.args, **fields: P.kwargs) -> str:
        return await self.app.client.aenqueue(self, _payload(self, args, fields), NO_OPTIONS)

    def enqueue_in(self, conn: Any, *args: P.args, **fields: P.kwargs) -> str:
        """Write the job into the outbox table in ``conn``'s transaction (no commit, no Redis); the relay
        sends it once the transaction commits (docs/outbox.md). Returns the job's id."""
        return self.app.client.enqueue_in(self, conn, _payload(self, args, fields), EnqueueOptions())

    async def aenqueue_in(self, conn: Any, *args: P.args, **fields: P.kwargs) -> str:
        """:meth:`enqueue_in` through an AsyncConnection or AsyncSession."""
        return await self.app.client.aenqueue_in(self, conn, _payload(self, args, fields), EnqueueOptions())

    def enqueue_on_commit(self, target: Any = None, model: BaseModel | None = None, /, *, using: str | None = None,
                          **fields: Any) -> str:
        """Queue one job once ``target``'s outer transaction commits; nothing on rollback (docs/producer.md).
        ``target``: a SQLAlchemy Session, Connection, AsyncSession or AsyncConnection, or a Django connection;
        None: Django's ``transaction.on_commit`` on database ``using`` (default "default"). The payload is
        checked now (the errors of ``enqueue``); returns the job's id, fixed now::

            with Session(engine) as s, s.begin():
                s.add(order)
                send_receipt.enqueue_on_commit(s, order_id=order.id)
        """
        return self.app.on_commit.defer(self, target, _payload(self, _model(model), fields), EnqueueOptions(), using)


class OptionFields(TypedDict, total=False):
    """The enqueue options by name and type (``with_options(**options)``), as :class:`EnqueueOptions` has them."""

    queue: str | None
    delay_s: float | None
    run_at: datetime | None
    max_attempts: int | None
    timeout_s: float | None
    expiry_s: float | None
    job_id: str | None
    unique_for: float | None
    unique_key: str | Callable[[dict[str, Any]], str] | None
    raise_on_duplicate: bool
    durable: bool
    min_replicas: int | None
    depends_on: list[str] | tuple[str, ...] | None
    debounce_s: float | None
    debounce_key: str | Callable[[dict[str, Any]], str] | None
    max_wait_s: float | None
    replace: Replace
    partition_key: str | Callable[[dict[str, Any]], str] | None


@dataclass(frozen=True)
class EnqueueOptions:
    queue: str | None = None
    delay_s: float | None = None
    run_at: datetime | None = None
    max_attempts: int | None = None
    timeout_s: float | None = None
    expiry_s: float | None = None
    job_id: str | None = None
    unique_for: float | None = None
    unique_key: str | Callable[[dict[str, Any]], str] | None = None
    raise_on_duplicate: bool = False
    durable: bool = False            # wait for a replica (min_replicas, or the App's, at least 1): redis/replicas.py
    min_replicas: int | None = None  # replicas that must confirm the enqueue (0: do not wait)
    depends_on: list[str] | tuple[str, ...] | None = None  # job ids of its queue to wait for (docs/workflows.md)
    debounce_s: float | None = None  # run this long after the last enqueue with debounce_key (docs/scheduling.md)
    debounce_key: str | Callable[[dict[str, Any]], str] | None = None  # as unique_key; None: the task's name
    max_wait_s: float | None = None  # a debounced job starts at most this long after its first enqueue
    replace: Replace = "both"        # what a later enqueue with the key replaces: payload, delay or both
    partition_key: str | Callable[[dict[str, Any]], str] | None = None  # as unique_key: a partitioned queue's
    #                                                                      partition (client.Client.route)

    def __post_init__(self) -> None:
        _check_debounce(self)
        check_seconds("delay_s", self.delay_s, minimum=0.0)
        for name in ("timeout_s", "expiry_s", "unique_for"):
            check_seconds(name, getattr(self, name), minimum=None)
        if self.run_at is not None and not isinstance(self.run_at, datetime):
            raise ConfigError(f"enqueue option run_at={self.run_at!r} must be a datetime with a timezone")
        if self.max_attempts is not None and type(self.max_attempts) is not int:
            raise ConfigError(f"enqueue option max_attempts={self.max_attempts!r} must be an int")
        if self.min_replicas is not None and (type(self.min_replicas) is not int or self.min_replicas < 0):
            raise ConfigError(f"enqueue option min_replicas={self.min_replicas!r} must be an int >= 0")
        deps = self.depends_on
        if deps is not None and (not isinstance(deps, list | tuple) or not deps
                                 or not all(isinstance(d, str) and d for d in deps)):
            raise ConfigError(f"enqueue option depends_on={deps!r} must be a non-empty list of job ids")


def _check_debounce(opts: EnqueueOptions) -> None:
    check_seconds("debounce_s", opts.debounce_s, minimum=None)
    check_seconds("max_wait_s", opts.max_wait_s, minimum=None)
    if opts.replace not in ("payload", "delay", "both"):
        raise ConfigError(f"enqueue option replace={opts.replace!r} must be 'payload', 'delay' or 'both'")
    if opts.debounce_s is None and (opts.debounce_key is not None or opts.max_wait_s is not None
                                    or opts.replace != "both"):
        raise ConfigError("enqueue options debounce_key, max_wait_s and replace need debounce_s")


def check_seconds(name: str, value: Any, *, minimum: float | None) -> None:
    """A duration option: None (off), or a finite number of seconds >= minimum (None: > 0)."""
    if value is None:
        return
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or (value < minimum if minimum is not None else value <= 0):
        bound = f">= {minimum:g}" if minimum is not None else "> 0"
        raise ConfigError(f"option {name}={value!r} must be a finite number of seconds {bound} (or None)")


def check_result_options(store_result: Any, result_ttl_s: Any) -> None:
    if type(store_result) is not bool:
        raise ConfigError(f"store_result={store_result!r} must be True or False")
    check_seconds("result_ttl_s", result_ttl_s, minimum=None)
    if result_ttl_s is not None and not store_result:
        raise ConfigError(f"result_ttl_s={result_ttl_s!r} without store_result=True: nothing would be kept")


#: A job's concurrency key travels in its spec as a JSON string the fetch script reads without decoding.
KEY_MAX_CHARS = 200


def payload_fields(fn: Callable[..., Any], model: type[BaseModel] | None) -> set[str] | None:
    """The field names a task's payload has (None: any, the handler takes ``**fields``)."""
    if model is not None:
        return set(model.model_fields)
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not p.VAR_POSITIONAL}


def check_concurrency_key(task: str, known: set[str] | None, template: Any, limit: Any
                          ) -> tuple[str | None, int | None]:
    """A per-key limit declared on a task: a ``str.format`` template of payload fields and a limit >= 1, given
    together; each field the template names must be one the task's payload has."""
    if template is None and limit is None:
        return None, None
    if template is None or limit is None:
        raise ConfigError(f"task {task!r}: concurrency_key and concurrency_limit go together (got concurrency_key="
                          f"{template!r}, concurrency_limit={limit!r})")
    if type(limit) is not int or limit < 1:
        raise ConfigError(f"task {task!r}: concurrency_limit={limit!r} must be an int >= 1 (jobs per key at once)")
    if not isinstance(template, str) or not template:
        raise ConfigError(f"task {task!r}: concurrency_key={template!r} must be a non-empty template such as "
                          "'account:{account_id}'")
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigError(f"task {task!r}: concurrency_key {template!r} is not a valid template: {exc}") from exc
    for name in names:
        root = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not root or root.isdigit():
            raise ConfigError(f"task {task!r}: concurrency_key {template!r} must name payload fields, as "
                              f"{{account_id}}, not {{{name}}}")
        if known is not None and root not in known:
            raise ConfigError(f"task {task!r}: concurrency_key {template!r} names field {root!r}, which the payload "
                              f"does not have (fields: {', '.join(sorted(known)) or 'none'})")
    return template, limit


def concurrency_key(task: Task, args: dict[str, Any]) -> str:
    """The concurrency key of a job of ``task`` with payload ``args``; PayloadError names what is missing."""
    template = task.concurrency_key
    assert template is not None
    try:
        key = template.format(**args)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as exc:
        raise PayloadError(f"task {task.name!r}: concurrency_key {template!r} cannot be built from the payload "
                           f"({type(exc).__name__}: {exc})") from exc
    if len(key) > KEY_MAX_CHARS or any(c in key for c in '"\\') or not key.isprintable():
        raise PayloadError(f"task {task.name!r}: concurrency key {key[:60]!r} must be printable, at most "
                           f"{KEY_MAX_CHARS} characters, without quotes or backslashes")
    return key


NO_OPTIONS = EnqueueOptions()  # frozen: one instance for every plain enqueue (its checks cost ~5 µs a call)


def enqueue_options(**options: Any) -> EnqueueOptions:
    """EnqueueOptions, refusing an unknown option by name."""
    if not options:
        return NO_OPTIONS  # app.enqueue(...): the plain enqueue's path (client.py)
    known = set(EnqueueOptions.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"unknown enqueue option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return EnqueueOptions(**options)


@dataclass(frozen=True)
class BoundTask(Generic[P, R]):
    task: Task[P, R]
    options: EnqueueOptions

    def with_options(self, **options: Unpack[OptionFields]) -> BoundTask[P, R]:
        enqueue_options(**options)  # same checks as a first with_options
        return BoundTask(self.task, replace(self.options, **options))

    def s(self, *args: Any, **fields: Any) -> Signature:
        return Signature(self.task, _payload(self.task, args, fields), self.options)

    def enqueue(self, *args: P.args, **fields: P.kwargs) -> str:
        return self.task.app.client.enqueue(self.task, _payload(self.task, args, fields), self.options)

    async def aenqueue(self, *args: P.args, **fields: P.kwargs) -> str:
        return await self.task.app.client.aenqueue(self.task, _payload(self.task, args, fields), self.options)

    def enqueue_in(self, conn: Any, *args: P.args, **fields: P.kwargs) -> str:
        return self.task.app.client.enqueue_in(self.task, conn, _payload(self.task, args, fields), self.options)

    async def aenqueue_in(self, conn: Any, *args: P.args, **fields: P.kwargs) -> str:
        return await self.task.app.client.aenqueue_in(self.task, conn, _payload(self.task, args, fields),
                                                      self.options)

    def enqueue_on_commit(self, target: Any = None, model: BaseModel | None = None, /, *, using: str | None = None,
                          **fields: Any) -> str:
        return self.task.app.on_commit.defer(self.task, target, _payload(self.task, _model(model), fields),
                                             self.options, using)


@dataclass(frozen=True)
class Signature:
    """A task, its payload and its options, not enqueued: a workflow's step (workflows.py)."""

    task: Task
    payload: Any
    options: EnqueueOptions


def _model(model: BaseModel | None) -> tuple[Any, ...]:
    return () if model is None else (model,)


def _payload(task: Task, args: tuple[Any, ...], fields: dict[str, Any]) -> Any:
    """The payload of an enqueue call: keyword fields, one payload model instance, or values given by position,
    named after the handler's parameters."""
    if not args:
        return fields
    if len(args) == 1 and isinstance(args[0], BaseModel):
        if fields:
            raise PayloadError("pass a payload model instance or keyword fields, not both")
        return args[0]
    names = [p.name for p in list(inspect.signature(task.fn).parameters.values())[1:]
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(names):
        raise PayloadError(f"task {task.name!r} takes {len(names)} payload field(s) by position, "
                           f"got {len(args)}: {args!r}")
    named = dict(zip(names, args, strict=False))
    twice = sorted(set(named) & set(fields))
    if twice:
        raise PayloadError(f"task {task.name!r}: payload field {', '.join(twice)} given twice (by position and "
                           "by name)")
    return {**named, **fields}


_MAKING_FLAG = threading.Lock()  # two threads touching a fresh CancelFlag at once make one Event


class CancelFlag(threading.Event):
    """``ctx.cancelled``: a ``threading.Event`` whose own Event is made on the first ``set``, ``clear`` or
    ``wait``. A worker makes one per job and most are only read; an Event's ``Condition`` costs three caught
    ``AttributeError`` exceptions in its ``__init__``, a tenth of an ``async def`` no-op job's instructions
    (``DRAIN_CALLGRIND=1 python -m bench.drain_cpu --handler anoop``). Every public method of ``Event`` is
    overridden, so no attribute of the base class is read."""

    def __init__(self) -> None:  # no super().__init__(): the Event this delegates to is made on first use
        self._event: threading.Event | None = None

    def _made(self) -> threading.Event:
        event = self._event
        if event is None:
            with _MAKING_FLAG:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        return event

    def is_set(self) -> bool:
        event = self._event
        return event is not None and event.is_set()

    isSet = is_set  # Event's deprecated alias, overridden so no base attribute is read

    def set(self) -> None:
        self._made().set()

    def clear(self) -> None:
        event = self._event
        if event is not None:
            event.clear()

    def wait(self, timeout: float | None = None) -> bool:
        return self._made().wait(timeout)

    def __repr__(self) -> str:
        return f"<CancelFlag {'set' if self.is_set() else 'unset'}>"


@dataclass
class JobContext:
    """What a handler learns about its job. ``cancelled`` is set when the worker wants the job to stop
    (shutdown, timeout, or the lease was lost); long handlers should check it between steps."""

    id: str
    task: str
    queue: str
    attempt: int
    max_attempts: int
    enqueued_ms: float
    token: str
    timeout_s: float = 300.0
    cancelled: threading.Event = field(default_factory=CancelFlag)
    fencing: FenceWiring | None = None  # the worker's fence wiring (worker/fencing.py); None outside a worker
    fence_key: str | None = None  # the latest fence opened ("subject/step"), stamped on log lines
    settling: bool = False  # attempts used up by orphaned runs: only steps in doubt may be settled
    deadline: float | None = None  # time.monotonic() when the worker stops this attempt (its timeout)
    workflow: tuple[str, str, str] | None = None  # a workflow step's (workflow id, step name, business id or '')

    def fence(self, subject: str | None = None, step: str | None = None, **options: Any) -> Fence:
        """A fence on (business id, step) in the SQL store: ``with``/``async with ctx.fence(...) as step``.
        Options: params, provider_dedup, key_window_s, reconcile, retention_s (see docs/fences.md). In a workflow
        started with a business id, both default to that id and the step's name."""
        if self.fencing is None:
            raise ConfigError("this job context has no fence wiring (it was not created by a worker)")
        subject, step = self._fence_names(subject, step)
        self.fence_key = f"{subject}/{step}"
        return self.fencing.sql(self).open(subject, step, **options)

    def redis_fence(self, subject: str, step: str, **options: Any) -> Fence:
        """The same API with the fence kept in Redis (SET NX + TTL): for cheap effects only, never money."""
        if self.fencing is None:
            raise ConfigError("this job context has no fence wiring (it was not created by a worker)")
        self.fence_key = f"{subject}/{step}"
        return self.fencing.redis(self).open(subject, step, **options)

    def _fence_names(self, subject: str | None, step: str | None) -> tuple[str, str]:
        if subject is not None and step is not None:
            return subject, step
        if self.workflow is None or not self.workflow[2]:
            raise ConfigError(f"job {self.id}: ctx.fence() needs a subject and a step (they default only in a "
                              "workflow started with a business_id)")
        return subject or self.workflow[2], step or self.workflow[1]

    @property
    def enqueued_at(self) -> datetime:
        return datetime.fromtimestamp(self.enqueued_ms / 1000, UTC)

    @property
    def last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


class Registry:
    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.builtin: dict[str, Task] = {}  # ringfence's own (workflows.START_TASK): run by any worker, listed nowhere

    def add(self, task: Task) -> None:
        existing = self.tasks.get(task.name)
        if existing is not None and existing.fn is not task.fn:
            raise ConfigError(f"task name {task.name!r} is registered twice ({existing.fn!r} and {task.fn!r})")
        self.tasks[task.name] = task

    def get(self, name: str) -> Task | None:
        found = self.tasks.get(name)
        return found if found is not None else self.builtin.get(name)

    def queues(self) -> list[str]:
        return sorted({t.options.queue for t in self.tasks.values()})
