"""The producer side: turns (task, payload, options) into stored jobs, one round trip per call."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import random
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, ClassVar, NoReturn, Protocol

import orjson

from ringfence.errors import BrokerError, ConfigError, DuplicateJob, PartlyEnqueued, PayloadError, RingfenceError
from ringfence.models import JobSpec, Prepared, new_job_id
from ringfence.outbox import write as outbox_write
from ringfence.redis import workflows as stored
from ringfence.redis.broker import Broker
from ringfence.redis.connect import REDIS_ERRORS, broker_error
from ringfence.redis.keys import INLINE_MAX_BYTES, logical_queue, partition_name
from ringfence.redis.ready import ReadyEnqueue
from ringfence.redis.replicas import arun_replicated, run_replicated
from ringfence.settings import MAX_ATTEMPTS_LIMIT, WorkerSettings, check_name
from ringfence.tasks import NO_OPTIONS, EnqueueOptions, Task, concurrency_key

#: An ``enqueue_many`` call sends at most this many jobs, and about this many bytes, per script call: Redis runs
#: one script at a time, so other clients wait for one bounded call, not the whole batch, and this client packs
#: one call's command at a time.
CHUNK_JOBS = 1000
CHUNK_BYTES = 1 << 20


_CALL_ERRORS: tuple[type[Exception], ...] = (RingfenceError, *REDIS_ERRORS)  # what a failed call raises


def _chunks(idx: list[int], prepared: list[Prepared]) -> Iterator[list[int]]:
    part: list[int] = []
    size = 0
    for i in idx:
        part.append(i)
        size += len(prepared[i].spec)
        if len(part) >= CHUNK_JOBS or size >= CHUNK_BYTES:
            yield part
            part, size = [], 0
    if part:
        yield part


def _key(task: Task, args: dict[str, Any], option: str, how: str | Callable[[dict[str, Any]], str]) -> str:
    """A unique or debounce key from the payload: ``how`` is a template of its fields or a callable."""
    if callable(how):
        return str(how(args))
    try:
        return how.format(**args)
    except KeyError as exc:
        raise ConfigError(f"task {task.name!r}: {option} {how!r} names field {exc} "
                          "that the payload does not have") from exc


class Tracing:
    """Set by an instrumentation (contrib/otel): ``fields()`` gives the spec fields carrying the caller's trace
    context. None: specs stay as they are and plain enqueues keep their fast path."""

    fields: ClassVar[Callable[[], dict[str, str]] | None] = None


class ProducerConfig(Protocol):
    """What the producer reads of its App (client.py never imports app.py)."""

    @property
    def broker(self) -> Broker: ...
    @property
    def worker_settings(self) -> WorkerSettings: ...
    @property
    def max_payload_bytes(self) -> int | None: ...
    @property
    def min_replicas(self) -> int: ...
    @property
    def replica_timeout_s(self) -> float: ...
    @property
    def namespace(self) -> str: ...
    @property
    def partitions(self) -> dict[str, int]: ...


class Client:
    def __init__(self, app: ProducerConfig) -> None:
        self.app = app
        self._known_queues: set[str] = set()
        # per task: its plain enqueues' packed-ahead call (a partitioned queue's: one per partition)
        self._ready: dict[Task, ReadyEnqueue | dict[str, ReadyEnqueue] | None] = {}
        # jobs with no key go to the partitions in turn, from a random one: many short-lived producers would
        # otherwise all start on the first
        self._turn = itertools.count(random.randrange(1 << 30))

    def prepare(self, task: Task, payload: Any, opts: EnqueueOptions, now_ms: float | None = None) -> Prepared:
        """Validate and encode one job. ``payload`` is a dict of fields or the task's payload model.
        ``now_ms``: the time to enqueue at, instead of Redis's clock (the outbox writes without Redis)."""
        if opts.depends_on is not None or opts.debounce_s is not None:  # enqueue() takes them; a batch, the outbox,
            # on_commit do not
            which = "depends_on" if opts.depends_on is not None else "debounce_s"
            raise ConfigError(f"task {task.name!r}: {which} is taken by enqueue() and aenqueue() only")
        args = task.codec.encode(payload)
        queue = self.check_options(task, opts)
        now = self.app.broker.clock() if now_ms is None else int(now_ms)
        at = 0
        if opts.delay_s is not None:
            at = now + math.ceil(opts.delay_s * 1000)
        elif opts.run_at is not None:
            at = int(opts.run_at.timestamp() * 1000)
        expiry_s = opts.expiry_s
        spec = JobSpec(
            task=task.name,
            args=args,
            enqueued_ms=self.app.broker.precise_ms() if now_ms is None else round(now_ms, 3),
            version=task.version,
            max_attempts=opts.max_attempts,
            timeout_ms=None if opts.timeout_s is None else int(opts.timeout_s * 1000),
            expires_ms=None if expiry_s is None else max(now, at) + int(expiry_s * 1000),
        )
        if Tracing.fields is not None:
            spec.extra.update(Tracing.fields())
        if task.concurrency_key is not None:  # read by the fetch script (redis/lua/_keyed.lua)
            spec.extra.update(ck=concurrency_key(task, args), cl=task.concurrency_limit)
        job_id = check_name("job id", opts.job_id) if opts.job_id else new_job_id()
        ukey, until = self._unique(task, args, opts, max(now, at))
        queue = self.route(task, queue, args, opts, ukey)
        encoded = spec.encode()
        self._check_size(task, encoded)
        # orjson's bytes keep their 4 KiB buffer; a copy holds only the spec (enqueue_many keeps 100,000s of them)
        return Prepared(queue, job_id, bytes(memoryview(encoded)), at, ukey, until)

    def check_options(self, task: Task, opts: EnqueueOptions) -> str:
        """The checks of ``prepare`` that need no clock (and so no Redis); returns the queue."""
        queue = opts.queue or task.options.queue
        if queue not in self._known_queues:  # a known queue's name was checked when it was registered
            check_name("queue", logical_queue(queue))  # a partition's name is its queue's and '~<i>of<N>'
        if opts.run_at is not None and opts.delay_s is not None:
            raise ConfigError("give delay_s or run_at, not both")
        if opts.run_at is not None and opts.run_at.tzinfo is None:
            raise ConfigError(f"run_at={opts.run_at.isoformat()} has no timezone; pass an aware datetime")
        if opts.max_attempts is not None and not 1 <= opts.max_attempts <= MAX_ATTEMPTS_LIMIT:
            raise ConfigError(f"max_attempts={opts.max_attempts} must be between 1 and {MAX_ATTEMPTS_LIMIT}")
        if opts.timeout_s is not None and not 0 < opts.timeout_s < self.app.worker_settings.max_lease_s:
            raise ConfigError(
                f"timeout_s={opts.timeout_s} must be > 0 and below max_lease_s={self.app.worker_settings.max_lease_s}"
            )
        return queue

    def route(self, task: Task, queue: str, args: dict[str, Any], opts: EnqueueOptions, key: str = "") -> str:
        """The partition a job of a partitioned queue goes to (app.queue(name, partitions=N)): the one its
        ``partition_key`` hashes to; else its concurrency key's, whose limit is kept in its partition's slot
        (lua/_keyed.lua); else the one ``key`` (its unique or debounce key) hashes to, so that key is held in one
        place; else the next in turn. A plain queue is itself."""
        if queue not in self.app.partitions:
            return queue
        how = opts.partition_key if opts.partition_key is not None else task.partition_key
        if how is not None:
            key = _key(task, args, "partition_key", how)
        elif task.concurrency_key is not None:
            key = concurrency_key(task, args)
        return self.partition(queue, key)

    def partition(self, queue: str, key: str = "") -> str:
        """The partition of ``queue`` that ``key`` hashes to ("": the next in turn); a plain queue is itself."""
        n = self.app.partitions.get(queue)
        if n is None:
            return queue
        index = zlib.crc32(key.encode()) % n if key else next(self._turn) % n
        return partition_name(queue, index, n)

    def check(self, task: Task, payload: Any, opts: EnqueueOptions) -> dict[str, Any]:
        """Every check of an enqueue, without Redis: the encoded payload, or the error ``enqueue`` would raise."""
        args = task.codec.encode(payload)
        self.check_options(task, opts)
        if opts.debounce_s is not None:  # on_commit sends with an id fixed now, which debounce cannot keep
            raise ConfigError(f"task {task.name!r}: debounce_s is taken by enqueue() and aenqueue() only")
        if opts.job_id is not None:
            check_name("job id", opts.job_id)
        self._unique(task, args, opts, 0)
        if task.concurrency_key is not None:
            concurrency_key(task, args)
        spec = JobSpec(task=task.name, args=args, enqueued_ms=0.0, version=task.version,
                       max_attempts=opts.max_attempts, timeout_ms=None if opts.timeout_s is None else 0,
                       expires_ms=None if opts.expiry_s is None else 0)
        self._check_size(task, spec.encode())
        return args

    def _check_size(self, task: Task, encoded: bytes) -> None:
        cap = self.app.max_payload_bytes
        if cap is not None and len(encoded) > cap:
            raise PayloadError(f"task {task.name!r}: the job is {len(encoded):,} bytes, above max_payload_bytes="
                               f"{cap:,}; store large data elsewhere and pass its id (or raise "
                               "App(max_payload_bytes=...))")

    @staticmethod
    def _unique(task: Task, args: dict[str, Any], opts: EnqueueOptions, start_ms: int) -> tuple[str, int]:
        hold_s = opts.unique_for if opts.unique_for is not None else task.unique_for
        if hold_s is None:
            return "", 0
        if hold_s <= 0:
            raise ConfigError(f"task {task.name!r}: unique_for={hold_s} must be > 0 seconds")
        how = opts.unique_key if opts.unique_key is not None else task.unique_key
        if how is None:
            key = f"{task.name}:" + hashlib.sha1(orjson.dumps(args, option=orjson.OPT_SORT_KEYS)).hexdigest()
        else:
            key = _key(task, args, "unique_key", how)
        return key, start_ms + int(hold_s * 1000)

    @staticmethod
    def _inline(task: Task, opts: EnqueueOptions) -> bool:
        """May the jobs go inline in the pending list (keys.py)? Only with ids generated here, so that only a
        retry of this very call can repeat one, and with no result to wait on (waiters look jobs up by id)."""
        return opts.job_id is None and not task.store_result

    def _calls(self, prepared: list[Prepared], inline: bool) -> Iterator[tuple[list[int], Any]]:
        """Script calls of at most ``CHUNK_JOBS`` jobs and about ``CHUNK_BYTES`` each, one queue each, with the
        positions of their jobs in ``prepared``; made one at a time, so only one call's arguments exist at once."""
        by_queue: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(prepared):
            by_queue[p.queue].append(i)
        for q, idx in by_queue.items():
            for part in _chunks(idx, prepared):
                yield part, self.app.broker.enqueue(q, [prepared[i][1:] for i in part], inline)

    @staticmethod
    def _partly(prepared: list[Prepared], done: list[tuple[list[int], list[bool | str]]],
                exc: Exception) -> PartlyEnqueued:
        """The error of an ``enqueue_many`` whose call ``exc`` failed after earlier calls went, with the ids they
        queued (a unique key's holder for a job it did not add, as ``enqueue_many`` returns without
        raise_on_duplicate)."""
        ids = Client._ids(prepared, done, NO_OPTIONS)
        went = sorted(i for idx, _ in done for i in idx)
        return PartlyEnqueued(f"enqueue_many: {len(went):,} of {len(prepared):,} jobs were queued, then "
                              f"{type(exc).__name__}: {str(exc).strip()}; the others were not (.ids lists the queued "
                              "ones, .positions their places in the payloads)", [ids[i] for i in went], went)

    @staticmethod
    def _ids(prepared: list[Prepared], results: list[tuple[list[int], list[bool | str]]],
             opts: EnqueueOptions) -> list[str]:
        ids = [p.id for p in prepared]
        for idx, outcome in results:
            for i, got in zip(idx, outcome, strict=True):
                ids[i] = Client._id(prepared[i], got, opts)
        return ids

    @staticmethod
    def _id(prepared: Prepared, got: bool | str, opts: EnqueueOptions) -> str:
        """The id an enqueue returns for one job, from the script's answer for it."""
        if isinstance(got, str):  # a unique key held by a queued or running job
            if opts.raise_on_duplicate:
                raise DuplicateJob(f"unique key {prepared.unique_key!r} is held by job {got}", got)
            return got
        if not got and opts.raise_on_duplicate:  # the id holds another job (not a retry of ours)
            raise DuplicateJob(f"job id {prepared.id!r} exists already with another payload or time", prepared.id)
        return prepared.id

    def _new_queues(self, prepared: list[Prepared]) -> list[str]:
        """Queues not registered yet by this client (marked known by the caller once registered)."""
        return sorted({p.queue for p in prepared} - self._known_queues)

    def replicas(self, opts: EnqueueOptions) -> int:
        """Replicas that must confirm this enqueue (the option, else the App's; ``durable``: at least 1)."""
        wanted = opts.min_replicas if opts.min_replicas is not None else self.app.min_replicas
        return max(wanted, 1) if opts.durable else wanted

    def _run(self, call: Any, opts: EnqueueOptions) -> Any:
        n = self.replicas(opts)
        if n:
            return run_replicated(self.app.broker, call, n, int(self.app.replica_timeout_s * 1000))
        return self.app.broker.run(call)

    async def _arun(self, call: Any, opts: EnqueueOptions) -> Any:
        n = self.replicas(opts)
        if n:
            return await arun_replicated(self.app.broker, call, n, int(self.app.replica_timeout_s * 1000))
        return await self.app.broker.arun(call)

    @property
    def namespace(self) -> str:
        return self.app.namespace

    def _broker_error(self, exc: Exception) -> BrokerError:
        return broker_error("enqueue", exc, self.app.broker.url)

    def enqueue(self, task: Task, payload: Any, opts: EnqueueOptions) -> str:
        try:
            if (opts is NO_OPTIONS and not self.app.min_replicas and task.unique_for is None
                    and not task.store_result and Tracing.fields is None):
                try:
                    ready = self._ready[task]
                except KeyError:
                    ready = self._ready[task] = self._ready_for(task)
                if ready is not None:
                    return self._enqueue_ready(task, payload, ready)
            if opts.depends_on is not None:
                return self._enqueue_after(task, payload, opts)
            if opts.debounce_s is not None:
                return self._enqueue_debounced(task, payload, opts)
            prepared = self.prepare(task, payload, opts)  # enqueue_many for one job, minus its grouping by queue
            queue = prepared[0]
            if queue not in self._known_queues:
                self.app.broker.register_queues([queue])
                self._known_queues.add(queue)
            got = self._run(self.app.broker.enqueue(queue, [prepared[1:]], self._inline(task, opts)), opts)
        except REDIS_ERRORS as exc:  # redis-py's own: raised as ringfence's, the original kept as the cause
            raise self._broker_error(exc) from exc
        return self._id(prepared, got[0], opts)

    def _enqueue_after(self, task: Task, payload: Any, opts: EnqueueOptions) -> str:
        """One job that runs once its dependencies are done (lua/depend.lua); no batched path."""
        deps = list(dict.fromkeys(opts.depends_on or ()))
        for dep in deps:
            check_name("depends_on job id", dep)
        if opts.delay_s is not None or opts.run_at is not None or opts.unique_for or task.unique_for is not None:
            raise ConfigError(f"task {task.name!r}: depends_on takes no delay_s, run_at or unique_for")
        queue, job_id, spec, *_ = self.prepare(task, payload, replace(opts, depends_on=None))
        if job_id in deps:
            raise ConfigError(f"depends_on: job {job_id} cannot wait for itself")
        broker = self.app.broker
        if queue not in self._known_queues:
            broker.register_queues([queue])
            self._known_queues.add(queue)
        stored.check_deps(broker, queue, deps)
        got = broker.run(stored.depend(broker, queue, job_id, spec, deps))
        if got[0] == "exists" and opts.raise_on_duplicate:  # as a plain enqueue: an id enqueued twice is one job
            raise DuplicateJob(f"job id {job_id!r} exists already with another payload or time", job_id)
        return job_id

    def _enqueue_debounced(self, task: Task, payload: Any, opts: EnqueueOptions) -> str:
        """One job that runs ``debounce_s`` after the last enqueue with its key; while it is scheduled, a later one
        replaces its payload and/or run-at and returns its id (lua/debounce.lua)."""
        if (opts.delay_s is not None or opts.run_at is not None or opts.job_id is not None
                or opts.unique_for is not None or task.unique_for is not None):
            raise ConfigError(f"task {task.name!r}: debounce_s takes no delay_s, run_at, job_id or unique_for "
                              "(the debounce key decides which job a call replaces)")
        how = opts.debounce_key
        key = task.name if how is None else f"{task.name}:{_key(task, task.codec.encode(payload), 'debounce_key', how)}"
        plain = replace(opts, delay_s=opts.debounce_s, debounce_s=None, debounce_key=None, max_wait_s=None,
                        replace="both")
        queue, job_id, spec, at, *_ = self.prepare(task, payload, plain)
        if opts.partition_key is None and task.partition_key is None and task.concurrency_key is None:
            # one debounce key, one partition: one job to replace
            queue = self.partition(self.check_options(task, plain), key)
        broker = self.app.broker
        if queue not in self._known_queues:
            broker.register_queues([queue])
            self._known_queues.add(queue)
        max_wait_ms = 0 if opts.max_wait_s is None else math.ceil(opts.max_wait_s * 1000)
        got: tuple[str, bool] = self._run(broker.debounce(queue, (job_id, spec, at), key, max_wait_ms, opts.replace),
                                          opts)
        return got[0]

    def _ready_for(self, task: Task) -> ReadyEnqueue | dict[str, ReadyEnqueue] | None:
        """The packed-ahead call for ``task``'s plain enqueues (no options), when they all go inline: no unique
        key, no stored result (``_inline``), and a plain client (redis/ready.py). For a partitioned queue, one per
        partition, by name."""
        if task.unique_for is not None or task.concurrency_key is not None or not self._inline(task, NO_OPTIONS):
            return None
        queue = self.check_options(task, NO_OPTIONS)
        n = self.app.partitions.get(queue)
        names = [partition_name(queue, i, n) for i in range(n)] if n else [queue]
        calls = {name: self.app.broker.ready_enqueue(name) for name in names}
        ready = {name: call for name, call in calls.items() if call is not None}
        if len(ready) < len(names):
            return None
        new = [name for name in names if name not in self._known_queues]
        if new:
            self.app.broker.register_queues(new)
            self._known_queues.update(new)
        return ready if n else ready[queue]

    def _enqueue_ready(self, task: Task, payload: Any, ready: ReadyEnqueue | dict[str, ReadyEnqueue]) -> str:
        """``enqueue`` with no options, as ``prepare`` + ``Broker.enqueue`` + ``Broker.run`` do it for a job that
        goes inline, in less Python: a sequential producer's rate is bound by its CPU per call."""
        args = task.codec.encode(payload)
        queue = task.options.queue
        if isinstance(ready, dict):  # a partitioned queue: the job's partition, as prepare routes it
            queue = self.route(task, queue, args, NO_OPTIONS)
            ready = ready[queue]
        now = ready.clock_ms()
        name, version = task.options.name, task.codec.version
        spec = JobSpec.plain(name, args, now, version)
        cap = self.app.max_payload_bytes
        if cap is not None and len(spec) > cap:
            self._check_size(task, spec)
        job_id = new_job_id()
        if len(spec) > INLINE_MAX_BYTES or not ready.send(job_id, spec, int(now)):
            got = self._run(self.app.broker.enqueue(queue, [(job_id, spec, 0)], True), NO_OPTIONS)
            return self._id(Prepared(queue, job_id, spec, 0, "", 0), got[0], NO_OPTIONS)
        return job_id

    def enqueue_in(self, task: Task, conn: Any, payload: Any, opts: EnqueueOptions) -> str:
        """The job as an outbox row in ``conn``'s transaction (outbox/write.py)."""
        return outbox_write.enqueue_in(task, conn, payload, opts)

    async def aenqueue_in(self, task: Task, conn: Any, payload: Any, opts: EnqueueOptions) -> str:
        return await outbox_write.aenqueue_in(task, conn, payload, opts)

    def enqueue_many(self, task: Task, payloads: Iterable[Any], opts: EnqueueOptions) -> list[str]:
        """Every payload is checked and encoded before the first call: a bad one sends nothing. The jobs then go
        in bounded calls (``_calls``); a call that fails after others went raises PartlyEnqueued."""
        try:
            prepared = [self.prepare(task, p, opts) for p in payloads]
            new = self._new_queues(prepared)
            self.app.broker.register_queues(new)
        except REDIS_ERRORS as exc:
            raise self._broker_error(exc) from exc
        self._known_queues.update(new)
        done: list[tuple[list[int], list[bool | str]]] = []
        for idx, call in self._calls(prepared, self._inline(task, opts)):
            try:
                done.append((idx, self._run(call, opts)))
            except _CALL_ERRORS as exc:
                self._failed_call(prepared, done, exc)
        return self._ids(prepared, done, opts)

    def _failed_call(self, prepared: list[Prepared], done: list[tuple[list[int], list[bool | str]]],
                     exc: Exception) -> NoReturn:
        """Raise for an ``enqueue_many`` call that failed: ringfence's error for redis-py's, PartlyEnqueued when
        earlier calls went."""
        error = exc if isinstance(exc, RingfenceError) else self._broker_error(exc)
        if error is not exc:
            error.__cause__ = exc
        if done:
            raise self._partly(prepared, done, error) from error
        raise error

    async def aenqueue(self, task: Task, payload: Any, opts: EnqueueOptions) -> str:
        if opts.depends_on is not None or opts.debounce_s is not None:
            # to_thread: the app's executor bounds the threads of a gather of many enqueues; the hop does not.
            return await asyncio.to_thread(self.enqueue, task, payload, opts)
        return (await self.aenqueue_many(task, [payload], opts))[0]

    async def aenqueue_many(self, task: Task, payloads: Iterable[Any],
                            opts: EnqueueOptions) -> list[str]:
        broker = self.app.broker
        try:
            if not broker.server_clock.measured:
                await broker.aping()  # else the first read of the Redis clock would block the loop for a round trip
            prepared = [self.prepare(task, p, opts) for p in payloads]
            new = self._new_queues(prepared)
            await broker.aregister_queues(new)
        except REDIS_ERRORS as exc:
            raise self._broker_error(exc) from exc
        self._known_queues.update(new)
        done: list[tuple[list[int], list[bool | str]]] = []
        for idx, call in self._calls(prepared, self._inline(task, opts)):
            try:
                done.append((idx, await self._arun(call, opts)))
            except _CALL_ERRORS as exc:
                self._failed_call(prepared, done, exc)
        return self._ids(prepared, done, opts)

