"""A workflow's page: its state, business id and steps (state, what each waits for, a link to its job, its result
or failure), for a chain a real worker ran until a step died; an unknown or malformed id in one line."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import sys
import warnings
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import ringfence
from ringfence import App
from ringfence.dashboard import create_app
from support import ROOT, wait_until


def test_workflow_page_shows_its_steps(make_app: Any, redis_url: str, namespace: str) -> None:
    app: App = make_app()
    quick = app.task(name="quick")(lambda ctx, **kw: None)
    broken = app.task(name="broken")(lambda ctx, **kw: None)
    wid = ringfence.chain(quick.s(n=1), broken.s(n=2, api_key="AK-9"), quick.s(n=3)).enqueue(business_id="order:9")
    env = {**os.environ, "RINGFENCE_REDIS_URL": redis_url, "RINGFENCE_NAMESPACE": namespace,
           "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    worker = subprocess.Popen([sys.executable, "-m", "ringfence.cli", "worker", "--app", "dashtasksapp:app"],
                              env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: (wf := app.workflow(wid)) is not None and wf.state == "failed", timeout=30)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
    view = app.workflow(wid)
    assert view is not None
    client = TestClient(create_app(app))
    page = client.get("/workflows", params={"id": wid})
    assert page.status_code == 200 and 'data-state="failed"' in page.text and "order:9" in page.text
    rows = re.findall(r'<tr data-step="(\d+)"><td class="num">\d+</td><td>(.*?)</td>\s*<td class="state">'
                      r'<span [^>]*>(\w+)</span></td>\s*<td>(.*?)</td>\s*<td>(.*?)</td>\s*<td>(.*?)</td></tr>',
                      page.text)
    shown = [(int(i), name, state, after) for i, name, state, after, _, _ in rows]
    assert shown == [(s.index, s.name, s.state, ", ".join(map(str, s.after)) or "-") for s in view.steps]
    assert [s.state for s in view.steps] == ["done", "dead", "waiting"]
    assert f'href="/jobs?id={view.steps[1].job_id}"' in rows[1][4] and "<code>1</code>" in rows[0][5]
    assert "no provider for 2" in html.unescape(rows[1][5])
    assert client.get("/workflows", params={"id": "nosuch"}).status_code == 404
    bad = client.get("/workflows", params={"id": "a b{"})
    assert bad.status_code == 400 and "workflow id" in html.unescape(bad.text)
