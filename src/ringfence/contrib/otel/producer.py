"""The producer's spans: ``Client``'s enqueue methods wrapped while instrumented (and restored after)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import SpanKind, Tracer

from ringfence.client import Client
from ringfence.contrib.otel import names as n
from ringfence.tasks import EnqueueOptions, Task

#: Client method -> (operation type, one job per call)
METHODS = {"enqueue": ("send", True), "enqueue_many": ("send", False), "aenqueue_many": ("send", False),
           "enqueue_in": ("create", True), "aenqueue_in": ("create", True)}


def _attributes(task: Task, opts: EnqueueOptions, operation: str) -> dict[str, Any]:
    return {n.MESSAGING_SYSTEM: n.SYSTEM, n.OPERATION_TYPE: operation, n.OPERATION_NAME: operation,
            n.DESTINATION: opts.queue or task.options.queue, n.TASK: task.name}


def _ended(span: Any, single: bool, got: Any) -> None:
    if single:
        span.set_attribute(n.MESSAGE_ID, got)
    else:
        span.set_attribute(n.BATCH_COUNT, len(got))
        if len(got) == 1:
            span.set_attribute(n.MESSAGE_ID, got[0])


def traced(tracer: Tracer, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    operation, single = METHODS[name]

    def start(task: Task, opts: EnqueueOptions) -> Any:
        attrs = _attributes(task, opts, operation)
        return tracer.start_as_current_span(f"{operation} {attrs[n.DESTINATION]}", kind=SpanKind.PRODUCER,
                                            attributes=attrs)

    if name.startswith("a"):
        @functools.wraps(fn)
        async def acall(self: Client, task: Task, arg: Any, *rest: Any) -> Any:
            with start(task, rest[-1]) as span:
                got = await fn(self, task, arg, *rest)
                _ended(span, single, got)
                return got
        return acall

    @functools.wraps(fn)
    def call(self: Client, task: Task, arg: Any, *rest: Any) -> Any:
        with start(task, rest[-1]) as span:
            got = fn(self, task, arg, *rest)
            _ended(span, single, got)
            return got
    return call
