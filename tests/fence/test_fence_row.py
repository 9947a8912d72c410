"""``FenceRow.but``: the row as written, without ``dataclasses.replace``'s per-call cost."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from ringfence.fence import FenceState
from ringfence.fence.model import FenceRow


def _row() -> FenceRow:
    return FenceRow(subject="s", step="charge", state=FenceState.CLAIMED, epoch=3, owner_job_id="j",
                    owner_token="t", params_hash="h", provider_key="k", retention_s=60.0, lease_live=True,
                    created_at=datetime(2026, 12, 1, tzinfo=UTC))


def test_replaced_is_replace_and_leaves_the_row_alone() -> None:
    row = _row()
    new = row.replaced(state=FenceState.EFFECTED, reference="ref-1")
    assert new == replace(row, state=FenceState.EFFECTED, reference="ref-1")
    assert type(new) is FenceRow and new is not row
    assert row.state is FenceState.CLAIMED and row.reference is None  # the old row is unchanged
    with pytest.raises(AttributeError):  # still frozen
        new.epoch = 4  # type: ignore[misc]


def test_replaced_refuses_a_field_the_row_does_not_have() -> None:
    with pytest.raises(TypeError, match="refrence"):
        _row().replaced(refrence="x")
