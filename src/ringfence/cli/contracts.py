"""``ringfence contracts freeze|check``."""

from __future__ import annotations

from pathlib import Path

import click

from ringfence.app import App
from ringfence.cli.base import app_option, main
from ringfence.contracts import DEFAULT_DIR, check, freeze
from ringfence.errors import ConfigError


@main.group()
def contracts() -> None:
    """Frozen sample payloads per task and version: deploys must keep reading them."""


@contracts.command("freeze")
@app_option
@click.option("--dir", "folder", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True,
              help="folder of the frozen sample payloads")
@click.option("--force", is_flag=True, help="rewrite samples of the current versions too")
def freeze_cmd(app: App, folder: Path, force: bool) -> None:
    """Write one sample per task for its current version (old versions' samples are kept forever)."""
    written = freeze(app, folder, force=force)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"{len(written)} sample(s) written, {len(app.registry.tasks)} task(s)")


@contracts.command("check")
@app_option
@click.option("--dir", "folder", type=click.Path(path_type=Path), default=DEFAULT_DIR, show_default=True,
              help="folder of the frozen sample payloads")
def check_cmd(app: App, folder: Path) -> None:
    """Decode every frozen sample with the current code; exit 2 naming each one that broke."""
    checked, problems = check(app, folder)
    if problems:
        raise ConfigError(f"{len(problems)} of {checked} contract sample(s) broken:\n  " + "\n  ".join(problems))
    click.echo(f"{checked} contract sample(s) ok")
