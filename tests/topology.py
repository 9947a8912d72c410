"""The tests' private Redis Cluster and Sentinel set-ups (bench/servers.py) and the slot moves of a reshard."""

from __future__ import annotations

import shutil
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from bench.servers import Cluster, SentinelSet, Servers, free_port

from ringfence import App

__all__ = [
    "HAVE_REDIS",
    "Cluster",
    "SentinelSet",
    "Servers",
    "close_migration",
    "free_port",
    "move_keys",
    "move_slot",
    "node_ids",
    "open_migration",
    "owner_of",
    "queue_per_master",
    "silence_a_master",
    "slot_map_reads",
    "still_cluster",
]

HAVE_REDIS = shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


@contextmanager
def still_cluster(tmp_path: Path, prefix: str) -> Iterator[tuple[Cluster, App]]:
    """3 masters, no replica, a node timeout longer than any test (no failover meanwhile), and an App on them in a
    namespace of its own."""
    cluster = Cluster(tmp_path, node_timeout_ms=60_000)
    app = App(cluster.url, f"{prefix}{uuid.uuid4().hex[:6]}")
    try:
        yield cluster, app
    finally:
        app.close()
        cluster.stop()


def slot_map_reads(clients: list[redis.Redis]) -> int:
    """How many times the nodes were asked for the slot map (redis-py's cluster client reloading it)."""
    total = 0
    for c in clients:
        stats = c.info("commandstats")
        total += sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_cluster|slots", "cmdstat_cluster"))
    return total


def node_ids(ports: list[int]) -> dict[int, str]:
    return {p: redis.Redis(port=p).execute_command("CLUSTER", "MYID").decode() for p in ports}


def owner_of(ports: list[int], slot: int) -> int:
    """The port of the master that serves ``slot`` (asked of each, so a node that redirects does not count)."""
    for p in ports:
        for start, end, master, *_ in redis.Redis(port=p).execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(master[1])
    raise AssertionError(f"slot {slot} is not served")


def open_migration(ports: list[int], slot: int, to_port: int) -> int:
    """Mark ``slot`` MIGRATING on its owner and IMPORTING on ``to_port`` (keys not moved yet); the owner's port."""
    src, ids = owner_of(ports, slot), node_ids(ports)
    redis.Redis(port=to_port).execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src])
    redis.Redis(port=src).execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to_port])
    return src


def move_keys(src: int, to_port: int, slot: int, limit: int = 1000) -> int:
    """MIGRATE up to ``limit`` keys of ``slot`` from ``src`` to ``to_port``; how many moved."""
    keys = redis.Redis(port=src).execute_command("CLUSTER", "GETKEYSINSLOT", slot, limit)
    if keys:
        redis.Redis(port=src).execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
    return len(keys)


def close_migration(ports: list[int], slot: int, to_port: int) -> None:
    """Give ``slot`` to ``to_port`` on every master (its keys moved)."""
    owner = node_ids(ports)[to_port]
    for p in [to_port, *[q for q in ports if q != to_port]]:
        redis.Redis(port=p).execute_command("CLUSTER", "SETSLOT", slot, "NODE", owner)


def move_slot(ports: list[int], slot: int, to_port: int) -> None:
    """Reshard one slot: its keys and its ownership, as ``redis-cli --cluster reshard`` does for each slot."""
    src = open_migration(ports, slot, to_port)
    while move_keys(src, to_port, slot):
        pass
    close_migration(ports, slot, to_port)


def queue_per_master(broker: Any) -> dict[str, str]:
    """A queue name whose keys live on each master of ``broker``'s cluster: the node's name -> the queue."""
    owner: dict[str, str] = {}
    for i in range(1000):
        owner.setdefault(broker.sync.get_node_from_key(broker.keys.queue(f"q{i}").pending).name, f"q{i}")
    return owner


def silence_a_master(cluster: Cluster, ns: str, fault: str) -> tuple[dict[str, str], str]:
    """One job in a queue on each master of ``cluster`` (namespace ``ns``), then a master other than the namespace
    keys' own SIGKILLed (``fault="killed"``) or SIGSTOPped (``"hung"``). Returns the queue per master and the
    silenced master's name."""
    app = App(cluster.url, ns)
    try:
        task = app.task(name="stamp")(_stamp)
        by_master = queue_per_master(app.broker)
        for q in by_master.values():
            task.with_options(queue=q).enqueue(n=1)
        home = app.broker.sync.get_node_from_key(app.broker.keys.queues).name  # type: ignore[attr-defined]
    finally:
        app.close()
    victim = sorted(m for m in by_master if m != home)[0]
    port = int(victim.rsplit(":", 1)[1])
    if fault == "killed":
        cluster.kill(port)
    else:
        cluster.procs[port].send_signal(signal.SIGSTOP)
    return by_master, victim


def _stamp(ctx: object, n: int) -> None:
    pass
