"""examples/fastapi_app with FastAPI's TestClient against the real Redis (a namespace of its own) and a SQLite
shop database: the lifespan builds the tables, each endpoint's job reaches Redis the way it promises, the
dashboard is mounted and its actions need the operators' token."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy import inspect as sa_inspect

from ringfence.testing import FakeProvider, run_job
from support import ROOT, wait_until

EXAMPLES = str(Path(ROOT) / "examples")
TOKEN = "ops-secret"


@pytest.fixture
def example(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    namespace = f"tfa{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RINGFENCE_REDIS_URL", redis_url)
        mp.setenv("RINGFENCE_NAMESPACE", namespace)
        mp.setenv("SHOP_DATABASE_URL", f"sqlite:///{tmp_path}/shop.db")
        mp.setenv("SHOP_PSP_DB", f"{tmp_path}/psp.db")
        mp.setenv("OPS_TOKEN", TOKEN)
        mp.syspath_prepend(EXAMPLES)
        for name in [m for m in sys.modules if m.startswith("fastapi_app")]:
            del sys.modules[name]  # the example reads its environment at import
        import fastapi_app.main as main

        yield main
    for name in [m for m in sys.modules if m.startswith("fastapi_app")]:
        del sys.modules[name]
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{namespace}:*", count=1000))
    if keys:
        r.delete(*keys)


def client(main: Any) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(main.api)


def test_lifespan_builds_the_tables_and_closes(example: Any) -> None:
    with client(example):
        names = set(sa_inspect(example.engine).get_table_names())
    assert {"orders", "ringfence_fences", "ringfence_failed_jobs", "ringfence_outbox"} <= names


def test_an_order_and_its_charge_job_commit_together_then_the_relay_sends_it(example: Any) -> None:
    from ringfence.outbox.relay import Relay

    app, jobs = example.app, sys.modules["fastapi_app.jobs"]
    with client(example) as c:
        made = c.post("/orders", json={"amount": 1999}).json()
        assert app.broker.job_state("critical", made["job_id"]) is None  # a row of the outbox, not yet in Redis
        assert Relay(app).run(once=True) == 1
        assert app.broker.job_state("critical", made["job_id"]) == "pending"
        run_job(jobs.charge_order, order_id=made["order_id"], amount=1999)  # what the worker does with it
        shown = c.get(f"/orders/{made['order_id']}").json()
    assert shown["status"] == "paid" and shown["charge_id"] == app.fence_store.get(
        f"order:{made['order_id']}", "charge").reference
    assert jobs.psp.effects == 1


def test_cancel_queues_its_mail_on_commit_only(example: Any) -> None:
    app = example.app
    with client(example) as c:
        order_id = c.post("/orders", json={"amount": 5}).json()["order_id"]
        cancelled = c.post(f"/orders/{order_id}/cancel")
        assert app.broker.job_state("default", cancelled.json()["job_id"]) == "pending"
        again = c.post(f"/orders/{order_id}/cancel")
    assert again.status_code == 409
    assert app.broker.sync.llen(app.broker.keys.queue("default").pending) == 1  # the refused one queued nothing


def test_contact_form_mail_is_sent_at_once(example: Any) -> None:
    with client(example) as c:
        job_id = c.post("/contact", json={"email": "a@example.com", "message": "hello"}).json()["job_id"]
    assert example.app.broker.job_state("low", job_id) == "pending"


def paused(app: Any, queue: str) -> bool:
    return bool(app.broker.sync.exists(app.broker.keys.queue(queue).paused))


def test_dashboard_is_mounted_and_its_actions_need_the_ops_token(example: Any) -> None:
    app = example.app
    with client(example) as c:
        c.post("/contact", json={"email": "a@example.com", "message": "hello"})
        page = c.get("/ops/ringfence/")
        assert page.status_code == 200 and "low" in page.text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        form = {"csrf": csrf.group(1) if csrf else c.cookies.get("rf_csrf", ""), "queue": "low", "paused": "1"}
        refused = c.post("/ops/ringfence/actions/pause", data=form)
        assert refused.status_code == 403 and not paused(app, "low")
        done = c.post("/ops/ringfence/actions/pause", data=form, headers={"X-Ops-Token": TOKEN},
                      follow_redirects=False)
        assert done.status_code == 303 and paused(app, "low")


def counts(main: Any) -> tuple[int, int]:
    """Orders and outbox rows in the shop's database."""
    from ringfence.outbox import outbox_table

    with main.engine.connect() as conn:
        return (conn.execute(select(func.count()).select_from(main.orders)).scalar_one(),
                conn.execute(select(func.count()).select_from(outbox_table(main.metadata))).scalar_one())


def test_bad_orders_and_contact_forms_are_refused_with_nothing_written(example: Any) -> None:
    with client(example) as c:
        for amount in (-5, 0, "5", 19.99, None):
            refused = c.post("/orders", json={"amount": amount})
            assert refused.status_code == 422, (amount, refused.text)
            assert refused.json()["detail"][0]["loc"] == ["body", "amount"]
        for form in ({"email": "not-an-address", "message": "hi"}, {"email": "a@example.com", "message": ""},
                     {"email": "a@example.com", "message": "x" * 5001}):
            assert c.post("/contact", json=form).status_code == 422, form
        assert counts(example) == (0, 0)
    assert example.app.broker.queues() == []  # no job sent


def test_a_cancelled_order_is_never_charged_by_a_real_worker(example: Any, tmp_path: Path) -> None:
    from ringfence.outbox.relay import Relay

    app = example.app
    with client(example) as c:
        made = c.post("/orders", json={"amount": 1999}).json()
        assert c.post(f"/orders/{made['order_id']}/cancel").status_code == 200
        assert Relay(app).run(once=True) == 1  # the charge job reaches Redis after the cancellation
        worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "fastapi_app.jobs:app",
                                   "--queues", "critical"], cwd=EXAMPLES, env=dict(os.environ),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: app.broker.job_state("critical", made["job_id"]) is None, timeout=60, interval=0.2)
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
            assert worker.stdout is not None
            log = worker.stdout.read().decode(errors="replace")
        shown = c.get(f"/orders/{made['order_id']}").json()
    assert shown["status"] == "cancelled" and shown["charge_id"] is None, (shown, log)
    assert FakeProvider(str(tmp_path / "psp.db")).effects == 0


def test_an_order_being_charged_cannot_be_cancelled(example: Any) -> None:
    jobs = sys.modules["fastapi_app.jobs"]
    with client(example) as c:
        made = c.post("/orders", json={"amount": 700}).json()
        jobs.psp.fault = "5xx"  # the provider is down: the charge stops after claiming the order
        with pytest.raises(Exception, match="503"):
            run_job(jobs.charge_order, order_id=made["order_id"], amount=700)
        refused = c.post(f"/orders/{made['order_id']}/cancel")
        assert refused.status_code == 409 and "charging" in refused.json()["detail"]
        jobs.psp.fault = ""
        run_job(jobs.charge_order, order_id=made["order_id"], amount=700)  # the retry charges it
        shown = c.get(f"/orders/{made['order_id']}").json()
    assert shown["status"] == "paid" and jobs.psp.effects == 1
