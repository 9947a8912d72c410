"""Writes confirmed by replicas: the script, then ``WAIT n timeout`` on the same connection.

Redis replicates asynchronously: a write the master acknowledged can be lost when the master dies before a
replica received it (a Sentinel or Cluster failover promotes that replica). ``WAIT`` blocks until ``n``
replicas acknowledged every earlier write of the connection, or the timeout passes; it cannot undo a write, so
fewer replicas than asked raises ``NotReplicated`` (the write is on the master and may still replicate).
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from ringfence.errors import NotReplicated
from ringfence.redis.broker import Broker
from ringfence.redis.call import Call
from ringfence.redis.connection import UNAVAILABLE
from ringfence.redis.scripts import script

T = TypeVar("T")


def run_replicated(broker: Broker, call: Call[T], replicas: int, timeout_ms: int) -> T:
    """Run ``call`` and wait until ``replicas`` replicas have it (``NotReplicated`` when fewer did in time)."""
    parsed, acked = run_and_wait(broker, call, replicas, timeout_ms)
    if acked < replicas:
        raise NotReplicated(not_replicated(call.name, acked, replicas, timeout_ms))
    return parsed


def not_replicated(what: str, acked: int, replicas: int, timeout_ms: int) -> str:
    return (f"{what}: {acked} of {replicas} replica(s) confirmed within {timeout_ms} ms; the write is on the master "
            "and is lost if it fails before a replica has it")


def run_and_wait(broker: Broker, call: Call[T], replicas: int, timeout_ms: int) -> tuple[T, int]:
    """Run ``call``, then ``WAIT`` up to ``timeout_ms``; returns its answer and how many replicas confirmed it.
    The wait is split into several WAITs each shorter than the socket timeout, so a long wait is not taken
    for an unreachable Redis."""
    client: Any = broker.sync
    if broker.cluster:  # WAIT counts the replicas of the node that took the write, on its connection
        client = client.get_node_from_key(call.keys[0]).redis_connection
    source, _ = script(call.name).for_server(broker.supports_flags(), broker.cluster)
    options = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    waits = wait_slices(timeout_ms, options.get("socket_timeout"))
    try:
        with client.pipeline(transaction=False) as p:
            # EVAL, not EVALSHA: a replica promoted by a failover has no script cache
            p.eval(source, len(call.keys), *call.keys, *call.args)
            for ms in waits:  # one connection: each WAIT waits for this connection's write above
                p.execute_command("WAIT", replicas, ms)
            raw, *acked = p.execute()
    except UNAVAILABLE as exc:
        broker.health.lost(exc)
        raise
    broker.health.ok()
    return call.parse(raw), max(int(a) for a in acked)


def wait_slices(timeout_ms: int, socket_timeout_s: float | None) -> list[int]:
    """``timeout_ms`` cut into WAIT timeouts that end well within the socket timeout: Redis ends a WAIT up to its
    timer's tick (100 ms) late, so each leaves half the socket timeout (a quarter below 0.4 s) spare. WAIT 0
    would block forever."""
    total = max(1, timeout_ms)
    if not socket_timeout_s:
        return [total]
    socket_ms = int(socket_timeout_s * 1000)
    step = max(1, min(total, socket_ms // 2 if socket_ms >= 400 else socket_ms // 4))
    return [step] * (total // step) + ([total % step] if total % step else [])


async def arun_replicated(broker: Broker, call: Call[T], replicas: int, timeout_ms: int) -> T:
    """``run_replicated`` off the event loop (WAIT blocks its connection for up to ``timeout_ms``)."""
    return await asyncio.to_thread(run_replicated, broker, call, replicas, timeout_ms)
