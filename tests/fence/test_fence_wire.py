"""What one fenced step costs on the wire (PostgreSQL, MariaDB), counted as ``python -m bench --only fence`` counts
it (libpq's protocol trace / PyMySQL's commands), and the rules of a step captured already ``calling``."""

from __future__ import annotations

from typing import Any

import pytest
from bench.fence_bench import summarize, transactions, wire_trace
from fence_helpers import Backend, OwnerFactory, Provider

from ringfence import faults
from ringfence.fence import Fences, FenceState, FenceStore

DEDUP = {"provider_dedup": True, "key_window_s": 3600}


def one_job(store: FenceStore, owner: Any, subject: str, provider: Provider, **opts: Any) -> None:
    with Fences(store, owner).open(subject, "charge", params={"amount": 5}, **opts) as step:
        if step.done:
            return
        ref = step.effect(lambda: provider.charge(5, idempotency_key=step.key))
        with step.complete(store.engine, result={"ref": ref}):
            pass


@pytest.fixture
def url_store(backend: Backend) -> Any:
    """A store built from the URL, as ``App(fence_url=...)`` builds it."""
    if backend.name == "sqlite":
        pytest.skip("counted on PostgreSQL and MariaDB")
    store = FenceStore(backend.url, table_name=backend.store.table.name)
    try:
        yield store
    finally:
        store.engine.dispose()


@pytest.mark.parametrize(("opts", "trips", "xacts"), [(DEDUP, 4, 3), ({}, 5, 4)], ids=["dedup", "strict"])
def test_round_trips_and_transactions_of_one_fenced_step(url_store: FenceStore, subject: str, provider: Provider,
                                                         make_owner: OwnerFactory, opts: dict[str, Any],
                                                         trips: int, xacts: int) -> None:
    one_job(url_store, make_owner(), f"{subject}-warm", provider, **opts)  # connect, warm the caches
    with wire_trace(url_store.engine) as fresh:
        one_job(url_store, make_owner(), subject, provider, **opts)
    with wire_trace(url_store.engine) as rerun:
        one_job(url_store, make_owner(), subject, provider, **opts)
    assert len(fresh) <= trips and transactions(fresh) <= xacts, summarize(fresh)
    assert len(rerun) <= 1 and transactions(rerun) <= 1, summarize(rerun)
    row = url_store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and provider.effects == 2  # warm-up + this one


def test_a_dedup_step_is_captured_calling_and_a_failed_block_puts_it_back(
        backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    with pytest.raises(ValueError), Fences(backend.store, make_owner()).open(subject, "charge", params={"a": 1},
                                                                             **DEDUP):
        row = backend.store.get(subject, "charge")
        assert row is not None and row.state is FenceState.CALLING and row.request == '{"a":1}'
        raise ValueError("bad input before the effect")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and row.request is None and not row.lease_live


def test_a_dedup_step_without_an_effect_completes(backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    with Fences(backend.store, make_owner()).open(subject, "charge", params={"a": 1}, **DEDUP) as step:
        assert not step.done
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED


def test_a_dedup_step_stores_the_request_its_effect_names(backend: Backend, subject: str, provider: Provider,
                                                          make_owner: OwnerFactory) -> None:
    with Fences(backend.store, make_owner()).open(subject, "charge", params={"a": 1}, **DEDUP) as step:
        step.effect(lambda: provider.charge(5, idempotency_key=step.key), request={"amount": 5})
        assert step.request == {"amount": 5}
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.request_value == {"amount": 5}


def test_a_dedup_step_killed_before_its_call_is_replayed_with_the_same_key(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """Killed right after the capture (already calling): the rerun finds calling with no reference and replays
    with the same key, as the in-doubt rule says; the provider sees one effect."""
    fired: list[str] = []

    def kill(name: str) -> None:
        if name == "after_capture" and not fired:
            fired.append(name)
            raise faults.SimulatedKill(name)

    with pytest.raises(faults.SimulatedKill), faults.inject(kill):
        one_job(backend.store, make_owner(), subject, provider, **DEDUP)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CALLING and provider.calls == []
    one_job(backend.store, make_owner(), subject, provider, **DEDUP)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2 and provider.effects == 1


def test_a_strict_step_killed_after_capture_is_still_taken_over(
        backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory) -> None:
    """Without provider_dedup the capture stays ``claimed``: a kill before the call is a safe takeover."""
    with pytest.raises(faults.SimulatedKill), faults.inject(
            lambda name: (_ for _ in ()).throw(faults.SimulatedKill(name)) if name == "after_capture" else None):
        one_job(backend.store, make_owner(), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED
    one_job(backend.store, make_owner(), subject, provider)
    assert provider.effects == 1


def test_a_settling_run_never_captures_calling(backend: Backend, subject: str, make_owner: OwnerFactory) -> None:
    from dataclasses import replace

    from ringfence.errors import SettleOnly

    owner = replace(make_owner(), settle_only=True)
    with pytest.raises(SettleOnly), Fences(backend.store, owner).open(subject, "charge", params={"a": 1},
                                                                      **DEDUP) as step:
        assert backend.store.get(subject, "charge").state is FenceState.CLAIMED  # type: ignore[union-attr]
        step.effect(lambda: "never")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and not row.lease_live
