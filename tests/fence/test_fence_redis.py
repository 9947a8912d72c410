"""The Redis fence: the same protocol, lossy storage (never for money)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fence_helpers import OwnerFactory, Provider

from ringfence import faults
from ringfence.errors import FenceBusy, FencedOut, InDoubt
from ringfence.fence import Fences, FenceState
from support import kill_at


def rebuild(store: Any, owner: Any, subject: str, provider: Provider, **opts: Any) -> str:
    with Fences(store, owner).open(subject, "rebuild", params={"v": 1}, **opts) as step:
        if step.done:
            return str(step.result)
        ref = step.effect(lambda: provider.charge(1, idempotency_key=step.key))
        with step.complete(None, result=ref):
            pass
        return ref


def test_same_job_twice_one_effect(fence_redis: Any, provider: Provider, make_owner: OwnerFactory) -> None:
    subject = f"cache:{uuid.uuid4().hex}"
    assert rebuild(fence_redis, make_owner(), subject, provider) == rebuild(
        fence_redis, make_owner(), subject, provider)
    row = fence_redis.get(subject, "rebuild")
    assert row.state is FenceState.COMPLETED and len(provider.calls) == 1
    assert fence_redis.redis.ttl(fence_redis.key(subject, "rebuild")) == -1  # retention None: kept


def test_busy_retention_and_zombie(fence_redis: Any, provider: Provider, make_owner: OwnerFactory) -> None:
    subject = f"cache:{uuid.uuid4().hex}"
    with pytest.raises(FencedOut), \
            Fences(fence_redis, make_owner("a")).open(subject, "rebuild", params={"v": 1}, retention_s=60) as old:
        with pytest.raises(FenceBusy):
            rebuild(fence_redis, make_owner("b", alive="live"), subject, provider)
        with Fences(fence_redis, make_owner("a")).open(subject, "rebuild", params={"v": 1}) as new:
            assert new.epoch == 2
            with pytest.raises(FencedOut):
                old.effect(lambda: provider.charge(1))
    assert provider.calls == []
    assert 0 < fence_redis.redis.ttl(fence_redis.key(subject, "rebuild")) <= 60


def test_in_doubt_replay_then_park_and_resolve(fence_redis: Any, provider: Provider,
                                               make_owner: OwnerFactory) -> None:
    subject = f"cache:{uuid.uuid4().hex}"

    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        rebuild(fence_redis, make_owner(), subject, provider, provider_dedup=True, key_window_s=60)
    rebuild(fence_redis, make_owner(), subject, provider, provider_dedup=True, key_window_s=60)
    assert len(provider.calls) == 2 and provider.effects == 1

    other = f"cache:{uuid.uuid4().hex}"
    with pytest.raises(faults.SimulatedKill), kill_at("after_effect"):
        rebuild(fence_redis, make_owner(), other, provider)
    with pytest.raises(InDoubt):
        rebuild(fence_redis, make_owner(), other, provider)
    assert fence_redis.get(other, "rebuild").state is FenceState.IN_DOUBT
    fence_redis.resolve(other, "rebuild", happened=True, reference="manual")
    assert rebuild(fence_redis, make_owner(), other, provider) == "manual"
    assert len(provider.calls) == 3


def test_a_lost_key_runs_again(fence_redis: Any, provider: Provider, make_owner: OwnerFactory) -> None:
    """Why never for money: eviction or expiry forgets the fence."""
    subject = f"cache:{uuid.uuid4().hex}"
    rebuild(fence_redis, make_owner(), subject, provider)
    fence_redis.redis.delete(fence_redis.key(subject, "rebuild"))
    rebuild(fence_redis, make_owner(), subject, provider)
    assert len(provider.calls) == 2


def test_subject_and_step_never_share_a_key(fence_redis: Any, provider: Provider, make_owner: OwnerFactory) -> None:
    """('order:1', 'refund:charge') and ('order:1:refund', 'charge') once shared one key: the second step
    reported done and its effect never ran."""
    base = f"order:{uuid.uuid4().hex}"
    pairs = [(base, "refund:charge"), (f"{base}:refund", "charge"), (f"{base}:refund:charge", "")]
    assert len({fence_redis.key(s, st) for s, st in pairs}) == len(pairs)
    refs = []
    for subject, step_name in pairs:
        with Fences(fence_redis, make_owner()).open(subject, step_name, params={"v": 1}) as step:
            assert not step.done
            refs.append(step.effect(lambda: provider.charge(1, idempotency_key=step.key)))
    assert len(provider.calls) == len(pairs) and len(set(refs)) == len(pairs)
    assert [fence_redis.get(s, st).state for s, st in pairs] == [FenceState.COMPLETED] * len(pairs)
    for subject, step_name in pairs:
        fence_redis.redis.delete(fence_redis.key(subject, step_name))
