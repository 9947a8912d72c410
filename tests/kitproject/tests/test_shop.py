import pytest
from shop.jobs import broken, charge, flaky, psp, seen, send_receipt

from ringfence.errors import PayloadError


@pytest.fixture(autouse=True)
def fresh():
    seen.clear()


def test_a_charge_enqueued_twice_charges_once(ringfence_worker):
    before = psp.effects
    charge.enqueue(order_id=7, amount=500)
    charge.enqueue(order_id=7, amount=500)
    assert ringfence_worker.drain().processed == 2
    assert psp.effects == before + 1


def test_retries_run_with_their_backoff_in_simulated_time(ringfence_worker, ringfence_clock):
    start = ringfence_clock()
    flaky.enqueue(n=1)
    ringfence_worker.drain()
    assert [s for s in seen if s[0] == "flaky"] == [("flaky", 1, 1), ("flaky", 1, 2), ("flaky", 1, 3)]
    assert ringfence_clock() - start >= 180_000  # 60 s then 120 s of backoff, waited on the test's clock


def test_a_delayed_job_runs_once_its_time_comes(ringfence_worker, ringfence_clock):
    start = ringfence_clock()
    send_receipt.with_options(delay_s=3600).enqueue(order_id=3, email="a@b.c")
    ringfence_worker.advance(1800)
    assert [s for s in seen if s[0] == "receipt"] == []
    ringfence_worker.drain()
    assert [s for s in seen if s[0] == "receipt"] == [("receipt", 3, 1)]
    assert ringfence_clock() - start >= 3_600_000


def test_cron_ticks_run_as_the_clock_moves(ringfence_worker, ringfence_clock):
    ringfence_worker.advance(3 * 3600)
    ticks = [ms for what, ms, _ in seen if what == "hourly"]
    assert len(ticks) == 3 and all(ms % 3_600_000 == 0 for ms in ticks)


def test_a_bad_payload_is_refused_at_enqueue(ringfence_worker):
    with pytest.raises(PayloadError):
        send_receipt.enqueue(order_id="three", email="a@b.c")


def test_an_expected_dead_job_is_returned(ringfence_worker):
    broken.enqueue(n=9)
    [dead] = ringfence_worker.drain(expect_dead=1).dead
    assert dead.task.endswith("broken") and "no order 9" in dead.error and dead.attempts == 2


def test_fails_on_an_unexpected_dead_job(ringfence_worker):
    broken.enqueue(n=10)
    ringfence_worker.drain()
