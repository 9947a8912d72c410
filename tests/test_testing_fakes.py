"""What docs/testing.md says about the provider fake, ringfence.testing.FakeProvider: it counts real effects,
deduplicated by key (a fake that counts calls reports the same-key replay of an in-doubt call as a second
charge); it can ignore keys, lose its answer after charging, refuse a call, and share a file between processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ringfence.testing import FakeProvider, LostAnswer, ProviderUnavailable, assert_second_run_empty


def _task(make_app, tmp_path, psp: FakeProvider):
    app = make_app(fence_url=f"sqlite:///{tmp_path}/fences.db")
    app.fence_store.create_all()

    @app.task(name="charge")
    def charge(ctx, order_id: int, amount: int) -> None:
        with ctx.fence(f"order:{order_id}", "charge", params={"amount": amount}, provider_dedup=True,
                       key_window_s=3600) as step:
            if step.done:
                return
            step.effect(lambda: psp.charge(amount, idempotency_key=step.key, order=order_id))

    return charge


def test_a_fake_that_dedups_by_key_sees_one_effect_per_order(make_app, tmp_path) -> None:
    psp = FakeProvider()
    report = assert_second_run_empty(_task(make_app, tmp_path, psp), payload=lambda n: {"order_id": n, "amount": 5},
                                     effects=lambda: psp.effects)
    assert not report.failed
    assert len(psp.calls) > psp.effects  # the same-key replays happened, and were no second charge
    assert psp.stats() == {"charges": psp.effects, "double_charged_orders": 0}


def test_a_fake_that_counts_calls_reports_the_replay_as_a_double(make_app, tmp_path) -> None:
    psp = FakeProvider()
    with pytest.raises(AssertionError, match="after_effect"):
        assert_second_run_empty(_task(make_app, tmp_path, psp), payload=lambda n: {"order_id": n, "amount": 5},
                                effects=lambda: len(psp.calls))


def test_keys_honoured_or_ignored_and_looked_up() -> None:
    psp = FakeProvider()
    first = psp.charge(5, idempotency_key="k1", order=1)
    assert psp.charge(5, idempotency_key="k1", order=1) == first  # a known key: the first charge
    assert psp.charge(5, order=1) != psp.charge(5, order=1)  # no key: a charge per call
    assert psp.effects == 3 and psp.calls == ["k1", "k1", None, None]
    assert psp.stats() == {"charges": 3, "double_charged_orders": 1}

    ignoring = FakeProvider(honours_keys=False)
    a, b = ignoring.charge(5, idempotency_key="k2", order=2), ignoring.charge(5, idempotency_key="k2", order=2)
    assert a != b and ignoring.effects == 2
    assert ignoring.lookup("k2") == a and ignoring.lookup("nope") is None  # the key is kept as metadata
    assert psp.charge(5, idempotency_key="k3", dedup=False) != psp.charge(5, idempotency_key="k3", dedup=False)


def test_answered_then_crashed_and_refused() -> None:
    psp = FakeProvider()
    psp.fault = "lost"  # switched on: every charge is made, then its answer is lost
    with pytest.raises(LostAnswer) as lost:
        psp.charge(5, idempotency_key="k", order=1)
    assert isinstance(lost.value, ConnectionError) and psp.charges == {lost.value.reference: "k"}
    psp.fault = ""
    assert psp.charge(5, idempotency_key="k", order=1) == lost.value.reference  # the replay finds the charge
    with pytest.raises(ProviderUnavailable):
        psp.charge(5, idempotency_key="other", fault="5xx")
    assert psp.effects == 1 and psp.calls == ["k", "k", "other"]


def test_a_file_is_shared_by_processes_and_providers(tmp_path) -> None:
    path = str(tmp_path / "psp.db")
    code = ("import sys; from ringfence.testing import FakeProvider; "
            "print(FakeProvider(sys.argv[1]).charge(5, idempotency_key='k', order=1))")
    refs = {subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)}
    psp = FakeProvider(path)
    assert refs == set(psp.charges) and psp.effects == 1 and len(psp.calls) == 2
    other = FakeProvider(path, name="b")  # another provider in the same file: its own charges
    assert other.effects == 0 and other.charge(5, idempotency_key="k") not in refs
