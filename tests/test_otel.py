"""ringfence.contrib.otel across real processes: the test process is the producer (OpenTelemetry's SDK with an
InMemorySpanExporter), real worker processes run tests/otelapp.py and append their spans to a file as JSON."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

import ringfence
from ringfence.contrib.otel import RingfenceInstrumentor
from ringfence.outbox import create_outbox
from support import ROOT, wait_until


class Traced:
    def __init__(self, mod: Any, tmp: Path, fence_url: str) -> None:
        self.mod, self.tmp, self.fence_url = mod, tmp, fence_url
        self.spans_file = tmp / "worker-spans.jsonl"
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("test")
        self.provider = provider

    def env(self) -> dict[str, str]:
        return {"FENCE_URL": self.fence_url, "OTEL_SPANS_FILE": str(self.spans_file), "OTEL_MARKS": str(self.tmp)}

    def worker_spans(self) -> list[dict[str, Any]]:
        if not self.spans_file.exists():
            return []
        return [json.loads(line) for line in self.spans_file.read_text().splitlines() if line]

    def process_spans(self, job_id: str, n: int) -> list[dict[str, Any]]:
        """The first ``n`` process spans of a job, in the order they ended (waits for them)."""
        def found() -> list[dict[str, Any]] | None:
            got = [s for s in self.worker_spans() if s["kind"] == "SpanKind.CONSUMER"
                   and s["attributes"].get("messaging.message.id") == job_id]
            return got[:n] if len(got) >= n else None
        return wait_until(found, timeout=30)

    def sent(self, job_id: str) -> Any:
        [span] = [s for s in self.exporter.get_finished_spans() if s.attributes.get("messaging.message.id") == job_id]
        return span


@pytest.fixture
def traced(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Traced]:
    fence_url = f"sqlite:///{tmp_path / 'fences.db'}"
    os.environ.update(RINGFENCE_NAMESPACE=namespace, RINGFENCE_REDIS_URL=redis_url, FENCE_URL=fence_url,
                      OTEL_MARKS=str(tmp_path))
    os.environ.pop("OTEL_SPANS_FILE", None)  # the test process is traced by the fixture, not by otelapp
    import otelapp

    mod = importlib.reload(otelapp)
    mod.app.fence_store.create_all()
    create_outbox(mod.app.fence_store.engine)
    t = Traced(mod, tmp_path, fence_url)
    RingfenceInstrumentor().instrument(tracer_provider=t.provider)
    try:
        yield t
    finally:
        RingfenceInstrumentor().uninstrument()
        mod.app.close()


def _hex(n: int) -> str:
    return f"0x{n:016x}"


def _child_of(worker_span: dict[str, Any], producer_span: Any) -> bool:
    return (worker_span["parent_id"] == _hex(producer_span.context.span_id)
            and worker_span["context"]["trace_id"] == f"0x{producer_span.context.trace_id:032x}")


def _stop(w: Any) -> None:
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.output()


def test_the_process_span_continues_the_producer_trace(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    with traced.tracer.start_as_current_span("request") as request:
        sync_job = m.hello.enqueue(n=1)  # a plain enqueue: its fast path must carry the context too
        async_job = m.ahello.enqueue(n=1)
    w = spawn_worker("--app", "otelapp:app", env=traced.env())
    [process] = traced.process_spans(sync_job, 1)
    [aprocess] = traced.process_spans(async_job, 1)
    _stop(w)

    send = traced.sent(sync_job)
    assert send.name == "send default" and send.kind.name == "PRODUCER"
    assert send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes) == {"messaging.system": "ringfence", "messaging.operation.type": "send",
                                     "messaging.operation.name": "send", "messaging.destination.name": "default",
                                     "ringfence.task": "otelapp.hello", "messaging.message.id": sync_job}
    assert _child_of(process, send) and _child_of(aprocess, traced.sent(async_job))
    assert process["name"] == "process default"
    assert {k: process["attributes"][k] for k in ("messaging.system", "messaging.operation.type",
                                                  "messaging.destination.name", "ringfence.attempt",
                                                  "ringfence.outcome")} == {
        "messaging.system": "ringfence", "messaging.operation.type": "process",
        "messaging.destination.name": "default", "ringfence.attempt": 1, "ringfence.outcome": "ack"}
    work = [s for s in traced.worker_spans() if s["name"] == "handler work"]
    parents = {s["parent_id"] for s in work}
    assert parents == {process["context"]["span_id"], aprocess["context"]["span_id"]}  # current in the handler


def test_a_retry_is_linked_to_the_first_run_and_the_exception_recorded(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    job = m.flaky.enqueue(n=1)
    w = spawn_worker("--app", "otelapp:app", env=traced.env())
    first, second = traced.process_spans(job, 2)
    _stop(w)
    send = traced.sent(job)
    assert _child_of(first, send) and _child_of(second, send)
    assert (first["attributes"]["ringfence.attempt"], first["attributes"]["ringfence.outcome"]) == (1, "retry")
    assert first["status"]["status_code"] == "ERROR"
    [exc] = [e for e in first["events"] if e["name"] == "exception"]
    assert exc["attributes"]["exception.type"] == "ValueError"
    assert exc["attributes"]["exception.message"] == "first run of flaky 1 fails"
    assert (second["attributes"]["ringfence.attempt"], second["attributes"]["ringfence.outcome"]) == (2, "ack")
    assert [link["context"]["span_id"] for link in second["links"]] == [first["context"]["span_id"]]
    assert first["links"] == []


def test_a_replay_is_linked_to_the_first_run(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    job = m.broken.enqueue(n=1)
    w = spawn_worker("--app", "otelapp:app", env=traced.env())
    first, last = traced.process_spans(job, 2)
    assert last["attributes"]["ringfence.outcome"] == "dead"
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "dead", "replay", "--app", "otelapp:app", job],
                         env={**os.environ, "PYTHONPATH": str(ROOT / "tests")}, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    replayed = traced.process_spans(job, 3)[2]
    _stop(w)
    assert (replayed["attributes"]["ringfence.attempt"], replayed["attributes"]["ringfence.outcome"]) == (1, "ack")
    assert [link["context"]["span_id"] for link in replayed["links"]] == [first["context"]["span_id"]]
    assert [link["context"]["span_id"] for link in last["links"]] == [first["context"]["span_id"]]


def test_fence_steps_are_child_spans_and_in_doubt_an_event(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    job = m.fenced.enqueue(order=1)
    w = spawn_worker("--app", "otelapp:app", env=traced.env())
    [process] = traced.process_spans(job, 1)
    [step] = [s for s in traced.worker_spans() if s["name"] == "fence charge"]
    assert step["parent_id"] == process["context"]["span_id"]
    a = step["attributes"]
    assert (a["ringfence.fence.subject"], a["ringfence.fence.step"], a["ringfence.fence.state"],
            a["ringfence.fence.outcome"]) == ("order:1", "charge", "completed", "completed")
    assert a["ringfence.fence.key"] == m.app.fence_store.get("order:1", "charge").provider_key

    again = m.fenced.enqueue(order=1)  # the second run is empty
    [process2] = traced.process_spans(again, 1)
    [step2] = [s for s in traced.worker_spans() if s["parent_id"] == process2["context"]["span_id"]]
    assert step2["attributes"]["ringfence.fence.outcome"] == "done_before"

    engine = create_engine(traced.fence_url)
    with engine.begin() as c:  # as a dead owner's calling step ends: in doubt
        c.execute(text("UPDATE ringfence_fences SET state = 'in_doubt' WHERE subject = 'order:1'"))
    engine.dispose()
    parked = m.fenced.enqueue(order=1)
    [process3] = traced.process_spans(parked, 1)
    _stop(w)
    assert process3["attributes"]["ringfence.outcome"] == "dead"
    [step3] = [s for s in traced.worker_spans() if s["parent_id"] == process3["context"]["span_id"]]
    assert step3["attributes"]["ringfence.fence.outcome"] == "in_doubt"
    assert "ringfence.fence.in_doubt" in [e["name"] for e in step3["events"]]
    assert step3["status"]["status_code"] == "ERROR"


def test_a_worker_stopped_by_sigterm_flushes_its_batched_spans(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    job = m.hello.enqueue(n=5)
    w = spawn_worker("--app", "otelapp:app", env={**traced.env(), "OTEL_BATCH": "1"})
    wait_until(lambda: (traced.tmp / "hello5").exists(), timeout=30)
    assert traced.worker_spans() == []  # held by the BatchSpanProcessor
    _stop(w)
    [process] = traced.process_spans(job, 1)
    assert _child_of(process, traced.sent(job))


def test_a_worker_replacing_itself_flushes_its_batched_spans_first(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    job = m.hello.enqueue(n=6)
    w = spawn_worker("--app", "otelapp:app", "--max-jobs-per-child", "1", env={**traced.env(), "OTEL_BATCH": "1"})
    [process] = traced.process_spans(job, 1)  # exported before the worker executed itself again (no exit hooks)
    assert w.proc.poll() is None  # the same process, its new image serving
    _stop(w)
    assert _child_of(process, traced.sent(job))


def test_enqueue_on_commit_keeps_the_callers_context(traced: Traced, tmp_path: Path) -> None:
    m = traced.mod
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with Session(engine) as session:
        with traced.tracer.start_as_current_span("request") as request:
            job = m.hello.enqueue_on_commit(session, n=2)
        session.commit()  # outside the request span: the send still belongs to it
    engine.dispose()
    send = traced.sent(job)
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id


def test_the_outbox_relay_keeps_the_writers_context(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    with traced.tracer.start_as_current_span("request") as request, m.app.fence_store.engine.begin() as conn:
        job = m.hello.enqueue_in(conn, n=4)
    create = traced.sent(job)
    assert (create.name, create.kind.name, create.attributes["messaging.operation.type"]) == (
        "create default", "PRODUCER", "create")
    assert create.parent is not None and create.parent.span_id == request.get_span_context().span_id
    w = spawn_worker("--app", "otelapp:app", env=traced.env())  # relays the row, then runs the job
    [process] = traced.process_spans(job, 1)
    _stop(w)
    assert _child_of(process, create)


def test_workflow_steps_continue_the_trace_that_started_them(traced: Traced, spawn_worker: Any) -> None:
    m = traced.mod
    with traced.tracer.start_as_current_span("request") as request:
        workflow = ringfence.chain(m.hello.s(n=7), m.ahello.s(n=8)).enqueue()
    w = spawn_worker("--app", "otelapp:app", env=traced.env())
    steps = [traced.process_spans(f"{workflow}.{i}", 1)[0] for i in range(2)]
    _stop(w)
    trace_id = f"0x{request.get_span_context().trace_id:032x}"
    assert [s["context"]["trace_id"] for s in steps] == [trace_id, trace_id]
    assert {s["parent_id"] for s in steps} == {_hex(request.get_span_context().span_id)}


def test_not_instrumented_specs_carry_no_trace_fields(traced: Traced, redis_url: str) -> None:
    m = traced.mod
    with traced.tracer.start_as_current_span("request"):
        traced_job = m.hello.with_options(job_id="traced-1").enqueue(n=3)
        RingfenceInstrumentor().uninstrument()
        plain_job = m.hello.with_options(job_id="plain-1").enqueue(n=3)
    broker = m.app.broker
    jobs = broker.keys.queue("default").jobs
    assert b'"tp":"00-' in broker.sync.hget(jobs, traced_job)
    assert b'"tp"' not in broker.sync.hget(jobs, plain_job)
    assert not RingfenceInstrumentor().is_instrumented_by_opentelemetry


HIDE = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
"""


def test_ringfence_runs_a_job_without_opentelemetry(redis_url: str, namespace: str, tmp_path: Path,
                                                    spawn_worker: Any) -> None:
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    env = {**os.environ, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_REDIS_URL": redis_url,
           "FENCE_URL": f"sqlite:///{tmp_path / 'f.db'}", "OTEL_MARKS": str(tmp_path),
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT / 'tests'}"}
    produce = ("import sys, ringfence, workerapp\n"
               "assert not any(m.startswith('opentelemetry') for m in sys.modules)\n"
               "print(workerapp.noop.enqueue(n=7))\n")
    out = subprocess.run([sys.executable, "-c", produce], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert job
    w = spawn_worker(env={"PYTHONPATH": env["PYTHONPATH"]})
    import redis

    r = redis.Redis.from_url(redis_url)
    wait_until(lambda: f"{job} 7".encode() in r.lrange(f"{namespace}:test:runs", 0, -1), timeout=30)
    _stop(w)
    missing = subprocess.run([sys.executable, "-c", "import ringfence.contrib.otel"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1] == (
        "ImportError: ringfence.contrib.otel needs OpenTelemetry's API: pip install 'ringfence[otel]'")
