"""Run now and cancel for scheduled and retrying jobs, one and in bulk (batches of 500, the page submitting the
next): a real worker process runs what was made due; a filter leaves the other jobs where they were; POST only,
with the token and the CSRF value."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import Workers, csrf, login, worker_env
from ringfence import App
from ringfence.dashboard import create_app
from support import wait_until

TOKEN = "later-token"


def logged_in(app: App) -> tuple[TestClient, str]:
    client = TestClient(create_app(app, token=TOKEN))
    return client, login(client, TOKEN)


def follow(client: TestClient, page: str) -> str:
    """Submit each next-batch form the progress page carries, as its script does; the last page."""
    while (form := re.search(r'<form method="post" action="/actions/later" data-autosubmit>(.*?)</form>', page,
                             re.S)) is not None:
        data = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form[1]))
        page = client.post("/actions/later", data=data).text
    return page


@pytest.fixture
def worker(redis_url: str, namespace: str) -> Iterator[Any]:
    workers = Workers(worker_env(redis_url, namespace), "dashtasksapp:app")
    yield workers.start
    workers.stop()


@pytest.fixture
def app(make_app: Any) -> App:
    app: App = make_app()
    for name in ("quick", "slow", "later"):
        app.task(name=name)(lambda ctx, **kw: None)
    return app


def test_run_now_one_scheduled_and_one_retrying_job_a_worker_runs_them(app: App, worker: Any) -> None:
    b = app.broker
    retrying = app.enqueue("later", n=1)
    worker()
    wait_until(lambda: b.job_state("default", retrying) == "retry", timeout=30)
    scheduled = app.enqueue_many("quick", [{"n": 1}], delay_s=3600)[0]
    client, token = logged_in(app)
    page = client.get("/queues/default/scheduled").text
    assert f'value="{scheduled}" form="later-form"' in page and 'value="run_now"' in page
    done = client.post("/actions/later", data={"csrf": token, "op": "run_now", "queue": "default",
                                               "state": "scheduled", "id": scheduled})
    assert done.status_code == 200 and 'data-done="1"' in done.text
    wait_until(lambda: b.job_state("default", scheduled) is None, timeout=10)  # run and acked
    done = client.post("/actions/later", data={"csrf": token, "op": "run_now", "queue": "default",
                                               "state": "retry", "id": retrying})
    assert 'data-done="1"' in done.text
    wait_until(lambda: b.attempts("default", retrying) == 2 and b.job_state("default", retrying) == "retry",
               timeout=10)  # its second attempt ran now, not in an hour (and failed again)


def test_the_job_page_of_a_scheduled_or_retrying_job_runs_it_now(app: App) -> None:
    b = app.broker
    k = b.keys.queue("default")
    scheduled, other = app.enqueue_many("quick", [{"n": 1}, {"n": 2}], delay_s=3600)
    client, _ = logged_in(app)
    for job_id, key in ((scheduled, k.scheduled), (other, k.scheduled)):
        if job_id == other:  # the same form on a retrying job
            b.sync.zrem(k.scheduled, other)
            b.sync.zadd(k.retry, {other: b.clock() + 3_600_000})
            key = k.retry
        page = client.get(f"/jobs?id={job_id}").text
        form = re.search(r'<form method="post" action="/actions/later" class="inline" id="run-now-form">(.*?)</form>',
                         page, re.S)
        assert form is not None and ">Run now</button>" in form[1]
        done = client.post("/actions/later", data=dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form[1])))
        assert done.status_code == 200 and 'data-done="1"' in done.text
        assert (b.sync.zscore(key, job_id) or 0) <= b.clock()  # due now: the next promotion queues it
    assert b.sync.zscore(k.scheduled, scheduled) is not None and b.sync.zscore(k.retry, other) is not None
    pending = app.enqueue("quick", n=3)
    assert "run-now-form" not in client.get(f"/jobs?id={pending}").text


def test_the_scheduled_and_retry_pages_say_when_each_job_is_due(app: App) -> None:
    from ringfence.dashboard.page import _utc

    b = app.broker
    k = b.keys.queue("default")
    soon, later = app.enqueue_many("quick", [{"n": 1}, {"n": 2}], delay_s=600)
    b.sync.zadd(k.scheduled, {later: b.clock() + 7_200_000})
    b.sync.zrem(k.scheduled, soon)
    b.sync.zadd(k.retry, {soon: b.clock() + 1_800_000})  # as a failed attempt leaves it
    client, _ = logged_in(app)
    for state, job_id, head in (("scheduled", later, "due"), ("retry", soon, "next retry")):
        page = client.get(f"/queues/default/{state}").text
        assert f"<th>{head}</th>" in page
        row = re.search(rf'<tr data-job="{job_id}">(.*?)</tr>', page, re.S)
        cell = re.search(r'<td class="due"><span title="([^"]+)">([^<]+)</span></td>', row[1] if row else "")
        assert cell is not None, page
        assert cell[1] == _utc(b.sync.zscore(k.retry if state == "retry" else k.scheduled, job_id) or 0)
        assert re.fullmatch(r"in 2\.0h" if state == "scheduled" else r"in (30\.0|29\.9)m", cell[2]), cell[2]
    assert "due</th>" not in client.get("/queues/default/pending").text


def test_bulk_run_now_with_a_filter_in_batches_leaves_the_rest(app: App) -> None:
    b = app.broker
    quick = app.enqueue_many("quick", [{"n": i} for i in range(1200)], delay_s=3600)
    slow = app.enqueue_many("slow", [{"n": i} for i in range(300)], delay_s=3600)
    client, token = logged_in(app)
    first = client.post("/actions/later", data={"csrf": token, "op": "run_now", "queue": "default",
                                                "state": "scheduled", "all": "1", "task": "quick"}).text
    assert "the next batch follows" in first
    last = follow(client, first)
    assert 'data-done="1200"' in last and "the next batch follows" not in last
    k = b.keys.queue("default")
    now = b.clock()
    assert {x.decode() for x in b.sync.zrangebyscore(k.scheduled, now + 1, "+inf")} == set(slow)
    assert {x.decode() for x in b.sync.zrangebyscore(k.scheduled, "-inf", now)} == set(quick)


def test_bulk_cancel_of_retrying_jobs(app: App, worker: Any) -> None:
    b = app.broker
    ids = app.enqueue_many("later", [{"n": i} for i in range(5)])
    worker()
    wait_until(lambda: all(b.job_state("default", j) == "retry" for j in ids), timeout=30)
    client, token = logged_in(app)
    page = follow(client, client.post("/actions/later", data={"csrf": token, "op": "cancel", "queue": "default",
                                                              "state": "retry", "all": "1"}).text)
    assert 'data-done="5"' in page
    assert all(b.job_state("default", j) is None for j in ids)


def test_later_actions_need_the_token_and_the_csrf_value(app: App) -> None:
    job = app.enqueue_many("quick", [{"n": 1}], delay_s=3600)[0]
    anonymous = TestClient(create_app(app, token=TOKEN))
    form = {"csrf": csrf(anonymous, "/login"), "op": "run_now", "queue": "default", "state": "scheduled", "id": job}
    assert anonymous.post("/actions/later", data=form).status_code == 403
    client, token = logged_in(app)
    assert client.post("/actions/later", data={**form, "csrf": "wrong"}).status_code == 403
    bad = client.post("/actions/later", data={**form, "csrf": token, "all": "1", "after": "12x"})
    assert bad.status_code == 400 and "after must be a time in milliseconds" in bad.text
    assert app.broker.job_state("default", job) == "scheduled"


def test_a_cancel_the_fence_store_refuses_says_so_and_leaves_the_job(make_app: Any) -> None:
    from bench.servers import free_port

    app: App = make_app(fence_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test")
    app.task(name="later")(lambda ctx, **kw: None)
    job_id = app.registry.get("later").with_options(delay_s=3600).enqueue(n=1)
    client, token = logged_in(app)
    page = client.post("/actions/later", data={"csrf": token, "op": "cancel", "queue": "default",
                                               "state": "scheduled", "id": job_id}).text
    assert "refused:" in page and "127.0.0.1" in page  # the fence store's error, not a count of 0
    assert app.broker.job_state("default", job_id) == "scheduled"
    overview = client.get("/")  # the overview still shows the queues, and why no step in doubt is counted
    assert overview.status_code == 200 and "steps in doubt are not counted" in overview.text
