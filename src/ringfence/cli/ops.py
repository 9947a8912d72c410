"""``ringfence info``, ``servers`` and ``queue pause|resume``."""

from __future__ import annotations

import dataclasses
import difflib
import sys
import time
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from ringfence import queries
from ringfence.app import App
from ringfence.cli.base import app_option, main
from ringfence.errors import ConfigError
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.keys import logical_queue, partition_name
from ringfence.redis.topology import silent_masters
from ringfence.settings import check_name

PARTIAL = 4  # a Cluster node is down: the queues it holds are not in the answer
NODE_TIMEOUT_S = 1.0


def print_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in ("queue", "id", "host", "queues", "task") else "right")
    for row in rows:
        table.add_row(*[str(row.get(c, "")) for c in columns])
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # pipes and logs: never squeeze columns
    console.print(table)


@main.command()
@app_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def info(app: App, as_json: bool) -> None:
    """Per queue: pending, active, scheduled, retry, dead, processed, failed, latency, paused; and the outbox's
    relay lag (rows waiting, the oldest's age, rows parked, the relay holding the lease) when the app's database
    has one."""
    from ringfence.outbox.lag import outbox_lag

    _short_timeouts(app)
    silent = silent_masters(app.broker)
    rows, missing = queries.info_partial(app.broker, silent)
    rows = queries.by_logical_queue(rows)  # a partitioned queue is one row
    breakers, missing_breakers = queries.breakers_partial(app.broker, silent)
    try:
        outbox = outbox_lag(app)
    except Exception as exc:  # the queues are still worth printing when the database does not answer
        outbox = {"waiting": "?", "oldest_s": "?", "parked": "?", "relay": None,
                  "error": f"{type(exc).__name__}: {exc}"}
    hint = None if rows or missing else namespace_hint(app)
    if as_json:
        print_json({"namespace": app.namespace, "environment": _environment(app), "queues": rows,
                    "breakers": breakers, "outbox": outbox, "unreachable": missing + missing_breakers,
                    **({"hint": hint} if hint else {})})
        _exit_partial(missing + missing_breakers)
        return
    cols = ["queue", "pending", "active", "scheduled", "retry", "dead", "processed", "failed", "latency_s", "paused",
            "versions"]
    view = [{**r, "versions": " ".join(f"{k}:{v}" for k, v in r["versions"].items())} for r in rows]
    print_table(f"ringfence {app.namespace}", view, cols)
    if hint:
        click.echo(f"hint: {hint}", err=True)
    if breakers:
        print_table("circuit breakers", [{**b, "transitions": " ".join(b["transitions"][:3])} for b in breakers],
                    ["dependency", "state", "recent_failures", "transitions"])
    if outbox is not None:
        print_table("outbox", [{**outbox, "relay": outbox["relay"] or "none"}],
                    ["waiting", "oldest_s", "parked", "relay"])
    _exit_partial(missing + missing_breakers)


def _short_timeouts(app: App) -> None:
    """On a Cluster a node that hangs costs every read of it the socket timeout, on each retry: ``info`` waits
    ``NODE_TIMEOUT_S`` per node, not the workers' timeouts."""
    if "+cluster://" not in (app.declared_redis_url or "") or app.built_runtime is not None:
        return
    s = app.redis_settings
    app.redis_settings = dataclasses.replace(s, connect_timeout_s=min(s.connect_timeout_s, NODE_TIMEOUT_S),
                                             socket_timeout_s=min(s.socket_timeout_s, NODE_TIMEOUT_S))


def _environment(app: App) -> str | None:
    try:
        return app.broker.environment()
    except UNAVAILABLE:
        if not app.broker.cluster:
            raise
        return None


def _exit_partial(missing: list[dict[str, str]]) -> None:
    """A partial answer (a Cluster node down): one line per unread queue or breaker, and exit 4."""
    if not missing:
        return
    for m in missing:
        what = f"queue {m['queue']}" if "queue" in m else f"breaker {m['breaker']}"
        click.echo(f"error: {what} cannot be read: node {m['node']} does not answer ({m['error']})", err=True)
    sys.exit(PARTIAL)


def namespace_hint(app: App) -> str:
    """Why a namespace may show no queues: its name, and namespaces of this Redis that have queues."""
    hint = f"namespace {app.namespace!r} has no queues: is RINGFENCE_NAMESPACE (or the app's namespace) right?"
    try:
        found = sorted(_namespaces(app.broker.sync) - {app.namespace})
    except Exception:  # a hint only: a user that may not SCAN still gets the first half
        return hint
    close = difflib.get_close_matches(app.namespace, found, n=10, cutoff=0.6)  # a typo's likely target first
    shown = (close + [n for n in found if n not in close])[:10]
    more = f" (and {len(found) - len(shown)} more)" if len(found) > len(shown) else ""
    return f"{hint} Namespaces with queues on this Redis: {', '.join(shown) or 'none'}{more}"


def _namespaces(client: Any, limit: int = 500, budget_s: float = 1.0) -> set[str]:
    """Up to ``limit`` namespaces with a queues key, looked for during at most ``budget_s`` (a big keyspace)."""
    found: set[str] = set()
    cursor, deadline = 0, time.monotonic() + budget_s
    while len(found) < limit and time.monotonic() < deadline:
        cursor, keys = client.scan(cursor, match="*:queues", count=1000)
        found.update((k.decode() if isinstance(k, bytes) else str(k)).removesuffix(":queues").strip("{}")
                     for k in keys)
        if not cursor:
            break
    return found


@main.command()
@app_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def servers(app: App, as_json: bool) -> None:
    """Live worker processes and what they serve."""
    rows = queries.servers(app.broker)
    if as_json:
        print_json(rows)
        return
    now = app.broker.clock() / 1000  # servers report their times on the Redis clock
    view = [
        {**s, "queues": ",".join(f"{q}={w}" for q, w in s["queues"].items()),
         "running": len(s["running"]), "up_s": int(now - s["started"]), "beat_s": round(now - s["heartbeat"], 1)}
        for s in rows
    ]
    print_table("servers", view, ["host", "pid", "environment", "queues", "concurrency", "running", "processed",
                                  "up_s", "beat_s"])


@main.group()
def queue() -> None:
    """Pause or resume a queue (a paused queue keeps its jobs)."""


def known_queue(app: App, name: str) -> str:
    """Refuse a malformed name or a queue this namespace has never used (a typo would pause nothing)."""
    check_name("queue", name)
    known = {logical_queue(q) for q in app.broker.queues()} | set(app.registry.queues())
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise ConfigError(f"no queue {name!r} in namespace {app.namespace}; known: {listed}")
    return name


def queues_named(app: App, name: str) -> list[str]:
    """The queues NAME stands for: a partitioned queue's partitions (declared, or found in Redis), else NAME."""
    known_queue(app, name)
    n = app.partitions.get(name)
    parts = {partition_name(name, i, n) for i in range(n)} if n else set()
    parts |= {q for q in app.broker.queues() if q != name and logical_queue(q) == name}
    return sorted(parts) or [name]


@queue.command()
@app_option
@click.argument("name")
def pause(app: App, name: str) -> None:
    """Stop workers fetching from queue NAME (running jobs finish; queued jobs wait)."""
    for q in queues_named(app, name):
        app.broker.set_paused(q, True)
    click.echo(f"paused {name}")


@queue.command()
@app_option
@click.argument("name")
def resume(app: App, name: str) -> None:
    """Let workers fetch from queue NAME again."""
    for q in queues_named(app, name):
        app.broker.set_paused(q, False)
    click.echo(f"resumed {name}")
