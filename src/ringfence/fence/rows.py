"""A fence row from a result mapping, and the error of a write that lost its epoch (shared by the sync and the
async store)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import FencedOut
from .model import FenceRow, FenceState


def fenced_out(subject: str, step: str, epoch: int, states: Sequence[FenceState] | None) -> FencedOut:
    want = "" if states is None else f" in state {'/'.join(s.value for s in states)}"
    return FencedOut(f"fence {subject!r}/{step!r}: epoch {epoch}{want} is no longer current; "
                     "another run took it over or a person resolved it")


def row_of(m: Any) -> FenceRow:
    """A :class:`FenceRow` from a result row's mapping (the table's columns and ``lease_live``)."""
    return FenceRow(
        subject=m["subject"], step=m["step"], state=FenceState(m["state"]), epoch=int(m["epoch"]),
        owner_job_id=m["owner_job_id"], owner_token=m["owner_token"], params_hash=m["params_hash"],
        provider_key=m["provider_key"], request=m["request"], reference=m["reference"],
        result=m["result"], retention_s=m["retention_s"], lease_live=bool(m["lease_live"]),
        lease_until=m["lease_until"], created_at=m["created_at"], updated_at=m["updated_at"],
        calling_at=m["calling_at"], completed_at=m["completed_at"])
