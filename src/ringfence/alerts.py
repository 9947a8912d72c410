"""Alerts: the doctor's cheap checks evaluated every few seconds by one process at a time.

One evaluator holds a Redis lease (``<ns>:alerts:leader``); workers running :class:`AlertLoop` and any
``ringfence watch`` compete for it, so rules run once per namespace. Each finding at or above
``min_status`` opens an incident in Redis (``<ns>:alerts``); only the process that opens it announces it,
and only the one that closes it (the condition is gone) announces the resolution: one alert per incident,
whoever evaluates.

Delivery, for each event, through the notifier (notify.py): the log; every ``app.on_alert`` hook as
``hook(kind, message, details)`` with ``details["status"]`` = ``"firing"`` or ``"resolved"``; and a webhook
(JSON POST) from a background thread, retried with exponential backoff, so a slow endpoint never blocks a worker.

Example::

    rules = AlertRules(thresholds=Thresholds(latency_warn_s=120), webhook_url="https://hooks.example/rf")
    loop = AlertLoop(app, rules)      # in a worker: loop.start() ... await loop.stop()
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from ringfence.app import App
from ringfence.doctor import Context, Finding, Snapshot, Status, Thresholds, run_checks
from ringfence.doctor.model import SEVERITY
from ringfence.models import new_job_id
from ringfence.notify import Notifier, WebhookSender
from ringfence.offloop import HOP
from ringfence.redis import observe
from ringfence.worker.loop import Loop

log = logging.getLogger("ringfence.alerts")

DEFAULT_CHECKS = ("backlog_stalled", "queue_unserved", "environment", "error_wave", "retry_storm", "starvation",
                  "in_doubt", "eviction")


@dataclass(frozen=True)
class AlertRules:
    """Which doctor checks raise alerts, their thresholds, the cadence and where alerts go."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    checks: tuple[str, ...] = DEFAULT_CHECKS
    min_status: Status = Status.WARNING
    interval_s: float = 15.0
    lease_s: float = 45.0                 # the evaluator lease; renewed every tick, so > interval_s
    webhook_url: str | None = None
    webhook_attempts: int = 5
    webhook_backoff_s: float = 1.0        # doubled after each failed POST
    webhook_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.lease_s <= self.interval_s:
            raise ValueError(f"lease_s={self.lease_s} must exceed interval_s={self.interval_s}, "
                             "or the evaluator loses its lease between two ticks")


@dataclass(frozen=True)
class AlertEvent:
    """One announcement: an incident started firing, or resolved."""

    kind: str            # the check's name
    status: str          # firing | resolved
    key: str             # incident key: check:subject
    message: str
    details: dict[str, Any]


