"""A script missing on a Redis Cluster node (a promoted replica, a restarted or flushed node) is loaded on the node
that answered NOSCRIPT, not on every master: with another master down, a call to a live master's queue still
runs, and the other masters are left alone. Sync (``Broker.run``) and asyncio (``Broker.arun``) clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.redis.scripts import script
from topology import HAVE_REDIS, Cluster, queue_per_master, still_cluster

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


def test_noscript_loads_the_script_on_the_node_that_answered(tmp_path: Path) -> None:
    with still_cluster(tmp_path, "scr") as (cluster, app):
        asyncio.run(_scenario(app, cluster))


async def _scenario(app: App, cluster: Cluster) -> None:
    b = app.broker
    owner = queue_per_master(b)
    dead, live, other = sorted(owner)
    queue = owner[live]
    # Both clients know the slot map, the clock and the script-flags probe (no key: any node) before the kill.
    b.run(b.recover(queue))
    await b.arun(b.recover(queue))
    sha = script("recover").for_server(b.supports_flags(), True)[1]
    live_r, other_r = (redis.Redis(port=int(m.rsplit(":", 1)[1])) for m in (live, other))
    live_r.script_flush()
    other_r.script_flush()
    cluster.kill(int(dead.rsplit(":", 1)[1]))
    try:
        assert b.run(b.recover(queue)) == []  # NOSCRIPT on its node: loaded there, run again
        assert (live_r.script_exists(sha), other_r.script_exists(sha)) == ([True], [False])

        live_r.script_flush()
        assert await b.arun(b.recover(queue)) == []
        assert (live_r.script_exists(sha), other_r.script_exists(sha)) == ([True], [False])
    finally:
        await b.aclose()
