"""``ringfence fence init|ddl|list|show|resolve|prune``."""

from __future__ import annotations

from typing import Any

import click

from ringfence.app import App
from ringfence.cli.base import app_option, dialect_option, main
from ringfence.cli.ops import print_json, print_table
from ringfence.errors import ConfigError


def _row(r: Any) -> dict[str, Any]:
    return {
        "subject": r.subject, "step": r.step, "state": str(r.state), "epoch": r.epoch,
        "owner_job_id": r.owner_job_id, "provider_key": r.provider_key, "reference": r.reference,
        "request": r.request_value, "result": r.result_value, "retention_s": r.retention_s,
        "created_at": _iso(r.created_at), "updated_at": _iso(r.updated_at), "calling_at": _iso(r.calling_at),
        "completed_at": _iso(r.completed_at),
    }


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def require_fence_store(app: App) -> Any:
    """The app's fence store; the CLI never falls back to creating ./ringfence.db."""
    if not app.fence_url:
        raise ConfigError("no fence database: give --app with App(fence_url=...) or set RINGFENCE_FENCE_URL")
    return app.fence_store


@main.group()
def fence() -> None:
    """Fences in the application's database (App(fence_url=...) or RINGFENCE_FENCE_URL)."""


@fence.command()
@app_option
def init(app: App) -> None:
    """Create the fence and failed_jobs tables if missing, and upgrade a failed_jobs table from before
    namespaces (adds the namespace column; rows without one are given this app's namespace)."""
    from ringfence.fence import create_all
    from ringfence.fence.failed import FailedJobs

    engine = require_fence_store(app).engine
    create_all(engine)
    added, assigned = FailedJobs(engine, namespace=app.namespace).upgrade(assign_unowned=True)
    if added or assigned:
        click.echo(f"failed_jobs: {'added the namespace column; ' if added else ''}"
                   f"{assigned} row(s) without a namespace now belong to namespace {app.namespace}")
    click.echo(f"fence tables ready in {engine.url.render_as_string(hide_password=True)}")


@fence.command()
@dialect_option
def ddl(dialect: str) -> None:
    """Print the CREATE TABLE statements (for Alembic or hand-run migrations)."""
    from ringfence.fence import ddl as make_ddl

    click.echo(make_ddl(dialect))


@fence.command("list")
@app_option
@click.option("--state", default=None, help="claimed, calling, effected, completed, in_doubt")
@click.option("--subject", default=None, help="only this subject, e.g. order:42")
@click.option("--limit", default=100, show_default=True, help="at most this many rows")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def list_(app: App, state: str | None, subject: str | None, limit: int, as_json: bool) -> None:
    """Fence rows, latest first."""
    rows = [_row(r) for r in require_fence_store(app).list_steps(state=state, subject=subject, limit=limit)]
    if as_json:
        print_json(rows)
        return
    print_table("fences (latest first)", rows,
                ["subject", "step", "state", "epoch", "owner_job_id", "reference", "updated_at"])


@fence.command()
@app_option
@click.argument("subject")
@click.argument("step")
def show(app: App, subject: str, step: str) -> None:
    """One fence row as JSON (state, epoch, owner, reference, request and result)."""
    row = require_fence_store(app).get(subject, step)
    if row is None:
        raise ConfigError(f"no fence {subject!r}/{step!r}")
    print_json(_row(row))


@fence.command()
@app_option
@click.argument("subject")
@click.argument("step")
@click.option("--done", "happened", flag_value=True, default=None, help="the effect happened (give --reference)")
@click.option("--not-done", "happened", flag_value=False, help="the effect did not happen: the next run calls again")
@click.option("--reference", default=None, help="the provider's reference, with --done")
def resolve(app: App, subject: str, step: str, happened: bool | None, reference: str | None) -> None:
    """Settle an in-doubt step by hand, then replay its job with ``ringfence dead replay``."""
    row = resolve_step(app, subject, step, happened, reference)
    click.echo(f"{subject}/{step}: now {row.state} (epoch {row.epoch}); replay the job to finish it")


def resolve_step(app: App, subject: str, step: str, happened: bool | None, reference: str | None) -> Any:
    """``ringfence fence resolve``'s checks and write (the Django admin's resolve action calls it too)."""
    if happened is None:
        raise ConfigError("say --done --reference REF or --not-done")
    if happened and not reference:
        raise ConfigError("--done needs --reference (the provider's id of the effect)")
    from ringfence.errors import FenceError, FenceStoreError

    try:
        return require_fence_store(app).resolve(subject, step, happened=happened, reference=reference)
    except FenceStoreError:
        raise  # the database failed (exit 3), not the step
    except FenceError as exc:
        raise ConfigError(str(exc)) from exc


@fence.command()
@app_option
def prune(app: App) -> None:
    """Delete completed fences past their step's retention (rows without retention are kept forever)."""
    click.echo(f"deleted {require_fence_store(app).prune()} fence row(s)")
