"""``ringfence worker``."""

from __future__ import annotations

import sys

import click

from ringfence.app import App
from ringfence.cli import app_option, main
from ringfence.errors import ConfigError


@main.command()
@app_option
@click.option("--queues", "-q", default=None, help="name=weight,...  e.g. critical=6,default=3,low=1")
@click.option("--concurrency", "-c", default=10, show_default=True, help="jobs run at once per process")
@click.option("--processes", "-p", default=1, show_default=True, help="worker processes under one supervisor")
@click.option("--strict", is_flag=True, help="serve queues in the order given instead of by weight")
def worker(app: App, queues: str | None, concurrency: int, processes: int, strict: bool) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal exits at once)."""
    from ringfence.worker.supervisor import child_command, supervise
    from ringfence.worker.worker import parse_queues, run_worker

    if processes < 1:
        raise ConfigError(f"--processes {processes} must be >= 1")
    parsed = parse_queues(queues) if queues else None
    if processes > 1:
        app.check()  # refuse a bad configuration before starting anything
        sys.exit(supervise(child_command(sys.argv[1:]), processes))
    sys.exit(run_worker(app, parsed, concurrency=concurrency, strict=strict))
