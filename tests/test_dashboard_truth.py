"""What the dashboard shows agrees with the CLI on the same Redis state: each state's list and the job page with
``ringfence job show``, the overview and its latency chart with ``ringfence info --json``, a filtered bulk
replay with the dead-letter it leaves. Real worker processes put the jobs where they are; the CLI runs as a
real process."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import Workers, worker_env
from ringfence import App
from ringfence.dashboard import DEFAULT_REDACT, create_app
from ringfence.dashboard.security import redact
from ringfence.models import JobSpec
from support import wait_until

TOKEN = "s3cret-token"


class Cli:
    def __init__(self, redis_url: str, namespace: str) -> None:
        self.env = worker_env(redis_url, namespace)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ringfence.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=60)

    def json(self, *args: str) -> Any:
        done = self.run(*args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def show(self, job_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.json("job", "show", job_id)
        return found


@pytest.fixture
def cli(redis_url: str, namespace: str) -> Cli:
    return Cli(redis_url, namespace)


@pytest.fixture
def worker(cli: Cli) -> Iterator[Callable[[], None]]:
    workers = Workers(cli.env, "truthapp:app")
    yield workers.start
    workers.stop()


@pytest.fixture
def app(make_app) -> App:
    """The producer's side of tests/truthapp.py."""
    app = make_app()
    for name in ("unreachable", "second_try", "quote", "doomed"):
        app.task(name=name)(lambda ctx, **kw: None)
    return app


def rows(page: str) -> dict[str, dict[str, Any]]:
    """Per job id on a state page: attempts, error, payload as shown."""
    out = {}
    for m in re.finditer(r'<tr data-job="([^"]+)">.*?<td class="num">(\d+)</td>\s*<td class="err">(.*?)</td>'
                         r'<td><code>(.*?)</code>', page, re.S):
        out[html.unescape(m.group(1))] = {"attempts": int(m.group(2)), "error": html.unescape(m.group(3)),
                                         "args": json.loads(html.unescape(m.group(4)))}
    return out


def test_each_state_list_and_the_job_page_show_what_job_show_says(app: App, cli: Cli, worker: Callable[[], None],
                                                                   rdb: Any) -> None:
    b = app.broker
    retrying = app.enqueue("unreachable", n=1, api_key="AK-1")
    running = app.enqueue("second_try", n=2)
    dead = app.enqueue("doomed", n=3)
    finished = app.enqueue("quote", n=4, card_number="4111")
    later = app.enqueue_many("unreachable", [{"n": 5}], delay_s=3600)[0]
    worker()
    wait_until(lambda: b.job_state("default", retrying) == "retry" and b.job_state("default", dead) == "dead"
               and b.job_state("default", running) == "active" and b.attempts("default", running) == 2
               and b.job_state("default", finished) is None, timeout=30)
    b.set_paused("default", True)  # nothing new starts while the page and the CLI look
    pending = app.enqueue("second_try", n=6)
    client = TestClient(create_app(app, token=TOKEN))
    shown = {}
    for state, job_id in [("retry", retrying), ("active", running), ("dead", dead), ("scheduled", later),
                          ("pending", pending)]:
        shown[state] = cli.show(job_id)
        assert shown[state]["state"] == state
        row = rows(client.get(f"/queues/default/{state}").text)[job_id]
        assert row == {"attempts": shown[state]["attempts"], "error": shown[state]["error"][:120],
                       "args": redact(shown[state]["args"], DEFAULT_REDACT)}, state
    assert shown["retry"]["attempts"] == 1 and shown["retry"]["error"].startswith("ConnectionError")
    assert shown["active"]["attempts"] == 2 and "first try of 2" in shown["active"]["error"]
    page = client.get(f"/jobs?id={retrying}").text
    assert f"<dt>attempts</dt><dd>{shown['retry']['attempts']}</dd>" in page
    assert html.escape(shown["retry"]["error"], quote=False) in page and "AK-1" not in page

    wait_until(lambda: [s.get("running") for s in b.servers()] == [[running]], timeout=10)  # its next heartbeat
    servers = cli.json("servers", "--json")
    page = client.get("/servers").text
    assert len(servers) == 1 and servers[0]["running"] == [running]
    assert server_rows(page) == [[servers[0]["host"], str(servers[0]["pid"]), servers[0]["environment"],
                                  " ".join(f"{q}={w}" for q, w in servers[0]["queues"].items()),
                                  str(servers[0]["concurrency"]), "1", str(servers[0]["processed"]),
                                  str(servers[0]["failed"])]]

    done = cli.show(finished)
    assert done["state"] == "done" and done["result"] == {"n": 4}
    assert not {"args", "attempts", "enqueued_ms", "history"} & done.keys()  # not kept: not shown as 0 or {}
    page = client.get(f"/jobs?id={finished}").text
    assert "<dt>attempts</dt>" not in page and "<h3>Payload</h3>" not in page and '"n": 4' in page
    assert "<dt>enqueued</dt>" not in page and "state" in page and ">done<" in page


