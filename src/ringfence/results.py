"""Job results, opt-in per task: ``@app.task(store_result=True, result_ttl_s=3600)``.

The worker stores what the handler returns (plain JSON, or a pydantic model as its JSON) before it acks the job,
and a record of the failure when the job goes to dead-letter; both expire after ``result_ttl_s``. Tasks without
``store_result`` cost nothing more: no key, no round trip. ``app.result(job_id, timeout=...)`` and
``await app.aresult(...)`` wait for the record:

- done: the handler's return value (as JSON gives it back: a model comes back as a dict);
- dead-letter: :class:`JobFailed` naming the job, the reason and the error;
- nothing within ``timeout`` (None: no limit): :class:`ResultTimeout`, the job may still finish;
- no job and no result with this id (wrong id, result expired, cancelled): :class:`UnknownJob`;
- a job whose task does not store results: ConfigError.

A return value that is not JSON (a datetime, NaN, an object) is not stored: the job goes to dead-letter with
reason ``bad_result`` and an error naming the field; its payload is kept there for a replay after the fix.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel

from ringfence import queries
from ringfence.errors import ConfigError, JobFailed, PayloadError, ResultTimeout, UnknownJob
from ringfence.payloads import json_problem, model_dump, non_finite
from ringfence.redis import results as stored
from ringfence.redis.connect import REDIS_ERRORS, broker_error
from ringfence.settings import check_name

if TYPE_CHECKING:
    from ringfence.redis.broker import Broker
    from ringfence.runtime import Live
    from ringfence.tasks import Task

log = logging.getLogger("ringfence.results")

DEFAULT_TTL_S = 86400.0
POLL_S = 0.1  # after a replay, until the new run's record replaces the old failure
BAD_RESULT = "bad_result"  # the dead-letter reason of a return value that is not JSON


def done_record(task: Task, queue: str, value: Any, now_ms: int, run: float | None = None) -> bytes:
    """The record of a finished job; PayloadError names the part of ``value`` that is not JSON. ``run``: the
    spec's ``enqueued_ms``, which tells this run's record from one of an earlier job with the same id."""
    problem = result_problem(value)
    if problem is not None:
        raise PayloadError(f"task {task.name!r}: the return value is not stored: {problem}; return plain JSON "
                           "(dict, list, str, int, finite float, bool, None) or a pydantic model")
    record = orjson.dumps({"state": "done", "task": task.name, "queue": queue, "finished_ms": now_ms, "run": run,
                           "result": plain_result(value)})
    cap = getattr(task.app, "max_result_bytes", None)  # the App's setting (TaskOwner does not name it)
    if isinstance(cap, int) and len(record) > cap:
        raise PayloadError(f"task {task.name!r}: the return value is not stored: its record is {len(record):,} "
                           f"bytes, above max_result_bytes={cap:,}; store large data elsewhere and return its id "
                           "(or raise App(max_result_bytes=...))")
    return record


def result_problem(value: Any) -> str | None:
    """Why ``value`` is not a result that can be stored (JSON, or a pydantic model of JSON); None: it is."""
    try:
        return (non_finite(model_dump(value, "result"), "result") if isinstance(value, BaseModel)
                else json_problem(value, "result"))
    except PayloadError as exc:
        return str(exc)


def plain_result(value: Any) -> Any:
    """``value`` as JSON data (a pydantic model dumped)."""
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def dead_record(task_name: str, queue: str, reason: str, error: str, now_ms: int) -> bytes:
    return orjson.dumps({"state": "dead", "task": task_name, "queue": queue, "finished_ms": now_ms,
                         "reason": reason, "error": error})


def ttl_ms(task: Task | None) -> int:
    ttl_s = task.result_ttl_s if task is not None and task.result_ttl_s is not None else DEFAULT_TTL_S
    return max(1, int(ttl_s * 1000))


async def store(broker: Broker, job_id: str, task: Task | None, record: bytes) -> None:
    """Store a finished job's record (the worker, before its ack)."""
    await broker.arun(stored.store(broker, job_id, record, ttl_ms(task)))


async def store_failure(broker: Broker, job_id: str, queue: str, task: Task | None, task_name: str, reason: str,
                        error: str) -> None:
    """After a dead-letter, for a task with store_result: wake the waiters with the reason. Best effort: a
    waiter that finds no record reads the dead-letter entry instead."""
    if task is None or not task.store_result:
        return
    try:
        record = dead_record(task_name, queue, reason, error, broker.clock())
        await broker.arun(stored.store(broker, job_id, record, ttl_ms(task)))
    except Exception as exc:
        log.warning("job %s: its failure record was not stored (%s); waiters read the dead-letter entry", job_id, exc)


def read(app: Live, job_id: str) -> dict[str, Any] | None:
    """The stored record of ``job_id`` (done or dead), or None."""
    raw = stored.read(app.broker, job_id)
    return None if raw is None else _record(raw)


def _record(raw: bytes) -> dict[str, Any]:
    found = orjson.loads(raw)
    if not isinstance(found, dict):
        raise ConfigError(f"result record is not a JSON object: {raw[:80]!r}")
    return found


def _outcome(job_id: str, record: dict[str, Any]) -> Any:
    if record.get("state") == "done":
        return record.get("result")
    reason, error = str(record.get("reason", "")), str(record.get("error", ""))
    raise JobFailed(f"job {job_id} ({record.get('task', '?')}) failed [{reason}]: {error}", job_id, reason, error)


