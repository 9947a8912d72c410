"""``ringfence worker``."""

from __future__ import annotations

import sys

import click

from ringfence.app import App
from ringfence.cli.base import app_option, check_port, main
from ringfence.errors import ConfigError
from ringfence.settings import DEFAULT_THREADS, check_threads


@main.command()
@app_option
@click.option("--queues", "-q", default=None,
              help="name=weight,...  e.g. critical=6,default=3,low=1 (default: only the queues the app's tasks "
                   "declare, weight 1 each)")
@click.option("--concurrency", "-c", default=10, show_default=True, help="jobs run at once per process")
@click.option("--processes", "-p", default=1, show_default=True, help="worker processes under one supervisor")
@click.option("--threads", "-t", type=int, default=None,
              help=f"job threads to start with for sync (def) handlers (default {DEFAULT_THREADS}, at most "
                   "--concurrency); more start, up to --concurrency, while calls wait and the threads are held by slow "
                   "calls or sleep on I/O")
@click.option("--strict", is_flag=True, help="serve queues in the order given instead of by weight")
@click.option("--max-wait", default=None, help="starvation bounds, queue=seconds,...: served first once exceeded")
@click.option("--scheduler", is_flag=True, help="also run the cron scheduler of the app's periodic tasks")
@click.option("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="address /metrics binds (0.0.0.0: every interface, e.g. for a scraper on another host)")
@click.option("--alerts/--no-alerts", default=True, show_default=True,
              help="evaluate alert rules (one worker at a time holds the evaluator lease)")
@click.option("--summary-s", type=float, default=10.0, show_default=True,
              help="seconds between INFO summary lines (per task and queue: jobs done, retried, dead, requeued); "
                   "0: none")
@click.option("--max-jobs-per-child", default=None, metavar="N",
              help="replace a worker process once it ran N jobs (it stops fetching and finishes its running jobs)")
@click.option("--max-memory-mb", default=None, metavar="M",
              help="replace a worker process once its resident memory, checked after each job, passes M MB")
def worker(app: App, queues: str | None, concurrency: int, processes: int, threads: int | None, strict: bool,
           max_wait: str | None, scheduler: bool, metrics_port: int | None, metrics_host: str, alerts: bool,
           summary_s: float, max_jobs_per_child: str | None, max_memory_mb: str | None) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal exits at once)."""
    from ringfence.worker.recycle import Limits
    from ringfence.worker.summary import check_summary_s
    from ringfence.worker.supervisor import supervise
    from ringfence.worker.worker import parse_max_wait, parse_queues, run_worker

    if processes < 1:
        raise ConfigError(f"--processes {processes} must be >= 1")
    check_summary_s(summary_s)  # said once, before any child starts
    check_threads(threads, concurrency)  # said once, before any child starts
    check_port("--metrics-port", metrics_port)
    recycle = Limits.parse(max_jobs_per_child, max_memory_mb)  # said once, before any child starts
    parsed = parse_queues(queues) if queues else None
    if processes > 1:
        app.check()  # refuse a bad configuration before starting anything
        ctx = click.get_current_context()
        sys.exit(supervise([child_command(ctx, slot) for slot in range(processes)]))
    sys.exit(run_worker(app, parsed, concurrency=concurrency, strict=strict,
                        max_wait=parse_max_wait(max_wait) if max_wait else None, scheduler=scheduler,
                        metrics_port=metrics_port, alerts=alerts, metrics_host=metrics_host, threads=threads,
                        summary_s=summary_s, recycle=recycle))


def child_command(ctx: click.Context, slot: int) -> list[str]:
    """The command of supervised worker ``slot``, built from this command's parsed options (``--processes``
    left out) and the group's; worker ``slot`` serves metrics on ``--metrics-port`` + ``slot``."""
    args = [sys.executable, "-m", "ringfence.cli"]
    for c in (ctx.parent, ctx):
        if c is None:
            continue
        for param in c.command.params:
            if isinstance(param, click.Option) and param.name != "processes":
                value = c.params.get(param.name or "")
                if param.name == "metrics_port" and value is not None:
                    value += slot
                args += _option_args(param, value)
        if c is ctx.parent:
            args.append(ctx.info_name or "worker")
    return args


def _option_args(option: click.Option, value: object) -> list[str]:
    if option.is_flag:
        if option.secondary_opts and value is not None:
            return [option.opts[0] if value else option.secondary_opts[0]]
        return [option.opts[0]] if value else []
    if value is None:
        return []
    long = max(option.opts, key=len)
    return [long, str(value)]


@main.command()
@app_option
@click.option("--interval-s", type=float, default=1.0, show_default=True, help="seconds between checks")
@click.option("--interval", "interval_old", type=float, default=None, hidden=True)  # still parses in existing scripts
def scheduler(app: App, interval_s: float, interval_old: float | None) -> None:
    """Enqueue the app's periodic tasks on their cron schedules (run as many as you like: ticks run once)."""
    import asyncio
    import signal

    from ringfence.scheduler import Scheduler
    from ringfence.worker.maintenance import SchedulerLoop

    if not app.periodics:
        raise ConfigError("the app declares no @app.periodic tasks")

    async def run() -> None:
        scheduler = Scheduler(app.periodics, app.broker)
        loop = SchedulerLoop(scheduler, interval_old if interval_old is not None else interval_s)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        loop.start()
        await stop.wait()
        await loop.stop()

    asyncio.run(run())
