"""Ownership is (job id, token): one fetch batch shares a lease token across its jobs."""

from __future__ import annotations

import pytest

from ringfence.errors import FenceBusy
from ringfence.fence import Fences, FenceStore, Owner


def test_two_jobs_with_one_batch_token_do_not_share_a_fence(tmp_path) -> None:
    store = FenceStore(f"sqlite:///{tmp_path}/f.db")
    store.create_all()
    alive = {("a", "w1.7"), ("b", "w1.7")}
    probe = lambda job, token: (job, token) in alive  # noqa: E731
    calls = []
    with Fences(store, Owner("a", "w1.7", 60, probe)).open("order:1", "charge") as step:
        step.effect(lambda: calls.append("a") or "ch_1")
        with pytest.raises(FenceBusy), Fences(store, Owner("b", "w1.7", 60, probe)).open("order:1", "charge"):
            calls.append("b")
    assert calls == ["a"]
