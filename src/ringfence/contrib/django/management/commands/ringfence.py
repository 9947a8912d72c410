"""``manage.py ringfence ...``: the ``ringfence`` command with ``--app`` taken from ``RINGFENCE["APP"]``.

``manage.py ringfence worker -q default -c 20`` is ``ringfence worker --app shop.jobs:app -q default -c 20``;
every subcommand and option of the CLI works the same (``manage.py ringfence --help``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError, CommandParser

ENTRY = "ringfence.contrib.django.entry:app"  # sets Django up in processes the worker starts, then RINGFENCE["APP"]


@contextmanager
def _app_from_settings() -> Iterator[None]:
    """RINGFENCE_APP for the CLI's ``--app`` (an explicit ``--app`` still wins), restored afterwards."""
    from ringfence.contrib.django import settings

    app, before = settings().app, os.environ.get("RINGFENCE_APP")
    if app and before is None:
        os.environ["RINGFENCE_APP"] = ENTRY
    try:
        yield
    finally:
        if app and before is None:
            os.environ.pop("RINGFENCE_APP", None)


def run(args: list[str], prog: str = "manage.py ringfence") -> int:
    """Run the ringfence CLI with ``args``; return its exit code (errors are printed by the CLI itself)."""
    from ringfence.cli import main

    with _app_from_settings():
        try:
            main.main(args=args, prog_name=prog, standalone_mode=False)
        except click.exceptions.Exit as exc:  # --help, --version
            return int(exc.exit_code)
        except click.ClickException as exc:  # a usage error: as click prints it standalone
            exc.show()
            return exc.exit_code
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            return 1
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


class Command(BaseCommand):
    help = "ringfence's CLI (worker, info, dead, fence, ...) with --app from settings.RINGFENCE['APP']"

    def run_from_argv(self, argv: list[str]) -> None:
        # Every argument is the CLI's (including --help); manage.py already handled --settings/--pythonpath.
        sys.exit(run(argv[2:]))

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs=argparse.REMAINDER, help="a ringfence subcommand and its options")

    def handle(self, *args: Any, **options: Any) -> None:
        """``call_command("ringfence", "dead", "list", "--json")``: output goes to the command's stdout/stderr;
        a non-zero exit becomes a CommandError carrying the code."""
        with redirect_stdout(self.stdout._out), redirect_stderr(self.stderr._out):
            code = run(list(args))
        if code:
            raise CommandError(f"ringfence {' '.join(args)} exited with {code}", returncode=code)
