"""What each page shows, read from Redis and the fence database in bounded reads (never every job)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ringfence.dashboard.charts import buckets, line_chart, minute_labels
from ringfence.dashboard.tasks import history, task_rows
from ringfence.errors import FenceStoreError, FenceTablesMissing
from ringfence.queries import queue_gauges
from ringfence.redis.keys import logical_queue

if TYPE_CHECKING:
    from collections.abc import Callable

    from ringfence.app import App


def overview(app: App) -> dict[str, Any]:
    broker = app.broker
    now = broker.clock()
    minute = now // 60_000
    rows, total = [], {}  # type: ignore[var-annotated]
    for q in broker.queues():
        g = queue_gauges(broker, q)
        mins = broker.minutes(q)
        for key, v in mins.items():  # counts add up over queues; latency: the worst queue
            total[key] = max(total.get(key, 0), v) if key.startswith("l") else total.get(key, 0) + v
        # a queue no worker serves has no sample: its live latency counts for the current minute
        now_key = f"l{minute}"
        total[now_key] = max(total.get(now_key, 0), round(g["latency_s"] * 1000))
        rows.append({
            **{k: g[k] for k in ("queue", "pending", "active", "scheduled", "retry", "dead", "paused")},
            "processed_min": mins.get(f"p{minute - 1}", 0), "failed_min": mins.get(f"f{minute - 1}", 0),
            "processed": g["stats"].get("processed", 0), "failed": g["stats"].get("failed", 0),
            "latency_s": round(g["latency_s"], 1),
        })
    charts = minute_charts(total, minute, "worst queue")
    return {"queues": with_partitioned_totals(rows), "charts": charts, "environment": broker.environment(),
            "tasks": task_rows(broker.servers()), **in_doubt_count(app)}


_SUMMED = ("pending", "active", "scheduled", "retry", "dead", "processed_min", "failed_min", "processed", "failed")


def with_partitioned_totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows, each partitioned queue's partitions after one row of their sums under the queue's name
    (``partitions``: how many; the worst latency; paused when any partition is)."""
    out: list[dict[str, Any]] = []
    totals: dict[str, dict[str, Any]] = {}
    for row in rows:
        queue = logical_queue(row["queue"])
        if queue != row["queue"]:
            total = totals.get(queue)
            if total is None:
                total = totals[queue] = {**row, "queue": queue, "partitions": 0}
                out.append(total)
            else:
                for k in _SUMMED:
                    total[k] += row[k]
                total["latency_s"] = max(total["latency_s"], row["latency_s"])
                total["paused"] = total["paused"] or row["paused"]
            total["partitions"] += 1
        out.append(row)
    return out


IN_DOUBT_SHOWN = 200  # the overview counts in-doubt steps up to this many ("200 or more")


def in_doubt_count(app: App) -> dict[str, Any]:
    """``in_doubt``: in-doubt fence steps, read up to IN_DOUBT_SHOWN + 1 rows (None: no fence database);
    ``fence_error``: why they could not be read (the overview still shows the queues)."""
    store = app.fence_store_in_use()
    if store is None:
        return {"in_doubt": None, "fence_error": ""}
    try:
        return {"in_doubt": len(store.list_steps(state="in_doubt", limit=IN_DOUBT_SHOWN + 1)), "fence_error": ""}
    except (FenceStoreError, FenceTablesMissing) as exc:
        return {"in_doubt": None, "fence_error": str(exc)}


def minute_charts(counts: dict[str, int], minute: int, which: str, day: bool = True) -> list[Any]:
    """Throughput, failures and latency over the last hour (per minute) and day (per 15 minutes) from a
    ``P:minutes`` hash (or the sum of several; ``which``: whose latency it is)."""
    charts = []
    for label, minutes, step in (("last hour", 60, 1), ("last day", 1440, 15))[:2 if day else 1]:
        per, times = f"per {'minute' if step == 1 else f'{step} minutes'}", minute_labels(minute, minutes, step)
        left = "-60 min" if step == 1 else "-24 h"
        charts.append(line_chart(f"Throughput, {label} ({per})",
                                 [("processed", buckets(counts, "p", minute, minutes, step), "s-ok")], left,
                                 labels=times))
        charts.append(line_chart(f"Failures, {label} ({per})",
                                 [("failed attempts", buckets(counts, "f", minute, minutes, step), "s-bad")], left,
                                 labels=times))
        lat = buckets(counts, "l", minute, minutes, step, peak=True)
        charts.append(line_chart(f"Latency, {label} (oldest pending, {which}, s)",
                                 [("latency", [round(v / 1000, 1) for v in lat], "s-lat")], left, unit="s",
                                 totals=False, labels=times))
    return charts


def queue_charts(app: App, queue: str) -> list[Any]:
    """One queue's charts; its live latency counts for the current minute (a queue no worker serves)."""
    minute = app.broker.clock() // 60_000
    counts = dict(app.broker.minutes(queue))
    live = round(queue_gauges(app.broker, queue)["latency_s"] * 1000)
    counts[f"l{minute}"] = max(counts.get(f"l{minute}", 0), live)
    return minute_charts(counts, minute, queue, day=False)


def task_page(app: App, queue: str, task: str) -> dict[str, Any] | None:
    """One task type in one queue: its row of the overview and its last hour per minute (None: no live worker
    has run it)."""
    row = next((r for r in task_rows(app.broker.servers()) if r["queue"] == queue and r["task"] == task), None)
    if row is None:
        return None
    minute = app.broker.clock() // 60_000
    h, times = history(row, minute), minute_labels(minute, 60, 1)
    charts = [line_chart("Attempts finished, last hour (per minute)", [("finished", h["finished"], "s-ok")],
                         "-60 min", labels=times),
              line_chart("Failed attempts, last hour (per minute)", [("failed", h["failed"], "s-bad")], "-60 min",
                         labels=times),
              line_chart("Run time p95, last hour (per minute, s)", [("p95", h["p95"], "s-lat")], "-60 min",
                         unit="s", totals=False, labels=times)]
    return {"row": row, "charts": charts}


