"""A dead Redis Cluster master must not make the asyncio client reload its slot map for every call a worker sends
to that master's queues: each reload holds up the calls of the healthy queues (all of them wait for it). Calls to a
node that just failed fail at once for ``DOWN_S``, one probe at a time; the healthy queues' calls go on. Measured on
the live masters: their ``CLUSTER SLOTS`` calls (the reloads) during a burst of calls to the dead master's queue."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from ringfence import App
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.node_gate import DOWN_S
from topology import HAVE_REDIS, Cluster, queue_per_master, slot_map_reads, still_cluster

pytestmark = [pytest.mark.topology,
              pytest.mark.skipif(not HAVE_REDIS, reason="needs redis-server and redis-cli")]


def test_calls_to_a_dead_master_do_not_reload_the_slot_map_each_time(tmp_path: Path) -> None:
    with still_cluster(tmp_path, "gate") as (cluster, app):
        asyncio.run(_scenario(app, cluster))


async def _scenario(app: App, cluster: Cluster) -> None:
    b = app.broker
    owner = queue_per_master(b)
    dead, *live = sorted(owner)
    for q in owner.values():
        await b.arun(b.recover(q))  # the client knows the map, the clock and the scripts
    cluster.kill(int(dead.rsplit(":", 1)[1]))
    live_clients = [redis.Redis(port=int(m.rsplit(":", 1)[1])) for m in live]
    before = slot_map_reads(live_clients)
    failed = answered = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < 2 * DOWN_S + 0.2:  # a worker's lease, ack and recovery calls
            try:
                await b.arun(b.recover(owner[dead]))
            except UNAVAILABLE:
                failed += 1
            for m in live:
                assert await b.arun(b.recover(owner[m])) == []  # the healthy queues are served throughout
                answered += 1
            await asyncio.sleep(0.005)
        reloads = slot_map_reads(live_clients) - before
    finally:
        await b.aclose()
    # Measured here: 164 healthy calls, 82 failed, 6 reloads (before: 10 healthy calls, 5 failed, 10 reloads:
    # each failed call reloaded the map and every call waited for it).
    assert answered >= 40, (failed, answered, reloads)
    assert failed >= 20 and reloads <= failed // 4, (failed, answered, reloads)


class _Map:
    """The slot map as the gate reads it (``get_node_from_key(key).name``): key -> node name."""

    def __init__(self, nodes: dict[str, str]) -> None:
        self.nodes = nodes

    def get_node_from_key(self, key: str) -> object:
        return type("Node", (), {"name": self.nodes[key]})()


def test_a_failed_node_is_probed_once_per_window_and_forgotten_once_its_slots_moved() -> None:
    from ringfence.redis.node_gate import NodeGate

    gate, slots = NodeGate(), _Map({"a": "n1:1", "b": "n2:2"})
    assert gate.check(slots, "a") is None  # nothing down: no lookup at all
    gate.failed(slots, "a")
    with pytest.raises(redis.ConnectionError, match="n1:1"):
        gate.check(slots, "a")
    assert gate.check(slots, "b") == "n2:2"  # another node's calls pass
    time.sleep(DOWN_S + 0.05)
    assert gate.check(slots, "a") == "n1:1"  # the probe
    with pytest.raises(redis.ConnectionError):
        gate.check(slots, "a")  # the others wait for its answer
    gate.answered("n1:1")
    assert gate.check(slots, "a") is None
    gate.failed(slots, "a")
    slots.nodes["a"] = "n3:3"  # a failover: the slot map names the promoted replica
    time.sleep(2 * DOWN_S + 0.05)
    assert gate.check(slots, "a") == "n3:3"
    assert gate.down == {}  # the dead node's mark went with it: calls take the fast path again
