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
    client: Any = broker.sync
    if broker.cluster:  # WAIT counts the replicas of the node that took the write, on its connection
        client = client.get_node_from_key(call.keys[0]).redis_connection
    source, _ = script(call.name).for_server(broker.supports_flags(), broker.cluster)
    try:
        with client.pipeline(transaction=False) as p:
            # EVAL, not EVALSHA: a replica promoted by a failover has no script cache
            p.eval(source, len(call.keys), *call.keys, *call.args)
            p.execute_command("WAIT", replicas, timeout_ms)
            raw, acked = p.execute()
    except UNAVAILABLE as exc:
        broker.health.lost(exc)
        raise
    broker.health.ok()
    if int(acked) < replicas:
        raise NotReplicated(f"{call.name}: {acked} of {replicas} replica(s) confirmed within {timeout_ms} ms; the "
                            "write is on the master and is lost if it fails before a replica has it")
    return call.parse(raw)


async def arun_replicated(broker: Broker, call: Call[T], replicas: int, timeout_ms: int) -> T:
    """``run_replicated`` off the event loop (WAIT blocks its connection for up to ``timeout_ms``)."""
    return await asyncio.to_thread(run_replicated, broker, call, replicas, timeout_ms)
