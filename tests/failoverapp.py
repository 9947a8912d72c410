"""The app of tests/test_cluster_info.py's worker: a job that runs for ``s`` seconds (its lease renewed
meanwhile), so a failover can roll its lease back while the worker is alive."""

from __future__ import annotations

import asyncio

from support import worker_app

app = worker_app(lease_s=3.0)


@app.task(name="slow")
async def slow(ctx, s: float) -> None:
    await asyncio.sleep(s)
