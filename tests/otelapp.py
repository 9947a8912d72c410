"""A worker app traced with OpenTelemetry's SDK: with $OTEL_SPANS_FILE set (the worker processes), every span
this process ends is appended to that file as one JSON line, at once (SimpleSpanProcessor), so a test reads
the spans of a worker it SIGTERMs. The test process instruments itself (an InMemorySpanExporter)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

from ringfence import RetryPolicy
from ringfence.contrib.otel import RingfenceInstrumentor
from support import worker_app

app = worker_app(fence=True, retry=RetryPolicy(max_attempts=2, base_s=0.1, cap_s=0.2),
                 relay_outbox_s=0.2)  # the workers relay the outbox in the fence database
MARKS = Path(os.environ.get("OTEL_MARKS", "/nonexistent"))  # a file per run: what the handlers did


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a") as f:
            f.writelines(s.to_json(indent=None) + "\n" for s in spans)
        return SpanExportResult.SUCCESS


if os.environ.get("OTEL_SPANS_FILE"):
    provider = TracerProvider()
    exporter = FileExporter(os.environ["OTEL_SPANS_FILE"])
    if os.environ.get("OTEL_BATCH"):  # exported only when the process exits (the SDK's exit hook flushes)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    RingfenceInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("otelapp")
else:
    tracer = trace.get_tracer("otelapp")


def _mark(name: str) -> int:
    """Count a run of ``name``; returns how many runs it had before this one."""
    path = MARKS / name
    before = int(path.read_text()) if path.exists() else 0
    path.write_text(str(before + 1))
    return before


@app.task
def hello(ctx, n: int) -> None:
    with tracer.start_as_current_span("handler work"):  # the process span must be current in the job thread
        _mark(f"hello{n}")


@app.task
async def ahello(ctx, n: int) -> None:
    with tracer.start_as_current_span("handler work"):
        _mark(f"ahello{n}")


@app.task
def flaky(ctx, n: int) -> None:
    if _mark(f"flaky{n}") == 0:
        raise ValueError(f"first run of flaky {n} fails")


@app.task
def broken(ctx, n: int) -> None:
    """Fails both attempts (dead-letter); runs clean once replayed."""
    if _mark(f"broken{n}") < 2:
        raise RuntimeError(f"broken {n} fails")


@app.task
def fenced(ctx, order: int) -> None:
    with ctx.fence(f"order:{order}", "charge") as step:
        if step.done:
            return
        step.effect(lambda: f"ch_{order}")
        with step.complete(app.fence_store.engine):
            pass
