"""``ringfence outbox init|ddl|status|retry`` and ``ringfence relay``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ringfence.app import App
from ringfence.cli.base import app_option, dialect_option, main
from ringfence.cli.fence import require_fence_store
from ringfence.errors import ConfigError

if TYPE_CHECKING:
    from ringfence.outbox.store import OutboxStore


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
@dialect_option
def ddl(dialect: str) -> None:
    """Print the CREATE TABLE statement of the outbox (for Alembic or hand-run migrations)."""
    from ringfence.outbox import outbox_ddl

    click.echo(outbox_ddl(dialect))


@outbox.command()
@app_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status(app: App, as_json: bool) -> None:
    """Rows waiting for the relay, the relay holding the lease, and the parked rows with the reason of each."""
    from ringfence.cli.ops import print_json, print_table
    from ringfence.outbox.lag import outbox_lag

    lag = outbox_lag(app)
    if lag is None:
        raise ConfigError("no outbox table in the app's database (App(fence_url=...) or RINGFENCE_FENCE_URL); "
                          "create it with `ringfence outbox init --app APP`")
    parked = _store(app).parked()
    if as_json:
        print_json({**lag, "parked_rows": parked})
        return
    print_table("outbox", [{**lag, "relay": lag["relay"] or "none"}], ["waiting", "oldest_s", "parked", "relay"])
    if parked:
        print_table("parked rows (`ringfence outbox retry ID`)", parked,
                    ["id", "job_id", "queue", "task", "parked_at", "reason"])


@outbox.command()
@app_option
@click.argument("row_ids", nargs=-1, type=int, required=True)
def retry(app: App, row_ids: tuple[int, ...]) -> None:
    """Give parked rows back to the relay (by row id, as `ringfence outbox status` lists them). A row sent
    before is refused by Redis and, for a durable row, waits for its replicas again."""
    done = _store(app).retry(list(row_ids))
    click.echo(f"{len(done)} of {len(row_ids)} row(s) back to the relay")
    others = sorted(set(row_ids) - set(done))
    if others:
        raise ConfigError(f"row id(s) {', '.join(map(str, others))} are not parked rows of namespace {app.namespace}; "
                          "`ringfence outbox status` lists them")


def _store(app: App) -> OutboxStore:
    from ringfence.outbox.store import OutboxStore

    store = OutboxStore(require_fence_store(app).engine, app.namespace)
    store.check()
    return store


@main.command()
@app_option
@click.option("--once", is_flag=True, help="relay the rows waiting now, then exit (exit 2 if another relay "
                                            "holds the lease)")
@click.option("--batch", default=100, show_default=True, type=click.IntRange(min=1),
              help="rows per transaction (each batch is one SELECT ... FOR UPDATE, one Redis call per queue)")
@click.option("--interval-s", "interval_s", default=1.0, show_default=True,
              type=click.FloatRange(min=0.0, min_open=True),
              help="seconds between looks at the outbox when it is empty (or when another relay leads)")
@click.option("--interval", "interval_old", type=click.FloatRange(min=0.0, min_open=True), default=None,
              hidden=True)  # still parses in existing scripts; --interval-s like every other command
@click.option("--lease-s", "lease_s", default=10.0, show_default=True, type=click.FloatRange(min=0.0, min_open=True),
              help="seconds the relay lease lasts unless renewed (one relay at a time per namespace)")
def relay(app: App, once: bool, batch: int, interval_s: float, interval_old: float | None, lease_s: float) -> None:
    """Move committed rows of the outbox table (task.enqueue_in) to Redis, each once, in order per queue.

    Runs until SIGTERM or Ctrl-C (--once: until no row waits). One relay per namespace holds a lease in Redis
    and sends; others wait and take over when it stops or dies (within --lease-s). docs/outbox.md."""
    import signal

    from ringfence.outbox.relay import Relay

    r = Relay(app, batch=batch, lease_s=lease_s)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: r.stop.set())
    where = r.store.engine.url.render_as_string(hide_password=True)
    if not once:
        click.echo(f"relaying {where} (namespace {app.namespace}) to {app.broker.url}; Ctrl-C to stop", err=True)
    total = r.run(once=once, interval_s=interval_old if interval_old is not None else interval_s)
    parked = f", {r.counts.parked} parked: `ringfence outbox status`" if r.counts.parked else ""
    click.echo(f"relayed {total} row(s) ({r.counts.sent} sent, {r.counts.refused} refused as sent before{parked})")
