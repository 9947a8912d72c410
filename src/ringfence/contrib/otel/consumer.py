"""The worker's spans: one ``process {queue}`` span per attempt, through the observer hooks (worker/observers/)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, get_current_span, set_span_in_context

from ringfence.contrib.otel import names as n
from ringfence.models import Fetched, JobSpec
from ringfence.tasks import JobContext, Task
from ringfence.worker.observers import Observer
from ringfence.worker.outcomes import Outcome, Verdict

FAILED = (Outcome.RETRY, Outcome.DEAD)


class TraceObserver(Observer):
    """Starts an attempt's span when its handler is about to run, ends it with the verdict (``ran``).
    ``link_ttl_s``: how long a job's first run is remembered in Redis for the links of its retries and replays
    (0: no links, no Redis call)."""

    def __init__(self, tracer: Tracer, link_ttl_s: float, provider: Any) -> None:
        self.tracer = tracer
        self.provider = provider  # an SDK provider has force_flush; the API's default one has not
        self.link_ttl_s = link_ttl_s
        self.spans: dict[int, Span] = {}  # id() of the attempt's Fetched (held until ``ran``) -> its span

    def handler(self, job: Fetched, spec: JobSpec, ctx: JobContext, fn: Callable[..., Any]) -> Callable[..., Any]:
        attrs: dict[str, Any] = {n.MESSAGING_SYSTEM: n.SYSTEM, n.OPERATION_TYPE: "process", n.OPERATION_NAME: "process",
                 n.DESTINATION: job.queue, n.MESSAGE_ID: job.id, n.TASK: spec.task, n.ATTEMPT: job.attempt}
        span = self.tracer.start_span(f"process {job.queue}", context=n.parent_of(spec.extra), kind=SpanKind.CONSUMER,
                                      attributes=attrs)
        self.spans[id(job)] = span
        return _async(fn, span) if inspect.iscoroutinefunction(fn) else _sync(fn, span)

    async def ran(self, job: Fetched, task: Task, verdict: Verdict) -> None:
        span = self.spans.pop(id(job), None)
        if span is None:
            return
        span.set_attribute(n.OUTCOME, verdict.outcome.value)
        if verdict.reason:
            span.set_attribute(n.REASON, verdict.reason)
        if verdict.outcome in FAILED:
            span.set_status(Status(StatusCode.ERROR, verdict.error.splitlines()[0] if verdict.error else None))
        try:
            if self.link_ttl_s:
                await self._link(task, job, span, verdict)
        finally:
            span.end()

    def leaving(self) -> None:
        flush = getattr(self.provider, "force_flush", None)
        if flush is not None:
            flush(5000)

    async def _link(self, task: Task, job: Fetched, span: Span, verdict: Verdict) -> None:
        """Link this run to the job's first run: remembered once a run fails (a retry or a replay may follow),
        looked up by every later attempt and every first attempt (a replay starts at attempt 1 again)."""
        broker: Any = task.app.broker  # type: ignore[attr-defined]  # the App's (TaskOwner does not name it)
        key = f"{broker.keys.ns}:otel:first:{job.id}"
        own = n.traceparent(span)
        if job.attempt == 1 and verdict.outcome is Outcome.ACK:
            first = await broker.aio.get(key)
        else:
            pipe = broker.aio.pipeline(transaction=False)
            pipe.get(key)
            pipe.set(key, own, nx=True, ex=int(self.link_ttl_s))
            first = (await pipe.execute())[0]
        if first:
            first = first.decode() if isinstance(first, bytes) else first
            if first != own:
                first_ctx = n.parent_of({"tp": first})
                if first_ctx is not None:
                    span.add_link(get_current_span(first_ctx).get_span_context(), {"ringfence.link": "first_run"})


@contextlib.contextmanager
def _current(span: Span) -> Iterator[None]:
    """``span`` is the current span inside; an exception leaving is recorded on it."""
    token = otel_context.attach(set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        span.record_exception(exc)
        raise
    finally:
        otel_context.detach(token)


def _sync(fn: Callable[..., Any], span: Span) -> Callable[..., Any]:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with _current(span):
            return fn(*args, **kwargs)
    return traced


def _async(fn: Callable[..., Any], span: Span) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def traced(*args: Any, **kwargs: Any) -> Any:
        with _current(span):
            return await fn(*args, **kwargs)
    return traced
