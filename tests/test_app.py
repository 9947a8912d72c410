"""Declaration and enqueue: invariants checked at start, bad payloads refused with a clear error."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import redis

from ringfence import App, ConfigError, PayloadError, RetryPolicy, WorkerSettings


def test_timeout_must_be_below_max_lease(make_app) -> None:
    app = make_app(worker=WorkerSettings(max_lease_s=60))
    with pytest.raises(ConfigError) as err:
        app.task(timeout_s=60)(lambda ctx: None)
    assert "timeout_s=60" in str(err.value) and "max_lease_s=60" in str(err.value)


def test_total_backoff_must_be_below_expiry(make_app) -> None:
    app = make_app()
    with pytest.raises(ConfigError) as err:
        app.task(retry=RetryPolicy(max_attempts=10, base_s=60, cap_s=3600), expiry_s=3600)(lambda ctx: None)
    msg = str(err.value)
    assert "expiry_s=3600" in msg and "max_attempts=10" in msg


def test_attempts_are_bounded(make_app) -> None:
    with pytest.raises(ConfigError, match="max_attempts=1000"):
        make_app().task(max_attempts=1000)(lambda ctx: None)


def test_all_violations_are_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        App("redis://127.0.0.1:6379/0", worker=WorkerSettings(lease_s=1, heartbeat_s=5, max_lease_s=0.5))
    assert len(err.value.problems) >= 2


def test_worker_refuses_to_start_with_a_bad_configuration(tmp_path, redis_url, namespace) -> None:
    (tmp_path / "badapp.py").write_text(
        "from ringfence import App, WorkerSettings\n"
        f"app = App({redis_url!r}, {namespace!r})\n"
        "@app.task(timeout_s=100)\n"
        "def t(ctx): pass\n"
        "app.worker_settings = WorkerSettings(max_lease_s=50, lease_s=20)\n"
    )
    out = subprocess.run([sys.executable, "-m", "ringfence.cli", "worker", "--app", "badapp:app"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "timeout_s=100" in out.stderr and "max_lease_s=50" in out.stderr
    assert "Traceback" not in out.stderr


def test_non_json_payload_is_refused_naming_the_field(make_app) -> None:
    app = make_app()

    @app.task
    def t(ctx, order: dict) -> None: ...

    with pytest.raises(PayloadError) as err:
        t.enqueue(order={"id": 1, "when": datetime.now(UTC).date(), "tags": [1, object()]})
    assert "payload.order.when" in str(err.value) or "payload.order.tags[1]" in str(err.value)
    assert app.broker.queue_counts("default")["pending"] == 0


def test_unknown_and_missing_fields_are_refused(make_app) -> None:
    app = make_app()

    @app.task
    def t(ctx, order_id: int, note: str = "") -> None: ...

    with pytest.raises(PayloadError, match=r"unknown field.*ordr_id"):
        t.enqueue(ordr_id=1)
    with pytest.raises(PayloadError, match=r"missing required field.*order_id"):
        t.enqueue(note="x")


def test_enqueue_options(make_app, rdb: redis.Redis) -> None:
    app = make_app()

    @app.task(queue="low")
    def t(ctx, n: int) -> None: ...

    job_id = t.with_options(job_id="order-42", queue="critical", max_attempts=5, timeout_s=10).enqueue(n=1)
    assert job_id == "order-42"
    k = app.broker.keys.queue("critical")
    doc = orjson.loads(rdb.hget(k.jobs, "order-42"))
    assert doc["m"] == 5 and doc["to"] == 10_000 and doc["a"] == {"n": 1} and doc["v"] == 1
    # Same id again: idempotent, the first job stays.
    assert t.with_options(job_id="order-42", queue="critical").enqueue(n=2) == "order-42"
    assert rdb.llen(k.pending) == 1
    t.with_options(delay_s=60).enqueue(n=3)
    t.with_options(run_at=datetime.now(UTC) + timedelta(hours=1)).enqueue(n=4)
    assert rdb.zcard(app.broker.keys.queue("low").scheduled) == 2
    with pytest.raises(ConfigError, match="timezone"):
        t.with_options(run_at=datetime.now()).enqueue(n=5)
    assert sorted(app.broker.queues()) == ["critical", "low"]


async def test_async_enqueue_and_bulk(make_app) -> None:
    app = make_app()

    @app.task
    async def t(ctx, n: int) -> None: ...

    one = await t.aenqueue(n=1)
    many = await app.aenqueue_many(t, [{"n": i} for i in range(100)])
    assert len(set(many)) == 100 and one not in many
    assert app.broker.queue_counts("default")["pending"] == 101


def test_unknown_enqueue_option_is_named(make_app) -> None:
    app = make_app()

    @app.task
    def t(ctx) -> None: ...

    with pytest.raises(ConfigError, match=r"unknown enqueue option\(s\) delay; known: .*delay_s"):
        t.with_options(delay=5)
    with pytest.raises(ConfigError, match=r"queu"):
        app.enqueue_many(t, [{}], queu="x")
