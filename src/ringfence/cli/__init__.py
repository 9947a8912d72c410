"""The ``ringfence`` command."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from ringfence.app import App, load_app
from ringfence.errors import RingfenceError


def app_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--app module:attr`` (or RINGFENCE_APP); without it, an App from the environment (read-only commands)."""

    @click.option("--app", "app_path", envvar="RINGFENCE_APP", help="module:attr of your App (env RINGFENCE_APP)")
    @functools.wraps(fn)
    def wrapper(app_path: str | None, **kwargs: Any) -> Any:
        app = load_app(app_path) if app_path else App()
        return fn(app, **kwargs)

    return wrapper


class Group(click.Group):
    """Prints ringfence errors as one clear line and exits 2, instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RingfenceError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=Group)
@click.option("--log-level", default="INFO", envvar="RINGFENCE_LOG_LEVEL", show_default=True)
@click.option("--log-json/--log-text", default=None, help="one JSON object per log line (env RINGFENCE_LOG_JSON)")
def main(log_level: str, log_json: bool | None) -> None:
    """ringfence: a Redis job queue where the second run is empty."""
    from ringfence.logs import cli_configure

    cli_configure(log_level, log_json)


from ringfence.cli import contracts, dead, demo, fence, observe, ops, worker  # noqa: E402  (commands register on import)

__all__ = ["contracts", "dead", "demo", "fence", "main", "observe", "ops", "worker"]
