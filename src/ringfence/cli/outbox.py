"""``ringfence outbox init|ddl`` and ``ringfence relay``."""

from __future__ import annotations

import click

from ringfence.app import App
from ringfence.cli import app_option, main
from ringfence.cli.fence import require_fence_store


@main.group()
def outbox() -> None:
    """The outbox table (task.enqueue_in) in the application's database (App(fence_url=...))."""


@outbox.command()
@app_option
def init(app: App) -> None:
    """Create the ringfence_outbox table if missing."""
    from ringfence.outbox import create_outbox

    engine = require_fence_store(app).engine
    create_outbox(engine)
    click.echo(f"outbox table ready in {engine.url.render_as_string(hide_password=True)}")


@outbox.command()
@click.option("--dialect", type=click.Choice(["postgresql", "mysql", "mariadb", "sqlite"]), required=True,
              help="the database the statements are for")
def ddl(dialect: str) -> None:
    """Print the CREATE TABLE statement of the outbox (for Alembic or hand-run migrations)."""
    from ringfence.outbox import outbox_ddl

    click.echo(outbox_ddl(dialect))
