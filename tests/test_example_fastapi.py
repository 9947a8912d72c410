"""examples/fastapi_app with FastAPI's TestClient against the real Redis (a namespace of its own) and a SQLite
shop database: the lifespan builds the tables, each endpoint's job reaches Redis the way it promises, the
dashboard is mounted and its actions need the operators' token."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import inspect as sa_inspect

from support import ROOT

EXAMPLES = str(Path(ROOT) / "examples")
TOKEN = "ops-secret"


@pytest.fixture
def example(redis_url: str, tmp_path: Path) -> Iterator[Any]:
    namespace = f"tfa{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RINGFENCE_REDIS_URL", redis_url)
        mp.setenv("RINGFENCE_NAMESPACE", namespace)
        mp.setenv("SHOP_DATABASE_URL", f"sqlite:///{tmp_path}/shop.db")
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
    from ringfence.testing import run_job

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
