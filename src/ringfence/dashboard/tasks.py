"""Per task type and queue: attempts, failure rate and run-time percentiles, summed over the live workers'
heartbeats (each reports its counts since it started and per minute of the last hour: metrics.task_stats)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ringfence.metrics import DURATION_BUCKETS

BOUNDS = (*DURATION_BUCKETS, float("inf"))


def quantile(counts: list[int], q: float) -> float | None:
    """The ``q`` quantile of a run-time histogram, interpolated inside its bucket as Prometheus'
    histogram_quantile does (past the last bound: that bound). None without observations."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = BOUNDS[i - 1] if i else 0.0
            if BOUNDS[i] == float("inf"):
                return low
            return round(low + (BOUNDS[i] - low) * (rank - seen) / n, 4)
        seen += n
    return BOUNDS[-2]


def _row(task: str, queue: str) -> dict[str, Any]:
    return {"task": task, "queue": queue, "finished": 0, "failed": 0, "buckets": [0] * len(BOUNDS),
            "minutes": defaultdict(lambda: [0, 0, [0] * len(BOUNDS)])}


def _add(row: dict[str, Any], entry: dict[str, Any]) -> None:
    row["finished"] += int(entry.get("finished", 0))
    row["failed"] += int(entry.get("failed", 0))
    for i, n in enumerate(entry.get("buckets", [])[:len(BOUNDS)]):
        row["buckets"][i] += int(n)
    for minute, finished, failed, runs in entry.get("minutes", []):
        m = row["minutes"][int(minute)]
        m[0], m[1] = m[0] + int(finished), m[1] + int(failed)
        for i, n in runs:
            if 0 <= i < len(BOUNDS):
                m[2][i] += int(n)


def task_rows(servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (queue, task) any live worker ran, sorted: its sums, failure rate and p50/p95 (seconds)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for server in servers:
        for entry in server.get("task_stats") or []:
            if isinstance(entry, dict) and "task" in entry and "queue" in entry:
                key = (str(entry["queue"]), str(entry["task"]))
                _add(rows.get(key) or rows.setdefault(key, _row(key[1], key[0])), entry)
    for row in rows.values():
        row["failure_rate"] = row["failed"] / row["finished"] if row["finished"] else 0.0
        row["p50_s"], row["p95_s"] = quantile(row["buckets"], 0.5), quantile(row["buckets"], 0.95)
    return [rows[k] for k in sorted(rows)]


def history(row: dict[str, Any], now_minute: int, minutes: int = 60) -> dict[str, list[float]]:
    """Per minute of the last ``minutes`` (oldest first): attempts finished, failed, and p95 run time (s)."""
    out: dict[str, list[float]] = {"finished": [], "failed": [], "p95": []}
    for minute in range(now_minute - minutes + 1, now_minute + 1):
        finished, failed, counts = row["minutes"].get(minute, (0, 0, []))
        out["finished"].append(finished)
        out["failed"].append(failed)
        out["p95"].append(quantile(counts, 0.95) or 0.0)
    return out
