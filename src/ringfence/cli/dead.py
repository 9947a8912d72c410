"""``ringfence dead list|show|replay|delete|prune``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
import orjson

from ringfence import inspect
from ringfence.app import App
from ringfence.cli import app_option, main
from ringfence.cli.ops import print_json, print_table
from ringfence.errors import ConfigError
from ringfence.models import DeadJob

BATCH = 500  # ids per script call of replay and delete


def filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--queue", default=None, help="only this queue")(fn)
    fn = click.option("--task", default=None, help="only this task name")(fn)
    fn = click.option("--error", default=None, help="only errors containing this text")(fn)
    return click.option("--reason", default=None, help="only this reason (max_attempts, permanent, in_doubt, ...)")(fn)


def _select(app: App, ids: tuple[str, ...], all_: bool, **flt: str | None) -> list[DeadJob]:
    _require_selection(ids, all_, **flt)
    if ids:
        found = [inspect.find_dead(app.broker, i) for i in ids]
        missing = [i for i, j in zip(ids, found, strict=True) if j is None]
        if missing:
            raise ConfigError(f"not in dead-letter: {', '.join(missing)}")
        return [j for j in found if j is not None]
    return inspect.dead_jobs(app.broker, inspect.DeadFilter(**flt))


def _require_selection(ids: tuple[str, ...], all_: bool, **flt: str | None) -> None:
    if not ids and not all_ and not any(v is not None for v in flt.values()):
        raise ConfigError("name job ids, a filter (--task/--queue/--error/--reason), or --all")


@main.group()
def dead() -> None:
    """Dead-letter: jobs that ran out of attempts, failed permanently, expired or are parked in doubt."""


@dead.command("list")
@app_option
@filters
@click.option("--limit", default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def list_(app: App, limit: int, as_json: bool, **flt: str | None) -> None:
    jobs = inspect.dead_jobs(app.broker, inspect.DeadFilter(**flt), limit)
    if as_json:
        print_json([j.to_dict() for j in jobs])
        return
    rows = [{"id": j.id + (" (malformed)" if j.malformed else ""), "queue": j.queue, "task": j.task,
             "reason": j.reason, "attempts": j.attempts,
             "died": datetime.fromtimestamp(j.died_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S"),
             "error": j.error[:60]} for j in jobs]
    print_table("dead jobs (newest first)", rows, ["id", "queue", "task", "reason", "attempts", "died", "error"])


@dead.command()
@app_option
@click.argument("job_id")
def show(app: App, job_id: str) -> None:
    job = inspect.find_dead(app.broker, job_id)
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
    _require_selection(ids, all_, **flt)
    if ids:
        in_redis = [j for j in (inspect.find_dead(app.broker, i) for i in ids) if j is not None]
    else:
        in_redis = inspect.dead_jobs(app.broker, inspect.DeadFilter(**flt))
    malformed = [j.id for j in in_redis if j.malformed]
    done: list[str] = []
    for queue in sorted({j.queue for j in in_redis}):
        ids_ = [j.id for j in in_redis if j.queue == queue and not j.malformed]
        for start in range(0, len(ids_), BATCH):  # bounded script calls, whatever the dead-letter's size
            replayed: list[str] = app.broker.run(app.broker.replay(queue, ids_[start:start + BATCH]))
            done.extend(replayed)
    seen = {j.id for j in in_redis}
    restored = 0
    for row in _durable_rows(app, ids, all_, **flt):
        if row["job_id"] in seen:
            continue
        seen.add(row["job_id"])
        queue, job_id = row["queue"], row["job_id"]
        if app.broker.run(app.broker.enqueue(queue, [(job_id, orjson.dumps(row["payload"]), 0)]))[0]:
            app.broker.register_queues([queue])
            done.append(job_id)
            restored += 1
    if app.failed_jobs is not None:
        app.failed_jobs.mark_replayed(done)
    missing = [i for i in ids if i not in seen]
    note = f" ({restored} restored from the failed_jobs table)" if restored else ""
    click.echo(f"replayed {len(done)} job(s){note}")
    if malformed:
        click.echo(f"not replayed, malformed record(s) (see `ringfence dead show ID`, remove with "
                   f"`ringfence dead delete ID`): {' '.join(malformed[:20])}", err=True)
    if missing:
        raise ConfigError(f"not in dead-letter: {', '.join(missing)}")


def _durable_rows(app: App, ids: tuple[str, ...], all_: bool, **flt: str | None) -> list[dict[str, Any]]:
    """failed_jobs rows (not replayed yet) matching the selection; empty without a fence database."""
    failed = app.failed_jobs
    if failed is None:
        return []
    from ringfence.fence.failed import as_dead_job

    rows = failed.unreplayed(list(ids) if ids else None)
    f = inspect.DeadFilter(**flt)
    return [r for r in rows if (ids or all_ or f.matches(as_dead_job(r))) and (not f.queue or r["queue"] == f.queue)]


@dead.command()
@app_option
@click.argument("ids", nargs=-1)
@filters
@click.option("--all", "all_", is_flag=True)
def delete(app: App, ids: tuple[str, ...], all_: bool, **flt: str | None) -> None:
    """Delete dead jobs for good."""
    jobs = _select(app, ids, all_, **flt)
    done = 0
    for queue in sorted({j.queue for j in jobs}):
        ids_ = [j.id for j in jobs if j.queue == queue]
        for start in range(0, len(ids_), BATCH):
            done += app.broker.run(app.broker.delete_dead(queue, ids_[start:start + BATCH]))
    click.echo(f"deleted {done} job(s)")


@dead.command()
@app_option
@click.option("--older-than-days", type=float, required=True, help="delete dead jobs older than this")
def prune(app: App, older_than_days: float) -> None:
    """Explicit retention: delete dead jobs older than N days (nothing is dropped unless you run this)."""
    total = 0
    for queue in app.broker.queues():
        total += app.broker.run(app.broker.delete_dead(queue, older_than_ms=int(older_than_days * 86_400_000)))
    click.echo(f"deleted {total} job(s)")