def server_rows(page: str) -> list[list[str]]:
    """The first eight cells of each row of the servers page: host to failed."""
    body = page[page.index("<tbody>"):page.index("</tbody>")]
    return [[html.unescape(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[:8]]
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def test_job_cancel_says_it_once(app: App, cli: Cli) -> None:
    job = app.enqueue("quote", n=1)
    done = cli.run("job", "cancel", job)
    assert done.returncode == 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if job in line]
    assert lines == [f"cancelled {job} (was pending in default)"]
    assert app.broker.job_state("default", job) is None


def overview_numbers(page: str, queue: str) -> dict[str, Any]:
    row = page[page.index(f'<tr data-queue="{queue}">'):]
    row = row[:row.index("</tr>")]
    found: dict[str, Any] = {s: int(re.search(rf'/queues/{queue}/{s}" class="[^"]*">(\d+)<', row).group(1))  # type: ignore[union-attr]
                             for s in ("pending", "active", "scheduled", "retry", "dead")}
    found["latency_s"] = float(re.findall(r'<td class="num">([\d.]+)s</td>', row)[0])
    found["paused"] = "paused</span>" in row
    chart = re.search(r"Latency, last hour \(oldest pending, worst queue, s\) <small>max ([\d.]+)s</small>", page)
    assert chart is not None
    found["chart_max_s"] = float(chart.group(1))
    return found


def test_the_overview_and_its_latency_chart_agree_with_info(app: App, cli: Cli) -> None:
    """A queue no worker serves has no latency sample: the chart still shows the latency the table shows."""
    app.task(name="idle", queue="unserved")(lambda ctx, **kw: None)
    app.enqueue("idle", n=1)
    app.enqueue("quote", n=2)
    app.enqueue_many("quote", [{"n": 3}], delay_s=3600)
    app.broker.set_paused("unserved", True)
    time.sleep(1.5)
    client = TestClient(create_app(app))
    before = {q["queue"]: q for q in cli.json("info", "--json")["queues"]}
    page = client.get("/").text
    after = {q["queue"]: q for q in cli.json("info", "--json")["queues"]}
    for queue in ("default", "unserved"):
        shown = overview_numbers(page, queue)
        for key in ("pending", "active", "scheduled", "retry", "dead", "paused"):
            assert shown[key] == before[queue][key] == after[queue][key], (queue, key)
        assert before[queue]["latency_s"] - 0.05 <= shown["latency_s"] <= after[queue]["latency_s"] + 0.05
    worst_before = max(q["latency_s"] for q in before.values())
    worst_after = max(q["latency_s"] for q in after.values())
    assert worst_before >= 1.5
    assert worst_before - 0.05 <= overview_numbers(page, "unserved")["chart_max_s"] <= worst_after + 0.05


def put_dead(app: App, job_id: str, task: str, error: str) -> None:
    b = app.broker
    k = b.keys.queue("default")
    b.register_queues(["default"])
    spec = JobSpec(task, {"n": 1}, b.clock()).encode()
    b.sync.zadd(k.dead, {job_id: b.clock()})
    b.sync.hset(k.dead_jobs, job_id, orjson.dumps({"spec": spec.decode(), "attempts": 3, "history": "[]",
                                                   "died_ms": b.clock(), "reason": "max_attempts", "error": error}))


def test_a_filtered_bulk_replay_counts_what_the_filter_matched(app: App, cli: Cli) -> None:
    for i in range(31):
        put_dead(app, f"other{i}", "doomed", "card declined")
    for i in range(5):
        put_dead(app, f"net{i}", "doomed", "ConnectionError: reset")
    web = create_app(app, token=TOKEN)
    client = TestClient(web)
    client.get("/login")
    client.post("/login", data={"csrf": client.cookies.get("rf_csrf", ""), "token": TOKEN})
    r = client.post("/actions/dead", data={"csrf": client.cookies.get("rf_csrf", ""), "op": "replay",
                                           "queue": "default", "all": "1", "error": "connectionerror"})
    progress = re.search(r'<p class="flash" role="status" id="progress">([^<]*)</p>', r.text)
    assert progress is not None
    assert progress.group(1) == "replayed 5 job(s) so far; 0 dead job(s) matching the filter left in default."
    info = {q["queue"]: q for q in cli.json("info", "--json")["queues"]}["default"]
    assert (info["dead"], info["pending"]) == (31, 5)
