"""The dashboard's routes through Starlette's TestClient against the real Redis: pages, actions, token, CSRF,
read-only, redaction, cancel/purge (also from the CLI) and the per-minute history the workers keep."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("starlette")
with warnings.catch_warnings():  # Starlette's note on which HTTP client its TestClient prefers
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import csrf, logged_in
from ringfence import App, jobs
from ringfence.cli import main
from ringfence.dashboard import create_app
from ringfence.fence import FenceStore, Owner
from ringfence.models import JobSpec
from support import wait_until

TOKEN = "s3cret-token"


@pytest.fixture
def app(make_app) -> App:
    app = make_app()

    @app.task(name="charge")
    def charge(ctx: Any, order: int, card: str = "", email: str = "") -> None: ...

    @app.task(name="send", queue="mail")
    def send(ctx: Any, to: str) -> None: ...

    return app


def test_every_page_renders_and_pages_read_one_page(app: App) -> None:
    ids = [app.enqueue("charge", order=i, card="4111-1111", email="a@b.c") for i in range(120)]
    app.enqueue("send", to="x")
    client = TestClient(create_app(app, token=TOKEN))
    for path in ["/", "/servers", "/jobs", "/fences", "/doctor", "/login", "/queues/default/pending",
                 "/queues/default/dead", f"/jobs?id={ids[0]}"]:
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert "4111-1111" not in r.text and "a@b.c" not in r.text  # redacted everywhere
    overview = client.get("/").text
    assert 'data-queue="default"' in overview and ">120<" in overview and "<svg" in overview
    page = client.get("/queues/default/pending").text
    assert page.count('<tr data-job="') == 50 and ids[0] in page and ids[50] not in page  # oldest first, 50
    nxt = client.get("/queues/default/pending?offset=50").text
    assert ids[50] in nxt and ids[0] not in nxt
    job = client.get(f"/jobs?id={ids[3]}").text
    assert "pending" in job and "[redacted]" in job and '"order": 3' in job
    assert client.get("/jobs?id=nope").status_code == 404
    assert client.get("/", headers={"X-Partial": "1"}).text.lstrip().startswith("<h1>")  # live refresh fragment


def test_actions_need_token_and_csrf(app: App) -> None:
    app.enqueue("charge", order=1)
    web = create_app(app, token=TOKEN)
    anon = TestClient(web)
    token_less = anon.post("/actions/pause", data={"csrf": csrf(anon), "queue": "default", "paused": "1"})
    assert token_less.status_code == 403 and "log in" in token_less.text
    assert "Pause" not in anon.get("/").text
    client = logged_in(web, TOKEN)
    no_csrf = client.post("/actions/pause", data={"queue": "default", "paused": "1"})
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
    wrong = client.post("/actions/pause", data={"csrf": "forged", "queue": "default", "paused": "1"})
    assert wrong.status_code == 403
    assert not app.broker.queue_counts("default")["paused"]
    ok = client.post("/actions/pause", data={"csrf": csrf(client), "queue": "default", "paused": "1"})
    assert ok.status_code == 200 and "paused default" in ok.text
    assert app.broker.queue_counts("default")["paused"]
    out = client.post("/logout", data={"csrf": csrf(client)})
    assert "logged out" in out.text and "log in for actions" in out.text
    again = client.post("/actions/pause", data={"csrf": csrf(client), "queue": "default", "paused": "0"})
    assert again.status_code == 403 and app.broker.queue_counts("default")["paused"]
    bad_login = TestClient(web)
    assert bad_login.post("/login", data={"csrf": csrf(bad_login, "/login"), "token": "guess"}).status_code == 403


def test_read_only_and_no_token_show_and_take_no_action(app: App) -> None:
    job = app.enqueue("charge", order=1)
    for web in (create_app(app, token=TOKEN, read_only=True), create_app(app, token="")):
        client = TestClient(web)
        for path in ["/", f"/jobs?id={job}", "/queues/default/pending", "/queues/default/dead", "/fences"]:
            assert "<form method=\"post\"" not in client.get(path).text, path
        r = client.post("/actions/cancel", data={"csrf": csrf(client), "id": job},
                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 403
    assert app.broker.job_state("default", job) == "pending"


def test_mounted_with_the_host_apps_auth(app: App) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/ops/ringfence",
                                   create_app(app, authorize=lambda req: req.headers.get("x-staff") == "yes"))])
    client = TestClient(host)
    page = client.get("/ops/ringfence/")
    assert page.status_code == 200 and 'href="/ops/ringfence/static/style.css"' in page.text
    assert client.get("/ops/ringfence/static/live.js").status_code == 200
    token = csrf(client, "/ops/ringfence/")
    data = {"csrf": token, "queue": "default", "paused": "1"}
    app.broker.register_queues(["default"])
    assert client.post("/ops/ringfence/actions/pause", data=data).status_code == 403
    ok = client.post("/ops/ringfence/actions/pause", data=data, headers={"x-staff": "yes"}, follow_redirects=False)
    assert ok.status_code == 303 and ok.headers["location"].startswith("/ops/ringfence/")


def test_cancel_scheduled_and_pending_and_purge(app: App) -> None:
    [later] = app.enqueue_many("charge", [{"order": 1}], delay_s=3600)
    now_job = app.enqueue("charge", order=2)
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    assert app.broker.job_state("default", later) == "scheduled"
    r = client.post("/actions/cancel", data={"csrf": csrf(client), "id": later})
    assert r.status_code == 200 and "was scheduled" in r.text
    assert app.broker.job_state("default", later) is None
    r = client.post("/actions/cancel", data={"csrf": csrf(client), "id": now_job})
    assert "was pending" in r.text and app.broker.job_state("default", now_job) is None
    app.enqueue_many("charge", [{"order": i} for i in range(2500)])
    refused = client.post("/actions/purge", data={"csrf": csrf(client), "queue": "default", "confirm": "nope"})
    assert "type the queue" in refused.text and app.broker.queue_counts("default")["pending"] == 2500
    done = client.post("/actions/purge", data={"csrf": csrf(client), "queue": "default", "confirm": "default"})
    assert "purged 2500" in done.text and app.broker.queue_counts("default")["pending"] == 0
    assert app.broker.sync.hlen(app.broker.keys.queue("default").jobs) == 0


def test_cli_job_show_cancel_and_queue_purge(app: App, redis_url: str, namespace: str) -> None:
    env = {"RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace}
    job = app.enqueue("charge", order=9, card="4111")
    run = CliRunner().invoke
    shown = run(main, ["job", "show", job], env=env)
    assert shown.exit_code == 0 and '"state": "pending"' in shown.output and '"order": 9' in shown.output
    assert run(main, ["job", "show", "nope"], env=env).exit_code == 2
    cancelled = run(main, ["job", "cancel", job], env=env)
    assert cancelled.exit_code == 0 and "was pending" in cancelled.output
    assert run(main, ["job", "cancel", job], env=env).exit_code == 2
    for i in range(3):
        app.enqueue("charge", order=i)
    refused = run(main, ["queue", "purge", "default"], env=env)
    assert refused.exit_code == 2 and "--yes" in refused.output
    purged = run(main, ["queue", "purge", "default", "--yes"], env=env)
    assert purged.exit_code == 0 and "purged 3" in purged.output


def test_cancel_of_a_job_owning_a_calling_step_parks_it_and_keeps_the_job(make_app, tmp_path) -> None:
    app = make_app(environment="test", fence_url=f"sqlite:///{tmp_path}/f.db")

    @app.task(name="charge")
    def charge(ctx: Any, order: int) -> None: ...

    store: FenceStore = app.fence_store
    store.create_all()
    job = app.enqueue("charge", order=7)
    store.capture("order:7", "charge", Owner(job, "tok", 30.0), "h", None)
    store.mark_calling("order:7", "charge", 1, None, 30.0)
    queue, left = __import__("ringfence.jobs", fromlist=["cancel_job"]).cancel_job(app, job)
    assert (queue, left) == ("default", "pending -> dead")
    row = store.get("order:7", "charge")
    assert row is not None and str(row.state) == "in_doubt"
    dead = app.broker.dead_records("default", [job])
    assert dead and b'"reason":"cancelled"' in dead[0][1] and b"in_doubt" in dead[0][1]


def test_in_doubt_step_resolved_then_its_dead_job_offered_for_replay(make_app, tmp_path) -> None:
    app = make_app(environment="test", fence_url=f"sqlite:///{tmp_path}/f.db")

    @app.task(name="charge")
    def charge(ctx: Any, order: int) -> None: ...

    store: FenceStore = app.fence_store
    store.create_all()
    job = app.enqueue("charge", order=7)
    store.capture("order:7", "charge", Owner(job, "tok", 30.0), "h", None)
    store.mark_calling("order:7", "charge", 1, None, 30.0)
    __import__("ringfence.jobs", fromlist=["cancel_job"]).cancel_job(app, job)  # dead, step in doubt
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    page = client.get("/fences").text
    assert 'data-step="order:7/charge"' in page and f"?id={job}" in page
    assert "was calling: the effect may have happened" in page  # the owner's dead-letter error as evidence
    no_ref = client.post("/actions/resolve", data={"csrf": csrf(client), "subject": "order:7", "step": "charge",
                                                   "outcome": "done"})
    assert "needs the provider" in no_ref.text
    r = client.post("/actions/resolve", data={"csrf": csrf(client), "subject": "order:7", "step": "charge",
                                              "outcome": "done", "reference": "ch_7"})
    assert "now effected" in r.text and f"Replay job {job}" in r.text
    replay = client.post("/actions/dead", data={"csrf": csrf(client), "op": "replay", "queue": "default", "id": job})
    assert "replayed 1" in replay.text and app.broker.job_state("default", job) == "pending"


def test_bulk_replay_of_dead_jobs_runs_in_batches(app: App) -> None:
    b = app.broker
    k = b.keys.queue("default")
    b.register_queues(["default"])
    spec = JobSpec("charge", {"order": 1}, b.clock()).encode()
    for start in range(0, 1200, 400):
        with b.sync.pipeline() as p:
            for i in range(start, start + 400):
                p.zadd(k.dead, {f"d{i}": i})
                p.hset(k.dead_jobs, f"d{i}", b'{"spec":' + __import__("orjson").dumps(spec.decode()) +
                       b',"attempts":3,"history":"[]","died_ms":1,"reason":"max_attempts","error":"boom x"}')
            p.execute()
    client = logged_in(create_app(app, token=TOKEN), TOKEN)
    data = {"csrf": csrf(client), "op": "replay", "queue": "default", "all": "1", "error": "boom"}
    first = client.post("/actions/dead", data=data)
    assert "replayed 500 job(s) so far; 500 or more dead job(s) matching the filter" in first.text
    assert "data-autosubmit" in first.text
    second = client.post("/actions/dead", data={**data, "done": "500"})
    third = client.post("/actions/dead", data={**data, "done": "1000"})
    assert "replayed 1000" in second.text
    assert "replayed 1200 job(s) so far; 0 dead job(s) matching the filter left" in third.text
    assert "data-autosubmit" not in third.text and b.queue_counts("default")["pending"] == 1200


def test_cancel_of_a_running_job_sets_ctx_cancelled_and_workers_keep_history(redis_url, namespace, rdb,
                                                                               spawn_worker) -> None:
    import importlib
    import os

    os.environ["RINGFENCE_NAMESPACE"], os.environ["RINGFENCE_REDIS_URL"] = namespace, redis_url
    import workerapp

    m = importlib.reload(workerapp)
    app = m.app
    job = m.watches.enqueue(seconds=30)
    spawn_worker()
    wait_until(lambda: rdb.lrange(f"{namespace}:test:started", 0, -1), timeout=20)
    assert jobs.cancel_job(app, job) == ("default", "active")
    assert rdb.lrange(f"{namespace}:test:cancelled", 0, -1) == []
    wait_until(lambda: rdb.lrange(f"{namespace}:test:cancelled", 0, -1) == [job.encode()], timeout=10)
    assert jobs.find_job(app, job) is None
    for n in range(5):
        m.noop.enqueue(n=n)
    m.refuses.enqueue()
    wait_until(lambda: app.broker.queue_counts("default")["stats"].get("processed", 0) >= 5, timeout=20)
    wait_until(lambda: app.broker.queue_counts("default")["dead"] == 1, timeout=20)
    history = app.broker.minutes("default")
    assert sum(v for k, v in history.items() if k.startswith("p")) == 5
    assert sum(v for k, v in history.items() if k.startswith("f")) == 1
    assert any(k.startswith("l") for k in history)  # the workers' latency samples
    assert 0 < rdb.pttl(app.broker.keys.queue("default").minutes) <= 90_000_000


def test_dashboard_command_without_its_extra_says_how_to_install(monkeypatch, redis_url, namespace) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    out = CliRunner().invoke(main, ["dashboard"], env={"RINGFENCE_REDIS_URL": redis_url,
                                                       "RINGFENCE_NAMESPACE": namespace})
    assert out.exit_code == 2
    assert out.output.strip().splitlines() == ["error: the dashboard needs its extra: pip install "
                                               "'ringfence[dashboard]' (uvicorn is missing)"]


def test_chart_buckets_sum_counts_and_keep_the_peak_of_latency() -> None:
    from ringfence.dashboard.charts import buckets, line_chart

    counts = {"p100": 3, "p101": 4, "p99": 1, "l100": 5000, "l101": 2000, "p10": 7}
    assert buckets(counts, "p", 101, 4, 1) == [0.0, 1.0, 3.0, 4.0]
    assert buckets(counts, "p", 101, 4, 2) == [1.0, 7.0]
    assert buckets(counts, "l", 101, 4, 2, peak=True) == [0.0, 5000.0]
    svg = str(line_chart("t", [("latency", [0.0, 5.0, 2.0], "s-lat")], "-1h", unit="s", totals=False))
    assert "latency (max 5s)" in svg and "<small>max 5s</small>" in svg and svg.count("<polyline") == 1


def test_the_per_minute_history_stays_bounded(app: App) -> None:
    """Fields older than a day go once the hash passes 4,400 fields, whichever script starts a new minute."""
    b = app.broker
    key = b.keys.queue("default").minutes
    now_minute = b.clock() // 60_000
    old = {f"p{m}": 1 for m in range(now_minute - 10_000, now_minute - 5_500)}  # 4,500 minutes long gone
    recent = {f"f{now_minute - 5}": 2}
    b.sync.hset(key, mapping={**old, **recent})
    b.run(b.latency_sample("default", 1500))
    left = b.minutes("default")
    assert [(k[0], v) for k, v in left.items() if k not in recent] == [("l", 1500)] and recent.items() <= left.items()
    b.sync.hset(key, mapping=old)
    b.sync.hdel(key, *[k for k in left if k.startswith("l")])
    job = app.enqueue("charge", order=1)
    [(job_id, _, _)] = b.run(b.fetch("default", 1, b.clock() + 10_000, "tok"))
    assert job_id == job and b.run(b.ack("default", [(job, "tok")])) == []
    left = b.minutes("default")
    assert [(k[0], v) for k, v in left.items() if k not in recent] == [("p", 1)] and recent.items() <= left.items()


def test_a_dead_job_only_in_the_failed_jobs_table_is_found(make_app, tmp_path) -> None:
    from ringfence.models import DeadJob

    app = make_app(environment="test", fence_url=f"sqlite:///{tmp_path}/f.db")
    app.fence_store.create_all()
    app.failed_jobs.create_all()
    app.failed_jobs.record(DeadJob("lost-1", "default", "doomed", {"n": 1, "card": "4111"}, "permanent", "E", "",
                                   1, 5, []), {"t": "doomed", "v": 1, "e": 1.0, "a": {"n": 1, "card": "4111"}})
    found = jobs.find_job(app, "lost-1")
    assert found is not None and (found.state, found.source, found.task) == ("dead", "sql", "doomed")
    page = logged_in(create_app(app, token=TOKEN), TOKEN).get("/jobs?id=lost-1").text
    assert "failed_jobs table only" in page and "ringfence dead replay lost-1" in page and "4111" not in page
    assert 'action="/actions/dead"' not in page  # Redis has no record to replay: the CLI restores it
