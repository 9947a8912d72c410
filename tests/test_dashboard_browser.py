"""The dashboard end to end in headless Chromium (Debian's ``chromium`` driven by Playwright): a real Redis,
real worker processes and the ``ringfence dashboard`` process. In CI a missing browser fails (REQUIRE)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from dashboard_support import charged_twice
from ringfence import App
from support import ROOT, service_missing, wait_until

pytestmark = pytest.mark.slow
CHROMIUM = os.environ.get("RINGFENCE_CHROMIUM", "/usr/bin/chromium")
SHOTS = ROOT / "tmp" / "dashboard"
TOKEN = "browser-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        service_missing("chromium", f"{CHROMIUM} not found (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        service_missing("playwright", str(exc))
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
                              args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


class Env:
    def __init__(self, namespace: str, redis_url: str, fence_url: str) -> None:
        self.ns, self.redis_url = namespace, redis_url
        self.env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
                    "FENCE_URL": fence_url, "RINGFENCE_DASHBOARD_TOKEN": TOKEN,
                    "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.app = App(redis_url, namespace, environment="test", fence_url=fence_url)  # the producer's side

        @self.app.task(name="noop")
        def noop(ctx: Any, n: int, card: str = "") -> None: ...

        @self.app.task(name="flaky")
        def flaky(ctx: Any, n: int) -> None: ...
        self.r = redis.Redis.from_url(redis_url)

    def dashboard(self, *args: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "dashboard", "--app", "dashapp:app",
                                 "--port", str(port), *args], env=self.env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return urllib.request.urlopen(url + "/servers", timeout=2).status == 200
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                return False

        wait_until(up, timeout=30, interval=0.2)
        return url

    def runs(self) -> list[str]:
        return [x.decode() for x in self.r.lrange(f"{self.ns}:test:runs", 0, -1)]

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(10)
        self.app.close()


@pytest.fixture
def env(namespace: str, redis_url: str, tmp_path: Path) -> Iterator[Env]:
    e = Env(namespace, redis_url, f"sqlite:///{tmp_path}/fences.db")
    e.app.fence_store.create_all()
    yield e
    e.close()


@pytest.fixture
def worker(env: Env) -> Callable[[], subprocess.Popen[bytes]]:
    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "dashapp:app"],
                                env=env.env, start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.STDOUT)
        env.procs.append(proc)
        return proc

    return start


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def login(page: Any, url: str) -> None:
    page.goto(url + "/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_selector("text=logged in: actions enabled")


def dead_later_and_in_doubt(env: Env, worker: Callable[[], Any], request: str | None = None) -> tuple[str, str, str]:
    """A job a real worker dead-lettered, a scheduled job with a card number in its payload, and a dead job whose
    ``charge`` step of order:7 is in doubt (calling with ``request``); their ids."""
    from ringfence import jobs
    from ringfence.fence import Owner

    app, b = env.app, env.app.broker
    env.r.set(f"{env.ns}:test:fail", 1)
    dying = app.enqueue("flaky", n=1)
    worker()
    wait_until(lambda: b.job_state("default", dying) == "dead", timeout=30)
    env.r.delete(f"{env.ns}:test:fail")
    later = app.enqueue_many("noop", [{"n": 0, "card": "4111-1111-1111-1111"}], delay_s=3600)[0]
    doubtful = app.enqueue_many("noop", [{"n": 1}], delay_s=3600)[0]
    store = app.fence_store
    store.capture("order:7", "charge", Owner(doubtful, "tok", 30.0), "h", None)
    store.mark_calling("order:7", "charge", 1, request, 30.0)
    jobs.cancel_job(app, doubtful)  # owned a calling step: dead, and the step in doubt
    return dying, later, doubtful


def test_operator_session_in_chromium(browser: Any, env: Env, worker: Callable[[], Any]) -> None:
    app, b = env.app, env.app.broker
    dying, later, doubtful = dead_later_and_in_doubt(env, worker)
    url = env.dashboard()
    page = browser.new_page(viewport={"width": 1280, "height": 800})

    # without the token no action is shown, and one posted anyway is refused
    page.goto(url + "/")
    assert page.locator("form[method=post]").count() == 0
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "rf_csrf")
    refused = page.context.request.post(url + "/actions/pause", form={"csrf": csrf, "queue": "default", "paused": "1"})
    assert refused.status == 403 and not b.queue_counts("default")["paused"]

    login(page, url)
    no_csrf = page.context.request.post(url + "/actions/pause", form={"queue": "default", "paused": "1"})
    assert no_csrf.status == 403 and "CSRF" in no_csrf.text()

    # every page opens; a screenshot of each
    for name, path in [("overview", "/"), ("servers", "/servers"), ("dead", "/queues/default/dead"),
                       ("scheduled", "/queues/default/scheduled"), ("job", f"/jobs?id={dying}"),
                       ("fences", "/fences"), ("doctor", "/doctor")]:
        resp = page.goto(url + path)
        assert resp is not None and resp.status == 200, path
        assert "4111-1111" not in page.content()
        shot(page, name)
    page.goto(url + "/servers")
    page.wait_for_selector("td:has-text('default=1')")

    # replay the dead job by clicking: the worker runs it
    page.goto(url + f"/jobs?id={dying}")
    page.click("button:has-text('Replay')")
    page.wait_for_selector("text=replayed 1 job(s) so far")
    wait_until(lambda: dying in env.runs(), timeout=20)

    # pause by clicking: the worker stops taking from the queue; resume: it takes again
    page.goto(url + "/")
    page.click("tr[data-queue=default] button:has-text('Pause')")
    page.wait_for_selector("text=paused default")
    assert b.queue_counts("default")["paused"]
    held = app.enqueue("noop", n=2)
    time.sleep(1.5)
    assert held not in env.runs() and b.job_state("default", held) == "pending"
    page.click("tr[data-queue=default] button:has-text('Resume')")
    page.wait_for_selector("text=resumed default")
    wait_until(lambda: held in env.runs(), timeout=20)

    # cancel a scheduled job by clicking
    page.goto(url + "/queues/default/scheduled")
    page.click(f"tr[data-job='{later}'] button:has-text('Cancel')")
    page.wait_for_selector(f"text=cancelled job {later} (was scheduled in default)")
    assert b.job_state("default", later) is None

    # resolve the in-doubt step (done, with the provider's reference), then replay its job from the offer
    page.goto(url + "/fences")
    step = page.locator("article[data-step='order:7/charge']")
    step.locator("input[name=reference]").fill("ch_7")
    step.locator("button:has-text('It happened')").click()
    page.wait_for_selector("text=now effected")
    shot(page, "fences-resolved")
    page.click(f"button:has-text('Replay job {doubtful}')")
    page.wait_for_selector("text=replayed 1 job(s) so far")
    wait_until(lambda: doubtful in env.runs(), timeout=20)

    # the overview at phone width, and its screenshot for the docs
    page.goto(url + "/")
    shot(page, "overview-after")
    phone = browser.new_page(viewport={"width": 390, "height": 844})
    phone.goto(url + "/")
    shot(phone, "overview-phone")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390 + 1
    phone.close()
    dark = browser.new_page(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    dark.goto(url + "/")
    shot(dark, "overview-dark")
    light_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert dark.evaluate("getComputedStyle(document.body).backgroundColor") != light_bg
    dark.close()
    page.close()


def test_read_only_shows_no_action(browser: Any, env: Env) -> None:
    job = env.app.enqueue("noop", n=1)
    env.app.broker.set_paused("default", True)
    url = env.dashboard("--read-only")
    page = browser.new_page()
    page.goto(url + "/login")
    assert page.locator("input[name=token]").count() == 0 and page.locator("text=read-only").count() >= 1
    for path in ["/", "/queues/default/pending", "/queues/default/dead", f"/jobs?id={job}", "/fences"]:
        page.goto(url + path)
        assert page.locator("form[method=post]").count() == 0, path
        assert page.locator("text=read-only").count() >= 1
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "rf_csrf")
    r = page.context.request.post(url + "/actions/cancel", form={"csrf": csrf, "id": job},
                                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status == 403 and env.app.broker.job_state("default", job) == "pending"
    page.close()


def test_odd_cookies_forged_messages_and_the_reconcile_page(browser: Any, env: Env) -> None:
    """A cookie that is not ASCII leaves every page working; a link cannot make the dashboard say anything;
    reconcile runs on a click, against the table the app declares, never one named in the address."""
    from sqlalchemy import text

    store = env.app.fence_store
    charged_twice(store)
    with store.engine.begin() as c:
        c.execute(text("create table users (email text, password_hash text)"))
        c.execute(text("insert into users values ('alice@example.org', 'hash-of-alice')"))
    job = env.app.enqueue("noop", n=1)
    url = env.dashboard()
    page = browser.new_page()
    page.context.add_cookies([{"name": "rf_auth", "value": "\u00e9t\u00e9\u4e2d", "url": url}])
    for path in ["/", "/servers", "/jobs", f"/jobs?id={job}", "/queues/default/pending", "/fences", "/login"]:
        resp = page.goto(url + path)
        assert resp is not None and resp.status == 200, path
        assert page.locator("text=log in for actions").count() == 1, path
    page.goto(url + "/?msg=Session+expired:+log+in+again+at+evil.example")
    assert page.locator(".flash").count() == 0 and "evil.example" not in page.content()
    page.context.clear_cookies()

    page.goto(url + "/fences/reconcile?step=charge&table=users&subject_column=email&reference_column=password_hash")
    assert "alice@example.org" not in page.content() and page.locator("button:has-text('Reconcile')").count() == 0
    login(page, url)  # its flash message comes from the dashboard's own redirect
    page.goto(url + "/fences")
    page.click("a[href='/fences/reconcile?step=charge']")
    page.click("button:has-text('Reconcile charge')")
    cell = page.locator("tr[data-finding=double_effects] td.num")
    assert cell.inner_text() == "1" and page.locator("text=2 fence row(s), 3 effect(s)").count() == 1
    assert "alice@example.org" not in page.content() and "hash-of-alice" not in page.content()
    shot(page, "reconcile")
    page.close()


def test_jobs_waiting_for_their_key_on_the_pending_page_and_a_cancel_there(browser: Any, env: Env) -> None:
    """A real worker runs account 7's one job at a time: the jobs waiting for its slot are on the pending page,
    marked with the key; a click on Cancel comes back to that page and the worker never runs that job."""
    from test_concurrency_key import keyed_task

    task = keyed_task(env.app, limit=1)
    url = env.dashboard()
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    login(page, url)
    holder = task.enqueue(account="7", n=0, sleep_s=8.0)  # the time the page below has to show the others
    waiting = [task.enqueue(account="7", n=i, sleep_s=0.05) for i in range(1, 4)]
    proc = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "concurrencykeyapp:app"],
                            env={**env.env, "TEST_KEY_LIMIT": "1"}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    env.procs.append(proc)
    b = env.app.broker
    wait_until(lambda: b.job_state("default", holder) == "active"
               and all(b.job_state("default", j) == "waiting for its key's slot: account:7" for j in waiting),
               timeout=30)
    page.goto(url + "/queues/default/pending")
    for job in waiting:
        assert page.locator(f"tr[data-job='{job}'] td.key").inner_text() == "account:7"
    shot(page, "pending-keyed")
    page.click(f"tr[data-job='{waiting[1]}'] button:has-text('Cancel')")
    page.wait_for_selector(f"text=cancelled job {waiting[1]} (was waiting for its key's slot: account:7 in default)")
    assert page.url.split("?")[0] == url + "/queues/default/pending"
    assert page.locator(f"tr[data-job='{waiting[1]}']").count() == 0
    wait_until(lambda: int(env.r.get(f"{env.ns}:test:done") or 0) == 3, timeout=30)
    started = [x.decode().split()[1] for x in env.r.lrange(f"{env.ns}:test:start", 0, -1)]
    assert sorted(started) == ["0", "1", "3"]
    page.close()
