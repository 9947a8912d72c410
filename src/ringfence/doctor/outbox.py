"""Outbox checks: committed rows waiting longer than a threshold for the relay, and rows the relay parked
(docs/outbox.md)."""

from __future__ import annotations

from collections.abc import Iterator

from ringfence.doctor.context import Context
from ringfence.doctor.model import Finding, Status, check


@check("outbox_lag", "no outbox row waits longer than the threshold for the relay")
def outbox_lag(ctx: Context) -> Iterator[Finding]:
    from ringfence.outbox.lag import outbox_lag as read_lag

    lag = read_lag(ctx.app)
    if lag is None:
        yield Finding("outbox_lag", Status.SKIPPED, symptom="no outbox table in the app's database (fence_url)")
        return
    limit = ctx.thresholds.outbox_lag_warn_s
    if lag["waiting"] == 0 or lag["oldest_s"] < limit:
        return
    symptom = f"{lag['waiting']} outbox row(s) wait for the relay, the oldest for {lag['oldest_s']:.0f}s"
    if lag["relay"] is None:
        yield Finding(
            "outbox_lag", Status.FAILURE, subject="outbox", symptom=symptom + "; no relay holds the lease",
            hypothesis="no relay runs: committed jobs stay in the table and never reach Redis",
            remedy="start one: `ringfence relay --app APP` (or WorkerSettings(relay_outbox_s=1.0) in the workers)",
            numbers=lag)
        return
    yield Finding(
        "outbox_lag", Status.WARNING, subject="outbox", symptom=symptom + f"; relay {lag['relay']} holds the lease",
        hypothesis="the relay cannot keep up or cannot send (Redis full or unreachable, the database slow); its "
                   "log says which",
        remedy="read the relay's log; drain by hand with `ringfence relay --app APP --once --batch 500` once the "
               "lease is free, or raise the relay's --batch",
        numbers=lag)


@check("outbox_parked", "the relay parked no outbox row")
def outbox_parked(ctx: Context) -> Iterator[Finding]:
    """The relay sent the other rows; these need a person."""
    from ringfence.outbox.lag import outbox_lag as read_lag
    from ringfence.outbox.store import OutboxStore

    lag = read_lag(ctx.app)
    if lag is None:
        yield Finding("outbox_parked", Status.SKIPPED, symptom="no outbox table in the app's database (fence_url)")
        return
    if not lag["parked"]:
        return

    rows = OutboxStore(ctx.app.fence_store.engine, ctx.app.namespace).parked(limit=3)
    shown = "; ".join(f"row {r['id']} (job {r['job_id']}): {r['reason']}" for r in rows)
    yield Finding(
        "outbox_parked", Status.FAILURE, subject="outbox",
        symptom=f"{lag['parked']} outbox row(s) parked by the relay, not sent: {shown}",
        hypothesis="a row the relay cannot send as it is (written by hand or by another program), or a durable "
                   "row no replica confirmed",
        remedy="list them with `ringfence outbox status --app APP`; fix the cause (the row, or the replicas), then "
               "`ringfence outbox retry --app APP ROW_ID`, or delete the row if its job must not run",
        numbers={"parked": lag["parked"]})
