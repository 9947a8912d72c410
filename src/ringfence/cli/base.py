"""The ``ringfence`` command group and what every command shares: ``--app`` and one-line errors.
Commands live in the sibling modules and register on ``main`` when ``ringfence.cli`` imports them."""

from __future__ import annotations

import functools
import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click

from ringfence.app import App, load_app
from ringfence.errors import CannotConnect, ConfigError, FenceStoreError, RingfenceError
from ringfence.redis.connect import cannot_connect

#: ``--dialect`` of the commands that print DDL (``fence ddl``, ``outbox ddl``).
dialect_option = click.option("--dialect", type=click.Choice(["postgresql", "mysql", "mariadb", "sqlite"]),
                              required=True, help="the database the statements are for")


def check_port(option: str, port: int | None) -> None:
    """Refuse a TCP port outside 0-65535 in one line, before anything starts."""
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"{option} {port} is not a TCP port: use 0-65535 (0: any free port)")


def app_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--app module:attr`` (or RINGFENCE_APP); without it, an App from the environment (read-only commands)."""

    @click.option("--app", "app_path", envvar="RINGFENCE_APP", help="module:attr of your App (env RINGFENCE_APP)")
    @functools.wraps(fn)
    def wrapper(app_path: str | None, **kwargs: Any) -> Any:
        app = load_app(app_path) if app_path else App()
        click.get_current_context().meta["ringfence.app"] = app  # names the Redis URL in connection errors
        return fn(app, **kwargs)

    return wrapper


class Group(click.Group):
    """Prints ringfence errors as one clear line instead of a traceback: exit 2 for a refused input or
    configuration, exit 3 when Redis or the fence database cannot be reached or refuses the login or a command
    (``CannotConnect``, ``NotPermitted``, ``FenceStoreError``). ``--debug`` adds the traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FenceStoreError as exc:
            found = _database_trouble(exc, getattr(ctx.meta.get("ringfence.app"), "fence_url", None))
            self._fail(ctx, f"error: {exc if found is None else found[0]}", 3)
        except RingfenceError as exc:
            app = ctx.meta.get("ringfence.app")
            lost = isinstance(exc, CannotConnect) or cannot_connect(exc, getattr(app, "declared_redis_url", None))
            self._fail(ctx, f"error: {exc}", 3 if lost else 2)
        except Exception as exc:
            app = ctx.meta.get("ringfence.app")
            line = cannot_connect(exc, getattr(app, "declared_redis_url", None))
            if line is not None:
                self._fail(ctx, f"error: {line}", 3)
            found = _database_trouble(exc, getattr(app, "fence_url", None))
            if found is None:
                raise
            self._fail(ctx, f"error: {found[0]}", 3 if found[1] else 2)

    @staticmethod
    def _fail(ctx: click.Context, line: str, code: int) -> None:
        if ctx.params.get("debug"):
            traceback.print_exc()
        click.echo(line, err=True)
        sys.exit(code)


def _database_trouble(exc: Exception, fence_url: str | None) -> tuple[str, bool] | None:
    if not fence_url:
        return None
    from ringfence.fence.schema import unusable_database  # SQLAlchemy is loaded only on this error path

    return unusable_database(exc, fence_url)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")  # named in the error; logging takes WARN, FATAL too


@click.group(cls=Group)
@click.version_option(package_name="ringfence", prog_name="ringfence")
@click.option("--log-level", default="INFO", envvar="RINGFENCE_LOG_LEVEL", show_default=True,
              help="DEBUG, INFO, WARNING or ERROR (env RINGFENCE_LOG_LEVEL)")
@click.option("--log-json/--log-text", default=None, help="one JSON object per log line (env RINGFENCE_LOG_JSON)")
@click.option("--debug", is_flag=True, envvar="RINGFENCE_DEBUG", help="print the traceback of an error too")
def main(log_level: str, log_json: bool | None, debug: bool) -> None:
    """ringfence: a Redis job queue where the second run is empty."""
    from ringfence.logs import cli_configure

    if log_level.upper() not in logging.getLevelNamesMapping():
        raise ConfigError(f"--log-level {log_level!r} is not a log level: use {', '.join(LOG_LEVELS)}")
    cli_configure(log_level, log_json)
