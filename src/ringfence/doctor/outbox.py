"""Outbox check: committed rows waiting longer than a threshold for the relay (docs/outbox.md)."""

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
