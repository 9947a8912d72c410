"""Reconciliation: the fence rows of one step against the provider's own records.

Throughput graphs never show a double charge; the provider's ledger does. ``reconcile`` reads every fence
row of a step and every effect the provider reports (a CSV export, a table of provider callbacks, or any
iterable of :class:`Effect`) and reports:

- ``double_effects``: subjects with more than one distinct effect (charged twice);
- ``unfenced``: effects with no fence row, or with a provider key other than the fence's (a code path that
  does not go through the fence);
- ``without_reference``: fences completed (or effected) without the provider's reference;
- ``stale_in_doubt``: in-doubt fences older than ``in_doubt_older_than_s``: a person must resolve them;
- ``owner_gone``: steps in ``calling`` or ``effected`` whose owner job left the queue (acked, dead, deleted;
  given only a store: whose fence lease is over): money may have moved and nothing will finish the step;
- ``missing_at_provider`` (informational: an export may cover a shorter period than the fence table):
  fences holding a reference the provider's records do not contain.

Example::

    from ringfence.reconcile import Effect, reconcile

    report = reconcile(app, "charge", (Effect(f"order:{c.metadata['order_id']}", c.id) for c in charges))
    assert report.exit_code == 0, report.to_dict()
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ringfence.fence.model import FenceRow, FenceState
from ringfence.fence.reads import step_rows, table_records

_SUBJECT = ("subject",)
_REFERENCE = ("reference", "ref", "id", "charge_id")
_KEY = ("provider_key", "provider key", "idempotency_key", "idempotency key")


@dataclass(frozen=True)
class Effect:
    """One effect the provider reports: the fence subject it belongs to, its reference, the key it was sent with."""

    subject: str
    reference: str | None = None
    provider_key: str | None = None


@dataclass
class ReconcileReport:
    """What reconciliation found. ``exit_code`` is 1 when any finding needs a person, else 0."""

    step: str
    fences: int = 0
    effects: int = 0
    double_effects: list[dict[str, Any]] = field(default_factory=list)
    unfenced: list[dict[str, Any]] = field(default_factory=list)
    without_reference: list[dict[str, Any]] = field(default_factory=list)
    stale_in_doubt: list[dict[str, Any]] = field(default_factory=list)
    owner_gone: list[dict[str, Any]] = field(default_factory=list)
    missing_at_provider: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return int(bool(self.double_effects or self.unfenced or self.without_reference or self.stale_in_doubt
                        or self.owner_gone))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}


def reconcile(app_or_store: Any, step: str, effects: Iterable[Effect] | None, *,
              in_doubt_older_than_s: float = 1800.0) -> ReconcileReport:
    """Compare the fence rows of ``step`` with ``effects`` (None: check the fence rows alone).

    ``app_or_store``: an App (its ``fence_store``) or a :class:`~ringfence.fence.FenceStore`.
    """
    store = getattr(app_or_store, "fence_store", app_or_store)
    rows = {r.subject: r for r in step_rows(store, step)}
    report = ReconcileReport(step, fences=len(rows))
    _check_rows(report, rows, store.db_now(), in_doubt_older_than_s)
    report.owner_gone = owner_gone(app_or_store, [r for r in rows.values() if r.state in PAST_CAPTURE])
    if effects is not None:
        _check_effects(report, rows, list(effects))
    return report


def _check_rows(report: ReconcileReport, rows: dict[str, FenceRow], now: datetime, older_s: float) -> None:
    for row in rows.values():
        done = row.state in (FenceState.COMPLETED, FenceState.EFFECTED)
        if done and not row.reference:
            report.without_reference.append({"subject": row.subject, "state": str(row.state), "epoch": row.epoch})
        if row.state == FenceState.IN_DOUBT:
            age = age_s(now, row.updated_at)
            if age >= older_s:
                report.stale_in_doubt.append({"subject": row.subject, "age_s": round(age, 1),
                                              "provider_key": row.provider_key, "request": row.request})


PAST_CAPTURE = (FenceState.CALLING, FenceState.EFFECTED)


def owner_gone(app_or_store: Any, rows: Iterable[FenceRow]) -> list[dict[str, Any]]:
    """Of ``rows`` (``calling``/``effected``), those whose owner left the queue, re-read to be sure.

    With an App, the owner is gone when its job id is in no queue of the namespace (acked, dead, deleted);
    with a store alone, when the fence's own lease is over. A row with no owner was resolved by hand and
    waits for its job's replay.
    """
    store = getattr(app_or_store, "fence_store", app_or_store)
    broker = getattr(app_or_store, "broker", None)
    rows = list(rows)
    if broker is not None:
        queued = broker.queued_ids(r.owner_job_id for r in rows if r.owner_job_id)
        suspects = [r for r in rows if r.owner_job_id not in queued]
    else:
        suspects = [r for r in rows if not r.lease_live]
    out = []
    for r in suspects:
        # A job is acked only after its step completed: a re-read after the queue check tells a race apart.
        now = store.get(r.subject, r.step)
        if now is not None and (now.state, now.epoch) == (r.state, r.epoch):
            out.append({"subject": r.subject, "step": r.step, "state": str(r.state), "epoch": r.epoch,
                        "owner_job_id": r.owner_job_id, "provider_key": r.provider_key, "reference": r.reference})
    return out


def _check_effects(report: ReconcileReport, rows: dict[str, FenceRow], effects: list[Effect]) -> None:
    report.effects = len(effects)
    by_subject: dict[str, list[Effect]] = defaultdict(list)
    for e in effects:
        by_subject[e.subject].append(e)
        row = rows.get(e.subject)
        if row is None:
            report.unfenced.append({**asdict(e), "why": "no fence row for this subject and step"})
        elif e.provider_key and e.provider_key != row.provider_key:
            report.unfenced.append({**asdict(e), "why": f"sent with key {e.provider_key!r}, the fence's key is "
                                                        f"{row.provider_key!r}: another code path"})
    for subject, found in by_subject.items():
        # The same reference exported twice is one effect; distinct references (or none at all) count apart.
        refs = {e.reference for e in found if e.reference}
        count = len(refs) + sum(1 for e in found if not e.reference)
        if count > 1:
            report.double_effects.append({"subject": subject, "count": count, "references": sorted(refs)})
    known = {e.reference for e in effects if e.reference}
    if known:
        for row in rows.values():
            if row.reference and row.reference not in known:
                report.missing_at_provider.append({"subject": row.subject, "reference": row.reference})


def age_s(now: datetime, then: datetime | None) -> float:
    """Seconds from ``then`` to ``now``; a ``then`` ahead of ``now`` is 0: it was written by a clock ahead of this
    one (on SQLite each writing process's clock is the database's), and the row is new, not missing."""
    if then is None:
        return 0.0
    if (now.tzinfo is None) != (then.tzinfo is None):  # SQLite gives naive UTC times, others aware ones
        now, then = now.replace(tzinfo=None), then.replace(tzinfo=None)
    return max((now - then).total_seconds(), 0.0)


# -- sources ---------------------------------------------------------------------------------------
def _column(header: list[str], names: tuple[str, ...], what: str, required: bool) -> str | None:
    lowered = {h.strip().lower(): h for h in header}
    for name in names:
        if name in lowered:
            return lowered[name]
    if required:
        raise ValueError(f"the CSV has no {what} column (looked for {', '.join(names)}; found {', '.join(header)})")
    return None


def read_csv(path: str | Path, subject_template: str = "{}") -> Iterator[Effect]:
    """Effects from a CSV export with columns ``subject`` and optionally ``reference`` and ``provider_key``.

    ``subject_template`` maps the exported value to the fence subject, e.g. ``"order:{}"``.
    """
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        subject = _column(header, _SUBJECT, "subject", True)
        reference = _column(header, _REFERENCE, "reference", False)
        key = _column(header, _KEY, "provider key", False)
        for rec in reader:
            yield Effect(subject_template.format(rec[subject or "subject"].strip()),
                         (rec[reference] or None) if reference else None, (rec[key] or None) if key else None)


def read_table(app_or_store: Any, table: str, *, subject_column: str, reference_column: str | None = None,
               key_column: str | None = None, subject_template: str = "{}") -> Iterator[Effect]:
    """Effects from a table of provider callbacks in the fence database."""
    store = getattr(app_or_store, "fence_store", app_or_store)
    for subject, reference, key in table_records(store, table, [subject_column, reference_column, key_column]):
        yield Effect(subject_template.format(subject), None if reference is None else str(reference),
                     None if key is None else str(key))


def declared_effects(app: Any, step: str) -> list[Effect] | None:
    """The provider's records of ``step`` from the source the App declares (``app.reconcile_source``), or None
    when it declares none. A function's items must be :class:`Effect`; a table's rows become effects."""
    from ringfence.errors import ConfigError

    source = app.reconcile_sources.get(step)
    if source is None:
        return None
    if not callable(source):
        return [Effect(s, r, k) for s, r, k in source.rows(app.fence_store)]
    found = list(source())
    wrong = next((e for e in found if not isinstance(e, Effect)), None)
    if wrong is not None:
        raise ConfigError(f"the reconcile source of step {step!r} returned {type(wrong).__name__}, not Effect")
    return found
