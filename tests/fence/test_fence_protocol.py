"""The fence protocol's rerun rules, on every database. Assertions are on rows and counters."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from fence_helpers import Backend, OwnerFactory, Provider

from ringfence import faults
from ringfence.errors import FenceBusy, FenceConflict, FencedOut, InDoubt, RetryLater
from ringfence.fence import NOT_HAPPENED, Fences, FenceState, Owner
from support import kill_at


def charge(b: Backend, owner: Owner, subject: str, provider: Provider, amount: int = 500,
           **opts: Any) -> Any:
    """The handler under test: charge once, store the charge id on the order, complete."""
    with Fences(b.store, owner).open(subject, "charge", params={"amount": amount}, **opts) as step:
        if step.done:
            return step.result
        charge_id = step.effect(lambda: provider.charge(amount, idempotency_key=step.key))
        with step.complete(b.engine, result={"charge_id": charge_id}) as conn:
            conn.execute(b.orders.insert().values(id=subject, charge_id=charge_id))
        return {"charge_id": charge_id}


def order_charge(b: Backend, subject: str) -> list[str]:
    with b.engine.connect() as conn:
        return list(conn.execute(sa.select(b.orders.c.charge_id).where(b.orders.c.id == subject)).scalars())


def test_same_job_twice_one_effect(backend: Backend, subject: str, provider: Provider,
                                   make_owner: OwnerFactory) -> None:
    first = charge(backend, make_owner(), subject, provider)
    second = charge(backend, make_owner(), subject, provider)  # redelivery: new token, old owner dead
    assert first == second
    assert provider.effects == 1 and len(provider.calls) == 1
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 1
    assert row.reference == first["charge_id"] and row.result_value == first
    assert order_charge(backend, subject) == [first["charge_id"]]


def test_duplicate_job_while_owner_alive_exits_busy(backend: Backend, subject: str, provider: Provider,
                                                   make_owner: OwnerFactory) -> None:
    a = make_owner("job-a")
    with Fences(backend.store, a).open(subject, "charge", params={"amount": 500}) as step:
        before = backend.store.get(subject, "charge")
        with pytest.raises(FenceBusy):
            charge(backend, make_owner("job-b", alive="live"), subject, provider)
        assert backend.store.get(subject, "charge") == before  # untouched
        step.effect(lambda: provider.charge(500, idempotency_key=step.key))
    charge(backend, make_owner("job-b", alive="live"), subject, provider)  # now done: nothing happens
    assert provider.effects == 1 and len(provider.calls) == 1


def test_own_redelivery_while_owner_alive_retries_later(backend: Backend, subject: str,
                                                       make_owner: OwnerFactory, provider: Provider) -> None:
    with Fences(backend.store, make_owner("job-1")).open(subject, "charge", params={"amount": 500}):
        before = backend.store.get(subject, "charge")
        with pytest.raises(RetryLater) as info:
            charge(backend, make_owner("job-1", alive="live"), subject, provider)
        first = info.value.delay_s
        assert first >= 0.5
        assert backend.store.get(subject, "charge") == before
        time.sleep(2.5)  # the owner holds it longer: the next rerun backs off longer
        with pytest.raises(RetryLater) as info:
            charge(backend, make_owner("job-1", alive="live"), subject, provider)
        assert info.value.delay_s >= 1.2 > first
        assert backend.store.get(subject, "charge") == before
    assert provider.calls == []


def test_no_probe_falls_back_to_db_lease(backend: Backend, subject: str, provider: Provider) -> None:
    short = Owner("job-a", "tok-a", lease_s=0.4)
    with pytest.raises(faults.SimulatedKill), kill_at("after_capture"):
        charge(backend, short, subject, provider)
    with pytest.raises(FenceBusy):  # lease_until > now (database clock)
        charge(backend, Owner("job-b", "tok-b", lease_s=30), subject, provider)
    time.sleep(0.6)
    charge(backend, Owner("job-b", "tok-b2", lease_s=30), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.epoch == 2 and row.owner_job_id == "job-b"
    assert row.state is FenceState.COMPLETED and provider.effects == 1


def test_many_jobs_racing_one_wins(backend: Backend, subject: str, provider: Provider,
                                   make_owner: OwnerFactory) -> None:
    outcomes: list[str] = []
    gate = threading.Barrier(6)

    def run(i: int) -> None:
        gate.wait()
        try:
            charge(backend, make_owner(f"job-{i}", alive="live"), subject, provider)
            outcomes.append("ran")
        except FenceBusy:
            outcomes.append("busy")
        except FenceConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The winner ran; each loser either met the live owner (busy) or the completed row (done → "ran").
    assert "conflict" not in outcomes and outcomes.count("ran") + outcomes.count("busy") == 6
    assert provider.effects == 1 and len(provider.calls) == 1


def test_crash_after_capture_takes_over_once(backend: Backend, subject: str, provider: Provider,
                                            make_owner: OwnerFactory) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_capture"):
        charge(backend, make_owner(), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and provider.calls == []
    charge(backend, make_owner(), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.epoch == 2
    assert provider.effects == 1 and len(provider.calls) == 1


def test_recorded_reference_skips_the_call(backend: Backend, subject: str, provider: Provider,
                                          make_owner: OwnerFactory) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_record"):
        charge(backend, make_owner(), subject, provider)
    stored = backend.store.get(subject, "charge")
    assert stored is not None and stored.state is FenceState.EFFECTED and stored.reference
    assert order_charge(backend, subject) == []
    charge(backend, make_owner(), subject, provider)
    assert len(provider.calls) == 1  # the second run did not call
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED and row.reference == stored.reference
    assert order_charge(backend, subject) == [stored.reference]


def test_in_doubt_replays_same_key_within_window(backend: Backend, subject: str, provider: Provider,
                                                make_owner: OwnerFactory) -> None:
    opts = {"provider_dedup": True, "key_window_s": 3600}
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        charge(backend, make_owner(), subject, provider, **opts)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CALLING and row.reference is None
    charge(backend, make_owner(), subject, provider, **opts)
    assert len(provider.calls) == 2 and provider.calls[0] == provider.calls[1] == row.provider_key
    assert provider.effects == 1
    done = backend.store.get(subject, "charge")
    assert done is not None and done.state is FenceState.COMPLETED
    assert done.calling_at == row.calling_at  # the window is measured from the first call
    assert order_charge(backend, subject) == [next(iter(provider.charges))]


def test_in_doubt_after_window_parks(backend: Backend, subject: str, provider: Provider,
                                     make_owner: OwnerFactory) -> None:
    opts = {"provider_dedup": True, "key_window_s": 0.3}
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        charge(backend, make_owner(), subject, provider, **opts)
    time.sleep(0.5)
    with pytest.raises(InDoubt):
        charge(backend, make_owner(), subject, provider, **opts)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.IN_DOUBT and row.epoch == 2
    assert len(provider.calls) == 1


def test_reconcile_adopts_the_providers_reference(backend: Backend, subject: str, provider: Provider,
                                                  make_owner: OwnerFactory) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        charge(backend, make_owner(), subject, provider, reconcile=provider.lookup)
    charge(backend, make_owner(), subject, provider, reconcile=provider.lookup)
    assert len(provider.calls) == 1 and provider.effects == 1
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED
    assert row.reference == next(iter(provider.charges))


def test_reconcile_not_happened_calls_again(backend: Backend, subject: str, provider: Provider,
                                            make_owner: OwnerFactory) -> None:
    asked: list[tuple[str, Any]] = []

    def reconcile(key: str, request: Any) -> Any:
        asked.append((key, request))
        return provider.lookup(key) or NOT_HAPPENED

    with pytest.raises(faults.SimulatedKill), kill_at("after_calling"):  # died before the call left
        charge(backend, make_owner(), subject, provider, reconcile=reconcile)
    charge(backend, make_owner(), subject, provider, reconcile=reconcile)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.COMPLETED
    assert asked == [(row.provider_key, {"amount": 500})]  # the stored request reached the hook
    assert len(provider.calls) == 1 and provider.effects == 1


def test_reconcile_unknown_parks_and_stays_parked(backend: Backend, subject: str, provider: Provider,
                                                  make_owner: OwnerFactory) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        charge(backend, make_owner(), subject, provider, reconcile=lambda key, req: None)
    with pytest.raises(InDoubt):
        charge(backend, make_owner(), subject, provider, reconcile=lambda key, req: None)
    parked = backend.store.get(subject, "charge")
    assert parked is not None and parked.state is FenceState.IN_DOUBT
    for job in ("job-1", "job-2"):  # any later run, any job: still parked, nothing called
        with pytest.raises(InDoubt):
            charge(backend, make_owner(job), subject, provider, provider_dedup=True, key_window_s=3600)
    assert backend.store.get(subject, "charge") == parked
    assert len(provider.calls) == 1
    assert [r.subject for r in backend.store.list_steps(state="in_doubt", subject=subject)] == [subject]


def test_park_without_options(backend: Backend, subject: str, provider: Provider,
                              make_owner: OwnerFactory) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        charge(backend, make_owner(), subject, provider)
    with pytest.raises(InDoubt, match="in doubt"):
        charge(backend, make_owner(), subject, provider)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.IN_DOUBT and len(provider.calls) == 1


@pytest.mark.parametrize("happened", [True, False])
def test_resolve_by_hand(backend: Backend, subject: str, provider: Provider, make_owner: OwnerFactory,
                         happened: bool) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        charge(backend, make_owner(), subject, provider)
    with pytest.raises(InDoubt):
        charge(backend, make_owner(), subject, provider)
    ref = next(iter(provider.charges))
    row = backend.store.resolve(subject, "charge", happened=happened, reference=ref if happened else None)
    assert row.epoch == 3 and row.owner_token is None
    assert row.state is (FenceState.EFFECTED if happened else FenceState.CLAIMED)
    charge(backend, make_owner(), subject, provider)
    done = backend.store.get(subject, "charge")
    assert done is not None and done.state is FenceState.COMPLETED
    assert len(provider.calls) == (1 if happened else 2)
    assert order_charge(backend, subject) == [done.reference]
    if happened:
        assert done.reference == ref


def test_conflict_leaves_row_untouched(backend: Backend, subject: str, provider: Provider,
                                       make_owner: OwnerFactory) -> None:
    with pytest.raises(faults.SimulatedKill), kill_at("after_calling"):
        charge(backend, make_owner(), subject, provider)
    before = backend.store.get(subject, "charge")
    with pytest.raises(FenceConflict) as info:
        charge(backend, make_owner(), subject, provider, amount=999)
    assert backend.store.get(subject, "charge") == before
    assert subject in str(info.value) and "charge" in str(info.value)
    assert before is not None and before.params_hash[:12] in str(info.value)
    assert provider.calls == []


def test_zombie_cannot_record_or_complete(backend: Backend, subject: str, provider: Provider,
                                          make_owner: OwnerFactory) -> None:
    zombie = make_owner("job-1")
    # Even the zombie's clean exit (auto-complete) is fenced out.
    with pytest.raises(FencedOut), \
            Fences(backend.store, zombie).open(subject, "charge", params={"amount": 500}) as old:
        # While the zombie is paused, a redelivery takes over (the broker says its lease ended).
        with Fences(backend.store, make_owner("job-1")).open(subject, "charge",
                                                             params={"amount": 500}) as new:
            assert new.epoch == old.epoch + 1
            with pytest.raises(FencedOut):
                old.effect(lambda: provider.charge(500, idempotency_key=old.key))
            assert provider.calls == []  # fenced before the call left
            ref = new.effect(lambda: provider.charge(500, idempotency_key=new.key))
            with backend.engine.connect() as conn:
                conn.execute(backend.orders.insert().values(id=subject, charge_id="zombie"))
                with pytest.raises(FencedOut), old.complete(conn, result={"by": "zombie"}):
                    pass
            assert order_charge(backend, subject) == []  # the zombie's write rolled back with it
            with new.complete(backend.engine, result={"by": "new"}) as conn:
                conn.execute(backend.orders.insert().values(id=subject, charge_id=ref))
        with pytest.raises(FencedOut):
            backend.store.record(subject, "charge", old.epoch, "ch_zombie")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.result_value == {"by": "new"} and row.reference == ref
    assert order_charge(backend, subject) == [ref]


def test_exception_after_calling_keeps_the_row(backend: Backend, subject: str,
                                               make_owner: OwnerFactory) -> None:
    def boom() -> str:
        raise ConnectionError("provider timed out")  # it may or may not have charged

    with pytest.raises(ConnectionError), Fences(backend.store, make_owner()).open(subject, "charge") as step:
        step.effect(boom)
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CALLING and row.epoch == 1
    assert row.lease_live  # not released either


def test_exception_while_claimed_releases_the_lease(backend: Backend, subject: str) -> None:
    owner = Owner("job-1", "tok-1", lease_s=300)  # no probe: only the database lease counts
    with pytest.raises(ValueError), Fences(backend.store, owner).open(subject, "charge"):
        raise ValueError("bug before the effect")
    row = backend.store.get(subject, "charge")
    assert row is not None and row.state is FenceState.CLAIMED and not row.lease_live
    with Fences(backend.store, Owner("job-1", "tok-2", lease_s=300)).open(subject, "charge") as step:
        assert step.epoch == 2  # the retry took over at once


def test_timestamps_come_from_the_database(backend: Backend, subject: str, provider: Provider,
                                           make_owner: OwnerFactory) -> None:
    import datetime as dt

    bound: list[Any] = []

    def spy(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        values = params.values() if isinstance(params, dict) else params
        bound.extend(values if isinstance(values, list | tuple) else list(values))

    sa.event.listen(backend.engine, "before_cursor_execute", spy)
    try:
        t0 = backend.store.db_now()
        with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
            charge(backend, make_owner(), subject, provider, provider_dedup=True, key_window_s=60)
        charge(backend, make_owner(), subject, provider, provider_dedup=True, key_window_s=60)
        t1 = backend.store.db_now()
    finally:
        sa.event.remove(backend.engine, "before_cursor_execute", spy)
    assert bound and not [v for v in bound if isinstance(v, dt.date | dt.datetime)]
    row = backend.store.get(subject, "charge")
    assert row is not None and row.created_at and row.calling_at and row.completed_at
    assert t0 <= row.created_at <= row.calling_at <= row.completed_at <= t1
