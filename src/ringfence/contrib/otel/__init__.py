"""OpenTelemetry traces of ringfence jobs (the ``otel`` extra: opentelemetry-api only).

::

    from ringfence.contrib.otel import RingfenceInstrumentor
    RingfenceInstrumentor().instrument(tracer_provider=provider)   # in the producer and in the worker's app module

Producer: a ``send {queue}`` span (kind PRODUCER) per enqueue call, whose W3C trace context goes into the job's
spec (``tp``, ``ts``). Worker: a ``process {queue}`` span (kind CONSUMER) per attempt, the producer's span its
parent, current while the handler runs; a retried or replayed job's run is linked to its first run; each fence
step is a child span. Not instrumented, nothing of this runs (docs/observability.md).
"""

try:
    import opentelemetry.trace  # noqa: F401
except ImportError as exc:
    raise ImportError("ringfence.contrib.otel needs OpenTelemetry's API: pip install 'ringfence[otel]'") from exc

from ringfence.contrib.otel.instrumentor import RingfenceInstrumentor

__all__ = ["RingfenceInstrumentor"]
