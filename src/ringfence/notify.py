"""The one way an alert leaves a process: the log, every ``app.on_alert`` hook as ``hook(kind, message,
details)``, and a webhook (JSON POST) when one is configured (``AlertRules(webhook_url=...)``).

Used by the alert rules (``alerts.AlertLoop``, ``ringfence watch``), by the worker for a job no worker can
read past ``grace_s``, and by ``app.alert(...)``. A failing hook is logged, never raised; the webhook is
posted from its own thread with exponential backoff, so a slow endpoint never blocks a worker."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson

log = logging.getLogger("ringfence.alerts")

AlertHook = Callable[[str, str, dict[str, Any]], Any]


class WebhookSender:
    """POSTs JSON from a daemon thread; each payload is retried with exponential backoff, then dropped
    with an error log. ``send`` never blocks."""

    def __init__(self, url: str, attempts: int = 5, backoff_s: float = 1.0, timeout_s: float = 5.0) -> None:
        self.url, self.attempts, self.backoff_s, self.timeout_s = url, attempts, backoff_s, timeout_s
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="ringfence-webhook", daemon=True)
        self._thread.start()

    def send(self, payload: dict[str, Any]) -> None:
        self._queue.put(payload)

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (up to ``timeout_s``), then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (payload := self._queue.get()) is not None:
            self._post(payload)

    def _post(self, payload: dict[str, Any]) -> None:
        body = orjson.dumps(payload, default=str)
        delay = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            req = urllib.request.Request(self.url, body, {"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    if 200 <= resp.status < 300:
                        return
            except OSError as exc:  # URLError, HTTPError and timeouts are all OSErrors
                log.warning("alert webhook attempt %d/%d failed: %s", attempt, self.attempts, exc)
            if attempt < self.attempts:
                time.sleep(delay)
                delay *= 2
        log.error("alert webhook gave up after %d attempts: %s", self.attempts, payload.get("key"))


class Notifier:
    """Delivers alerts to the log, the hooks (the App's list, read at each alert) and the webhook."""

    def __init__(self, hooks: list[AlertHook], webhook: WebhookSender | None = None) -> None:
        self.hooks = hooks
        self.webhook = webhook

    async def alert(self, kind: str, message: str, details: dict[str, Any], *, level: int = logging.ERROR,
                    line: str | None = None) -> None:
        log.log(level, "%s", line or f"ALERT [{kind}] {message}")
        if self.webhook is not None:
            self.webhook.send({"kind": kind, "message": message, **details})
        for hook in self.hooks:
            try:
                result = hook(kind, message, details)
                if asyncio.iscoroutine(result) or hasattr(result, "__await__"):
                    await result
            except Exception:
                log.exception("alert hook %r failed", hook)

    def close(self) -> None:
        if self.webhook is not None:
            self.webhook.close()
