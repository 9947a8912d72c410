"""Versioned payloads across a rolling deploy: old payloads upcast, newer ones wait, broken ones dead-letter once."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import BaseModel, Field

from ringfence import PayloadError
from ringfence.contracts import assert_contracts, check, freeze
from ringfence.queries import DeadFilter, dead_jobs, queue_info
from test_worker import run_until


class ChargeV2(BaseModel):
    order_id: int
    amount: int = Field(gt=0)
    currency: str


def old_release(make_app):
    """Release 1: keyword payload, version 1."""
    app = make_app()

    @app.task(name="charge")
    async def charge(ctx, order_id: int, amount: int) -> None: ...

    return app, charge


def new_release(make_app, seen, *, with_upcaster=True, **settings):
    """Release 2: a pydantic payload with a new required field, version 2."""
    app = make_app()
    if settings:
        app.worker_settings = dataclasses.replace(app.worker_settings, **settings)

    @app.task(name="charge", version=2, payload=ChargeV2)
    async def charge(ctx, p: ChargeV2) -> None:
        seen.append((ctx.attempt, p))

    if with_upcaster:
        @charge.upcaster(1)
        def v1_to_v2(old: dict) -> dict:
            return {**old, "currency": "EUR"}

    return app, charge


async def test_old_payload_with_an_upcaster_runs(make_app) -> None:
    _, old_charge = old_release(make_app)
    old_charge.enqueue(order_id=1, amount=500)
    seen: list = []
    app, _ = new_release(make_app, seen)
    await run_until(app, lambda: seen)
    assert seen == [(1, ChargeV2(order_id=1, amount=500, currency="EUR"))]


async def test_old_payload_without_upcaster_dead_letters_at_once_with_a_clear_message(make_app) -> None:
    _, old_charge = old_release(make_app)
    old_charge.enqueue(order_id=1, amount=500)
    seen: list = []
    app, _ = new_release(make_app, seen, with_upcaster=False)
    await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 1)
    [d] = dead_jobs(app.broker, DeadFilter())
    assert seen == [] and d.reason == "bad_payload" and d.attempts == 1
    assert "'charge'" in d.error and "version 1" in d.error and "understood: [2]" in d.error
    assert queue_info(app.broker, "default")["retry"] == 0


async def test_payload_failing_validation_names_the_field(make_app) -> None:
    seen: list = []
    app, charge = new_release(make_app, seen)
    with pytest.raises(PayloadError, match=r"field amount"):
        charge.enqueue(order_id=1, amount=-5, currency="EUR")
    # An upcaster producing an invalid v2 payload dead-letters at run time, naming the field.
    _, old_charge = old_release(make_app)
    old_charge.enqueue(order_id=2, amount=0)
    await run_until(app, lambda: queue_info(app.broker, "default")["dead"] == 1)
    [d] = dead_jobs(app.broker, DeadFilter())
    assert "field amount" in d.error and "version 1" in d.error and seen == []


async def test_newer_payload_waits_on_an_old_worker_and_runs_on_a_new_one(make_app) -> None:
    seen: list = []
    _, new_charge = new_release(make_app, seen)
    job = new_charge.enqueue(ChargeV2(order_id=7, amount=100, currency="USD"))
    old_app, _ = old_release(make_app)
    old_app.worker_settings = dataclasses.replace(old_app.worker_settings, defer_s=0.2)
    counts = lambda: old_app.broker.queue_counts("default")["stats"].get("newer_version", 0)  # noqa: E731
    await run_until(old_app, lambda: counts() >= 3)
    assert old_app.broker.attempts("default", job) == 0  # never burned
    assert queue_info(old_app.broker, "default")["dead"] == 0
    app, _ = new_release(make_app, seen)
    await run_until(app, lambda: seen)
    assert seen == [(1, ChargeV2(order_id=7, amount=100, currency="USD"))]


async def test_newer_payload_alerts_once_after_the_grace_period(make_app) -> None:
    seen: list = []
    _, new_charge = new_release(make_app, seen)
    new_charge.enqueue(order_id=7, amount=100, currency="USD")
    old_app, _ = old_release(make_app)
    old_app.worker_settings = dataclasses.replace(old_app.worker_settings, defer_s=0.2, grace_s=0.5)
    alerts: list = []
    old_app.on_alert(lambda kind, msg, details: alerts.append((kind, details["version"])))
    await run_until(old_app, lambda: old_app.broker.queue_counts("default")["stats"].get("newer_version", 0) >= 8)
    assert alerts == [("newer_version", 2)]


async def test_unknown_task_goes_to_dead_letter_after_the_grace_period(make_app) -> None:
    producer, _ = old_release(make_app)
    producer.registry.tasks["charge"].enqueue(order_id=1, amount=1)
    consumer = make_app()
    consumer.worker_settings = dataclasses.replace(consumer.worker_settings, defer_s=0.2, grace_s=0.6)

    @consumer.task(name="other")
    async def other(ctx) -> None: ...

    await run_until(consumer, lambda: queue_info(consumer.broker, "default")["dead"] == 1)
    [d] = dead_jobs(consumer.broker, DeadFilter())
    assert d.reason == "unknown_task" and "'charge' is not registered" in d.error
    assert consumer.broker.queue_counts("default")["stats"]["unknown_task"] >= 2


def test_contracts_freeze_and_check_round_trip(make_app, tmp_path) -> None:
    app1, _ = old_release(make_app)
    assert [p.name for p in freeze(app1, tmp_path)] == ["v1.json"]
    assert freeze(app1, tmp_path) == []  # frozen samples are never overwritten
    seen: list = []
    app2, _ = new_release(make_app, seen)
    written = freeze(app2, tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == ["charge/v2.json"]
    assert assert_contracts(app2, tmp_path) == 2  # v1 through the upcaster, v2 directly


def test_contracts_check_fails_when_a_change_breaks_an_old_sample(make_app, tmp_path) -> None:
    app1, _ = old_release(make_app)
    freeze(app1, tmp_path)
    seen: list = []
    broken, _ = new_release(make_app, seen, with_upcaster=False)  # v1 payloads can no longer be read
    checked, problems = check(broken, tmp_path)
    assert checked == 1 and len(problems) == 1 and "no upcaster from version 1" in problems[0]
    with pytest.raises(AssertionError, match=r"charge/v1.json"):
        assert_contracts(broken, tmp_path)


def test_contracts_cli(make_app, tmp_path) -> None:
    from click.testing import CliRunner

    from ringfence.cli import main as cli

    mod = tmp_path / "contractapp.py"
    mod.write_text(
        "from pydantic import BaseModel\nfrom ringfence import App\n"
        "app = App('redis://127.0.0.1:6379/0', 'contracts')\n"
        "class P(BaseModel):\n    when: str\n    n: int\n"
        "@app.task(name='t', version=3, payload=P)\n"
        "def t(ctx, p: P) -> None: ...\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        res = CliRunner().invoke(cli, ["contracts", "freeze", "--app", "contractapp:app", "--dir", str(tmp_path / "c")])
        assert res.exit_code == 0 and "1 sample(s) written" in res.output
        assert (tmp_path / "c" / "t" / "v3.json").exists()
        res = CliRunner().invoke(cli, ["contracts", "check", "--app", "contractapp:app", "--dir", str(tmp_path / "c")])
        assert res.exit_code == 0 and "1 contract sample(s) ok" in res.output
    finally:
        sys.path.remove(str(tmp_path))


def test_info_shows_versions_in_flight(make_app) -> None:
    _, old_charge = old_release(make_app)
    seen: list = []
    app, new_charge = new_release(make_app, seen)
    old_charge.enqueue(order_id=1, amount=1)
    new_charge.enqueue(order_id=2, amount=2, currency="EUR")
    new_charge.enqueue(order_id=3, amount=3, currency="EUR")
    info = queue_info(app.broker, "default")
    assert info["versions"] == {"charge@v1": 1, "charge@v2": 2} and info["versions_exact"] is True



