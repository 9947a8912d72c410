"""The doctor: every row of the diagnostic map as a live check against Redis, the fence table and the servers.

Example::

    from ringfence.doctor import Thresholds, diagnose

    report = diagnose(app, Thresholds(sample_s=2))
    for f in report.problems():
        print(f.status, f.check, f.symptom, f.hypothesis, f.remedy)
    raise SystemExit(report.exit_code)   # 0 healthy, 1 warnings, 2 failures
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ringfence.doctor import fences, outbox, queues, topology, workers, workflows  # noqa: F401  (checks register on import)
from ringfence.doctor.context import Context, Snapshot, Thresholds
from ringfence.doctor.model import CHECKS, Finding, Report, Status
from ringfence.queries import queue_gauges
from ringfence.redis.topology import prepare_reads, silent_masters

if TYPE_CHECKING:
    from ringfence.app import App
    from ringfence.reconcile import Effect

#: The diagnostic map's order (DESIGN.md section 4): consumers first, money last.
ORDER = ("topology", "backlog_stalled", "queue_unserved", "environment", "error_wave", "retry_storm", "future_load",
         "orphaned", "stuck_active", "shutdown_timeout", "starvation", "outbox_lag", "outbox_parked", "in_doubt",
         "owner_gone", "effects", "workflow_stuck", "eviction", "memory", "redis_version", "timeouts")

__all__ = ["CHECKS", "Context", "Finding", "Report", "Snapshot", "Status", "Thresholds", "diagnose",
           "queue_gauges", "run_checks"]


def diagnose(app: App, thresholds: Thresholds | None = None, *, step: str | None = None,
             effects: Iterable[Effect] | None = None) -> Report:
    """Sample the namespace twice, ``thresholds.sample_s`` apart, and run every check."""
    t = thresholds or Thresholds()
    broker = app.broker
    # On a Cluster, as `info`: a short PING to each master first; a silent one's queues are named, not waited for.
    silent = silent_masters(broker) if broker.cluster else {}
    prepare_reads(broker, (), silent)
    before = Snapshot.take(broker, silent)
    time.sleep(t.sample_s)
    after = Snapshot.take(broker, silent)
    ctx = Context(app, before, after, t, step=step, effects=effects, silent=silent)
    return Report(app.namespace, run_checks(ctx))


def run_checks(ctx: Context, names: Iterable[str] | None = None, *, with_ok: bool = True) -> list[Finding]:
    """Run the named checks (default: all). A check that finds nothing reports one ``ok`` finding; a check
    that raises reports a warning naming the error, and the others still run."""
    wanted = set(names) if names is not None else None
    out: list[Finding] = []
    for c in sorted(CHECKS, key=lambda c: ORDER.index(c.name) if c.name in ORDER else len(ORDER)):
        if wanted is not None and c.name not in wanted:
            continue
        try:
            found = list(c.run(ctx))
        except Exception as exc:  # one broken check must not hide the others' findings
            first = (str(exc).strip().splitlines() or [""])[0]
            found = [Finding(c.name, Status.WARNING, symptom=f"the check failed: {type(exc).__name__}: {first}",
                             hypothesis="the check could not read what it needs",
                             remedy="see the error; the other checks ran")]
        if not found and with_ok:
            found = [Finding(c.name, Status.OK, symptom=c.ok)]
        out.extend(found)
    return out
