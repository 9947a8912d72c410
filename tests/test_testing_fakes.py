"""What docs/testing.md says about the provider fake: it must count real effects, deduplicated by key. A fake
that counts calls reports the same-key replay of an in-doubt call (provider_dedup=True) as a second charge."""

from __future__ import annotations

import pytest

from ringfence.testing import assert_second_run_empty


class FakePSP:
    """As in docs/testing.md: one entry per distinct idempotency key; also counts every call."""

    def __init__(self) -> None:
        self.charges: dict[str, str] = {}
        self.calls = 0

    def charge(self, order_id: int, amount: int, idempotency_key: str) -> str:
        self.calls += 1
        if idempotency_key not in self.charges:
            self.charges[idempotency_key] = f"ch_{len(self.charges) + 1}"
        return self.charges[idempotency_key]


def _task(make_app, tmp_path, psp: FakePSP):
    app = make_app(fence_url=f"sqlite:///{tmp_path}/fences.db")
    app.fence_store.create_all()

    @app.task(name="charge")
    def charge(ctx, order_id: int, amount: int) -> None:
        with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount}, provider_dedup=True,
                       key_window_s=3600) as step:
            if step.done:
                return
            step.effect(lambda: psp.charge(order_id, amount, idempotency_key=step.key))

    return charge


def test_a_fake_that_dedups_by_key_sees_one_effect_per_order(make_app, tmp_path) -> None:
    psp = FakePSP()
    report = assert_second_run_empty(_task(make_app, tmp_path, psp), payload=lambda n: {"order_id": n, "amount": 5},
                                     effects=lambda: len(psp.charges))
    assert not report.failed
    assert psp.calls > len(psp.charges)  # the same-key replays happened, and were no second charge


def test_a_fake_that_counts_calls_reports_the_replay_as_a_double(make_app, tmp_path) -> None:
    psp = FakePSP()
    with pytest.raises(AssertionError, match="after_effect"):
        assert_second_run_empty(_task(make_app, tmp_path, psp), payload=lambda n: {"order_id": n, "amount": 5},
                                effects=lambda: psp.calls)
