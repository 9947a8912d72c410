"""``ringfence demo``: the double charge, then the same chaos with a fence. No servers needed."""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import click

from ringfence.cli.base import main

ROWS = [
    ("orders", "orders"),
    ("charges", "provider charges"),
    ("double_charged_orders", "orders charged twice"),
    ("fence_rows", "fence rows"),
    ("in_doubt", "in doubt (parked)"),
    ("dead", "dead jobs"),
    ("kills", "workers SIGKILLed"),
    ("seconds", "seconds"),
]


@main.command()
@click.option("--orders", "n_orders", default=200, show_default=True, help="orders to charge per run")
@click.option("--workers", default=2, show_default=True, help="worker processes per run")
@click.option("--concurrency", default=4, show_default=True, help="jobs at once per worker process")
@click.option("--kill-probability", type=float, default=None,
              help="chance that a worker is SIGKILLed right after the provider's 200 [default: about 15 kills/run]")
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON on stdout")
def demo(n_orders: int, workers: int, concurrency: int, kill_probability: float | None, as_json: bool) -> None:
    """Charge orders with workers SIGKILLed after the provider's 200: naive handler vs fenced handler.

    Runs on an embedded Redis, SQLite files and a fake payment provider process, all temporary.
    """
    from ringfence.demo.run import DemoConfig, run_demo

    cfg = DemoConfig(orders=n_orders, workers=workers, concurrency=concurrency, kill_probability=kill_probability)
    # SIGTERM tears down like Ctrl-C: the run's `finally` stops every process and removes the temp dir.
    # SIGINT too, explicitly: a shell starts background jobs with SIGINT ignored.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    started = time.monotonic()
    with _progress(cfg.orders) as progress:
        results = run_demo(cfg, progress)
    figures: dict[str, Any] = {mode: r.as_dict() for mode, r in results.items()}
    figures["settings"] = {"orders": cfg.orders, "workers": cfg.workers, "concurrency": cfg.concurrency,
                           "kill_probability": cfg.probability, "seconds": round(time.monotonic() - started, 1)}
    if as_json:
        click.echo(json.dumps(figures, indent=2))
    else:
        _print_table(figures)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


class _progress:
    """A rich progress bar on stderr (stdout stays clean for ``--json``), one line per run."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.total = total
        self.bar = Progress(TextColumn("{task.description:>7}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("kills: {task.fields[kills]}"), TimeElapsedColumn(),
                            console=Console(stderr=True))
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _progress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def __call__(self, mode: str, done: int, kills: int) -> None:
        if mode not in self.tasks:
            self.tasks[mode] = self.bar.add_task(mode, total=self.total, kills=0)
        self.bar.update(self.tasks[mode], completed=done, kills=kills)


def _print_table(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = figures["settings"]
    table = Table(title=f"{s['orders']} orders, {s['workers']} workers",
                  caption=f"SIGKILL after the provider's 200: p={s['kill_probability']}")
    table.add_column("")
    table.add_column("naive", justify="right")
    table.add_column("fenced", justify="right")
    for key, label in ROWS:
        table.add_row(label, str(figures["naive"][key]), str(figures["fenced"][key]))
    console = Console()
    console.print(table)
    naive, fenced = figures["naive"], figures["fenced"]
    console.print(f"naive:  {naive['double_charged_orders']} order(s) charged twice "
                  f"({naive['charges']} charges for {naive['orders']} orders)")
    console.print(f"fenced: {fenced['charges']} charges for {fenced['orders']} orders, "
                  f"{fenced['double_charged_orders']} charged twice: the second run is empty")
    console.print(f"({s['seconds']} s)")
