"""The verdict: per-order, per-job and per-worker checks over the collected ledger, per fault kind and in total."""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass
from typing import Any

from bench.chaos.config import KINDS

# One row per order that was enqueued: its provider charges, its fence, and whether a dead job names it.
ORDER_VIEW = """
CREATE TEMP VIEW verdict AS
SELECT o.order_id,
       COALESCE(c.n, 0) AS charges,
       f.state AS state,
       EXISTS (SELECT 1 FROM jobs j JOIN (SELECT job_id, reason, error FROM dead
                                          UNION ALL SELECT job_id, reason, error FROM failed) d
               ON d.job_id = j.job_id WHERE j.order_id = o.order_id AND d.reason <> ''
               AND (instr(d.error, 'order:' || o.order_id || '/charge') > 0
                    OR instr(d.error, '''order:' || o.order_id || '''/''charge''') > 0)) AS dead_named,
       EXISTS (SELECT 1 FROM jobs j JOIN dead d ON d.job_id = j.job_id
               WHERE j.order_id = o.order_id AND d.reason <> '') AS dead_any,
       CASE WHEN f.state = 'completed' AND (r.charge_id IS NULL OR r.charge_id <> f.reference
                 OR NOT EXISTS (SELECT 1 FROM p.charges x WHERE x.order_id = o.order_id
                                AND 'ch_' || x.id = f.reference)) THEN 1 ELSE 0 END AS mismatch
FROM (SELECT DISTINCT order_id FROM jobs WHERE sent = 1) o
LEFT JOIN (SELECT order_id, count(*) AS n FROM p.charges GROUP BY order_id) c ON c.order_id = o.order_id
LEFT JOIN fences f ON f.order_id = o.order_id
LEFT JOIN orders r ON r.order_id = o.order_id;
CREATE TEMP TABLE settled AS
SELECT order_id, charges, state, mismatch,
       -- settled: completed, or left in doubt / effected by a dead job that names the step (a person or a
       -- replay finishes it), or never past capture and its job dead with a reason (nothing left the network)
       COALESCE(state = 'completed' OR (state IN ('in_doubt', 'effected') AND dead_named)
                OR ((state IS NULL OR state = 'claimed') AND charges = 0 AND dead_any), 0) AS ok,
       -- charged as promised: exactly once; or never, when the order's job was dead-lettered before any call,
       -- or the step is in doubt and named by its dead job (a person settles it: --not-done)
       (charges = 1 OR (charges = 0 AND dead_any AND (state IS NULL OR state = 'claimed'))
        OR (charges = 0 AND state = 'in_doubt' AND dead_named)) AS charge_ok
FROM verdict;
"""

EVENT_KINDS = ("redis-restart", "failover", "reshard", "oom", "db-kill")  # the driver's timed events
PID = "CAST(substr(q.caller, instr(q.caller, ':') + 1) AS INTEGER)"


def touched_sql(kind: str, window_s: float) -> str:
    """SQL selecting the orders a fault kind touched."""
    if kind in ("kill", "term", "points"):
        pid_kind = {"kill": "killed", "term": "termed", "points": "self_killed"}[kind]
        return (f"SELECT DISTINCT q.order_id FROM p.calls q JOIN pids k ON k.pid = {PID} "
                f"AND k.kind = '{pid_kind}' AND q.ts BETWEEN k.t_end - {window_s} AND k.t_end")
    if kind in ("doomed", "duplicates"):
        col = "doomed" if kind == "doomed" else "dup"
        return f"SELECT DISTINCT order_id FROM jobs WHERE sent = 1 AND {col} = 1"
    if kind in EVENT_KINDS:
        return (f"SELECT DISTINCT q.order_id FROM p.calls q JOIN events e ON e.kind = '{kind}' "
                f"AND q.ts BETWEEN e.t0 AND e.t1 + {window_s}")
    if kind == "skew":
        return "SELECT DISTINCT order_id FROM p.calls WHERE caller LIKE 'skew:%'"
    if kind == "slow-hook":  # orders whose charge the hook looked up (a lookup that found nothing has no order)
        return ("SELECT DISTINCT c.order_id FROM p.lookups l "
                "JOIN p.charges c ON c.provider = 'b' AND c.idem_key = l.idem_key")
    return f"SELECT DISTINCT order_id FROM p.calls WHERE fault = '{kind.removeprefix('provider-')}'"


