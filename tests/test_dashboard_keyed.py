"""The pending page lists the jobs a fetch sorted into their concurrency keys' lists (lua/_keyed.lua), after the
pending list, each marked with its key, paged like the rest and in bounded reads; a cancel goes back to the page
the job was on."""

from __future__ import annotations

import html
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import redis

from ringfence import App
from ringfence.queries import queue_gauges
from ringfence.redis.embedded import EmbeddedRedis
from test_concurrency_key import keyed_task

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import csrf, logged_in
from ringfence.dashboard import create_app

ROW = re.compile(r'<tr data-job="([^"]+)">\s*<td><a [^>]*>[^<]*</a></td>'
                 r'<td class="key">(?:<span[^>]*>([^<]*)</span>)?</td>')
NEXT = re.compile(r'<a href="\?(offset=[^"]*)">next</a>')


def rows(page: str) -> list[tuple[str, str]]:
    """(id, key or '') of each job row of a pending page with the key column."""
    return [(i, html.unescape(k)) for i, k in ROW.findall(page)]


def walk(client: TestClient, path: str) -> tuple[list[tuple[str, str]], int]:
    """Every row of a state, following the "next" links; and how many pages it took."""
    page, found, pages = client.get(path).text, [], 1
    found += rows(page)
    while (m := NEXT.search(page)) is not None:
        page = client.get(path + "?" + html.unescape(m[1])).text
        found += rows(page)
        pages += 1
    return found, pages


def lease_one(app: App) -> None:
    """A fetch as a worker's, of one job."""
    b = app.broker
    b.run(b.fetch("default", 1, b.clock() + 600_000, "t1"))


def test_the_pending_page_lists_jobs_waiting_for_their_key_page_by_page(make_app: Callable[..., App]) -> None:
    app = make_app()
    task = keyed_task(app, limit=1)

    @app.task(name="plain")
    def plain(ctx: object, n: int) -> None: ...

    a = [task.enqueue(account="a", n=i) for i in range(70)]
    b = [task.enqueue(account="b", n=i) for i in range(3)]
    early = [plain.enqueue(n=i) for i in range(4)]  # sorted under key '' (pending, no key) with the others
    lease_one(app)  # a[0] runs; the rest wait in their keys' lists
    late = [plain.enqueue(n=i) for i in range(6)]  # in the pending list
    waiting = {*a[1:], *b, *early, *late}
    assert queue_gauges(app.broker, "default")["pending"] == len(waiting)

    client = TestClient(create_app(app))
    first = client.get("/queues/default/pending").text
    assert [i for i, _ in rows(first)[:6]] == late  # the pending list first, oldest first
    found, pages = walk(client, "/queues/default/pending")
    assert len(found) == len(waiting) and {i for i, _ in found} == waiting
    assert pages == 2
    keys = dict(found)
    assert all(keys[i] == "account:a" for i in a[1:]) and all(keys[i] == "account:b" for i in b)
    assert all(keys[i] == "" for i in early + late)
    by_key = [i for i, k in found if k == "account:a"]
    assert by_key == a[1:]  # a key's jobs oldest first, across the page break

    # a filter reads on into the keys' lists
    hit = client.get("/queues/default/pending", params={"payload": "n=66", "task": "per_account"}).text
    assert [i for i, _ in rows(hit)] == [a[66]] and "to the end of pending" in hit
    bad = client.get("/queues/default/pending?keyed=1.x")
    assert bad.status_code == 400 and "keyed must be two whole numbers" in bad.text


def test_a_page_deep_in_a_key_reads_one_page(private_redis: EmbeddedRedis) -> None:
    """20,000 jobs of one key: a page 15,000 jobs deep sends the dashboard about a page of entries, not the key."""
    app = App(private_redis.url, "deep", environment="test")
    keyed_task(app, limit=1)
    ids = app.enqueue_many("per_account", [{"account": "a", "n": i} for i in range(20_000)])
    b = app.broker
    lease_one(app)  # the key's first job: the key is at its limit, the rest wait in its list
    assert queue_gauges(b, "default")["pending"] == 19_999
    client = TestClient(create_app(app))
    admin = redis.Redis.from_url(private_redis.url)

    def sent() -> int:
        return int(admin.info("stats")["total_net_output_bytes"])

    client.get("/queues/default/pending?keyed=0.15000")  # warm: connections, templates
    before = sent()
    page = client.get("/queues/default/pending?keyed=0.15000").text
    spent = sent() - before
    assert [i for i, _ in rows(page)] == ids[15_001:15_051]
    assert 'href="?offset=0&keyed=0.15050&' in html.unescape(page)
    whole_key = sum(len(e) for e in admin.lrange(b.keys.keyed("default") + "q:account:a", 0, -1))
    assert whole_key > 1_000_000 and spent < 60_000, spent


@pytest.mark.parametrize("where", ["key", "pending", "waiting", "scheduled", "active"])
def test_a_cancel_goes_back_to_the_page_the_job_was_on(make_app: Callable[..., App], where: str) -> None:
    app = make_app()
    task = keyed_task(app, limit=1)
    b = app.broker
    holder = task.enqueue(account="7", n=0)
    second = task.enqueue(account="7", n=1)
    lease_one(app)  # holder runs; the second job of its key waits in the key's list
    job = {"key": lambda: second, "active": lambda: holder,
           "pending": lambda: task.enqueue(account="8", n=1),
           "waiting": lambda: task.with_options(depends_on=[holder]).enqueue(account="9", n=1),
           "scheduled": lambda: task.with_options(delay_s=3600).enqueue(account="9", n=2)}[where]()
    state = {"key": "waiting for its key's slot: account:7"}.get(where, where)
    assert b.job_state("default", job) == state
    client = logged_in(create_app(app, token="tok"), "tok")
    assert "Cancel job" in client.get(f"/jobs?id={job}").text
    done = client.post("/actions/cancel", data={"csrf": csrf(client), "id": job}, follow_redirects=False)
    page = {"key": "pending", "waiting": "pending"}.get(where, where)
    assert done.status_code == 303 and done.headers["location"].split("?")[0] == f"/queues/default/{page}"
    shown = html.unescape(client.get(done.headers["location"]).text)
    assert f"cancelled job {job} (was {state} in default)" in shown
    assert b.job_state("default", job) is None


def test_a_queue_without_keys_has_no_key_column_and_pages_as_before(make_app: Callable[..., App]) -> None:
    app = make_app()
    app.task(name="plain")(lambda ctx, n: None)
    ids = app.enqueue_many("plain", [{"n": i} for i in range(60)])
    client = TestClient(create_app(app))
    page = client.get("/queues/default/pending").text
    assert '<td class="key">' not in page and "concurrency key" not in page
    assert re.findall(r'<tr data-job="([^"]+)">', page) == ids[:50]
    found: list[Any] = re.findall(r'<tr data-job="([^"]+)">', client.get("/queues/default/pending?offset=50").text)
    assert found == ids[50:]
