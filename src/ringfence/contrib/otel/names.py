"""Attribute names (OpenTelemetry messaging conventions, then ringfence's own) and the spec's trace fields."""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.trace import Span, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SYSTEM = "ringfence"
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
TASK = "ringfence.task"
ATTEMPT = "ringfence.attempt"
OUTCOME = "ringfence.outcome"
REASON = "ringfence.reason"

W3C = TraceContextTextMapPropagator()  # always W3C in the spec, whatever the app's global propagator is


def spec_fields() -> dict[str, str]:
    """The current trace context as spec fields (``tp``: traceparent, ``ts``: tracestate); {} without a span."""
    if not get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    W3C.inject(carrier)
    fields = {"tp": carrier["traceparent"]}
    if carrier.get("tracestate"):
        fields["ts"] = carrier["tracestate"]
    return fields


def parent_of(extra: dict[str, Any]) -> otel_context.Context | None:
    """The producer's context carried by a spec's fields; None when it carries none (a root span then)."""
    tp = extra.get("tp")
    if not isinstance(tp, str):
        return None
    carrier = {"traceparent": tp}
    if isinstance(extra.get("ts"), str):
        carrier["tracestate"] = extra["ts"]
    return W3C.extract(carrier, context=otel_context.Context())


def traceparent(span: Span) -> str:
    c = span.get_span_context()
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
