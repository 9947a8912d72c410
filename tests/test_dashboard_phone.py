"""Every page at phone width (390 px, Chromium): nothing scrolls the page sideways and no table, fence card or
chart is wider than the screen; the job page's copy button copies the redacted payload. With
RINGFENCE_DOC_SHOTS=1 it also writes the screenshots of docs/dashboard.md (docs/img/)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from support import ROOT, wait_until
from test_dashboard_browser import Env, browser, dead_later_and_in_doubt, env, login, worker  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow
DOCS = ROOT / "docs" / "img"

WIDER = """() => {
  const out = [];
  for (const el of document.querySelectorAll("table, article, figure, pre, form, dl, .scroll, h1, p")) {
    const r = el.getBoundingClientRect();
    if (r.width && (r.right > innerWidth + 1 || el.scrollWidth > el.clientWidth + 1) && el.tagName !== "PRE")
      out.push(el.tagName + "." + el.className + " " + Math.round(r.right) + "/" + el.scrollWidth);
  }
  return out;
}"""


def test_every_page_fits_a_phone(browser: Any, env: Env, worker: Callable[[], Any]) -> None:  # noqa: F811
    app, b = env.app, env.app.broker
    request = json.dumps({"amount": 1250, "currency": "EUR", "customer_reference": "c" * 60})
    dying, later, _ = dead_later_and_in_doubt(env, worker, request)
    app.enqueue_many("noop", [{"n": i} for i in range(20)])
    import ringfence

    noop = app.registry.tasks["noop"]
    wid = ringfence.chain(noop.s(n=5), noop.s(n=6)).enqueue(business_id="order:5")
    wait_until(lambda: any(s.get("task_stats") for s in b.servers()), timeout=20)
    wait_until(lambda: (wf := app.workflow(wid)) is not None and wf.state == "done", timeout=20)
    url = env.dashboard()
    pages = [("overview", "/"), ("servers", "/servers"), ("pending", "/queues/default/pending"),
             ("dead", "/queues/default/dead"), ("scheduled", "/queues/default/scheduled"),
             ("job", f"/jobs?id={later}"), ("dead-job", f"/jobs?id={dying}"), ("task", "/tasks/default/noop"),
             ("fences", "/fences"), ("doctor", "/doctor"), ("search", "/queues/default/pending?payload=n%3D3"),
             ("workflow", f"/workflows?id={wid}")]
    DOCS.mkdir(parents=True, exist_ok=True)
    phone = browser.new_page(viewport={"width": 390, "height": 844})
    login(phone, url)
    for name, path in pages:
        resp = phone.goto(url + path)
        assert resp is not None and resp.status == 200, path
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390, name
        assert phone.evaluate(WIDER) == [], name
        if name in ("overview", "fences") and os.environ.get("RINGFENCE_DOC_SHOTS") == "1":
            phone.screenshot(path=str(DOCS / f"dashboard-{name}-phone.png"))
    phone.close()

    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    page = context.new_page()
    login(page, url)
    page.goto(url + f"/jobs?id={later}")
    page.click(f"button[data-copy='payload-{later}']")
    page.wait_for_selector("button[data-copied='1']")
    copied = json.loads(page.evaluate("navigator.clipboard.readText()"))
    assert copied == {"n": 0, "card": "[redacted]"}
    if os.environ.get("RINGFENCE_DOC_SHOTS") == "1":
        for name, path in pages:
            page.goto(url + path)
            page.screenshot(path=str(DOCS / f"dashboard-{name}.png"))
    context.close()
