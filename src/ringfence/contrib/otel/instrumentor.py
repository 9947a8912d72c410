"""``RingfenceInstrumentor``: the contrib convention (``instrument(tracer_provider=...)`` / ``uninstrument()``)."""

from __future__ import annotations

from typing import Any, ClassVar

from opentelemetry.trace import TracerProvider, get_tracer, get_tracer_provider

from ringfence import client as producer_hooks
from ringfence.client import Client
from ringfence.contrib.otel import names, producer
from ringfence.contrib.otel.consumer import TraceObserver
from ringfence.contrib.otel.steps import StepSpans
from ringfence.fence import step as step_hooks
from ringfence.worker import observers

LINK_TTL_S = 7 * 86400.0


class RingfenceInstrumentor:
    """Traces enqueues, job attempts and fence steps. One state per process: any instance undoes ``instrument``.

    ``instrument(tracer_provider=None, link_ttl_s=7 days)``: ``tracer_provider`` defaults to the global one;
    ``link_ttl_s=0`` turns off the links of retries and replays to their first run (and their Redis call per job).
    Workers made after ``instrument()`` are traced (call it in the app module the worker imports)."""

    _originals: ClassVar[dict[str, Any]] = {}
    _observer: ClassVar[TraceObserver | None] = None

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        return bool(RingfenceInstrumentor._originals)

    def instrument(self, *, tracer_provider: TracerProvider | None = None, link_ttl_s: float = LINK_TTL_S) -> None:
        if self.is_instrumented_by_opentelemetry:
            return
        if link_ttl_s < 0:
            raise ValueError(f"link_ttl_s={link_ttl_s} must be >= 0 seconds (0: no links)")
        tracer = get_tracer("ringfence.contrib.otel", tracer_provider=tracer_provider)
        cls = RingfenceInstrumentor
        for name in producer.METHODS:
            cls._originals[name] = original = getattr(Client, name)
            setattr(Client, name, producer.traced(tracer, name, original))
        producer_hooks.Tracing.fields = names.spec_fields
        step_hooks.Tracing.tracer = StepSpans(tracer)
        cls._observer = TraceObserver(tracer, link_ttl_s, tracer_provider or get_tracer_provider())
        observers.INSTALLED.append(cls._observer)

    def uninstrument(self) -> None:
        cls = RingfenceInstrumentor
        for name, original in cls._originals.items():
            setattr(Client, name, original)
        cls._originals.clear()
        producer_hooks.Tracing.fields = None
        step_hooks.Tracing.tracer = None
        if cls._observer in observers.INSTALLED:
            observers.INSTALLED.remove(cls._observer)
        cls._observer = None
