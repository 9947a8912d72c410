"""``ringfence dead list|show|replay|delete|prune``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
import orjson

from ringfence import queries
from ringfence.app import App
from ringfence.cli.base import app_option, main
from ringfence.cli.ops import print_json, print_table
from ringfence.errors import ConfigError
from ringfence.models import DeadJob
from ringfence.redis.keys import logical_queue

BATCH = 500  # ids per script call of replay and delete


def filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--queue", default=None, help="only this queue")(fn)
    fn = click.option("--task", default=None, help="only this task name")(fn)
    fn = click.option("--error", default=None, help="only errors containing this text")(fn)
    return click.option("--reason", default=None, help="only this reason (max_attempts, permanent, in_doubt, ...)")(fn)


def _select(app: App, ids: tuple[str, ...], all_: bool, **flt: str | None) -> list[DeadJob]:
    """The dead jobs named by ids or matched by the filters: in Redis, then those only in the failed_jobs
    table (Redis lost them). Refuses an id found in neither."""
    _require_selection(ids, all_, **flt)
    if ids:
        found = [j for j in (queries.find_dead(app.broker, i) for i in ids) if j is not None]
    else:
        found = queries.dead_jobs(app.broker, queries.DeadFilter(**flt))
    found += _sql_only(app, queries.DeadFilter(**flt), ids, {j.id for j in found})
    missing = [i for i in ids if i not in {j.id for j in found}]
    if missing:
        raise ConfigError(f"not in dead-letter: {', '.join(missing)}")
    return found


def _sql_only(app: App, flt: queries.DeadFilter, ids: tuple[str, ...] = (), seen: set[str] | None = None,
              limit: int | None = None) -> list[DeadJob]:
    """Dead jobs kept only in the failed_jobs table of this namespace (not replayed, not in Redis)."""
    failed = app.failed_jobs
    if failed is None:
        return []
    from ringfence.fence.failed import as_dead_job

    rows = [r for r in failed.unreplayed(list(ids) if ids else None) if r["job_id"] not in (seen or set())]
    jobs = [as_dead_job(r) for r in rows]
    if not ids:
        jobs = [j for j in jobs if flt.matches(j)
                and (not flt.queue or flt.queue in (j.queue, logical_queue(j.queue)))]
    out: list[DeadJob] = []
    for queue in sorted({j.queue for j in jobs}):
        of_queue = [j for j in jobs if j.queue == queue]
        present = app.broker.dead_present(queue, [j.id for j in of_queue])
        out += [j for j, p in zip(of_queue, present, strict=True) if not p]
    out.sort(key=lambda j: -j.died_ms)
    return out[:limit] if limit is not None else out


def _require_selection(ids: tuple[str, ...], all_: bool, **flt: str | None) -> None:
    if not ids and not all_ and not any(v is not None for v in flt.values()):
        raise ConfigError("name job ids, a filter (--task/--queue/--error/--reason), or --all")


@main.group()
def dead() -> None:
    """Dead-letter: jobs that ran out of attempts, failed permanently, expired or are parked in doubt."""


@dead.command("list")
@app_option
@filters
@click.option("--limit", default=50, show_default=True, help="at most this many jobs")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def list_(app: App, limit: int, as_json: bool, **flt: str | None) -> None:
    """Dead jobs, newest first; with a fence database also those only in its failed_jobs table (marked)."""
    f = queries.DeadFilter(**flt)
    jobs = queries.dead_jobs(app.broker, f, limit)
    if len(jobs) < limit:
        jobs += _sql_only(app, f, seen={j.id for j in jobs}, limit=limit - len(jobs))
    if as_json:
        print_json([j.to_dict() for j in jobs])
        return
    rows = [{"id": j.id + (" (malformed)" if j.malformed else "") + (" (sql only)" if j.source == "sql" else ""),
             "queue": j.queue, "task": j.task, "reason": j.reason, "attempts": j.attempts,
             "died": datetime.fromtimestamp(j.died_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S"),
             "error": j.error[:60]} for j in jobs]
    print_table("dead jobs (newest first)", rows, ["id", "queue", "task", "reason", "attempts", "died", "error"])


@dead.command()
@app_option
@click.argument("job_id")
def show(app: App, job_id: str) -> None:
    """One dead job as JSON (``"source": "sql"`` when only the failed_jobs table has it)."""
    job = queries.find_dead(app.broker, job_id)
    if job is None:
        found = _sql_only(app, queries.DeadFilter(), (job_id,))
        job = found[0] if found else None
    if job is None:
        raise ConfigError(f"not in dead-letter: {job_id}")
    print_json(job.to_dict())


@dead.command()
@app_option
@click.argument("ids", nargs=-1)
@filters
@click.option("--all", "all_", is_flag=True, help="every dead job (of --queue if given)")
def replay(app: App, ids: tuple[str, ...], all_: bool, **flt: str | None) -> None:
    """Run dead jobs again under the same id (fences still apply), attempts reset.

    With a fence database configured, jobs found only in its failed_jobs table (Redis lost them) are
    enqueued again from there."""
    done = replay_dead(app, ids, all_, **flt)
    note = f" ({done.restored} restored from the failed_jobs table)" if done.restored else ""
    click.echo(f"replayed {len(done.replayed)} job(s){note}")
    if done.malformed:
        click.echo(f"not replayed, malformed record(s) (see `ringfence dead show ID`, remove with "
                   f"`ringfence dead delete ID`): {' '.join(done.malformed[:20])}", err=True)


@dataclass(frozen=True)
class Replayed:
    replayed: list[str]  # ids enqueued again
    restored: int  # of them, from the failed_jobs table only (Redis had lost them)
    malformed: list[str]  # dead records too damaged to replay


def replay_dead(app: App, ids: tuple[str, ...] = (), all_: bool = False, **flt: str | None) -> Replayed:
    """``ringfence dead replay``: the jobs named or matched, from Redis or else from the failed_jobs table, then
    their rows marked replayed (the Django admin's replay action calls it too). An id in neither is refused."""
    jobs = _select(app, ids, all_, **flt)
    in_redis = [j for j in jobs if j.source == "redis" and not j.malformed]
    malformed = [j.id for j in jobs if j.malformed]
    done: list[str] = []
    for queue, batch in _batches(in_redis):  # bounded script calls, whatever the dead-letter's size
        replayed: list[str] = app.broker.run(app.broker.replay(queue, batch))
        done.extend(replayed)
    restored = 0
    sql_only = {j.id: j for j in jobs if j.source == "sql"}
    failed = app.failed_jobs
    if sql_only and failed is not None:
        payloads = {r["job_id"]: r["payload"] for r in failed.unreplayed(list(sql_only))}
        for queue, batch in _batches(list(sql_only.values())):
            specs = [(i, orjson.dumps(payloads[i]), 0) for i in batch if i in payloads]
            added = app.broker.run(app.broker.enqueue(queue, specs))
            app.broker.register_queues([queue])
            restored_ids = [spec[0] for spec, ok in zip(specs, added, strict=True) if ok is True]
            done.extend(restored_ids)
            restored += len(restored_ids)
    if failed is not None:
        for start in range(0, len(done), BATCH):
            failed.mark_replayed(done[start:start + BATCH])
    return Replayed(done, restored, malformed)


def _batches(jobs: list[DeadJob]) -> list[tuple[str, list[str]]]:
    """(queue, up to BATCH ids) groups: one script call each."""
    out: list[tuple[str, list[str]]] = []
    for queue in sorted({j.queue for j in jobs}):
        ids_ = [j.id for j in jobs if j.queue == queue]
        out += [(queue, ids_[start:start + BATCH]) for start in range(0, len(ids_), BATCH)]
    return out


@dead.command()
@app_option
@click.argument("ids", nargs=-1)
@filters
@click.option("--all", "all_", is_flag=True, help="every dead job (of --queue if given)")
def delete(app: App, ids: tuple[str, ...], all_: bool, **flt: str | None) -> None:
    """Delete dead jobs for good: from Redis and from the failed_jobs table."""
    jobs = _select(app, ids, all_, **flt)
    for queue, batch in _batches([j for j in jobs if j.source == "redis"]):
        app.broker.run(app.broker.delete_dead(queue, batch))
    failed = app.failed_jobs
    if failed is not None:
        every = [j.id for j in jobs]
        for start in range(0, len(every), BATCH):
            failed.delete(every[start:start + BATCH])
    click.echo(f"deleted {len({j.id for j in jobs})} job(s)")


@dead.command()
@app_option
@click.option("--older-than-days", type=float, required=True, help="delete dead jobs older than this (>= 0)")
def prune(app: App, older_than_days: float) -> None:
    """Explicit retention: delete dead jobs older than N days, in Redis and in the failed_jobs table
    (nothing is dropped unless you run this)."""
    if not older_than_days >= 0:  # also refuses NaN
        raise ConfigError(f"--older-than-days {older_than_days:g} must be >= 0")
    age_ms = int(older_than_days * 86_400_000)
    total = 0
    for queue in app.broker.queues():
        while True:
            n = app.broker.run(app.broker.delete_dead(queue, older_than_ms=age_ms, limit=BATCH))
            total += n
            if n < BATCH:
                break
    failed = app.failed_jobs
    rows = failed.prune(older_than_days * 86_400) if failed is not None else 0
    click.echo(f"deleted {total} job(s)" + (f" ({rows} failed_jobs row(s))" if failed is not None else ""))