def injected_sql(kind: str) -> str:
    if kind in ("kill", "term", "points"):
        pid_kind = {"kill": "killed", "term": "termed", "points": "self_killed"}[kind]
        return f"SELECT count(*) FROM pids WHERE kind = '{pid_kind}'"
    if kind in ("doomed", "duplicates"):
        return f"SELECT count(*) FROM jobs WHERE sent = 1 AND {'doomed' if kind == 'doomed' else 'dup'} = 1"
    if kind in EVENT_KINDS:
        return f"SELECT count(*) FROM events WHERE kind = '{kind}'"
    if kind == "skew":
        return "SELECT count(*) FROM p.calls WHERE caller LIKE 'skew:%'"
    if kind == "slow-hook":
        return "SELECT count(*) FROM p.lookups"
    return f"SELECT count(*) FROM p.calls WHERE fault = '{kind.removeprefix('provider-')}'"


@dataclass
class Figures:
    """Counts over a set of orders (all of them, or those one fault kind touched)."""

    kind: str
    injected: int
    orders: int
    charged_once: int
    charged_0: int
    charged_2plus: int
    completed: int
    in_doubt: int
    effected: int      # left effected by a dead job that says "replay to finish"
    unsettled: int
    past_capture: int  # fences left calling/effected
    uncharged_dead: int  # never charged, visibly: dead before any call, or in doubt and named by its dead job

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def figures(db: sqlite3.Connection, kind: str, injected: int, where: str) -> Figures:
    row = db.execute(f"""SELECT count(*), sum(charges = 1), sum(charges = 0), sum(charges >= 2),
                                sum(state = 'completed'), sum(state = 'in_doubt'), sum(state = 'effected'),
                                sum(NOT ok), sum(state IN ('calling', 'effected')), sum(charges = 0 AND charge_ok)
                         FROM settled WHERE {where}""").fetchone()
    n, once, zero, multi, completed, doubt, effected, bad, past, uncharged = (int(x or 0) for x in row)
    return Figures(kind, injected, n, once, zero, multi, completed, doubt, effected, bad, past, uncharged)


def per_fault(db: sqlite3.Connection, kinds: list[str], window_s: float) -> list[Figures]:
    out = []
    for kind in kinds:
        injected = int(db.execute(injected_sql(kind)).fetchone()[0])
        out.append(figures(db, kind, injected, f"order_id IN ({touched_sql(kind, window_s)})"))
    return out


def job_counts(db: sqlite3.Connection) -> dict[str, int]:
    row = db.execute("""
        SELECT count(*),
               sum(d.job_id IS NOT NULL),
               sum(d.job_id IS NULL AND q.job_id IS NULL AND a.job_id IS NOT NULL),
               sum(d.job_id IS NULL AND q.job_id IS NOT NULL),
               sum(d.job_id IS NULL AND q.job_id IS NULL AND a.job_id IS NULL),
               sum(a.outcome = 'duplicate')
        FROM jobs j LEFT JOIN dead d ON d.job_id = j.job_id LEFT JOIN queued q ON q.job_id = j.job_id
        LEFT JOIN acked a ON a.job_id = j.job_id WHERE j.sent = 1""").fetchone()
    keys = ("enqueued", "dead", "acked", "unfinished", "lost", "acked_as_duplicate")
    out = {k: int(v or 0) for k, v in zip(keys, row, strict=True)}
    out["not_sent"] = int(db.execute("SELECT count(*) FROM jobs WHERE sent = 0").fetchone()[0])
    out["dead_without_row"] = int(db.execute(
        "SELECT count(*) FROM dead d WHERE NOT EXISTS (SELECT 1 FROM failed f WHERE f.job_id = d.job_id)"
    ).fetchone()[0])
    out["dead_without_reason"] = int(db.execute("SELECT count(*) FROM dead WHERE reason = ''").fetchone()[0])
    return out


def dead_reasons(db: sqlite3.Connection) -> dict[str, int]:
    return {str(r): int(n) for r, n in db.execute("SELECT reason, count(*) FROM dead GROUP BY reason ORDER BY 2 DESC")}


