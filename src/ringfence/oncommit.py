"""Enqueue after commit: a job that leaves for Redis only once the caller's database transaction has committed.

``task.enqueue_on_commit(session, **payload)`` checks the payload at once (the errors of ``enqueue``), fixes the
job's id, and keeps the job with the transaction (``fence/aftercommit.py`` for SQLAlchemy, ``on_commit`` for
Django). Nothing is sent on rollback; a job kept in a savepoint that rolls back is dropped.

Redis unreachable at commit: the transaction has committed, so the job must not vanish. It is counted
(``ringfence_on_commit_unsent_total``), logged at ERROR with its whole record as JSON (the line starts
``on-commit job not sent``), and kept in this process (:meth:`OnCommit.unsent`). A background thread retries the
kept jobs with backoff for ``retry_for_s``; :meth:`OnCommit.resend` tries again at any time, and
``ringfence job resend`` sends records copied from the log. A job keeps its id, so a second send of one that
did arrive is refused by Redis while the job is queued.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from ringfence.client import Tracing
from ringfence.errors import ConfigError
from ringfence.models import new_job_id
from ringfence.tasks import EnqueueOptions, Task

if TYPE_CHECKING:
    from ringfence.client import Client

log = logging.getLogger("ringfence.oncommit")

MAX_KEPT = 10_000  # unsent jobs kept in memory; past it a job is in the log line only (and counted as dropped)


@dataclass(frozen=True)
class Deferred:
    """A checked job waiting for a commit (or, after a failed send, for Redis)."""

    task: Task
    args: dict[str, Any]
    options: EnqueueOptions
    kept_at: float = 0.0     # time.monotonic() when its first send failed (0: not failed yet)
    given_up: bool = False   # retried for retry_for_s: left for resend() or the operator
    context: contextvars.Context | None = None  # the caller's, when traced: the send continues its trace

    def send(self, enqueue: Callable[..., str]) -> str:
        args = (self.task, self.args, self.options)
        return enqueue(*args) if self.context is None else self.context.copy().run(enqueue, *args)

    async def asend(self, client: Client) -> str:
        send = client.aenqueue(self.task, self.args, self.options)
        if self.context is None:
            return await send
        return await asyncio.get_running_loop().create_task(send, context=self.context.copy())

    @property
    def id(self) -> str:
        return self.options.job_id or ""

    def record(self) -> dict[str, Any]:
        """The job as JSON-ready data: what the log line carries and ``ringfence job resend`` reads."""
        opts = {k: v for k, v in asdict(self.options).items()
                if v not in (None, False) and v != _DEFAULTS.get(k) and k not in ("job_id", "unique_key", "run_at")}
        if self.options.run_at is not None:
            opts["run_at"] = self.options.run_at.isoformat()
        if isinstance(self.options.unique_key, str):
            opts["unique_key"] = self.options.unique_key
        return {"id": self.id, "task": self.task.name, "args": self.args, "options": opts}


# An option left at its default is not written (a record stays what `job resend` needs and nothing more).
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(EnqueueOptions) if f.default is not MISSING}

class HasClient(Protocol):
    """The App, as the on-commit jobs see it: its producer (oncommit.py never imports app.py)."""

    @property
    def client(self) -> Client: ...


class OnCommit:
    """The on-commit jobs of one App: sending, counting and keeping the ones Redis did not take."""

    def __init__(self, app: HasClient, retry_for_s: float = 300.0) -> None:
        self.app = app
        self.retry_for_s = retry_for_s
        self.registry = CollectorRegistry()
        self.sent = Counter("ringfence_on_commit_sent", "On-commit jobs sent to Redis after their commit",
                            ["task"], registry=self.registry)
        self.unsent_total = Counter("ringfence_on_commit_unsent", "On-commit jobs whose send after commit failed "
                                    "(kept in memory, logged with their JSON)", ["task"], registry=self.registry)
        self.dropped = Counter("ringfence_on_commit_dropped", "Unsent jobs past the in-memory cap: only in the log",
                               ["task"], registry=self.registry)
        self.kept = Gauge("ringfence_on_commit_kept", "Unsent on-commit jobs kept in memory now",
                          registry=self.registry)
        self._kept: dict[str, Deferred] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._retrier: threading.Thread | None = None

    # -- registering ----------------------------------------------------------------------------
    def defer(self, task: Task, target: Any, payload: Any, opts: EnqueueOptions, using: str | None = None) -> str:
        """Check the job now, send it after ``target``'s transaction commits; returns its id."""
        args = orjson.loads(orjson.dumps(self.app.client.check(task, payload, opts)))  # a snapshot
        context = None if Tracing.fields is None else contextvars.copy_context()
        job = Deferred(task, args, replace(opts, job_id=opts.job_id or new_job_id()), context=context)
        if target is None or _is_django(target):
            _django_on_commit(self, job, target, using)
        else:
            from ringfence.fence.aftercommit import after_commit

            after_commit(target, job, self._deliver)
        return job.id

    def _deliver(self, jobs: list[Deferred], in_async: bool) -> None:
        """Called once the outer transaction committed: never raises (the commit has happened)."""
        if in_async:
            from ringfence.fence.aftercommit import run_async

            if run_async(self._asend(jobs)):
                return
        self._send(jobs)

    # -- sending --------------------------------------------------------------------------------
    def _send(self, jobs: list[Deferred]) -> None:
        client = self.app.client
        for job in jobs:
            try:
                job.send(client.enqueue)
            except Exception as exc:  # commit is done: keep the job, never raise into the caller's commit
                self._keep(job, exc)
            else:
                self.sent.labels(job.task.name).inc()

    async def _asend(self, jobs: list[Deferred]) -> None:
        client = self.app.client
        for job in jobs:
            try:
                await job.asend(client)
            except Exception as exc:
                self._keep(job, exc)
            else:
                self.sent.labels(job.task.name).inc()

    def _keep(self, job: Deferred, exc: Exception) -> None:
        name = job.task.name
        self.unsent_total.labels(name).inc()
        record = orjson.dumps(job.record()).decode()
        with self._lock:
            full = len(self._kept) >= MAX_KEPT and job.id not in self._kept
            if not full:
                self._kept[job.id] = replace(job, kept_at=job.kept_at or time.monotonic())
                self.kept.set(len(self._kept))
        if full:
            self.dropped.labels(name).inc()
        log.error("on-commit job not sent (%s: %s); %s: %s", type(exc).__name__, exc,
                  f"{MAX_KEPT} unsent jobs kept already, this one is only in this line" if full
                  else f"kept in memory and retried for {self.retry_for_s:g}s", record)
        if not full:
            self._start_retrier()

    def unsent(self) -> list[dict[str, Any]]:
        """The records of the jobs kept after a failed send, oldest first."""
        with self._lock:
            return [job.record() for job in self._kept.values()]

    def resend(self) -> tuple[int, int]:
        """Send every kept job now. Returns (sent, still kept)."""
        with self._lock:
            jobs = list(self._kept.values())
        sent = 0
        for job in jobs:
            try:
                job.send(self.app.client.enqueue)
            except Exception as exc:
                log.debug("on-commit job %s: resend failed: %s", job.id, exc)
                continue
            sent += 1
            self.sent.labels(job.task.name).inc()
            with self._lock:
                self._kept.pop(job.id, None)
            log.warning("on-commit job %s sent after all (do not resend it from the log)", job.id)
        with self._lock:
            left = len(self._kept)
            self.kept.set(left)
        return sent, left

    # -- retrying -------------------------------------------------------------------------------
    def _start_retrier(self) -> None:
        with self._lock:
            if self._retrier is not None and self._retrier.is_alive():
                self._wake.set()
                return
            self._retrier = threading.Thread(target=self._retry_loop, name="ringfence-on-commit", daemon=True)
            self._retrier.start()

    def _retry_loop(self) -> None:
        delay = 0.5
        while True:
            self._wake.wait(delay)
            self._wake.clear()
            try:
                _, left = self.resend()
            except Exception:  # a bug must not end the retries silently
                log.exception("on-commit: resend failed")
                left = 1
            if not left:
                return
            self._give_up_old()
            with self._lock:
                if all(j.given_up for j in self._kept.values()):
                    return  # they wait for resend() or the operator
            delay = min(delay * 2, 10.0)

    def _give_up_old(self) -> None:
        now = time.monotonic()
        with self._lock:
            old = [j for j in self._kept.values() if not j.given_up and j.kept_at + self.retry_for_s <= now]
            for j in old:
                self._kept[j.id] = replace(j, given_up=True)
        for j in old:
            log.error("on-commit job %s: not sent after %gs of retries; kept in memory for resend() "
                      "(or send it with `ringfence job resend`): %s", j.id, self.retry_for_s,
                      orjson.dumps(j.record()).decode())


