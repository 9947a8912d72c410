"""What the project's own doctor says about the run's fences at the end: every fence that is not completed must
be visible there (``in_doubt``, or ``owner_gone`` for a step past capture whose job left the queue)."""

from __future__ import annotations

from typing import Any

from ringfence.app import App
from ringfence.doctor import Context, Snapshot, Thresholds, run_checks


def fence_findings(app: App) -> dict[str, Any]:
    """``{"in_doubt": n, "owner_gone": m}`` as the doctor counts them (or the error when a check failed)."""
    snap = Snapshot.take(app.broker)
    ctx = Context(app, snap, snap, Thresholds(sample_s=0.0, in_doubt_older_than_s=0.0))
    out: dict[str, Any] = {"in_doubt": 0, "owner_gone": 0}
    for f in run_checks(ctx, ["in_doubt", "owner_gone"], with_ok=False):
        if f.check in f.numbers:
            out[f.check] = int(f.numbers[f.check])
        else:
            out.setdefault("errors", []).append(f"{f.check}: {f.symptom}")
    return out
