"""``ringfence job show|cancel`` and ``ringfence queue purge``."""

from __future__ import annotations

from typing import Any

import click

from ringfence import jobs
from ringfence.app import App
from ringfence.cli.base import app_option, main
from ringfence.cli.ops import print_json, queue, queues_named
from ringfence.errors import ConfigError, DuplicateJob


@main.group()
def job() -> None:
    """One job, whatever its state: show it, cancel it; resend on-commit jobs Redis did not take."""


@job.command()
@app_option
@click.argument("job_id")
def show(app: App, job_id: str) -> None:
    """The job as JSON: queue, state, payload, attempts, history, error and traceback; a finished job of a task
    with store_result: state "done" and its result (until result_ttl_s)."""
    found = jobs.find_job(app, job_id)
    if found is None:
        raise ConfigError(f"no job {job_id!r} in namespace {app.namespace} (finished jobs are forgotten, unless "
                          "their task stores results: store_result=True)")
    print_json(found.to_dict())


@job.command()
@app_option
@click.argument("job_id")
def cancel(app: App, job_id: str) -> None:
    """Cancel a pending, scheduled, retrying or running job (a running one sees ``ctx.cancelled``). A job that
    owns a fence step past capture goes to dead-letter instead (its calling step becomes in_doubt)."""
    queue_name, left = jobs.cancel_job(app, job_id)
    click.echo(f"cancelled {job_id} (was {left} in {queue_name})")


@job.command()
@app_option
@click.argument("source", type=click.File("r"), default="-")
def resend(app: App, source: Any) -> None:
    """Send on-commit jobs that Redis did not take at commit time. SOURCE (default: stdin) holds their log
    lines ("on-commit job not sent ...", text or --log-json) or bare JSON records. Every line is checked
    first: one bad line and nothing is sent. Each job keeps its id, so a job still queued is reported and not
    sent twice."""
    from ringfence.cli.resend import read

    checked, refused, notes = read(app, source)
    for r in refused:
        click.echo(f"line {r.line}: {r.reason}", err=True)
    if refused:
        raise ConfigError(f"{len(refused)} line(s) refused (listed above); nothing sent: fix or remove them "
                          "and run again")
    for note in notes:
        click.echo(note)
    sent = queued = 0
    for c in checked:
        try:
            app.client.enqueue(c.task, c.args, c.options)
        except DuplicateJob:
            queued += 1
            click.echo(f"line {c.line}: {c.job_id}: queued already, not sent again")
            continue
        sent += 1
        click.echo(f"line {c.line}: {c.job_id}: sent")
    click.echo(f"{sent} sent, {queued} queued already")


@queue.command()
@app_option
@click.argument("name")
@click.option("--yes", is_flag=True, help="confirm: every pending job of NAME is deleted")
def purge(app: App, name: str, yes: bool) -> None:
    """Delete every pending job of queue NAME (scheduled, retrying, running and dead jobs stay)."""
    named = queues_named(app, name)  # a partitioned queue: every partition
    if not yes:
        raise ConfigError(f"purge deletes every pending job of {name}: add --yes to confirm")
    deleted = moved = 0
    for q in named:
        d, m = jobs.purge_queue(app, q)
        deleted, moved = deleted + d, moved + m
    note = f"; {moved} owning a fence step past capture moved to dead-letter" if moved else ""
    click.echo(f"purged {deleted} pending job(s) of {name}{note}")
