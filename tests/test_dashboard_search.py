"""Search by payload field (``customer_id=42``) on the pending, scheduled, retry and dead pages: server-side, in
chunks within a time budget that the page reports; a redacted field cannot be searched. Retry and dead jobs are
left there by a real worker process."""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import Workers, worker_env
from ringfence import App
from ringfence.dashboard import create_app, search
from support import wait_until


def ids(page: str) -> set[str]:
    return set(re.findall(r'<tr data-job="([^"]+)">', page))


def scanned(page: str) -> int:
    m = re.search(r'data-scanned="(\d+)"', page)
    assert m, "the page says how many jobs it read"
    return int(m[1])


def test_payload_field_search_in_each_state(make_app: Any, redis_url: str, namespace: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(search, "BUDGET_S", 60.0)  # what is found, here; the budget: the test below
    app: App = make_app()
    for name in ("quick", "broken", "later"):
        app.task(name=name)(lambda ctx, **kw: None)
    dead = app.enqueue_many("broken", [{"n": i, "customer_id": 42 if i == 3 else i} for i in range(6)])
    retry = app.enqueue_many("later", [{"n": i, "customer_id": 42 if i == 1 else i} for i in range(4)])
    workers = Workers(worker_env(redis_url, namespace), "dashtasksapp:app")
    workers.start()
    try:
        b = app.broker
        wait_until(lambda: all(b.job_state("default", j) == "dead" for j in dead)
                   and all(b.job_state("default", j) == "retry" for j in retry), timeout=30)
    finally:
        workers.stop()
    pending = app.enqueue_many("quick", [{"n": i, "customer_id": i % 1000, "meta": {"region": "eu" if i == 7 else "us"},
                                          "email": "a@example.com"} for i in range(3000)])
    scheduled = app.enqueue_many("quick", [{"n": i, "customer_id": 42 + i} for i in range(3)], delay_s=3600)
    client = TestClient(create_app(app))

    page = client.get("/queues/default/pending", params={"payload": "customer_id=42"}).text
    assert ids(page) == {pending[42], pending[1042], pending[2042]}
    assert scanned(page) == 3000 and "to the end of pending" in page
    assert ids(client.get("/queues/default/pending", params={"payload": "meta.region=eu"}).text) == {pending[7]}
    assert ids(client.get("/queues/default/scheduled", params={"payload": "customer_id=42"}).text) == {scheduled[0]}
    assert ids(client.get("/queues/default/retry", params={"payload": "customer_id=42"}).text) == {retry[1]}
    assert ids(client.get("/queues/default/dead", params={"payload": "customer_id=42"}).text) == {dead[3]}
    assert ids(client.get("/queues/default/dead", params={"payload": "customer_id=42", "task": "quick"}).text) == set()

    bad = client.get("/queues/default/pending", params={"payload": "email=a@example.com"})
    assert bad.status_code == 400 and "payload field &#39;email&#39; is redacted" in bad.text
    bad = client.get("/queues/default/pending", params={"payload": "customer_id"})
    assert bad.status_code == 400 and "payload must be field=value" in bad.text


def test_a_search_stops_at_its_time_budget_and_next_reads_on(make_app: Any, monkeypatch: Any) -> None:
    app: App = make_app()
    app.task(name="quick")(lambda ctx, **kw: None)
    pending = app.enqueue_many("quick", [{"n": i, "customer_id": 42 if i == 1700 else 10_000 + i} for i in range(2000)])
    client = TestClient(create_app(app))
    monkeypatch.setattr(search, "BUDGET_S", 0.0)  # one chunk per request
    page = client.get("/queues/default/pending", params={"payload": "customer_id=42"}).text
    assert ids(page) == set() and scanned(page) == search.CHUNK and "time budget spent" in page
    offsets = []
    while (m := re.search(r'<a href="\?offset=(\d+)[^"]*">next</a>', page)) is not None:
        offsets.append(int(m[1]))
        page = client.get("/queues/default/pending", params={"payload": "customer_id=42", "offset": m[1]}).text
        if ids(page):
            break
    assert offsets == list(range(search.CHUNK, 1700 // search.CHUNK * search.CHUNK + 1, search.CHUNK))
    assert ids(page) == {pending[1700]}
