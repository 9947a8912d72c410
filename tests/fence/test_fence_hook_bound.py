"""The reconcile hook's time bound, checked at its start against the attempt's deadline, on every database."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest
from fence_helpers import Backend, OwnerFactory, Provider
from test_fence_protocol import charge, kill_at

from ringfence import faults
from ringfence.errors import InDoubt, ReconcileTimeout
from ringfence.fence import Fences, FenceState


def in_doubt_step(b: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    with kill_at("after_effect"), pytest.raises(faults.SimulatedKill):
        charge(b, make_owner("job-h"), subject, provider)


def test_hook_not_started_when_its_bound_does_not_fit(backend: Backend, subject: str, provider: Provider,
                                                      make_owner: OwnerFactory) -> None:
    in_doubt_step(backend, subject, provider, make_owner)
    asked: list[str] = []
    late = replace(make_owner("job-h"), deadline=time.monotonic() + 1.0, budget_s=60.0)
    with pytest.raises(ReconcileTimeout, match="may take up to 5s"):
        charge(backend, late, subject, provider, reconcile=lambda k, r: asked.append(k), reconcile_timeout_s=5)
    row = backend.store.get(subject, "charge")
    assert asked == [] and row is not None and row.state is FenceState.CALLING  # left for the next attempt
    on_time = replace(make_owner("job-h"), deadline=time.monotonic() + 30.0, budget_s=60.0)
    charge(backend, on_time, subject, provider, reconcile=provider.lookup, reconcile_timeout_s=5)
    assert backend.store.get(subject, "charge").state is FenceState.COMPLETED
    assert provider.effects == 1


def test_bound_longer_than_the_job_timeout_parks(backend: Backend, subject: str, provider: Provider,
                                                 make_owner: OwnerFactory) -> None:
    in_doubt_step(backend, subject, provider, make_owner)
    owner = replace(make_owner("job-h"), deadline=time.monotonic() + 10.0, budget_s=10.0)
    with pytest.raises(InDoubt, match="reconcile_timeout_s=20 exceeds the job's timeout of 10s"):
        charge(backend, owner, subject, provider, reconcile=provider.lookup, reconcile_timeout_s=20)
    assert backend.store.get(subject, "charge").state is FenceState.IN_DOUBT


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_async_step_stops_waiting_for_a_hook_at_its_bound(backend: Backend, subject: str, provider: Provider,
                                                          make_owner: OwnerFactory, kind: str) -> None:
    in_doubt_step(backend, subject, provider, make_owner)

    async def slow_async(key: str, request: Any) -> str | None:
        await asyncio.sleep(3)
        return provider.lookup(key)

    def slow_sync(key: str, request: Any) -> str | None:
        time.sleep(3)
        return provider.lookup(key)

    waited: list[float] = []

    async def run() -> None:
        opened = Fences(backend.store, make_owner("job-h")).open(
            subject, "charge", params={"amount": 500}, reconcile=slow_async if kind == "async" else slow_sync,
            reconcile_timeout_s=0.3)
        started = time.monotonic()
        try:
            async with opened:
                raise AssertionError("not reached")
        finally:
            waited.append(time.monotonic() - started)

    with pytest.raises(ReconcileTimeout, match=r"did not answer within reconcile_timeout_s=0\.3s"):
        asyncio.run(run())  # (asyncio.run itself then waits for a sync hook's thread to end)
    assert waited[0] < 2.0
    assert backend.store.get(subject, "charge").state is FenceState.CALLING
