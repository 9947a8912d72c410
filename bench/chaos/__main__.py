"""``python -m bench.chaos [options]`` (``make chaos``): exit 0 when every check passes, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.chaos.config import DESCRIPTIONS, KINDS, TOPOLOGIES, ChaosConfig
from bench.chaos.run import ChaosRun

RATES = {  # option → help
    "kill_every_s": "mean seconds between SIGKILLs of a random worker",
    "term_every_s": "mean seconds between SIGTERMs (graceful restarts) of a random worker",
    "points_p": "kill probability at each fence fault point (RINGFENCE_FAULTS)",
    "doomed_rate": "share of orders whose worker dies after the provider's answer on every attempt",
    "dup_rate": "share of orders enqueued twice",
    "redis_restart_every_s": "mean seconds between restarts of the private Redis (--redis single)",
    "failover_every_s": "mean seconds between SIGKILLs of the Redis master (--redis sentinel|cluster)",
    "oom_every_s": "mean seconds between OOM windows", "oom_hold_s": "seconds an OOM window lasts",
    "db_kill_every_s": "mean seconds between terminations of the run's database connections",
    "skew_s": "clock offset of the skewed worker, seconds ahead",
    "p_5xx": "provider: probability of a 503", "p_hang": "provider: probability of a late answer",
    "p_drop": "provider: probability of a dropped connection after the charge",
    "hook_delay_s": "seconds the slow reconcile hook takes",
    "lease_s": "the workers' lease", "effect_timeout_s": "the provider client's timeout",
    "max_attempts": "attempts per job", "term_bound_s": "seconds after SIGTERM before a worker counts as hung",
    "batch": "jobs per enqueue round trip", "backlog": "enqueue only while fewer jobs than this wait or run",
}


def parse(argv: list[str] | None) -> tuple[ChaosConfig, bool]:
    d = ChaosConfig()
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__,
                                epilog="fault kinds: " + "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()))
    p.add_argument("--orders", type=int, default=d.orders)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--db", default=d.db, choices=("sqlite", "postgresql", "mariadb"))
    p.add_argument("--redis", default=d.redis, choices=TOPOLOGIES,
                   help="single: one redis-server; sentinel: 1 master, 1 replica, 3 sentinels; cluster: 3 masters "
                        "with a replica each")
    p.add_argument("--durable", action="store_true", help="enqueue with durable=True (a replica confirms each batch)")
    p.add_argument("--max-seconds", type=float, default=d.max_seconds, help="bound of the whole run")
    p.add_argument("--chaos-seconds", type=float, default=None, help="faults stop after this (default 60%% of max)")
    p.add_argument("--faults", default="all", help=f"comma-separated kinds, or 'all' ({','.join(KINDS)})")
    p.add_argument("--without", default="", help="comma-separated kinds to switch off")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print only the JSON report on stdout")
    p.add_argument("--keep", action="store_true", help="keep the run's directory (logs, ledgers)")
    for name, text in RATES.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(getattr(d, name)), default=getattr(d, name),
                       help=text)
    a = p.parse_args(argv)
    kinds = set(KINDS) if a.faults == "all" else {k.strip() for k in a.faults.split(",") if k.strip()}
    kinds -= {k.strip() for k in a.without.split(",") if k.strip()}
    known = {f.name for f in fields(ChaosConfig)}
    values = {k: v for k, v in vars(a).items() if k in known and k != "faults"}
    cfg = ChaosConfig(**values, faults=frozenset(kinds))
    problems = cfg.problems()
    if problems:
        p.error("; ".join(problems))
    return cfg, a.json


def render(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"chaos: {r['total']['orders']} orders, {r['settings']['workers']} workers, "
                    f"db {r['settings']['db']}, commit {r['commit'] or '?'}")
    cols = ("injected", "orders", "charged_once", "charged_0", "charged_2plus", "completed", "in_doubt", "effected",
            "unsettled")
    heads = ("injected", "orders", "charged 1×", "0×", "≥2×", "completed", "in doubt", "effected", "unsettled")
    t.add_column("fault")
    for head in heads:
        t.add_column(head, justify="right")
    for f in [*r["faults"], r["total"]]:
        style = "bold" if f["kind"] == "total" else None
        t.add_row(f["kind"], *("" if f["kind"] == "total" and c == "injected" else str(f[c]) for c in cols),
                  style=style)
    console.print(t)
    c = Table(title="checks")
    c.add_column("")
    c.add_column("check")
    c.add_column("figures")
    for chk in r["checks"]:
        c.add_row("[green]PASS[/]" if chk["ok"] else "[red]FAIL[/]", chk["check"], chk["detail"])
    console.print(c)
    w, jobs = r["workers"], r["jobs"]
    console.print(f"workers: {w['sigkilled_by_driver']} SIGKILLed by the driver, {w['sigkilled_themselves']} by "
                  f"fault points/doomed, {w['sigterm_stops']} SIGTERM stops (max {w['max_exit_s']}s), "
                  f"other exits {w['other_exits'] or 'none'}")
    console.print(f"jobs: {jobs['acked_as_duplicate']} acked as duplicates; dead by reason {r['dead_reasons']}; "
                  f"reconcile hook: {r['reconcile_lookups']['calls']} lookups, "
                  f"{r['reconcile_lookups']['adopted']} adopted; fence epochs: max {r['fence_epochs']['max']}, "
                  f"{r['fence_epochs']['above_5']} above 5; enqueue batches resent after RedisFull: "
                  f"{r['enqueue']['batches_refused_full']}, after other Redis errors: {r['enqueue']['batches_failed']}")
    for note in [*r["notes"], *r["injection_errors"]]:
        console.print(f"note: {note}")
    bad = {k: v for k, v in r["samples"].items() if v}
    if bad:
        console.print(f"samples: {bad}")
    verdict = "[green]all checks pass[/]" if r["ok"] else "[red]some checks FAIL[/]"
    drained = "not drained" if r["drained_s"] is None else f"drained in {r['drained_s']}s"
    console.print(f"{verdict}; {drained}; wall time {r['seconds']}s")


def main(argv: list[str] | None = None) -> int:
    cfg, as_json = parse(argv)
    err = Console(stderr=True)

    def progress(p: dict[str, Any]) -> None:
        if not as_json and int(p["elapsed"] * 10) % 50 == 0:
            err.print(f"[{p['elapsed']:6.1f}s] enqueued {p['enqueued']}, backlog {p['backlog']}, "
                      f"kills {p['kills']}{' (calm)' if p['calm'] else ''}")

    try:
        result = ChaosRun(cfg, progress).execute()
    except KeyboardInterrupt:
        err.print("chaos: interrupted; every process stopped, the run's database dropped")
        return 130
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        render(result, Console(width=None if sys.stdout.isatty() else 140))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