def samples(db: sqlite3.Connection, limit: int = 10) -> dict[str, list[Any]]:
    """A few offending orders per failure, for the report (the run's directory has the rest with --keep)."""
    q = {
        "charged_0": "SELECT order_id, state FROM settled WHERE charges = 0 AND NOT charge_ok",
        "charged_2plus": "SELECT order_id, charges, state FROM settled WHERE charges >= 2",
        "unsettled": "SELECT order_id, state, charges FROM settled WHERE NOT ok",
        "local_mismatch": "SELECT order_id FROM settled WHERE mismatch = 1",
    }
    out: dict[str, list[Any]] = {k: [list(r) for r in db.execute(f"{sql} ORDER BY order_id LIMIT {limit}")]
                                 for k, sql in q.items()}
    out["stories"] = [story(db, order_id) for (order_id,) in db.execute(
        "SELECT order_id FROM settled WHERE NOT ok OR NOT charge_ok OR mismatch = 1 ORDER BY order_id LIMIT 3")]
    return out


def story(db: sqlite3.Connection, order_id: int) -> dict[str, Any]:
    """What happened to one offending order: its fence, each of its jobs' ends, its provider calls (seconds
    from the first), so a failed CI run can be read without the run's directory."""
    fence = db.execute("SELECT state, epoch, owner, reference FROM fences WHERE order_id = ?", (order_id,)).fetchone()
    jobs = [list(r) for r in db.execute(
        """SELECT j.job_id, j.dup, j.doomed, a.outcome, d.reason, substr(d.error, 1, 300),
                  (SELECT group_concat(f.reason || ': ' || substr(f.error, 1, 200), ' | ') FROM failed f
                   WHERE f.job_id = j.job_id), q.job_id IS NOT NULL
           FROM jobs j LEFT JOIN acked a ON a.job_id = j.job_id LEFT JOIN dead d ON d.job_id = j.job_id
           LEFT JOIN queued q ON q.job_id = j.job_id WHERE j.order_id = ? ORDER BY j.job_id""", (order_id,))]
    calls = [list(r) for r in db.execute(
        """SELECT round(ts - (SELECT min(ts) FROM p.calls), 2), caller, fault, charged, idem_key FROM p.calls
           WHERE order_id = ? ORDER BY ts""", (order_id,))]
    return {"order": order_id, "fence [state, epoch, owner, reference]": list(fence) if fence else None,
            "jobs [id, dup, doomed, acked, dead reason, dead error, failed rows, still queued]": jobs,
            "calls [s, caller, fault, charged, key]": calls}


# Without them each order's lookups scan the whole jobs table and charge log: 10,000 orders took minutes.
INDEXES = """
CREATE INDEX IF NOT EXISTS jobs_order ON jobs (order_id);
CREATE INDEX IF NOT EXISTS p.charges_order ON charges (order_id);
CREATE INDEX IF NOT EXISTS p.calls_ts ON calls (ts);
"""


def verdict(db: sqlite3.Connection, kinds: list[str], window_s: float) -> dict[str, Any]:
    """Every figure and sample the report prints (no pass/fail here: see ``run.checks``). The per-order verdict is
    computed once (a table), then counted per fault kind."""
    db.executescript(INDEXES + ORDER_VIEW)
    total = figures(db, "total", 0, "1")
    mismatch = int(db.execute("SELECT count(*) FROM settled WHERE mismatch = 1").fetchone()[0])
    lookups = db.execute("SELECT count(*), sum(found) FROM p.lookups").fetchone()
    epochs = db.execute("SELECT max(epoch), sum(epoch > 5) FROM fences").fetchone()
    return {
        "total": total.as_dict(),
        "faults": [f.as_dict() for f in per_fault(db, [k for k in KINDS if k in kinds], window_s)],
        "jobs": job_counts(db),
        "dead_reasons": dead_reasons(db),
        "local_mismatch": mismatch,
        "reconcile_lookups": {"calls": int(lookups[0] or 0), "adopted": int(lookups[1] or 0)},
        "fence_epochs": {"max": int(epochs[0] or 0), "above_5": int(epochs[1] or 0)},  # takeovers per step
        "samples": samples(db),
    }
