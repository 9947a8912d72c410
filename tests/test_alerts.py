"""Alert rules: one evaluator by lease, one announcement per incident, a resolution, a retried webhook."""

from __future__ import annotations

import asyncio
import http.server
import threading
from typing import ClassVar

import orjson

from ringfence import App
from ringfence.alerts import AlertLoop, AlertRules
from ringfence.doctor import Thresholds
from ringfence.redis import observe
from ringfence.worker.worker import Worker
from support import wait_until

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

    worker = Worker(app)  # a consumer arrives and drains the queue
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
