"""What a worker did, at INFO: one line per task and queue every ``interval_s`` in which attempts of it finished
(how many were done, retried, dead-lettered, requeued; the run time's p95), none while it is idle.

Read from the counters the worker keeps for /metrics anyway (metrics.py): nothing more is done per job."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict

from ringfence.errors import ConfigError
from ringfence.metrics import Metrics
from ringfence.worker.loop import Loop

log = logging.getLogger("ringfence.worker")

DEFAULT_SUMMARY_S = 10.0
# outcome (metrics.OUTCOMES) -> its name in a summary, in the line's order
NAMES = {"ack": "done", "retry": "retried", "dead": "dead", "requeue": "requeued"}


def check_summary_s(value: float) -> float:
    if not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"--summary-s {value}: must be a number of seconds >= 0 (0: no summary lines)")
    return value


class Summary(Loop):
    name = "summary"

    def __init__(self, metrics: Metrics, interval_s: float = DEFAULT_SUMMARY_S) -> None:
        super().__init__(interval_s)
        self.metrics = metrics
        self.reported: dict[tuple[str, str, str], float] = {}  # (task, queue, outcome) -> count at the last line
        self.since = time.monotonic()  # when the counts were last read

    async def tick(self) -> None:
        self.report()

    async def stop(self) -> None:
        await super().stop()
        self.report()  # the jobs of the last, shorter interval

    def report(self) -> None:
        now = time.monotonic()
        news, seconds, self.since = self.news(), now - self.since, now
        p95 = self.metrics.duration_p95() if news else {}
        for (task, queue), counts in sorted(news.items()):
            shown = ", ".join(f"{n} {what}" for what, n in counts.items() if n)
            log.info("last %.0fs: %s; run time p95 %gs (last 200)", seconds, shown, p95.get(task, 0.0),
                     extra={"task": task, "queue": queue, "summary": {**counts, "p95_s": p95.get(task, 0.0)}})

    def news(self) -> dict[tuple[str, str], dict[str, int]]:
        """Attempts finished since the last report, per (task, queue) that has any."""
        now: dict[tuple[str, str, str], float] = {}
        for family in self.metrics.finished.collect():  # counts the held observations first
            for s in family.samples:
                if s.name.endswith("_total"):
                    now[(s.labels["task"], s.labels["queue"], s.labels["outcome"])] = s.value
        news: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: dict.fromkeys(NAMES.values(), 0))
        for (task, queue, outcome), value in now.items():
            n = int(value - self.reported.get((task, queue, outcome), 0.0))
            if n:
                news[(task, queue)][NAMES.get(outcome, outcome)] = n
        self.reported = now
        return news