def options_from_record(record: dict[str, Any]) -> EnqueueOptions:
    """The enqueue options of a record made by :meth:`Deferred.record` (``ringfence job resend``)."""
    from datetime import datetime

    from ringfence.tasks import enqueue_options

    opts = dict(record.get("options") or {})
    if "run_at" in opts:
        opts["run_at"] = datetime.fromisoformat(opts["run_at"])
    if not isinstance(record.get("id"), str):
        raise ConfigError(f"record {str(record)[:80]!r} has no job id")
    return enqueue_options(job_id=record["id"], **opts)


# -- Django -------------------------------------------------------------------------------------------------
def _is_django(target: Any) -> bool:
    return type(target).__module__.startswith("django.")


def _django_on_commit(on_commit: OnCommit, job: Deferred, conn: Any, using: str | None) -> None:
    try:
        from django.db import transaction
    except ImportError as exc:
        raise ConfigError("enqueue_on_commit needs a SQLAlchemy Session or Connection, or Django installed "
                          "(then pass its connection, or call it inside transaction.atomic())") from exc
    alias = using or (conn.alias if conn is not None else None)
    if alias is None:
        from django.db import DEFAULT_DB_ALIAS

        alias = DEFAULT_DB_ALIAS
    transaction.on_commit(lambda: on_commit._deliver([job], False), using=alias)
