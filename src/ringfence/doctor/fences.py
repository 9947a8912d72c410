"""Fence checks: in-doubt rows waiting for a person, and fence rows against the provider's effects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ringfence.doctor.context import Context
from ringfence.doctor.model import Finding, Status, check


def _store(ctx: Context) -> object | None:
    # Without a configured fence database, app.fence_store would create ./ringfence.db: never from the doctor.
    return ctx.app.fence_store if ctx.app.fence_url else None


def _rows(ctx: Context, states: tuple[str, ...]) -> list[Any]:
    """Fence rows in ``states``; raises :class:`Unusable` when the fence database cannot be used."""
    try:
        store: Any = _store(ctx)
        return [r for state in states for r in store.list_steps(state=state, limit=1000)]
    except Exception as exc:
        from ringfence.fence.schema import unusable_database

        found = unusable_database(exc, str(ctx.app.fence_url))
        if found is None:
            raise
        raise Unusable(*found) from exc


class Unusable(Exception):
    """The fence database cannot be used: one line, and whether it does not answer (vs. is not set up)."""

    def __init__(self, line: str, unreachable: bool) -> None:
        super().__init__(line)
        self.unreachable = unreachable

    def finding(self, check: str, status: Status) -> Finding:
        return Finding(
            check, status, subject="fence_database", symptom=str(self),
            hypothesis="the fence database does not answer" if self.unreachable else
            "fence_url names a database whose fence tables were never created (fences and the outbox need them)",
            remedy="check that the database is up and fence_url points at it" if self.unreachable else
            "run `ringfence fence init` with this fence_url (or apply the DDL the line names in a migration)")


@check("in_doubt", "no fence is in doubt")
def in_doubt(ctx: Context) -> Iterator[Finding]:
    if not ctx.app.fence_url:
        yield Finding("in_doubt", Status.SKIPPED, symptom="no fence database configured (fence_url)")
        return
    from ringfence.reconcile import age_s

    try:
        rows = _rows(ctx, ("in_doubt",))
    except Unusable as exc:
        yield exc.finding("in_doubt", Status.WARNING)  # said once, here; the other fence checks skip
        return
    if not rows:
        return
    now = ctx.app.fence_store.db_now()
    ages = sorted((age_s(now, r.updated_at) for r in rows), reverse=True)
    old = [a for a in ages if a >= ctx.thresholds.in_doubt_older_than_s]
    if not old:
        return
    sample = ", ".join(f"{r.subject}/{r.step}" for r in rows[:5])
    yield Finding(
        "in_doubt", Status.FAILURE, subject="fences",
        symptom=f"{len(old)} fence(s) in doubt, the oldest for {ages[0]:.0f}s: {sample}",
        hypothesis="a run died after the provider call left and before its answer was recorded; nobody can "
                   "tell whether the effect happened",
        remedy="look each one up at the provider by its provider_key, then "
               "`ringfence fence resolve SUBJECT STEP --done --reference REF` if it happened, else "
               "`ringfence fence resolve SUBJECT STEP --not-done`; then `ringfence dead replay JOB_ID`",
        numbers={"in_doubt": len(old), "oldest_s": round(ages[0], 1)})


@check("owner_gone", "no step past capture is left by a gone job")
def owner_gone(ctx: Context) -> Iterator[Finding]:
    if not ctx.app.fence_url:
        yield Finding("owner_gone", Status.SKIPPED, symptom="no fence database configured (fence_url)")
        return
    from ringfence.reconcile import PAST_CAPTURE, owner_gone

    try:
        rows = _rows(ctx, PAST_CAPTURE)
    except Unusable as exc:
        yield exc.finding("owner_gone", Status.SKIPPED)
        return
    gone = owner_gone(ctx.app, rows)
    if not gone:
        return
    sample = ", ".join(f"{g['subject']}/{g['step']} ({g['state']}, job {g['owner_job_id']})" for g in gone[:5])
    yield Finding(
        "owner_gone", Status.FAILURE, subject="fences",
        symptom=f"{len(gone)} step(s) past capture whose job left the queue: {sample}",
        hypothesis="the job was acked, dead-lettered or deleted after its effect left (a handler that swallowed "
                   "the step's error, a crash while dead-lettering, or a dead job deleted): the effect may have "
                   "happened and nothing will finish the step",
        remedy="calling: look the effect up at the provider by its provider_key, then "
               "`ringfence fence resolve SUBJECT STEP --done --reference REF` or "
               "`ringfence fence resolve SUBJECT STEP --not-done`; "
               "effected: replay the job (`ringfence dead replay ID`) so it completes with the stored reference",
        numbers={"owner_gone": len(gone), "steps": gone[:20]})


@check("effects", "fence rows match the provider's effects", cheap=False)
def effects(ctx: Context) -> Iterator[Finding]:
    if ctx.effects is None or ctx.step is None or _store(ctx) is None:
        yield Finding("effects", Status.SKIPPED,
                      symptom="no effects source given: pass --step and --effects, or run "
                              "`ringfence reconcile --step STEP --effects FILE`")
        return
    from ringfence.reconcile import reconcile

    r = reconcile(ctx.app, ctx.step, ctx.effects, in_doubt_older_than_s=ctx.thresholds.in_doubt_older_than_s)
    if r.double_effects or r.unfenced:
        yield Finding(
            "effects", Status.FAILURE, subject=ctx.step,
            symptom=(f"step {ctx.step}: {len(r.double_effects)} subject(s) with more than one effect, "
                     f"{len(r.unfenced)} effect(s) without a matching fence row "
                     f"({r.effects} effects, {r.fences} fences)"),
            hypothesis="a code path calls the provider without the fence, or the provider key is not forwarded",
            remedy="route every call through ctx.fence(...) and pass step.key as the idempotency key; refund "
                   "the doubles (`ringfence reconcile --step STEP --effects FILE --json` lists them)",
            numbers={"double_effects": r.double_effects[:20], "unfenced": r.unfenced[:20]})
    if r.without_reference:
        yield Finding(
            "effects", Status.WARNING, subject=f"{ctx.step}:reference",
            symptom=f"step {ctx.step}: {len(r.without_reference)} fence(s) completed without a provider reference",
            hypothesis="the effect's reference is not returned from step.effect(...) (or reference=... is missing)",
            remedy="return the provider's id from the effect function so it is recorded on the fence",
            numbers={"without_reference": r.without_reference[:20]})
