"""A starting worker whose Redis stops answering after its connect (a master SIGKILLed, not failed over yet) waits
for it as the connect does, instead of exiting 3 "cannot connect to Redis" (seen on Sentinel in the 10,000-order
chaos run: the registration after the connect)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.worker.worker import Worker
from topology import HAVE_REDIS, Servers, free_port

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


async def test_the_registration_waits_for_a_redis_that_stopped_answering(tmp_path: Path) -> None:
    servers = Servers(tmp_path)
    port = free_port()
    app = App(f"redis://127.0.0.1:{port}/0", f"t{uuid.uuid4().hex[:8]}", environment="test")
    worker = Worker(app, [("q", 1)])
    try:
        registering = asyncio.ensure_future(worker._register(["q"]))
        await asyncio.sleep(1.5)
        assert not registering.done(), registering.exception()
        servers.start(port)
        await asyncio.wait_for(registering, 30)
        assert redis.Redis(port=port).smembers(app.broker.keys.queues) == {b"q"}
    finally:
        await app.broker.aclose()
        app.close()
        servers.stop()
