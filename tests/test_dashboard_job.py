"""A job's page against a real worker process: the worker running it and since when, when its next retry is due,
its failed attempts as a table with readable times and each attempt's worker, the payload (redacted) collapsible
with a copy button."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import sys
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from ringfence import App
from ringfence.dashboard import create_app
from support import ROOT, wait_until


def utc(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_job_page_says_where_when_and_who(make_app: Any, redis_url: str, namespace: str) -> None:
    app: App = make_app()
    for name in ("later", "long"):
        app.task(name=name)(lambda ctx, **kw: None)
    b = app.broker
    before = b.clock()
    retrying = app.enqueue("later", n=1, customer_id=7, api_key="AK-SECRET")
    running = app.enqueue("long", n=2)
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "dashtasksapp:app"],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: b.job_state("default", retrying) == "retry"
                   and any(running in (s.get("running_since_ms") or {}) for s in b.servers()), timeout=30)
        (server,) = b.servers()
        client = TestClient(create_app(app))

        page = client.get("/jobs", params={"id": running}).text
        since = server["running_since_ms"][running]
        assert before <= since <= b.clock()
        runner = html.unescape(re.search(r'<dd class="runner">(.*?)</dd>', page, re.S)[1])
        assert f"{server['host']} pid {server['pid']}" in runner and server["id"] in runner
        assert f"since {utc(since)}" in runner

        page = client.get("/jobs", params={"id": retrying}).text
        due = b.sync.zscore(b.keys.queue("default").retry, retrying)
        m = re.search(r'<dt>next retry</dt><dd class="due" data-ms="(\d+)">(.*?)</dd>', page)
        assert m and int(m[1]) == int(due) and m[2].startswith(utc(due))
        minutes = float(re.search(r"\(in ([\d.]+)m\)", m[2])[1])  # a retry an hour or less away (with jitter)
        assert abs(minutes - (due - b.clock()) / 60_000) < 0.2
        (entry,) = b.history("default", retrying)
        row = re.search(r'<table class="history">.*?<tbody>\s*<tr>(.*?)</tr>', page, re.S)[1]
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        assert cells[0] == "1" and cells[1].startswith(utc(entry["at"]))
        assert cells[2] == f"{server['host']} pid {server['pid']} {server['id']}" and entry["worker"] == server["id"]
        assert cells[3].startswith("ConnectionError") and "provider unreachable for 1" in cells[3]
        assert '<details class="payload keep" open>' in page and f'data-copy="payload-{retrying}"' in page
        payload = html.unescape(re.search(rf'<pre class="payload" id="payload-{retrying}">(.*?)</pre>', page, re.S)[1])
        assert '"customer_id": 7' in payload and '"api_key": "[redacted]"' in payload and "AK-SECRET" not in page
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
