"""A Redis Cluster's topology as its nodes see it (CLUSTER NODES and CLUSTER INFO of the first node that answers):
nodes down, slots not served, masters without a replica. Read for the doctor and ``info``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ringfence.redis.broker import Broker
from ringfence.redis.scripts import script


@dataclass(frozen=True)
class Node:
    address: str
    node_id: str
    master: bool
    master_id: str  # a replica's master; "-" for a master
    flagged: bool  # flagged fail or pfail by the cluster (after its node timeout)
    answers: bool  # answered a PING from here just now
    slots: int

    @property
    def down(self) -> bool:
        return self.flagged or not self.answers


@dataclass(frozen=True)
class ClusterView:
    read_from: str
    state: str  # cluster_state: "ok" or "fail"
    slots_ok: int  # of 16384
    nodes: list[Node]

    def down(self) -> list[Node]:
        return [n for n in self.nodes if n.down]

    def without_replica(self) -> list[Node]:
        """Masters serving slots with no live replica: their failure leaves slots unserved."""
        live = {n.master_id for n in self.nodes if not n.master and not n.down}
        return [n for n in self.nodes if n.master and not n.down and n.slots and n.node_id not in live]


def _slots(ranges: Any) -> int:
    total = 0
    for r in ranges or []:
        first, last = (int(r[0]), int(r[-1])) if isinstance(r, list | tuple) else (int(r), int(r))
        total += last - first + 1
    return total


def cluster_view(broker: Broker, silent: dict[str, str] | None = None) -> ClusterView | None:
    """The view of the first known node that answers; None when none does (or not a Cluster). ``silent``: nodes
    that did not answer a short PING (``silent_masters``): neither asked nor pinged again."""
    if not broker.cluster:
        return None
    silent = silent or {}
    known = broker.sync.get_nodes()  # type: ignore[attr-defined]
    for node in known:
        if node.name in silent:
            continue
        conn = node.redis_connection
        try:
            nodes = conn.execute_command("CLUSTER NODES")
            info = conn.execute_command("CLUSTER INFO")
        except (redis.RedisError, OSError):
            continue
        clients = {n.name: n.redis_connection for n in known}
        found = [Node(address, str(n["node_id"]), "master" in n["flags"], str(n["master_id"]),
                      "fail" in n["flags"],
                      address not in silent and _answers(clients.get(address) or _client(conn, address)),
                      _slots(n.get("slots")))
                 for address, n in sorted(nodes.items())]
        return ClusterView(node.name, str(info.get("cluster_state")), int(info.get("cluster_slots_ok", 0)), found)
    return None


def node_of(broker: Broker, key: str) -> str:
    """The address of the node that owns ``key``'s slot, as the client's slot map says ("?" outside a Cluster)."""
    if not broker.cluster:
        return "?"
    try:
        return str(broker.sync.get_node_from_key(key).name)  # type: ignore[attr-defined]
    except (redis.RedisError, OSError):
        return "?"


@dataclass(frozen=True)
class Promotion:
    """A master that was a replica until a failover promoted it (``INFO replication`` keeps the former
    replication id until the node restarts; Redis records no time of it)."""

    address: str
    former_replid: str
    offset_at_promotion: int
    offset_now: int


def promotion(broker: Broker) -> Promotion | None:
    """The Redis master's promotion, if a failover made it master; None otherwise and on a Cluster."""
    if broker.cluster:
        return None
    try:
        info = broker.sync.info("replication")
    except redis.ResponseError:  # INFO not granted to the ACL user: no promotion can be told
        return None
    former, at = str(info.get("master_replid2", "")), int(info.get("second_repl_offset", -1))
    if info.get("role") != "master" or at < 0 or not former.strip("0"):
        return None
    laddr = str(broker.sync.client_info().get("laddr", "?"))  # the master's address as this connection sees it
    return Promotion(laddr, former, at, int(info.get("master_repl_offset", 0)))


def silent_masters(broker: Broker, timeout_s: float = 1.0) -> dict[str, str]:
    """Masters of the client's slot map that do not answer a PING within ``timeout_s`` -> the error: a read that
    would wait the client's socket timeout on each of its retries is skipped instead."""
    if not broker.cluster:
        return {}
    silent: dict[str, str] = {}
    for node in broker.sync.get_nodes():  # type: ignore[attr-defined]
        if node.server_type != "primary":
            continue
        client = _client(node.redis_connection, node.name, timeout_s)
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            silent[node.name] = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        finally:
            client.close()
    return silent


def prepare_reads(broker: Broker, scripts: tuple[str, ...], silent: dict[str, str]) -> None:
    """Ready a Cluster client for reads while a node is down: the clock, the script-flags probe and the scripts'
    loading go to the nodes that answer (the client sends TIME and EVAL without keys to one default node, and SCRIPT
    LOAD to every master, so one dead node would fail reads of the live ones)."""
    if not broker.cluster:
        return
    for node in broker.sync.get_nodes():  # type: ignore[attr-defined]
        if node.server_type != "primary" or node.name in silent:
            continue
        try:
            _prepare(broker, node.redis_connection, scripts)
        except (redis.RedisError, OSError):
            continue


def _prepare(broker: Broker, conn: Any, scripts: tuple[str, ...]) -> None:
    if not broker.server_clock.measured:
        broker.server_clock.measure(conn)
    flags = broker.supports_flags(conn)
    for name in scripts:
        conn.script_load(script(name).for_server(flags, True)[0])


def _client(like: Any, address: str, timeout_s: float = 2.0) -> redis.Redis:
    """A client of a node the cluster client left out of its map (it did not answer then), with the same login
    and TLS options."""
    host, _, port = address.rpartition(":")
    options = {k: v for k, v in like.connection_pool.connection_kwargs.items()
               if k in ("username", "password", "ssl", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")}
    return redis.Redis(host=host, port=int(port), socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                       retry=Retry(NoBackoff(), 0), **options)  # one try: a silent node costs timeout_s once


def _answers(client: Any) -> bool:
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