# -- waiting ------------------------------------------------------------------------------------------------
class _Waiter:
    """What result() and aresult() share: where the job is, and when to give up."""

    def __init__(self, app: Live, job_id: str, timeout: float | None) -> None:
        check_name("job id", job_id)
        if timeout is not None and not timeout >= 0:
            raise ConfigError(f"timeout={timeout!r} must be >= 0 seconds (or None: no limit)")
        self.app, self.job_id = app, job_id
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.queue: str | None = None
        self.stale_ms: float | None = None  # records up to this finished_ms are from before a replay
        # A blocking read shorter than the socket timeout, so the client never takes it for a dead socket.
        self.step_s = max(0.05, min(1.0, app.redis_settings.socket_timeout_s / 2))

    def locate(self) -> None:
        """Find the job's queue (raises UnknownJob, JobFailed or ConfigError when waiting is pointless)."""
        from ringfence.jobs import find_job

        view = find_job(self.app, self.job_id)
        if view is None:
            raise UnknownJob(f"no job {self.job_id!r} and no stored result in namespace {self.app.namespace} "
                             "(a wrong id, a result past its result_ttl_s, a job cancelled or purged, or a task "
                             "without store_result=True)", self.job_id)
        task = self.app.registry.get(view.task)
        if task is not None and not task.store_result:
            raise ConfigError(f"task {view.task!r} does not store results: declare it with store_result=True "
                              f"(job {self.job_id} is {view.state})")
        if view.state == "dead":  # died before a record could be written (or the record expired)
            dead = queries.find_dead(self.app.broker, self.job_id)
            reason, error = (dead.reason, dead.error) if dead is not None else (view.reason, view.error)
            raise JobFailed(f"job {self.job_id} ({view.task}) failed [{reason}]: {error}", self.job_id, reason, error)
        self.queue = view.queue

    def _stale(self, record: dict[str, Any]) -> bool:
        return self.stale_ms is not None and record.get("finished_ms", 0) <= self.stale_ms

    def _earlier(self, record: dict[str, Any], now: tuple[str, float] | None) -> bool:
        """Is ``record`` from an earlier run of this id than the one in a queue ``now`` (a failure since replayed,
        any record of a run whose id was enqueued again)? Then wait for the record of the run in the queue."""
        if now is None:
            return False
        queue, run = now
        written_by = record.get("run")  # the spec's enqueued_ms of the run that wrote the record
        same_run = run == written_by if written_by is not None else record.get("finished_ms", 0) > run
        if record.get("state") == "done" and same_run:
            return False  # stored before the ack: the job is still in its queue for a moment
        self.stale_ms, self.queue = record.get("finished_ms", 0), queue
        return True

    def fresh(self, raw: bytes | None) -> dict[str, Any] | None:
        record = None if raw is None else _record(raw)
        if record is None or self._stale(record):
            return None
        return None if self._earlier(record, stored.current_run(self.app.broker, self.job_id)) else record

    async def afresh(self, raw: bytes | None) -> dict[str, Any] | None:
        record = None if raw is None else _record(raw)
        if record is None or self._stale(record):
            return None
        return None if self._earlier(record, await stored.acurrent_run(self.app.broker, self.job_id)) else record

    def gone(self) -> bool:
        return self.queue is None or not stored.present(self.app.broker, self.queue, self.job_id)

    async def agone(self) -> bool:
        return self.queue is None or not await stored.apresent(self.app.broker, self.queue, self.job_id)

    def slice_s(self) -> float:
        if self.deadline is None:
            return self.step_s
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ResultTimeout(f"job {self.job_id}: no result within {self.timeout:g}s (it may still finish; "
                                f"`ringfence job show {self.job_id}` says where it is)", self.job_id)
        return max(0.01, min(self.step_s, left))


def result(app: Live, job_id: str, timeout: float | None = None) -> Any:
    """The return value of job ``job_id``, waiting up to ``timeout`` seconds (None: no limit). redis-py's errors
    come as ringfence's (CannotConnect, NotPermitted, BrokerError), the original as the cause."""
    w = _Waiter(app, job_id, timeout)
    try:
        return _result(w)
    except REDIS_ERRORS as exc:
        raise broker_error("result", exc, app.broker.url) from exc


async def aresult(app: Live, job_id: str, timeout: float | None = None) -> Any:
    """:func:`result` for asyncio (locating the job, once, reads Redis synchronously: a round trip per queue)."""
    w = _Waiter(app, job_id, timeout)
    try:
        return await _aresult(w)
    except REDIS_ERRORS as exc:
        raise broker_error("result", exc, app.broker.url) from exc


def _result(w: _Waiter) -> Any:
    b, job_id = w.app.broker, w.job_id
    while True:
        record = w.fresh(stored.read(b, job_id))
        if record is None and w.gone():
            record = w.fresh(stored.read(b, job_id))  # the worker stores before it acks: read again, then look
            if record is None:
                w.locate()
        if record is None and w.stale_ms is None:
            record = w.fresh(stored.wait(b, job_id, w.slice_s()))
        elif record is None:
            time.sleep(min(w.slice_s(), POLL_S))  # a stale record would answer a blocking read at once
        if record is not None:
            return _outcome(job_id, record)


async def _aresult(w: _Waiter) -> Any:
    b, job_id = w.app.broker, w.job_id
    while True:
        record = await w.afresh(await stored.aread(b, job_id))
        if record is None and await w.agone():
            record = await w.afresh(await stored.aread(b, job_id))
            if record is None:
                w.locate()
        if record is None and w.stale_ms is None:
            record = await w.afresh(await stored.await_(b, job_id, w.slice_s()))
        elif record is None:
            await asyncio.sleep(min(w.slice_s(), POLL_S))
        if record is not None:
            return _outcome(job_id, record)
