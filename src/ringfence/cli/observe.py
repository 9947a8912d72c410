"""``ringfence doctor``, ``watch``, ``exporter`` and ``reconcile``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import click

from ringfence.app import App
from ringfence.cli.base import app_option, check_port, main
from ringfence.cli.ops import print_json
from ringfence.doctor import Finding, Status, Thresholds, diagnose
from ringfence.errors import ConfigError
from ringfence.reconcile import Effect, read_csv, read_table, reconcile

_MARK = {Status.OK: "ok  ", Status.SKIPPED: "skip", Status.WARNING: "WARN", Status.FAILURE: "FAIL"}


def threshold_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The thresholds shared by ``doctor`` and ``watch``; passes ``thresholds=Thresholds(...)``."""

    @click.option("--latency-warn-s", type=float, default=Thresholds.latency_warn_s, show_default=True,
                  help="a queue's oldest pending job older than this is slow")
    @click.option("--retry-warn", type=int, default=Thresholds.retry_warn, show_default=True,
                  help="jobs in one retry set that make a retry storm")
    @click.option("--future-load-warn", type=int, default=Thresholds.future_load_warn, show_default=True,
                  help="backlog x remaining attempts of one dependency")
    @click.option("--in-doubt-older-than-min", type=float, default=0.0, show_default=True,
                  help="report in-doubt fences older than this")
    @click.option("--outbox-lag-warn-s", type=float, default=Thresholds.outbox_lag_warn_s, show_default=True,
                  help="the oldest outbox row waiting for the relay longer than this is an alert")
    @functools.wraps(fn)
    def wrapper(*args: Any, latency_warn_s: float, retry_warn: int, future_load_warn: int,
                in_doubt_older_than_min: float, outbox_lag_warn_s: float, sample_s: float = Thresholds.sample_s,
                **kw: Any) -> Any:
        t = Thresholds(sample_s=sample_s, latency_warn_s=latency_warn_s, retry_warn=retry_warn,
                       future_load_warn=future_load_warn, in_doubt_older_than_s=in_doubt_older_than_min * 60,
                       outbox_lag_warn_s=outbox_lag_warn_s)
        return fn(*args, thresholds=t, **kw)

    return wrapper


def effects_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Where the provider's records come from; passes ``effects_source=dict(...)``."""

    @click.option("--effects", "effects", metavar="FILE|TABLE",
                  help="the provider's records: a CSV export (subject[,reference][,provider_key]) or a table name")
    @click.option("--effects-table", metavar="NAME", help="a table of provider callbacks in the fence database")
    @click.option("--subject-column", default="subject", show_default=True,
                  help="the column (or CSV field) holding the subject")
    @click.option("--reference-column", default=None, help="the provider's id of the effect")
    @click.option("--key-column", default=None, help="the idempotency key the effect was sent with")
    @click.option("--subject-template", default="{}", show_default=True,
                  help="maps the exported value to the fence subject, e.g. 'order:{}'")
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Any:
        names = ("effects", "effects_table", "subject_column", "reference_column", "key_column", "subject_template")
        source = {n: kw.pop(n) for n in names}
        return fn(*args, effects_source=source, **kw)

    return wrapper


def load_effects(app: App, source: dict[str, Any]) -> Iterable[Effect] | None:
    """The effects named on the command line: a CSV file, else a table in the fence database; None if none."""
    path, table = source["effects"], source["effects_table"]
    if path and os.path.isfile(path):
        return list(read_csv(path, source["subject_template"]))
    if path and (os.sep in path or path.lower().endswith(".csv")):
        raise ConfigError(f"--effects {path}: no such file (give a CSV export of the provider's records, or a "
                          "table name of the fence database)")
    table = table or path
    if not table:
        return None
    return list(read_table(app, table, subject_column=source["subject_column"],
                           reference_column=source["reference_column"], key_column=source["key_column"],
                           subject_template=source["subject_template"]))


def print_findings(findings: list[Finding]) -> None:
    for f in findings:
        where = f" [{f.subject}]" if f.subject else ""
        click.echo(f"{_MARK[f.status]} {f.check}{where}: {f.symptom}")
        if f.status in (Status.WARNING, Status.FAILURE):
            click.echo(f"       why: {f.hypothesis}")
            click.echo(f"       fix: {f.remedy}")


