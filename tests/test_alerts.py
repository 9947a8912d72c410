"""Alert rules: one evaluator by lease, one announcement per incident, a resolution, a retried webhook."""

from __future__ import annotations

import asyncio
import http.server
import threading
from dataclasses import replace
from typing import ClassVar

import orjson

from ringfence import App
from ringfence.alerts import AlertLoop, AlertRules
from ringfence.doctor import Thresholds
from ringfence.redis import observe
from ringfence.worker.worker import Worker
from support import FAST, wait_until

RULES = AlertRules(thresholds=Thresholds(sample_s=0.0), interval_s=0.1, lease_s=5.0)


def stalled_queue(app: App):
    @app.task(name="alerts.noop")
    async def noop(ctx, n: int) -> None: ...

    noop.enqueue(n=1)
    return noop


async def test_alert_fires_once_per_incident_and_resolves(make_app) -> None:
    app = make_app(environment="test")
    calls: list[tuple[str, str, dict]] = []
    app.on_alert(lambda kind, message, details: calls.append((kind, message, details)))
    stalled_queue(app)
    a, b = AlertLoop(app, RULES, owner="a"), AlertLoop(app, RULES, owner="b")
    assert await a.tick() == []  # the first tick only samples
    fired = await a.tick()
    assert {e.key for e in fired} == {"backlog_stalled:default", "queue_unserved:default"}
    assert await b.tick() == []   # b does not hold the lease
    assert await a.tick() == []   # still firing: not announced again
    assert set(await asyncio.to_thread(observe.incidents, app.broker)) == {e.key for e in fired}
    assert [c[2]["status"] for c in calls] == ["firing", "firing"]

    # a leaves; b takes over and does not announce the open incidents again.
    await asyncio.to_thread(a.evaluator.release)
    assert await b.tick() == [] and await b.tick() == []

    worker = Worker(app, alerts=False)  # a consumer arrives and drains the queue; only b evaluates
    runner = asyncio.create_task(worker.run())
    try:
        await asyncio.to_thread(wait_until, lambda: app.broker.queue_counts("default")["stats"].get("processed"))
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    resolved = await b.tick()
    assert {(e.key, e.status) for e in resolved} == {("backlog_stalled:default", "resolved"),
                                                      ("queue_unserved:default", "resolved")}
    assert await asyncio.to_thread(observe.incidents, app.broker) == {}
    assert [c[2]["status"] for c in calls] == ["firing", "firing", "resolved", "resolved"]
    assert await b.tick() == []
    await b.stop()


class FlakyReceiver(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = orjson.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        self.send_response(500 if len(self.bodies) == 1 else 200)  # the first delivery fails
        self.end_headers()

    def log_message(self, *args: object) -> None: ...


async def test_webhook_is_retried_in_the_background(make_app) -> None:
    app = make_app(environment="test")
    FlakyReceiver.bodies = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyReceiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_port}/hook"
    rules = AlertRules(thresholds=Thresholds(sample_s=0.0), interval_s=0.1, lease_s=5.0, webhook_url=url,
                       webhook_backoff_s=0.05, checks=("queue_unserved",))
    stalled_queue(app)
    loop = AlertLoop(app, rules)
    try:
        await loop.tick()
        [event] = await loop.tick()
        assert event.key == "queue_unserved:default"
        await asyncio.to_thread(wait_until, lambda: len(FlakyReceiver.bodies) == 2, 10)
    finally:
        await loop.stop()
        httpd.shutdown()
    first, retried = FlakyReceiver.bodies
    assert first == retried
    assert retried["kind"] == "queue_unserved" and retried["status"] == "firing"
    assert retried["numbers"]["waiting"] == 1 and retried["namespace"] == app.namespace


async def test_error_wave_of_one_unregistered_task_fires_once_then_resolves_once(make_app) -> None:
    """One job of a task no worker registers, deferred every defer_s: the deferral counter rises in some samples
    and not in others; the incident stays open while it keeps rising (within the wave window), and says what it
    saw — deferrals, not "0 job(s) dead"."""
    app = make_app(environment="test", worker=replace(FAST, defer_s=0.3))

    @app.task(name="alerts.known")
    async def known(ctx, n: int) -> None: ...

    producer = make_app(environment="test")

    @producer.task(name="alerts.gone")
    async def gone(ctx, n: int) -> None: ...

    gone.enqueue(n=1)
    rules = AlertRules(thresholds=Thresholds(sample_s=0.0, wave_window_s=3.0), checks=("error_wave",),
                       interval_s=0.1, lease_s=5.0)
    loop = AlertLoop(app, rules)
    events = []
    worker = Worker(app, alerts=False)  # its own alert loop would race this one for the lease
    runner = asyncio.create_task(worker.run())
    try:
        for _ in range(50):  # 5 s of evaluations, a deferral every 0.3 s
            events += await loop.tick()
            await asyncio.sleep(0.1)
        deferred = app.broker.queue_counts("default")["stats"].get("unknown_task", 0)
    finally:
        worker.request_stop()
        await asyncio.wait_for(runner, 10)
    assert int(deferred) >= 5, deferred
    assert [e.status for e in events] == ["firing"], [(e.status, e.message) for e in events]
    message = events[0].message
    assert "deferral(s)" in message and "whose task no worker registers (unknown_task)" in message
    assert "bad_payload" not in message and "0 job(s)" not in message
    assert "no live worker registers" in events[0].details["hypothesis"]
    try:
        for _ in range(60):  # the worker is gone: no more deferrals; the incident resolves once, after the window
            events += await loop.tick()
            await asyncio.sleep(0.1)
    finally:
        await loop.stop()
    assert [e.status for e in events] == ["firing", "resolved"], [(e.status, e.message) for e in events]
