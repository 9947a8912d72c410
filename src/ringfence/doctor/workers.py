"""Worker and configuration checks: environment, error waves after starts, orphans, shutdown timeout,
timeouts vs leases, the Redis eviction policy and its memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ringfence.doctor.context import Context
from ringfence.doctor.model import Finding, Status, check
from ringfence.errors import BadRecord, ConfigError
from ringfence.models import DeadJob, JobSpec
from ringfence.redis import observe
from ringfence.redis.topology import promotion


@check("environment", "every live server runs the namespace's environment")
def environment(ctx: Context) -> Iterator[Finding]:
    recorded = ctx.after.environment
    expected = recorded or ctx.app.environment
    # "default" is what an App built from a bare environment gets: a read-only shell, not a misconfiguration.
    if recorded is not None and ctx.app.environment not in (recorded, "default"):
        yield Finding(
            "environment", Status.WARNING, subject="app",
            symptom=f"namespace {ctx.app.namespace!r} belongs to {recorded!r}; this app says {ctx.app.environment!r}",
            hypothesis="this command (or the app module) is configured for another environment",
            remedy="check RINGFENCE_ENV / App(environment=...) and RINGFENCE_REDIS_URL of this shell",
            numbers={"recorded": recorded, "app": ctx.app.environment})
    for s in ctx.after.servers:
        env = s.get("environment")
        if env == expected:
            continue
        yield Finding(
            "environment", Status.FAILURE, subject=str(s.get("id", "")),
            symptom=(f"server {s.get('id')} (host {s.get('host')}, pid {s.get('pid')}) heartbeats on namespace "
                     f"{ctx.app.namespace!r} with environment {env!r}; the namespace belongs to {expected!r}"),
            hypothesis="a worker of another environment (staging pointed at production) shares this Redis",
            remedy="stop it and fix its RINGFENCE_REDIS_URL / RINGFENCE_NAMESPACE / RINGFENCE_ENV",
            numbers={"server_environment": env, "namespace_environment": expected})


@check("error_wave", "no burst of unreadable payloads after a worker start")
def error_wave(ctx: Context) -> Iterator[Finding]:
    t = ctx.thresholds
    now_s = ctx.broker.clock() / 1000  # died_ms and servers' start times are on the Redis clock
    cutoff_ms = int((now_s - t.wave_window_s) * 1000)
    for name in ctx.after.queues:
        bad = _recent_dead(ctx, name, cutoff_ms, {"bad_payload"})
        newer, unknown = ctx.delta(name, "newer_version"), ctx.delta(name, "unknown_task")
        if len(bad) < t.wave_warn and newer <= 0 and unknown <= 0:
            continue
        first = min(bad, default=None)
        starts = sorted(s["started"] for s in ctx.after.servers
                        if s.get("started") and (first is None or s["started"] * 1000 <= first + 1000))
        after_start = f"; the latest server start was {now_s - starts[-1]:.0f}s ago" if starts else ""
        took = f"in {ctx.elapsed_s:.1f}s"
        seen = [f"{len(bad)} job(s) dead with bad_payload in the last {t.wave_window_s:g}s" if bad else "",
                f"{unknown} deferral(s) {took} of jobs whose task no worker registers (unknown_task)"
                if unknown > 0 else "",
                f"{newer} deferral(s) {took} of payloads newer than the workers read (newer_version)"
                if newer > 0 else ""]
        yield Finding(
            "error_wave", Status.WARNING, subject=name,
            symptom=f"queue {name}: {'; '.join(s for s in seen if s)}{after_start}",
            hypothesis=_wave_why(bool(bad), unknown > 0, newer > 0),
            remedy="version the payload (version=N + upcaster), run `ringfence contracts check`, then "
                   "`ringfence dead replay --reason bad_payload` once fixed; a job of an unregistered task waits "
                   "grace_s for a worker that registers it, then goes to dead-letter (reason unknown_task)",
            numbers={"bad_payload": len(bad), "deferred_delta": newer + unknown, "unknown_task_delta": unknown,
                     "newer_version_delta": newer, "window_s": t.wave_window_s,
                     "server_started": starts[-1] if starts else None})


def _wave_why(bad: bool, unknown: bool, newer: bool) -> str:
    why = []
    if bad or newer:
        why.append("a deploy changed a payload format without a version (or workers run older code)")
    if unknown:
        why.append("a job names a task no live worker registers (renamed or removed in a deploy, or the "
                   "producer runs newer code than the workers)")
    return "; ".join(why)


def _recent_dead(ctx: Context, queue: str, cutoff_ms: int, reasons: set[str]) -> list[int]:
    """died_ms of dead jobs with one of ``reasons`` since ``cutoff_ms`` (newest first, stops at the cutoff)."""
    b, offset = ctx.broker, 0
    out: list[int] = []
    while True:
        ids = b.dead_ids(queue, offset, 200)
        if not ids:
            return out
        offset += len(ids)
        for job_id, raw in b.dead_records(queue, ids):
            job = DeadJob.decode(queue, job_id, raw)  # survives a malformed record
            if job.died_ms < cutoff_ms:
                return out
            if job.reason in reasons:
                out.append(job.died_ms)


@check("orphaned", "no attempt was orphaned recently", cheap=False)
def orphaned(ctx: Context) -> Iterator[Finding]:
    window = ctx.thresholds.orphan_window_s
    now_ms = ctx.broker.clock()
    cutoff_ms = now_ms - int(window * 1000)
    for name in ctx.after.queues:
        total = ctx.after.stat(name, "orphaned")
        if not total:
            continue
        # The history goes with an acked job, so a recovered job that then succeeded leaves only the counter
        # and the time of the latest orphan (set by the recover script).
        last_ms = ctx.after.stat(name, "orphaned_last_ms")
        recent = [e for e in observe.history_sample(ctx.broker, name)
                  if e.get("orphaned") and int(e.get("at", 0)) >= cutoff_ms]
        if not recent and last_ms < cutoff_ms:
            continue
        ago = f", the latest {max(0, now_ms - last_ms) / 1000:.0f}s ago" if last_ms else ""
        yield Finding(
            "orphaned", Status.WARNING, subject=name,
            symptom=(f"queue {name}: attempts orphaned within the last {window:g}s{ago} ({total} since the start, "
                     f"{len(recent)} on jobs still in Redis); their workers died or stopped heartbeating while "
                     "the jobs ran"),
            hypothesis=_orphan_cause(ctx, name, last_ms),
            remedy="give the platform's kill grace > shutdown_timeout_s > job durations; fence every external "
                   "effect so the rerun is empty",
            numbers={"recent": len(recent), "total": total,
                     "last_s_ago": round((now_ms - last_ms) / 1000, 1) if last_ms else None})


def _orphan_cause(ctx: Context, queue: str, last_ms: int) -> str:
    """A failover rolls leases back to the promoted replica's copy: live workers' jobs look orphaned. Named when
    the master was promoted and workers of the queue live now were live before the latest orphan."""
    promoted = promotion(ctx.broker) if last_ms else None
    survivors = [s for s in ctx.after.listed_by(queue) if float(s.get("started", 0)) * 1000 < last_ms]
    if promoted is None or not survivors:
        return "workers killed mid-job (SIGKILL, OOM, a deploy whose grace is shorter than the jobs)"
    return (f"a Redis failover: master {promoted.address} was promoted from a replica whose leases lagged the "
            f"renewals the old master took; {len(survivors)} worker(s) of the queue were live before the latest "
            "orphan and still are, so no worker need have died (the jobs ran again)")


@check("stuck_active", "every active job has a live lease or a live worker to recover it")
def stuck_active(ctx: Context) -> Iterator[Finding]:
    grace_s = ctx.thresholds.stuck_grace_s
    for name, q in ctx.after.queues.items():
        if not q["active"]:
            continue
        expired, oldest_s = observe.expired_leases(ctx.broker, name)
        if ctx.after.servers and (not expired or oldest_s < grace_s):
            continue  # live workers recover expired leases every recover_interval_s
        if not ctx.after.servers:
            symptom = (f"queue {name}: {q['active']} job(s) active but no live worker on this namespace "
                       f"({expired} past their lease, the oldest by {oldest_s:.0f}s)")
            hypothesis = "the worker that ran them died (SIGKILL, OOM, a lost host); only a live worker recovers them"
            remedy = "start a worker on this namespace: it returns the jobs to the queue (marked orphaned)"
        else:
            symptom = (f"queue {name}: {expired} active job(s) past their lease for up to {oldest_s:.0f}s "
                       f"(>= {grace_s:g}s) although {len(ctx.after.servers)} worker(s) are live")
            hypothesis = "the live workers do not recover them: they run against another Redis or namespace, or hang"
            remedy = "check the workers' RINGFENCE_REDIS_URL/NAMESPACE (`ringfence servers`) and their logs"
        yield Finding("stuck_active", Status.FAILURE, subject=name, symptom=symptom, hypothesis=hypothesis,
                      remedy=remedy, numbers={"active": q["active"], "expired": expired,
                                              "oldest_expired_s": round(oldest_s, 1),
                                              "servers": len(ctx.after.servers)})


@check("shutdown_timeout", "jobs finish within the servers' shutdown_timeout_s")
def shutdown_timeout(ctx: Context) -> Iterator[Finding]:
    for name in ctx.after.queues:
        requeued = ctx.after.stat(name, "requeued_on_shutdown")
        abandoned = ctx.after.stat(name, "abandoned_on_shutdown")
        if requeued or abandoned:
            timeouts = sorted({float(s["shutdown_timeout_s"]) for s in ctx.after.listed_by(name)
                               if s.get("shutdown_timeout_s") is not None})
            yield Finding(
                "shutdown_timeout", Status.WARNING, subject=name,
                symptom=(f"queue {name}: {requeued + abandoned} job(s) were still running when their worker's "
                         f"shutdown timeout ended ({requeued} went back to the queue, {abandoned} sync one(s) came "
                         f"back when their lease lapsed, an attempt burned; servers' shutdown_timeout_s: "
                         f"{timeouts or 'n/a'})"),
                hypothesis="shutdown_timeout_s is shorter than the jobs, so every deploy interrupts them",
                remedy="raise shutdown_timeout_s (and the platform's kill grace), make handlers watch ctx.cancelled",
                numbers={"requeued_on_shutdown": requeued, "abandoned_on_shutdown": abandoned,
                         "shutdown_timeout_s": timeouts})
    for s in ctx.after.servers:
        yield from _slow_tasks(s)


def _slow_tasks(server: dict[str, Any]) -> Iterator[Finding]:
    # `duration_p95_s` ({task: seconds}) appears once workers report it in their heartbeat.
    limit = server.get("shutdown_timeout_s")
    p95 = server.get("duration_p95_s") or {}
    slow = {task: d for task, d in p95.items() if limit is not None and d > limit}
    if slow:
        yield Finding(
            "shutdown_timeout", Status.WARNING, subject=str(server.get("id", "")),
            symptom=f"server {server.get('id')}: shutdown_timeout_s={limit} but p95 durations {slow}",
            hypothesis="a deploy will interrupt these tasks mid-run",
            remedy="raise shutdown_timeout_s above the p95 durations, or split the tasks",
            numbers={"shutdown_timeout_s": limit, "slow_p95_s": slow})


@check("timeouts", "every task's and waiting job's timeout is below max_lease_s", cheap=False)
def timeouts(ctx: Context) -> Iterator[Finding]:
    try:
        ctx.app.check()
    except ConfigError as exc:
        problems = exc.problems
        yield Finding(
            "timeouts", Status.FAILURE, subject="app",
            symptom=f"{len(problems)} configuration problem(s): " + "; ".join(map(str, problems)),
            hypothesis="a job can outlive its lease (or expire while waiting to retry): it would run twice",
            remedy="apply the fix named in each problem", numbers={"problems": list(map(str, problems))})
    max_lease_ms = int(ctx.app.worker_settings.max_lease_s * 1000)
    for name in ctx.after.queues:
        sample, _ = observe.waiting_jobs(ctx.broker, name)
        # A producer with other settings may enqueue a per-job timeout these workers cannot honour.
        over = [t for t in (_timeout_ms(head, size) for head, size, _ in sample) if t and t >= max_lease_ms]
        if over:
            yield Finding(
                "timeouts", Status.FAILURE, subject=name,
                symptom=(f"queue {name}: {len(over)} waiting job(s) carry timeout_s up to {max(over) / 1000:g} "
                         f">= the workers' max_lease_s={max_lease_ms / 1000:g}"),
                hypothesis="a producer with other settings enqueued per-job timeouts the lease cannot cover: the "
                           "lease ends while the job still runs and it runs twice",
                remedy="align the producer's and workers' max_lease_s, or enqueue with a shorter timeout_s",
                numbers={"jobs": len(over), "max_timeout_s": max(over) / 1000,
                         "max_lease_s": max_lease_ms / 1000})


@check("eviction", "Redis never evicts keys without a TTL")
def eviction(ctx: Context) -> Iterator[Finding]:
    policy = observe.config_value(ctx.broker, "maxmemory-policy", ctx.primaries())
    if policy is None:
        yield Finding("eviction", Status.SKIPPED, symptom="CONFIG GET is disabled on this Redis",
                      remedy="check the maxmemory-policy in your provider's console: it must not be allkeys-*")
    elif policy.startswith("allkeys-"):
        maxmemory = observe.config_value(ctx.broker, "maxmemory", ctx.primaries())
        yield Finding(
            "eviction", Status.FAILURE, subject="redis",
            symptom=f"maxmemory-policy is {policy} (maxmemory {maxmemory}): Redis may evict job keys under pressure",
            hypothesis="a Redis shared with a cache; jobs and leases vanish silently when memory runs out",
            remedy="use a Redis with noeviction (or volatile-*: job keys carry no TTL), or a separate instance",
            numbers={"policy": policy, "maxmemory": maxmemory})


@check("memory", "Redis has room below maxmemory (or runs without a limit)")
def memory(ctx: Context) -> Iterator[Finding]:
    used, limit, policy = observe.memory(ctx.broker, ctx.primaries())
    t = ctx.thresholds
    if not limit or used < limit * t.memory_warn_ratio:
        return
    ratio = used / limit
    full = ratio >= t.memory_fail_ratio
    yield Finding(
        "memory", Status.FAILURE if full else Status.WARNING, subject="redis",
        symptom=(f"Redis uses {used / 1048576:.1f}mb of maxmemory {limit / 1048576:.1f}mb ({ratio:.0%}, "
                 f"policy {policy})"),
        hypothesis=("at maxmemory every enqueue is refused (workers still finish, ack and drain what is queued)"
                    if policy == "noeviction" or policy.startswith("volatile-") else
                    "at maxmemory Redis evicts keys, job keys included"),
        remedy="raise maxmemory, prune old dead jobs (`ringfence dead prune --older-than-days 30`), or move caches "
               "to another Redis",
        numbers={"used_memory": used, "maxmemory": limit, "ratio": round(ratio, 3), "policy": policy})


@check("redis_version", "Redis runs scripts flagged allow-oom (Redis 7+), or has no maxmemory")
def redis_version(ctx: Context) -> Iterator[Finding]:
    versions = _versions(ctx.broker, ctx.primaries())
    oldest = min(versions, key=_version_key, default=None)
    if oldest is None or _version_key(oldest) >= (7,):
        return
    used, limit, policy = observe.memory(ctx.broker, ctx.primaries())
    if not limit:
        return
    yield Finding(
        "redis_version", Status.WARNING, subject="redis",
        symptom=f"Redis {oldest} with maxmemory {limit / 1048576:.1f}mb: at maxmemory it refuses the workers' "
                "lease renewals and acks (script flags, allow-oom, need Redis 7)",
        hypothesis="a full Redis lets leases lapse while their jobs still run: other workers take the jobs and "
                   "they run twice",
        remedy="upgrade to Redis 7 or later, or run this Redis without maxmemory and watch its memory",
        numbers={"redis_version": oldest, "maxmemory": limit, "used_memory": used, "policy": policy})


def _versions(broker: Any, nodes: Any = "primaries") -> list[str]:
    """``redis_version`` of every primary (``INFO server``), or of ``nodes`` on a Cluster."""
    if broker.cluster:
        found: Any = broker.sync.info("server", target_nodes=nodes)
        infos = list(found.values())
    else:
        infos = [broker.sync.info("server")]
    return [str(i["redis_version"]) for i in infos if "redis_version" in i]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def _timeout_ms(head: bytes, size: int) -> int | None:
    try:
        return JobSpec.decode_head(head, size).timeout_ms
    except BadRecord:
        return None  # dead-lettered as bad_record when a worker fetches it