class AlertEvaluator:
    """Evaluates the rules once per ``evaluate()`` call while holding the lease (sync: Redis and SQL reads)."""

    def __init__(self, app: App, rules: AlertRules, owner: str | None = None) -> None:
        self.app = app
        self.rules = rules
        self.owner = owner or f"{socket.gethostname()}.{os.getpid()}.{new_job_id()[:6]}"
        self._prev: Snapshot | None = None
        self._last_firing: dict[str, int] = {}  # incident key -> Redis ms of the latest tick that found it

    def evaluate(self) -> list[AlertEvent]:
        """Events to announce now. The first tick after taking the lease only samples (deltas need two)."""
        broker = self.app.broker
        if not observe.acquire_lease(broker, self.owner, self.rules.lease_s):
            self._prev = None
            return []
        now = Snapshot.take(broker)
        prev, self._prev = self._prev, now
        if prev is None:
            return []
        ctx = Context(self.app, prev, now, self.rules.thresholds)
        firing = {f.incident_key: f for f in run_checks(ctx, self.rules.checks, with_ok=False)
                  if SEVERITY[f.status] >= SEVERITY[self.rules.min_status]}
        now_ms = broker.clock()
        self._last_firing.update(dict.fromkeys(firing, now_ms))
        return self._open(firing) + self._close(firing, now_ms)

    def hold_ms(self, check: str) -> int:
        """How long an incident of ``check`` stays open after its condition was last seen. error_wave counts
        deferrals between two samples: one job deferred every ``defer_s`` shows in one sample and not the
        next, so its incident holds for the wave window, the look-back of its dead-job count too."""
        return int(self.rules.thresholds.wave_window_s * 1000) if check == "error_wave" else 0

    def _open(self, firing: dict[str, Finding]) -> list[AlertEvent]:
        events = []
        for key, f in firing.items():
            record = {"since": self.app.broker.clock(), "message": f.symptom, "status": str(f.status)}
            if observe.open_incident(self.app.broker, key, record):
                events.append(AlertEvent(f.check, "firing", key, f.symptom, {
                    "status": "firing", "key": key, "severity": str(f.status), "subject": f.subject,
                    "hypothesis": f.hypothesis, "remedy": f.remedy, "numbers": f.numbers,
                    "namespace": self.app.namespace, "since_ms": record["since"]}))
        return events

    def _close(self, firing: dict[str, Finding], now_ms: int) -> list[AlertEvent]:
        events = []
        for key in observe.incidents(self.app.broker):
            check = key.partition(":")[0]
            if key in firing or check not in self.rules.checks:
                continue  # still firing, or a rule this evaluator does not run
            # An evaluator that took over the lease has not seen the incident: it holds from now.
            if now_ms - self._last_firing.setdefault(key, now_ms) < self.hold_ms(check):
                continue
            self._last_firing.pop(key, None)
            record = observe.close_incident(self.app.broker, key)
            if record is None:
                continue
            lasted = (self.app.broker.clock() - record["since"]) / 1000
            events.append(AlertEvent(check, "resolved", key, f"resolved after {lasted:.0f}s: {record['message']}", {
                "status": "resolved", "key": key, "namespace": self.app.namespace, "since_ms": record["since"],
                "duration_s": round(lasted, 1)}))
        return events

    def release(self) -> None:
        observe.release_lease(self.app.broker, self.owner)


def notifier(app: App, rules: AlertRules) -> Notifier:
    """The notifier of ``app`` with the webhook of ``rules`` (notify.py: the one way an alert is sent)."""
    webhook = (WebhookSender(rules.webhook_url, rules.webhook_attempts, rules.webhook_backoff_s,
                             rules.webhook_timeout_s) if rules.webhook_url else None)
    return Notifier(app.alert_hooks, webhook)


async def deliver(notifier: Notifier, event: AlertEvent) -> None:
    level = logging.WARNING if event.status == "firing" else logging.INFO
    await notifier.alert(event.kind, event.message, event.details, level=level,
                         line=f"ALERT {event.status} [{event.key}] {event.message}")


class AlertLoop(Loop):
    """The alert rules as a worker background loop: ``start()`` / ``await stop()``, or ``await tick()``.

    Every worker may run one; the lease lets one evaluate at a time. Evaluation runs in a thread, so the
    Redis and SQL reads never block the event loop; delivery to the webhook is queued to its own thread.
    """

    name = "alerts"

    def __init__(self, app: App, rules: AlertRules | None = None, *, owner: str | None = None) -> None:
        self.rules = rules or AlertRules()
        super().__init__(self.rules.interval_s)
        self.evaluator = AlertEvaluator(app, self.rules, owner)
        self.notifier = notifier(app, self.rules)

    async def tick(self) -> list[AlertEvent]:  # type: ignore[override]
        events = await HOP.run(self.evaluator.evaluate)
        for event in events:
            await deliver(self.notifier, event)
        return events

    async def stop(self) -> None:
        await super().stop()
        await HOP.run(self.evaluator.release)
        self.notifier.close()


async def watch(app: App, rules: AlertRules, iterations: int | None = None) -> None:
    """``ringfence watch``: evaluate every ``interval_s`` until cancelled (or ``iterations`` ticks)."""
    loop = AlertLoop(app, rules)
    n = 0
    try:
        while iterations is None or n < iterations:
            await loop.tick()
            n += 1
            await asyncio.sleep(rules.interval_s)
    finally:
        await HOP.run(loop.evaluator.release)
        loop.notifier.close()
