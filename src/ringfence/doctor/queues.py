"""Queue checks: no consumer, a forgotten queue, starvation, retry storms and the future load they carry."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from ringfence.doctor.context import Context
from ringfence.doctor.model import Finding, Status, check
from ringfence.errors import BadRecord
from ringfence.models import JobSpec
from ringfence.redis import observe


@check("backlog_stalled", "every queue with a backlog is being processed")
def backlog_stalled(ctx: Context) -> Iterator[Finding]:
    for name, q in ctx.after.queues.items():
        if q["pending"] == 0 or q["paused"] or ctx.delta(name, "processed") > 0:
            continue
        listed = ctx.after.listed_by(name)
        if not ctx.after.servers:
            hypothesis = "no worker is running on this namespace (or workers run against another Redis)"
            remedy = "start a worker; check `ringfence servers` and the workers' RINGFENCE_REDIS_URL/NAMESPACE"
        elif not listed:
            hypothesis = "no live worker lists this queue in --queues"
            remedy = f"add {name} to a worker's --queues (see `ringfence servers`)"
        else:
            hypothesis = "the workers that list this queue are busy, stuck, or connected to another Redis"
            remedy = "check their running jobs (`ringfence servers`), timeouts and concurrency"
        status = Status.WARNING if q["active"] else Status.FAILURE
        yield Finding(
            "backlog_stalled", status, subject=name,
            symptom=(f"queue {name}: {q['pending']} pending, processed flat at {ctx.after.stat(name, 'processed')} "
                     f"over {ctx.elapsed_s:.1f}s, latency {q['latency_s']:.1f}s, {q['active']} active"),
            hypothesis=hypothesis, remedy=remedy,
            numbers={"pending": q["pending"], "active": q["active"], "latency_s": q["latency_s"],
                     "processed": ctx.after.stat(name, "processed"), "sample_s": round(ctx.elapsed_s, 2),
                     "servers_listing": len(listed)})


@check("queue_unserved", "every queue with jobs is listed by a live server")
def queue_unserved(ctx: Context) -> Iterator[Finding]:
    for name, q in ctx.after.queues.items():
        waiting = q["pending"] + q["scheduled"] + q["retry"]
        if waiting == 0 or ctx.after.listed_by(name):
            continue
        served = sorted({queue for s in ctx.after.servers for queue in (s.get("queues") or {})})
        yield Finding(
            "queue_unserved", Status.FAILURE, subject=name,
            symptom=(f"queue {name} holds {waiting} job(s) ({q['pending']} pending, {q['scheduled']} scheduled, "
                     f"{q['retry']} retry) and none of {len(ctx.after.servers)} live server(s) lists it "
                     f"(they serve: {', '.join(served) or 'nothing'})"),
            hypothesis="the queue was forgotten in a worker's --queues (or its workers are all down)",
            remedy=f"start a worker with --queues including {name}",
            numbers={"waiting": waiting, "servers": len(ctx.after.servers), "served_queues": served})


@check("starvation", "no queue waits much longer than the others")
def starvation(ctx: Context) -> Iterator[Finding]:
    t = ctx.thresholds
    served = {n: q for n, q in ctx.after.queues.items() if ctx.after.listed_by(n) and not q["paused"]}
    high = {n: q for n, q in served.items() if q["latency_s"] >= t.latency_warn_s}
    low = {n: q for n, q in served.items() if q["latency_s"] < t.latency_warn_s / t.starvation_ratio}
    if not high or not low:
        return  # every queue slow (or none) is a capacity problem, not starvation
    fast = ", ".join(f"{n} {q['latency_s']:.1f}s" for n, q in sorted(low.items()))
    for name, q in high.items():
        weights = {s["id"]: (s.get("queues") or {}).get(name) for s in ctx.after.listed_by(name) if "id" in s}
        yield Finding(
            "starvation", Status.WARNING, subject=name,
            symptom=(f"queue {name}: latency {q['latency_s']:.1f}s (>= {t.latency_warn_s:g}s) with "
                     f"{q['pending']} pending, while {fast}"),
            hypothesis="one queue starves: low weight, a strict order that serves it last, or shared capacity",
            remedy="raise its weight, give it separate workers, or lower the concurrency of the busy queues",
            numbers={"latency_s": q["latency_s"], "pending": q["pending"], "weights": weights,
                     "others_latency_s": {n: v["latency_s"] for n, v in low.items()}})


@check("retry_storm", "no retry set is large or growing fast")
def retry_storm(ctx: Context) -> Iterator[Finding]:
    t = ctx.thresholds
    for name, q in ctx.after.queues.items():
        before = ctx.before.queues.get(name, {}).get("retry", 0)
        growth = q["retry"] - before
        if q["retry"] < t.retry_warn and growth < t.retry_growth_warn:
            continue
        yield Finding(
            "retry_storm", Status.WARNING, subject=name,
            symptom=(f"queue {name}: {q['retry']} job(s) waiting to retry ({growth:+d} in {ctx.elapsed_s:.1f}s), "
                     f"failed {ctx.after.stat(name, 'failed')} in total ({ctx.delta(name, 'failed'):+d})"),
            hypothesis="a retry explosion: a dependency fails and every job retries into it",
            remedy=("lower max_attempts, mark permanent errors, use a per-task retry profile or a circuit breaker "
                    "on the dependency; see future_load for what the backlog will still cost"),
            numbers={"retry": q["retry"], "growth": growth, "failed_delta": ctx.delta(name, "failed")})


@check("future_load", "no dependency faces a large backlog x remaining attempts", cheap=False)
def future_load(ctx: Context) -> Iterator[Finding]:
    loads = future_loads(ctx)
    for dep, (jobs, attempts) in sorted(loads.items()):
        if attempts < ctx.thresholds.future_load_warn:
            continue
        yield Finding(
            "future_load", Status.WARNING, subject=dep,
            symptom=(f"{dep}: {jobs} job(s) waiting with up to {attempts} attempt(s) left in total "
                     f"(>= {ctx.thresholds.future_load_warn})"),
            hypothesis="when the dependency comes back, the backlog times its remaining attempts hits it at once",
            remedy="drain or pause the backlog, lower max_attempts, open the circuit breaker, add rate limits",
            numbers={"jobs": jobs, "remaining_attempts": attempts})


def future_loads(ctx: Context) -> dict[str, tuple[int, int]]:
    """Per dependency (the task's ``dependency``, else ``queue:<name>``): (jobs waiting, remaining attempts),
    scaled up from a sample of at most 1,000 jobs per queue."""
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name in ctx.after.queues:
        sample, total = observe.waiting_jobs(ctx.broker, name)
        scale = total / len(sample) if sample else 0.0
        for head, size, started in sample:
            try:
                spec = JobSpec.decode_head(head, size)
            except BadRecord:
                continue  # dead-lettered as bad_record when a worker fetches it
            dep, max_attempts = _task_facts(ctx, spec, name)
            acc = out[dep]
            acc[0] += scale
            acc[1] += scale * max(0, max_attempts - started)
    return {dep: (round(j), round(a)) for dep, (j, a) in out.items()}


def _task_facts(ctx: Context, spec: JobSpec, queue: str) -> tuple[str, int]:
    task: Any = ctx.app.registry.get(spec.task)
    dependency = None
    max_attempts = ctx.app.default_retry.max_attempts
    if task is not None:
        # `dependency` arrives with circuit breakers; absent, the queue stands for the dependency.
        dependency = getattr(task, "dependency", None) or getattr(task.options, "dependency", None)
        max_attempts = task.options.retry.max_attempts
    return (dependency or f"queue:{queue}"), spec.max_attempts or max_attempts
