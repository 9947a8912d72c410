"""The app of tests/test_producer_edges.py's real worker processes: tasks that store their results."""

from __future__ import annotations

import os
from typing import Any

from support import worker_app

app = worker_app()
app.max_result_bytes = int(os.environ.get("TEST_MAX_RESULT_BYTES", str(1 << 20)))


@app.task(name="quote", store_result=True)
def quote(ctx: Any, n: int) -> dict[str, int]:
    return {"n": n}


@app.task(name="big", store_result=True)
def big(ctx: Any, kib: int) -> str:
    return "x" * (kib * 1024)


@app.task(name="deep", store_result=True)
def deep(ctx: Any, levels: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(levels):
        out = [out]
    return out