def whereabouts(app: App, job: Any) -> dict[str, Any]:
    """What the job page adds to ``ringfence job show``: the worker running it and since when (from the live
    workers' heartbeats), when a scheduled or retrying job is due, and the host of each attempt's worker."""
    live = {s.get("id"): s for s in app.broker.servers()}
    out: dict[str, Any] = {"hosts": {i: f"{s.get('host', '?')} pid {s.get('pid', '?')}" for i, s in live.items()}}
    if job.state == "active":
        runner = next((s for s in live.values() if job.id in (s.get("running") or [])), None)
        if runner is not None:
            out["worker"] = runner.get("id")
            out["since_ms"] = (runner.get("running_since_ms") or {}).get(job.id, 0)
    elif job.state in ("scheduled", "retry") and job.source == "redis":
        k = app.broker.keys.queue(job.queue)
        due = app.broker.sync.zscore(k.retry if job.state == "retry" else k.scheduled, job.id)
        out["due_ms"] = int(due) if due is not None else 0
    return out


def due_times(app: App, queue: str, state: str, ids: list[str]) -> dict[str, int]:
    """When each scheduled or retrying job of a page is due (ms; one round trip); nothing for other states. A job
    that left the state meanwhile has none."""
    if state not in ("scheduled", "retry") or not ids:
        return {}
    k = app.broker.keys.queue(queue)
    p = app.broker.sync.pipeline(transaction=False)
    for job_id in ids:
        p.zscore(k.retry if state == "retry" else k.scheduled, job_id)
    return {job_id: int(due) for job_id, due in zip(ids, p.execute(), strict=True) if due is not None}


def servers(app: App) -> list[dict[str, Any]]:
    from ringfence import queries

    now = app.broker.clock() / 1000
    out = []
    for s in queries.servers(app.broker):
        out.append({**s, "running_n": len(s.get("running", [])), "beat_age_s": round(now - s.get("heartbeat", now), 1),
                    "up_s": int(now - s.get("started", now))})
    return out


def fences(app: App) -> dict[str, Any]:
    store = app.fence_store_in_use()
    if store is None:
        return {"store": False, "counts": {}, "in_doubt": [], "errors": {}, "requests": {}}
    from ringfence import queries
    from ringfence.fence.reads import state_counts

    rows = store.list_steps(state="in_doubt", limit=200)
    errors = {}  # the owner's dead-letter error: what its last attempt saw (evidence for the person resolving)
    for owner in {r.owner_job_id for r in rows if r.owner_job_id}:
        dead = queries.find_dead(app.broker, owner)
        if dead is not None:
            errors[owner] = dead.error
    requests = {(r.subject, r.step): _decoded(r.request) for r in rows if r.request is not None}
    return {"store": True, "counts": state_counts(store), "in_doubt": rows, "errors": errors, "requests": requests}


class DoctorView:
    """The doctor refreshed live: each request compares with the snapshot of the previous one (or samples
    ``min_gap_s`` apart when that one is missing or stale)."""

    def __init__(self, min_gap_s: float = 0.5, stale_s: float = 60.0) -> None:
        self.min_gap_s, self.stale_s = min_gap_s, stale_s
        self.last: tuple[float, Any] | None = None

    def findings(self, app: App) -> list[Any]:
        from ringfence.doctor import Context, Snapshot, Thresholds, run_checks

        before = self.last[1] if self.last and time.monotonic() - self.last[0] < self.stale_s else None
        if before is None:
            before = Snapshot.take(app.broker)
            time.sleep(self.min_gap_s)
        after = Snapshot.take(app.broker)
        self.last = (time.monotonic(), after)
        return run_checks(Context(app, before, after, Thresholds(sample_s=self.min_gap_s)))


def reconcile_step(app: App, step: str) -> tuple[str, str]:
    """(what the page says about the provider's records of ``step``, a one-line error or "")."""
    if app.fence_store_in_use() is None:
        return "", "no fence database configured (App(fence_url=...) or RINGFENCE_FENCE_URL)"
    from ringfence.fence.reads import state_counts

    if step not in app.reconcile_sources and step not in state_counts(app.fence_store):
        return "", f"no fence step {step[:80]!r}"
    source = app.reconcile_sources.get(step)
    if source is None:
        return "none declared (app.reconcile_source): the fence rows are checked alone", ""
    if callable(source):
        return f"the function {getattr(source, '__qualname__', repr(source))}", ""
    ref = f", reference column {source.reference_column}" if source.reference_column else ""
    return f"the table {source.table} (subject column {source.subject_column}{ref})", ""


def reconcile(app: App, step: str, redact: Callable[[Any], Any]) -> tuple[dict[str, Any] | None, str]:
    """``ringfence reconcile`` of one step against what the App declares for it: (report, or None; one line)."""
    from ringfence.errors import RingfenceError
    from ringfence.reconcile import declared_effects
    from ringfence.reconcile import reconcile as run

    try:
        report = run(app, step, declared_effects(app, step)).to_dict()
    except RingfenceError as exc:
        return None, str(exc).splitlines()[0]
    for item in report["stale_in_doubt"]:  # the stored request is JSON: decoded, so redaction sees its fields
        item["request"] = redact(_decoded(item.get("request")))
    return report, ""


def _decoded(raw: Any) -> Any:
    try:
        return json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return raw
