"""``ringfence dashboard``: the web dashboard on one port (loopback by default)."""

from __future__ import annotations

import click

from ringfence.app import App
from ringfence.cli.base import app_option, main
from ringfence.errors import ConfigError

INSTALL = "the dashboard needs its extra: pip install 'ringfence[dashboard]'"


@main.command()
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", default=8787, show_default=True, help="port to listen on")
@click.option("--read-only", is_flag=True, help="show no action and accept none")
@click.option("--redact", default=None, envvar="RINGFENCE_DASHBOARD_REDACT",
              help="comma-separated words: a payload field whose name contains one is shown as [redacted] "
                   "(default: password, secret, token, key, card, auth, cvv, iban, email and more)")
def dashboard(app: App, host: str, port: int, read_only: bool, redact: str | None) -> None:
    """Web dashboard: queues, servers, jobs, fences, doctor; actions with RINGFENCE_DASHBOARD_TOKEN."""
    try:
        import uvicorn

        from ringfence.dashboard import create_app
    except ImportError as exc:
        raise ConfigError(f"{INSTALL} ({exc.name} is missing)") from exc
    fields = [f.strip() for f in redact.split(",") if f.strip()] if redact is not None else None
    web = create_app(app, read_only=read_only, redact=fields)
    import os

    mode = "read-only" if read_only else ("actions need the token" if os.environ.get("RINGFENCE_DASHBOARD_TOKEN")
                                           else "view only: set RINGFENCE_DASHBOARD_TOKEN to enable actions")
    click.echo(f"ringfence dashboard for {app.namespace} on http://{host}:{port}/ ({mode})")
    uvicorn.run(web, host=host, port=port, log_level="warning")