@main.command()
@app_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@click.option("--sample-s", type=float, default=Thresholds.sample_s, show_default=True,
              help="seconds between the two samples of the counters")
@click.option("--step", default=None, help="with --effects: reconcile this fence step as one more check")
@threshold_options
@effects_options
def doctor(app: App, as_json: bool, step: str | None, thresholds: Thresholds,
           effects_source: dict[str, Any]) -> None:
    """Run every check of the diagnostic map; exit 0 healthy, 1 warnings, 2 failures."""
    if not thresholds.sample_s >= 0:  # also refuses nan
        raise ConfigError(f"--sample-s {thresholds.sample_s} must be >= 0")
    effects = load_effects(app, effects_source) if step else None
    report = diagnose(app, thresholds, step=step, effects=effects)
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(f"ringfence doctor: namespace {app.namespace}")
        print_findings(report.findings)
    sys.exit(report.exit_code)


@main.command()
@app_option
@click.option("--interval-s", type=float, default=15.0, show_default=True, help="seconds between evaluations")
@click.option("--webhook-url", envvar="RINGFENCE_ALERT_WEBHOOK", default=None,
              help="POST each alert as JSON here (env RINGFENCE_ALERT_WEBHOOK)")
@click.option("--iterations", type=int, default=None, help="stop after N evaluations (default: run until ^C)")
@threshold_options
def watch(app: App, interval_s: float, webhook_url: str | None, iterations: int | None,
          thresholds: Thresholds) -> None:
    """Evaluate the alert rules every interval (one watcher or worker at a time, by a Redis lease)."""
    from ringfence.alerts import AlertRules
    from ringfence.alerts import watch as run_watch

    rules = AlertRules(thresholds=thresholds, interval_s=interval_s, lease_s=max(3 * interval_s, interval_s + 5),
                       webhook_url=webhook_url)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_watch(app, rules, iterations))


@main.command()
@app_option
@click.option("--port", type=int, default=9108, show_default=True, help="HTTP port of /metrics")
@click.option("--addr", default="0.0.0.0", show_default=True, help="address to bind (127.0.0.1: this host only)")
def exporter(app: App, port: int, addr: str) -> None:
    """Serve the namespace's queue gauges (and, with a fence_url, the outbox's relay lag) on /metrics for
    Prometheus."""
    from ringfence.metrics import serve_exporter
    from ringfence.outbox.lag import outbox_lag

    check_port("--port", port)
    app.broker.environment()  # a Redis that cannot be reached fails here, with one line, not at every scrape
    server = serve_exporter(app.broker, port, addr, outbox=(lambda: outbox_lag(app)) if app.fence_url else None)
    click.echo(f"ringfence exporter: http://{addr}:{server.server_port}/metrics (namespace {app.namespace})")
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    server.shutdown()


@main.command(name="reconcile")
@app_option
@click.option("--step", required=True, help="the fence step, e.g. charge")
@click.option("--in-doubt-older-than-min", type=float, default=30.0, show_default=True,
              help="report in-doubt fences older than this")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@effects_options
def reconcile_cmd(app: App, step: str, in_doubt_older_than_min: float, as_json: bool,
                  effects_source: dict[str, Any]) -> None:
    """Fence rows of STEP vs the provider's records; exit 1 on any finding (for CI and cron)."""
    from ringfence.cli.fence import require_fence_store

    require_fence_store(app)
    effects = load_effects(app, effects_source)
    report = reconcile(app, step, effects, in_doubt_older_than_s=in_doubt_older_than_min * 60)
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(f"reconcile {step}: {report.fences} fence row(s), "
                   f"{report.effects if effects is not None else 'no'} effect(s)")
        for name in ("double_effects", "unfenced", "without_reference", "stale_in_doubt", "owner_gone",
                     "missing_at_provider"):
            items = getattr(report, name)
            click.echo(f"  {name}: {len(items)}")
            for item in items[:20]:
                click.echo(f"    {item}")
    sys.exit(report.exit_code)
