"""``ringfence workflow show|cancel``."""

from __future__ import annotations

import click

from ringfence import workflows
from ringfence.app import App
from ringfence.cli.base import app_option, main
from ringfence.cli.ops import print_json
from ringfence.errors import ConfigError


@main.group()
def workflow() -> None:
    """A workflow (ringfence.chain, group, chord): show its steps, cancel it."""


@workflow.command()
@app_option
@click.argument("workflow_id")
def show(app: App, workflow_id: str) -> None:
    """The workflow as JSON: state (running, done, failed, cancelled), the names of its dead steps, and each
    step's job id, state, the steps it waits for, its result or its failure."""
    found = workflows.read(app, workflow_id)
    if found is None:
        raise ConfigError(f"no workflow {workflow_id!r} in namespace {app.namespace} (wrong id, or it expired: "
                          "finished workflows are kept for their result_ttl_s)")
    print_json(found.to_dict())


@workflow.command()
@app_option
@click.argument("workflow_id")
def cancel(app: App, workflow_id: str) -> None:
    """Cancel a workflow: steps not started never run, running ones see ``ctx.cancelled`` (their lease is taken
    back); it is kept for its result_ttl_s."""
    found, cancelled = workflows.cancel(app, workflow_id)
    click.echo(f"cancelled workflow {workflow_id} ({found.state}); {len(cancelled)} queued step job(s) cancelled"
               + (f": {' '.join(cancelled)}" if cancelled else ""))
