"""Writes confirmed by replicas: the script, then ``WAIT n timeout`` on the same connection.

Redis replicates asynchronously: a write the master acknowledged can be lost when the master dies before a
replica received it (a Sentinel or Cluster failover promotes that replica). ``WAIT`` blocks until ``n``
replicas acknowledged every earlier write of the connection, or the timeout passes; it cannot undo a write, so
fewer replicas than asked raises ``NotReplicated`` (the write is on the master and may still replicate).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, TypeVar

from redis.exceptions import AskError, MovedError, RedisClusterException, TryAgainError

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
    source, _ = script(call.name).for_server(broker.supports_flags(), broker.cluster)
    try:
        if broker.cluster:
            raw, acked = _on_cluster(broker.sync, call, source, replicas, timeout_ms)
        else:
            raw, acked = _send(broker.sync, call, source, replicas, timeout_ms, asking=False)
    except UNAVAILABLE as exc:
        broker.health.lost(exc)
        raise
    broker.health.ok()
    return call.parse(raw), acked


def _send(client: Any, call: Call[Any], source: str, replicas: int, timeout_ms: int, asking: bool) -> tuple[Any, int]:
    """The script and its WAITs in one pipeline on one connection (``ASKING`` first on a slot being imported)."""
    options = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    with client.pipeline(transaction=False) as p:
        if asking:
            p.execute_command("ASKING")
        # EVAL, not EVALSHA: a replica promoted by a failover has no script cache
        p.eval(source, len(call.keys), *call.keys, *call.args)
        for ms in wait_slices(timeout_ms, options.get("socket_timeout")):
            p.execute_command("WAIT", replicas, ms)  # one connection: each waits for this connection's write above
        raw, *acked = p.execute()[1 if asking else 0:]
    return raw, max(int(a) for a in acked)


#: Redirections followed by a cluster's replicated write before giving up (as the cluster client's TTL does).
REDIRECTIONS = 5


def _on_cluster(client: Any, call: Call[Any], source: str, replicas: int, timeout_ms: int) -> tuple[Any, int]:
    """WAIT counts the replicas of the node that took the write, so the pipeline goes to that node, past the cluster
    client: MOVED (a reshard, a failover) refreshes its slot map and is followed, ASK goes to the importing node,
    TRYAGAIN (keys of a slot half migrated) waits; a node that does not answer refreshes the map for the next call."""
    node, asking = client.get_node_from_key(call.keys[0]), False
    for attempt in range(REDIRECTIONS):
        try:
            return _send(client.get_redis_connection(node), call, source, replicas, timeout_ms, asking)
        except MovedError:
            client.nodes_manager.initialize()
            node, asking = client.get_node_from_key(call.keys[0]), False
        except AskError as exc:
            node, asking = client.get_node(host=exc.host, port=exc.port), True
            if node is None:  # a node the map does not know yet
                client.nodes_manager.initialize()
                node, asking = client.get_node_from_key(call.keys[0]), False
        except TryAgainError:
            time.sleep(0.05 * (attempt + 1))
        except UNAVAILABLE:
            _refresh(client)
            raise
    raise TryAgainError(f"{call.name}: the slot of {call.keys[0]} kept moving ({REDIRECTIONS} redirections)")


def _refresh(client: Any) -> None:
    """Reload the slot map after a node failed (the next call finds the replica promoted in its place)."""
    with contextlib.suppress(*UNAVAILABLE, RedisClusterException):
        client.nodes_manager.initialize()


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
    # to_thread: a producer's call; the app's executor bounds the threads (and connections) of many at once.
    return await asyncio.to_thread(run_replicated, broker, call, replicas, timeout_ms)
