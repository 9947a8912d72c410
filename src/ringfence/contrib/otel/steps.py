"""Fence steps as child spans of the attempt (fence/step.py's ``Tracing`` hook)."""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Status, StatusCode, Tracer, set_span_in_context

from ringfence.errors import FenceError, InDoubt
from ringfence.fence.core import Core
from ringfence.fence.model import FenceState


class StepSpans:
    """``fence {step}`` spans: the subject, step and provider key; at the end the row's state and the outcome."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def begin(self, core: Core) -> Any:
        span = self.tracer.start_span(f"fence {core.step}", attributes={
            "ringfence.fence.subject": core.subject, "ringfence.fence.step": core.step,
            "ringfence.fence.key": core.key})
        return span, otel_context.attach(set_span_in_context(span))

    def end(self, handle: Any, core: Core, exc: BaseException | None) -> None:
        span, token = handle
        otel_context.detach(token)
        try:
            row = core.row
        except FenceError:
            row = None
        if row is not None:  # the row as last read; a completion this run made is not read back
            state = FenceState.COMPLETED if core.completed else row.state
            span.set_attribute("ringfence.fence.state", state.value)
            span.set_attribute("ringfence.fence.epoch", row.epoch)
        span.set_attribute("ringfence.fence.outcome", _outcome(core, exc))
        if isinstance(exc, InDoubt) or (row is not None and row.state is FenceState.IN_DOUBT):
            span.add_event("ringfence.fence.in_doubt", {"message": str(exc) if exc else "in doubt"})
        if exc is not None:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()


def _outcome(core: Core, exc: BaseException | None) -> str:
    if core.done:
        return "done_before"  # completed on an earlier run: the second run is empty
    if core.completed:
        return "completed"
    if isinstance(exc, InDoubt):
        return "in_doubt"
    return "failed" if exc is not None else "open"
