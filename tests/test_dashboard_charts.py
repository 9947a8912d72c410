"""Charts people can read: a y axis with its top and 0, time ticks, and a tooltip per point giving its time and
value, per queue (its pending page) and per task (its page); values from what a real worker did."""

from __future__ import annotations

import html
import re
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest

pytest.importorskip("starlette")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

from dashboard_support import Workers, worker_env
from ringfence import App
from ringfence.dashboard import create_app
from support import wait_until


def figure(page: str, title: str) -> str:
    m = re.search(rf'<figure class="chart"><figcaption>{re.escape(title)} .*?</figure>', page, re.S)
    assert m, f"no chart {title!r}"
    return m[0]


def points(fig: str) -> list[tuple[str, float]]:
    """(time, value) of each tooltip of a one-series chart."""
    tip = r'<rect class="hover"[^>]*><title>([\d:]+): \w[\w ]* ([\d.]+)s?</title>'
    return [(t, float(v)) for t, v in re.findall(tip, html.unescape(fig))]


def test_queue_and_task_charts_have_axes_and_values_on_hover(make_app: Any, redis_url: str, namespace: str) -> None:
    app: App = make_app()
    app.task(name="quick")(lambda ctx, **kw: None)
    ids = app.enqueue_many("quick", [{"n": i} for i in range(30)])
    workers = Workers(worker_env(redis_url, namespace), "dashtasksapp:app")
    workers.start()
    try:
        b = app.broker
        client = TestClient(create_app(app))
        wait_until(lambda: all(b.job_state("default", j) is None for j in ids), timeout=30)
        fig = figure(client.get("/queues/default/pending").text, "Throughput, last hour (per minute)")
        pts = points(fig)
        now = datetime.fromtimestamp(b.clock() / 1000, UTC).strftime("%H:%M")
        assert len(pts) == 60 and pts[-1][0] == now and sum(v for _, v in pts) == 30
        top = max(v for _, v in pts)
        assert re.search(rf'<div class="yaxis"><span>{top:g}</span><span>0</span></div>', fig)
        ticks = f'<div class="ticks"><span>{pts[0][0]}</span><span>{pts[30][0]}</span><span>{now}</span>'
        assert ticks in fig

        def task_chart() -> list[tuple[str, float]]:
            page = client.get("/tasks/default/quick").text
            return points(figure(page, "Attempts finished, last hour (per minute)")) if "<figure" in page else []

        wait_until(lambda: sum(v for _, v in task_chart()) == 30, timeout=15)  # the workers' next heartbeat
    finally:
        workers.stop()


def test_a_chart_of_zeros_has_an_axis_from_0_to_1(make_app: Any) -> None:
    """A queue with nothing failed: its failures chart has two distinct ends and its line lies on the 0."""
    from ringfence.dashboard.charts import PAD, H

    app: App = make_app()
    app.task(name="quick")(lambda ctx, **kw: None)
    app.enqueue("quick", n=1)
    fig = figure(TestClient(create_app(app)).get("/queues/default/pending").text, "Failures, last hour (per minute)")
    assert all(v == 0 for _, v in points(fig)) and len(points(fig)) == 60
    assert '<div class="yaxis"><span>1</span><span>0</span></div>' in fig
    line = re.search(r'<polyline class="s-bad" fill="none" points="([^"]+)"', fig)
    assert line is not None and {p.split(",")[1] for p in line[1].split()} == {f"{H - PAD:.1f}"}
    assert "<small>max 0</small>" in fig
