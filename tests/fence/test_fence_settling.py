"""The settling run of a job whose attempts were used up by orphaned runs, and the steps a job owns, on every
database."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from fence_helpers import Backend, OwnerFactory, Provider
from test_fence_protocol import charge, kill_at

from ringfence import faults
from ringfence.errors import SettleOnly
from ringfence.fence import FenceState


def test_settling_run_replays_an_in_doubt_step(backend: Backend, subject: str, provider: Provider,
                                               make_owner: OwnerFactory) -> None:
    with kill_at("after_effect"), pytest.raises(faults.SimulatedKill):
        charge(backend, make_owner("job-s"), subject, provider, provider_dedup=True, key_window_s=3600)
    settling = replace(make_owner("job-s"), settle_only=True)
    charge(backend, settling, subject, provider, provider_dedup=True, key_window_s=3600)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2
    assert provider.effects == 1 and len(provider.calls) == 2  # the replay, with the same key


def test_settling_run_starts_no_new_effect(backend: Backend, subject: str, provider: Provider,
                                           make_owner: OwnerFactory) -> None:
    with kill_at("after_capture"), pytest.raises(faults.SimulatedKill):
        charge(backend, make_owner("job-s"), subject, provider)  # claimed: nothing left the network
    with pytest.raises(SettleOnly, match="settling run"):
        charge(backend, replace(make_owner("job-s"), settle_only=True), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and not row.lease_live  # released for a replay
    assert provider.calls == []


def test_owned_lists_a_jobs_steps_past_capture(backend: Backend, provider: Provider,
                                               make_owner: OwnerFactory) -> None:
    job = f"job-{uuid.uuid4().hex[:8]}"
    subjects = [f"order:{uuid.uuid4().hex[:12]}" for _ in range(4)]
    for subject, point in zip(subjects, ("after_capture", "after_effect", "after_record"), strict=False):
        with kill_at(point), pytest.raises(faults.SimulatedKill):
            charge(backend, make_owner(job), subject, provider)
    charge(backend, make_owner(job), subjects[3], provider)  # completed
    owned = {r.subject: r.state for r in backend.store.owned(job)}
    assert owned == {subjects[1]: FenceState.CALLING, subjects[2]: FenceState.EFFECTED}
    assert backend.store.owned("another-job") == []
