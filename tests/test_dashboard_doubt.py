"""Fence steps in doubt are flagged on the overview (a count and a link), and each in-doubt card shows the request
the step stored (redacted as payloads are) next to its provider key."""

from __future__ import annotations

import html
import json
import re
import warnings
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from ringfence import jobs
from ringfence.dashboard import create_app
from ringfence.fence import FenceStore, Owner


def test_overview_flags_in_doubt_steps_and_cards_show_the_request(make_app: Any, tmp_path: Any) -> None:
    app = make_app(environment="test", fence_url=f"sqlite:///{tmp_path}/f.db")

    @app.task(name="charge")
    def charge(ctx: Any, order: int) -> None: ...

    store: FenceStore = app.fence_store
    store.create_all()
    client = TestClient(create_app(app))
    assert "in doubt</a>" not in client.get("/").text
    for order in (7, 8):
        job = app.enqueue("charge", order=order)
        store.capture(f"order:{order}", "charge", Owner(job, "tok", 30.0), "h", None)
        store.mark_calling(f"order:{order}", "charge", 1,
                           json.dumps({"amount": 1250 + order, "currency": "EUR", "card_number": "4111-1111"}), 30.0)
        jobs.cancel_job(app, job)  # dead; its calling step now in doubt
    page = client.get("/").text
    flag = re.search(r'<p class="flash bad in-doubt" data-in-doubt="(\d+)"><a href="/fences">(.*?)</a>', page)
    assert flag and flag[1] == "2" and flag[2] == "2 fence step(s) in doubt"
    fences = client.get("/fences").text
    for order in (7, 8):
        card = re.search(rf'<article class="doubt" data-step="order:{order}/charge">(.*?)</article>', fences, re.S)[1]
        shown = json.loads(html.unescape(re.search(r'<dd class="request"><code>(.*?)</code>', card)[1]))
        assert shown == {"amount": 1250 + order, "currency": "EUR", "card_number": "[redacted]"}
        row = store.get(f"order:{order}", "charge")
        assert row is not None and row.updated_at is not None
        since = re.search(r'<dd class="since">(.*?)</dd>', card)[1]  # to the second, as the job page's times
        assert since == row.updated_at.strftime("%Y-%m-%d %H:%M:%S"), since
    assert "4111" not in fences


def test_a_fence_time_with_its_zone_is_shown_in_utc() -> None:
    from datetime import datetime, timedelta, timezone

    from ringfence.dashboard.page import _stamp

    assert _stamp(datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=timezone(timedelta(hours=2)))) == "2026-01-02 01:04:05 UTC"
    assert _stamp(datetime(2026, 1, 2, 3, 4, 5, 678)) == "2026-01-02 03:04:05"  # no zone: none claimed
    assert _stamp(None) == "-"
