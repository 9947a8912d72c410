"""A workflow's page: its state, business id and steps (queue, state, what each waits for, a link to its job, its
result or failure), for a chain a real worker ran until a step died, and a step left `handing` to another queue by a
start killed before its hand-in; an unknown or malformed id in one line."""

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
from ringfence import App, faults
from ringfence.dashboard import create_app
from support import ROOT, wait_until


def steps(page: str) -> list[tuple[str, ...]]:
    """Each step's row: index, name, queue, state, after, job cell, result cell."""
    return re.findall(r'<tr data-step="(\d+)"><td class="num">\d+</td><td>(.*?)</td>\s*<td class="queue"><a [^>]*>'
                      r'(.*?)</a></td>\s*<td class="state"><span [^>]*>(\w+)</span></td>\s*<td>(.*?)</td>\s*'
                      r'<td>(.*?)</td>\s*<td>(.*?)</td></tr>', page)


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
    rows = steps(page.text)
    shown = [(int(i), name, queue, state, after) for i, name, queue, state, after, _, _ in rows]
    assert shown == [(s.index, s.name, s.queue, s.state, ", ".join(map(str, s.after)) or "-") for s in view.steps]
    assert [s.state for s in view.steps] == ["done", "dead", "waiting"]
    assert f'href="/jobs?id={view.steps[1].job_id}"' in rows[1][5] and "<code>1</code>" in rows[0][6]
    assert "no provider for 2" in html.unescape(rows[1][6])

    def killed_before_hand_in(name: str) -> None:
        if name == "before_hand_in":
            raise faults.SimulatedKill(name)

    before = set(app.broker.sync.scan_iter(f"{namespace}:*:wf:*"))
    with faults.inject(killed_before_hand_in), pytest.raises(faults.SimulatedKill):  # a client killed in its start
        ringfence.group([quick.s(n=4), quick.with_options(queue="elsewhere").s(n=5)]).enqueue()
    (key,) = set(app.broker.sync.scan_iter(f"{namespace}:*:wf:*")) - before
    handing = client.get("/workflows", params={"id": key.decode().rsplit(":wf:", 1)[1]})
    shown = [(q, state, job.startswith("<a ")) for _, _, q, state, _, job, _ in steps(handing.text)]
    assert shown == [("default", "queued", True), ("elsewhere", "handing", False)], handing.text  # no job yet
    assert 'href="/queues/elsewhere/pending"' in handing.text and "not yet in it" in handing.text
    assert client.get("/workflows", params={"id": "nosuch"}).status_code == 404
    bad = client.get("/workflows", params={"id": "a b{"})
    assert bad.status_code == 400 and "workflow id" in html.unescape(bad.text)
