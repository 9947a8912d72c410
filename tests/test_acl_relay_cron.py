"""The scripts that add jobs outside enqueue — the outbox relay's and the cron scheduler's — ask Redis for every
command they run (ACL) before their first write: a refused call leaves nothing half-written (no sent record
without its job, no tick stored but never queued) and says in one line which command the user lacks."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from ringfence import App
from ringfence.errors import NotPermitted
from ringfence.models import JobSpec
from ringfence.outbox import create_outbox
from ringfence.redis import outbox as redis_outbox
from ringfence.redis.embedded import EmbeddedRedis
from ringfence.redis.scripts import script
from ringfence.scheduler import Scheduler
from support import wait_until

#: The least-privilege user of docs/deployment.md (tests/test_acl.py), minus one command.
ACL = "on >s3cret resetkeys ~{ns}:* resetchannels &{ns}:* -@all +@read +@write +@scripting +@pubsub " \
      "+@connection +@transaction +time +info -@dangerous -{denied}"


def acl_app(server: EmbeddedRedis, namespace: str, denied: str) -> tuple[App, redis.Redis]:
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "producer", *ACL.format(ns=namespace, denied=denied).split())
    return App(server.url.replace("redis://", "redis://producer:s3cret@"), namespace, environment="test"), admin


def keys(admin: redis.Redis, namespace: str) -> list[bytes]:
    return sorted(k for k in admin.keys(f"{namespace}:*") if not k.endswith(b":queues"))


def assert_one_line(caught: pytest.ExceptionInfo[NotPermitted], script: str, command: str) -> None:
    said = str(caught.value)
    assert said.startswith(f"{script} refused before any write: this Redis user may not run {command} on ")
    assert "\n" not in said and "ACL" in said


@pytest.mark.parametrize("denied", ["lpush", "zadd", "hincrby"])
def test_a_relay_refused_by_an_acl_leaves_no_sent_record_and_no_job(private_redis: EmbeddedRedis, namespace: str,
                                                                    denied: str) -> None:
    app, admin = acl_app(private_redis, namespace, denied)
    spec = JobSpec("anything", {"value": 1}, 0.0, 1).encode()
    for _ in range(2):  # the relay retries a refused batch: refused again, never recorded as sent
        with pytest.raises(NotPermitted) as caught:
            app.broker.run(redis_outbox.relay(app.broker, "default", [("order-1", spec, 0, "", 0)]))
        assert_one_line(caught, "relay", denied.upper())
    assert keys(admin, namespace) == []
    app.close()


@pytest.mark.parametrize("denied", ["lpush", "hset"])
def test_a_cron_tick_refused_by_an_acl_stores_nothing(private_redis: EmbeddedRedis, namespace: str,
                                                      denied: str) -> None:
    app, admin = acl_app(private_redis, namespace, denied)

    @app.periodic("* * * * *", name="every-minute")
    def every_minute(ctx: object) -> None: ...

    scheduler = Scheduler(app.periodics, app.broker)

    async def refused_then_granted() -> int:
        for _ in range(2):  # the loop's next tick is refused the same way; the job is not half-stored
            with pytest.raises(NotPermitted) as caught:
                await scheduler.tick()
            assert_one_line(caught, "cron", denied.upper())
        assert keys(admin, namespace) == []
        admin.execute_command("ACL", "SETUSER", "producer", f"+{denied}")  # granted: the tick is enqueued once
        try:
            return await scheduler.tick()
        finally:
            await app.broker.aclose()

    assert asyncio.run(refused_then_granted()) == 1
    assert admin.llen(app.broker.keys.queue("default").pending) == 1
    app.close()


SCHEDULER_APP = """
from ringfence import App

app = App(environment="test")

@app.periodic("* * * * *", name="every-minute")
def every_minute(ctx) -> None: ...
"""


def test_the_scheduler_process_logs_the_refusal_in_one_line_and_enqueues_once_granted(
        private_redis: EmbeddedRedis, namespace: str, tmp_path: Path) -> None:
    app, admin = acl_app(private_redis, namespace, "lpush")
    (tmp_path / "cronapp.py").write_text(SCHEDULER_APP)
    log = tmp_path / "scheduler.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
           "RINGFENCE_REDIS_URL": private_redis.url.replace("redis://", "redis://producer:s3cret@"),
           "RINGFENCE_NAMESPACE": namespace, "PYTHONPATH": str(tmp_path)}
    pending = app.broker.keys.queue("default").pending
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "scheduler", "--app", "cronapp:app",
                                 "--interval-s", "0.2"], env=env, cwd=tmp_path, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: log.read_text().count("tick failed") >= 2 or proc.poll() is not None, timeout=30)
        assert keys(admin, namespace) == []
        admin.execute_command("ACL", "SETUSER", "producer", "+lpush")
        wait_until(lambda: admin.llen(pending) > 0 or proc.poll() is not None, timeout=30)
        time.sleep(0.6)  # three more ticks: the same tick is not enqueued again
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    assert admin.llen(pending) == 1
    text = log.read_text()
    refused = [line for line in text.splitlines() if "tick failed" in line]
    assert refused and all(line.endswith("scheduler: tick failed (NotPermitted: cron refused before any write: this "
                                         f"Redis user may not run LPUSH on {pending} (ACL); grant it, see "
                                         "docs/deployment.md); retrying in 0.2s") for line in refused), text
    assert "Traceback" not in text, text
    app.close()


def test_relay_once_refused_by_an_acl_says_it_in_one_line_and_the_row_still_waits(
        private_redis: EmbeddedRedis, namespace: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/app.db"
    engine = sa.create_engine(url)
    create_outbox(engine)
    producer, admin = acl_app(private_redis, namespace, "lpush")
    app = App(private_redis.url, namespace, environment="test", fence_url=url)
    charge = app.task(queue="orders", name="charge")(producer_side)
    with engine.begin() as conn:
        job_id = charge.enqueue_in(conn, n=1)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RINGFENCE_")},
           "RINGFENCE_REDIS_URL": producer.broker.url, "RINGFENCE_NAMESPACE": namespace, "RINGFENCE_FENCE_URL": url}

    def relay_once() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ringfence.cli", "relay", "--once"], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    pending = app.broker.keys.queue("orders").pending
    refused = relay_once()
    assert refused.returncode == 3, refused.stderr  # the CLI's exit code for what Redis refused
    assert [line for line in refused.stderr.splitlines() if "INFO" not in line] == [
        "error: relay refused before any write: this Redis user may not run LPUSH on "
        f"{pending} (ACL); grant it, see docs/deployment.md"], refused.stderr
    assert [k for k in keys(admin, namespace) if b"outbox_sent" in k or b"jobs" in k] == []  # no sent record
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT job_id FROM ringfence_outbox")).scalars().all() == [job_id]
    admin.execute_command("ACL", "SETUSER", "producer", "+lpush")
    sent = relay_once()
    assert sent.returncode == 0 and "relayed 1 row(s) (1 sent, 0 refused" in sent.stderr + sent.stdout, sent.stderr
    assert admin.llen(pending) == 1
    app.close()
    producer.close()
    engine.dispose()


def producer_side(ctx: object, n: int) -> None:
    raise AssertionError("runs in the worker")


def test_on_a_cluster_the_relay_and_cron_checks_ask_for_the_sharded_publish_they_run() -> None:
    for name in ("relay", "cron"):
        sharded = script(name).sharded
        assert "{'SPUBLISH', " in sharded and re.search(r"[^S]PUBLISH'", sharded) is None, name
